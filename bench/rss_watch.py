"""The daemons' memory over a soak: RSS and its parts sampled every few seconds, and
whether RSS is flat at the end (bench/soak/, ``--memory-interval``).

Each sample asks a node's first Stats page for its process memory (Stats'
``process_memory_json``: RSS split into model weights, libraries, llama.cpp's context,
the prompt cache, the trees, malloc in use, malloc's free memory held, stacks and what is
left unattributed; daemon/common/process_memory.py), and reads the process's VmRSS from
/proc beside it (which answers even when the daemon is too busy to).

The flatness rule (``flat``): over the samples of the last ``window_s`` seconds of the
run taken from one and the same process (a node restarted inside the window cannot be
judged: "restarted"), fit RSS against time by least squares; the growth is the fitted
slope times the window's length. RSS is flat when that growth is at most the larger of
``abs_mib`` (16 MiB) and ``rel`` (2%) of the window's mean RSS. The slope, not the last
sample less the first, because the allocator swings RSS by tens of MiB from one minute
to the next (BENCHMARKS.md, the hour-long soak: +-50 MiB) while a leak is a trend.
The same rule is applied to each part, to say which one grew.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from suffixd.client import Client, SuffixdError

MIB = 1 << 20
PART_NAMES = ("model_weights", "store", "libraries", "llama_context", "prompt_cache", "trees",
              "malloc_in_use", "malloc_free", "stacks", "unattributed")


def vm_rss_mib(pid: int) -> float:
    """VmRSS of a process in MiB; 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def process_memory(target: str, timeout: float = 30.0) -> dict[str, Any] | None:
    """A daemon's process memory (Stats' first page), or None when it does not answer."""
    from suffixd.v1 import suffixd_pb2 as pb

    c = Client(target, retries=0, timeout=timeout)
    try:
        resp = c.call(c.stub.Stats, pb.StatsRequest(page_size=1, top_documents=1))
    except SuffixdError:
        return None
    finally:
        c.close()
    text = getattr(resp, "process_memory_json", "")
    if not text:
        return None
    out: dict[str, Any] = json.loads(text)
    # the trees by kind: which of them a growing ``trees`` part is
    out["trees_by_kind"] = {m.kind: {"trees": m.trees, "tokens": m.tokens, "bytes": m.bytes}
                            for m in resp.memory}
    return out


def sample_node(name: str, pid: int, target: str, t: float) -> dict[str, Any]:
    """One sample of a node at ``t`` seconds of the run (MiB, one decimal)."""
    pm = process_memory(target)
    out: dict[str, Any] = {"t": round(t, 1), "node": name, "pid": pid,
                           "vm_rss": round(vm_rss_mib(pid), 1)}
    if pm and "parts" in pm:
        out["rss"] = round(pm["rss"] / MIB, 1)
        out["parts"] = {k: round(v / MIB, 1) for k, v in pm["parts"].items()}
        malloc = pm.get("malloc") or {}
        out["malloc"] = {k: round(malloc[k] / MIB, 1) for k in
                         ("arena", "uordblks", "fordblks", "hblkhd") if k in malloc}
        out["llama_buffers"] = {k: round(v / MIB, 1)
                                for k, v in (pm.get("llama_buffers") or {}).items()}
        out["trees_by_kind"] = {k: {"trees": v["trees"], "tokens": v["tokens"],
                                    "mib": round(v["bytes"] / MIB, 1)}
                                for k, v in (pm.get("trees_by_kind") or {}).items()}
        if "malloc_trim" in pm:  # what trimming cost so far (daemon/server/malloc_tuning.py)
            out["malloc_trim"] = pm["malloc_trim"]
    return out


class MemoryWatch(threading.Thread):
    """Samples every node every ``interval_s`` seconds until ``stop`` is set.
    ``nodes()``: (name, pid, gRPC target) of each node up now."""

    def __init__(self, nodes: Callable[[], list[tuple[str, int, str]]], interval_s: float,
                 t0: float, stop: threading.Event) -> None:
        super().__init__(name="soak-memory", daemon=True)
        self.nodes = nodes
        self.interval_s = interval_s
        self.t0 = t0
        self.stop_event = stop
        self.samples: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def run(self) -> None:
        next_at = time.monotonic()
        while not self.stop_event.is_set():
            for name, pid, target in self.nodes():
                s = sample_node(name, pid, target, time.monotonic() - self.t0)
                with self.lock:
                    self.samples.append(s)
            next_at += self.interval_s
            self.stop_event.wait(max(0.0, next_at - time.monotonic()))

    def of(self, node: str) -> list[dict[str, Any]]:
        with self.lock:
            return [s for s in self.samples if s["node"] == node]


def slope(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of y over x (0 with fewer than two distinct x)."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in points) / sxx


def flat(samples: Sequence[dict[str, Any]], end_s: float, window_s: float,
         abs_mib: float = 16.0, rel: float = 0.02) -> dict[str, Any]:
    """The verdict on one node's samples (see the module docstring): ``flat`` True/False,
    or None with ``why`` when the window cannot be judged."""
    start = end_s - window_s
    if not samples:
        return {"flat": None, "why": "no samples"}
    last_pid = samples[-1]["pid"]
    if any(s["pid"] != last_pid for s in samples if s["t"] >= start):
        return {"flat": None, "why": "restarted within the window"}
    inside = [s for s in samples if s["t"] >= start and s.get("rss")]
    if len(inside) < 3 or inside[-1]["t"] - inside[0]["t"] < window_s / 2:
        return {"flat": None, "why": f"{len(inside)} samples in the window"}
    span = window_s
    pts = [(s["t"], s["rss"]) for s in inside]
    growth = slope(pts) * span
    mean = sum(y for _, y in pts) / len(pts)
    limit = max(abs_mib, rel * mean)
    parts = {p: round(slope([(s["t"], s["parts"].get(p, 0.0)) for s in inside]) * span, 1)
             for p in PART_NAMES if all("parts" in s for s in inside)}
    vm = [(s["t"], s["vm_rss"]) for s in inside if s.get("vm_rss")]
    return {
        "flat": growth <= limit,
        "window_s": round(window_s), "samples": len(inside),
        "from_s": inside[0]["t"], "to_s": inside[-1]["t"],
        "rss_first": inside[0]["rss"], "rss_last": inside[-1]["rss"],
        "rss_min": min(y for _, y in pts), "rss_max": max(y for _, y in pts),
        "rss_mean": round(mean, 1),
        "growth_mib": round(growth, 1), "limit_mib": round(limit, 1),
        "vm_rss_growth_mib": round(slope(vm) * span, 1) if len(vm) >= 2 else None,
        "growth_by_part_mib": parts,
        "trees_growth_by_kind_mib": {
            k: round(slope([(s["t"], s["trees_by_kind"].get(k, {}).get("mib", 0.0))
                            for s in inside]) * span, 1)
            for k in sorted({k for s in inside for k in s.get("trees_by_kind") or {}})},
        "rule": f"least-squares RSS slope x {round(window_s / 60, 1):g} min <= "
                f"max({abs_mib:g} MiB, {100 * rel:g}% of the window's mean RSS)",
    }


def markdown(report: dict[str, Any]) -> str:
    """The memory part of a soak's report as markdown: the verdict per node, then every
    sample (MiB)."""
    out = [f"# Soak memory: {report.get('command', '')}", "",
           f"{report.get('date', '')}, {report.get('seconds', 0) / 60:.0f} min, "
           f"samples every {report.get('interval_s', 0):g} s", ""]
    for node, v in (report.get("verdicts") or {}).items():
        if v.get("flat") is None:
            out.append(f"* node {node}: not judged ({v.get('why')})")
            continue
        grew = ", ".join(f"{p} {g:+.1f}" for p, g in v["growth_by_part_mib"].items() if g)
        out.append(
            f"* node {node}: **{'flat' if v['flat'] else 'NOT flat'}** over the last "
            f"{round(v['window_s'] / 60, 1):g} min ({v['samples']} samples): RSS "
            f"{v['rss_first']:.0f} -> {v['rss_last']:.0f} MiB (range {v['rss_min']:.0f}-"
            f"{v['rss_max']:.0f}), trend "
            f"{v['growth_mib']:+.1f} MiB against a limit of {v['limit_mib']:.1f}; by part: "
            f"{grew or 'none'}"
            + ("; trees by kind: " + ", ".join(
                f"{k} {g:+.1f}" for k, g in v["trees_growth_by_kind_mib"].items())
               if v.get("trees_growth_by_kind_mib") else ""))
    for node, samples in (report.get("samples") or {}).items():
        trim = next((s["malloc_trim"] for s in reversed(samples) if "malloc_trim" in s), None)
        if trim and trim.get("trims"):
            out.append(f"* node {node}: malloc_trim every {trim['interval_s']:g} s, "
                       f"{trim['trims']} trims, {trim['seconds']:.1f} s in all "
                       f"({1e3 * trim['seconds'] / trim['trims']:.1f} ms each)")
    rule = next((v["rule"] for v in (report.get("verdicts") or {}).values() if "rule" in v), "")
    if rule:
        out += ["", f"Rule: {rule}."]
    for node, samples in (report.get("samples") or {}).items():
        out += ["", f"## node {node} (MiB)", "",
                "| min | pid | RSS | " + " | ".join(p.replace("_", " ") for p in PART_NAMES)
                + " | malloc arenas | malloc mmapped |",
                "|" + " --- |" * (len(PART_NAMES) + 5)]
        for s in samples:
            parts = s.get("parts") or {}
            m = s.get("malloc") or {}
            out.append(
                f"| {s['t'] / 60:.1f} | {s['pid']} | {s.get('rss', s['vm_rss']):.0f} | "
                + " | ".join(f"{parts.get(p, 0):.0f}" for p in PART_NAMES)
                + f" | {m.get('arena', 0):.0f} | {m.get('hblkhd', 0):.0f} |")
    return "\n".join(out) + "\n"
