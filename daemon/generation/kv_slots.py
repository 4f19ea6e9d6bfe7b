"""Per-session KV slots of the verifier's llama.cpp context.

Each session owns one sequence id ("slot") of the context, a KV stream of its own
(``kv_unified`` off) of ``n_ctx`` cells, and keeps it between turns so that a new
prompt only pays for the tokens after its longest common prefix with what the slot
holds. A new session takes a free id next to the busy ones (consecutive ids share a
ubatch), else, when every id is taken, the idle slot next to busy ones or else the least
recently used gives its id up.

Interface (``KvSlots``, a mixin of ``Verifier``; the host sets ``_llama_cpp``,
``_mem``, ``n_ctx`` and ``n_swa`` and calls ``_init_slots`` in its constructor):

* ``_acquire_slot(key)`` / ``_release_slot(slot)``: the session's ``Slot``, marked busy
  (waits while it is busy elsewhere or no id is free); released, it becomes the most
  recently used.
* ``_make_room(slot, needed)``: raises ``ContextOverflowError`` if ``needed`` more
  tokens do not fit the slot; ``check_fits(prompt_tokens)`` whether a prompt fits at all.
* ``_reusable_prefix(slot, common)``: drops what the slot holds after the first
  ``common`` tokens and returns how many it kept.
* ``_seq_rm(seq_id, p0)``: removes positions ``p0..`` of a sequence (draft rollback).
* ``forget(key)``, ``cached_tokens(key)``: a session's KV dropped, or what it holds.
* ``_restore_checkpoint(slot, scope, prompt, common)`` / ``_save_checkpoint(slot, scope)``: a slot
  started from the host-memory prompt cache (``prompt_cache``, shared by every
  session), and a slot's state kept there.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from .prompt_cache import PromptCache

log = logging.getLogger("suffixd.verifier")

class ContextOverflowError(ValueError):
    """The prompt (plus what must be generated) does not fit the context window."""


def _busy_neighbours(seq_id: int, busy: set[int]) -> int:
    return (seq_id - 1 in busy) + (seq_id + 1 in busy)


def pick_free_id(free: Sequence[int], busy: set[int]) -> int:
    """The free sequence id for a new session: next to busy ones first (llama.cpp puts
    only sequences of consecutive ids in one ubatch: two agents in ids 0 and 2 cost a
    step two passes over the weights, 127 ms where ids 0 and 1 took 87 on the 2-core
    EPYC), then the lowest."""
    return min(free, key=lambda s: (-_busy_neighbours(s, busy), s))


def pick_victim(idle: Sequence[tuple[float, int, str]], busy: set[int]) -> str:
    """The idle slot (last used, sequence id, session key) a new session takes when no id
    is free: next to busy ones first, then the least recently used. A session whose slot
    is taken restarts, when it returns, from its best checkpoint in the prompt cache."""
    return min(idle, key=lambda t: (-_busy_neighbours(t[1], busy), t[0], t[1]))[2]


@dataclass
class Slot:
    seq_id: int
    tokens: list[int] = field(default_factory=list)  # exactly what the KV cache holds
    last_used: float = 0.0
    busy: bool = False


class KvSlots:
    """The slot table over the host's llama.cpp memory (see the module docstring)."""

    # Set by the host (Verifier): the llama_cpp module, the context (its ``ctx``) and its
    # memory handle, the cells per slot and the sliding window (0: none).
    _llama_cpp: Any
    _ctx: Any
    _mem: Any
    n_ctx: int
    n_swa: int

    # The longest checkpoint restored (None: any). The verifier's deterministic mode sets
    # it for a model with sliding-window layers: a restored checkpoint lays the window's
    # cells out from the first cell, where evaluating the same prompt leaves them at other
    # cells once positions have left the window, and attention sums over cells in their
    # order (a prompt of 520 tokens restored gave logits a few ulps off; of 512, the same).
    restore_limit: int | None = None

    def _memory_guard(self) -> AbstractContextManager[Any]:
        """Held around changes to a slot's KV that is not stepping (eviction, a new
        prompt's rollback, forget): the host makes them wait for a gap between decodes."""
        return nullcontext()

    def _init_slots(self, n_slots: int, prompt_cache_bytes: int = 0) -> None:
        self._slots_lock = threading.Condition()
        self._slots: dict[str, Slot] = {}
        self._free_seq_ids = list(range(n_slots))
        self.n_slots = n_slots
        self.prompt_cache = PromptCache(prompt_cache_bytes)
        # One buffer for every checkpoint save, grown as needed: a fresh one per save was
        # zero-filled (page-faulted) while the save held the model (see _save_checkpoint).
        self._state_lock = threading.Lock()
        self._state_buf: ctypes.Array[ctypes.c_uint8] = (ctypes.c_uint8 * 0)()

    def _seq_rm(self, seq_id: int, p0: int) -> None:
        if not self._llama_cpp.llama_memory_seq_rm(self._mem, seq_id, p0, -1):
            # A partial removal can fail (e.g. recurrent models): drop the whole sequence.
            self._llama_cpp.llama_memory_seq_rm(self._mem, seq_id, -1, -1)
            raise RuntimeError("KV cache rollback failed")

    def _acquire_slot(self, key: str) -> Slot:
        with self._slots_lock:
            while True:
                taken = self._take_slot(key)
                if taken is not None:
                    break
                self._slots_lock.wait()
        slot, evicted = taken
        if evicted:
            # Outside the slot table's lock: the guard waits for the model, and a holder of
            # the model (the cost measurement) may be waiting for the table meanwhile. The
            # slot is already this caller's, so nothing else touches its sequence.
            with self._memory_guard():
                self._llama_cpp.llama_memory_seq_rm(self._mem, slot.seq_id, -1, -1)
        return slot

    def _try_acquire_slot(self, key: str) -> Slot | None:
        """The slot for ``key`` now, or None when every slot is busy; for a caller that
        already holds the model alone (an idle slot's eviction runs without the guard,
        which would wait for that very hold)."""
        with self._slots_lock:
            taken = self._take_slot(key)
        if taken is None:
            return None
        slot, evicted = taken
        if evicted:
            self._llama_cpp.llama_memory_seq_rm(self._mem, slot.seq_id, -1, -1)
        return slot

    def _take_slot(self, key: str) -> tuple[Slot, bool] | None:
        """Marks ``key``'s slot busy (a free sequence, else the idle one ``pick_victim``
        chooses) and says whether an evicted session's KV is still to be removed from it;
        None when every slot is busy. Called with the slot table's lock held."""
        slot = self._slots.get(key)
        if slot is not None:
            if slot.busy:
                return None
            slot.busy = True
            return slot, False
        busy = {s.seq_id for s in self._slots.values() if s.busy}
        evicted = not self._free_seq_ids
        if self._free_seq_ids:
            seq_id = pick_free_id(self._free_seq_ids, busy)
            self._free_seq_ids.remove(seq_id)
        else:
            idle = [(s.last_used, s.seq_id, k) for k, s in self._slots.items() if not s.busy]
            if not idle:
                return None
            seq_id = self._slots.pop(pick_victim(idle, busy)).seq_id
        slot = Slot(seq_id=seq_id, busy=True)
        self._slots[key] = slot
        return slot, evicted

    def _release_slot(self, slot: Slot) -> None:
        with self._slots_lock:
            slot.busy = False
            slot.last_used = time.monotonic()
            self._slots_lock.notify_all()

    def _make_room(self, slot: Slot, needed: int) -> None:
        """Refuse what cannot fit the slot's context (each slot has its own KV stream of
        ``n_ctx`` cells, so sessions never evict each other's tokens to make room)."""
        self.check_fits(len(slot.tokens) + needed - 1)

    def check_fits(self, prompt_tokens: int) -> None:
        """Refuse a prompt that no slot can hold with the first token generated after it:
        ``generate`` would refuse it too (``_make_room``), but asked before anything is
        stored for the request, the refusal leaves no state behind."""
        if prompt_tokens + 1 > self.n_ctx:
            raise ContextOverflowError(
                f"context window of {self.n_ctx} tokens per session exceeded "
                f"({prompt_tokens + 1} needed)"
            )

    def _reusable_prefix(self, slot: Slot, common: int) -> int:
        """How much of the slot's first ``common`` tokens can be kept after dropping the
        rest: all of them, unless the sliding-window cache has already reused cells that
        the next position needs (a prompt parting more than a window before the slot's
        end); then none, and the prompt is evaluated again."""
        with self._memory_guard():
            return self._keep_prefix(slot, common)

    def _keep_prefix(self, slot: Slot, common: int) -> int:
        if common and self.n_swa and slot.tokens:
            # The window cache's oldest position, before dropping anything (it is -1 once
            # the rollback empties the window cache).
            oldest = int(self._llama_cpp.llama_memory_seq_pos_min(self._mem, slot.seq_id))
            if oldest > max(0, common - self.n_swa):
                self._llama_cpp.llama_memory_seq_rm(self._mem, slot.seq_id, -1, -1)
                slot.tokens = []
                return 0
        if common < len(slot.tokens):
            self._seq_rm(slot.seq_id, common)
            del slot.tokens[common:]
        return common

    def _restore_checkpoint(self, slot: Slot, scope: str, prompt: list[int],
                            common: int) -> int:
        """Start ``slot`` from the prompt cache's best checkpoint (of ``scope``) when it
        covers more than the ``common`` tokens the slot kept of it; returns how many
        prompt tokens the slot holds now. (A longer checkpoint is cut back to what the
        prompt shares only without sliding-window layers: see prompt_cache.)"""
        limit = len(prompt) - 1
        if self.restore_limit is not None:
            limit = min(limit, self.restore_limit)
        found = self.prompt_cache.best(scope, prompt, limit, partial=not self.n_swa)
        if found is None or found[1] <= common:
            return common
        cp, n = found
        # bytes are immutable: llama.cpp reads them in place, no copy
        src = ctypes.cast(ctypes.c_char_p(cp.state), ctypes.POINTER(ctypes.c_uint8))
        with self._memory_guard():
            read = self._llama_cpp.llama_state_seq_set_data(
                self._ctx.ctx, src, len(cp.state), slot.seq_id)
            if read != len(cp.state):
                # llama.cpp has cleared the sequence; evaluate the prompt from scratch
                self._llama_cpp.llama_memory_seq_rm(self._mem, slot.seq_id, -1, -1)
                slot.tokens = []
                log.warning("prompt cache: restoring %d tokens failed", len(cp.tokens))
                return 0
            slot.tokens = cp.tokens.tolist()
            if n < len(slot.tokens):
                self._seq_rm(slot.seq_id, n)
                del slot.tokens[n:]
        self.prompt_cache.record_hit(n)
        return n

    def _save_checkpoint(self, slot: Slot, scope: str) -> None:
        """Keep the slot's state (its KV for ``slot.tokens``) in the prompt cache.

        The model is held only for llama.cpp's copy into the reused buffer (every other
        sequence's step waits meanwhile); the copy out of it is made after."""
        ctx = self._ctx.ctx
        with self._state_lock:
            with self._memory_guard():
                size = int(self._llama_cpp.llama_state_seq_get_size(ctx, slot.seq_id))
                if len(self._state_buf) < size:
                    self._state_buf = (ctypes.c_uint8 * size)()
                written = int(self._llama_cpp.llama_state_seq_get_data(
                    ctx, self._state_buf, size, slot.seq_id))
            state = bytes(memoryview(self._state_buf)[:written]) if written else b""
        if state:
            self.prompt_cache.add(scope, slot.tokens, state)

    def forget(self, session_key: str) -> None:
        """Drop a session's KV cache (e.g. when the session is closed)."""
        with self._slots_lock:
            slot = self._slots.get(session_key)
            if slot is None or slot.busy:
                return
            del self._slots[session_key]  # its sequence is neither free nor taken meanwhile
        # the guard outside the table's lock, as in _acquire_slot
        with self._memory_guard():
            self._llama_cpp.llama_memory_seq_rm(self._mem, slot.seq_id, -1, -1)
        with self._slots_lock:
            self._free_seq_ids.append(slot.seq_id)
            self._slots_lock.notify_all()

    def cached_tokens(self, session_key: str) -> list[int]:
        with self._slots_lock:
            slot = self._slots.get(session_key)
            return list(slot.tokens) if slot else []
