"""Consuming: the peers' entries from Redis into this node's trees and LMDB.

``FleetConsumer`` is one of the rooms of ``Fleet`` (daemon/fleet/node.py), a mixin over the
node's shared state. It provides ``_consume_loop`` (the consumer thread: XREADs every
namespace's stream after its position and applies the other nodes' entries; each
entry's data and the new position commit in one transaction, so a node killed at any
point resumes exactly after what it applied), ``_consume`` (one XREAD's result),
``_discover`` (namespaces new to this node, caught up from their snapshot when their
stream was trimmed past our position) and the appliers ``_apply_evict``,
``_add_to_tree`` and ``_drop``, which the snapshot catch-up (daemon/fleet/snapshot.py)
shares. Every entry is checked whole first (daemon/fleet/entries.py): an invalid one is
skipped, logged once with its stream id and counted in ``invalid`` ((namespace, reason)
-> entries), and the position moves past it. An entry's drop epoch is judged against the
stream's epoch at its position (``sep``, the same on every node: entries.epoch_error),
then compared with the namespace's drop epoch (daemon/fleet/node.py, "Drops";
entries.epoch_action) under ``apply_lock``.

It keeps ``pos`` (namespace -> stream id handled), ``sep`` (namespace -> the stream's
epoch at ``pos``, stored with it), ``seen`` ((namespace, origin) ->
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
from collections import OrderedDict, deque
from typing import Any

from suffixcache.store_records import Txn

from ..common.errors import EngineError
from . import entries, outbox
from .config import FleetConfig, FleetError, RedisKeys, stream_id
from .rooms import Rep, RoomBase

log = logging.getLogger("suffixd.fleet")

_BAD_STREAM_S = 30.0  # a stream key of another type is looked at again after this


class FleetConsumer(RoomBase):
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
    sep: dict[str, int]
    seen: dict[tuple[str, str], int]
    _dirty_pos: set[str]
    namespaces: set[str]
    applied: int
    skipped: int
    invalid: dict[tuple[str, str], int]
    _invalid_seen: OrderedDict[tuple[str, str], None]
    _bad_names: set[bytes]
    _bad_streams: dict[str, float]
    apply_lock: threading.RLock
    _apply_lat: deque[float]

    # ------------------------------------------------------------------ positions
    def _handled(self, rep: Rep) -> None:
        ns = rep["ns"]
        self.pos[ns] = rep["id"]
        self.sep[ns] = int(rep["sep"])
        if rep.get("n"):
            key = (ns, rep["src"])
            self.seen[key] = max(self.seen.get(key, 0), int(rep["n"]))

    def _skip(self, rep: Rep, count: bool = True) -> None:
        # Nothing to apply: the position is written with the next write (or batch end).
        self._handled(rep)
        self._dirty_pos.add(rep["ns"])
        if count:
            self.skipped += 1

    def _flush_positions(self) -> None:
        if not self._dirty_pos:
            return
        names = list(self._dirty_pos)
        self._dirty_pos.clear()
        pos = {ns: (self.pos[ns], self.sep[ns]) for ns in names}
        seen = {k: v for k, v in self.seen.items() if k[0] in pos}

        def write(t: Txn) -> None:
            for ns, (p, sep) in pos.items():
                outbox.put_position(t, ns, p, sep)
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
        self.sep = outbox.read_stream_epochs(self.store)
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
                if str(exc).startswith("WRONGTYPE") and self._set_aside_bad_streams():
                    continue  # one bad key must not stop the other namespaces
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
        found: set[str] = set()
        for m in self.r.smembers(self.keys.namespaces):
            try:
                ns = m.decode()
                self.engine.validator.check_name("namespace", ns)
            except (UnicodeDecodeError, EngineError) as exc:
                # Not a namespace any node would write: never read its stream.
                if m not in self._bad_names and len(self._bad_names) < 1000:
                    self._bad_names.add(m)
                    log.warning("fleet: ignored an invalid namespace name",
                                extra={"member": repr(m[:80]), "error": str(exc)})
                continue
            found.add(ns)
        now = time.monotonic()
        found -= {ns for ns, t in self._bad_streams.items() if now - t < _BAD_STREAM_S}
        for ns in found - self.namespaces:
            trim = self.r.hget(self.keys.snapmeta(ns), "trimmed")
            if trim is not None and stream_id(trim) > stream_id(self.pos.get(ns, "0-0")):
                self._load_snapshot(ns)
        self.namespaces = found

    def _set_aside_bad_streams(self) -> bool:
        """Some namespace's stream key holds another type (anything can write to Redis):
        read the others without it for a while, and say so. Whether one was found."""
        names = sorted(self.namespaces)
        pipe = self.r.pipeline(transaction=False)
        for ns in names:
            pipe.type(self.keys.stream(ns))
        try:
            kinds = pipe.execute()
        except self._redis_mod.RedisError:
            return False
        found = False
        for ns, kind in zip(names, kinds, strict=True):
            if kind not in (b"stream", b"none", "stream", "none"):
                if ns not in self._bad_streams:
                    log.warning("fleet: a namespace's stream key holds another type; not "
                                "read until it is a stream", extra={
                                    "namespace": ns, "key": self.keys.stream(ns),
                                    "type": str(kind)})
                self._bad_streams[ns] = time.monotonic()
                self.namespaces.discard(ns)
                found = True
        return found

    def _consume(self, res: list[Any]) -> None:
        names = [self.keys.ns_of(key) for key, _ in res]
        # Trims only move forward: a trim point read after the entries that is not past
        # our position proves nothing between it and them was trimmed.
        pipe = self.r.pipeline(transaction=False)
        for ns in names:
            pipe.hget(self.keys.snapmeta(ns), "trimmed")
        trims = pipe.execute()
        for ns, (_key, items), trim in zip(names, res, trims, strict=True):
            # Held while a namespace's entries are checked and applied: a local drop of
            # it waits, so no entry checked against the old epoch is written after it.
            with self.apply_lock:
                if trim is not None and stream_id(trim) > stream_id(self.pos.get(ns, "0-0")):
                    self._load_snapshot(ns)
                    continue
                self._consume_namespace(ns, items)
        self._flush_positions()

    def stream_epoch(self, ns: str, ep: int) -> int:
        """The stream's epoch at this node's position in ``ns`` (``ep``: its own). A
        position stored by a version that did not keep it: the node's own epoch."""
        return self.sep.get(ns, ep if ns in self.pos else 0)

    def _consume_namespace(self, ns: str, items: list[Any]) -> None:
        ep = outbox.epoch(self.store, ns)
        sep = self.stream_epoch(ns, ep)
        # Consecutive peers' responses are applied in one transaction (catch-up speed).
        run: list[tuple[dict[str, Any], Rep]] = []
        for sid, fields in items:
            if self._stop.is_set():
                break
            e, rep = self._parse(ns, sid.decode(), fields, sep)
            sep = rep["sep"]
            entry_ep = int(e.get("ep") or 0) if e is not None else 0
            drop_first, apply = (False, False) if e is None else \
                entries.epoch_action(str(e["op"]), entry_ep, ep)
            if e is None or not (drop_first or apply):
                # Invalid, a duplicate, written before a drop this node applied, or a
                # drop it applied: the position moves past it, after the run before it.
                self._apply_responses(ns, run)
                run = []
                self._skip(rep, count="src" in rep)  # invalid ones are counted apart
                continue
            if drop_first:
                # A drop: this entry's, or one this node never read (trimmed away, or lost
                # from its publisher's full outbox) that the entry's epoch proves.
                self._apply_responses(ns, run)
                run = []
                self._drop(ns, entry_ep, rep if e["op"] == "drop" else None)
                ep = entry_ep
                if not apply:
                    continue
            if e["op"] == "resp" and rep["src"] != self.src:
                run.append((e, rep))
                continue
            self._apply_responses(ns, run)
            run = []
            self._apply(ns, e, rep)
        self._apply_responses(ns, run)

    def _parse(self, ns: str, sid: str, fields: Any,
               sep: int) -> tuple[dict[str, Any] | None, Rep]:
        """The entry (None when it is skipped: invalid, a duplicate) and its replica
        record, read where the stream's epoch is ``sep``. Counts it as seen (in memory: a
        failed apply reloads the state)."""
        try:
            e = entries.check(fields, ns, self.engine.validator)
            err = entries.epoch_error(int(e.get("ep") or 0), sep)
            if err:
                raise entries.BadEntry("epoch", err)
        except entries.BadEntry as exc:
            self._invalid(ns, sid, exc.reason, str(exc))
            return None, {"ns": ns, "id": sid, "sep": sep}
        # Every valid entry moves the stream's epoch, duplicates too: it must depend on
        # the stream alone, not on what this node happened to have handled.
        sep = max(sep, int(e.get("ep") or 0))
        src, n = str(e["src"]), int(e.get("n") or 0)
        rep = {"ns": ns, "id": sid, "sep": sep, "src": src, "n": n}
        if n and n <= self.seen.get((ns, src), 0):
            return None, rep
        if n:
            self.seen[(ns, src)] = n
        return e, rep

    def _invalid(self, ns: str, sid: str, reason: str, error: str) -> None:
        """An entry no node could apply: logged and counted once (a reload after a
        failed apply reads it again), by namespace and reason."""
        if (ns, sid) in self._invalid_seen:
            return
        self._invalid_seen[(ns, sid)] = None
        if len(self._invalid_seen) > 4096:
            self._invalid_seen.popitem(last=False)
        log.warning("fleet: skipped an invalid entry", extra={
            "namespace": ns, "id": sid, "reason": reason, "error": error[:200]})
        if (ns, reason) not in self.invalid and \
                len({k[0] for k in self.invalid}) >= self.engine.limits.max_namespaces:
            ns = "(other)"  # a bounded number of label values
        self.invalid[(ns, reason)] = self.invalid.get((ns, reason), 0) + 1

    def _drop(self, ns: str, ep: int, rep: Rep | None) -> None:
        """A peer's drop of ``ns`` (epoch ``ep``), applied as a local drop is; with
        ``rep`` its position commits with it."""
        r = self.engine.drop_namespace(ns, replica={**(rep or {}), "ep": ep})
        if rep:
            self._handled(rep)
            self.applied += 1
        log.info("fleet: namespace dropped by a peer",
                 extra={"namespace": ns, "epoch": ep, "sessions": r["sessions"],
                        "sequences": r["sequences"], "documents": r["documents"]})

    # ------------------------------------------------------------------ applying
    def _apply(self, ns: str, e: dict[str, Any], rep: Rep) -> None:
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

    def _apply_responses(self, ns: str, run: list[tuple[dict[str, Any], Rep]]) -> None:
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
                toks = e["toks"]  # checked by entries.check
                seq = t.add_sequence(ns, "response", toks, meta={"origin": origin})
                t.fleet_put(rkey, seq)
                out.append((seq, toks))
            outbox.put_position(t, ns, last["id"], int(last["sep"]))
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
            try:
                self._add_to_tree(ns, *got)
            except Exception:  # stored: the next rebuild judges it again; the rest go on
                log.exception("fleet: a replicated response did not enter the tree",
                              extra={"namespace": ns, "id": rep["id"]})
            self.applied += 1
            self._apply_lat.append(max(0.0, now - float(e.get("t", now))))

    def _add_to_tree(self, ns: str, seq: int, toks: list[int]) -> None:
        evicted = self.engine.cache.add_response(ns, seq, toks)
        if evicted:
            self.engine._delete_sequences(list(evicted))

    def _apply_evict(self, ns: str, e: dict[str, Any], rep: Rep | None) -> bool:
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

    def _apply_doc(self, ns: str, e: dict[str, Any], rep: Rep, own: bool) -> bool:
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
                ns, key, e["toks"], content_hash=e.get("hash"),
                meta=e.get("meta") or {}, replica=rep)
            return True
        return bool(self.engine.remove_corpus_document(ns, key, replica=rep))
