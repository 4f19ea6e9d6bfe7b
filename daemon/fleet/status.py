"""The fleet's view of itself: the heartbeat, lag, status and metrics.

``FleetStatusView`` is one of the rooms of ``Fleet`` (daemon/fleet/node.py), a mixin over
the node's shared state. It provides ``_housekeeping`` (each ``heartbeat_s`` on the
consumer thread: discover namespaces, measure each one's lag, catch up past a trim,
trim a stream grown past ``max_entries`` when this node is caught up, and heartbeat this
node's status into ``<prefix>:<tag>:nodes``), ``local_status()``, ``status()`` (the
Stats RPC, ``suffixd stats [--fleet]``) and ``collector()`` (Prometheus gauges).

It uses from ``Fleet``: ``store``, ``cfg``, ``node``, ``src``, ``url_shown``,
``tokenizer``, ``r``, ``keys``, the connection state (``redis_up``, ``last_error``,
``refused``), ``pos``, ``namespaces``, the counters, ``_discover``
(daemon/fleet/consume.py), ``_load_snapshot`` and ``_write_snapshot``
(daemon/fleet/snapshot.py).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from . import outbox
from .config import FleetConfig, RedisKeys, stream_id
from .rooms import RoomBase


class FleetStatusView(RoomBase):
    # Fleet's state this room reads or keeps (annotations only: Fleet.__init__ sets them)
    store: Any
    cfg: FleetConfig
    node: str
    src: str
    url_shown: str
    tokenizer: str
    r: Any
    keys: RedisKeys
    redis_up: bool
    last_error: str
    refused: str | None
    pos: dict[str, str]
    namespaces: set[str]
    published: int
    applied: int
    skipped: int
    invalid: dict[tuple[str, str], int]
    snapshots_loaded: int
    snapshots_written: int
    backlog: int
    lag: dict[str, dict[str, Any]]
    nodes: dict[str, Any]
    _apply_lat: deque[float]

    def _housekeeping(self) -> None:
        self._discover()
        names = sorted(self.namespaces)
        pipe = self.r.pipeline(transaction=False)
        for ns in names:
            pipe.hget(self.keys.snapmeta(ns), "trimmed")
            pipe.xrange(self.keys.stream(ns), min="(" + self.pos.get(ns, "0-0")
                        if self.pos.get(ns, "0-0") != "0-0" else "-", count=10_001)
            pipe.xlen(self.keys.stream(ns))
        res = pipe.execute()
        lag: dict[str, dict[str, Any]] = {}
        now_ms = time.time() * 1000
        for i, ns in enumerate(names):
            trim, unread, length = res[3 * i], res[3 * i + 1], res[3 * i + 2]
            if trim is not None and stream_id(trim) > stream_id(self.pos.get(ns, "0-0")):
                self._load_snapshot(ns)
                unread = []
            behind = len(unread)
            lag_s = max(0.0, (now_ms - stream_id(unread[0][0])[0]) / 1000) if unread else 0.0
            lag[ns] = {"pos": self.pos.get(ns, "0-0"), "lag_entries": behind,
                       "lag_s": round(lag_s, 3), "stream_length": int(length)}
            if length > self.cfg.max_entries and behind == 0:
                self._write_snapshot(ns)
        self.lag = lag
        self.backlog = outbox.backlog(self.store)
        me = self.local_status()
        pipe = self.r.pipeline(transaction=False)
        pipe.hset(self.keys.nodes, self.node, json.dumps(me))
        pipe.hgetall(self.keys.nodes)
        _, nodes = pipe.execute()
        self.nodes = {k.decode(): json.loads(v) for k, v in nodes.items()}

    def local_status(self) -> dict[str, Any]:
        lat = sorted(self._apply_lat)
        with contextlib.suppress(Exception):  # the store may be closing
            self.backlog = outbox.backlog(self.store)

        invalid: dict[str, dict[str, int]] = {}
        for (ns, reason), n in list(self.invalid.items()):
            invalid.setdefault(ns, {})[reason] = n

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
            # Peer entries refused whole (daemon/fleet/entries.py): ns -> reason -> count.
            "invalid": sum(self.invalid.values()),
            "invalid_entries": invalid,
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
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

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
                bad = CounterMetricFamily(
                    "suffixd_fleet_invalid_entries",
                    "Peer entries (and snapshot items) refused as invalid and skipped, "
                    "since start.", labels=["namespace", "reason"])
                for ns, reasons in st["invalid_entries"].items():
                    for reason, n in reasons.items():
                        bad.add_metric([ns, reason], n)
                yield bad

        return _FleetCollector()
