"""Consuming: the peers' entries from Redis into this node's trees and LMDB.

``FleetConsumer`` is one of the rooms of ``Fleet`` (daemon/fleet/node.py), a mixin over the
node's shared state. It provides ``_consume_loop`` (the consumer thread: XREADs every
namespace's stream after its position and applies the other nodes' entries; each
entry's data and the new position commit in one transaction, so a node killed at any
point resumes exactly after what it applied), ``_consume`` (one XREAD's result),
``_discover`` (namespaces new to this node, caught up from their snapshot when their
stream was trimmed past our position) and the appliers ``_apply_evict`` and
``_add_to_tree``, which the snapshot catch-up (daemon/fleet/snapshot.py) shares.

It keeps ``pos`` (namespace -> stream id handled), ``seen`` ((namespace, origin) ->
highest outbox number handled), ``namespaces`` and the counters ``applied`` /
``skipped``. It uses from ``Fleet``: ``engine``, ``store``, ``cfg``, ``src``, ``r``,
``keys``, ``_redis_mod``, ``_stop``, the connection state (``joined``, ``_join``,
``_up``, ``_down``), ``_housekeeping`` (daemon/fleet/status.py) and ``_load_snapshot``
(daemon/fleet/snapshot.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

from suffixcache.store_layout import unpack_tokens
from suffixcache.store_records import Txn

from ..common.errors import EngineError
from . import outbox
from .config import FleetConfig, FleetError, RedisKeys, stream_id

log = logging.getLogger("suffixd.fleet")

_Rep = dict[str, Any]  # an entry's replica record: {ns, id (stream id), src, n}


class FleetConsumer:
    # Fleet's state this room reads or keeps (annotations only: Fleet.__init__ sets them)
    engine: Any
    store: Any
    cfg: FleetConfig
    src: str
    r: Any
    keys: RedisKeys
    _redis_mod: Any
    _stop: threading.Event
    joined: bool
    pos: dict[str, str]
    seen: dict[tuple[str, str], int]
    _dirty_pos: set[str]
    namespaces: set[str]
    applied: int
    skipped: int
    _apply_lat: deque[float]

    # ------------------------------------------------------------------ positions
    def _handled(self, rep: _Rep) -> None:
        ns = rep["ns"]
        self.pos[ns] = rep["id"]
        if rep.get("n"):
            key = (ns, rep["src"])
            self.seen[key] = max(self.seen.get(key, 0), int(rep["n"]))

    def _skip(self, rep: _Rep) -> None:
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
                outbox.put_position(t, ns, p)
            for (ns, src), n in seen.items():
                outbox.put_seen(t, ns, src, n)

        self.store.write(write)

    def _reload_state(self) -> None:
        """After a failed apply: the positions and outbox numbers as stored (in memory
        they may be ahead of what committed)."""
        try:
            self._read_state()
        except Exception:  # the store is closing: nothing will be applied any more
            self._stop.set()

    def _read_state(self) -> None:
        self.pos = outbox.read_positions(self.store)
        self.seen = outbox.read_seen(self.store)
        self._dirty_pos.clear()

    # ------------------------------------------------------------------ the loop
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
                streams = {self.keys.stream(ns): self.pos.get(ns, "0-0")
                           for ns in self.namespaces}
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

    def _discover(self) -> None:
        found = {m.decode() for m in self.r.smembers(self.keys.namespaces)}
        for ns in found - self.namespaces:
            trim = self.r.hget(self.keys.snapmeta(ns), "trimmed")
            if trim is not None and stream_id(trim) > stream_id(self.pos.get(ns, "0-0")):
                self._load_snapshot(ns)
        self.namespaces = found

    def _consume(self, res: list[Any]) -> None:
        names = [self.keys.ns_of(key) for key, _ in res]
        # Trims only move forward: a trim point read after the entries that is not past
        # our position proves nothing between it and them was trimmed.
        pipe = self.r.pipeline(transaction=False)
        for ns in names:
            pipe.hget(self.keys.snapmeta(ns), "trimmed")
        trims = pipe.execute()
        for ns, (_key, entries), trim in zip(names, res, trims, strict=True):
            if trim is not None and stream_id(trim) > stream_id(self.pos.get(ns, "0-0")):
                self._load_snapshot(ns)
                continue
            # Consecutive peers' responses are applied in one transaction (catch-up speed).
            run: list[tuple[dict[str, Any], _Rep]] = []
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
               fields: dict[bytes, bytes]) -> tuple[dict[str, Any], _Rep] | None:
        """The entry and its replica record, or None when it is skipped (a duplicate,
        unreadable). Counts it as seen (in memory: a failed apply reloads the state)."""
        try:
            e = outbox.load(fields[b"d"])
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

    # ------------------------------------------------------------------ applying
    def _apply(self, ns: str, e: dict[str, Any], rep: _Rep) -> None:
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

    def _apply_responses(self, ns: str, run: list[tuple[dict[str, Any], _Rep]]) -> None:
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
                rkey = outbox.origin_key(ns, origin)
                if origin.startswith(self.src + ":") or origin in fresh \
                        or t.fleet_get(rkey) is not None:
                    out.append(None)  # ours, or already here (a re-published copy)
                    continue
                fresh.add(origin)
                toks = unpack_tokens(e["tok"])
                seq = t.add_sequence(ns, "response", toks, meta={"origin": origin})
                t.fleet_put(rkey, seq)
                out.append((seq, toks))
            outbox.put_position(t, ns, last["id"])
            for src, n in top.items():
                outbox.put_seen(t, ns, src, n)
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

    def _apply_evict(self, ns: str, e: dict[str, Any], rep: _Rep | None) -> bool:
        gone: list[int] = []
        origins = [str(o) for o in e["o"]]

        def write(t: Txn) -> None:
            gone.clear()
            for origin in origins:
                if origin.startswith(self.src + ":"):
                    seq = int(origin.rsplit(":", 1)[1])
                else:
                    got = t.fleet_get(outbox.origin_key(ns, origin))
                    if got is None:
                        continue
                    seq = int(got)
                    t.fleet_delete(outbox.origin_key(ns, origin))
                if t.delete_sequence(seq):
                    gone.append(seq)
            if rep:
                outbox.mark_applied(t, rep)

        self.store.write(write)
        self.engine.remove_from_trees(ns, "response", gone)
        return bool(gone)

    def _apply_doc(self, ns: str, e: dict[str, Any], rep: _Rep, own: bool) -> bool:
        key = str(e["key"])
        if own:
            latest = self.store.fleet_get(outbox.doc_write_key(ns, key))
            if not rep["n"] or (latest is not None and rep["n"] < int(latest)):
                return False  # a later local write of this document is coming
        want = outbox.digest(list(e["seqs"])) if e["op"] == "doc" else None
        if want == outbox.local_digest(self.store, ns, key):
            return False
        if e["op"] == "doc":
            self.engine.add_corpus_document(
                ns, key, [unpack_tokens(s) for s in e["seqs"]], content_hash=e.get("hash"),
                meta=e.get("meta") or {}, replica=rep)
            return True
        return bool(self.engine.remove_corpus_document(ns, key, replica=rep))
