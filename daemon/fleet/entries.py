"""What a peer's entry must be before this node commits anything of it.

Redis is shared: a node of another version, a bug or anyone with write access can put
anything into a namespace's stream. An entry that reached LMDB and then failed to enter
a tree was committed with the stream position, so it failed again at every restart;
one that missed a field stopped the consumer on every node. So every entry is checked
here, whole, before it is applied: the schema of its op, its namespace, its token ids
against the vocabulary, and the sizes the daemon enforces on its own inputs
(daemon/engine/validation.py). The consumer skips what fails (logged with its stream
id, counted by reason) and moves its position past it.

Drop epochs. An entry's ``ep`` is judged against the stream's epoch: the highest epoch
of the valid entries before it in the namespace's stream, which every node holds alike at
the same position (the node's own epoch may be ahead: a local drop not read back yet).
A drop moves the epoch forward by one, and an entry may prove drops its reader missed
(trimmed away, lost from a full outbox), but never more than ``MAX_EPOCH_STEP`` of them:
an entry beyond that, or at ``MAX_EPOCH`` and above, is invalid ("epoch"). Otherwise one
forged entry (epoch 2**63-1) would wipe the namespace everywhere and leave no epoch for
the next legitimate drop, and the nodes would ignore each other for good.

Interface: ``check(fields, ns, validator)`` -> the entry (a dict) or raises
``BadEntry(reason, message)``; ``tokens_error(tokens, vocab_size)``; ``REASONS``;
``epoch_error(ep, stream_ep)``, ``epoch_action(op, ep, local_ep)``, ``MAX_EPOCH_STEP``,
``MAX_EPOCH``.
"""

from __future__ import annotations

import math
import re
from typing import Any

from suffixcache.store_layout import unpack_tokens

from ..common.errors import EngineError
from ..engine.validation import Validator
from . import outbox

# The reasons an entry is refused (a label of suffixd_fleet_invalid_entries_total).
REASONS = ("unreadable", "schema", "namespace", "tokens", "size", "epoch")
OPS = ("resp", "doc", "undoc", "evict", "drop")

# A node's origin name: its --node-id (daemon/fleet/node.py, 1-64 characters) "." its
# incarnation (8 hex digits).
_SRC_RE = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
_I64 = 2**63
# LMDB refuses keys over 511 bytes, and a refused write would be retried for ever: a
# document's keys (``ns NUL key``, the fleet's ``w NUL ns NUL key``) must fit.
_MAX_KEY = 500


# How many drops one entry may prove beyond the stream's epoch: drops lost from a node's
# full outbox while Redis was away. Forging the epoch up to MAX_EPOCH then takes 2**52
# entries, so a legitimate drop always has an epoch left to publish.
MAX_EPOCH_STEP = 1024
MAX_EPOCH = 2**62


class BadEntry(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _int(e: dict[str, Any], field: str, lo: int = 0) -> int:
    v = e.get(field)
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v < _I64:
        raise BadEntry("schema", f"field {field!r} is not an integer in [{lo}, 2**63)")
    return v


def _str(e: dict[str, Any], field: str) -> str:
    v = e.get(field)
    if not isinstance(v, str):
        raise BadEntry("schema", f"field {field!r} is missing or not a string")
    return v


def _origin(v: Any) -> str:
    # "src:seq": a peer's sequence; evictions of this node's own parse the seq back.
    if not isinstance(v, str) or len(v) > 128:
        raise BadEntry("schema", "an origin is not a string of at most 128 characters")
    src, _, seq = v.rpartition(":")
    if not _SRC_RE.match(src) or not seq.isascii() or not seq.isdigit() or len(seq) > 19:
        raise BadEntry("schema", f"origin {v[:80]!r} is not <node>:<sequence id>")
    return v


def _doc_key(key: str, ns: str) -> str:
    if not key or "\x00" in key:  # as CorpusDocuments.add requires
        raise BadEntry("schema", "a document key is empty or holds NUL")
    try:
        size = len(key.encode("utf-8")) + len(ns.encode("utf-8"))
    except UnicodeEncodeError:
        raise BadEntry("schema", "a document key is not valid UTF-8") from None
    if size > _MAX_KEY:
        raise BadEntry("size", f"a document key of {size} bytes with its namespace")
    return key


def _hash(v: Any) -> str | None:
    if v is not None and (not isinstance(v, str) or len(v) > 256):
        raise BadEntry("schema", "a document hash is not a string of at most 256 characters")
    return v


def _meta(v: Any, validator: Validator) -> dict[str, Any]:
    # What a warm stores ({"kind": "sql", "size": 123}), within a session metadata's limits.
    meta = v or {}
    if not isinstance(meta, dict) or len(meta) > validator.limits.max_metadata_entries:
        raise BadEntry("schema", "a document's meta is not a small map")
    for k, x in meta.items():
        if not isinstance(k, str) or not (x is None or isinstance(x, str | int | float)):
            raise BadEntry("schema", "a document's meta holds more than names and scalars")
        if isinstance(x, int) and not -_I64 <= x < _I64:
            raise BadEntry("schema", "a document's meta holds an integer out of range")
    if len(outbox.dump(meta)) > validator.limits.max_metadata_bytes:
        raise BadEntry("size", "a document's meta is above the metadata limit")
    return meta


def tokens_error(tokens: list[int], vocab_size: int | None) -> str | None:
    """Why these token ids cannot enter a tree, or None."""
    hi = vocab_size if vocab_size else 2**31
    if tokens and (min(tokens) < 0 or max(tokens) >= hi):
        bad = next(t for t in tokens if not 0 <= t < hi)
        return f"token id {bad} out of range [0, {hi})"
    return None


def _tokens(packed: Any, validator: Validator, limit: int) -> list[int]:
    if not isinstance(packed, bytes) or len(packed) % 4:
        raise BadEntry("schema", "tokens are not packed int32")
    if len(packed) // 4 > limit:
        raise BadEntry("size", f"{len(packed) // 4} tokens; the limit is {limit}")
    toks = unpack_tokens(packed)
    err = tokens_error(toks, validator.vocab_size)
    if err:
        raise BadEntry("tokens", err)
    return toks


def max_entry_bytes(validator: Validator) -> int:
    """The largest entry a node of this configuration publishes: a response as long as a
    session may grow, or a message's worth, with room for the fields."""
    lim = validator.limits
    return max(lim.max_message_bytes, 4 * lim.max_session_tokens) + (1 << 16)


def check(fields: Any, ns: str, validator: Validator) -> dict[str, Any]:
    """The entry of a stream entry's ``fields`` (stream of namespace ``ns``), checked
    whole; raises BadEntry."""
    try:
        validator.check_name("namespace", ns)
    except EngineError as exc:
        raise BadEntry("namespace", str(exc)) from None
    raw = fields.get(b"d") if isinstance(fields, dict) else None
    if not isinstance(raw, bytes):
        raise BadEntry("unreadable", "no 'd' field")
    if len(raw) > max_entry_bytes(validator):
        raise BadEntry("size", f"entry of {len(raw)} bytes")
    try:
        e = outbox.load(raw)
    except Exception as exc:
        raise BadEntry("unreadable", f"not msgpack: {type(exc).__name__}") from None
    if not isinstance(e, dict):
        raise BadEntry("unreadable", "not a msgpack map")
    op = e.get("op")
    if op not in OPS:
        raise BadEntry("schema", f"unknown op {str(op)[:40]!r}")
    if "ns" in e and e["ns"] != ns:
        raise BadEntry("namespace", "the entry names another namespace than its stream")
    if not _SRC_RE.match(_str(e, "src")):
        raise BadEntry("schema", "field 'src' is not a node name")
    _int(e, "n")
    _int(e, "ep")
    t = e.get("t")
    if t is not None and (isinstance(t, bool) or not isinstance(t, int | float)
                          or not math.isfinite(t)):
        raise BadEntry("schema", "field 't' is not a finite number")
    lim = validator.limits
    if op == "resp":
        _origin(e.get("o"))
        e["toks"] = _tokens(e.get("tok"), validator, lim.max_session_tokens)
        if not e["toks"]:
            raise BadEntry("schema", "an empty response")
    elif op in ("doc", "undoc"):
        _doc_key(_str(e, "key"), ns)
        if op == "doc":
            seqs = e.get("seqs")
            if not isinstance(seqs, list):
                raise BadEntry("schema", "field 'seqs' is not a list")
            e["toks"] = [_tokens(s, validator, lim.max_tokens_per_call) for s in seqs]
            if sum(map(len, e["toks"])) > lim.max_tokens_per_call:
                raise BadEntry("size", "a document above the tokens-per-call limit")
            _hash(e.get("hash"))
            _meta(e.get("meta"), validator)
    elif op == "evict":
        o = e.get("o")
        if not isinstance(o, list):
            raise BadEntry("schema", "field 'o' is not a list")
        for origin in o:
            _origin(origin)
    elif op == "drop" and _int(e, "ep", 1) < 1:
        raise BadEntry("schema", "a drop without its epoch")
    return e


def epoch_error(ep: int, stream_ep: int) -> str | None:
    """Why an entry of epoch ``ep`` read where the stream's epoch is ``stream_ep`` is
    invalid, or None. Lower epochs are valid: entries written before a drop, skipped."""
    if ep >= MAX_EPOCH:
        return f"drop epoch {ep} is out of range [0, 2**62)"
    if ep > stream_ep + MAX_EPOCH_STEP:
        return (f"drop epoch {ep} is more than {MAX_EPOCH_STEP} drops past the stream's "
                f"epoch {stream_ep}")
    return None


def epoch_action(op: str, ep: int, local_ep: int) -> tuple[bool, bool]:
    """What a node whose epoch is ``local_ep`` does with a valid entry of epoch ``ep``:
    (drop the namespace to ``ep`` first, then apply the entry)."""
    if ep < local_ep or (op == "drop" and ep == local_ep):
        # Written before a drop this node applied, or a drop it applied already.
        return False, False
    # A higher epoch proves a drop: this entry's, or one this node never read.
    return ep > local_ep, op != "drop"


def check_snapshot_item(item: Any, ns: str, validator: Validator) -> list[Any]:
    """One item of a snapshot (daemon/fleet/snapshot.py): ["r", origin, tokens] or
    ["d", key, [tokens...], hash, meta], with the tokens unpacked in place."""
    lim = validator.limits
    if not isinstance(item, list) or not item:
        raise BadEntry("schema", "a snapshot item is not a list")
    if item[0] == "r" and len(item) == 3:
        return ["r", _origin(item[1]), _tokens(item[2], validator, lim.max_session_tokens)]
    if item[0] == "d" and len(item) == 5 and isinstance(item[1], str) \
            and isinstance(item[2], list):
        seqs = [_tokens(s, validator, lim.max_tokens_per_call) for s in item[2]]
        if sum(map(len, seqs)) > lim.max_tokens_per_call:
            raise BadEntry("size", "a document above the tokens-per-call limit")
        return ["d", _doc_key(item[1], ns), seqs, _hash(item[3]), _meta(item[4], validator)]
    raise BadEntry("schema", "a snapshot item of no known kind")
