"""The soak's probes and checks: ``Probe`` (replication lag, a response written on one node
until the other drafts it), ``tree_sample`` (the global trees against their budgets), and
after a restart ``check_lost`` (acknowledged tokens) and ``check_probes`` (acknowledged
probes still drafted).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

from suffixd.client import Client, SuffixdError

from soak.books import Tally
from soak.nodes import Node

PROBE_NS = "soak-probe"
PROBE_CONTEXT = 12  # tokens of a probe given as the context; the rest must be drafted
PROBE_DEADLINE = 60.0  # seconds for a probe to be drafted by the other node


class Probe(threading.Thread):
    """Writes a unique response on one node and times until the other drafts it."""

    def __init__(self, nodes: list[Node], tally: Tally, stop: threading.Event,
                 interval: float) -> None:
        super().__init__(name="soak-probe", daemon=True)
        self.nodes = nodes
        self.tally = tally
        self.stop_event = stop
        self.interval = interval
        self.rng = random.Random(7)
        self.lags: list[float] = []
        self.never_seen: list[str] = []
        self.interrupted = 0  # a node stopped between the write and the draft
        self.sent = 0
        self.lock = threading.Lock()  # the nodes' acked_probes, read at the stops and kills
        self.clients: dict[str, tuple[int, Client]] = {}

    def client(self, node: Node) -> Client:
        epoch, c = self.clients.get(node.name, (-1, None))
        if c is None or epoch != node.epoch:
            if c is not None:
                c.close()
            c = Client(node.target, retries=0, timeout=60)
            self.clients[node.name] = (node.epoch, c)
        return c

    def run(self) -> None:
        vocab = self.client(self.nodes[0]).info()["vocab_size"]
        k = 0
        while not self.stop_event.wait(self.interval if k else 1.0):
            if not all(n.up for n in self.nodes):
                continue
            k += 1
            src, dst = (self.nodes[0], self.nodes[1]) if k % 2 else (self.nodes[1],
                                                                     self.nodes[0])
            marks = [n.mark() for n in (src, dst)]
            seq = [self.rng.randrange(1000, vocab - 1000) for _ in range(40)]
            t0 = time.perf_counter()
            try:
                with self.client(src).session(PROBE_NS) as s:
                    s.append(seq[:4], kind="prompt")
                    s.append(seq, kind="response")
            except SuffixdError as exc:
                self.tally.record("probe write", time.perf_counter() - t0, exc.code.name, False,
                                  src, marks[0], f"probe write on {src.name}: {exc}")
                continue
            written = time.perf_counter()
            self.tally.record("probe write", written - t0, "OK", False)
            with self.lock:
                src.acked_probes.append(seq)
            self.sent += 1
            seen = False
            while not self.stop_event.is_set() and time.perf_counter() - written < PROBE_DEADLINE:
                try:
                    got = list(self.client(dst).speculate(PROBE_NS, None, seq[:PROBE_CONTEXT],
                                                           8).tokens)
                except SuffixdError as exc:
                    self.tally.record("probe read", 0.0, exc.code.name, False, dst, marks[1],
                                      f"probe read on {dst.name}: {exc}")
                    break
                if len(got) >= 4 and got == seq[PROBE_CONTEXT:PROBE_CONTEXT + len(got)]:
                    seen = True
                    break
                time.sleep(0.01)
            if seen:
                self.lags.append(time.perf_counter() - written)
                with self.lock:
                    dst.acked_probes.append(seq)
            elif any(n.mark() != m for n, m in zip((src, dst), marks, strict=True)):
                self.interrupted += 1
            elif not self.stop_event.is_set() and not self.tally.killed:
                self.never_seen.append(f"{src.name}->{dst.name} #{k}")
        for _, c in self.clients.values():
            c.close()


def tree_sample(node: Node) -> tuple[int, int, int, list[str]]:
    """(global tree tokens, their evictions, open sessions) summed over the node's
    namespaces: whether the budgets are reached, beside the RSS; and every tree over its
    budget as the daemon states them (Stats.memory: each kind daemon-wide, and each
    namespace's global tree against the budget per tree)."""
    c = Client(node.target, retries=0, timeout=60)
    try:
        stats = c.stats(top_documents=0)
    except SuffixdError:
        return (-1, -1, -1, [])
    finally:
        c.close()
    nss = stats["namespaces"]
    over: list[str] = []
    per_tree = 0
    for m in stats.get("memory") or []:
        kind = m.get("kind", "?")
        for what in ("tokens", "bytes"):
            budget = int(m.get(f"budget_{what}", 0))
            if budget and int(m.get(what, 0)) > budget:
                over.append(f"{kind} trees: {m.get(what)} {what} > {budget}")
        if kind == "global":
            per_tree = int(m.get("budget_tokens_per_tree", 0))
    for e in nss:
        tokens = int(e["global"].get("tokens", 0))
        if per_tree and tokens > per_tree:
            over.append(f"global tree of {e.get('namespace', '?')}: {tokens} tokens > {per_tree}")
    return (sum(int(e["global"].get("tokens", 0)) for e in nss),
            sum(int(e["global"].get("evictions", 0)) for e in nss),
            sum(int(e.get("open_sessions", 0)) for e in nss), over)


def check_lost(target: str, acked: dict[tuple[str, str], int],
               excused: Callable[[], set[tuple[str, str]]]) -> dict[str, int]:
    """After a restart: every session a reply acknowledged, against what the store holds.
    A session absent is lost with all its acknowledged tokens, unless its client tried to
    close it (``excused``, read after the store: a close may follow the restart)."""
    c = Client(target, retries=10, timeout=60)
    c.wait_ready()
    stored = {(s.namespace, s.session_id): s.tokens for s in c.list_sessions()}
    c.close()
    closing = excused()
    lost = total = checked = missing = 0
    for key, n in acked.items():
        if key not in stored:
            if key in closing:
                continue
            missing += 1
        checked += 1
        total += n
        lost += max(0, n - stored.get(key, 0))
    return {"sessions_checked": checked, "acknowledged_tokens": total, "lost_tokens": lost,
            "sessions_missing": missing}


def check_probes(node: Node, probes: list[list[int]]) -> dict[str, Any]:
    """After a restart: the rebuild's time, and the acknowledged probes it no longer drafts."""
    c = Client(node.target, retries=10, timeout=60)
    c.wait_ready()
    t0 = time.monotonic()
    while c.info().get("rebuilding") and time.monotonic() - t0 < 600:
        time.sleep(0.2)
    rebuild_s = time.monotonic() - t0
    missing = 0
    for seq in probes:
        got = list(c.speculate(PROBE_NS, None, seq[:PROBE_CONTEXT], 8).tokens)
        if len(got) < 4 or got != seq[PROBE_CONTEXT:PROBE_CONTEXT + len(got)]:
            missing += 1
    rebuilding = bool(c.info().get("rebuilding"))
    c.close()
    return {"rebuild_wait_s": round(rebuild_s, 1), "rebuilding_after": rebuilding,
            "probes_checked": len(probes), "probes_missing": missing}
