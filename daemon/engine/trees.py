"""The global and corpus trees kept in step with the store: the start-up rebuild,
removals a running rebuild honours, evictions deleted from the store, and which corpus
document each corpus sequence came from.

Interface (``TreeIndex``, one per Engine):

* ``start_rebuild(session_tokens, t0, background, spawn, count_sessions)``: re-insert the
  stored "response" and "corpus" sequences into the trees, now or (``background``) in the
  ``suffixd-rebuild`` thread while the daemon serves; ``rebuilding``,
  ``rebuild_tokens`` and ``rebuild_seconds`` tell how far it is (Info.rebuilding); a
  stored record no tree takes (token ids outside the vocabulary) is skipped, logged and
  counted (``invalid_records``), never the end of the rebuild; a store the background
  rebuild cannot read (damaged pages: ``StoreFileError``) ends it: one ERROR line,
  ``rebuild_error`` set, ``rebuilding`` false, and ``failed(error)`` called (the daemon
  stops: what it acknowledged cannot be served);
* ``remove(ns, kind, seq_ids)``: take sequences out of the trees after they were deleted
  from the store; a rebuild still running will not put them back;
* ``delete_sequences(seq_ids)``: delete sequences the global tree evicted from the store
  (queued, not waited for: an eviction lost in a crash is redone by the next rebuild);
* ``add_corpus(ns, seq, tokens, doc_key)``, ``corpus_docs`` ((ns, seq) -> doc key) and
  ``document_of(ns, draft)``: the document a corpus draft was drawn from.

``lock`` (the rebuild lock) pairs the rebuild's inserts with live removals, so a sequence
removed while the rebuild runs is never resurrected; it is taken with nothing but session
locks held and only around tree calls. Live inserts need no lock: sequences written after
the rebuild started are beyond the last id it reads. SuffixCache locks its own trees.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import lmdb

from suffixcache.store import Store, StoreError, Txn

if TYPE_CHECKING:
    from suffixcache import SuffixCache

log = logging.getLogger("suffixd.engine")


class TreeIndex:
    def __init__(self, store: Store, cache: SuffixCache, publish: Callable[..., None],
                 stop: threading.Event, vocab_size: int | None = None) -> None:
        self.store = store
        self.vocab_size = vocab_size
        # Stored records no tree takes (token ids out of range: written by a version that
        # committed a peer's entry unchecked), skipped by the last rebuild.
        self.invalid_records = 0
        self.cache = cache
        self.publish = publish
        self._stop = stop
        self.corpus_docs: dict[tuple[str, int], str] = {}
        self.rebuild_seconds = 0.0
        self.rebuild_tokens = 0
        self.rebuilding = False
        # Why the background rebuild ended before its end (the store could not be read).
        self.rebuild_error: StoreError | None = None
        self.lock = threading.Lock()
        self._removed_during_rebuild: set[int] = set()

    # ------------------------------------------------------------------ rebuild
    def start_rebuild(
        self,
        session_tokens: int,
        t0: float,
        background: bool,
        spawn: Callable[[Callable[[], None], str], None],
        count_sessions: Callable[[], int],
        failed: Callable[[StoreError], None] | None = None,
    ) -> None:
        """After the sessions (``session_tokens`` of them) were loaded at ``t0``.
        ``failed``: called from the thread when a background rebuild cannot read the
        store (a blocking one raises instead)."""
        self.rebuild_tokens = session_tokens
        # Sequences written from now on go to the trees directly; the rebuild stops here.
        last_id = int(self.store.get_meta("next_seq", 1)) - 1
        self.rebuilding = True
        if background:
            spawn(lambda: self._rebuild_in_background(last_id, t0, count_sessions, failed),
                  "suffixd-rebuild")
        else:
            self._rebuild_sequences(last_id, t0, count_sessions)

    def _rebuild_in_background(self, last_id: int, t0: float,
                               count_sessions: Callable[[], int],
                               failed: Callable[[StoreError], None] | None) -> None:
        try:
            self._rebuild_sequences(last_id, t0, count_sessions)
        except (StoreError, lmdb.Error) as exc:
            if self._stop.is_set():
                return  # the engine closed the store under a rebuild it gave up waiting for
            # The helper turns LMDB's damage errors into StoreFileError; any other LMDB
            # error still needs the store's path to be worth reading.
            error = exc if isinstance(exc, StoreError) else StoreError(
                f"the store {self.store.path} could not be read while the trees rebuilt "
                f"({exc})")
            # The blocking rebuild's one line (a thread's traceback said neither the file
            # nor the way out); and not "rebuilding" for good.
            log.error("%s", error)
            with self.lock:
                self.rebuild_error = error
                self.rebuilding = False
                self._removed_during_rebuild.clear()
            self.rebuild_seconds = time.perf_counter() - t0
            if failed is not None:
                failed(error)

    def _rebuild_sequences(self, last_id: int, t0: float,
                           count_sessions: Callable[[], int]) -> None:
        evicted: list[int] = []
        for rec in self.store.iter_sequences():
            if rec["id"] > last_id or self._stop.is_set():
                break
            ns, toks = rec["ns"], rec["tokens"]
            bad = self._invalid(rec)
            with self.lock:
                # Removed (session closed without keeping responses, corpus document
                # replaced) after this record was read: do not resurrect it.
                if rec["id"] in self._removed_during_rebuild:
                    continue
                try:
                    if bad:
                        raise ValueError(bad)
                    if rec["kind"] == "response":
                        evicted.extend(self.cache.add_response(ns, rec["id"], toks))
                    elif rec["kind"] == "corpus":
                        self.cache.add_corpus(ns, rec["id"], toks)
                        if rec.get("doc") is not None:
                            self.corpus_docs[(ns, rec["id"])] = rec["doc"]
                except (ValueError, TypeError) as exc:
                    # One bad record must not stop the rebuild (at every restart): it
                    # stays stored, out of the trees, reported.
                    self.invalid_records += 1
                    log.warning("skipped a stored sequence no tree takes",
                                extra={"seq": rec["id"], "namespace": str(ns)[:80],
                                       "kind": rec.get("kind"), "error": str(exc)[:200]})
                    continue
            self.rebuild_tokens += len(toks)
        if evicted:
            self.delete_sequences(evicted)
        with self.lock:
            self.rebuilding = False
            self._removed_during_rebuild.clear()
        self.rebuild_seconds = time.perf_counter() - t0
        log.info(
            "rebuilt trees from LMDB",
            extra={"tokens": self.rebuild_tokens, "seconds": round(self.rebuild_seconds, 3),
                   "sessions": count_sessions(), "invalid_records": self.invalid_records},
        )

    def _invalid(self, rec: dict[str, Any]) -> str | None:
        """Why a stored record cannot enter a tree (the native tree checks the id range
        itself; the vocabulary is the daemon's), or None."""
        toks = rec.get("tokens")
        if not isinstance(toks, list) or not isinstance(rec.get("ns"), str):
            return "not a sequence record"
        hi = self.vocab_size or 2**31
        if toks and (min(toks) < 0 or max(toks) >= hi):
            return f"token id out of range [0, {hi})"
        return None

    # ------------------------------------------------------------------ live changes
    def remove(self, ns: str, kind: str, seq_ids: Iterable[int]) -> None:
        with self.lock:
            for seq in seq_ids:
                if self.rebuilding:
                    self._removed_during_rebuild.add(seq)
                if kind == "corpus":
                    self.cache.remove_corpus(ns, seq)
                    self.corpus_docs.pop((ns, seq), None)
                else:
                    self.cache.remove_response(ns, seq)

    def forget_namespace(self, ns: str, seq_ids: Iterable[int]) -> None:
        """A dropped namespace (its trees are dropped whole, by the caller): a rebuild still
        running skips its deleted sequences, and its corpus documents are forgotten."""
        with self.lock:
            if self.rebuilding:
                self._removed_during_rebuild.update(seq_ids)
            for key in [k for k in self.corpus_docs if k[0] == ns]:
                del self.corpus_docs[key]

    def delete_sequences(self, seq_ids: list[int]) -> None:
        def write(t: Txn) -> None:
            self.publish(t, "evict", "", seqs=seq_ids)
            for seq in seq_ids:
                t.delete_sequence(seq)

        self.store.submit(write)

    def add_corpus(self, ns: str, seq: int, tokens: list[int], doc_key: str) -> None:
        self.cache.add_corpus(ns, seq, tokens)
        self.corpus_docs[(ns, seq)] = doc_key

    def document_of(self, ns: str, draft: Any) -> str | None:
        # The drafter may name the corpus sequence it drew from; map it to its document.
        seq = getattr(draft, "seq_id", None)
        if seq is None or getattr(draft, "source", "") != "corpus":
            return None
        return self.corpus_docs.get((ns, int(seq)))
