"""The phases of a soak run, in order: the nodes started and warmed, the load started
(clients, probe, stops and kills), its minutes sampled, the load wound down, the final
kill -9 of every node, their restart and checks, their SIGTERM; ``soak()`` runs them and
returns the report (soak/report.py).
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from rss_watch import MemoryWatch

from soak.books import Book, Tally
from soak.chaos import STOP_TIMEOUT, Chaos, make_schedule
from soak.grpc_workers import Worker
from soak.http_workers import HttpWorker
from soak.nodes import Node, warm
from soak.probes import Probe, check_lost, check_probes, tree_sample
from soak.report import report
from soak.schemas import strategy_leaves


def start_nodes(nodes: list[Node]) -> None:
    """Each node started, then warmed, one after the other."""
    for node in nodes:
        node.data.parent.mkdir(parents=True, exist_ok=True)
        node.start()
        node.up = True
        # The verifier loaded and its costs measured (or read back) before the clock
        # starts, one node after the other: two measurements at once distort both.
        warm(node)
        node.ready = True


@dataclass
class Load:
    """The clients, the probe and the stop/kill thread of a run, and the books they keep."""

    workers: list[threading.Thread]
    probe: Probe | None
    chaos: Chaos
    tally: Tally
    book: Book
    stop: threading.Event  # set once the clients are to end
    t0: float  # when the clients started (time.monotonic())
    warmup: float  # seconds before the first sample and the first event

    def threads(self) -> list[threading.Thread]:
        return self.workers + ([self.probe] if self.probe else [])


def start_load(args: argparse.Namespace, nodes: list[Node]) -> Load:
    """The gRPC and HTTP clients, the probe (with the fleet) and the schedule's thread,
    started."""
    leaves = strategy_leaves()
    tally = Tally()
    stop = threading.Event()
    book = Book()
    workers: list[threading.Thread] = [
        Worker(i, nodes[i % len(nodes)], tally, stop, book, args) for i in range(args.clients)]
    workers += [HttpWorker(i, nodes, tally, stop, args, leaves)
                for i in range(args.http_clients)]
    probe = Probe(nodes, tally, stop, args.probe_interval) if len(nodes) > 1 else None
    t0 = time.monotonic()
    warmup = min(30.0, args.minutes * 6)
    # The last event leaves time for its restart and checks before the final kill.
    schedule = make_schedule(args, nodes, warmup, args.minutes * 60 - 45)
    chaos = Chaos(nodes, tally, book, probe, schedule, t0, args)
    print("schedule: " + (", ".join(f"{e.sig.name} of {e.node.name} at {e.at_s:.0f} s"
                                    for e in schedule) or "none"), flush=True)
    load = Load(workers, probe, chaos, tally, book, stop, t0, warmup)
    for w in load.threads():
        w.start()
    chaos.start()
    return load


class Samples:
    """Each node's RSS (and its peak) every minute, its global trees against their budgets,
    and the memory watch (bench/rss_watch.py: RSS and its parts every --memory-interval
    seconds)."""

    def __init__(self, nodes: list[Node], t0: float, interval: float) -> None:
        self.nodes = nodes
        self.t0 = t0
        self.rss: list[tuple[int, ...]] = []  # (seconds, each node's RSS in MiB or 0)
        self.trees: dict[str, list[tuple[int, int, int, int]]] = {n.name: [] for n in nodes}
        self.tree_over: list[str] = []
        self.memory_stop = threading.Event()
        self.watch = MemoryWatch(lambda: [(n.name, n.proc.pid, n.target) for n in nodes
                                          if n.up], interval, t0, self.memory_stop)
        self.memory_end_s = 0.0

    def sample(self) -> None:
        for n in self.nodes:
            if n.up:
                n.note_peak()
        self.rss.append((round(time.monotonic() - self.t0),
                         *(round(n.rss()) if n.up else 0 for n in self.nodes)))
        t = self.rss[-1][0]
        for n in self.nodes:
            tokens, evictions, sessions, over = tree_sample(n) if n.up else (-1, -1, -1, [])
            self.trees[n.name].append((t, tokens, evictions, sessions))
            self.tree_over.extend(f"{t} s, node {n.name}: {what}" for what in over)

    def print_minute(self, load: Load) -> None:
        """The last sample, one line, and each node's memory parts."""
        probe, tally, last = load.probe, load.tally, self.rss[-1]
        lag = f"  probes {len(probe.lags)}/{probe.sent} seen" if probe else ""
        print(f"{last[0]:>5} s  " + "  ".join(
            f"{n.name}: RSS {m} MiB (peak {n.peak_mib:.0f}), global "
            f"{self.trees[n.name][-1][1] / 1e3:.0f}k tokens, {self.trees[n.name][-1][3]} open "
            "sessions" if m else f"{n.name}: down (restarting)"
            for n, m in zip(self.nodes, last[1:], strict=True))
            + f"  served {sum(tally.ok.values()):,}  unexpected "
            f"{sum(tally.unexpected.values())}  stops {len(load.chaos.events)}{lag}  "
            f"load {os.getloadavg()[0]:.1f}", flush=True)
        for n in self.nodes:
            parts = (self.watch.of(n.name) or [{}])[-1]
            if parts.get("parts"):
                print("        " + n.name + ": " + ", ".join(
                    f"{k} {v:.0f}" for k, v in parts["parts"].items()) + " MiB", flush=True)

    def stop(self) -> None:
        self.memory_stop.set()
        self.watch.join(timeout=120)
        self.memory_end_s = time.monotonic() - self.t0


def run_minutes(args: argparse.Namespace, load: Load, samples: Samples) -> None:
    """The warm-up (sessions opened, first trees built), then a sample every minute until
    --minutes are over."""
    time.sleep(load.warmup)
    samples.sample()
    samples.watch.start()
    end = load.t0 + args.minutes * 60
    while time.monotonic() < end:
        time.sleep(min(60.0, max(0.0, end - time.monotonic())))
        samples.sample()
        samples.print_minute(load)


def wind_down(load: Load, samples: Samples) -> tuple[float, float, float]:
    """The memory watch stopped, and the stop/kill thread once an event under way is done
    (its node restarted and checked: the schedule ends before the final kill); the load
    average then."""
    samples.stop()
    load.chaos.stop_event.set()
    load.chaos.join(timeout=1800)  # a restart's checks are bounded (rebuild 600 s, model 300 s)
    if load.chaos.is_alive():
        load.chaos.failures.append("the stop/kill thread did not finish its last restart")
    return os.getloadavg()


@dataclass
class Ending:
    """The final kill -9 and what followed: the nodes up then (``live``), their exit
    statuses, what each had acknowledged, then (``after``) the checks of their restart and
    their SIGTERM, and the crashes of the whole run."""

    live: list[Node]
    rc: dict[str, int | None]
    acked: dict[str, dict[tuple[str, str], int]]
    probes: dict[str, list[list[int]]]
    elapsed: float  # seconds from the clients' start to the final kill
    load_end: tuple[float, float, float]
    after: dict[str, Any] = field(default_factory=dict)
    crashes: list[dict[str, Any]] = field(default_factory=list)


def final_kill(load: Load, nodes: list[Node], load_end: tuple[float, float, float]) -> Ending:
    """kill -9 of every node with the clients still sending (whatever was acknowledged must
    survive), then the clients stopped."""
    for n in nodes:
        if n.up:
            n.note_peak()
    live = [n for n in nodes if n.up]
    with load.book.lock, load.tally.lock:
        load.tally.killed = True
        for n in live:
            n.proc.send_signal(signal.SIGKILL)
    for n in live:
        n.daemon.kill9()  # reaped (and its log closed)
    rc = {n.name: n.proc.returncode for n in live}
    acked = {n.name: load.book.snapshot(n.name) for n in live}
    if load.probe:
        with load.probe.lock:
            probes = {n.name: list(n.acked_probes) for n in nodes}
    else:
        probes = {n.name: [] for n in nodes}
    ending = Ending(live, rc, acked, probes, time.monotonic() - load.t0, load_end)
    load.stop.set()
    for w in load.threads():
        w.join(timeout=60)
    return ending


def check_after_kill(load: Load, ending: Ending) -> None:
    """The killed nodes restarted together (the fleet's peers come back at once), then
    each one's sessions and probes checked against what it had acknowledged."""
    for n in ending.live:
        n.start()
    for n in ending.live:
        ending.after[n.name] = {"rc": ending.rc[n.name],
                                **check_lost(n.target, ending.acked[n.name],
                                             functools.partial(load.book.excused, n.name)),
                                **check_probes(n, ending.probes[n.name])}


def final_sigterm(load: Load, ending: Ending) -> None:
    """SIGTERM of every restarted node: each must exit 0, and not hang."""
    for n in ending.live:
        n.proc.send_signal(signal.SIGTERM)
    ending.crashes = list(load.chaos.crashes)
    for n in ending.live:
        rc: int | str
        try:
            rc = n.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            n.daemon.kill9()
            rc = "hung"
        ending.after[n.name]["sigterm_rc"] = rc
        if rc != 0:
            ending.crashes.append({"node": n.name, "rc": rc, "what": "final SIGTERM",
                                   "log_tail": n.log_tail(1500)})


def soak(args: argparse.Namespace, nodes: list[Node], threads: int) -> dict[str, Any]:
    """The whole run, phase after phase; its report."""
    start_nodes(nodes)
    load = start_load(args, nodes)
    samples = Samples(nodes, load.t0, args.memory_interval)
    run_minutes(args, load, samples)
    ending = final_kill(load, nodes, wind_down(load, samples))
    check_after_kill(load, ending)
    final_sigterm(load, ending)
    return report(args, nodes, threads, load, samples, ending)
