"""SuffixCache: the per-namespace hierarchy of suffix trees.

Per namespace:

* a **global tree** of finished responses, bounded by a token budget; the
  oldest responses are evicted first;
* a **corpus tree** of warmed documents;
* a **session tree** per live session, holding everything the session has seen
  (prompts, tool outputs, responses) as one growing sequence, so that a 40-turn
  agent loop indexes each token once, not once per turn.

Locking: one lock per tree, held only for the native call (which releases the
GIL). A draft takes the locks of its session, global and corpus trees in that
fixed order; writers take one lock at a time, so there is no deadlock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from suffixcache._native import SuffixTree

SESSION_SEQ = 0  # a session tree holds one sequence: the session's transcript


class LockedTree:
    """A native tree with the lock that serialises access to it."""

    __slots__ = ("tree", "lock")

    def __init__(self, max_depth: int, vocab_size: int) -> None:
        self.tree = SuffixTree(max_depth, vocab_size)
        self.lock = threading.Lock()

    def stats(self) -> dict[str, int]:
        with self.lock:
            t = self.tree
            return {
                "sequences": t.num_sequences,
                "tokens": t.num_tokens,
                "nodes": t.num_nodes,
                "bytes": t.memory_bytes,
            }


class DraftSources:
    """Trees locked for one draft, in a fixed order (a plain class: a generator-based
    context manager cost a tenth of a draft)."""

    __slots__ = ("_named", "_held")

    def __init__(self, named: list[tuple[str, LockedTree]]) -> None:
        self._named = named
        self._held = 0

    def __enter__(self) -> list[tuple[str, SuffixTree, int]]:
        # __exit__ runs only if __enter__ returns: on any failure here, release at once
        try:
            for _, locked in self._named:
                locked.lock.acquire()
                self._held += 1
            return [
                (name, locked.tree, SESSION_SEQ if name == "session" else -1)
                for name, locked in self._named
                if locked.tree.num_tokens > 0
            ]
        except BaseException:
            self._release()
            raise

    def __exit__(self, *exc_info: object) -> None:
        self._release()

    def _release(self) -> None:
        for _, locked in self._named[: self._held]:
            locked.lock.release()
        self._held = 0


@dataclass
class Namespace:
    name: str
    global_tree: LockedTree
    corpus_tree: LockedTree
    sessions: dict[str, LockedTree] = field(default_factory=dict)
    # response seq id -> token count, oldest first (the eviction order)
    responses: OrderedDict[int, int] = field(default_factory=OrderedDict)
    response_tokens: int = 0
    evictions: int = 0


class SuffixCache:
    """Suffix trees per namespace: global responses, warmed corpus, live sessions."""

    def __init__(
        self,
        *,
        max_depth: int = 64,
        global_budget_tokens: int = 4_000_000,
        vocab_size: int = 0,
    ) -> None:
        if not 1 <= max_depth <= 4096:
            raise ValueError("max_depth must be in [1, 4096]")
        if global_budget_tokens < 1:
            raise ValueError("global_budget_tokens must be >= 1")
        self.max_depth = max_depth
        self.global_budget_tokens = global_budget_tokens
        self.vocab_size = vocab_size
        self._namespaces: dict[str, Namespace] = {}
        self._lock = threading.Lock()  # guards the dicts, never held during native work

    # ------------------------------------------------------------ namespaces

    def _new_tree(self) -> LockedTree:
        return LockedTree(self.max_depth, self.vocab_size)

    def namespace(self, name: str) -> Namespace:
        ns = self._namespaces.get(name)
        if ns is not None:
            return ns
        if not isinstance(name, str):
            raise TypeError("namespace must be a str")
        with self._lock:
            ns = self._namespaces.get(name)
            if ns is None:
                ns = Namespace(name, self._new_tree(), self._new_tree())
                self._namespaces[name] = ns
            return ns

    def namespaces(self) -> list[str]:
        return sorted(self._namespaces)

    def has_namespace(self, name: str) -> bool:
        return name in self._namespaces

    def drop_namespace(self, name: str) -> bool:
        """Forget a namespace and all its trees; False if there was none."""
        with self._lock:
            return self._namespaces.pop(name, None) is not None

    # ------------------------------------------------------------ global tree

    def add_response(self, namespace: str, seq_id: int, tokens: Sequence[int]) -> list[int]:
        """Adds a finished response; returns the ids it evicted (oldest first) for the budget."""
        ns = self.namespace(namespace)
        n = len(tokens)
        with ns.global_tree.lock:
            if seq_id in ns.global_tree.tree:
                raise ValueError(f"response {seq_id} already exists in namespace {namespace!r}")
            ns.global_tree.tree.extend(seq_id, tokens)
        evicted: list[int] = []
        with self._lock:
            ns.responses[seq_id] = n
            ns.response_tokens += n
            while ns.response_tokens > self.global_budget_tokens and len(ns.responses) > 1:
                old_id, old_n = ns.responses.popitem(last=False)
                ns.response_tokens -= old_n
                ns.evictions += 1
                evicted.append(old_id)
        for old_id in evicted:
            with ns.global_tree.lock:
                ns.global_tree.tree.remove(old_id)
        return evicted

    def remove_response(self, namespace: str, seq_id: int) -> bool:
        ns = self.namespace(namespace)
        with self._lock:
            n = ns.responses.pop(seq_id, None)
            if n is None:
                return False
            ns.response_tokens -= n
        with ns.global_tree.lock:
            return bool(ns.global_tree.tree.remove(seq_id))

    def response_ids(self, namespace: str) -> list[int]:
        """Response ids in eviction order (oldest first)."""
        return list(self.namespace(namespace).responses)

    # ------------------------------------------------------------ corpus tree

    def add_corpus(self, namespace: str, seq_id: int, tokens: Sequence[int]) -> None:
        ns = self.namespace(namespace)
        with ns.corpus_tree.lock:
            if seq_id in ns.corpus_tree.tree:
                raise ValueError(
                    f"corpus sequence {seq_id} already exists in namespace {namespace!r}"
                )
            ns.corpus_tree.tree.extend(seq_id, tokens)

    def remove_corpus(self, namespace: str, seq_id: int) -> bool:
        ns = self.namespace(namespace)
        with ns.corpus_tree.lock:
            return bool(ns.corpus_tree.tree.remove(seq_id))

    # ------------------------------------------------------------ sessions

    def open_session(self, namespace: str, session_id: str, tokens: Sequence[int] = ()) -> None:
        ns = self.namespace(namespace)
        tree = self._new_tree()
        if tokens:
            tree.tree.extend(SESSION_SEQ, tokens)
        with self._lock:
            if session_id in ns.sessions:
                raise KeyError(f"session {session_id!r} already exists in namespace {namespace!r}")
            ns.sessions[session_id] = tree

    def _session(self, namespace: str, session_id: str) -> LockedTree:
        ns = self._namespaces.get(namespace)
        tree = ns.sessions.get(session_id) if ns is not None else None
        if tree is None:
            raise KeyError(f"no session {session_id!r} in namespace {namespace!r}")
        return tree

    def has_session(self, namespace: str, session_id: str) -> bool:
        ns = self._namespaces.get(namespace)
        return ns is not None and session_id in ns.sessions

    def append_session(self, namespace: str, session_id: str, tokens: Sequence[int]) -> None:
        """Appends to the session's transcript: cost proportional to len(tokens)."""
        tree = self._session(namespace, session_id)
        with tree.lock:
            tree.tree.extend(SESSION_SEQ, tokens)

    def session_tokens(self, namespace: str, session_id: str) -> list[int]:
        tree = self._session(namespace, session_id)
        with tree.lock:
            if SESSION_SEQ not in tree.tree:
                return []
            return list(tree.tree.seq_tokens(SESSION_SEQ))

    def session_bytes(self, namespace: str, session_id: str) -> int:
        """The session tree's measured memory (cheap: no walk of the tree)."""
        tree = self._session(namespace, session_id)
        with tree.lock:
            return int(tree.tree.memory_bytes)

    def session_length(self, namespace: str, session_id: str) -> int:
        tree = self._session(namespace, session_id)
        with tree.lock:
            return tree.tree.seq_length(SESSION_SEQ) if SESSION_SEQ in tree.tree else 0

    def close_session(self, namespace: str, session_id: str) -> None:
        ns = self._namespaces.get(namespace)
        with self._lock:
            if ns is None or ns.sessions.pop(session_id, None) is None:
                raise KeyError(f"no session {session_id!r} in namespace {namespace!r}")

    def session_ids(self, namespace: str) -> list[str]:
        ns = self._namespaces.get(namespace)
        return sorted(ns.sessions) if ns is not None else []

    # ------------------------------------------------------------ drafting support

    def draft_sources(self, namespace: str, session_id: str | None) -> DraftSources:
        """The non-empty trees to draft from, most local first, locked while the
        returned context lasts (``with cache.draft_sources(ns, sid) as sources:``).

        Each comes with the id of the sequence that may end with the drafting
        context itself (the session transcript), or -1.
        """
        ns = self._namespaces.get(namespace)
        if ns is None:
            return DraftSources([])
        named: list[tuple[str, LockedTree]] = []
        if session_id is not None:
            session = ns.sessions.get(session_id)
            if session is None:
                raise KeyError(f"no session {session_id!r} in namespace {namespace!r}")
            named.append(("session", session))
        named.append(("global", ns.global_tree))
        named.append(("corpus", ns.corpus_tree))
        return DraftSources(named)

    # ------------------------------------------------------------ figures

    def stats(self, namespace: str | None = None) -> dict[str, Any]:
        names: Iterable[str] = [namespace] if namespace is not None else self.namespaces()
        out: dict[str, Any] = {}
        for name in names:
            ns = self._namespaces.get(name)
            if ns is None:
                continue
            g = ns.global_tree.stats()
            g["evictions"] = ns.evictions
            g["budget_tokens"] = self.global_budget_tokens
            sessions = {"count": 0, "tokens": 0, "nodes": 0, "bytes": 0}
            for tree in list(ns.sessions.values()):
                s = tree.stats()
                sessions["count"] += 1
                for key in ("tokens", "nodes", "bytes"):
                    sessions[key] += s[key]
            out[name] = {"global": g, "corpus": ns.corpus_tree.stats(), "sessions": sessions}
        return out

    def memory(self) -> dict[str, dict[str, int]]:
        """Trees, tokens and bytes by kind ("session", "global", "corpus") over every
        namespace."""
        out = {k: {"trees": 0, "tokens": 0, "bytes": 0} for k in ("session", "global", "corpus")}
        for ns in list(self._namespaces.values()):
            for kind, trees in (("global", [ns.global_tree]), ("corpus", [ns.corpus_tree]),
                                ("session", list(ns.sessions.values()))):
                m = out[kind]
                for tree in trees:
                    with tree.lock:
                        m["trees"] += 1
                        m["tokens"] += int(tree.tree.num_tokens)
                        m["bytes"] += int(tree.tree.memory_bytes)
        return out

    def check_integrity(self) -> None:
        """Runs the native integrity check on every tree (slow; for tests and `--check`)."""
        for ns in list(self._namespaces.values()):
            for tree in [ns.global_tree, ns.corpus_tree, *list(ns.sessions.values())]:
                with tree.lock:
                    tree.tree.check_integrity()
