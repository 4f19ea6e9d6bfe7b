"""Ingest: appends to open sessions, durable or deferred, and what follows each one.

Interface (``Ingest``, one per Engine):

* ``append_many([(ns, sid, kind, tokens), ...])`` -> [AppendResult]: validated, then
  committed in one transaction; durable when it returns;
* ``append_step(sess, kind, tokens, defer_commit, commit_soon)``: a session stream's
  append (``Engine.step``), durable or deferred; ``append_locked(checked, sessions)``: a
  durable one with the sessions' locks held;
* ``append_deferred(sess, kind, tokens, lazy)``: a stream step with ``defer_commit`` (any
  kind but "response"), the session's lock held: the trees and the session follow now,
  the write joins the session's queued ``DeferredBatch`` (session_state.py) or queues a new one, and
  ``sess.last_commit`` says when it is durable (``sess.durable_tokens`` follows);
* ``wait_commits(sess)``: wait for the session's queued commits (Unavailable when one
  failed: the session then refuses appends); ``check_write_error(sess)``;
* after a failed commit: a session's later writes fail too, in the writer thread
  (``Session.check_writable``), so its store holds a prefix of what it appended;
  ``undo_step(sess, commit, after)``: a durable stream step (written alone) whose commit
  failed is undone, and the session goes on when nothing else was lost; a failed
  deferred commit (acknowledged steps lost) resyncs the session in a thread of its own
  (``resync``): tree, record, tail and pending response become what the store holds.

What an append does: a "generated" append adds to the session's pending response; a
"response" append ends it, the pending tokens plus these becoming one sequence of the
namespace's global tree (one request counted). After the commit (or, deferred, the
queueing) the session tree, the tail, the pending response and the counters follow, and
the session's last draft (``propose(..., remember=True)``) is judged against the
appended tokens: the step goes to ``record_step``.

Locks: the caller holds each session's ``lock`` across the commit and the tree update, so
a session's store and tree see its appends in the same order; ``append_many`` takes the
locks in sorted (ns, id) order, so two batches cannot deadlock. ``DeferredBatch.lock``
(one for all batches) guards a batch against the store's writer thread sealing it, held
for a few list operations. Different sessions' commits share fsyncs through the store's
group commit.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from suffixcache.store import DiskFullError, Store, StoreClosedError, Txn

from ..common.errors import NotFound, ResourceExhausted, Unavailable
from .drafting import accepted_along
from .session_state import TAIL_KEEP, DeferredBatch, end_batch

if TYPE_CHECKING:
    from suffixcache import SuffixCache

    from .budgets import SessionBudgets
    from .counters import Counters
    from .session_state import Session, SessionRegistry
    from .trees import TreeIndex

log = logging.getLogger("suffixd.engine")

# A deferred chunk stops growing at this many tokens (a new one starts): one LMDB value
# stays small whatever a client sends between two commits.
CHUNK_MAX = 65536


@dataclass
class AppendResult:
    appended: int
    session_tokens: int
    accepted: int  # -1: no draft was pending
    seq_id: int | None = None  # the global-tree sequence a "response" append created
    commit: Future[Any] | None = None  # a deferred append's commit (durable when done)


class Ingest:
    def __init__(
        self,
        store: Store,
        cache: SuffixCache,
        registry: SessionRegistry,
        counters: Counters,
        trees: TreeIndex,
        publish: Callable[..., None],
        record_step: Callable[..., None],
        budgets: SessionBudgets,
    ) -> None:
        self.store = store
        self.budgets = budgets
        self.cache = cache
        self.registry = registry
        self.validator = registry.validator
        self.limits = registry.limits
        self.counters = counters
        self.trees = trees
        self.publish = publish
        # The step judged from an append goes through this (Engine.record_step, which the
        # Prometheus collector wraps).
        self.record_step = record_step

    def append_many(
        self, items: Iterable[tuple[str, str, str, Sequence[int]]]
    ) -> list[AppendResult]:
        """Append items in order; all are durable (one transaction) when this returns."""
        checked: list[tuple[Session, str, list[int]]] = []
        total = 0
        for ns, sid, kind, tokens in items:
            self.validator.check_kind(kind)
            toks = self.validator.check_tokens(tokens)
            total += len(toks)
            if total > self.limits.max_tokens_per_call:
                raise ResourceExhausted(
                    f"more than {self.limits.max_tokens_per_call} tokens in one call"
                )
            checked.append((self.registry.get(ns, sid), kind, toks))
        if not checked:
            return []
        sessions = sorted({id(s): s for s, _, _ in checked}.values(), key=lambda s: (s.ns, s.id))
        with contextlib.ExitStack() as stack:
            for s in sessions:
                stack.enter_context(s.lock)
                if s.closed:
                    raise NotFound(f"session {s.id!r} in namespace {s.ns!r} was closed")
                s.check_writable()  # (a unary append used to build on lost tokens)
            return self.append_locked(checked, sessions)

    def append_step(self, sess: Session, kind: str, toks: list[int], defer_commit: bool,
                    commit_soon: bool) -> AppendResult:
        """A session stream's append (validated tokens, not empty); see Engine.step."""
        with sess.lock:
            if sess.closed:
                raise NotFound(f"session {sess.id!r} in namespace {sess.ns!r} was closed")
            self.check_write_error(sess)
            if defer_commit and kind != "response":
                # commit_soon: a durable stream step, whose reply awaits this commit; it
                # writes alone so that a failure undoes exactly it (undo_step)
                return self.append_deferred(sess, kind, toks, lazy=not commit_soon,
                                            alone=commit_soon)
            return self.append_locked([(sess, kind, toks)], [sess])[0]

    def append_locked(
        self, checked: list[tuple[Session, str, list[int]]], sessions: list[Session],
    ) -> list[AppendResult]:
        adding: dict[int, int] = {}
        for sess, _kind, toks in checked:
            adding[id(sess)] = adding.get(id(sess), 0) + len(toks)
        self.budgets.check([(s, adding.get(id(s), 0)) for s in sessions])
        # Plan: the finished response tokens of each item, without mutating the sessions
        # until the transaction committed (and without copying a session's pending
        # response on every step: only a "response" item needs it).
        plan: list[list[int] | None] = []
        extra: dict[int, list[int]] = {}  # "generated" tokens of this call, per session
        ended: set[int] = set()  # sessions whose response an earlier item ended
        for sess, kind, toks in checked:
            key = id(sess)
            if kind == "generated":
                extra.setdefault(key, []).extend(toks)
                plan.append(None)
            elif kind == "response":
                prev = () if key in ended else sess.pending
                plan.append([*prev, *extra.pop(key, ()), *toks])
                ended.add(key)
            else:
                plan.append(None)
        now = time.time()
        # A queued deferred batch of these sessions must not grow past this write (it
        # would put later tokens before these in the store).
        with DeferredBatch.lock:
            for s in sessions:
                if s.batch is not None:
                    s.batch.close()
        base = {id(s): dict(s.rec) for s in sessions}

        def write(t: Txn) -> tuple[dict[int, dict[str, Any]], list[int | None]]:
            for s in sessions:  # a write queued before this one failed: refused too
                s.check_writable()
            recs = {k: dict(v) for k, v in base.items()}
            for r in recs.values():
                r["last"] = now
            unsaved = set(recs)  # records changed since append_chunk last stored them
            seqs: list[int | None] = []
            for (sess, kind, toks), resp in zip(checked, plan, strict=True):
                r = recs[id(sess)]
                if toks:
                    t.append_chunk(r, kind, toks)  # stores the record too
                    unsaved.discard(id(sess))
                if resp is not None and resp:
                    seq = t.add_sequence(sess.ns, "response", resp, session=sess.id)
                    self.publish(t, "resp", sess.ns, seq=seq, tokens=resp)
                    t.add_session_response(sess.ns, sess.id, seq)
                    r["n_responses"] = int(r.get("n_responses", 0)) + 1
                    unsaved.add(id(sess))
                    seqs.append(seq)
                else:
                    seqs.append(None)
            for key in unsaved:
                t.put_session(recs[key])
            return recs, seqs

        recs, seqs = self.store.write(write)
        for s in sessions:
            s.durable_tokens = int(recs[id(s)]["tokens"])

        # Durable: now the trees and the in-memory state follow.
        results: list[AppendResult] = []
        evicted: list[int] = []
        for (sess, kind, toks), resp, seq in zip(checked, plan, seqs, strict=True):
            accepted = self._follow_append(sess, kind, toks)
            if seq is not None and resp:
                evicted.extend(self.cache.add_response(sess.ns, seq, resp))
            results.append(AppendResult(len(toks), int(recs[id(sess)]["tokens"]), accepted, seq))
        for s in sessions:
            s.rec = recs[id(s)]
            s.last = now
        if evicted:
            self.trees.delete_sequences(evicted)
        return results

    def append_deferred(self, sess: Session, kind: str, toks: list[int],
                        lazy: bool, alone: bool = False) -> AppendResult:
        """One deferred append (session streams; any kind but "response", which waits for
        its sequence id), with the session's lock held: the trees and the session follow at
        once, the write joins the session's queued batch or queues a new one
        (DeferredBatch), and ``sess.last_commit`` is the future that says it is durable.
        ``lazy``: nobody waits for the commit soon (Store.submit). ``alone``: a write of
        its own, which nothing joins (a durable stream step: undo_step undoes it alone).

        The record the store will hold is kept in ``sess.rec`` (chunks numbered, tokens
        counted as the batch will store them), so a later write builds on it."""
        self.budgets.check([(sess, len(toks))])
        now = time.time()
        rec = sess.rec
        new_batch = None
        kick = False
        with DeferredBatch.lock:
            b = sess.batch
            if alone and b is not None:
                b.close()  # queued before this one, and stays apart from it
                b = None
            if b is not None and b.open:
                if b.lazy and not lazy:
                    b.lazy = False
                    kick = True  # its caller waits for this one: commit what is queued
                _no, last_kind, last = b.chunks[-1]
                if last_kind == kind and len(last) + len(toks) <= CHUNK_MAX:
                    last.extend(toks)
                else:
                    no = int(rec.get("chunks", 0))
                    b.chunks.append((no, kind, list(toks)))
                    rec["chunks"] = no + 1
            else:
                no = int(rec.get("chunks", 0))
                new_batch = sess.batch = DeferredBatch(sess, no, kind, list(toks), lazy, alone)
                rec["chunks"] = no + 1
            rec["tokens"] = tokens = int(rec.get("tokens", 0)) + len(toks)
            rec["last"] = now
            if alone and new_batch is not None:
                new_batch.close()  # its record counts this step only: nothing joins it
        if new_batch is not None:
            try:
                fut = self.store.submit(new_batch.write, lazy=lazy)
            except BaseException:
                # Not queued (the store is closing): the session's record and trees no
                # longer match its store, as after a failed commit.
                with DeferredBatch.lock:
                    new_batch.close()
                sess.write_error = StoreClosedError("the store is closed")
                raise
            sess.last_commit = fut
            fut.add_done_callback(functools.partial(self._deferred_done, sess, alone))
        elif kick:
            self.store.kick()

        accepted = self._follow_append(sess, kind, toks)
        sess.last = now
        return AppendResult(len(toks), tokens, accepted, None, sess.last_commit)

    def _follow_append(self, sess: Session, kind: str, toks: list[int]) -> int:
        """Once an append is written (or, deferred, queued): the session's tree, tail,
        pending response and counters follow it, and the session's last draft is judged
        by it. Returns that draft's accepted length for a generated or response append
        (-1 otherwise, or without a draft)."""
        if toks:
            self.cache.append_session(sess.ns, sess.id, toks)
            sess.push_tail(toks)
            self.budgets.grew(sess, len(toks))
        accepted = -1
        if kind in ("generated", "response"):
            draft = sess.last_draft
            if draft is not None:
                sess.last_draft = None
                accepted = accepted_along(draft, toks)
                self.record_step(sess.ns, sess.id, draft.source, len(draft.tokens),
                                 accepted, draft=draft, accepted_tokens=toks)
            self.counters.count_generated(sess.ns, sess.id, len(toks), kind == "response")
        else:
            sess.last_draft = None
        if kind == "generated":
            sess.pending.extend(toks)
        elif kind == "response":
            sess.pending.clear()
        return accepted

    def _deferred_done(self, sess: Session, alone: bool, fut: Future[Any]) -> None:
        # Runs in the store's writer thread once a deferred batch committed (or failed),
        # before the writer runs the next write; its result is the session's stored length.
        exc = fut.exception()
        if exc is not None:
            if sess.write_error is None:
                # the session's later writes fail from now on (Session.check_writable)
                sess.write_error = exc
                sess.failed_commit = fut
            log.error("commit failed", extra={"namespace": sess.ns, "session": sess.id,
                                              "error": repr(exc)})
            if not alone:
                # Steps acknowledged before they were durable are lost: the session's
                # tree and record go back to what the store holds (they must agree after
                # any fault). Not here: this thread must not wait for a session lock,
                # whose holder may be waiting for this thread. A durable step's own
                # failure is settled by the stream awaiting it (undo_step).
                threading.Thread(target=self.resync, args=(sess,), daemon=True,
                                 name="suffixd-session-resync").start()
            return
        tokens = fut.result()
        if tokens > sess.durable_tokens:
            sess.durable_tokens = tokens

    def resync(self, sess: Session) -> None:
        """After a failed write: the session's tree, record, tail and pending response
        become what the store holds (every queued write of the session settled first)."""
        with sess.lock:
            if not sess.closed:
                self._resync_locked(sess)

    def _resync_locked(self, sess: Session) -> None:
        end_batch(sess)
        fut = sess.last_commit
        if fut is not None:
            with contextlib.suppress(Exception):  # failures are in write_error
                fut.result()
        rec = self.store.get_session(sess.ns, sess.id)
        if rec is None:  # dropped meanwhile
            return
        tokens: list[int] = []
        pending: list[int] = []
        for kind, toks in self.store.session_chunks(sess.ns, sess.id):
            tokens += toks
            if kind == "generated":
                pending += toks
            elif kind == "response":
                pending = []
        if len(tokens) == int(sess.rec.get("tokens", 0)):
            # nothing was lost (a second resync): the store holds a prefix of what the
            # session appended, since a failed write fails the session's later ones
            sess.rec = rec
            return
        log.warning("session resynced with its store after a failed commit",
                    extra={"namespace": sess.ns, "session": sess.id, "stored": len(tokens),
                           "had": int(sess.rec.get("tokens", 0))})
        self.cache.close_session(sess.ns, sess.id)
        self.cache.open_session(sess.ns, sess.id, tokens)
        self.budgets.dropped(sess.ns, sess.id)
        self.budgets.opened(sess, len(tokens))
        sess.rec = rec
        sess.tail = tokens[-TAIL_KEEP:]
        sess.pending = pending
        sess.last_draft = None
        sess.durable_tokens = int(rec.get("tokens", 0))

    def undo_step(self, sess: Session, commit: Future[Any], after: int) -> None:
        """A durable stream step's commit (``commit``) failed: the session goes back to
        what its store holds. When that failure was the session's first and nothing was
        queued after the step (the session held ``after`` tokens with it), the session
        is exactly as before the step and goes on: raises the step's refusal (nothing of
        it was applied). Otherwise acknowledged tokens were lost too: raises the
        session's write error (it refuses appends from now on)."""
        with sess.lock:
            clean = sess.failed_commit is commit and int(sess.rec.get("tokens", 0)) == after
            if not sess.closed:
                self._resync_locked(sess)
            exc = commit.exception()
            if clean and not sess.closed:
                sess.write_error = sess.failed_commit = None
                sess.last_commit = None
                error = ResourceExhausted if isinstance(exc, DiskFullError) else Unavailable
                raise error(f"{exc} (the step was not applied: the session is as it was "
                            "before it)")
            self.check_write_error(sess)
            raise Unavailable(f"the step's commit failed: {exc}")

    def wait_commits(self, sess: Session) -> None:
        """Wait until everything the session queued (deferred commits) is committed."""
        fut = sess.last_commit
        if fut is not None:
            if not fut.done():
                self.store.kick()  # it may be a lazy write waiting for company
            with contextlib.suppress(Exception):  # reported through write_error
                fut.result()
        self.check_write_error(sess)

    @staticmethod
    def check_write_error(sess: Session) -> None:
        sess.check_writable()
