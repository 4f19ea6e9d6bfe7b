"""The life of open sessions: open, close, idle expiry, start-up load. Their state
(``Session``, ``SessionRegistry``) is in session_state.py.

Interface:

* ``Sessions``: ``open``, ``close``, ``close_locked`` (the caller holds the session's
  lock), ``infos`` (the list of open sessions), ``describe``, ``tail``, ``expire_idle``
  (and ``reap_loop``, the ``suffixd-session-reaper`` thread), ``load`` (every stored
  session into the registry and its session tree, at start-up), ``hold`` / ``release``
  (a generation runs on the session: the reaper leaves it open until the last one ends,
  and its idle time starts then; ``open(..., hold=True)`` opens it held).

Locks: ``Session.lock`` serialises a session's writes: ``open`` holds it until the
session is durable (nobody can use it before), ``close`` while the close commits and the
trees follow; appends hold it too (ingest.py).

Durability: ``open`` returns once the session record (and its initial "prompt" chunk) is
committed; ``close`` once the record is deleted, a pending response stored as a global
sequence (``keep_responses``) or the session's responses deleted (not kept), and the
fleet's outbox entry committed with it. The trees follow after the commit.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from suffixcache.store import Store, Txn

from ..common.errors import NotFound
from .session_state import TAIL_KEEP, Session, SessionRegistry, end_batch

if TYPE_CHECKING:
    from suffixcache import SuffixCache

    from .budgets import NamespaceLimit
    from .counters import Counters
    from .ingest import Ingest
    from .trees import TreeIndex

log = logging.getLogger("suffixd.engine")

Publish = Callable[..., None]


class Sessions:
    def __init__(
        self,
        store: Store,
        cache: SuffixCache,
        registry: SessionRegistry,
        counters: Counters,
        trees: TreeIndex,
        ingest: Ingest,
        publish: Publish,
        namespaces: NamespaceLimit,
    ) -> None:
        self.store = store
        self.namespaces = namespaces
        self.budgets = ingest.budgets
        self.cache = cache
        self.registry = registry
        self.validator = registry.validator
        self.limits = registry.limits
        self.counters = counters
        self.trees = trees
        self.ingest = ingest
        self.publish = publish

    def load(self) -> int:
        """Every stored session into the registry and its session tree (start-up, before
        serving); returns their tokens."""
        n_tokens = 0
        for srec in self.store.iter_sessions():
            ns, sid = srec["ns"], srec["id"]
            toks = self.store.session_tokens(ns, sid)
            n_tokens += len(toks)
            self.cache.open_session(ns, sid, toks)
            sess = Session(ns, sid, srec)
            sess.push_tail(toks[-TAIL_KEEP:])
            self.registry.load(sess)
            self.budgets.opened(sess, len(toks))
        return n_tokens

    def open(
        self,
        ns: str,
        session_id: str | None = None,
        metadata: dict[str, str] | None = None,
        tokens: Sequence[int] = (),
        hold: bool = False,
    ) -> dict[str, Any]:
        """Open a session (durable when it returns). ``hold``: opened held by the caller's
        generation (``release`` when it ends), so the reaper cannot close it before the
        caller gets to it."""
        self.validator.check_name("namespace", ns)
        sid = session_id or secrets.token_hex(8)
        self.validator.check_name("session_id", sid)
        md = self.validator.check_metadata(metadata)
        toks = self.validator.check_tokens(tokens)
        now = time.time()
        rec = {"ns": ns, "id": sid, "meta": md, "created": now, "last": now,
               "tokens": 0, "chunks": 0, "n_responses": 0}
        sess = Session(ns, sid, rec)
        sess.lock.acquire()  # nobody may use the session before it is durable
        try:
            # (the budgets first: a refused opening must not take a namespace's place)
            self.budgets.check([(sess, len(toks))])
            admitted = self.namespaces.admit(ns)
            try:
                self.registry.add(sess)
            except BaseException:
                if admitted:  # a refused opening leaves no namespace behind
                    self.namespaces.forget(ns)
                raise
            try:
                def write(t: Txn) -> dict[str, Any]:
                    r = dict(rec)
                    if toks:
                        t.append_chunk(r, "prompt", toks)
                    else:
                        t.put_session(r)
                    return r

                sess.rec = self.store.write(write)
                sess.durable_tokens = int(sess.rec.get("tokens", 0))
                self.cache.open_session(ns, sid, toks)
                self.budgets.opened(sess, len(toks))
            except BaseException:
                self.registry.remove(ns, sid)
                if admitted:
                    self.namespaces.forget(ns)
                with contextlib.suppress(Exception):
                    self.store.write(lambda t: t.delete_session(ns, sid))
                raise
            sess.push_tail(toks)
            if hold:
                sess.users += 1
            return sess.info()
        finally:
            sess.lock.release()

    def hold(self, ns: str, sid: str) -> Session | None:
        """The open session ``sid``, held for a generation until ``release``: the idle
        reaper leaves it open meanwhile. None when it is not open (closed meanwhile: the
        caller opens it again)."""
        try:
            sess = self.registry.get(ns, sid)
        except NotFound:
            return None
        # under the session's lock: the reaper decides under it too, so a session is
        # either closed before this or held after it
        with sess.lock:
            if sess.closed:
                return None
            sess.users += 1
        return sess

    def release(self, sess: Session) -> None:
        """A generation on ``sess`` ended: its idle time starts now."""
        with sess.lock:
            sess.users = max(0, sess.users - 1)
            sess.last = time.time()

    def close(self, ns: str, sid: str, keep_responses: bool = True) -> dict[str, int]:
        sess = self.registry.get(ns, sid)
        with sess.lock:
            if sess.closed:
                raise NotFound(f"no open session {sid!r} in namespace {ns!r}")
            return self.close_locked(sess, keep_responses)

    def close_locked(self, sess: Session, keep_responses: bool) -> dict[str, int]:
        ns, sid = sess.ns, sess.id
        end_batch(sess)
        pending = list(sess.pending)
        pending_seq: list[int] = []

        def write(t: Txn) -> list[int]:
            pending_seq.clear()
            responses = t.session_responses(ns, sid)
            if pending and keep_responses:
                # A response still being generated when the session closes is finished now.
                pending_seq.append(t.add_sequence(ns, "response", pending, session=sid))
                self.publish(t, "resp", ns, seq=pending_seq[-1], tokens=pending)
            if not keep_responses:
                self.publish(t, "evict", ns, seqs=responses)
                for seq in responses:
                    t.delete_sequence(seq)
            t.delete_session(ns, sid)
            return responses

        responses: list[int] = self.store.write(write)
        sess.closed = True
        self.registry.remove(ns, sid)
        self.counters.forget_session(ns, sid)
        self.cache.close_session(ns, sid)
        self.budgets.dropped(ns, sid)
        kept = 0
        if keep_responses:
            for seq in pending_seq:
                self.trees.delete_sequences(self.cache.add_response(ns, seq, pending))
            # The truth: the global budget may have evicted older responses already.
            in_tree = set(self.cache.response_ids(ns))
            kept = sum(1 for seq in (*responses, *pending_seq) if seq in in_tree)
        else:
            self.trees.remove(ns, "response", responses)
        return {"tokens": int(sess.rec.get("tokens", 0)), "responses_kept": kept}

    def infos(self, ns: str | None = None) -> list[dict[str, Any]]:
        if ns:
            self.validator.check_name("namespace", ns)
        sessions = self.registry.sessions(ns)
        return [s.info() for s in sorted(sessions, key=lambda s: (s.ns, s.id))]

    def describe(
        self, ns: str, sid: str, tail_tokens: int = 0, include_counters: bool = False
    ) -> dict[str, Any]:
        sess = self.registry.get(ns, sid)
        info = sess.info()
        if tail_tokens:
            info["tail"] = self.tail(ns, sid, tail_tokens)
        if include_counters:
            info["counters"] = self.counters.session_counters(ns, sid)
        return info

    def tail(self, ns: str, sid: str, n: int) -> list[int]:
        sess = self.registry.get(ns, sid)
        if n <= len(sess.tail):
            return list(sess.tail[-n:]) if n > 0 else []
        return list(self.cache.session_tokens(ns, sid)[-n:])

    def expire_idle(self, now: float | None = None) -> list[tuple[str, str]]:
        ttl = self.limits.session_idle_timeout_s
        if ttl <= 0:
            return []
        now = time.time() if now is None else now
        idle = self.registry.idle(now, ttl)
        closed = []
        for sess in idle:
            with sess.lock:
                # a generation may have taken it since the list was made
                if sess.closed or sess.users or now - sess.last <= ttl:
                    continue
                self.close_locked(sess, keep_responses=True)
                closed.append((sess.ns, sess.id))
                log.info("closed idle session", extra={"namespace": sess.ns, "session": sess.id})
        return closed

    def reap_loop(self, interval: float, stop: threading.Event) -> None:
        while not stop.wait(interval):
            try:
                self.expire_idle()
            except Exception:  # the reaper must survive a failed close
                log.exception("idle-session expiry failed")
