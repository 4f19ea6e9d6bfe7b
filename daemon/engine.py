"""The engine: the daemon's state (SuffixCache + Drafter + LMDB Store + counters), no gRPC.

Construct it in-process for tests or embedding::

    engine = Engine(data_dir, model_path=None)       # token ids only, no tokenizer
    engine = Engine(data_dir, model_path="default")  # embedded gemma tokenizer
    ...
    engine.close()                                   # flushes counters, closes LMDB

Python API used by the servicers and by the other daemon modules (verifier, corpus, metrics):

* ``engine.tokenizer`` (or None), ``engine.vocab_size``, ``engine.info()``,
  ``engine.tokenize(text)``, ``engine.detokenize(ids)``
* sessions: ``open_session(ns, session_id=None, metadata=None, tokens=())`` -> dict,
  ``close_session(ns, sid, keep_responses=True)``, ``list_sessions(ns=None)``,
  ``describe_session(ns, sid, tail_tokens=0)``, ``session_tail(ns, sid, n)``
* ingest (durable when it returns): ``append(ns, sid, kind, tokens)`` -> AppendResult,
  ``append_many([(ns, sid, kind, tokens), ...])``. ``kind`` is one of KINDS.
  A "generated" append adds to the session's pending response; a "response" append
  ends it: the pending tokens plus these become one sequence of the namespace's global
  tree (and count one request). When the append follows a ``propose(..., remember=True)``
  on the same session, the appended tokens are compared with the draft and the step is
  counted (source, proposed, accepted) and fed to ``Drafter.observe``.
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
  from those trees fill in as it proceeds; ingest is durable throughout).

Locking (explicit; a lock is never held across another session's work):

* ``self._lock`` guards the session registry (``_sessions``, per-namespace counts). It is
  held only for dictionary operations, never across I/O.
* each session has its own ``lock``, held across the durable commit and the tree update
  of an append (and during close), so a session's store and tree see its appends in the
  same order. Operations on different sessions run in parallel; their LMDB writes share
  fsyncs through the store's group commit. ``append_many`` takes the session locks it
  needs in sorted order, so it cannot deadlock with another batch.
* ``self._ctr_lock`` guards the in-memory counters (tiny critical sections). Counters are
  flushed to LMDB by a background thread every ``counter_flush_s`` and on close.
* SuffixCache is thread-safe on its own (one lock per tree, native work without the GIL);
  Store is thread-safe (one writer thread; group commit).
* ``self._rebuild_lock`` pairs a background rebuild's "add" with live removals, so a
  sequence removed while the rebuild runs is never resurrected.
* Lock order: session locks (sorted) -> ``_lock`` -> ``_ctr_lock``; ``_rebuild_lock`` is
  taken with nothing but session locks held and only around tree calls. The store and the cache
  are called with at most session locks held.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from suffixcache.drafter import Draft
from suffixcache.store import Store, StoreClosedError, Txn

from .config import CacheConfig, Limits
from .errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
)

log = logging.getLogger("suffixd.engine")

KINDS = ("prompt", "tool", "response", "generated")
SOURCES = ("session", "global", "corpus", "draft_model", "none")
# Tokens of each session kept in Python for drafting without asking the tree for the
# whole session; the drafter matches at most max_depth tokens back.
_TAIL_KEEP = 1024


@functools.cache
def _version() -> str:
    try:
        from importlib.metadata import version

        return version("suffixd")
    except Exception:
        return "0.0.0+unknown"


def _new_counters() -> dict[str, Any]:
    return {
        "requests": 0,
        "steps": 0,
        "proposed": 0,
        "accepted": 0,
        "generated": 0,
        "speculate_calls": 0,
        "by_source": {},  # source -> [steps, proposed, accepted]
    }


@dataclass
class AppendResult:
    appended: int
    session_tokens: int
    accepted: int  # -1: no draft was pending
    seq_id: int | None = None  # the global-tree sequence a "response" append created


class _Session:
    __slots__ = (
        "ns", "id", "rec", "tail", "pending", "last_draft", "lock", "closed", "last",
        "durable_tokens", "last_commit", "write_error", "batch",
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
        # Deferred commits (step streams with defer_commit): the session length known
        # committed, the latest queued commit, and the error of a failed one (the session
        # then refuses appends: its trees hold tokens its store lost).
        self.durable_tokens = int(rec.get("tokens", 0))
        self.last_commit: Future[Any] | None = None
        self.write_error: BaseException | None = None
        # The session's queued deferred write that later deferred appends may still join
        # (see _DeferredBatch); None when there is none or it can no longer grow.
        self.batch: _DeferredBatch | None = None

    def push_tail(self, tokens: Sequence[int]) -> None:
        self.tail.extend(tokens)
        if len(self.tail) > 2 * _TAIL_KEEP:
            del self.tail[: len(self.tail) - _TAIL_KEEP]

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


# A deferred chunk stops growing at this many tokens (a new one starts): one LMDB value
# stays small whatever a client sends between two commits.
_CHUNK_MAX = 65536


class _DeferredBatch:
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

    __slots__ = ("sess", "chunks", "open", "rec", "sealed", "lazy")

    # Guards every batch's open/chunks/rec against the writer thread sealing it; held for
    # a few dictionary and list operations only.
    lock = threading.Lock()

    def __init__(self, sess: _Session, no: int, kind: str, tokens: list[int],
                 lazy: bool) -> None:
        self.sess = sess
        self.lazy = lazy  # queued as a lazy store write (Store.submit)
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
        if self.sealed is None:
            with _DeferredBatch.lock:
                self.close()
                assert self.rec is not None
                self.sealed = (self.chunks, self.rec)
        chunks, rec = self.sealed
        ns, sid = self.sess.ns, self.sess.id
        for no, kind, toks in chunks:
            t.put_chunk(ns, sid, no, kind, toks)
        t.put_session(rec)
        return int(rec["tokens"])


def _accepted_along(draft: Any, appended: Sequence[int]) -> int:
    """Longest prefix of ``appended`` that follows a root-to-leaf path of the draft tree."""
    tokens = draft.tokens
    if not tokens or not appended:
        return 0
    parents = getattr(draft, "parents", None) or []
    is_path = getattr(draft, "is_path", None)  # a suffixcache Draft knows (and caches) it
    if len(parents) != len(tokens) or (
        is_path() if is_path is not None else all(p == i - 1 for i, p in enumerate(parents))
    ):
        # A path draft (the usual case): the common prefix.
        n = 0
        for a, b in zip(tokens, appended, strict=False):
            if a != b:
                break
            n += 1
        return n
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        children.setdefault(p, []).append(i)
    node, n = -1, 0
    for tok in appended:
        nxt = next((c for c in children.get(node, ()) if tokens[c] == tok), None)
        if nxt is None:
            break
        node, n = nxt, n + 1
    return n


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
    ) -> None:
        from suffixcache import CostProfile, DraftConfig, Drafter, SuffixCache

        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.limits = limits or Limits()
        self.cache_config = cache_config or CacheConfig()
        self.model_path: Path | None = None
        if tokenizer is None and model_path is not None:
            from .model import Tokenizer, resolve_model_path

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
        # Hooks for other daemon modules (metrics, corpus watcher): observers are called as
        # fn(event, **fields) for "speculate" (ns, seconds, draft) and "step" (ns, session,
        # source, proposed, accepted); close hooks run first thing in close().
        self.observers: list[Any] = []
        self.close_hooks: list[Any] = []
        # The fleet (daemon/fleet.py): called as fn(txn, op, ns, **fields) inside the store
        # transaction of every ingest that reaches a global or corpus tree, so the entry it
        # queues for publication commits (or not) with the data.
        self.ingest_hook: Any = None

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
        self._CostProfile = CostProfile
        self._DraftConfig = DraftConfig
        self._Drafter = Drafter
        self.cache = SuffixCache(
            max_depth=self.cache_config.max_depth,
            global_budget_tokens=self.cache_config.global_budget_tokens,
        )
        self.drafter = Drafter(
            self.cache,
            config=DraftConfig(max_tokens=self.cache_config.default_draft_tokens),
            cost_profile=CostProfile.cpu_default(),
        )
        # Drafters for per-request cost profiles, keyed by the profile's JSON (LRU).
        self._drafters: OrderedDict[str, Any] = OrderedDict()

        self._lock = threading.Lock()
        self._sessions: dict[tuple[str, str], _Session] = {}
        self._ns_sessions: dict[str, int] = {}
        self._ctr_lock = threading.Lock()
        self._counters: dict[tuple[str, str], dict[str, Any]] = {}
        self._docs_accepted: dict[str, dict[str, int]] = {}
        self._dirty: set[tuple[str, str]] = set()
        self._corpus_docs: dict[tuple[str, int], str] = {}
        self.rebuild_seconds = 0.0
        self.rebuild_tokens = 0
        self.rebuilding = False
        self._rebuild_lock = threading.Lock()
        self._removed_during_rebuild: set[int] = set()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

        self._rebuild(background_rebuild)
        self._counter_flush_s = counter_flush_s
        self._spawn(self._flush_loop, "suffixd-counter-flush")
        ttl = self.limits.session_idle_timeout_s
        if ttl > 0:
            interval = reaper_interval_s or max(0.05, min(ttl / 4, 30.0))
            self._spawn(lambda: self._reap_loop(interval), "suffixd-session-reaper")
        self._closed = False

    # ------------------------------------------------------------------ lifecycle
    def _spawn(self, fn: Any, name: str) -> None:
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

    def _rebuild(self, background: bool) -> None:
        """Load the state from LMDB: sessions and counters now; the global and corpus trees
        now or (``background``) in a thread while the daemon already serves."""
        t0 = time.perf_counter()
        n_tokens = 0
        for srec in self.store.iter_sessions():
            ns, sid = srec["ns"], srec["id"]
            toks = self.store.session_tokens(ns, sid)
            n_tokens += len(toks)
            self.cache.open_session(ns, sid, toks)
            sess = _Session(ns, sid, srec)
            sess.push_tail(toks[-_TAIL_KEEP:])
            self._sessions[(ns, sid)] = sess
            self._ns_sessions[ns] = self._ns_sessions.get(ns, 0) + 1
        for ns, sid, ctr in self.store.iter_counters():
            docs = ctr.pop("docs", None)
            base = _new_counters()
            base.update(ctr)
            self._counters[(ns, sid)] = base
            if docs:
                self._docs_accepted[ns] = {str(k): int(v) for k, v in docs.items()}
        self.rebuild_tokens = n_tokens
        # Sequences written from now on go to the trees directly; the rebuild stops here.
        last_id = int(self.store.get_meta("next_seq", 1)) - 1
        self.rebuilding = True
        if background:
            self._spawn(lambda: self._rebuild_sequences(last_id, t0), "suffixd-rebuild")
        else:
            self._rebuild_sequences(last_id, t0)

    def _rebuild_sequences(self, last_id: int, t0: float) -> None:
        evicted: list[int] = []
        for rec in self.store.iter_sequences():
            if rec["id"] > last_id or self._stop.is_set():
                break
            ns, toks = rec["ns"], rec["tokens"]
            with self._rebuild_lock:
                # Removed (session closed without keeping responses, corpus document
                # replaced) after this record was read: do not resurrect it.
                if rec["id"] in self._removed_during_rebuild:
                    continue
                if rec["kind"] == "response":
                    evicted.extend(self.cache.add_response(ns, rec["id"], toks))
                elif rec["kind"] == "corpus":
                    self.cache.add_corpus(ns, rec["id"], toks)
                    if rec.get("doc") is not None:
                        self._corpus_docs[(ns, rec["id"])] = rec["doc"]
            self.rebuild_tokens += len(toks)
        if evicted:
            self._delete_sequences(evicted)
        with self._rebuild_lock:
            self.rebuilding = False
            self._removed_during_rebuild.clear()
        self.rebuild_seconds = time.perf_counter() - t0
        log.info(
            "rebuilt trees from LMDB",
            extra={"tokens": self.rebuild_tokens, "seconds": round(self.rebuild_seconds, 3),
                   "sessions": len(self._sessions)},
        )

    def remove_from_trees(self, ns: str, kind: str, seq_ids: Iterable[int]) -> None:
        """Remove sequences (kind "response" or "corpus") from the trees, also from a
        background rebuild still in progress (which would otherwise re-add them). Modules
        that delete sequences from the store themselves must remove them with this."""
        with self._rebuild_lock:
            for seq in seq_ids:
                if self.rebuilding:
                    self._removed_during_rebuild.add(seq)
                if kind == "corpus":
                    self.cache.remove_corpus(ns, seq)
                    self._corpus_docs.pop((ns, seq), None)
                else:
                    self.cache.remove_response(ns, seq)

    # ------------------------------------------------------------------ validation
    def _check_name(self, what: str, value: str, *, allow_empty: bool = False) -> None:
        if not isinstance(value, str):
            raise InvalidArgument(f"{what} must be a string")
        if not value and not allow_empty:
            raise InvalidArgument(f"{what} must not be empty")
        raw = value.encode("utf-8", errors="surrogatepass")
        if len(raw) > self.limits.max_name_bytes:
            raise InvalidArgument(f"{what} is longer than {self.limits.max_name_bytes} bytes")
        if "\x00" in value:
            raise InvalidArgument(f"{what} must not contain NUL characters")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(f"{what} is not valid UTF-8") from None

    def check_tokens(self, tokens: Sequence[int], what: str = "tokens") -> list[int]:
        toks = list(tokens)
        if len(toks) > self.limits.max_tokens_per_call:
            raise ResourceExhausted(
                f"{len(toks)} {what} in one call; the limit is {self.limits.max_tokens_per_call}"
            )
        hi = self.vocab_size if self.vocab_size is not None else 2**31
        if toks and min(toks) >= 0 and max(toks) < hi:  # the common case, at C speed
            return toks
        for t in toks:
            if not 0 <= t < hi:
                raise InvalidArgument(
                    f"token id {t} out of range [0, {hi})"
                    + (" (the model's vocabulary size)" if self.vocab_size is not None else "")
                )
        return toks

    def _check_kind(self, kind: str) -> str:
        if kind not in KINDS:
            raise InvalidArgument(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
        return kind

    def _check_metadata(self, metadata: dict[str, str] | None) -> dict[str, str]:
        md = dict(metadata or {})
        if len(md) > self.limits.max_metadata_entries:
            raise ResourceExhausted(
                f"{len(md)} metadata entries; the limit is {self.limits.max_metadata_entries}"
            )
        size = 0
        for k, v in md.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise InvalidArgument("metadata keys and values must be strings")
            try:
                size += len(k.encode("utf-8")) + len(v.encode("utf-8"))
            except UnicodeEncodeError:
                raise InvalidArgument("metadata is not valid UTF-8") from None
        if size > self.limits.max_metadata_bytes:
            raise ResourceExhausted(
                f"metadata is {size} bytes; the limit is {self.limits.max_metadata_bytes}"
            )
        return md

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
        }

    # ------------------------------------------------------------------ sessions
    def _get(self, ns: str, sid: str) -> _Session:
        self._check_name("namespace", ns)
        self._check_name("session_id", sid)
        with self._lock:
            sess = self._sessions.get((ns, sid))
        if sess is None:
            raise NotFound(f"no open session {sid!r} in namespace {ns!r}")
        return sess

    def open_session(
        self,
        ns: str,
        session_id: str | None = None,
        metadata: dict[str, str] | None = None,
        tokens: Sequence[int] = (),
    ) -> dict[str, Any]:
        self._check_name("namespace", ns)
        sid = session_id or secrets.token_hex(8)
        self._check_name("session_id", sid)
        md = self._check_metadata(metadata)
        toks = self.check_tokens(tokens)
        now = time.time()
        rec = {"ns": ns, "id": sid, "meta": md, "created": now, "last": now,
               "tokens": 0, "chunks": 0, "n_responses": 0}
        sess = _Session(ns, sid, rec)
        sess.lock.acquire()  # nobody may use the session before it is durable
        try:
            with self._lock:
                if (ns, sid) in self._sessions:
                    raise AlreadyExists(f"session {sid!r} already exists in namespace {ns!r}")
                n = self._ns_sessions.get(ns, 0)
                if n >= self.limits.max_sessions_per_namespace:
                    raise ResourceExhausted(
                        f"namespace {ns!r} has {n} open sessions; the limit is "
                        f"{self.limits.max_sessions_per_namespace} (close some first)"
                    )
                if n == 0 and len(self._ns_sessions) >= self.limits.max_namespaces:
                    raise ResourceExhausted(
                        f"{len(self._ns_sessions)} namespaces have open sessions; "
                        f"the limit is {self.limits.max_namespaces}"
                    )
                self._sessions[(ns, sid)] = sess
                self._ns_sessions[ns] = n + 1
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
            except BaseException:
                with self._lock:
                    self._sessions.pop((ns, sid), None)
                    self._dec_ns(ns)
                with contextlib.suppress(Exception):
                    self.store.write(lambda t: t.delete_session(ns, sid))
                raise
            sess.push_tail(toks)
            return sess.info()
        finally:
            sess.lock.release()

    def _dec_ns(self, ns: str) -> None:
        n = self._ns_sessions.get(ns, 0) - 1
        if n <= 0:
            self._ns_sessions.pop(ns, None)
        else:
            self._ns_sessions[ns] = n

    def close_session(self, ns: str, sid: str, keep_responses: bool = True) -> dict[str, int]:
        sess = self._get(ns, sid)
        with sess.lock:
            if sess.closed:
                raise NotFound(f"no open session {sid!r} in namespace {ns!r}")
            return self._close_locked(sess, keep_responses)

    def _close_locked(self, sess: _Session, keep_responses: bool) -> dict[str, int]:
        ns, sid = sess.ns, sess.id
        with _DeferredBatch.lock:
            if sess.batch is not None:
                sess.batch.close()
        pending = list(sess.pending)
        pending_seq: list[int] = []

        def write(t: Txn) -> list[int]:
            pending_seq.clear()
            responses = t.session_responses(ns, sid)
            if pending and keep_responses:
                # A response still being generated when the session closes is finished now.
                pending_seq.append(t.add_sequence(ns, "response", pending, session=sid))
                self._publish(t, "resp", ns, seq=pending_seq[-1], tokens=pending)
            if not keep_responses:
                self._publish(t, "evict", ns, seqs=responses)
                for seq in responses:
                    t.delete_sequence(seq)
            t.delete_session(ns, sid)
            return responses

        responses: list[int] = self.store.write(write)
        sess.closed = True
        with self._lock:
            self._sessions.pop((ns, sid), None)
            self._dec_ns(ns)
        with self._ctr_lock:
            self._counters.pop((ns, sid), None)
            self._dirty.discard((ns, sid))
        self.cache.close_session(ns, sid)
        if keep_responses:
            for seq in pending_seq:
                self._delete_sequences(self.cache.add_response(ns, seq, pending))
        else:
            self.remove_from_trees(ns, "response", responses)
        kept = len(responses) + len(pending_seq) if keep_responses else 0
        return {"tokens": int(sess.rec.get("tokens", 0)), "responses_kept": kept}

    def list_sessions(self, ns: str | None = None) -> list[dict[str, Any]]:
        if ns:
            self._check_name("namespace", ns)
        with self._lock:
            sessions = [s for (n, _), s in self._sessions.items() if not ns or n == ns]
        return [s.info() for s in sorted(sessions, key=lambda s: (s.ns, s.id))]

    def describe_session(
        self, ns: str, sid: str, tail_tokens: int = 0, include_counters: bool = False
    ) -> dict[str, Any]:
        sess = self._get(ns, sid)
        info = sess.info()
        if tail_tokens:
            info["tail"] = self.session_tail(ns, sid, tail_tokens)
        if include_counters:
            with self._ctr_lock:
                info["counters"] = self._derive(self._counters.get((ns, sid)) or _new_counters())
        return info

    def session_tail(self, ns: str, sid: str, n: int) -> list[int]:
        sess = self._get(ns, sid)
        if n <= len(sess.tail):
            return list(sess.tail[-n:]) if n > 0 else []
        return list(self.cache.session_tokens(ns, sid)[-n:])

    def expire_idle_sessions(self, now: float | None = None) -> list[tuple[str, str]]:
        ttl = self.limits.session_idle_timeout_s
        if ttl <= 0:
            return []
        now = time.time() if now is None else now
        with self._lock:
            idle = [s for s in self._sessions.values() if now - s.last > ttl]
        closed = []
        for sess in idle:
            with sess.lock:
                if sess.closed or now - sess.last <= ttl:
                    continue
                self._close_locked(sess, keep_responses=True)
                closed.append((sess.ns, sess.id))
                log.info("closed idle session", extra={"namespace": sess.ns, "session": sess.id})
        return closed

    def _reap_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.expire_idle_sessions()
            except Exception:  # the reaper must survive a failed close
                log.exception("idle-session expiry failed")

    # ------------------------------------------------------------------ ingest
    def append(self, ns: str, sid: str, kind: str, tokens: Sequence[int]) -> AppendResult:
        return self.append_many([(ns, sid, kind, tokens)])[0]

    def append_many(
        self, items: Iterable[tuple[str, str, str, Sequence[int]]]
    ) -> list[AppendResult]:
        """Append items in order; all are durable (one transaction) when this returns."""
        checked: list[tuple[_Session, str, list[int]]] = []
        total = 0
        for ns, sid, kind, tokens in items:
            self._check_kind(kind)
            toks = self.check_tokens(tokens)
            total += len(toks)
            if total > self.limits.max_tokens_per_call:
                raise ResourceExhausted(
                    f"more than {self.limits.max_tokens_per_call} tokens in one call"
                )
            checked.append((self._get(ns, sid), kind, toks))
        if not checked:
            return []
        sessions = sorted({id(s): s for s, _, _ in checked}.values(), key=lambda s: (s.ns, s.id))
        with contextlib.ExitStack() as stack:
            for s in sessions:
                stack.enter_context(s.lock)
                if s.closed:
                    raise NotFound(f"session {s.id!r} in namespace {s.ns!r} was closed")
            return self._append_locked(checked, sessions)

    def _append_locked(
        self, checked: list[tuple[_Session, str, list[int]]], sessions: list[_Session],
    ) -> list[AppendResult]:
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
        with _DeferredBatch.lock:
            for s in sessions:
                if s.batch is not None:
                    s.batch.close()
        base = {id(s): dict(s.rec) for s in sessions}

        def write(t: Txn) -> tuple[dict[int, dict[str, Any]], list[int | None]]:
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
                    self._publish(t, "resp", sess.ns, seq=seq, tokens=resp)
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
            self._delete_sequences(evicted)
        return results

    def _append_deferred(self, sess: _Session, kind: str, toks: list[int],
                         lazy: bool) -> AppendResult:
        """One deferred append (session streams; any kind but "response", which waits for
        its sequence id), with the session's lock held: the trees and the session follow at
        once, the write joins the session's queued batch or queues a new one
        (_DeferredBatch), and ``sess.last_commit`` is the future that says it is durable.
        ``lazy``: nobody waits for the commit soon (Store.submit).

        The record the store will hold is kept in ``sess.rec`` (chunks numbered, tokens
        counted as the batch will store them), so a later write builds on it."""
        now = time.time()
        rec = sess.rec
        new_batch = None
        kick = False
        with _DeferredBatch.lock:
            b = sess.batch
            if b is not None and b.open:
                if b.lazy and not lazy:
                    b.lazy = False
                    kick = True  # its caller waits for this one: commit what is queued
                _no, last_kind, last = b.chunks[-1]
                if last_kind == kind and len(last) + len(toks) <= _CHUNK_MAX:
                    last.extend(toks)
                else:
                    no = int(rec.get("chunks", 0))
                    b.chunks.append((no, kind, list(toks)))
                    rec["chunks"] = no + 1
            else:
                no = int(rec.get("chunks", 0))
                new_batch = sess.batch = _DeferredBatch(sess, no, kind, list(toks), lazy)
                rec["chunks"] = no + 1
            rec["tokens"] = tokens = int(rec.get("tokens", 0)) + len(toks)
            rec["last"] = now
        if new_batch is not None:
            try:
                fut = self.store.submit(new_batch.write, lazy=lazy)
            except BaseException:
                # Not queued (the store is closing): the session's record and trees no
                # longer match its store, as after a failed commit.
                with _DeferredBatch.lock:
                    new_batch.close()
                sess.write_error = StoreClosedError("the store is closed")
                raise
            sess.last_commit = fut
            fut.add_done_callback(functools.partial(self._deferred_done, sess))
        elif kick:
            self.store.kick()

        accepted = self._follow_append(sess, kind, toks)
        sess.last = now
        return AppendResult(len(toks), tokens, accepted, None)

    def _follow_append(self, sess: _Session, kind: str, toks: list[int]) -> int:
        """Once an append is written (or, deferred, queued): the session's tree, tail,
        pending response and counters follow it, and the session's last draft is judged
        by it. Returns that draft's accepted length for a generated or response append
        (-1 otherwise, or without a draft)."""
        if toks:
            self.cache.append_session(sess.ns, sess.id, toks)
            sess.push_tail(toks)
        accepted = -1
        if kind in ("generated", "response"):
            draft = sess.last_draft
            if draft is not None:
                sess.last_draft = None
                accepted = _accepted_along(draft, toks)
                self.record_step(sess.ns, sess.id, draft.source, len(draft.tokens),
                                 accepted, draft=draft, accepted_tokens=toks)
            with self._ctr_lock:
                self._bump(sess.ns, sess.id, "generated", len(toks))
                if kind == "response":
                    self._bump(sess.ns, sess.id, "requests", 1)
        else:
            sess.last_draft = None
        if kind == "generated":
            sess.pending.extend(toks)
        elif kind == "response":
            sess.pending.clear()
        return accepted

    @staticmethod
    def _deferred_done(sess: _Session, fut: Future[Any]) -> None:
        # Runs in the store's writer thread once a deferred batch committed (or failed);
        # its result is the session's stored length.
        exc = fut.exception()
        if exc is not None:
            if sess.write_error is None:
                sess.write_error = exc
            log.error("deferred commit failed",
                      extra={"namespace": sess.ns, "session": sess.id, "error": repr(exc)})
            return
        tokens = fut.result()
        if tokens > sess.durable_tokens:
            sess.durable_tokens = tokens

    def _publish(self, t: Txn, op: str, ns: str, **fields: Any) -> None:
        if self.ingest_hook is not None:
            self.ingest_hook(t, op, ns, **fields)

    def _delete_sequences(self, seq_ids: list[int]) -> None:
        # Not waited for: an eviction lost in a crash is redone by the next rebuild.
        def write(t: Txn) -> None:
            self._publish(t, "evict", "", seqs=seq_ids)
            for seq in seq_ids:
                t.delete_sequence(seq)

        self.store.submit(write)

    # ------------------------------------------------------------------ drafting
    def _drafter_for(self, cost_profile: Any) -> Any:
        if cost_profile is None:
            return self.drafter
        key = json.dumps(cost_profile, sort_keys=True) if not isinstance(cost_profile, str) \
            else cost_profile
        with self._lock:
            d = self._drafters.get(key)
            if d is not None:
                self._drafters.move_to_end(key)
                return d
        try:
            profile = self._CostProfile.from_json(cost_profile)
        except Exception as exc:
            raise InvalidArgument(f"invalid cost profile: {exc}") from None
        d = self._Drafter(
            self.cache,
            config=self._DraftConfig(max_tokens=self.cache_config.default_draft_tokens),
            cost_profile=profile,
        )
        with self._lock:
            self._drafters[key] = d
            while len(self._drafters) > 16:
                self._drafters.popitem(last=False)
        return d

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
        self._check_name("namespace", ns)
        sess = self._get(ns, session_id) if session_id else None
        if context is None:
            if sess is None:
                raise InvalidArgument("give a context or a session")
            ctx: Sequence[int] = sess.tail[-_TAIL_KEEP:]
        else:
            ctx = self.check_tokens(context, "context tokens")
        self.check_max_tokens(max_tokens)
        return self._draft(ns, session_id or None, sess, ctx, max_tokens,
                           self._drafter_for(cost_profile), remember)

    def check_max_tokens(self, max_tokens: int | None) -> None:
        if max_tokens is not None and max_tokens < 0:
            raise InvalidArgument("max_tokens must be >= 0")
        if max_tokens is not None and max_tokens > self.limits.max_draft_tokens:
            raise ResourceExhausted(
                f"max_tokens {max_tokens} is above the limit {self.limits.max_draft_tokens}"
            )

    def drafter_for(self, cost_profile: Any) -> Any:
        """The Drafter for a cost profile (None: the daemon's); InvalidArgument if bad."""
        return self._drafter_for(cost_profile)

    # ------------------------------------------------------------------ session streams
    def stream_session(self, ns: str, sid: str) -> _Session:
        """The session a step stream works on, resolved (and validated) once per stream."""
        return self._get(ns, sid)

    def step(
        self,
        sess: _Session,
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
        self._check_kind(kind)
        toks = self.check_tokens(tokens) if tokens else None
        if draft:
            self.check_max_tokens(max_tokens)
        res = None
        if toks:
            with sess.lock:
                if sess.closed:
                    raise NotFound(f"session {sess.id!r} in namespace {sess.ns!r} was closed")
                self._check_write_error(sess)
                if defer_commit and kind != "response":
                    res = self._append_deferred(sess, kind, toks, lazy=not commit_soon)
                else:
                    res = self._append_locked([(sess, kind, toks)], [sess])[0]
        elif sess.closed:
            raise NotFound(f"session {sess.id!r} in namespace {sess.ns!r} was closed")
        if not draft:
            return res, None
        return res, self._draft(sess.ns, sess.id, sess, sess.tail[-_TAIL_KEEP:], max_tokens,
                                drafter or self.drafter, True)

    def wait_commits(self, sess: _Session) -> None:
        """Wait until everything the session queued (deferred commits) is committed."""
        fut = sess.last_commit
        if fut is not None:
            if not fut.done():
                self.store.kick()  # it may be a lazy write waiting for company
            with contextlib.suppress(Exception):  # reported through write_error
                fut.result()
        self._check_write_error(sess)

    @staticmethod
    def _check_write_error(sess: _Session) -> None:
        if sess.write_error is not None:
            raise Unavailable(
                f"a deferred commit of session {sess.id!r} in namespace {sess.ns!r} failed "
                f"({sess.write_error}); its stored content lacks acknowledged tokens: close "
                "it and open another"
            )

    def _draft(
        self,
        ns: str,
        session_id: str | None,
        sess: _Session | None,
        ctx: Sequence[int],
        max_tokens: int | None,
        drafter: Any,
        remember: bool,
    ) -> Any:
        t0 = time.perf_counter()
        try:
            draft = drafter.propose(ns, session_id or None, ctx, max_tokens or None)
        except KeyError:
            # The session was closed (or is still being opened) by a concurrent call.
            raise NotFound(f"no open session {session_id!r} in namespace {ns!r}") from None
        if self.observers:
            self._notify("speculate", ns=ns, seconds=time.perf_counter() - t0, draft=draft)
        if sess is not None:
            sess.last = time.time()
            if remember:
                sess.last_draft = draft
        with self._ctr_lock:
            self._bump(ns, session_id or "", "speculate_calls", 1)
        return draft

    # ------------------------------------------------------------------ counters
    def _ctr(self, ns: str, sid: str) -> dict[str, Any]:
        c = self._counters.get((ns, sid))
        if c is None:
            c = self._counters[(ns, sid)] = _new_counters()
        self._dirty.add((ns, sid))
        return c

    def _bump(self, ns: str, sid: str, key: str, n: int) -> None:
        """Add n to a counter of the namespace and (if sid) the session. Needs _ctr_lock."""
        self._ctr(ns, "")[key] += n
        if sid:
            self._ctr(ns, sid)[key] += n

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
        if source not in SOURCES:
            source = "none"
        # Empty drafts too: the drafter's achieved rate must count the steps it
        # declined (one token at the cost of one), or it overrates what it achieves
        # and drafts too little.
        if isinstance(draft, Draft) and source != "draft_model":
            # Calibration is advisory; a failure there must not fail an append.
            with contextlib.suppress(Exception):
                self.drafter.observe(draft, accepted, accepted_tokens)
        sid = session_id or ""
        with self._ctr_lock:
            for key in ((ns, ""), (ns, sid)) if sid else ((ns, ""),):
                c = self._ctr(*key)
                c["steps"] += 1
                c["proposed"] += proposed
                c["accepted"] += accepted
                bs = c["by_source"].setdefault(source, [0, 0, 0])
                bs[0] += 1
                bs[1] += proposed
                bs[2] += accepted
        if self.observers:
            self._notify("step", ns=ns, session=sid, source=source, proposed=proposed,
                         accepted=accepted)
        doc = self._draft_document(ns, draft) if draft is not None and accepted else None
        if doc is not None:
            self.record_document_accept(ns, doc, accepted)

    def _notify(self, event: str, **fields: Any) -> None:
        for fn in self.observers:
            try:
                fn(event, **fields)
            except Exception:  # an observer must never fail a request
                log.exception("observer failed")

    def _draft_document(self, ns: str, draft: Any) -> str | None:
        # The drafter may name the corpus sequence it drew from; map it to its document.
        seq = getattr(draft, "seq_id", None)
        if seq is None or getattr(draft, "source", "") != "corpus":
            return None
        return self._corpus_docs.get((ns, int(seq)))

    def record_document_accept(self, ns: str, doc_key: str, n: int) -> None:
        with self._ctr_lock:
            d = self._docs_accepted.setdefault(ns, {})
            d[doc_key] = d.get(doc_key, 0) + n
            self._dirty.add((ns, ""))

    def flush_counters(self) -> None:
        with self._ctr_lock:
            dirty = list(self._dirty)
            self._dirty.clear()
            snap = {}
            for key in dirty:
                c = self._counters.get(key)
                if c is None:
                    continue
                c2 = json.loads(json.dumps(c))
                if key[1] == "" and key[0] in self._docs_accepted:
                    c2["docs"] = dict(self._docs_accepted[key[0]])
                snap[key] = c2
        if not snap:
            return
        with self._lock:
            live = {k for k in snap if k[1] == "" or k in self._sessions}

        def write(t: Txn) -> None:
            for (ns, sid), c in snap.items():
                if (ns, sid) in live:
                    t.put_counters(ns, sid, c)

        self.store.write(write)

    def _flush_loop(self) -> None:
        while not self._stop.wait(self._counter_flush_s):
            try:
                self.flush_counters()
            except Exception:
                log.exception("counter flush failed")

    @staticmethod
    def _derive(c: dict[str, Any]) -> dict[str, Any]:
        steps, prop, acc = c["steps"], c["proposed"], c["accepted"]
        by_source = {src: {"steps": v[0], "proposed": v[1], "accepted": v[2]}
                     for src, v in sorted(c["by_source"].items())}
        return {
            "requests": c["requests"],
            "steps": steps,
            "draft_tokens_proposed": prop,
            "draft_tokens_accepted": acc,
            "acceptance_rate": acc / prop if prop else 0.0,
            "mean_accepted_per_step": acc / steps if steps else 0.0,
            "by_source": by_source,
            "forward_passes_saved": acc,
            "generated_tokens": c["generated"],
            "speculate_calls": c["speculate_calls"],
        }

    def stats(
        self,
        ns: str | None = None,
        session_id: str | None = None,
        include_sessions: bool = False,
        top_documents: int = 10,
    ) -> dict[str, Any]:
        if ns:
            self._check_name("namespace", ns)
        if session_id:
            if not ns:
                raise InvalidArgument("a session id needs its namespace")
            self._get(ns, session_id)
        with self._lock:
            open_by_ns = dict(self._ns_sessions)
            sess_tokens = {k: int(s.rec.get("tokens", 0)) for k, s in self._sessions.items()}
        with self._ctr_lock:
            ctrs = {k: json.loads(json.dumps(v)) for k, v in self._counters.items()}
            docs = {k: dict(v) for k, v in self._docs_accepted.items()}
        names = set(self.cache.namespaces()) | {k[0] for k in ctrs} | set(open_by_ns)
        if ns:
            names = {ns}
        cache_stats = self.cache.stats()
        out: dict[str, Any] = {}
        for name in sorted(names):
            entry: dict[str, Any] = {
                "counters": self._derive(ctrs.get((name, ""), _new_counters())),
                "cache": cache_stats.get(name, {}),
                "open_sessions": open_by_ns.get(name, 0),
                "top_documents": sorted(docs.get(name, {}).items(), key=lambda kv: -kv[1])[
                    : top_documents or 10
                ],
            }
            if session_id or include_sessions:
                entry["sessions"] = {
                    sid: {
                        "counters": self._derive(ctrs.get((name, sid), _new_counters())),
                        "tokens": tok,
                    }
                    for (n, sid), tok in sorted(sess_tokens.items())
                    if n == name and (not session_id or sid == session_id)
                }
            out[name] = entry
        return out

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
        self._check_name("namespace", ns)
        if not doc_key or "\x00" in doc_key:
            raise InvalidArgument("doc_key must be a non-empty string without NUL")
        seqs = [self.check_tokens(s) for s in sequences]
        if sum(map(len, seqs)) > self.limits.max_tokens_per_call:
            raise ResourceExhausted(
                f"more than {self.limits.max_tokens_per_call} tokens in one document"
            )
        old: list[int] = []

        def write(t: Txn) -> list[int]:
            old.clear()
            prev = t.get_doc(ns, doc_key)
            if prev is not None:
                old.extend(prev.get("seqs", []))
                for s in old:
                    t.delete_sequence(s)
            ids = [t.add_sequence(ns, "corpus", s, doc=doc_key) for s in seqs if s]
            t.put_doc(ns, doc_key, {"seqs": ids, "hash": content_hash, "meta": meta or {},
                                    "tokens": sum(map(len, seqs)), "t": time.time()})
            self._publish(t, "doc", ns, key=doc_key, seqs=seqs, hash=content_hash,
                          meta=meta or {}, replica=replica)
            return ids

        ids: list[int] = self.store.write(write)
        self.remove_from_trees(ns, "corpus", old)
        for seq, toks in zip(ids, [s for s in seqs if s], strict=True):
            self.cache.add_corpus(ns, seq, toks)
            self._corpus_docs[(ns, seq)] = doc_key
        return ids

    def remove_corpus_document(self, ns: str, doc_key: str, replica: Any = None) -> bool:
        self._check_name("namespace", ns)
        old: list[int] = []

        def write(t: Txn) -> bool:
            old.clear()
            prev = t.get_doc(ns, doc_key)
            if prev is None:
                return False
            old.extend(prev.get("seqs", []))
            for s in old:
                t.delete_sequence(s)
            t.delete_doc(ns, doc_key)
            self._publish(t, "undoc", ns, key=doc_key, replica=replica)
            return True

        found: bool = self.store.write(write)
        self.remove_from_trees(ns, "corpus", old)
        return found

    def corpus_document(self, ns: str, doc_key: str) -> dict[str, Any] | None:
        return self.store.get_doc(ns, doc_key)

    def corpus_documents(self, ns: str | None = None) -> list[tuple[str, str, dict[str, Any]]]:
        return self.store.iter_docs(ns)
