"""An open session's in-memory state, the registry of open sessions, and a session's queued
deferred write: the data every other engine module reads and changes, with no behaviour
of its own beyond keeping itself consistent.

* ``Session``: one open session (its store record ``rec``, the tail kept for drafting, the
  pending response, the last draft, the deferred-commit state that ``ingest.py``
  maintains) and its ``lock``;
* ``SessionRegistry`` (no I/O): ``get(ns, sid)`` (validated lookup, NotFound),
  ``add(sess)`` (the per-namespace and namespace-count limits; ``check_room(ns)`` asks
  without adding), ``remove(ns, sid)``,
  ``sessions(ns)``, ``idle(now, ttl)``, ``snapshot()`` and ``live(keys)`` for the counters,
  ``load(sess)`` at start-up;
* ``DeferredBatch`` and ``end_batch(sess)``: the deferred appends of a session queued as
  one store write (ingest.py queues them, sessions.py and namespace_drop.py end them).

Locks: ``SessionRegistry.lock`` guards the registry's two dictionaries, for dictionary
operations only, never across I/O; ``DeferredBatch.lock`` a queued batch against the
store's writer thread sealing it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from suffixcache.store import DiskFullError

from ..common.config import Limits
from ..common.errors import AlreadyExists, NotFound, ResourceExhausted, Unavailable
from .validation import Validator

if TYPE_CHECKING:
    from suffixcache.store import Txn

# Tokens of each session kept in Python for drafting without asking the tree for the
# whole session; the drafter matches at most max_depth tokens back.
TAIL_KEEP = 1024


class Session:
    __slots__ = (
        "ns", "id", "rec", "tail", "pending", "last_draft", "lock", "closed", "last",
        "durable_tokens", "last_commit", "write_error", "failed_commit", "batch", "users",
    )

    def __init__(self, ns: str, sid: str, rec: dict[str, Any]) -> None:
        self.ns = ns
        self.id = sid
        self.rec = rec
        self.tail: list[int] = []
        self.pending: list[int] = []  # generated tokens of the response in progress
        self.last_draft: Any = None
        self.lock = threading.Lock()
        self.closed = False
        self.last = float(rec.get("last", time.time()))
        # Generations running on the session (Sessions.hold / release, with ``lock``
        # held): the idle reaper never closes a session while one runs, and its idle
        # time starts when the last one ends (a long prompt or a wait for the model
        # appends nothing for a while).
        self.users = 0
        # Deferred commits (step streams with defer_commit): the session length known
        # committed, the latest queued commit, and the error of a failed one (the session
        # then refuses appends: its trees hold tokens its store lost).
        self.durable_tokens = int(rec.get("tokens", 0))
        self.last_commit: Future[Any] | None = None
        self.write_error: BaseException | None = None
        # The commit whose failure set write_error (the session's first failed write):
        # when it is a durable stream step's own, and nothing was queued after it, the
        # step is undone and the session goes on (ingest.py, undo_step).
        self.failed_commit: Future[Any] | None = None
        # The session's queued deferred write that later deferred appends may still join
        # (see DeferredBatch below); None when there is none or it can no longer grow.
        self.batch: DeferredBatch | None = None

    def check_writable(self) -> None:
        """Refuse a write (appends, and inside the store's writer thread every queued write
        of the session) once one of the session's writes failed: the store then never
        holds a later write of a session without an earlier one."""
        exc = self.write_error
        if exc is not None:
            error = ResourceExhausted if isinstance(exc, DiskFullError) else Unavailable
            raise error(
                f"a commit of session {self.id!r} in namespace {self.ns!r} failed ({exc}); "
                "tokens acknowledged before it (deferred steps) were not stored, and the "
                "session now holds only what was: close it and open another"
            )

    def push_tail(self, tokens: Sequence[int]) -> None:
        self.tail.extend(tokens)
        if len(self.tail) > 2 * TAIL_KEEP:
            del self.tail[: len(self.tail) - TAIL_KEEP]

    def info(self) -> dict[str, Any]:
        return {
            "namespace": self.ns,
            "session_id": self.id,
            "metadata": dict(self.rec.get("meta", {})),
            "tokens": int(self.rec.get("tokens", 0)),
            "created_at": float(self.rec.get("created", 0.0)),
            "last_active_at": self.last,
            "responses": int(self.rec.get("n_responses", 0)),
        }


class SessionRegistry:
    """The open sessions by (namespace, id), and how many each namespace has."""

    def __init__(self, limits: Limits, validator: Validator) -> None:
        self.limits = limits
        self.validator = validator
        self.lock = threading.Lock()
        self._sessions: dict[tuple[str, str], Session] = {}
        self._ns_sessions: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, ns: str, sid: str) -> Session:
        self.validator.check_name("namespace", ns)
        self.validator.check_name("session_id", sid)
        with self.lock:
            sess = self._sessions.get((ns, sid))
        if sess is None:
            raise NotFound(f"no open session {sid!r} in namespace {ns!r}")
        return sess

    def add(self, sess: Session) -> None:
        """Register a new session, within the limits (AlreadyExists, ResourceExhausted)."""
        ns, sid = sess.ns, sess.id
        with self.lock:
            if (ns, sid) in self._sessions:
                raise AlreadyExists(f"session {sid!r} already exists in namespace {ns!r}")
            n = self._ns_sessions.get(ns, 0)
            self._refuse_past_limit(ns, n)
            self._sessions[(ns, sid)] = sess
            self._ns_sessions[ns] = n + 1

    def check_room(self, ns: str) -> None:
        """``add``'s limit without adding: whether ``ns`` may open one more session."""
        with self.lock:
            n = self._ns_sessions.get(ns, 0)
        self._refuse_past_limit(ns, n)

    def _refuse_past_limit(self, ns: str, n: int) -> None:
        if n >= self.limits.max_sessions_per_namespace:
            raise ResourceExhausted(
                f"namespace {ns!r} has {n} open sessions; the limit is "
                f"{self.limits.max_sessions_per_namespace} (--max-sessions): close some "
                "first"
            )

    def load(self, sess: Session) -> None:
        """Register a stored session at start-up (whatever the limits are now)."""
        self._sessions[(sess.ns, sess.id)] = sess
        self._ns_sessions[sess.ns] = self._ns_sessions.get(sess.ns, 0) + 1

    def remove(self, ns: str, sid: str) -> None:
        with self.lock:
            self._sessions.pop((ns, sid), None)
            n = self._ns_sessions.get(ns, 0) - 1
            if n <= 0:
                self._ns_sessions.pop(ns, None)
            else:
                self._ns_sessions[ns] = n

    def has_namespace(self, ns: str) -> bool:
        return ns in self._ns_sessions

    def namespaces(self) -> set[str]:
        with self.lock:
            return set(self._ns_sessions)

    def sessions(self, ns: str | None = None) -> list[Session]:
        with self.lock:
            return [s for (n, _), s in self._sessions.items() if not ns or n == ns]

    def idle(self, now: float, ttl: float) -> list[Session]:
        """Sessions idle longer than ``ttl``: no generation on them (``users``), and
        nothing appended for that long."""
        with self.lock:
            return [s for s in self._sessions.values()
                    if not s.users and now - s.last > ttl]

    def snapshot(self) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
        """Open sessions per namespace, and each open session's length."""
        with self.lock:
            open_by_ns = dict(self._ns_sessions)
            sess_tokens = {k: int(s.rec.get("tokens", 0)) for k, s in self._sessions.items()}
        return open_by_ns, sess_tokens

    def live(self, keys: Iterable[tuple[str, str]]) -> set[tuple[str, str]]:
        """The (ns, sid) keys still worth storing: namespaces ("" sid) and open sessions."""
        with self.lock:
            return {k for k in keys if k[1] == "" or k in self._sessions}


class DeferredBatch:
    """A session's deferred appends (kinds other than "response") queued as one store
    write: the chunks they add, numbered when appended, and the session record after them.

    Deferred steps arrive faster than commits: each used to queue a write of its own (a
    chunk, the session record, a future and a callback per step, all run by the store's
    writer thread while it holds the GIL). Now a step joins the session's batch while that
    is still queued, extending its last chunk when the kind is the same, so a commit group
    writes one chunk and one record per session however many steps it covers. The writer
    seals the batch when it runs it; a step after that starts the next batch, queued behind
    it, so the store sees the session's appends in order. Every step of a batch is durable
    when the batch's future is done (sess.last_commit)."""

    __slots__ = ("sess", "chunks", "open", "rec", "sealed", "lazy", "alone")

    # Guards every batch's open/chunks/rec against the writer thread sealing it; held for
    # a few dictionary and list operations only.
    lock = threading.Lock()

    def __init__(self, sess: Session, no: int, kind: str, tokens: list[int],
                 lazy: bool, alone: bool = False) -> None:
        self.sess = sess
        self.lazy = lazy  # queued as a lazy store write (Store.submit)
        # a durable stream step's own write: nothing joins it, so its failure undoes
        # exactly that step (ingest.py, undo_step)
        self.alone = alone
        self.chunks: list[tuple[int, str, list[int]]] = [(no, kind, tokens)]
        self.open = True  # later deferred appends of the session may still join
        # The session record to store: snapshot taken when the batch stops growing.
        self.rec: dict[str, Any] | None = None
        self.sealed: tuple[list[tuple[int, str, list[int]]], dict[str, Any]] | None = None

    def close(self) -> None:
        """Stop growing (with the batch lock held): the record as it is now is the one to
        store, because the session's next writes are not part of this batch."""
        if self.open:
            self.open = False
            self.rec = dict(self.sess.rec)
            if self.sess.batch is self:
                self.sess.batch = None

    def write(self, t: Txn) -> int:
        """The store job. Sealed on the first run, so a replayed transaction (map resize,
        a failed group retried job by job) writes exactly the same thing."""
        # after a failed write of the session, none of its later ones may land
        self.sess.check_writable()
        if self.sealed is None:
            with DeferredBatch.lock:
                self.close()
                assert self.rec is not None
                self.sealed = (self.chunks, self.rec)
        chunks, rec = self.sealed
        ns, sid = self.sess.ns, self.sess.id
        for no, kind, toks in chunks:
            t.put_chunk(ns, sid, no, kind, toks)
        t.put_session(rec)
        return int(rec["tokens"])


def end_batch(sess: Session) -> None:
    """Stop the session's queued deferred batch from growing: its next append starts
    another (before the session closes or its namespace is dropped)."""
    with DeferredBatch.lock:
        if sess.batch is not None:
            sess.batch.close()
