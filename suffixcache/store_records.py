"""The store's record kinds as a write transaction sees them.

``Txn`` is what the callables passed to ``Store.write`` / ``Store.submit`` receive: one
open LMDB write transaction with a method per record kind (the layout is in
suffixcache/store_layout.py):

* sequences: ``next_seq_id``, ``add_sequence``, ``get_sequence``, ``delete_sequence``
* sessions: ``get_session``, ``put_session``, ``append_chunk``, ``put_chunk``,
  ``add_session_response``, ``session_responses``, ``delete_session``
* a whole namespace: ``drop_namespace``
* counters, documents, meta: ``put_counters``, ``get_doc``, ``put_doc``, ``delete_doc``,
  ``put_meta``
* the fleet's replication state: ``fleet_get``, ``fleet_put``, ``fleet_delete``

``txn`` is the raw ``lmdb.Transaction``. Nothing here commits: the store's writer does
(suffixcache/store_writer.py).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, cast

import lmdb

from .store_layout import (
    Databases,
    chunk_key,
    decode_seq,
    dump,
    load,
    name_key,
    pack_tokens,
    seq_key,
    session_response_key,
)


class Txn:
    """A write transaction as seen by the callables passed to :meth:`Store.write`."""

    def __init__(self, dbs: Databases, txn: lmdb.Transaction) -> None:
        self._dbs = dbs
        self.txn = txn

    # -- sequences -------------------------------------------------------
    def next_seq_id(self) -> int:
        raw = self.txn.get(b"next_seq", db=self._dbs.meta)
        nxt = load(raw) if raw is not None else 1
        self.txn.put(b"next_seq", dump(nxt + 1), db=self._dbs.meta)
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
        self.txn.put(seq_key(seq_id), dump(rec), db=self._dbs.seq)
        return seq_id

    def delete_sequence(self, seq_id: int) -> bool:
        return bool(self.txn.delete(seq_key(seq_id), db=self._dbs.seq))

    def get_sequence(self, seq_id: int) -> dict[str, Any] | None:
        raw = self.txn.get(seq_key(seq_id), db=self._dbs.seq)
        return decode_seq(seq_id, raw) if raw is not None else None

    # -- sessions --------------------------------------------------------
    def get_session(self, ns: str, sid: str) -> dict[str, Any] | None:
        raw = self.txn.get(name_key(ns, sid), db=self._dbs.sess)
        return load(raw) if raw is not None else None

    def put_session(self, rec: dict[str, Any]) -> None:
        self.txn.put(name_key(rec["ns"], rec["id"]), dump(rec), db=self._dbs.sess)

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
        self.txn.put(chunk_key(ns, sid, no), dump({"k": kind, "tok": pack_tokens(tokens)}),
                     db=self._dbs.chunk)

    def add_session_response(self, ns: str, sid: str, seq_id: int) -> None:
        self.txn.put(session_response_key(ns, sid, seq_id), b"", db=self._dbs.sresp)

    def session_responses(self, ns: str, sid: str) -> list[int]:
        prefix = name_key(ns, sid) + b"\x00"
        out: list[int] = []
        cur = self.txn.cursor(db=self._dbs.sresp)
        ok = cur.set_range(prefix)
        while ok and cast(bytes, cur.key()).startswith(prefix):
            out.append(int.from_bytes(cur.key()[len(prefix) :], "big"))
            ok = cur.next()
        return out

    def delete_session(self, ns: str, sid: str) -> None:
        prefix = name_key(ns, sid) + b"\x00"
        for db in (self._dbs.chunk, self._dbs.sresp):
            cur = self.txn.cursor(db=db)
            if cur.set_range(prefix):
                while cast(bytes, cur.key()).startswith(prefix):
                    if not cur.delete():
                        break
        self.txn.delete(name_key(ns, sid), db=self._dbs.sess)
        self.txn.delete(name_key(ns, sid), db=self._dbs.ctr)

    def drop_namespace(self, ns: str) -> dict[str, Any]:
        """Delete every record of namespace ``ns``: its sessions (records, chunks,
        response lists), counters, corpus documents and sequences (global and corpus;
        they are keyed by id alone, so all of them are scanned). Returns the deleted
        sequence ids, the documents and the other records deleted."""
        prefix = ns.encode("utf-8") + b"\x00"
        d = self._dbs
        records = documents = 0
        for db in (d.sess, d.chunk, d.sresp, d.ctr, d.doc):
            cur = self.txn.cursor(db=db)
            ok = cur.set_range(prefix)
            while ok and cast(bytes, cur.key()).startswith(prefix):
                records += 1
                documents += db is d.doc
                ok = cur.delete()
        seq_ids: list[int] = []
        cur = self.txn.cursor(db=d.seq)
        ok = cur.first()
        while ok:
            if load(cur.value()).get("ns") == ns:
                seq_ids.append(int.from_bytes(cur.key(), "big"))
                # (after the last record the cursor is past the end: an empty key)
                ok = cur.delete() and bool(cur.key())
            else:
                ok = cur.next()
        return {"sequence_ids": seq_ids, "documents": documents, "records": records}

    # -- counters and documents -----------------------------------------
    def put_counters(self, ns: str, sid: str, counters: dict[str, Any]) -> None:
        self.txn.put(name_key(ns, sid), dump(counters), db=self._dbs.ctr)

    def get_doc(self, ns: str, doc_key: str) -> dict[str, Any] | None:
        raw = self.txn.get(name_key(ns, doc_key), db=self._dbs.doc)
        return load(raw) if raw is not None else None

    def put_doc(self, ns: str, doc_key: str, rec: dict[str, Any]) -> None:
        self.txn.put(name_key(ns, doc_key), dump(rec), db=self._dbs.doc)

    def delete_doc(self, ns: str, doc_key: str) -> bool:
        return bool(self.txn.delete(name_key(ns, doc_key), db=self._dbs.doc))

    def put_meta(self, key: str, value: Any) -> None:
        self.txn.put(key.encode(), dump(value), db=self._dbs.meta)

    # -- fleet replication state (daemon/fleet/node.py) -------------------------
    def fleet_get(self, key: bytes) -> Any:
        raw = self.txn.get(key, db=self._dbs.fleet)
        return load(raw) if raw is not None else None

    def fleet_put(self, key: bytes, value: Any) -> None:
        self.txn.put(key, dump(value), db=self._dbs.fleet)

    def fleet_delete(self, key: bytes) -> bool:
        return bool(self.txn.delete(key, db=self._dbs.fleet))

    def fleet_delete_prefix(self, prefix: bytes) -> int:
        """Delete every key of the fleet database starting with ``prefix``; how many."""
        cur = self.txn.cursor(db=self._dbs.fleet)
        n = 0
        ok = cur.set_range(prefix)
        while ok and cast(bytes, cur.key()).startswith(prefix):
            ok = cur.delete()  # moves to the next key
            n += 1
        return n
