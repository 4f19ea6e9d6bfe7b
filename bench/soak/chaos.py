"""The soak's stops and kills: ``make_schedule`` (SIGTERM or kill -9 of a node at random
moments) and ``Chaos`` (the thread that runs it, watches for exits nobody caused, restarts
each node at once, hits some restarts again while they start, and checks them).
"""

from __future__ import annotations

import argparse
import random
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any

from soak.books import Book, Tally
from soak.nodes import Node, NodeError, serving
from soak.probes import Probe, check_lost, check_probes

STOP_TIMEOUT = 120.0  # a SIGTERM'd node past this (grace 10 s + closing) has hung


@dataclass
class Event:
    at_s: float  # seconds after the clients started
    node: Node
    sig: signal.Signals


def make_schedule(args: argparse.Namespace, nodes: list[Node], first_s: float,
                  last_s: float) -> list[Event]:
    """Stops and kills at random moments in [first_s, last_s], about one per
    ``--events-every`` seconds; with two or more, at least one of each kind (unless the
    share says only one kind)."""
    if args.events_every <= 0 or last_s <= first_s:
        return []
    rng = random.Random(args.seed)
    n = max(1, round((last_s - first_s) / args.events_every))
    sigs = [signal.SIGTERM if rng.random() < args.sigterm_share else signal.SIGKILL
            for _ in range(n)]
    if n >= 2 and 0 < args.sigterm_share < 1:
        sigs[:2] = [signal.SIGTERM, signal.SIGKILL]
        rng.shuffle(sigs)
    times = sorted(rng.uniform(first_s, last_s) for _ in range(n))
    return [Event(t, rng.choice(nodes), s) for t, s in zip(times, sigs, strict=True)]


class Chaos(threading.Thread):
    """Runs the schedule of stops and kills, and watches for exits nobody caused. After
    each, the node is restarted at once and checked while the load goes on: the sessions'
    acknowledged tokens, then (its rebuild done) the probes it had acknowledged.
    ``early_share`` of the restarts are hit again (SIGTERM or kill -9) at a random moment of
    their first ``early_window`` seconds (the store opening, the trees loading, the fronts
    starting, the model loading for the first requests); the next restart's checks then
    cover both."""

    def __init__(self, nodes: list[Node], tally: Tally, book: Book, probe: Probe | None,
                 schedule: list[Event], t0: float, args: argparse.Namespace) -> None:
        super().__init__(name="soak-chaos", daemon=True)
        self.nodes = nodes
        self.tally = tally
        self.book = book
        self.probe = probe
        self.schedule = schedule
        self.t0 = t0
        self.rng = random.Random(args.seed * 7919 + 1)
        self.early_share = args.early_share
        self.early_window = args.early_window
        self.sigterm_share = args.sigterm_share
        self.stop_event = threading.Event()
        self.events: list[dict[str, Any]] = []
        self.crashes: list[dict[str, Any]] = []
        self.failures: list[str] = []  # a node that did not come back, a check that raised

    def run(self) -> None:
        try:
            for ev in self.schedule:
                while not self.stop_event.is_set() and time.monotonic() - self.t0 < ev.at_s:
                    self.watch()
                    self.stop_event.wait(0.5)
                if self.stop_event.is_set():
                    break
                self.watch()
                if ev.node.up:
                    self.stop(ev.node, ev.sig, "serving")
            while not self.stop_event.is_set():
                self.watch()
                self.stop_event.wait(0.5)
            self.watch()
        except NodeError as exc:
            self.failures.append(str(exc))

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 1)

    def down(self, node: Node) -> None:
        """From now on, calls to the node (and those in flight) are counted apart."""
        node.note_peak()
        with self.tally.lock:
            node.up = node.ready = False
            node.epoch += 1

    def crash(self, node: Node, rc: Any, what: str) -> None:
        self.crashes.append({"at_s": self.now(), "node": node.name, "rc": rc, "what": what,
                             "log_tail": node.log_tail(1500)})
        print(f"{self.now():>7} s  CRASH: node {node.name} rc {rc}: {what}", flush=True)

    def watch(self) -> None:
        for node in self.nodes:
            if node.up and node.proc.poll() is not None:
                rc = node.proc.returncode
                self.down(node)
                self.crash(node, rc, "exited by itself")
                self.recover(node, {"at_s": self.now(), "node": node.name, "signal": None,
                                    "phase": "serving", "rc": rc})

    def stop(self, node: Node, sig: signal.Signals, phase: str) -> None:
        ev: dict[str, Any] = {"at_s": self.now(), "node": node.name, "signal": sig.name,
                              "phase": phase, "pid": node.proc.pid}
        self.down(node)
        t = time.monotonic()
        if node.proc.poll() is not None:
            self.crash(node, node.proc.returncode, f"exited by itself ({phase})")
            ev["exited_before_signal"] = True
        node.proc.send_signal(sig)  # nothing once it is reaped
        try:
            rc = node.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            node.proc.kill()
            rc = node.proc.wait()
            ev["hung"] = True
        ev.update(rc=rc, exit_s=round(time.monotonic() - t, 2))
        want = 0 if sig == signal.SIGTERM else -signal.SIGKILL
        if not ev.get("exited_before_signal") and (rc != want or ev.get("hung")):
            self.crash(node, rc, f"after {sig.name} ({phase})"
                       + (f": hung {STOP_TIMEOUT:.0f} s" if ev.get("hung") else ""))
        self.recover(node, ev, early_ok=phase == "serving")

    def recover(self, node: Node, ev: dict[str, Any], early_ok: bool = True) -> None:
        self.events.append(ev)
        # What the ended process acknowledged: every reply it sent came before its exit.
        acked = self.book.snapshot(node.name)
        probes: list[list[int]] = []
        if self.probe is not None:
            with self.probe.lock:
                probes = list(node.acked_probes)
        t = time.monotonic()
        node.spawn()
        if early_ok and self.rng.random() < self.early_share:
            self.hit_early(node, ev)
            return
        node.wait_announced()
        with self.tally.lock:
            node.up = True
        ev["restart_s"] = round(time.monotonic() - t, 2)
        try:
            ev.update(check_lost(node.target, acked, lambda: self.book.excused(node.name)))
            serving(node)
            node.ready = True
            ev["ready_s"] = round(time.monotonic() - t, 2)
            ev.update(check_probes(node, probes))
        except Exception as exc:  # the node died meanwhile (watch() sees it), or a check broke
            ev["check_error"] = repr(exc)[:300]
            self.failures.append(f"checks after {ev.get('signal')} of {node.name}: {exc!r}")
        print(f"{ev['at_s']:>7} s  {ev.get('signal') or 'crash'} of {node.name} "
              f"({ev['phase']}): rc {ev.get('rc')} in {ev.get('exit_s', 0)} s, back in "
              f"{ev['restart_s']} s; {ev.get('lost_tokens', '?')} of "
              f"{ev.get('acknowledged_tokens', '?')} acknowledged tokens lost "
              f"({ev.get('sessions_checked', '?')} sessions, "
              f"{ev.get('sessions_missing', '?')} missing), "
              f"{ev.get('probes_missing', '?')}/{ev.get('probes_checked', '?')} probes missing",
              flush=True)

    def hit_early(self, node: Node, ev: dict[str, Any]) -> None:
        """Stop the restarting node again within its first seconds: from its "starting"
        line (its signal handler in place; before, Python's default is all there is) to a
        random moment of the window, letting the clients in once it announces itself."""
        ev["checked_by_next_event"] = True
        print(f"{ev['at_s']:>7} s  {ev.get('signal') or 'crash'} of {node.name} "
              f"({ev['phase']}): rc {ev.get('rc')} in {ev.get('exit_s', 0)} s; hit again "
              "while it starts", flush=True)
        deadline = time.monotonic() + 60
        while not node.logged_since_spawn("starting") and node.proc.poll() is None:
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        end = time.monotonic() + self.rng.uniform(0.0, self.early_window)
        while time.monotonic() < end and node.proc.poll() is None:
            if not node.up and node.announced():
                with self.tally.lock:
                    node.up = True
            time.sleep(0.02)
        sig = signal.SIGTERM if self.rng.random() < self.sigterm_share else signal.SIGKILL
        self.stop(node, sig, "start-up, serving" if node.up else "start-up")
