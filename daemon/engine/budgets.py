"""Bounded state: which namespaces may hold state, and the session trees' budgets.

Interface (one of each per Engine):

* ``NamespaceLimit``: ``admit(ns)`` before anything creates state for a namespace it
  does not hold yet (a session, stored counters: a Speculate in a new namespace creates
  them, a corpus file); ResourceExhausted once ``Limits.max_namespaces`` namespaces hold
  state; ``check(ns)`` the same question without letting it in. ``names()``: every
  namespace holding state, sorted; ``forget(ns)`` after a drop.
  The fleet's replicas are not admitted (a peer's data must not be refused) but count.
* ``SessionBudgets``: ``check(items)`` before an append (or a session's opening) with
  the session locks held, ResourceExhausted naming the limit when it would pass
  ``max_session_tokens`` / ``max_session_bytes`` (one session) or
  ``max_total_session_tokens`` / ``max_total_session_bytes`` (all of them); ``grew(sess,
  n)`` once the session's tree took ``n`` tokens (its measured size is read then);
  ``opened(sess, n)`` / ``dropped(ns, sid)`` when a session's tree comes and goes.
  (Stats' memory by tree kind comes from ``SuffixCache.memory``: Engine.memory.)

The policy is to refuse, never to evict another session's tree: a session's context is
what its agent is working with, and losing it behind the agent's back costs more than a
clear error (close idle sessions, or let the idle timeout do it). Byte budgets are
checked against the sizes measured after the previous append, and concurrent appends of
different sessions are checked apart, so a budget may be passed by one call's size.

``lock`` guards the figures (a leaf lock: nothing is called while it is held).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ..common.config import Limits
from ..common.errors import ResourceExhausted

if TYPE_CHECKING:
    from suffixcache import SuffixCache

    from .counters import Counters
    from .session_state import Session, SessionRegistry


class NamespaceLimit:
    def __init__(self, limits: Limits, cache: SuffixCache, registry: SessionRegistry,
                 counters: Counters) -> None:
        self.limits = limits
        self.cache = cache
        self.registry = registry
        self.counters = counters
        self.lock = threading.Lock()
        # Namespaces let in since start-up (or found holding state): the fast path.
        self._admitted: set[str] = set()

    def _holds_state(self, ns: str) -> bool:
        return (self.cache.has_namespace(ns) or self.counters.has_namespace(ns)
                or self.registry.has_namespace(ns))

    def known(self) -> set[str]:
        """Every namespace let in or holding state."""
        with self.lock:
            known = set(self._admitted)
        known.update(self.cache.namespaces(), self.counters.namespaces(),
                     self.registry.namespaces())
        return known

    def admit(self, ns: str) -> bool:
        """Let ``ns`` hold state (ResourceExhausted past the limit); True when this call let
        it in (the caller may ``forget`` it again if it then creates nothing)."""
        if ns in self._admitted:
            return False
        if self._holds_state(ns):
            with self.lock:
                self._admitted.add(ns)
            return False
        with self.lock:
            # Held across the count, so two new namespaces cannot both take the last place.
            self._check_locked(ns)
            fresh = ns not in self._admitted
            self._admitted.add(ns)
            return fresh

    def check(self, ns: str) -> None:
        """``admit`` without letting it in: whether a request creating state in ``ns``
        would be refused (checked before anything is changed)."""
        if ns in self._admitted or self._holds_state(ns):
            return
        with self.lock:
            self._check_locked(ns)

    def _check_locked(self, ns: str) -> None:
        known = self._admitted | set(self.cache.namespaces()) \
            | self.counters.namespaces() | self.registry.namespaces()
        if ns not in known and len(known) >= self.limits.max_namespaces:
            raise ResourceExhausted(
                f"{len(known)} namespaces hold state; the limit is "
                f"{self.limits.max_namespaces} (--max-namespaces): drop one first "
                "(suffixd namespaces drop NAME)"
            )

    def forget(self, ns: str) -> None:
        with self.lock:
            self._admitted.discard(ns)


class SessionBudgets:
    def __init__(self, limits: Limits, cache: SuffixCache) -> None:
        self.limits = limits
        self.cache = cache
        self.lock = threading.Lock()
        self._bytes: dict[tuple[str, str], int] = {}
        self._tokens: dict[tuple[str, str], int] = {}
        self.total_bytes = 0
        self.total_tokens = 0

    def check(self, items: list[tuple[Session, int]]) -> None:
        """Whether these sessions may take these many tokens more (one entry per session,
        a session being opened with its initial tokens included)."""
        lim = self.limits
        with self.lock:
            total_bytes, total_tokens = self.total_bytes, self.total_tokens
            sizes = [(self._tokens.get((s.ns, s.id), 0), self._bytes.get((s.ns, s.id), 0))
                     for s, _ in items]
        added = 0
        for (sess, n), (tokens, nbytes) in zip(items, sizes, strict=True):
            if not n:
                continue
            added += n
            if tokens + n > lim.max_session_tokens:
                raise ResourceExhausted(
                    f"session {sess.id!r} in namespace {sess.ns!r} would hold {tokens + n} "
                    f"tokens; the limit per session is {lim.max_session_tokens} "
                    "(--max-session-tokens): close it and open another"
                )
            if nbytes >= lim.max_session_bytes:
                raise ResourceExhausted(
                    f"session {sess.id!r} in namespace {sess.ns!r} holds a tree of {nbytes} "
                    f"bytes; the limit per session is {lim.max_session_bytes} bytes "
                    "(--max-session-bytes): close it and open another"
                )
        if not added:
            return
        if total_tokens + added > lim.max_total_session_tokens:
            raise ResourceExhausted(
                f"all sessions together would hold {total_tokens + added} tokens; the limit "
                f"is {lim.max_total_session_tokens} (--max-total-session-tokens): close "
                "sessions first"
            )
        if total_bytes >= lim.max_total_session_bytes:
            raise ResourceExhausted(
                f"the session trees hold {total_bytes} bytes; the limit is "
                f"{lim.max_total_session_bytes} bytes (--max-total-session-bytes): close "
                "sessions first"
            )

    def grew(self, sess: Session, n: int) -> None:
        """The session's tree took ``n`` tokens (0: it was just created or loaded)."""
        try:
            nbytes = self.cache.session_bytes(sess.ns, sess.id)
        except KeyError:  # closed meanwhile
            return
        key = (sess.ns, sess.id)
        with self.lock:
            self.total_bytes += nbytes - self._bytes.get(key, 0)
            self._bytes[key] = nbytes
            self._tokens[key] = self._tokens.get(key, 0) + n
            self.total_tokens += n

    def opened(self, sess: Session, tokens: int) -> None:
        self.grew(sess, tokens)

    def dropped(self, ns: str, sid: str) -> None:
        with self.lock:
            self.total_bytes -= self._bytes.pop((ns, sid), 0)
            self.total_tokens -= self._tokens.pop((ns, sid), 0)
