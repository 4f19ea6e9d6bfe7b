"""Fleet benchmarks: replication lag under load, catch-up speed, the replay protocol over 3 nodes.

    python bench/fleet_bench.py lag --clients 16 --seconds 20
    python bench/fleet_bench.py catchup --tokens 2000000
    python bench/fleet_bench.py replay --workload spider_dev [--workload swe_django]

Each starts its own redis-server (loopback, no persistence) and prints one JSON object per
result.

lag: daemons a and b (real ``suffixd serve --fleet``, embedded gemma tokenizer, fsync'd
LMDB); the daemon bench's rpc load (``daemon_bench.py rpc``, mode ``unary``: 16 clients
replaying spider_dev turns, Speculate + durable Append per step, each turn ending in a
response) runs on a only; b applies a's responses. Reported: b's replication lag per
entry (a's commit to b's apply, same clock), p50/p99 over the last 4,096 entries, and the
load's own figures.

catchup: a ingests the workloads' responses (durable AppendBatch, as
``daemon_bench.py restart`` does: that is the single-node warm rate); then a new node c
joins and applies them from the stream. Reported: both rates in tokens/s.

replay: the replay protocol (``suffixcache.replay``) with the workload's sessions dealt
round-robin to 3 in-process engines (LMDB without fsync): with the fleet (each turn's
response reaches the other nodes before the next session starts on them: requests arrive
slower than the ~10 ms replication lag) and without it (three separate caches), beside
one node. Reported: tokens per step and the CPU cost profile's speed-up of each.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from daemon_durability import ingest  # noqa: E402
from daemon_harness import (  # noqa: E402
    DATA,
    load_responses,
    load_turns,
    start_daemon,
)
from daemon_rpc import proc_worker  # noqa: E402
from suffixd.client.launch import RedisServer  # noqa: E402


def start_redis(workdir: Path) -> RedisServer:
    """A redis-server on a free loopback port, without persistence, answering; exits with
    a message (not a traceback) when it is not installed."""
    try:
        return RedisServer(workdir).start()
    except FileNotFoundError as exc:
        raise SystemExit(str(exc)) from None


def _fleet_status(target: str) -> dict[str, Any]:
    from suffixd.client import Client

    c = Client(target)
    try:
        node: dict[str, Any] = json.loads(c.stats()["fleet_json"] or "{}").get("node", {})
        return node
    finally:
        c.close()


def _global_tokens(target: str, ns: str) -> int:
    from suffixd.client import Client

    c = Client(target)
    try:
        for e in c.stats(namespace=ns)["namespaces"]:
            return int(e["global"]["tokens"])
        return 0
    finally:
        c.close()


def bench_lag(clients: int, seconds: float, procs: int) -> None:
    import multiprocessing as mp

    turns = load_turns("spider_dev", 400)
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        r = start_redis(Path(tmp))
        pa = start_daemon(Path(tmp) / "a", "--fleet", r.url, "--node-id", "a")
        pb = start_daemon(Path(tmp) / "b", "--fleet", r.url, "--node-id", "b")
        ta, tb = pa.target, pb.target
        try:
            start_at = time.time() + 2.0
            per = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
            firsts = [sum(per[:i]) for i in range(procs)]
            with mp.get_context("spawn").Pool(procs) as pool:
                outs = pool.map(proc_worker, [(ta, turns, seconds, firsts[i], per[i],
                                                start_at, "unary") for i in range(procs)])
            time.sleep(1.5)  # the last entries and a heartbeat
            sb = _fleet_status(tb)
            sa = _fleet_status(ta)
            per_client = [v for o in outs for k, v in o.items() if k != "cpu_s"]
            spec = sum(len(v["spec"]) for v in per_client)
            sessions = sum(v["sessions"] for v in per_client)
            print(json.dumps({
                "bench": "fleet-lag", "clients": clients, "seconds": seconds,
                "speculate_rpc_s": round(spec / seconds), "turns": sessions,
                "published_by_a": sa.get("published"), "applied_by_b": sb.get("applied"),
                "lag_p50_ms": sb.get("apply_lag_p50_ms"), "lag_p99_ms": sb.get("apply_lag_p99_ms"),
                "b_lag_entries_after": sb.get("lag_entries"), "a_backlog_after": sa.get("backlog"),
                "a_global_tokens": _global_tokens(ta, "bench"),
                "b_global_tokens": _global_tokens(tb, "bench"),
                "load_before": round(load0, 2), "load_after": round(os.getloadavg()[0], 2),
            }))
        finally:
            pa.stop(60)
            pb.stop(60)
            r.stop()


def bench_catchup(tokens: int, batch_tokens: int) -> None:
    responses = load_responses(["swe_django", "spider_dev"])
    seqs: list[list[int]] = []
    total = 0
    while total < tokens:
        for resp in responses:
            resp = resp[: tokens - total]
            seqs.append(resp)
            total += len(resp)
            if total >= tokens:
                break
    budget = str(int(total * 1.2))
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        r = start_redis(Path(tmp))
        pa = start_daemon(Path(tmp) / "a", "--fleet", r.url, "--node-id", "a",
                          "--global-budget-tokens", budget)
        ta = pa.target
        try:
            n, dt = ingest(ta, seqs, batch_tokens)
            want = _global_tokens(ta, "restart")
            while _fleet_status(ta).get("backlog", 1):
                time.sleep(0.05)
            t0 = time.perf_counter()
            pc = start_daemon(Path(tmp) / "c", "--fleet", r.url, "--node-id", "c",
                              "--global-budget-tokens", budget)
            tc, started = pc.target, pc.started_s
            t1 = time.perf_counter()
            while _global_tokens(tc, "restart") < want:
                time.sleep(0.02)
            t2 = time.perf_counter()
            got = _global_tokens(tc, "restart")
            pc.stop(60)
            print(json.dumps({
                "bench": "fleet-catchup", "tokens": n, "sequences": len(seqs),
                "single_node_warm_tok_s": round(n / dt), "warm_batch_tokens": batch_tokens,
                "catchup_tok_s": round(want / (t2 - t1)),
                "catchup_s_after_serving": round(t2 - t1, 2),
                "catchup_s_with_start": round(t2 - t0, 2), "start_s": round(started, 2),
                "a_global_tokens": want, "c_global_tokens": got,
                "load_before": round(load0, 2), "load_after": round(os.getloadavg()[0], 2),
            }))
        finally:
            pa.stop(60)
            r.stop()


class _EngineSource:
    """The replay's DraftSource over engines; session k goes to engine k % len(engines)."""

    name = "suffixd"

    def __init__(self, engines: Sequence[Any], fleets: Sequence[Any] | None) -> None:
        self.engines = list(engines)
        self.fleets = fleets
        self.where: dict[str, Any] = {}
        self.n = 0
        self.ns = "replay"
        self.expected = [0] * len(self.engines)
        self._last: Any = self.engines[0]

    def begin_session(self, key: str) -> None:
        i = self.n % len(self.engines)
        self.n += 1
        self.where[key] = (i, self.engines[i])
        self.engines[i].open_session(self.ns, key)

    def append(self, key: str, tokens: Sequence[int], *, generated: bool) -> None:
        self.where[key][1].append(self.ns, key, "generated" if generated else "prompt",
                                  list(tokens))

    def propose(self, key: str, context: list[int], max_tokens: int) -> Any:
        self._last = self.where[key][1]
        return self._last.drafter.propose(self.ns, key, context, max_tokens)

    def observe(self, draft: Any, accepted: int, accepted_tokens: Sequence[int]) -> None:
        # Calibration is per node: each node learns from its own sessions' steps (the
        # replay observes right after the propose).
        self._last.drafter.observe(draft, accepted, accepted_tokens)

    def end_turn(self, key: str, response: Sequence[int]) -> None:
        i, e = self.where[key]
        e.append(self.ns, key, "response", [])
        if self.fleets:
            for j in range(len(self.fleets)):
                if j != i:
                    self.expected[j] += 1
            deadline = time.monotonic() + 30
            while any(f.applied < self.expected[j] for j, f in enumerate(self.fleets)):
                if time.monotonic() > deadline:
                    raise TimeoutError("replication stalled")
                time.sleep(0.0005)

    def end_session(self, key: str) -> None:
        self.where.pop(key)[1].close_session(self.ns, key)

    def memory(self) -> dict[str, int]:
        return {}


def bench_replay(workloads: list[str], nodes: int) -> None:
    from suffixd.benchkit.workloads import tokenized_workload
    from suffixd.daemon.common.config import CacheConfig
    from suffixd.daemon.engine import Engine
    from suffixd.daemon.fleet.config import FleetConfig
    from suffixd.daemon.fleet.node import Fleet

    from suffixcache.cost import CostProfile
    from suffixcache.drafter import DraftConfig, Drafter
    from suffixcache.replay import replay

    profile = CostProfile.cpu_default()
    for w in workloads:
        sessions = tokenized_workload(DATA / "workloads" / f"{w}.jsonl", None, None)
        row: dict[str, Any] = {"bench": "fleet-replay", "workload": w, "nodes": nodes}
        for mode in ("single", "fleet", "separate"):
            with tempfile.TemporaryDirectory() as tmp:
                r = start_redis(Path(tmp)) if mode == "fleet" else None
                n = 1 if mode == "single" else nodes
                engines = [Engine(Path(tmp) / f"e{i}", sync=False,
                                  cache_config=CacheConfig(global_budget_tokens=50_000_000))
                           for i in range(n)]
                for e in engines:  # as `suffixd bench replay` drafts
                    e.drafter = Drafter(e.cache, DraftConfig(max_tokens=32), profile)
                fleets = None
                if r is not None:
                    fleets = [Fleet(e, FleetConfig(r.url, f"n{i}")) for i, e in
                              enumerate(engines)]
                    for f in fleets:
                        f.start()
                src = _EngineSource(engines, fleets)
                t0 = time.perf_counter()
                res = replay(sessions, src, profile, max_spec=32).figures()
                dt = time.perf_counter() - t0
                for e in engines:
                    e.close()
                if r is not None:
                    r.stop()
            row[mode] = {"tokens_per_step": round(float(res["tokens_per_step"]), 4),
                         "cpu_model_speedup": round(float(res["cpu_model_speedup"]), 4),
                         "seconds": round(dt, 1)}
        s = row["single"]
        for mode in ("fleet", "separate"):
            row[mode]["vs_single_tokens_per_step"] = round(
                row[mode]["tokens_per_step"] / s["tokens_per_step"], 4)
            row[mode]["vs_single_speedup"] = round(
                row[mode]["cpu_model_speedup"] / s["cpu_model_speedup"], 4)
        print(json.dumps(row), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    lag = sub.add_parser("lag")
    lag.add_argument("--clients", type=int, default=16)
    lag.add_argument("--seconds", type=float, default=20)
    lag.add_argument("--procs", type=int, default=2)
    cu = sub.add_parser("catchup")
    cu.add_argument("--tokens", type=int, default=2_000_000)
    cu.add_argument("--batch-tokens", type=int, default=65_536)
    rp = sub.add_parser("replay")
    rp.add_argument("--workload", action="append", default=[])
    rp.add_argument("--nodes", type=int, default=3)
    a = ap.parse_args()
    if a.cmd == "lag":
        bench_lag(a.clients, a.seconds, a.procs)
    elif a.cmd == "catchup":
        bench_catchup(a.tokens, a.batch_tokens)
    else:
        bench_replay(a.workload or ["spider_dev", "swe_django"], a.nodes)


if __name__ == "__main__":
    threading.current_thread().name = "fleet-bench"
    main()
