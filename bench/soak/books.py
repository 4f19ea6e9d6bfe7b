"""The soak's books: ``Tally`` (every call's latency and outcome, counted apart when a stop
or the final kill explains a failure), ``Book`` (every session's acknowledged length) and
``percentile``.
"""

from __future__ import annotations

import collections
import threading

from soak.nodes import Node


class Tally:
    """Latencies per call, outcomes by status; thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lat: dict[str, list[float]] = collections.defaultdict(list)
        self.ok: collections.Counter[str] = collections.Counter()
        self.expected: collections.Counter[str] = collections.Counter()  # bad input refused
        self.unexpected: collections.Counter[str] = collections.Counter()
        self.unexpected_samples: list[str] = []
        # Set just before the final kill -9: calls in flight then fail with UNAVAILABLE (or
        # a broken connection), as they must, and are counted apart.
        self.killed = False
        self.at_kill: collections.Counter[str] = collections.Counter()
        # The same for the stops and kills during the run, per node.
        self.at_stop: collections.Counter[str] = collections.Counter()
        self.schema: collections.Counter[str] = collections.Counter()

    def record(self, rpc: str, seconds: float, status: str, bad: bool,
               node: Node | None = None, mark: tuple[int, bool] | None = None,
               detail: str = "") -> None:
        """``node``/``mark`` (the node's epoch and state when the call began): a failure of
        a call to a node that was down, or stopped while it ran, is no fault of the node."""
        with self.lock:
            if self.killed:
                self.at_kill[f"{rpc} {status}"] += 1
                return
            if status != "OK" and node is not None and mark is not None and (
                    not mark[1] or not node.up or node.epoch != mark[0]):
                self.at_stop[f"{rpc} {status}"] += 1
                return
            self.lat[rpc].append(seconds)
            if status == "OK" and not bad:
                self.ok[rpc] += 1
            elif bad and status != "OK":
                self.expected[f"{rpc} {status}"] += 1
            else:
                self.unexpected[f"{rpc} {status}"] += 1
                if detail and len(self.unexpected_samples) < 20:
                    self.unexpected_samples.append(detail)

    def count_schema(self, what: str) -> None:
        with self.lock:
            if not self.killed:
                self.schema[what] += 1


class Book:
    """The acknowledged length of every (node, namespace, session) a gRPC client appends
    to, and the sessions a client tried to close: after a restart, a session absent from
    the store is excused only if its client tried to close it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acked: dict[tuple[str, str, str], int] = {}
        self.closing: set[tuple[str, str, str]] = set()

    def ack(self, key: tuple[str, str, str], tokens: int) -> None:
        with self.lock:
            if tokens > self.acked.get(key, -1):
                self.acked[key] = tokens

    def will_close(self, key: tuple[str, str, str]) -> None:
        with self.lock:
            self.closing.add(key)

    def closed(self, key: tuple[str, str, str]) -> None:
        with self.lock:
            self.acked.pop(key, None)

    def snapshot(self, node: str) -> dict[tuple[str, str], int]:
        with self.lock:
            return {(ns, sid): v for (name, ns, sid), v in self.acked.items() if name == node}

    def excused(self, node: str) -> set[tuple[str, str]]:
        with self.lock:
            return {(ns, sid) for (name, ns, sid) in self.closing if name == node}


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]
