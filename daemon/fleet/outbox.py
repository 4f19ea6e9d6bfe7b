"""The fleet's state in this node's LMDB (the store's ``fleet`` database) and the
format of its entries. No Redis here: every function is a read of the store or a step
of a write transaction (``Txn``), so a caller commits it together with its own data.

Keys (NS: the namespace, UTF-8)::

    o NUL u64 n            outbox entry n, deleted once published
    n:out                  the next outbox number
    n:pub                  the first outbox number not yet published
    inc                    this data directory's incarnation (part of every origin)
    x:overflow             namespaces whose outbox dropped entries (to re-publish)
    p NUL NS               the stream position: id of the last entry handled
    h NUL NS               the stream's drop epoch at that position (entries.epoch_error)
    s NUL NS NUL src       the highest outbox number of origin ``src`` handled
    r NUL NS NUL origin    the local sequence id of a peer's response (``src:seq``)
    w NUL NS NUL key       the outbox number of this node's latest write of a document
    e NUL NS               the namespace's drop epoch: how many drops it has seen

An entry is a msgpack map: ``op`` ("resp" | "doc" | "undoc" | "evict" | "drop"), ``ns``,
``src``, ``n`` (outbox number; 0 for a re-publication), ``t``, ``ep`` (the namespace's
drop epoch when the entry was written; absent from older nodes' entries: 0) and the op's
fields (daemon/fleet/entries.py checks them).

Interface: ``dump`` / ``load`` (entries); ``incarnation``; the outbox (``enqueue``,
``pending``, ``outbox_number``, ``mark_published``, ``backlog``, ``overflowed``,
``clear_overflow``); positions (``read_positions``, ``read_stream_epochs``,
``read_seen``, ``put_position``, ``put_seen``, ``mark_applied``); the origin index
(``origin_key``, ``replicated``) and documents (``doc_write_key``, ``doc_packed``,
``digest``, ``local_digest``); drops (``epoch``, ``txn_epoch``, ``dropped``).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from typing import Any

import msgpack

from suffixcache.store_layout import pack_tokens
from suffixcache.store_records import Txn

OUTBOX = b"o\x00"  # + u64 outbox number -> entry
_N_OUT = b"n:out"  # next outbox number
_N_PUB = b"n:pub"  # first outbox number not yet published
_INC = b"inc"  # this data directory's incarnation (part of every origin it publishes)
_OVERFLOW = b"x:overflow"  # namespaces whose outbox dropped entries
_POS = b"p\x00"
_STREAM_EPOCH = b"h\x00"
_SEEN = b"s\x00"
_ORIGIN = b"r\x00"
_DOC_WRITE = b"w\x00"
_EPOCH = b"e\x00"


def dump(obj: Any) -> bytes:
    packed: bytes = msgpack.packb(obj, use_bin_type=True)  # msgpack has no types
    return packed


def load(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def _b(ns: str) -> bytes:
    return ns.encode("utf-8")


def incarnation(store: Any) -> str:
    """This data directory's incarnation, drawn on first use."""
    inc = store.fleet_get(_INC)
    if inc is None:
        inc = secrets.token_hex(4)
        store.write(lambda t: t.fleet_put(_INC, inc))
    return str(inc)


# ------------------------------------------------------------------ the outbox
def enqueue(t: Txn, ns: str, entry: dict[str, Any], src: str, max_backlog: int) -> int:
    """Add ``entry`` to the outbox (in ``t``); returns its number. Bounded: past
    ``max_backlog`` entries the oldest is dropped and its namespace marked."""
    n = int(t.fleet_get(_N_OUT) or 1)
    first = int(t.fleet_get(_N_PUB) or 1)
    # Stamped with the epoch the data was written in: after a drop, an entry from before
    # it (published late by a lagging node) is recognised and ignored.
    entry.update(ns=ns, src=src, n=n, t=time.time(), ep=txn_epoch(t, ns))
    t.fleet_put(_N_OUT, n + 1)
    t.fleet_put(OUTBOX + n.to_bytes(8, "big"), entry)
    if n - first + 1 > max_backlog:
        # Bounded: drop the oldest; the namespace is re-published when Redis is back.
        t.fleet_delete(OUTBOX + first.to_bytes(8, "big"))
        t.fleet_put(_N_PUB, first + 1)
        dropped = t.fleet_get(_OVERFLOW) or []
        if ns not in dropped:
            t.fleet_put(_OVERFLOW, [*dropped, ns])
    return n


def pending(store: Any, limit: int) -> list[tuple[bytes, Any]]:
    """The oldest ``limit`` outbox entries, (key, entry), in order."""
    items: list[tuple[bytes, Any]] = store.fleet_items(OUTBOX, limit=limit)
    return items


def outbox_number(key: bytes) -> int:
    return int.from_bytes(key[len(OUTBOX):], "big")


def mark_published(keys: list[bytes], last: int, t: Txn) -> None:
    """The entries ``keys`` (up to number ``last``) reached Redis."""
    for k in keys:
        t.fleet_delete(k)
    if int(t.fleet_get(_N_PUB) or 1) <= last:
        t.fleet_put(_N_PUB, last + 1)


def backlog(store: Any) -> int:
    return max(0, int(store.fleet_get(_N_OUT) or 1) - int(store.fleet_get(_N_PUB) or 1))


def overflowed(store: Any) -> list[str]:
    """The namespaces whose outbox dropped entries since they were last re-published."""
    return list(store.fleet_get(_OVERFLOW) or [])


def clear_overflow(t: Txn, namespaces: set[str]) -> None:
    left = [n for n in (t.fleet_get(_OVERFLOW) or []) if n not in namespaces]
    if left:
        t.fleet_put(_OVERFLOW, left)
    else:
        t.fleet_delete(_OVERFLOW)


# ------------------------------------------------------------------ positions
def read_positions(store: Any) -> dict[str, str]:
    return {k[2:].decode(): str(v) for k, v in store.fleet_items(_POS)}


def read_stream_epochs(store: Any) -> dict[str, int]:
    return {k[2:].decode(): int(v) for k, v in store.fleet_items(_STREAM_EPOCH)}


def read_seen(store: Any) -> dict[tuple[str, str], int]:
    seen: dict[tuple[str, str], int] = {}
    for k, v in store.fleet_items(_SEEN):
        ns, _, src = k[2:].decode().partition("\x00")
        seen[(ns, src)] = int(v)
    return seen


def put_position(t: Txn, ns: str, pos: str, stream_ep: int) -> None:
    # One transaction for both: the stream's epoch is a function of the position, and a
    # node resuming from one with the other's value would judge entries unlike its peers.
    t.fleet_put(_POS + _b(ns), pos)
    t.fleet_put(_STREAM_EPOCH + _b(ns), stream_ep)


def put_seen(t: Txn, ns: str, src: str, n: int) -> None:
    t.fleet_put(_SEEN + _b(ns) + b"\x00" + src.encode(), n)


def mark_applied(t: Txn, rep: dict[str, Any]) -> None:
    """A peer's entry ``rep`` ({ns, id, sep, src, n}) is handled, in the transaction of
    its data."""
    put_position(t, rep["ns"], rep["id"], int(rep["sep"]))
    if rep.get("n"):
        put_seen(t, rep["ns"], rep["src"], rep["n"])


# ------------------------------------------------------------------ origins and documents
def origin_key(ns: str, origin: str) -> bytes:
    return _ORIGIN + _b(ns) + b"\x00" + origin.encode()


def replicated(store: Any, ns: str) -> dict[str, int]:
    """origin -> local sequence id of every peer response of ``ns`` held here."""
    return {k.split(b"\x00", 2)[2].decode(): int(v)
            for k, v in store.fleet_items(_ORIGIN + _b(ns) + b"\x00")}


def doc_write_key(ns: str, key: str) -> bytes:
    return _DOC_WRITE + _b(ns) + b"\x00" + key.encode()


def digest(packed: list[bytes]) -> str:
    h = hashlib.blake2b(digest_size=16)
    for p in packed:
        h.update(len(p).to_bytes(8, "little"))
        h.update(p)
    return h.hexdigest()


def doc_packed(store: Any, doc: dict[str, Any]) -> list[bytes]:
    """A stored document's sequences, packed (as entries carry them)."""
    out = []
    for s in doc.get("seqs", []):
        rec = store.get_sequence(int(s))
        if rec is not None:
            out.append(pack_tokens(rec["tokens"]))
    return out


def local_digest(store: Any, ns: str, key: str) -> str | None:
    doc = store.get_doc(ns, key)
    return None if doc is None else digest(doc_packed(store, doc))


# ------------------------------------------------------------------ drops
def epoch(store: Any, ns: str) -> int:
    """How many drops of ``ns`` this node has applied (its own and its peers')."""
    return int(store.fleet_get(_EPOCH + _b(ns)) or 0)


def txn_epoch(t: Txn, ns: str) -> int:
    return int(t.fleet_get(_EPOCH + _b(ns)) or 0)


def dropped(t: Txn, ns: str, ep: int) -> None:
    """``ns`` was dropped (in ``t``, the drop's transaction): its epoch is now ``ep``, and
    the fleet's index of its data (peers' origins, document writes) goes with the data."""
    t.fleet_put(_EPOCH + _b(ns), ep)
    for prefix in (_ORIGIN, _DOC_WRITE):
        t.fleet_delete_prefix(prefix + _b(ns) + b"\x00")
