"""The soak's report: one JSON-ready dict of what the run served, refused, lost and
measured (``report``), each node's RSS over the run (``rss_of``) and whether it is flat at
the end (``flatness``), and whether the run passed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rss_watch import flat

from soak.books import percentile
from soak.nodes import Node

if TYPE_CHECKING:
    from soak.run import Ending, Load, Samples


def command_line() -> str:
    """The command as run, its script named (``soak`` for the package, run as
    ``python bench/soak`` or ``python -m soak``)."""
    script = Path(sys.argv[0])
    name = script.parent.name if script.name == "__main__.py" else script.name
    return " ".join([name, *sys.argv[1:]])


def rss_of(args: argparse.Namespace, samples: Samples, load: Load, i: int,
           node: Node) -> dict[str, Any]:
    """Node ``i``'s RSS samples, start, end, max and peak against the budget, and its
    growth over the second half of the run (within its last process's life)."""
    xs = [(s[0], s[1 + i] or None) for s in samples.rss]
    up = [(t, m) for t, m in xs if m is not None]
    # Growth over the last process's life, where it spans the second half of the run.
    restarts = [e["at_s"] for e in load.chaos.events if e["node"] == node.name]
    last = [(t, m) for t, m in up if not restarts or t > max(restarts)]
    half = next((m for t, m in last if t >= xs[-1][0] / 2), None)
    return {"start": up[0][1] if up else None, "end": up[-1][1] if up else None,
            "max": max((m for _, m in up), default=None), "peak_hwm": round(node.peak_mib),
            "budget": args.rss_budget_mib,
            "within_budget": node.peak_mib <= args.rss_budget_mib,
            "growth_second_half": (last[-1][1] - half) if last and half is not None
            else None,
            "restarted_at_s": restarts, "samples": xs}


def flatness(args: argparse.Namespace, nodes: list[Node],
             samples: Samples) -> tuple[dict[str, Any], list[str]]:
    """RSS flat at the end (the last --flat-window minutes, at most a third of the run):
    the verdict per node, and the failures when --require-flat."""
    window_s = min(args.flat_window * 60, samples.memory_end_s / 3)
    verdicts = {n.name: flat(samples.watch.of(n.name), samples.memory_end_s, window_s,
                             args.flat_mib, args.flat_pct / 100) for n in nodes}
    failures: list[str] = []
    if args.require_flat:
        failures += [f"node {name}: RSS not flat over the last {window_s / 60:.0f} min "
                     f"({v.get('growth_mib')} MiB > {v.get('limit_mib')})"
                     if v["flat"] is False else
                     f"node {name}: RSS flatness not judged ({v.get('why')})"
                     for name, v in verdicts.items() if not v["flat"]]
    return verdicts, failures


def report(args: argparse.Namespace, nodes: list[Node], threads: int, load: Load,
           samples: Samples, ending: Ending) -> dict[str, Any]:
    """The run's report; ``passed`` when nothing failed."""
    tally, chaos, probe, after = load.tally, load.chaos, load.probe, ending.after
    lags = probe.lags if probe else []
    never = probe.never_seen if probe else []
    unexpected = sum(tally.unexpected.values())
    lost_all = sum(a["lost_tokens"] for a in [*after.values(), *chaos.events]
                   if "lost_tokens" in a)
    missing_sessions = sum(a.get("sessions_missing", 0) for a in [*after.values(),
                                                                    *chaos.events])
    missing = sum(a.get("probes_missing", 0) for a in [*after.values(), *chaos.events])
    rss_report = {n.name: rss_of(args, samples, load, i, n) for i, n in enumerate(nodes)}
    over_rss = [n for n, r in rss_report.items() if not r["within_budget"]]
    failures = list(chaos.failures) + [f"node {n.name} down at the end" for n in nodes
                                       if n not in ending.live]
    verdicts, not_flat = flatness(args, nodes, samples)
    failures += not_flat
    return {
        "command": command_line(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "seconds": round(ending.elapsed, 1),
        "nodes": len(nodes), "threads_per_node": threads,
        "grpc_clients": args.clients, "http_clients": args.http_clients,
        "cpus": os.cpu_count(),
        "load_average_end": [round(x, 2) for x in ending.load_end],
        "requests_served": sum(tally.ok.values()),
        "served_by_call": dict(sorted(tally.ok.items())),
        "bad_inputs_refused": dict(sorted(tally.expected.items())),
        "bad_inputs_refused_total": sum(tally.expected.values()),
        "unexpected_errors": dict(tally.unexpected),
        "unexpected_total": unexpected,
        "unexpected_samples": tally.unexpected_samples[:10],
        "schema_answers": dict(sorted(tally.schema.items())),
        "stops_and_kills": [{k: v for k, v in e.items() if k != "log_tail"}
                            for e in chaos.events],
        "crashes": ending.crashes,
        "failures": failures,
        "in_flight_at_stops": dict(tally.at_stop),
        "in_flight_at_kill": dict(tally.at_kill),
        "rss_mib": rss_report,
        "memory": {"interval_s": args.memory_interval, "verdicts": verdicts,
                   "samples": {n.name: samples.watch.of(n.name) for n in nodes}},
        "global_tokens_evictions_open_sessions": samples.trees,
        "global_over_budget": samples.tree_over,
        "latency_ms": {rpc: {"n": len(v), "p50": round(1e3 * percentile(v, 0.5), 2),
                             "p99": round(1e3 * percentile(v, 0.99), 2)}
                       for rpc, v in sorted(tally.lat.items())},
        "replication": {"probes": probe.sent if probe else 0, "seen": len(lags),
                        "never_seen": never,
                        "interrupted_by_a_stop": probe.interrupted if probe else 0,
                        "lag_ms_p50": round(1e3 * percentile(lags, 0.5), 1),
                        "lag_ms_p99": round(1e3 * percentile(lags, 0.99), 1),
                        "lag_ms_max": round(1e3 * max(lags, default=0.0), 1)},
        "kill9": after,
        "passed": not (unexpected or lost_all or missing or never or ending.crashes
                       or failures or missing_sessions or over_rss or samples.tree_over),
    }
