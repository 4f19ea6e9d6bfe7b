"""A fleet of suffixd nodes whose global and corpus trees follow one log in Redis Streams.

``suffixd serve --fleet redis://host:6379/0 --node-id a`` on every node. Redis is the only
shared part; this module speaks to it with the ``redis`` client (no protocol of our own).

Publishing (transactional outbox). Every ingest that reaches a namespace's global or
corpus tree calls ``Engine.ingest_hook`` inside its LMDB transaction: a finished response
("resp"), a corpus document added or replaced ("doc") or removed ("undoc"), sequences
evicted by the budget or dropped with a closed session ("evict"). The hook writes the
entry into the ``fleet`` database's outbox in that same transaction, so an entry exists
exactly when its data committed. A publisher thread XADDs the outbox, in order, to the
namespace's stream and then deletes what it published. While Redis is away the outbox
grows up to ``max_backlog`` entries (durable across restarts); past that the oldest are
dropped and the namespace is marked, and once Redis is back the node re-publishes its
own responses and its documents of that namespace (evictions in the dropped part are
lost: the peers evict by their own budgets).

Consuming. A consumer thread XREADs every namespace's stream after its position and
applies the other nodes' entries to its own trees and LMDB. The position (the stream id
of the last entry handled) is written in the same transaction as the entry's data, so a
node killed at any point resumes exactly after what it applied: nothing lost or doubled.
A second guard makes re-published entries harmless: each entry carries its origin's
(``src``) outbox number, and a node skips numbers it already handled; responses are
keyed by origin (``src:seq``), documents compared by content digest.

Documents converge to the last entry of the stream: a node also re-applies its own doc
entry when a peer's entry for that document was applied after its local write (it skips
its own entries older than its latest write of that document).

Trimming and snapshots. A stream longer than ``max_entries`` is trimmed by one node (a
Redis lock) that is caught up: it first stores a snapshot of the namespace as it holds
it at its position P (every response with its origin, every document) under the
namespace's snapshot key, then records ``trimmed = P`` and trims the stream to the
entries from P on (XTRIM MINID), atomically. A node whose position is below ``trimmed``
(joined late, or away too long) loads that snapshot (adds the responses it lacks, drops
replicated ones absent from it, applies documents whose content differs), sets its
position to P and reads on from there. (A document removed in the fleet while such a
node was away stays on it until removed again: the snapshot lists what exists, and the
node cannot tell a peer's removal from a document of its own not yet published.)

Identity and isolation. Keys are ``<prefix>:<tokenizer tag>:...``, one stream per
namespace. ``<prefix>:fleet`` records the fleet's tokenizer fingerprint: a node with
another tokenizer refuses to join. Credentials and TLS come from the URL (``rediss://``,
``redis://:password@host``) or ``$SUFFIXD_REDIS_PASSWORD``; the URL is logged redacted.

Status. Nodes heartbeat their lag, backlog and counts into ``<prefix>:<tag>:nodes``;
``status()`` (the Stats RPC, ``suffixd stats [--fleet]``) and the Prometheus collector
report them.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import re
import secrets
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import msgpack

from suffixcache.store_layout import pack_tokens, unpack_tokens
from suffixcache.store_records import Txn

from .errors import EngineError

log = logging.getLogger("suffixd.fleet")

_NODE_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
# fleet database keys (suffixcache.store, db "fleet")
_OUT = b"o\x00"  # + u64 outbox number -> entry
_N_OUT = b"n:out"  # next outbox number
_N_PUB = b"n:pub"  # first outbox number not yet published
_INC = b"inc"  # this data directory's incarnation (part of every origin it publishes)
_OVERFLOW = b"x:overflow"  # namespaces whose outbox dropped entries


class FleetError(Exception):
    """A fleet start-up problem (bad option, another tokenizer)."""


@dataclass
class FleetConfig:
    url: str
    node_id: str
    prefix: str = "suffixd"
    max_backlog: int = 100_000  # outbox entries kept while Redis is unreachable
    max_entries: int = 100_000  # stream length per namespace before snapshot + trim
    heartbeat_s: float = 1.0
    read_count: int = 512


def redact(url: str) -> str:
    """The URL without its credentials (for logs and status)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<invalid url>"
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, f"***@{host}", parts.path, "", ""))


def _sid(s: bytes | str) -> tuple[int, int]:
    text = s.decode() if isinstance(s, bytes) else s
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def _digest(packed: list[bytes]) -> str:
    h = hashlib.blake2b(digest_size=16)
    for p in packed:
        h.update(len(p).to_bytes(8, "little"))
        h.update(p)
    return h.hexdigest()


def _dump(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _load(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def _b(ns: str) -> bytes:
    return ns.encode("utf-8")


def _published(keys: list[bytes], last: int, t: Txn) -> None:
    for k in keys:
        t.fleet_delete(k)
    if int(t.fleet_get(_N_PUB) or 1) <= last:
        t.fleet_put(_N_PUB, last + 1)


class Fleet:
    """One node's replication: see the module docstring."""

    def __init__(self, engine: Any, cfg: FleetConfig, client: Any = None) -> None:
        import redis

        if not _NODE_RE.match(cfg.node_id or ""):
            raise FleetError("--node-id must be 1-64 characters of A-Z a-z 0-9 _ . -")
        self.engine = engine
        self.store = engine.store
        self.cfg = cfg
        self.node = cfg.node_id
        self.url_shown = redact(cfg.url)
        self._redis_mod = redis
        if client is None:
            kwargs: dict[str, Any] = {"socket_timeout": 5.0, "socket_connect_timeout": 2.0}
            try:
                has_password = urlsplit(cfg.url).password is not None
            except ValueError:
                has_password = False
            if not has_password and os.environ.get("SUFFIXD_REDIS_PASSWORD"):
                kwargs["password"] = os.environ["SUFFIXD_REDIS_PASSWORD"]
            try:
                client = redis.Redis.from_url(cfg.url, **kwargs)
            except ValueError as exc:
                # The message may quote the URL: name only the redacted one.
                raise FleetError(f"invalid --fleet URL {self.url_shown}: "
                                 f"{str(exc).replace(cfg.url, self.url_shown)}") from None
        self.r = client
        if engine.fingerprint:
            self.tokenizer = str(engine.fingerprint)
        elif engine.vocab_size:
            self.tokenizer = f"token-ids:vocab={engine.vocab_size}"
        else:
            self.tokenizer = "token-ids"
        tag = hashlib.sha256(self.tokenizer.encode()).hexdigest()[:12]
        self._base = f"{cfg.prefix}:{tag}"
        inc = self.store.fleet_get(_INC)
        if inc is None:
            inc = secrets.token_hex(4)
            self.store.write(lambda t: t.fleet_put(_INC, inc))
        # Origins name the data directory too: a node whose data was wiped starts a new
        # numbering, and its old entries are then the peers' data to catch up from.
        self.src = f"{self.node}.{inc}"
        self.pos: dict[str, str] = {}
        self.seen: dict[tuple[str, str], int] = {}
        self._dirty_pos: set[str] = set()
        for k, v in self.store.fleet_items(b"p\x00"):
            self.pos[k[2:].decode()] = str(v)
        for k, v in self.store.fleet_items(b"s\x00"):
            ns, _, src = k[2:].decode().partition("\x00")
            self.seen[(ns, src)] = int(v)
        self.namespaces: set[str] = set()
        self.joined = False
        self.refused: str | None = None
        self.redis_up = False
        self.last_error = ""
        self.published = 0
        self.applied = 0
        self.skipped = 0
        self.snapshots_loaded = 0
        self.snapshots_written = 0
        self.backlog = self._backlog()
        self.lag: dict[str, dict[str, Any]] = {}
        self.nodes: dict[str, Any] = {}
        self._apply_lat: deque[float] = deque(maxlen=4096)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []
        engine.ingest_hook = self._hook
        engine.fleet = self

    # ------------------------------------------------------------------ keys
    def _stream(self, ns: str) -> str:
        return f"{self._base}:log:{ns}"

    def _ns_of(self, key: bytes | str) -> str:
        k = key.decode() if isinstance(key, bytes) else key
        return k[len(self._base) + 5:]

    @property
    def _ns_key(self) -> str:
        return f"{self._base}:namespaces"

    @property
    def _nodes_key(self) -> str:
        return f"{self._base}:nodes"

    def _snap_key(self, ns: str) -> str:
        return f"{self._base}:snap:{ns}"

    def _snapmeta_key(self, ns: str) -> str:
        return f"{self._base}:snapmeta:{ns}"

    @staticmethod
    def _rkey(ns: str, origin: str) -> bytes:
        return b"r\x00" + _b(ns) + b"\x00" + origin.encode()

    @staticmethod
    def _wkey(ns: str, key: str) -> bytes:
        return b"w\x00" + _b(ns) + b"\x00" + key.encode()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Join (refusing another tokenizer if Redis answers now) and start the threads.
        An unreachable Redis is not an error: the node serves and retries."""
        try:
            self._join()
        except self._redis_mod.RedisError as exc:
            self._down(exc)
            log.warning("fleet: Redis unreachable; serving from the local trees and "
                        "buffering until it answers",
                        extra={"url": self.url_shown, "error": self.last_error})
        for fn, name in ((self._publish_loop, "suffixd-fleet-publish"),
                         (self._consume_loop, "suffixd-fleet-consume")):
            t = threading.Thread(target=fn, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        self.engine.close_hooks.append(self.close)

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        for t in self._threads:
            t.join(timeout=10)
        self._threads.clear()
        with contextlib.suppress(Exception):
            self.r.close()

    def _join(self) -> None:
        key = f"{self.cfg.prefix}:fleet"
        self.r.hsetnx(key, "tokenizer", self.tokenizer)
        theirs = self.r.hget(key, "tokenizer")
        theirs_s = theirs.decode() if theirs is not None else self.tokenizer
        if theirs_s != self.tokenizer:
            self.refused = (
                f"the fleet at {self.url_shown} (key prefix {self.cfg.prefix!r}) uses "
                f"tokenizer {theirs_s}, but this node's model has {self.tokenizer}: a node "
                "joins only a fleet of its own tokenizer (use the same model, or another "
                "Redis database or --fleet-prefix)"
            )
            self._stop.set()
            raise FleetError(self.refused)
        if not self.joined:
            log.info("fleet: joined", extra={"url": self.url_shown, "node": self.src,
                                             "tokenizer": self.tokenizer})
        self.joined = True
        self._up()

    def _up(self) -> None:
        if not self.redis_up:
            self.redis_up = True
            self.last_error = ""

    def _down(self, exc: BaseException) -> None:
        msg = f"{type(exc).__name__}: {exc}".replace(self.cfg.url, self.url_shown)
        if self.redis_up or not self.last_error:
            log.warning("fleet: Redis unreachable", extra={"url": self.url_shown,
                                                           "error": msg})
        self.redis_up = False
        self.last_error = msg

    # ------------------------------------------------------------------ publishing
    def _hook(self, t: Txn, op: str, ns: str, replica: Any = None, **f: Any) -> None:
        """Engine.ingest_hook: runs inside the ingest's LMDB transaction."""
        if replica is not None:
            # A peer's entry being applied: record the position, publish nothing.
            if replica:
                self._mark_applied(t, replica)
            return
        if op == "evict":
            by_ns: dict[str, list[str]] = {}
            for seq in f["seqs"]:
                rec = t.get_sequence(seq)
                if rec is None or rec["kind"] != "response":
                    continue
                origin = (rec.get("meta") or {}).get("origin")
                if origin:
                    t.fleet_delete(self._rkey(rec["ns"], origin))
                else:
                    origin = f"{self.src}:{seq}"
                by_ns.setdefault(rec["ns"], []).append(origin)
            for name, origins in by_ns.items():
                self._enqueue(t, name, {"op": "evict", "o": origins})
            return
        if op == "resp":
            self._enqueue(t, ns, {"op": "resp", "o": f"{self.src}:{f['seq']}",
                                  "tok": pack_tokens(f["tokens"])})
        elif op == "doc":
            n = self._enqueue(t, ns, {
                "op": "doc", "key": f["key"],
                "seqs": [pack_tokens(s) for s in f["seqs"] if s],
                "hash": f.get("hash"), "meta": f.get("meta") or {},
            })
            t.fleet_put(self._wkey(ns, f["key"]), n)
        elif op == "undoc":
            n = self._enqueue(t, ns, {"op": "undoc", "key": f["key"]})
            t.fleet_put(self._wkey(ns, f["key"]), n)

    def _enqueue(self, t: Txn, ns: str, entry: dict[str, Any]) -> int:
        n = int(t.fleet_get(_N_OUT) or 1)
        first = int(t.fleet_get(_N_PUB) or 1)
        entry.update(ns=ns, src=self.src, n=n, t=time.time())
        t.fleet_put(_N_OUT, n + 1)
        t.fleet_put(_OUT + n.to_bytes(8, "big"), entry)
        if n - first + 1 > self.cfg.max_backlog:
            # Bounded: drop the oldest; the namespace is re-published when Redis is back.
            t.fleet_delete(_OUT + first.to_bytes(8, "big"))
            t.fleet_put(_N_PUB, first + 1)
            dropped = t.fleet_get(_OVERFLOW) or []
            if ns not in dropped:
                t.fleet_put(_OVERFLOW, [*dropped, ns])
        self._wake.set()
        return n

    def _backlog(self) -> int:
        return max(0, int(self.store.fleet_get(_N_OUT) or 1) - int(self.store.fleet_get(_N_PUB)
                                                                    or 1))

    def _publish_loop(self) -> None:
        backoff = 0.05
        while not self._stop.is_set():
            try:
                if not self.joined:
                    self._join()
                items = self.store.fleet_items(_OUT, limit=self.cfg.read_count)
                if not items:
                    self.backlog = self._backlog()
                    overflow = self.store.fleet_get(_OVERFLOW)
                    if overflow:
                        self._republish(list(overflow))
                        continue
                    self._wake.wait(0.01)
                    self._wake.clear()
                    continue
                pipe = self.r.pipeline(transaction=False)
                for _k, e in items:
                    pipe.xadd(self._stream(e["ns"]), {"d": _dump(e)})
                pipe.sadd(self._ns_key, *{e["ns"] for _k, e in items})
                pipe.execute()
                self._up()
                last = int.from_bytes(items[-1][0][len(_OUT):], "big")
                self.store.write(functools.partial(_published, [k for k, _ in items], last))
                self.published += len(items)
                self.backlog = self._backlog()
                backoff = 0.05
            except FleetError as exc:
                log.error("fleet: %s", exc)
                return
            except self._redis_mod.RedisError as exc:
                self._down(exc)
                self.backlog = self._backlog()
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 2.0)
            except Exception:
                if self._stop.is_set():
                    return
                log.exception("fleet: publishing failed")
                self._stop.wait(1.0)

    def _republish(self, namespaces: list[str]) -> None:
        """After the outbox overflowed: publish this node's own responses and its
        documents of those namespaces again (outbox number 0: the peers dedupe them by
        origin and by content)."""
        want = set(namespaces)
        pipe = self.r.pipeline(transaction=False)
        count = 0

        def entry(ns: str, body: dict[str, Any]) -> None:
            nonlocal pipe, count
            body.update(ns=ns, src=self.src, n=0, t=time.time())
            pipe.xadd(self._stream(ns), {"d": _dump(body)})
            count += 1
            if count % 512 == 0:
                pipe.execute()
                pipe = self.r.pipeline(transaction=False)

        for rec in self.store.iter_sequences():
            if rec["ns"] in want and rec["kind"] == "response" \
                    and not (rec.get("meta") or {}).get("origin"):
                entry(rec["ns"], {"op": "resp", "o": f"{self.src}:{rec['id']}",
                                  "tok": pack_tokens(rec["tokens"])})
        for ns in want:
            for _ns, key, doc in self.store.iter_docs(ns):
                entry(ns, {"op": "doc", "key": key, "seqs": self._doc_packed(doc),
                           "hash": doc.get("hash"), "meta": doc.get("meta") or {}})
        pipe.sadd(self._ns_key, *want)
        pipe.execute()

        def clear(t: Txn) -> None:
            left = [n for n in (t.fleet_get(_OVERFLOW) or []) if n not in want]
            if left:
                t.fleet_put(_OVERFLOW, left)
            else:
                t.fleet_delete(_OVERFLOW)

        self.store.write(clear)
        self.published += count
        log.info("fleet: re-published after an outbox overflow",
                 extra={"namespaces": sorted(want), "entries": count})

    def _doc_packed(self, doc: dict[str, Any]) -> list[bytes]:
        out = []
        for s in doc.get("seqs", []):
            rec = self.store.get_sequence(int(s))
            if rec is not None:
                out.append(pack_tokens(rec["tokens"]))
        return out

    # ------------------------------------------------------------------ consuming
    def _mark_applied(self, t: Txn, rep: dict[str, Any]) -> None:
        t.fleet_put(b"p\x00" + _b(rep["ns"]), rep["id"])
        if rep.get("n"):
            t.fleet_put(b"s\x00" + _b(rep["ns"]) + b"\x00" + rep["src"].encode(), rep["n"])

    def _handled(self, rep: dict[str, Any]) -> None:
        ns = rep["ns"]
        self.pos[ns] = rep["id"]
        if rep.get("n"):
            key = (ns, rep["src"])
            self.seen[key] = max(self.seen.get(key, 0), int(rep["n"]))

    def _skip(self, rep: dict[str, Any]) -> None:
        # Nothing to apply: the position is written with the next write (or batch end).
        self._handled(rep)
        self._dirty_pos.add(rep["ns"])
        self.skipped += 1

    def _flush_positions(self) -> None:
        if not self._dirty_pos:
            return
        names = list(self._dirty_pos)
        self._dirty_pos.clear()
        pos = {ns: self.pos[ns] for ns in names}
        seen = {k: v for k, v in self.seen.items() if k[0] in pos}

        def write(t: Txn) -> None:
            for ns, p in pos.items():
                t.fleet_put(b"p\x00" + _b(ns), p)
            for (ns, src), n in seen.items():
                t.fleet_put(b"s\x00" + _b(ns) + b"\x00" + src.encode(), n)

        self.store.write(write)

    def _consume_loop(self) -> None:
        backoff = 0.05
        last_hk = last_ns = 0.0
        while not self._stop.is_set():
            try:
                if not self.joined:
                    self._join()
                now = time.monotonic()
                if now - last_hk >= self.cfg.heartbeat_s:
                    last_hk = now
                    self._housekeeping()
                elif now - last_ns >= 0.1:
                    # A new namespace's first entries should not wait for a heartbeat.
                    last_ns = now
                    self._discover()
                if not self.namespaces:
                    self._stop.wait(0.1)
                    continue
                streams = {self._stream(ns): self.pos.get(ns, "0-0") for ns in self.namespaces}
                res = self.r.xread(streams, count=self.cfg.read_count, block=100)
                self._up()
                if res:
                    self._consume(res)
                backoff = 0.05
            except FleetError as exc:
                log.error("fleet: %s", exc)
                return
            except self._redis_mod.RedisError as exc:
                self._down(exc)
                self._reload_state()
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 2.0)
            except Exception:
                if self._stop.is_set():
                    return
                log.exception("fleet: applying entries failed; retrying")
                self._reload_state()
                self._stop.wait(1.0)

    def _consume(self, res: list[Any]) -> None:
        names = [self._ns_of(key) for key, _ in res]
        # Trims only move forward: a trim point read after the entries that is not past
        # our position proves nothing between it and them was trimmed.
        pipe = self.r.pipeline(transaction=False)
        for ns in names:
            pipe.hget(self._snapmeta_key(ns), "trimmed")
        trims = pipe.execute()
        for ns, (_key, entries), trim in zip(names, res, trims, strict=True):
            if trim is not None and _sid(trim) > _sid(self.pos.get(ns, "0-0")):
                self._load_snapshot(ns)
                continue
            # Consecutive peers' responses are applied in one transaction (catch-up speed).
            run: list[tuple[dict[str, Any], dict[str, Any]]] = []
            for sid, fields in entries:
                if self._stop.is_set():
                    break
                parsed = self._parse(ns, sid.decode(), fields)
                if parsed is None:
                    continue
                e, rep = parsed
                if e["op"] == "resp" and rep["src"] != self.src:
                    run.append((e, rep))
                    continue
                self._apply_responses(ns, run)
                run = []
                self._apply(ns, e, rep)
            self._apply_responses(ns, run)
        self._flush_positions()

    def _parse(self, ns: str, sid: str,
               fields: dict[bytes, bytes]) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The entry and its replica record, or None when it is skipped (a duplicate,
        unreadable). Counts it as seen (in memory: a failed apply reloads the state)."""
        try:
            e = _load(fields[b"d"])
            src, n = str(e["src"]), int(e.get("n") or 0)
            str(e["op"])
        except Exception:
            log.warning("fleet: skipped an unreadable entry", extra={"namespace": ns,
                                                                     "id": sid})
            self._skip({"ns": ns, "id": sid})
            return None
        rep = {"ns": ns, "id": sid, "src": src, "n": n}
        if n and n <= self.seen.get((ns, src), 0):
            self._skip(rep)
            return None
        if n:
            self.seen[(ns, src)] = n
        return e, rep

    def _reload_state(self) -> None:
        """After a failed apply: the positions and outbox numbers as stored (in memory
        they may be ahead of what committed)."""
        try:
            self._read_state()
        except Exception:  # the store is closing: nothing will be applied any more
            self._stop.set()

    def _read_state(self) -> None:
        self.pos = {k[2:].decode(): str(v) for k, v in self.store.fleet_items(b"p\x00")}
        seen: dict[tuple[str, str], int] = {}
        for k, v in self.store.fleet_items(b"s\x00"):
            ns, _, src = k[2:].decode().partition("\x00")
            seen[(ns, src)] = int(v)
        self.seen = seen
        self._dirty_pos.clear()

    def _apply(self, ns: str, e: dict[str, Any], rep: dict[str, Any]) -> None:
        own = rep["src"] == self.src
        op = str(e["op"])
        try:
            if op == "evict":
                done = not own and self._apply_evict(ns, e, rep)
            elif op in ("doc", "undoc"):
                done = self._apply_doc(ns, e, rep, own)
            else:
                done = False
        except EngineError as exc:
            # Refused by the engine (a limit of this node): skip it rather than stall.
            log.warning("fleet: entry refused", extra={"namespace": ns, "id": rep["id"],
                                                       "error": str(exc)})
            done = False
        if done:
            self._handled(rep)
            self.applied += 1
            self._apply_lat.append(max(0.0, time.time() - float(e.get("t", time.time()))))
        else:
            self._skip(rep)

    def _apply_responses(self, ns: str,
                         run: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
        """Peers' responses, in one transaction with the position after the last."""
        if not run:
            return
        last = run[-1][1]
        top: dict[str, int] = {}
        for _e, rep in run:
            if rep["n"]:
                top[rep["src"]] = max(top.get(rep["src"], 0), int(rep["n"]))

        def write(t: Txn) -> list[tuple[int, list[int]] | None]:
            out: list[tuple[int, list[int]] | None] = []
            fresh: set[str] = set()
            for e, _rep in run:
                origin = str(e["o"])
                rkey = self._rkey(ns, origin)
                if origin.startswith(self.src + ":") or origin in fresh \
                        or t.fleet_get(rkey) is not None:
                    out.append(None)  # ours, or already here (a re-published copy)
                    continue
                fresh.add(origin)
                toks = unpack_tokens(e["tok"])
                seq = t.add_sequence(ns, "response", toks, meta={"origin": origin})
                t.fleet_put(rkey, seq)
                out.append((seq, toks))
            t.fleet_put(b"p\x00" + _b(ns), last["id"])
            for src, n in top.items():
                t.fleet_put(b"s\x00" + _b(ns) + b"\x00" + src.encode(), n)
            return out

        added = self.store.write(write)
        now = time.time()
        for (e, rep), got in zip(run, added, strict=True):
            self._handled(rep)
            if got is None:
                self.skipped += 1
                continue
            self._add_to_tree(ns, *got)
            self.applied += 1
            self._apply_lat.append(max(0.0, now - float(e.get("t", now))))

    def _add_to_tree(self, ns: str, seq: int, toks: list[int]) -> None:
        evicted = self.engine.cache.add_response(ns, seq, toks)
        if evicted:
            self.engine._delete_sequences(list(evicted))

    def _apply_evict(self, ns: str, e: dict[str, Any], rep: dict[str, Any] | None) -> bool:
        gone: list[int] = []
        origins = [str(o) for o in e["o"]]

        def write(t: Txn) -> None:
            gone.clear()
            for origin in origins:
                if origin.startswith(self.src + ":"):
                    seq = int(origin.rsplit(":", 1)[1])
                else:
                    got = t.fleet_get(self._rkey(ns, origin))
                    if got is None:
                        continue
                    seq = int(got)
                    t.fleet_delete(self._rkey(ns, origin))
                if t.delete_sequence(seq):
                    gone.append(seq)
            if rep:
                self._mark_applied(t, rep)

        self.store.write(write)
        self.engine.remove_from_trees(ns, "response", gone)
        return bool(gone)

    def _local_digest(self, ns: str, key: str) -> str | None:
        doc = self.store.get_doc(ns, key)
        return None if doc is None else _digest(self._doc_packed(doc))

    def _apply_doc(self, ns: str, e: dict[str, Any], rep: dict[str, Any], own: bool) -> bool:
        key = str(e["key"])
        if own:
            latest = self.store.fleet_get(self._wkey(ns, key))
            if not rep["n"] or (latest is not None and rep["n"] < int(latest)):
                return False  # a later local write of this document is coming
        want = _digest(list(e["seqs"])) if e["op"] == "doc" else None
        if want == self._local_digest(ns, key):
            return False
        if e["op"] == "doc":
            self.engine.add_corpus_document(
                ns, key, [unpack_tokens(s) for s in e["seqs"]], content_hash=e.get("hash"),
                meta=e.get("meta") or {}, replica=rep)
            return True
        return bool(self.engine.remove_corpus_document(ns, key, replica=rep))

    # ------------------------------------------------------------------ snapshots
    def _load_snapshot(self, ns: str) -> None:
        pipe = self.r.pipeline(transaction=True)
        pipe.hgetall(self._snapmeta_key(ns))
        pipe.lrange(self._snap_key(ns), 0, -1)
        meta, chunks = pipe.execute()
        if not meta or b"pos" not in meta:
            raise self._redis_mod.RedisError(f"the stream of namespace {ns!r} was trimmed "
                                             "but its snapshot is missing")
        pos = meta[b"pos"].decode()
        have = {k.split(b"\x00", 2)[2].decode(): int(v)
                for k, v in self.store.fleet_items(b"r\x00" + _b(ns) + b"\x00")}
        in_snap: set[str] = set()
        adds: list[tuple[str, list[int]]] = []
        docs: list[tuple[str, list[bytes], Any, Any]] = []
        for chunk in chunks:
            for item in _load(chunk):
                if item[0] == "r":
                    origin = str(item[1])
                    if origin.startswith(self.src + ":"):
                        continue
                    in_snap.add(origin)
                    if origin not in have:
                        adds.append((origin, unpack_tokens(item[2])))
                elif item[0] == "d":
                    docs.append((str(item[1]), list(item[2]), item[3], item[4]))
        for i in range(0, len(adds), 256):
            batch = adds[i:i + 256]

            def write(t: Txn, batch: list[tuple[str, list[int]]] = batch) -> list[int]:
                out = []
                for origin, toks in batch:
                    seq = t.add_sequence(ns, "response", toks, meta={"origin": origin})
                    t.fleet_put(self._rkey(ns, origin), seq)
                    out.append(seq)
                return out

            for seq, (_o, toks) in zip(self.store.write(write), batch, strict=True):
                self._add_to_tree(ns, seq, toks)
        stale = [o for o in have if o not in in_snap]
        if stale:
            self._apply_evict(ns, {"o": stale}, None)
        for key, packed, chash, meta_d in docs:
            if _digest(packed) != self._local_digest(ns, key):
                self.engine.add_corpus_document(ns, key, [unpack_tokens(s) for s in packed],
                                                content_hash=chash, meta=meta_d or {},
                                                replica={})
        self.store.write(lambda t: t.fleet_put(b"p\x00" + _b(ns), pos))
        self.pos[ns] = pos
        self.snapshots_loaded += 1
        log.info("fleet: caught up from a snapshot",
                 extra={"namespace": ns, "pos": pos, "responses": len(adds),
                        "documents": len(docs), "dropped": len(stale)})

    def _snapshot_items(self, ns: str) -> Iterator[list[Any]]:
        for rec in self.store.iter_sequences():
            if rec["ns"] == ns and rec["kind"] == "response":
                origin = (rec.get("meta") or {}).get("origin") or f"{self.src}:{rec['id']}"
                yield ["r", origin, pack_tokens(rec["tokens"])]
        for _ns, key, doc in self.store.iter_docs(ns):
            yield ["d", key, self._doc_packed(doc), doc.get("hash"), doc.get("meta") or {}]

    def _write_snapshot(self, ns: str) -> None:
        """Snapshot the namespace at our position and trim the stream to it (the consumer
        thread calls this, so nothing is applied meanwhile)."""
        lock = f"{self._base}:lock:{ns}"
        if not self.r.set(lock, self.src, nx=True, ex=120):
            return
        try:
            pos = self.pos.get(ns)
            if pos is None:
                return
            tmp = f"{self._snap_key(ns)}:tmp:{self.src}"
            self.r.delete(tmp)
            chunk: list[Any] = []
            size = n = 0
            pipe = self.r.pipeline(transaction=False)
            for item in self._snapshot_items(ns):
                chunk.append(item)
                size += sum(len(x) for x in item if isinstance(x, bytes)) + 64
                n += 1
                if size > 1 << 20:
                    pipe.rpush(tmp, _dump(chunk))
                    pipe.execute()
                    chunk, size = [], 0
            if chunk:
                pipe.rpush(tmp, _dump(chunk))
            pipe.execute()
            tx = self.r.pipeline(transaction=True)
            if n:
                tx.rename(tmp, self._snap_key(ns))
            else:
                tx.delete(self._snap_key(ns))
            tx.hset(self._snapmeta_key(ns), mapping={
                "pos": pos, "trimmed": pos, "node": self.src, "t": time.time(), "items": n})
            tx.xtrim(self._stream(ns), minid=pos, approximate=False)
            tx.execute()
            self.snapshots_written += 1
            log.info("fleet: snapshot written, stream trimmed",
                     extra={"namespace": ns, "pos": pos, "items": n})
        finally:
            with contextlib.suppress(self._redis_mod.RedisError):
                if self.r.get(lock) == self.src.encode():
                    self.r.delete(lock)

    # ------------------------------------------------------------------ status
    def _discover(self) -> None:
        found = {m.decode() for m in self.r.smembers(self._ns_key)}
        for ns in found - self.namespaces:
            trim = self.r.hget(self._snapmeta_key(ns), "trimmed")
            if trim is not None and _sid(trim) > _sid(self.pos.get(ns, "0-0")):
                self._load_snapshot(ns)
        self.namespaces = found

    def _housekeeping(self) -> None:
        self._discover()
        names = sorted(self.namespaces)
        pipe = self.r.pipeline(transaction=False)
        for ns in names:
            pipe.hget(self._snapmeta_key(ns), "trimmed")
            pipe.xrange(self._stream(ns), min="(" + self.pos.get(ns, "0-0")
                        if self.pos.get(ns, "0-0") != "0-0" else "-", count=10_001)
            pipe.xlen(self._stream(ns))
        res = pipe.execute()
        lag: dict[str, dict[str, Any]] = {}
        now_ms = time.time() * 1000
        for i, ns in enumerate(names):
            trim, unread, length = res[3 * i], res[3 * i + 1], res[3 * i + 2]
            if trim is not None and _sid(trim) > _sid(self.pos.get(ns, "0-0")):
                self._load_snapshot(ns)
                unread = []
            behind = len(unread)
            lag_s = max(0.0, (now_ms - _sid(unread[0][0])[0]) / 1000) if unread else 0.0
            lag[ns] = {"pos": self.pos.get(ns, "0-0"), "lag_entries": behind,
                       "lag_s": round(lag_s, 3), "stream_length": int(length)}
            if length > self.cfg.max_entries and behind == 0:
                self._write_snapshot(ns)
        self.lag = lag
        self.backlog = self._backlog()
        me = self.local_status()
        pipe = self.r.pipeline(transaction=False)
        pipe.hset(self._nodes_key, self.node, json.dumps(me))
        pipe.hgetall(self._nodes_key)
        _, nodes = pipe.execute()
        self.nodes = {k.decode(): json.loads(v) for k, v in nodes.items()}

    def local_status(self) -> dict[str, Any]:
        lat = sorted(self._apply_lat)
        with contextlib.suppress(Exception):  # the store may be closing
            self.backlog = self._backlog()

        def q(p: float) -> float:
            return round(lat[min(len(lat) - 1, int(p * len(lat)))] * 1000, 3) if lat else 0.0

        return {
            "node": self.node,
            "src": self.src,
            "url": self.url_shown,
            "tokenizer": self.tokenizer,
            "redis_up": self.redis_up,
            "error": self.refused or self.last_error,
            "backlog": self.backlog,
            "published": self.published,
            "applied": self.applied,
            "skipped": self.skipped,
            "snapshots_loaded": self.snapshots_loaded,
            "snapshots_written": self.snapshots_written,
            "lag_entries": sum(v["lag_entries"] for v in self.lag.values()),
            "lag_s": max((v["lag_s"] for v in self.lag.values()), default=0.0),
            "apply_lag_p50_ms": q(0.50),
            "apply_lag_p99_ms": q(0.99),
            "namespaces": self.lag,
            "t": time.time(),
        }

    def status(self) -> dict[str, Any]:
        """This node's status and the last heartbeat of every node of the fleet."""
        return {"node": self.local_status(), "nodes": self.nodes}

    def collector(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        fleet = self

        class _FleetCollector:
            def collect(self) -> Iterator[Any]:
                st = fleet.local_status()
                g = GaugeMetricFamily
                yield g("suffixd_fleet_backlog", "Entries waiting to be published to Redis.",
                        value=st["backlog"])
                yield g("suffixd_fleet_redis_up", "1 while Redis answers.",
                        value=1 if st["redis_up"] else 0)
                lag = g("suffixd_fleet_lag_entries", "Peer entries not applied yet.",
                        labels=["namespace"])
                lag_s = g("suffixd_fleet_lag_seconds", "Age of the oldest entry not applied.",
                          labels=["namespace"])
                for ns, v in st["namespaces"].items():
                    lag.add_metric([ns], v["lag_entries"])
                    lag_s.add_metric([ns], v["lag_s"])
                yield lag
                yield lag_s
                for name in ("published", "applied", "skipped"):
                    yield g(f"suffixd_fleet_{name}", f"Entries {name} since start.",
                            value=st[name])

        return _FleetCollector()
