"""Snapshots: how a stream is trimmed, and how a node catches up past a trim.

``FleetSnapshots`` is one of the rooms of ``Fleet`` (daemon/fleet/node.py), a mixin over the
node's shared state; both methods run on the consumer thread, so nothing is applied
meanwhile.

* ``_write_snapshot(ns)``: by the one caught-up node that takes the namespace's Redis
  lock: store the namespace as this node holds it at its position P (every response
  with its origin, every document) under the snapshot key, then record ``trimmed = P``
  and trim the stream to the entries from P on (XTRIM MINID), atomically.
* ``_load_snapshot(ns)``: for a node whose position is below ``trimmed``: add the
  responses it lacks, drop replicated ones absent from the snapshot, apply documents
  whose content differs, then set its position to P. Every item is checked first
  (daemon/fleet/entries.py; invalid ones are skipped and counted). The snapshot carries
  the namespace's drop epoch: one older than this node's is skipped whole (a drop
  applied here is not undone), a newer one is a drop this node missed (applied first).
  It carries the stream's epoch at P too (``sep``, which the loader reads on from): a
  writer's epoch is at most ``entries.MAX_EPOCH_STEP`` past it (its peers would refuse
  its entries otherwise), so a snapshot whose epochs break that is skipped whole and
  counted as invalid ("epoch"), its position taken.

It uses from ``Fleet``: ``engine``, ``store``, ``src``, ``r``, ``keys``, ``_redis_mod``,
``pos``, ``sep``, ``stream_epoch`` (daemon/fleet/consume.py), the counters
``snapshots_loaded`` / ``snapshots_written``, and the appliers ``_add_to_tree``,
``_apply_evict`` and ``_drop`` (daemon/fleet/consume.py).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from suffixcache.store_layout import pack_tokens
from suffixcache.store_records import Txn

from . import entries, outbox
from .config import RedisKeys
from .rooms import RoomBase

log = logging.getLogger("suffixd.fleet")


def _snapshot_epochs(meta: dict[bytes, bytes]) -> tuple[int, int, str | None]:
    """A snapshot's (epoch, stream epoch, why they are invalid or None). A snapshot of a
    version that wrote no stream epoch: its epoch."""
    try:
        ep = int(meta.get(b"ep", b"0"))
        sep = int(meta.get(b"sep", b"%d" % ep))
    except ValueError:
        return 0, 0, "an epoch is not an integer"
    if sep < 0 or sep > ep:
        return ep, sep, f"stream epoch {sep} is not in [0, epoch {ep}]"
    return ep, sep, entries.epoch_error(ep, sep)


class FleetSnapshots(RoomBase):
    # Fleet's state this room reads or keeps (annotations only: Fleet.__init__ sets them)
    engine: Any
    store: Any
    src: str
    r: Any
    keys: RedisKeys
    _redis_mod: Any
    pos: dict[str, str]
    sep: dict[str, int]
    invalid: dict[tuple[str, str], int]
    apply_lock: threading.RLock
    snapshots_loaded: int
    snapshots_written: int
    def _load_snapshot(self, ns: str) -> None:
        with self.apply_lock:
            self._load_snapshot_locked(ns)

    def _load_snapshot_locked(self, ns: str) -> None:
        pipe = self.r.pipeline(transaction=True)
        pipe.hgetall(self.keys.snapmeta(ns))
        pipe.lrange(self.keys.snap(ns), 0, -1)
        meta, chunks = pipe.execute()
        if not meta or b"pos" not in meta:
            raise self._redis_mod.RedisError(f"the stream of namespace {ns!r} was trimmed "
                                             "but its snapshot is missing")
        pos = meta[b"pos"].decode()
        ep = outbox.epoch(self.store, ns)
        sep = self.stream_epoch(ns, ep)
        snap_ep, snap_sep, err = _snapshot_epochs(meta)
        if err:
            self.invalid[(ns, "epoch")] = self.invalid.get((ns, "epoch"), 0) + 1
            self._snapshot_position(ns, pos, sep)
            log.warning("fleet: skipped a snapshot with invalid drop epochs",
                        extra={"namespace": ns, "pos": pos, "error": err})
            return
        # A stream's epoch only grows along it; the loader's position is before P.
        sep = max(sep, snap_sep)
        if snap_ep < ep:
            # Written before a drop this node applied: nothing of it may come back.
            self._snapshot_position(ns, pos, sep)
            log.info("fleet: skipped a snapshot older than a drop",
                     extra={"namespace": ns, "pos": pos, "epoch": ep, "snapshot_epoch": snap_ep})
            return
        if snap_ep > ep:  # a drop this node never read: the snapshot is after it
            self._drop(ns, snap_ep, None)
        have = outbox.replicated(self.store, ns)
        in_snap: set[str] = set()
        adds: list[tuple[str, list[int]]] = []
        docs: list[list[Any]] = []
        invalid = 0
        for chunk in chunks:
            try:
                items = outbox.load(chunk)
                if not isinstance(items, list):
                    raise entries.BadEntry("unreadable", "a snapshot chunk is not a list")
            except Exception as exc:
                invalid += 1
                log.warning("fleet: skipped an unreadable snapshot chunk",
                            extra={"namespace": ns, "error": str(exc)[:200]})
                continue
            for raw in items:
                try:
                    item = entries.check_snapshot_item(raw, ns, self.engine.validator)
                except entries.BadEntry as exc:
                    invalid += 1
                    if invalid <= 10:
                        log.warning("fleet: skipped an invalid snapshot item",
                                    extra={"namespace": ns, "reason": exc.reason,
                                           "error": str(exc)[:200]})
                    continue
                if item[0] == "r":
                    origin = str(item[1])
                    if origin.startswith(self.src + ":"):
                        continue
                    in_snap.add(origin)
                    if origin not in have:
                        adds.append((origin, item[2]))
                else:
                    docs.append(item)
        if invalid:
            self.invalid[(ns, "snapshot")] = self.invalid.get((ns, "snapshot"), 0) + invalid
        for i in range(0, len(adds), 256):
            batch = adds[i:i + 256]

            def write(t: Txn, batch: list[tuple[str, list[int]]] = batch) -> list[int]:
                out = []
                for origin, toks in batch:
                    seq = t.add_sequence(ns, "response", toks, meta={"origin": origin})
                    t.fleet_put(outbox.origin_key(ns, origin), seq)
                    out.append(seq)
                return out

            for seq, (_o, toks) in zip(self.store.write(write), batch, strict=True):
                self._add_to_tree(ns, seq, toks)
        stale = [o for o in have if o not in in_snap]
        if stale:
            self._apply_evict(ns, {"o": stale}, None)
        for _d, key, seqs, chash, meta_d in docs:
            packed = [pack_tokens(s) for s in seqs]
            if outbox.digest(packed) != outbox.local_digest(self.store, ns, key):
                self.engine.add_corpus_document(ns, key, seqs, content_hash=chash,
                                                meta=meta_d or {}, replica={})
        self._snapshot_position(ns, pos, sep)
        self.snapshots_loaded += 1
        log.info("fleet: caught up from a snapshot",
                 extra={"namespace": ns, "pos": pos, "responses": len(adds),
                        "documents": len(docs), "dropped": len(stale), "invalid": invalid})

    def _snapshot_position(self, ns: str, pos: str, sep: int) -> None:
        self.store.write(lambda t: outbox.put_position(t, ns, pos, sep))
        self.pos[ns] = pos
        self.sep[ns] = sep

    def _snapshot_items(self, ns: str) -> Iterator[list[Any]]:
        for rec in self.store.iter_sequences():
            if rec["ns"] == ns and rec["kind"] == "response":
                origin = (rec.get("meta") or {}).get("origin") or f"{self.src}:{rec['id']}"
                yield ["r", origin, pack_tokens(rec["tokens"])]
        for _ns, key, doc in self.store.iter_docs(ns):
            yield ["d", key, outbox.doc_packed(self.store, doc), doc.get("hash"),
                   doc.get("meta") or {}]

    def _write_snapshot(self, ns: str) -> None:
        """Snapshot the namespace at our position and trim the stream to it (the consumer
        thread calls this, so nothing is applied meanwhile)."""
        lock = self.keys.lock(ns)
        if not self.r.set(lock, self.src, nx=True, ex=120):
            return
        # The snapshot is of one epoch: no local drop while it is read from the store.
        self.apply_lock.acquire()
        try:
            pos = self.pos.get(ns)
            if pos is None:
                return
            tmp = f"{self.keys.snap(ns)}:tmp:{self.src}"
            self.r.delete(tmp)
            chunk: list[Any] = []
            size = n = 0
            pipe = self.r.pipeline(transaction=False)
            for item in self._snapshot_items(ns):
                chunk.append(item)
                size += sum(len(x) for x in item if isinstance(x, bytes)) + 64
                n += 1
                if size > 1 << 20:
                    pipe.rpush(tmp, outbox.dump(chunk))
                    pipe.execute()
                    chunk, size = [], 0
            if chunk:
                pipe.rpush(tmp, outbox.dump(chunk))
            pipe.execute()
            tx = self.r.pipeline(transaction=True)
            if n:
                tx.rename(tmp, self.keys.snap(ns))
            else:
                tx.delete(self.keys.snap(ns))
            ep = outbox.epoch(self.store, ns)
            tx.hset(self.keys.snapmeta(ns), mapping={
                "pos": pos, "trimmed": pos, "node": self.src, "t": time.time(), "items": n,
                "ep": ep, "sep": self.stream_epoch(ns, ep)})
            tx.xtrim(self.keys.stream(ns), minid=pos, approximate=False)
            tx.execute()
            self.snapshots_written += 1
            log.info("fleet: snapshot written, stream trimmed",
                     extra={"namespace": ns, "pos": pos, "items": n})
        finally:
            self.apply_lock.release()
            with contextlib.suppress(self._redis_mod.RedisError):
                if self.r.get(lock) == self.src.encode():
                    self.r.delete(lock)
