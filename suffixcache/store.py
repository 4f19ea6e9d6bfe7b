"""LMDB persistence for suffixcache: the source of truth for everything ingested.

``Store`` opens the environment (owner-only files, schema check), records and checks the
tokenizer, takes writes and answers reads. The rooms behind it:

* suffixcache/store_layout.py: the named databases, their keys and the value encoding
  (msgpack, tokens packed little-endian int32);
* suffixcache/store_records.py: ``Txn``, the record kinds (sequences, sessions and their
  chunks, counters, documents, the fleet's state) inside a write transaction;
* suffixcache/store_writer.py: the writer thread (group commit, fsync, map growth).

Durability: a caller that returned from :meth:`Store.write` knows its data survives
``kill -9``; concurrent callers share one fsync. Writes submitted ``lazy`` (nobody waits
for them soon) may wait a few milliseconds for company. The map grows on demand: callers
never see ``MapFullError``.

Interface: ``Store(path, map_size=, sync=, max_batch=, lazy_interval_s=)``; ``write``,
``submit``, ``kick``; the reads (``get_meta``, ``get_sequence``, ``iter_sequences``,
``iter_sessions``, ``get_session``, ``session_chunks``, ``session_tokens``,
``iter_counters``, ``get_doc``, ``iter_docs``, ``fleet_get``, ``fleet_items``, ``stat``);
``check_tokenizer``; ``close``. Errors: ``StoreError``, ``TokenizerMismatchError``,
``StoreClosedError``, ``DiskFullError`` (a write failed for want of space: nothing of it
was stored, and writes succeed again once space is freed; reads are unaffected),
``StoreFileError`` (a file of the store is a link, not a regular file, empty, truncated or
damaged: suffixcache/store_files.py checks them before and after LMDB opens them; raised
by the constructor, or by a read that meets damaged pages).
``Txn``, ``pack_tokens`` and ``unpack_tokens`` live in the modules above.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import lmdb

from .store_errors import DiskFullError, StoreError, StoreFileError
from .store_files import DAMAGE, check_after_open, check_before_open, damaged
from .store_layout import (
    SCHEMA_VERSION,
    U64,
    Databases,
    decode_seq,
    dump,
    load,
    name_key,
    seq_key,
    unpack_tokens,
)
from .store_records import Txn
from .store_writer import GroupCommitWriter

__all__ = ["DiskFullError", "Store", "StoreClosedError", "StoreError", "StoreFileError",
           "TokenizerMismatchError", "Txn"]


class TokenizerMismatchError(StoreError):
    """The data directory was written with another tokenizer."""


class StoreClosedError(StoreError):
    pass


def _nothing(_t: Txn) -> None:
    return None


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
        check_before_open(self.path)
        try:
            self.env = lmdb.open(
                str(self.path),
                # The token data is the users' text: owner-only files (LMDB's default is
                # 0644).
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
        except DAMAGE as exc:
            raise damaged(self.path, exc) from None
        # Serialises every transaction of this process with map resizing, which LMDB
        # only allows while no transaction is open. Reads are rare (start-up, describe);
        # the in-memory trees serve the hot path.
        self._lock = threading.Lock()
        self._closed = False
        try:
            # Before anything reads a page: past a truncated file's end that is SIGBUS.
            check_after_open(self.path, self.env)
            self._dbs = Databases.open(self.env)
            with self._lock, self.env.begin(write=True) as txn:
                raw = txn.get(b"schema", db=self._dbs.meta)
                if raw is None:
                    txn.put(b"schema", dump(SCHEMA_VERSION), db=self._dbs.meta)
                elif load(raw) != SCHEMA_VERSION:
                    raise StoreError(
                        f"{self.path}: store schema {load(raw)} is not supported "
                        f"(this version reads schema {SCHEMA_VERSION})"
                    )
        except BaseException as exc:
            self.env.close()
            if isinstance(exc, DAMAGE):
                raise damaged(self.path, exc) from None
            raise
        self._writer = GroupCommitWriter(
            self.env, self._dbs, self._lock, max_batch=max_batch, lazy_interval_s=lazy_interval_s
        )

    # -- lifecycle -------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._writer.close()
        with self._lock:
            self.env.sync(True)
            self.env.close()

    @property
    def commits(self) -> int:
        """Write transactions committed since the store opened."""
        return self._writer.commits

    @property
    def resizes(self) -> int:
        """Times the map was doubled since the store opened."""
        return self._writer.resizes

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
        return self._writer.submit(fn, lazy=lazy)

    def kick(self) -> None:
        """Commit what is queued now, lazy or not (for a caller that starts waiting for a
        lazy write it queued)."""
        self.submit(_nothing)

    # -- reads -----------------------------------------------------------
    @contextlib.contextmanager
    def _reading(self) -> Iterator[lmdb.Transaction[bytes]]:
        """A read transaction under the store's lock; damaged pages met on the way are a
        ``StoreFileError`` (LMDB's own errors would not say which file, or what to do)."""
        with self._lock:
            try:
                with self.env.begin() as txn:
                    yield txn
            except DAMAGE as exc:
                raise damaged(self.path, exc) from None

    def get_meta(self, key: str, default: Any = None) -> Any:
        with self._reading() as txn:
            raw = txn.get(key.encode(), db=self._dbs.meta)
        return load(raw) if raw is not None else default

    def get_sequence(self, seq_id: int) -> dict[str, Any] | None:
        with self._reading() as txn:
            raw = txn.get(seq_key(seq_id), db=self._dbs.seq)
        return decode_seq(seq_id, raw) if raw is not None else None

    def iter_sequences(self, batch: int = 4096) -> Iterator[dict[str, Any]]:
        """All sequences in insertion order (read in batches so writers are not held up)."""
        start = b""
        while True:
            rows: list[tuple[bytes, bytes]] = []
            with self._reading() as txn:
                cur = txn.cursor(db=self._dbs.seq)
                ok = cur.set_range(start) if start else cur.first()
                while ok and len(rows) < batch:
                    rows.append((cur.key(), cur.value()))
                    ok = cur.next()
            for k, v in rows:
                yield decode_seq(int.from_bytes(k, "big"), v)
            if len(rows) < batch:
                return
            start = (int.from_bytes(rows[-1][0], "big") + 1).to_bytes(U64, "big")

    def iter_sessions(self) -> list[dict[str, Any]]:
        with self._reading() as txn:
            return [load(v) for _, v in txn.cursor(db=self._dbs.sess)]

    def get_session(self, ns: str, sid: str) -> dict[str, Any] | None:
        with self._reading() as txn:
            raw = txn.get(name_key(ns, sid), db=self._dbs.sess)
        return load(raw) if raw is not None else None

    def session_chunks(self, ns: str, sid: str) -> list[tuple[str, list[int]]]:
        prefix = name_key(ns, sid) + b"\x00"
        out: list[tuple[str, list[int]]] = []
        with self._reading() as txn:
            cur = txn.cursor(db=self._dbs.chunk)
            ok = cur.set_range(prefix)
            while ok and cur.key().startswith(prefix):
                rec = load(cur.value())
                out.append((rec["k"], unpack_tokens(rec["tok"])))
                ok = cur.next()
        return out

    def session_tokens(self, ns: str, sid: str) -> list[int]:
        return [t for _, toks in self.session_chunks(ns, sid) for t in toks]

    def iter_counters(self) -> list[tuple[str, str, dict[str, Any]]]:
        """(namespace, session id or "", counters) for every stored counter record."""
        with self._reading() as txn:
            rows = list(txn.cursor(db=self._dbs.ctr))
        out = []
        for k, v in rows:
            ns, _, sid = k.decode("utf-8").partition("\x00")
            out.append((ns, sid, load(v)))
        return out

    def get_doc(self, ns: str, doc_key: str) -> dict[str, Any] | None:
        with self._reading() as txn:
            raw = txn.get(name_key(ns, doc_key), db=self._dbs.doc)
        return load(raw) if raw is not None else None

    def iter_docs(self, ns: str | None = None) -> list[tuple[str, str, dict[str, Any]]]:
        prefix = (ns.encode("utf-8") + b"\x00") if ns is not None else b""
        with self._reading() as txn:
            cur = txn.cursor(db=self._dbs.doc)
            ok = cur.set_range(prefix) if prefix else cur.first()
            rows = []
            while ok and cur.key().startswith(prefix):
                rows.append((cur.key(), cur.value()))
                ok = cur.next()
        out = []
        for k, v in rows:
            d_ns, _, key = k.decode("utf-8").partition("\x00")
            out.append((d_ns, key, load(v)))
        return out

    def fleet_get(self, key: bytes) -> Any:
        with self._reading() as txn:
            raw = txn.get(key, db=self._dbs.fleet)
        return load(raw) if raw is not None else None

    def fleet_items(self, prefix: bytes, limit: int = 1 << 30) -> list[tuple[bytes, Any]]:
        """Up to ``limit`` (key, value) pairs of the fleet database whose key starts with
        ``prefix``, in key order."""
        out: list[tuple[bytes, Any]] = []
        with self._reading() as txn:
            cur = txn.cursor(db=self._dbs.fleet)
            ok = cur.set_range(prefix)
            while ok and len(out) < limit and cur.key().startswith(prefix):
                out.append((cur.key(), cur.value()))
                ok = cur.next()
        return [(k, load(v)) for k, v in out]

    def stat(self) -> dict[str, Any]:
        with self._lock:
            info = self.env.info()
            with self.env.begin() as txn:
                seqs = txn.stat(self._dbs.seq)["entries"]
                sess = txn.stat(self._dbs.sess)["entries"]
        return {
            "map_size": info["map_size"],
            "used_bytes": (info["last_pgno"] + 1) * self.env.stat()["psize"],
            "sequences": seqs,
            "sessions": sess,
            "commits": self.commits,
            "resizes": self.resizes,
            "path": os.fspath(self.path),
        }
