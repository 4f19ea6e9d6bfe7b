"""LMDB persistence for suffixcache: the source of truth for everything ingested.

Layout (one LMDB environment, several named databases; values are msgpack,
token arrays are packed little-endian int32):

``meta``   str key -> value (schema version, tokenizer fingerprint, vocab size, seq id counter)
``seq``    u64 big-endian seq id -> {ns, kind: "response" | "corpus", tok, sess, doc, meta, t}
           (big-endian ids iterate in insertion order, which is what eviction and rebuild need)
``sess``   ns NUL session id -> {ns, id, meta, created, last, tokens, chunks, n_responses}
``sresp``  ns NUL session id NUL u64 big-endian seq id -> b"" (the session's responses, so an
           append stays O(new tokens) however many responses the session has)
``chunk``  ns NUL session id NUL u32 big-endian chunk no -> {k: kind, tok}
           (the session's content, kind "session" sequences, appended piecewise so an append
           costs O(new tokens))
``ctr``    ns NUL [session id] -> counters dict (stats that must survive a restart)
``doc``    ns NUL doc key -> {seqs: [seq ids], hash, ...} (corpus documents)
``fleet``  bytes key -> msgpack value: the fleet's replication state (daemon/fleet.py owns
           its keys: the outbox of entries to publish, stream positions, origin index)

Durability: every write goes through one writer thread that groups the writes
queued while the previous transaction was committing into a single
transaction (group commit), commits it with fsync and only then wakes the
callers. A caller that returned from :meth:`Store.write` therefore knows its
data survives ``kill -9``; concurrent callers share one fsync. Writes submitted
``lazy`` (nobody waits for them soon) may wait a few milliseconds for company.

The map grows on demand: a transaction that hits ``MapFullError`` is aborted,
the map doubled and the batch replayed, so callers never see the error.
"""

from __future__ import annotations

import array
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, cast

import lmdb
import msgpack

SCHEMA_VERSION = 1
_U64 = 8


class StoreError(Exception):
    """Base class of the store's errors."""


class TokenizerMismatchError(StoreError):
    """The data directory was written with another tokenizer."""


class StoreClosedError(StoreError):
    pass


def pack_tokens(tokens: Sequence[int]) -> bytes:
    arr = array.array("i", tokens)
    if sys.byteorder != "little":
        arr.byteswap()
    return arr.tobytes()


def unpack_tokens(data: bytes) -> list[int]:
    arr = array.array("i")
    arr.frombytes(data)
    if sys.byteorder != "little":
        arr.byteswap()
    return arr.tolist()


def _key(*parts: str) -> bytes:
    return b"\x00".join(p.encode("utf-8") for p in parts)


def _dump(obj: Any) -> bytes:
    packed: bytes = msgpack.packb(obj, use_bin_type=True)
    return packed


def _load(data: bytes | memoryview) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


class Txn:
    """A write transaction as seen by the callables passed to :meth:`Store.write`."""

    def __init__(self, store: Store, txn: lmdb.Transaction) -> None:
        self._s = store
        self.txn = txn

    # -- sequences -------------------------------------------------------
    def next_seq_id(self) -> int:
        raw = self.txn.get(b"next_seq", db=self._s._meta)
        nxt = _load(raw) if raw is not None else 1
        self.txn.put(b"next_seq", _dump(nxt + 1), db=self._s._meta)
        return int(nxt)

    def add_sequence(
        self,
        ns: str,
        kind: str,
        tokens: Sequence[int],
        *,
        session: str | None = None,
        doc: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> int:
        seq_id = self.next_seq_id()
        rec = {
            "ns": ns,
            "kind": kind,
            "tok": pack_tokens(tokens),
            "sess": session,
            "doc": doc,
            "meta": meta or {},
            "t": time.time(),
        }
        self.txn.put(seq_id.to_bytes(_U64, "big"), _dump(rec), db=self._s._seq)
        return seq_id

    def delete_sequence(self, seq_id: int) -> bool:
        return bool(self.txn.delete(seq_id.to_bytes(_U64, "big"), db=self._s._seq))

    def get_sequence(self, seq_id: int) -> dict[str, Any] | None:
        raw = self.txn.get(seq_id.to_bytes(_U64, "big"), db=self._s._seq)
        return _decode_seq(seq_id, raw) if raw is not None else None

    # -- sessions --------------------------------------------------------
    def get_session(self, ns: str, sid: str) -> dict[str, Any] | None:
        raw = self.txn.get(_key(ns, sid), db=self._s._sess)
        return _load(raw) if raw is not None else None

    def put_session(self, rec: dict[str, Any]) -> None:
        self.txn.put(_key(rec["ns"], rec["id"]), _dump(rec), db=self._s._sess)

    def append_chunk(self, rec: dict[str, Any], kind: str, tokens: Sequence[int]) -> None:
        """Append a chunk to a session and update (and store) its record."""
        no = int(rec.get("chunks", 0))
        self.put_chunk(rec["ns"], rec["id"], no, kind, tokens)
        rec["chunks"] = no + 1
        rec["tokens"] = int(rec.get("tokens", 0)) + len(tokens)
        self.put_session(rec)

    def put_chunk(self, ns: str, sid: str, no: int, kind: str, tokens: Sequence[int]) -> None:
        """Store chunk ``no`` of a session as it is; the caller stores the session record
        that counts it (:meth:`put_session`), in the same transaction. For writers that
        number their chunks ahead of the commit (coalesced deferred appends)."""
        key = _key(ns, sid) + b"\x00" + no.to_bytes(4, "big")
        self.txn.put(key, _dump({"k": kind, "tok": pack_tokens(tokens)}), db=self._s._chunk)

    def add_session_response(self, ns: str, sid: str, seq_id: int) -> None:
        key = _key(ns, sid) + b"\x00" + seq_id.to_bytes(_U64, "big")
        self.txn.put(key, b"", db=self._s._sresp)

    def session_responses(self, ns: str, sid: str) -> list[int]:
        prefix = _key(ns, sid) + b"\x00"
        out: list[int] = []
        cur = self.txn.cursor(db=self._s._sresp)
        ok = cur.set_range(prefix)
        while ok and cast(bytes, cur.key()).startswith(prefix):
            out.append(int.from_bytes(cur.key()[len(prefix) :], "big"))
            ok = cur.next()
        return out

    def delete_session(self, ns: str, sid: str) -> None:
        prefix = _key(ns, sid) + b"\x00"
        for db in (self._s._chunk, self._s._sresp):
            cur = self.txn.cursor(db=db)
            if cur.set_range(prefix):
                while cast(bytes, cur.key()).startswith(prefix):
                    if not cur.delete():
                        break
        self.txn.delete(_key(ns, sid), db=self._s._sess)
        self.txn.delete(_key(ns, sid), db=self._s._ctr)

    # -- counters and documents -----------------------------------------
    def put_counters(self, ns: str, sid: str, counters: dict[str, Any]) -> None:
        self.txn.put(_key(ns, sid), _dump(counters), db=self._s._ctr)

    def get_doc(self, ns: str, doc_key: str) -> dict[str, Any] | None:
        raw = self.txn.get(_key(ns, doc_key), db=self._s._doc)
        return _load(raw) if raw is not None else None

    def put_doc(self, ns: str, doc_key: str, rec: dict[str, Any]) -> None:
        self.txn.put(_key(ns, doc_key), _dump(rec), db=self._s._doc)

    def delete_doc(self, ns: str, doc_key: str) -> bool:
        return bool(self.txn.delete(_key(ns, doc_key), db=self._s._doc))

    def put_meta(self, key: str, value: Any) -> None:
        self.txn.put(key.encode(), _dump(value), db=self._s._meta)

    # -- fleet replication state (daemon/fleet.py) -------------------------
    def fleet_get(self, key: bytes) -> Any:
        raw = self.txn.get(key, db=self._s._fleet)
        return _load(raw) if raw is not None else None

    def fleet_put(self, key: bytes, value: Any) -> None:
        self.txn.put(key, _dump(value), db=self._s._fleet)

    def fleet_delete(self, key: bytes) -> bool:
        return bool(self.txn.delete(key, db=self._s._fleet))


def _nothing(_t: Txn) -> None:
    return None


def _decode_seq(seq_id: int, raw: bytes | memoryview) -> dict[str, Any]:
    rec: dict[str, Any] = _load(raw)
    rec["id"] = seq_id
    rec["tokens"] = unpack_tokens(rec.pop("tok"))
    return rec


class _Job:
    __slots__ = ("fn", "future", "lazy")

    def __init__(self, fn: Callable[[Txn], Any], lazy: bool = False) -> None:
        self.fn = fn
        self.future: Future[Any] = Future()
        self.lazy = lazy


class Store:
    """The LMDB store. Thread-safe; writes are durable when :meth:`write` returns."""

    def __init__(
        self,
        path: str | Path,
        *,
        map_size: int = 64 << 20,
        sync: bool = True,
        max_batch: int = 512,
        lazy_interval_s: float = 0.005,
    ) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.env = lmdb.open(
            str(self.path),
            # The token data is the users' text: owner-only files (LMDB's default is 0644).
            mode=0o600,
            # Opening the named databases needs a few pages; below 1 MiB that can fail.
            map_size=max(map_size, 1 << 20),
            max_dbs=16,
            sync=sync,
            metasync=sync,
            # One process per store (the daemon's lock file enforces it); readers in
            # this process are serialised by self._lock, so no reader table growth.
            max_readers=64,
        )
        self._meta = self.env.open_db(b"meta")
        self._seq = self.env.open_db(b"seq")
        self._sess = self.env.open_db(b"sess")
        self._chunk = self.env.open_db(b"chunk")
        self._ctr = self.env.open_db(b"ctr")
        self._doc = self.env.open_db(b"doc")
        self._sresp = self.env.open_db(b"sresp")
        self._fleet = self.env.open_db(b"fleet")
        # Serialises every transaction of this process with map resizing, which LMDB
        # only allows while no transaction is open. Reads are rare (start-up, describe);
        # the in-memory trees serve the hot path.
        self._lock = threading.Lock()
        self._max_batch = max_batch
        self._lazy_interval = lazy_interval_s
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._closed = False
        self.commits = 0
        self.resizes = 0
        with self._lock, self.env.begin(write=True) as txn:
            raw = txn.get(b"schema", db=self._meta)
            if raw is None:
                txn.put(b"schema", _dump(SCHEMA_VERSION), db=self._meta)
            elif _load(raw) != SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path}: store schema {_load(raw)} is not supported "
                    f"(this version reads schema {SCHEMA_VERSION})"
                )
        self._writer = threading.Thread(
            target=self._run_writer, name="suffixd-lmdb-writer", daemon=True
        )
        self._writer.start()

    # -- lifecycle -------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._writer.join()
        with self._lock:
            self.env.sync(True)
            self.env.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- tokenizer check -------------------------------------------------
    def check_tokenizer(self, fingerprint: str | None, vocab_size: int | None) -> None:
        """Record the tokenizer on first use; refuse data written with another one."""
        stored_fp = self.get_meta("tokenizer_fingerprint")
        stored_vocab = self.get_meta("vocab_size")
        if fingerprint is not None and stored_fp is not None and stored_fp != fingerprint:
            raise TokenizerMismatchError(
                f"the data in {self.path} was written with tokenizer {stored_fp} "
                f"(vocab {stored_vocab}), but this daemon's model has tokenizer {fingerprint} "
                f"(vocab {vocab_size}); use the same model (or one with the same vocabulary) "
                "or another --data-dir"
            )
        if vocab_size is not None and stored_vocab is not None and stored_vocab != vocab_size:
            raise TokenizerMismatchError(
                f"the data in {self.path} was written with a vocabulary of {stored_vocab} "
                f"tokens, but this daemon's model has {vocab_size}"
            )

        def record(t: Txn) -> None:
            if fingerprint is not None and stored_fp is None:
                t.put_meta("tokenizer_fingerprint", fingerprint)
            if vocab_size is not None and stored_vocab is None:
                t.put_meta("vocab_size", vocab_size)

        self.write(record)

    # -- writes ----------------------------------------------------------
    def write(self, fn: Callable[[Txn], Any]) -> Any:
        """Run ``fn(txn)`` in a write transaction; return its result once committed."""
        return self.submit(fn).result()

    def submit(self, fn: Callable[[Txn], Any], *, lazy: bool = False) -> Future[Any]:
        """Queue ``fn(txn)``; the future is done once it committed (or failed).

        ``lazy``: nobody waits for this commit soon (a deferred write), so it may wait for
        company: a group of lazy writes only commits ``lazy_interval_s`` after the previous
        commit ended (or as soon as a write that is not lazy joins it). Under a stream of
        small deferred writes this bounds the commit rate, and with it the fsyncs and the
        writer thread's work, instead of committing each write alone as soon as the disk
        is free."""
        if self._closed:
            raise StoreClosedError("the store is closed")
        job = _Job(fn, lazy)
        self._queue.put(job)
        return job.future

    def kick(self) -> None:
        """Commit what is queued now, lazy or not (for a caller that starts waiting for a
        lazy write it queued)."""
        self.submit(_nothing)

    def _run_writer(self) -> None:
        stop = False
        last_end = 0.0
        while not stop:
            first = self._queue.get()
            if first is None:
                return
            jobs = [first]
            urgent = not first.lazy
            due = last_end + self._lazy_interval
            # Everything queued while the previous commit ran shares this transaction; a
            # group of lazy writes also takes what comes until it is due.
            while len(jobs) < self._max_batch:
                try:
                    wait = 0.0 if urgent else due - time.monotonic()
                    nxt = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                jobs.append(nxt)
                urgent = urgent or not nxt.lazy
            self._commit_group(jobs)
            last_end = time.monotonic()

    def _commit_group(self, jobs: list[_Job]) -> None:
        try:
            results = self._run_txn(jobs)
        except Exception:
            if len(jobs) == 1:
                self._fail(jobs[0])
                return
            # One job failed: isolate it so the others still commit.
            for job in jobs:
                try:
                    res = self._run_txn([job])
                except Exception:
                    self._fail(job)
                else:
                    job.future.set_result(res[0])
            return
        for job, res in zip(jobs, results, strict=True):
            job.future.set_result(res)

    @staticmethod
    def _fail(job: _Job) -> None:
        exc = sys.exc_info()[1]
        job.future.set_exception(exc if exc is not None else StoreError("write failed"))

    def _run_txn(self, jobs: list[_Job]) -> list[Any]:
        while True:
            with self._lock:
                txn = self.env.begin(write=True)
                try:
                    t = Txn(self, txn)
                    results = [job.fn(t) for job in jobs]
                    txn.commit()
                    self.commits += 1
                    return results
                except lmdb.MapFullError:
                    txn.abort()
                    new_size = self.env.info()["map_size"] * 2
                    self.env.set_mapsize(new_size)
                    self.resizes += 1
                except BaseException:
                    txn.abort()
                    raise

    # -- reads -----------------------------------------------------------
    def get_meta(self, key: str, default: Any = None) -> Any:
        with self._lock, self.env.begin() as txn:
            raw = txn.get(key.encode(), db=self._meta)
        return _load(raw) if raw is not None else default

    def get_sequence(self, seq_id: int) -> dict[str, Any] | None:
        with self._lock, self.env.begin() as txn:
            raw = txn.get(seq_id.to_bytes(_U64, "big"), db=self._seq)
        return _decode_seq(seq_id, raw) if raw is not None else None

    def iter_sequences(self, batch: int = 4096) -> Iterator[dict[str, Any]]:
        """All sequences in insertion order (read in batches so writers are not held up)."""
        start = b""
        while True:
            rows: list[tuple[bytes, bytes]] = []
            with self._lock, self.env.begin() as txn:
                cur = txn.cursor(db=self._seq)
                ok = cur.set_range(start) if start else cur.first()
                while ok and len(rows) < batch:
                    rows.append((cur.key(), cur.value()))
                    ok = cur.next()
            for k, v in rows:
                yield _decode_seq(int.from_bytes(k, "big"), v)
            if len(rows) < batch:
                return
            start = (int.from_bytes(rows[-1][0], "big") + 1).to_bytes(_U64, "big")

    def iter_sessions(self) -> list[dict[str, Any]]:
        with self._lock, self.env.begin() as txn:
            return [_load(v) for _, v in txn.cursor(db=self._sess)]

    def get_session(self, ns: str, sid: str) -> dict[str, Any] | None:
        with self._lock, self.env.begin() as txn:
            raw = txn.get(_key(ns, sid), db=self._sess)
        return _load(raw) if raw is not None else None

    def session_chunks(self, ns: str, sid: str) -> list[tuple[str, list[int]]]:
        prefix = _key(ns, sid) + b"\x00"
        out: list[tuple[str, list[int]]] = []
        with self._lock, self.env.begin() as txn:
            cur = txn.cursor(db=self._chunk)
            ok = cur.set_range(prefix)
            while ok and cur.key().startswith(prefix):
                rec = _load(cur.value())
                out.append((rec["k"], unpack_tokens(rec["tok"])))
                ok = cur.next()
        return out

    def session_tokens(self, ns: str, sid: str) -> list[int]:
        return [t for _, toks in self.session_chunks(ns, sid) for t in toks]

    def iter_counters(self) -> list[tuple[str, str, dict[str, Any]]]:
        """(namespace, session id or "", counters) for every stored counter record."""
        with self._lock, self.env.begin() as txn:
            rows = list(txn.cursor(db=self._ctr))
        out = []
        for k, v in rows:
            ns, _, sid = k.decode("utf-8").partition("\x00")
            out.append((ns, sid, _load(v)))
        return out

    def get_doc(self, ns: str, doc_key: str) -> dict[str, Any] | None:
        with self._lock, self.env.begin() as txn:
            raw = txn.get(_key(ns, doc_key), db=self._doc)
        return _load(raw) if raw is not None else None

    def iter_docs(self, ns: str | None = None) -> list[tuple[str, str, dict[str, Any]]]:
        prefix = (ns.encode("utf-8") + b"\x00") if ns is not None else b""
        with self._lock, self.env.begin() as txn:
            cur = txn.cursor(db=self._doc)
            ok = cur.set_range(prefix) if prefix else cur.first()
            rows = []
            while ok and cur.key().startswith(prefix):
                rows.append((cur.key(), cur.value()))
                ok = cur.next()
        out = []
        for k, v in rows:
            d_ns, _, key = k.decode("utf-8").partition("\x00")
            out.append((d_ns, key, _load(v)))
        return out

    def fleet_get(self, key: bytes) -> Any:
        with self._lock, self.env.begin() as txn:
            raw = txn.get(key, db=self._fleet)
        return _load(raw) if raw is not None else None

    def fleet_items(self, prefix: bytes, limit: int = 1 << 30) -> list[tuple[bytes, Any]]:
        """Up to ``limit`` (key, value) pairs of the fleet database whose key starts with
        ``prefix``, in key order."""
        out: list[tuple[bytes, Any]] = []
        with self._lock, self.env.begin() as txn:
            cur = txn.cursor(db=self._fleet)
            ok = cur.set_range(prefix)
            while ok and len(out) < limit and cur.key().startswith(prefix):
                out.append((cur.key(), cur.value()))
                ok = cur.next()
        return [(k, _load(v)) for k, v in out]

    def stat(self) -> dict[str, Any]:
        with self._lock:
            info = self.env.info()
            with self.env.begin() as txn:
                seqs = txn.stat(self._seq)["entries"]
                sess = txn.stat(self._sess)["entries"]
        return {
            "map_size": info["map_size"],
            "used_bytes": (info["last_pgno"] + 1) * self.env.stat()["psize"],
            "sequences": seqs,
            "sessions": sess,
            "commits": self.commits,
            "resizes": self.resizes,
            "path": os.fspath(self.path),
        }
