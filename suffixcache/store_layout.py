"""How the store lays its data out in LMDB, and how values and keys are encoded.

One LMDB environment, several named databases; values are msgpack, token arrays are
packed little-endian int32:

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
``fleet``  bytes key -> msgpack value: the fleet's replication state (daemon/fleet/node.py owns
           its keys: the outbox of entries to publish, stream positions, origin index)

Interface: ``SCHEMA_VERSION``; ``pack_tokens`` / ``unpack_tokens``; ``dump`` / ``load``
(msgpack); the key builders ``name_key`` (NUL-joined names), ``seq_key``, ``chunk_key``,
``session_response_key``; ``decode_seq`` (a ``seq`` record as callers see it); and
``Databases``, the named database handles of one environment.
"""

from __future__ import annotations

import array
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import lmdb
import msgpack

SCHEMA_VERSION = 1
U64 = 8


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


def dump(obj: Any) -> bytes:
    packed: bytes = msgpack.packb(obj, use_bin_type=True)
    return packed


def load(data: bytes | memoryview) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def name_key(*parts: str) -> bytes:
    """``ns NUL name``: the key of a session, its counters or a document."""
    return b"\x00".join(p.encode("utf-8") for p in parts)


def seq_key(seq_id: int) -> bytes:
    return seq_id.to_bytes(U64, "big")


def chunk_key(ns: str, sid: str, no: int) -> bytes:
    return name_key(ns, sid) + b"\x00" + no.to_bytes(4, "big")


def session_response_key(ns: str, sid: str, seq_id: int) -> bytes:
    return name_key(ns, sid) + b"\x00" + seq_key(seq_id)


def decode_seq(seq_id: int, raw: bytes | memoryview) -> dict[str, Any]:
    rec: dict[str, Any] = load(raw)
    rec["id"] = seq_id
    rec["tokens"] = unpack_tokens(rec.pop("tok"))
    return rec


@dataclass(frozen=True)
class Databases:
    """The named databases of one environment (handles are valid for its lifetime)."""

    meta: Any
    seq: Any
    sess: Any
    chunk: Any
    ctr: Any
    doc: Any
    sresp: Any
    fleet: Any

    @classmethod
    def open(cls, env: lmdb.Environment) -> Databases:
        return cls(
            meta=env.open_db(b"meta"),
            seq=env.open_db(b"seq"),
            sess=env.open_db(b"sess"),
            chunk=env.open_db(b"chunk"),
            ctr=env.open_db(b"ctr"),
            doc=env.open_db(b"doc"),
            sresp=env.open_db(b"sresp"),
            fleet=env.open_db(b"fleet"),
        )
