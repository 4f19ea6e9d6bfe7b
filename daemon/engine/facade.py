"""The engine: the daemon's state (SuffixCache + Drafter + LMDB Store + counters), no gRPC.

Construct it in-process for tests or embedding::

    engine = Engine(data_dir, model_path=None)       # token ids only, no tokenizer
    engine = Engine(data_dir, model_path="default")  # embedded gemma tokenizer
    ...
    engine.close()                                   # flushes counters, closes LMDB

``Engine`` is a facade: it builds the parts below, starts and stops their threads, and
forwards the Python API the servicers and the other daemon modules (verifier, corpus,
metrics, fleet) use. Each part's module docstring holds its interface, locks and
durability:

* ``validator`` (validation.py): names, tokens, kinds, metadata, draft lengths;
* ``registry`` (session_state.py) and ``sessions`` (sessions.py): the open sessions; open,
  close, idle expiry;
* ``ingest`` (ingest.py): durable and deferred appends, what follows each one;
* ``drafting`` (drafting.py): proposals, and the feedback of verified steps;
* ``counters`` (counters.py): counters, their flushing to LMDB, ``stats``;
* ``trees`` (trees.py): the global and corpus trees' start-up rebuild and removals;
* ``corpus`` (corpus_docs.py): corpus documents.

Python API:

* ``engine.tokenizer`` (or None), ``engine.vocab_size``, ``engine.info()``,
  ``engine.tokenize(text)``, ``engine.detokenize(ids)``
* sessions: ``open_session(ns, session_id=None, metadata=None, tokens=(), hold=False)``
  -> dict, ``hold_session(ns, sid)`` / ``release_session(sess)`` (a generation runs on it:
  the idle reaper waits for its end),
  ``check_admission(ns, sid, tokens)`` (would opening/appending be refused? changes nothing),
  ``close_session(ns, sid, keep_responses=True)``, ``list_sessions(ns=None)``,
  ``describe_session(ns, sid, tail_tokens=0)``, ``session_tail(ns, sid, n)``
* ingest (durable when it returns): ``append(ns, sid, kind, tokens)`` -> AppendResult,
  ``append_many([(ns, sid, kind, tokens), ...])``. ``kind`` is one of KINDS.
  A "generated" append adds to the session's pending response; a "response" append
  ends it: the pending tokens plus these become one sequence of the namespace's global
  tree (and count one request). When the append follows a ``propose(..., remember=True)``
  on the same session, the appended tokens are compared with the draft and the step is
  counted (source, proposed, accepted) and fed to ``Drafter.observe``.
* session streams: ``stream_session(ns, sid)`` once, then ``step(sess, kind, tokens,
  ...)`` per step (append, durable or ``defer_commit``, then draft), ``wait_commits(sess)``,
  ``undo_step(sess, commit, after)`` (a durable step whose commit failed)
* drafting: ``propose(ns, sid, context=None, max_tokens=None, cost_profile=None,
  remember=True)`` -> suffixcache.Draft. ``context=None`` uses the session's tail.
  A verifier that counts acceptance itself passes ``remember=False`` and calls
  ``record_step(ns, sid, source, proposed, accepted, draft=draft)`` once per verified step
  (``source`` may also be "draft_model"), then appends with kind "generated"/"response".
* corpus: ``add_corpus_document(ns, doc_key, sequences, content_hash=None, meta=None)``
  (replaces an existing document), ``remove_corpus_document(ns, doc_key)``,
  ``corpus_document(ns, doc_key)`` (stored record, e.g. its hash), ``corpus_documents(ns)``,
  ``record_document_accept(ns, doc_key, n)``
* ``remove_from_trees(ns, kind, seq_ids)``: after deleting sequences from the store
* ``stats(ns=None, session_id=None, include_sessions=False, top_documents=10)`` -> dict
* restart: sessions and counters are loaded in the constructor; the global and corpus
  trees too, or with ``background_rebuild=True`` (what `suffixd serve` does) in a thread
  while the daemon already serves (``engine.rebuilding`` / Info.rebuilding tell; drafts
  from those trees fill in as it proceeds; ingest is durable throughout). A store that
  rebuild cannot read ends it (``engine.rebuild_error``, ``info()["rebuild_error"]``)
  and calls ``on_rebuild_failure(error)``: `suffixd serve` stops, exit status 2.

Locking (explicit; a lock is never held across another session's work):

* ``registry.lock`` guards the session registry; dictionary operations only, never I/O.
* each session has its own ``lock``, held across the durable commit and the tree update
  of an append (and during open and close), so a session's store and tree see its appends
  in the same order. Operations on different sessions run in parallel; their LMDB writes
  share fsyncs through the store's group commit. ``append_many`` takes the session locks
  it needs in sorted order, so it cannot deadlock with another batch.
* ``session_state.DeferredBatch.lock``: a queued deferred batch against the writer sealing it.
* ``counters.lock`` guards the in-memory counters (tiny critical sections). Counters are
  flushed to LMDB by a background thread every ``counter_flush_s`` and on close.
* ``drafting``'s LRU of per-profile drafters has a leaf lock of its own.
* SuffixCache is thread-safe on its own (one lock per tree, native work without the GIL);
  Store is thread-safe (one writer thread; group commit).
* ``trees.lock`` pairs a background rebuild's "add" with live removals, so a sequence
  removed while the rebuild runs is never resurrected.
* ``fleet_lock`` (the fleet consumer's apply lock with ``--fleet``, else a no-op) is held
  across ``drop_namespace``, so a drop never interleaves with a peer's entry being applied.
* Lock order: ``fleet_lock`` -> session locks (sorted) -> ``registry.lock`` -> ``counters.lock``;
  ``trees.lock`` is taken with nothing but session locks held and only around tree
  calls. The store and the cache are called with at most session locks held.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from suffixcache.store import Store, StoreError, Txn

from ..common.config import CacheConfig, Limits
from ..common.errors import FailedPrecondition, NotFound, ResourceExhausted
from .budgets import NamespaceLimit, SessionBudgets
from .corpus_docs import CorpusDocuments
from .counters import SOURCES, Counters
from .drafting import Drafting
from .ingest import AppendResult, Ingest
from .namespace_drop import NamespaceParts, drop_namespace
from .session_state import TAIL_KEEP, Session, SessionRegistry
from .sessions import Sessions
from .trees import TreeIndex
from .validation import KINDS, Validator

__all__ = ["KINDS", "SOURCES", "AppendResult", "Engine"]

log = logging.getLogger("suffixd.engine")


@functools.cache
def _version() -> str:
    try:
        from importlib.metadata import version

        return version("suffixd")
    except Exception:
        return "0.0.0+unknown"


class Engine:
    """See the module docstring."""

    def __init__(
        self,
        data_dir: str | Path,
        model_path: str | Path | None = None,
        *,
        tokenizer: Any = None,
        vocab_size: int | None = None,
        limits: Limits | None = None,
        cache_config: CacheConfig | None = None,
        sync: bool = True,
        counter_flush_s: float = 1.0,
        reaper_interval_s: float | None = None,
        background_rebuild: bool = False,
        lazy_commit_s: float = 0.010,
        on_rebuild_failure: Callable[[StoreError], None] | None = None,
    ) -> None:
        from suffixcache import SuffixCache

        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.limits = limits or Limits()
        self.cache_config = cache_config or CacheConfig()
        self.model_path: Path | None = None
        if tokenizer is None and model_path is not None:
            from ..model import Tokenizer, resolve_model_path

            self.model_path = resolve_model_path(model_path)
            tokenizer = Tokenizer(self.model_path)
        elif tokenizer is not None:
            self.model_path = getattr(tokenizer, "model_path", None)
        self.tokenizer = tokenizer
        self.vocab_size: int | None = (
            int(tokenizer.vocab_size) if tokenizer is not None else vocab_size
        )
        self.fingerprint: str | None = tokenizer.fingerprint if tokenizer is not None else None
        self.started_at = time.time()
        self.extra_services: list[str] = []
        # Hooks for other daemon modules (metrics, corpus watcher): close hooks run first
        # thing in close(); ``observers`` (drafting.py) are called as fn(event, **fields).
        self.close_hooks: list[Any] = []
        # The fleet (daemon/fleet/node.py): called as fn(txn, op, ns, **fields) inside the store
        # transaction of every ingest that reaches a global or corpus tree, so the entry it
        # queues for publication commits (or not) with the data.
        self.ingest_hook: Any = None
        # Held across a namespace drop; the fleet makes it the lock its consumer holds
        # while it applies a namespace's entries, so a drop never lands between a peer
        # entry's epoch check and its write.
        self.fleet_lock: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()

        # Deferred stream steps are lazy store writes: they commit together at most every
        # lazy_commit_s (or with the next durable write). At 3,000 deferred steps/s, 5 ms
        # cost the writer thread ~16% of a core (mostly the fsyncs' system time), 15 ms ~7%;
        # the price is how long a deferred step stays undurable.
        self.store = Store(self.data_dir / "store", sync=sync, lazy_interval_s=lazy_commit_s)
        try:
            self.store.check_tokenizer(self.fingerprint, self.vocab_size)
        except Exception:
            self.store.close()
            raise
        self.cache = SuffixCache(
            max_depth=self.cache_config.max_depth,
            global_budget_tokens=self.cache_config.global_budget_tokens,
        )
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

        self.validator = Validator(self.limits, self.vocab_size)
        self.registry = SessionRegistry(self.limits, self.validator)
        self.counters = Counters(self.store, self.registry, self.cache)
        self.namespaces = NamespaceLimit(self.limits, self.cache, self.registry, self.counters)
        self.budgets = SessionBudgets(self.limits, self.cache)
        self.trees = TreeIndex(self.store, self.cache, self._publish, self._stop,
                               self.vocab_size)
        self.drafting = Drafting(self.cache, self.cache_config, self.registry, self.counters,
                                 self.trees, self.namespaces)
        self.observers: list[Any] = self.drafting.observers
        self.ingest = Ingest(self.store, self.cache, self.registry, self.counters, self.trees,
                             self._publish, self._judged_step, self.budgets)
        self.sessions = Sessions(self.store, self.cache, self.registry, self.counters,
                                 self.trees, self.ingest, self._publish, self.namespaces)
        self.corpus = CorpusDocuments(self.store, self.validator, self.trees, self._publish,
                                      self.namespaces)
        self._parts = NamespaceParts(self.store, self.cache, self.registry, self.counters,
                                     self.trees, self.ingest, self.budgets, self.namespaces,
                                     self._publish)
        # (ns, corpus sequence) -> document key; grpc_api/corpus_service.py indexes warmed
        # files here.
        self._corpus_docs = self.trees.corpus_docs

        # Restart: sessions and counters now; the global and corpus trees now or in a thread.
        t0 = time.perf_counter()
        session_tokens = self.sessions.load()
        self.counters.load()
        self.trees.start_rebuild(session_tokens, t0, background_rebuild, self._spawn,
                                 self.registry.__len__, on_rebuild_failure)
        self._spawn(lambda: self.counters.flush_loop(counter_flush_s, self._stop),
                    "suffixd-counter-flush")
        ttl = self.limits.session_idle_timeout_s
        if ttl > 0:
            interval = reaper_interval_s or max(0.05, min(ttl / 4, 30.0))
            self._spawn(lambda: self.sessions.reap_loop(interval, self._stop),
                        "suffixd-session-reaper")
        self._closed = False

    # ------------------------------------------------------------------ lifecycle
    def _spawn(self, fn: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=fn, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def close(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        for hook in self.close_hooks:
            try:
                hook()
            except Exception:
                log.exception("close hook failed")
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        self.flush_counters()
        self.store.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _publish(self, t: Txn, op: str, ns: str, **fields: Any) -> None:
        if self.ingest_hook is not None:
            self.ingest_hook(t, op, ns, **fields)

    @property
    def rebuilding(self) -> bool:
        return self.trees.rebuilding

    @property
    def rebuild_error(self) -> StoreError | None:
        return self.trees.rebuild_error

    @property
    def rebuild_seconds(self) -> float:
        return self.trees.rebuild_seconds

    @property
    def rebuild_tokens(self) -> int:
        return self.trees.rebuild_tokens

    def remove_from_trees(self, ns: str, kind: str, seq_ids: Iterable[int]) -> None:
        """Remove sequences (kind "response" or "corpus") from the trees, also from a
        background rebuild still in progress (which would otherwise re-add them). Modules
        that delete sequences from the store themselves must remove them with this."""
        self.trees.remove(ns, kind, seq_ids)

    def _delete_sequences(self, seq_ids: list[int]) -> None:
        # The fleet deletes what applying a peer's response evicted (daemon/fleet/node.py).
        self.trees.delete_sequences(seq_ids)

    # ------------------------------------------------------------------ validation
    def check_tokens(self, tokens: Sequence[int], what: str = "tokens") -> list[int]:
        return self.validator.check_tokens(tokens, what)

    def check_max_tokens(self, max_tokens: int | None) -> None:
        self.validator.check_max_tokens(max_tokens)

    # ------------------------------------------------------------------ tokenizer
    def tokenize(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise FailedPrecondition("this daemon has no tokenizer (started without a model)")
        if len(text.encode("utf-8", errors="surrogatepass")) > self.limits.max_text_bytes:
            raise ResourceExhausted(f"text longer than {self.limits.max_text_bytes} bytes")
        toks = list(self.tokenizer.tokenize(text))
        if len(toks) > self.limits.max_tokens_per_call:
            raise ResourceExhausted(
                f"text is {len(toks)} tokens; the limit per call is "
                f"{self.limits.max_tokens_per_call}"
            )
        return toks

    def detokenize(self, tokens: Sequence[int]) -> str:
        if self.tokenizer is None:
            raise FailedPrecondition("this daemon has no tokenizer (started without a model)")
        return str(self.tokenizer.detokenize(self.check_tokens(tokens)))

    def info(self) -> dict[str, Any]:
        return {
            "version": _version(),
            "model_path": str(self.model_path) if self.model_path else "",
            "vocab_size": self.vocab_size or 0,
            "tokenizer_fingerprint": self.fingerprint or "",
            "data_dir": str(self.data_dir),
            "limits": self.limits,
            "services": list(self.extra_services),
            "rebuild_seconds": self.rebuild_seconds,
            "rebuild_tokens": self.rebuild_tokens,
            "rebuilding": self.rebuilding,
            "rebuild_error": str(self.rebuild_error or ""),
        }

    # ------------------------------------------------------------------ sessions
    def open_session(
        self,
        ns: str,
        session_id: str | None = None,
        metadata: dict[str, str] | None = None,
        tokens: Sequence[int] = (),
        hold: bool = False,
    ) -> dict[str, Any]:
        return self.sessions.open(ns, session_id, metadata, tokens, hold)

    def hold_session(self, ns: str, sid: str) -> Session | None:
        """Hold an open session for a generation (None if it is not open): the idle reaper
        leaves it open until ``release_session``."""
        return self.sessions.hold(ns, sid)

    def release_session(self, sess: Session) -> None:
        self.sessions.release(sess)

    def check_admission(self, ns: str, sid: str, tokens: int) -> bool:
        """Whether appending ``tokens`` tokens to session ``sid`` of ``ns`` (opening it when
        it is not open) would be let in, changing nothing: raises what the request would
        meet (names, tokens per call, the namespace limit, sessions per namespace, the
        session budgets, a session whose deferred commit failed). Returns whether the
        session is open. The generation path asks before it opens or appends anything,
        so a refused request leaves no session, token or record behind (a full disk
        refuses the write itself, which applies nothing: an opening stores its record
        and first prompt in one transaction)."""
        self.validator.check_name("namespace", ns)
        self.validator.check_name("session_id", sid)
        if tokens > self.limits.max_tokens_per_call:
            raise ResourceExhausted(
                f"{tokens} tokens in one call; the limit is {self.limits.max_tokens_per_call}"
                " (--max-tokens-per-call)"
            )
        try:
            sess: Session | None = self.registry.get(ns, sid)
        except NotFound:
            sess = None
        if sess is None or sess.closed:
            self.namespaces.check(ns)
            self.registry.check_room(ns)
            self.budgets.check([(Session(ns, sid, {}), tokens)])
            return False
        self.ingest.check_write_error(sess)
        self.budgets.check([(sess, tokens)])
        return True

    def close_session(self, ns: str, sid: str, keep_responses: bool = True) -> dict[str, int]:
        return self.sessions.close(ns, sid, keep_responses)

    def list_sessions(self, ns: str | None = None) -> list[dict[str, Any]]:
        return self.sessions.infos(ns)

    def describe_session(
        self, ns: str, sid: str, tail_tokens: int = 0, include_counters: bool = False
    ) -> dict[str, Any]:
        return self.sessions.describe(ns, sid, tail_tokens, include_counters)

    def session_tail(self, ns: str, sid: str, n: int) -> list[int]:
        return self.sessions.tail(ns, sid, n)

    def expire_idle_sessions(self, now: float | None = None) -> list[tuple[str, str]]:
        return self.sessions.expire_idle(now)

    # ------------------------------------------------------------------ ingest
    def append(self, ns: str, sid: str, kind: str, tokens: Sequence[int]) -> AppendResult:
        return self.ingest.append_many([(ns, sid, kind, tokens)])[0]

    def append_many(
        self, items: Iterable[tuple[str, str, str, Sequence[int]]]
    ) -> list[AppendResult]:
        """Append items in order; all are durable (one transaction) when this returns."""
        return self.ingest.append_many(items)

    # ------------------------------------------------------------------ session streams
    def stream_session(self, ns: str, sid: str) -> Session:
        """The session a step stream works on, resolved (and validated) once per stream."""
        return self.registry.get(ns, sid)

    def step(
        self,
        sess: Session,
        kind: str,
        tokens: Sequence[int],
        max_tokens: int | None = None,
        drafter: Any = None,
        draft: bool = True,
        defer_commit: bool = False,
        commit_soon: bool = False,
    ) -> tuple[AppendResult | None, Any]:
        """One decoding step of a session stream: append ``tokens`` durably (nothing when
        empty), then draft from the session's new tail (unless ``draft`` is False).

        Exactly ``append(ns, sid, kind, tokens)`` followed by ``propose(ns, sid,
        max_tokens=...)``, minus the per-call name checks and session lookups. Everything
        is validated before anything is written, so a failing step applies nothing.

        ``defer_commit`` (not for kind "response", which always waits): the tokens go to
        the trees and their commit is queued behind the session's earlier writes, but this
        does not wait for it; ``sess.durable_tokens`` follows the commits and
        ``wait_commits(sess)`` waits for them. The commit may wait a few milliseconds for
        other deferred writes to share it, unless ``commit_soon`` (the caller is about to
        wait for it itself, as the daemon's event loop does for a durable stream step).
        """
        self.validator.check_kind(kind)
        toks = self.validator.check_tokens(tokens) if tokens else None
        if draft:
            self.validator.check_max_tokens(max_tokens)
        res = None
        if toks:
            res = self.ingest.append_step(sess, kind, toks, defer_commit, commit_soon)
        elif sess.closed:
            raise NotFound(f"session {sess.id!r} in namespace {sess.ns!r} was closed")
        if not draft:
            return res, None
        return res, self.drafting.draft(sess.ns, sess.id, sess, sess.tail[-TAIL_KEEP:],
                                        max_tokens, drafter or self.drafting.drafter, True)

    def wait_commits(self, sess: Session) -> None:
        """Wait until everything the session queued (deferred commits) is committed."""
        self.ingest.wait_commits(sess)

    def undo_step(self, sess: Session, commit: Any, after: int) -> None:
        """A durable stream step's commit failed: the session back to what its store
        holds; raises the step's refusal (ingest.py, ``Ingest.undo_step``)."""
        self.ingest.undo_step(sess, commit, after)

    # ------------------------------------------------------------------ drafting
    @property
    def drafter(self) -> Any:
        return self.drafting.drafter

    @drafter.setter
    def drafter(self, drafter: Any) -> None:
        self.drafting.drafter = drafter

    def drafter_for(self, cost_profile: Any) -> Any:
        """The Drafter for a cost profile (None: the daemon's); InvalidArgument if bad."""
        return self.drafting.drafter_for(cost_profile)

    def propose(
        self,
        ns: str,
        session_id: str | None = None,
        context: Sequence[int] | None = None,
        max_tokens: int | None = None,
        cost_profile: Any = None,
        *,
        remember: bool = True,
    ) -> Any:
        return self.drafting.propose(ns, session_id, context, max_tokens, cost_profile,
                                     remember=remember)

    def record_step(
        self,
        ns: str,
        session_id: str | None,
        source: str,
        proposed: int,
        accepted: int,
        draft: Any = None,
        accepted_tokens: Sequence[int] | None = None,
    ) -> None:
        """Count one verified step: a draft of ``proposed`` tokens, ``accepted`` of them.

        With ``draft`` (a suffixcache Draft) the drafter's calibration learns from the
        outcome; ``accepted_tokens`` (the tokens that followed) locates the accepted
        branch of a tree draft.
        """
        self.drafting.record_step(ns, session_id, source, proposed, accepted, draft,
                                  accepted_tokens)

    def _judged_step(self, *args: Any, **kwargs: Any) -> None:
        # A step judged from an append goes through the attribute: daemon/server/metrics.py wraps
        # record_step on the instance to count accepted lengths.
        self.record_step(*args, **kwargs)

    # ------------------------------------------------------------------ counters
    def record_document_accept(self, ns: str, doc_key: str, n: int) -> None:
        self.counters.count_document_accept(ns, doc_key, n)

    def flush_counters(self) -> None:
        self.counters.flush()

    def stats(
        self,
        ns: str | None = None,
        session_id: str | None = None,
        include_sessions: bool = False,
        top_documents: int = 10,
        names: list[str] | None = None,
    ) -> dict[str, Any]:
        """Per namespace (all, ``ns``, or ``names``): counters, tree sizes, sessions."""
        return self.counters.stats(ns, session_id, include_sessions, top_documents, names)

    # ------------------------------------------------------------------ bounded state
    def stats_page(self, ns: str | None, after: str | None,
                   limit: int) -> tuple[int, int, list[str]]:
        """The namespaces a Stats page covers: how many there are in all, how many sort
        after ``after`` (the page token's name), and the first ``limit`` of those in name
        order: ``ns`` alone, or every namespace holding state. Not a sorted copy of every
        name per page: 80 pages over 80,000 namespaces took 10 s that way."""
        if ns:
            self.validator.check_name("namespace", ns)
            later = [ns] if after is None or ns > after else []
            return 1, len(later), later
        known = self.namespaces.known()
        rest = list(known) if after is None else [n for n in known if n > after]
        return len(known), len(rest), heapq.nsmallest(limit, rest)

    def drop_namespace(self, ns: str, replica: Any = None) -> dict[str, Any]:
        """Delete a namespace and everything in it, durably (daemon/engine/namespace_drop.py):
        {found, sessions, sequences, documents}. ``replica``: the fleet applies a peer's
        drop (it is not published again)."""
        with self.fleet_lock:
            return drop_namespace(self._parts, ns, replica)

    def admit_namespace(self, ns: str) -> None:
        """Before creating state in ``ns`` (ResourceExhausted past --max-namespaces)."""
        self.namespaces.admit(ns)

    def memory(self) -> list[dict[str, Any]]:
        """The trees by kind over every namespace, against their budgets (Stats.memory)."""
        lim = self.limits
        mem = self.cache.memory()
        budgets = {
            "session": (lim.max_total_session_tokens, lim.max_total_session_bytes,
                        lim.max_session_tokens, lim.max_session_bytes),
            "global": (0, 0, self.cache_config.global_budget_tokens, 0),
            "corpus": (0, 0, 0, 0),
        }
        return [{"kind": kind, **mem[kind],
                 **dict(zip(("budget_tokens", "budget_bytes", "budget_tokens_per_tree",
                             "budget_bytes_per_tree"), budgets[kind], strict=True))}
                for kind in ("session", "global", "corpus")]

    # ------------------------------------------------------------------ corpus
    def add_corpus_document(
        self,
        ns: str,
        doc_key: str,
        sequences: Sequence[Sequence[int]],
        *,
        content_hash: str | None = None,
        meta: dict[str, Any] | None = None,
        replica: Any = None,
    ) -> list[int]:
        """Store a document's sequences (replacing an older version) durably; index them.
        ``replica``: the fleet applies a peer's entry (it is not published again)."""
        return self.corpus.add(ns, doc_key, sequences, content_hash=content_hash, meta=meta,
                               replica=replica)

    def remove_corpus_document(self, ns: str, doc_key: str, replica: Any = None) -> bool:
        return self.corpus.remove(ns, doc_key, replica)

    def corpus_document(self, ns: str, doc_key: str) -> dict[str, Any] | None:
        return self.corpus.get(ns, doc_key)

    def corpus_documents(self, ns: str | None = None) -> list[tuple[str, str, dict[str, Any]]]:
        return self.corpus.documents(ns)
