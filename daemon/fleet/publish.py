"""Publishing: this node's ingests into its outbox, and the outbox into Redis.

``FleetPublisher`` is one of the rooms of ``Fleet`` (daemon/fleet/node.py), a mixin over the
node's shared state. It provides ``_hook`` (``Engine.ingest_hook``: runs inside the
ingest's LMDB transaction and writes the outbox entry there, so an entry exists exactly
when its data committed; a namespace drop also records its new drop epoch there) and
``_publish_loop`` (the publisher thread: XADDs the outbox
in order to the namespaces' streams, then deletes what it published; after an overflow
it re-publishes the node's own responses and documents of the namespaces concerned).

It uses from ``Fleet``: ``store``, ``cfg``, ``src``, ``r``, ``keys``, ``_redis_mod``,
the events ``_stop`` / ``_wake`` and the connection state (``joined``, ``_join``,
``_up``, ``_down``); it keeps the counters ``published`` and ``backlog``.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Any

from suffixcache.store_layout import pack_tokens
from suffixcache.store_records import Txn

from . import outbox
from .config import FleetConfig, FleetError, RedisKeys
from .rooms import RoomBase

log = logging.getLogger("suffixd.fleet")


class FleetPublisher(RoomBase):
    # Fleet's state this room reads or keeps (annotations only: Fleet.__init__ sets them)
    store: Any
    cfg: FleetConfig
    src: str
    r: Any
    keys: RedisKeys
    _redis_mod: Any
    _stop: threading.Event
    _wake: threading.Event
    joined: bool
    published: int
    backlog: int

    def _hook(self, t: Txn, op: str, ns: str, replica: Any = None, **f: Any) -> None:
        """Engine.ingest_hook: runs inside the ingest's LMDB transaction."""
        if op == "drop":
            # The namespace's data went in this transaction: so do the fleet's index of it,
            # and its epoch moves on (a peer's drop brings its own, ours the next one).
            ep = int(replica["ep"]) if replica is not None else outbox.txn_epoch(t, ns) + 1
            outbox.dropped(t, ns, ep)
            if replica is None:
                self._enqueue(t, ns, {"op": "drop"})  # stamped with the new epoch
            elif replica.get("id"):
                outbox.mark_applied(t, replica)
            return
        if replica is not None:
            # A peer's entry being applied: record the position, publish nothing.
            if replica:
                outbox.mark_applied(t, replica)
            return
        if op == "evict":
            by_ns: dict[str, list[str]] = {}
            for seq in f["seqs"]:
                rec = t.get_sequence(seq)
                if rec is None or rec["kind"] != "response":
                    continue
                origin = (rec.get("meta") or {}).get("origin")
                if origin:
                    t.fleet_delete(outbox.origin_key(rec["ns"], origin))
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
            t.fleet_put(outbox.doc_write_key(ns, f["key"]), n)
        elif op == "undoc":
            n = self._enqueue(t, ns, {"op": "undoc", "key": f["key"]})
            t.fleet_put(outbox.doc_write_key(ns, f["key"]), n)

    def _enqueue(self, t: Txn, ns: str, entry: dict[str, Any]) -> int:
        n = outbox.enqueue(t, ns, entry, self.src, self.cfg.max_backlog)
        self._wake.set()
        return n

    def _publish_loop(self) -> None:
        backoff = 0.05
        while not self._stop.is_set():
            try:
                if not self.joined:
                    self._join()
                items = outbox.pending(self.store, self.cfg.read_count)
                if not items:
                    self.backlog = outbox.backlog(self.store)
                    overflow = outbox.overflowed(self.store)
                    if overflow:
                        self._republish(overflow)
                        continue
                    self._wake.wait(0.01)
                    self._wake.clear()
                    continue
                pipe = self.r.pipeline(transaction=False)
                for _k, e in items:
                    pipe.xadd(self.keys.stream(e["ns"]), {"d": outbox.dump(e)})
                pipe.sadd(self.keys.namespaces, *{e["ns"] for _k, e in items})
                pipe.execute()
                self._up()
                last = outbox.outbox_number(items[-1][0])
                self.store.write(functools.partial(outbox.mark_published,
                                                   [k for k, _ in items], last))
                self.published += len(items)
                self.backlog = outbox.backlog(self.store)
                backoff = 0.05
            except FleetError as exc:
                log.error("fleet: %s", exc)
                return
            except self._redis_mod.RedisError as exc:
                self._down(exc)
                self.backlog = outbox.backlog(self.store)
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

        epochs = {ns: outbox.epoch(self.store, ns) for ns in want}

        def entry(ns: str, body: dict[str, Any]) -> None:
            nonlocal pipe, count
            body.update(ns=ns, src=self.src, n=0, t=time.time(), ep=epochs[ns])
            pipe.xadd(self.keys.stream(ns), {"d": outbox.dump(body)})
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
                entry(ns, {"op": "doc", "key": key,
                           "seqs": outbox.doc_packed(self.store, doc),
                           "hash": doc.get("hash"), "meta": doc.get("meta") or {}})
        pipe.sadd(self.keys.namespaces, *want)
        pipe.execute()
        self.store.write(functools.partial(outbox.clear_overflow, namespaces=want))
        self.published += count
        log.info("fleet: re-published after an outbox overflow",
                 extra={"namespaces": sorted(want), "entries": count})
