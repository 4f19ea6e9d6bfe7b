"""Prompt KV checkpoints in host memory, shared by every session (no llama.cpp here).

A KV slot belongs to one session, so a new conversation starts on a slot that holds
nothing of its system prompt. The verifier therefore saves the KV state of a sequence
at a few prompt positions ("checkpoints": ``llama_state_seq_get_data``, a few MB per
thousand tokens) and a later prompt of any session that starts with the same tokens
restores the longest one instead of evaluating those tokens again.

Why whole checkpoints and not a copy of another slot's prefix: gemma-3 and other models
with sliding-window layers keep only the last window of positions in those layers, so
a slot that went past a shared prefix no longer holds what a position right after the
prefix needs. A checkpoint taken *at* the prefix holds exactly that window (llama.cpp
writes the window cells still in use), so restoring it is exact whatever came later.
Without sliding-window layers a longer checkpoint can also be cut back to a shorter
common prefix (``partial``).

Where checkpoints are taken (``points``): positions the caller names (the ends of a chat
prompt's leading system messages and of all but its last message: what the next
conversation or a retry shares), the longest prefix this prompt shares with a recent
prompt of another conversation (learnt: the third conversation with a system prompt
reuses it even without a caller's hint), and the end of the prompt (an identical
request again). The store is bounded in bytes, least recently used first out.

Prompts that arrive together (agents started at once on one system prompt) would each
evaluate the prefix no checkpoint holds yet. A prefill therefore announces the
checkpoints it will take (``expect``); a later prompt that begins with one of them
(``awaited``) waits for it (``wait``, until ``settle``) and restores it. Only announced
ones are awaited and a prompt announces after it has waited, so no two wait on each
other.

Checkpoints and prompt history are kept per ``scope`` (the daemon's namespace): a
restored prefix shows in ``cached_tokens`` and in time to first token, so sharing them
across tenants would tell one what another's prompts begin with.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

# Shorter prefixes are cheaper to evaluate again than to keep.
MIN_CHECKPOINT_TOKENS = 64
# Recent prompts remembered (their tokens only) to find what new prompts share.
PROMPT_HISTORY = 32


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """The length of the longest common prefix of two token arrays."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


@dataclass
class Checkpoint:
    scope: str
    tokens: np.ndarray  # int32: the prefix whose KV ``state`` holds
    state: bytes

    @property
    def nbytes(self) -> int:
        return len(self.state) + self.tokens.nbytes


@dataclass(eq=False)  # each one is itself (its tokens are an array)
class Expected:
    """A checkpoint a prefill under way will take (``PromptCache.expect``)."""

    scope: str
    tokens: np.ndarray  # int32: the prefix
    settled: bool = False


@dataclass
class PromptCacheStats:
    lookups: int = 0
    hits: int = 0
    reused_tokens: int = 0  # prompt tokens restored instead of evaluated
    saved: int = 0
    evicted: int = 0
    refused: int = 0  # checkpoints larger than the whole store
    awaited: int = 0  # prompts that waited for another prefill's checkpoint

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class PromptCache:
    """Checkpoints keyed by their token prefix, at most ``max_bytes`` in all."""

    def __init__(self, max_bytes: int, *, min_tokens: int = MIN_CHECKPOINT_TOKENS,
                 history: int = PROMPT_HISTORY) -> None:
        self.max_bytes = max(0, int(max_bytes))
        self.min_tokens = min_tokens
        self._entries: OrderedDict[bytes, Checkpoint] = OrderedDict()  # LRU first
        self._history: OrderedDict[bytes, tuple[str, np.ndarray]] = OrderedDict()
        self._history_len = history
        self._bytes = 0
        self._lock = threading.Lock()
        self._expected: list[Expected] = []
        self._settled = threading.Condition(self._lock)
        self.stats = PromptCacheStats()

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def best(self, scope: str, prompt: Sequence[int], limit: int, *,
             partial: bool) -> tuple[Checkpoint, int] | None:
        """The checkpoint of ``scope`` to restore for ``prompt`` and how many of its tokens
        are used: the most prompt tokens (of the first ``limit``) it covers; without
        ``partial`` only checkpoints that are a whole prefix of them count."""
        if not self.enabled:
            return None
        p = np.asarray(prompt[:limit], dtype=np.int32)
        with self._lock:
            self.stats.lookups += 1
            best: tuple[int, bytes] | None = None
            for key, cp in self._entries.items():
                if cp.scope != scope or (not partial and len(cp.tokens) > len(p)):
                    continue
                n = common_prefix(cp.tokens, p)
                if not partial and n < len(cp.tokens):
                    continue
                if n >= self.min_tokens and (best is None or n > best[0]):
                    best = (n, key)
            if best is None:
                return None
            self._entries.move_to_end(best[1])
            return self._entries[best[1]], best[0]

    def record_hit(self, tokens: int) -> None:
        with self._lock:
            self.stats.hits += 1
            self.stats.reused_tokens += tokens

    def has(self, scope: str, tokens: Sequence[int]) -> bool:
        with self._lock:
            return _key(scope, tokens) in self._entries

    def add(self, scope: str, tokens: Sequence[int], state: bytes) -> bool:
        """Keep a checkpoint (the least recently used go first to make room); False when
        it alone is larger than the store."""
        cp = Checkpoint(scope, np.asarray(tokens, dtype=np.int32), bytes(state))
        if not self.enabled or cp.nbytes > self.max_bytes:
            with self._lock:
                self.stats.refused += 1
            return False
        key = _key(scope, tokens)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            while self._entries and self._bytes + cp.nbytes > self.max_bytes:
                _, gone = self._entries.popitem(last=False)
                self._bytes -= gone.nbytes
                self.stats.evicted += 1
            self._entries[key] = cp
            self._bytes += cp.nbytes
            self.stats.saved += 1
        return True

    def points(self, scope: str, prompt: Sequence[int], start: int,
               hints: Iterable[int] = (), *, new: bool = True) -> list[int]:
        """Where to checkpoint ``prompt`` while evaluating it from token ``start``: the
        hints, the longest prefix it shares with a recent prompt, and, for a ``new``
        conversation (its slot held none of it), the end of what is cached of it (all but its last
        token: the same request again; a session's next turn has its slot for that); in
        order, each past ``start`` and long enough, none already stored."""
        if not self.enabled:
            return []
        end = len(prompt) - 1
        p = np.asarray(prompt, dtype=np.int32)
        with self._lock:
            shared = max((common_prefix(h, p[:end]) for s, h in self._history.values()
                          if s == scope), default=0)
        wanted = {int(h) for h in hints} | {shared}
        if new:
            wanted.add(end)
        out = [n for n in sorted(wanted) if start < n <= end and n >= self.min_tokens]
        return [n for n in out if not self.has(scope, prompt[:n])]

    def expect(self, scope: str, prompt: Sequence[int], points: Iterable[int]
               ) -> list[Expected]:
        """Announce the checkpoints a prefill of ``prompt`` will take at ``points``; each
        must be ``settle``d (taken or not) when the prefill passes it or ends."""
        if not self.enabled:
            return []
        p = np.asarray(prompt, dtype=np.int32)
        out = [Expected(scope, p[:n]) for n in points]
        with self._lock:
            self._expected += out
        return out

    def settle(self, expected: Iterable[Expected]) -> None:
        with self._lock:
            for e in expected:
                e.settled = True
            self._expected = [e for e in self._expected if not e.settled]
            self._settled.notify_all()

    def awaited(self, scope: str, prompt: Sequence[int], beyond: int, limit: int
                ) -> Expected | None:
        """The longest announced checkpoint of ``scope`` that is a prefix of the first
        ``limit`` tokens of ``prompt`` and longer than ``beyond``."""
        p = np.asarray(prompt[:limit], dtype=np.int32)
        with self._lock:
            fits = [e for e in self._expected if e.scope == scope
                    and beyond < len(e.tokens) <= len(p) and len(e.tokens) >= self.min_tokens
                    and common_prefix(e.tokens, p) == len(e.tokens)]
        return max(fits, key=lambda e: len(e.tokens), default=None)

    def wait(self, expected: Expected, timeout: float) -> bool:
        """Wait until ``expected`` is settled; False if ``timeout`` seconds passed first."""
        with self._lock:
            self.stats.awaited += 1
            return self._settled.wait_for(lambda: expected.settled, timeout)

    def remember_prompt(self, scope: str, prompt: Sequence[int]) -> None:
        """A prompt to compare later ones of its scope with (``points``)."""
        if not self.enabled:
            return
        key = _key(scope, prompt)
        with self._lock:
            self._history.pop(key, None)
            self._history[key] = (scope, np.asarray(prompt, dtype=np.int32))
            while len(self._history) > self._history_len:
                self._history.popitem(last=False)

    def as_dict(self) -> dict[str, int]:
        with self._lock:
            return {**self.stats.as_dict(), "entries": len(self._entries),
                    "bytes": self._bytes, "max_bytes": self.max_bytes}


def _key(scope: str, tokens: Sequence[int]) -> bytes:
    return scope.encode() + b"\x00" + np.asarray(tokens, dtype=np.int32).tobytes()
