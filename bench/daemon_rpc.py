"""The rpc benchmark: spider_dev agent turns replayed as an external verifier would.

    bench_rpc(clients, seconds, procs, turns_n, serve_args, modes, prompt_tokens=2048)
        one fresh daemon per mode ("unary", "step", "stream", "stream-deferred", each
        optionally "+keep"), one JSON line each
    proc_worker((target, turns, seconds, first, n_threads, start_at, mode))
        one client process: ``n_threads`` replaying clients numbered from ``first``,
        started together at ``start_at`` (time.time()); returns their latencies, accepted
        and proposed draft tokens and turns by client, and the process's "cpu_s"
        (fleet_bench runs it as its load)

What it measures is told in daemon_bench's docstring (``daemon_bench.py rpc``).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from daemon_harness import cpu_s, load_turns, pct, start_daemon

from suffixcache import common_prefix_length


def _stream_turn(st: Any, sid: str, prompt: list[int], resp: list[int], end: float,
                 spec_lat: list[float], app_lat: list[float]) -> tuple[int, int]:
    """One turn on the client's SpeculateStream (one per client for the whole run, switched
    to the turn's session): the first message appends the prompt and gets the first draft
    (its latency counts as a speculate's), then one message per step, the last one appending
    the end of the response without a draft. Returns (proposed, accepted)."""
    pc = time.perf_counter
    accepted = proposed = pos = 0
    st.use_session("bench", sid)
    t = pc()
    d = st.step(prompt, kind="prompt")
    spec_lat.append(pc() - t)
    while pos < len(resp) and time.time() < end:
        n = common_prefix_length(d.tokens, resp[pos:])
        proposed += len(d.tokens)
        accepted += n
        step = resp[pos: pos + n + 1]
        pos += len(step)
        final = pos >= len(resp)
        t = pc()
        d = st.step(step, final=final, draft=not final)
        (app_lat if final else spec_lat).append(pc() - t)
    return proposed, accepted


def _client_loop(target: str, turns: list[tuple[list[int], list[int]]], seconds: float,
                 idx: int, out: dict[str, Any], start_at: float, mode: str) -> None:
    from suffixd.client import Client

    mode, _, keep = mode.partition("+")  # "+keep": one session per client for the run
    combined = mode == "step"

    c = Client(target, retries=0, timeout=30)
    spec_lat: list[float] = []
    app_lat: list[float] = []
    accepted = proposed = 0
    rng = random.Random(idx)
    order = list(range(len(turns)))
    rng.shuffle(order)
    while time.time() < start_at:
        time.sleep(0.001)
    end = time.time() + seconds
    k = 0
    pc = time.perf_counter
    stepper = None
    while time.time() < end:
        prompt, resp = turns[order[k % len(order)]]
        k += 1
        if not keep or k == 1:
            sid = c.open_session("bench", f"c{idx}-{k}").session_id
        if mode.startswith("stream"):
            if stepper is None:
                stepper = c.stepper("bench", sid, max_tokens=16,
                                    defer_commit=mode == "stream-deferred")
            p, a = _stream_turn(stepper, sid, prompt, resp, end, spec_lat, app_lat)
            proposed += p
            accepted += a
            if not keep:
                c.close_session("bench", sid)
            continue
        c.append("bench", sid, prompt, kind="prompt")
        pos = 0
        t = pc()
        d = c.speculate("bench", sid, None, 16)
        spec_lat.append(pc() - t)
        while pos < len(resp) and time.time() < end:
            n = common_prefix_length(d.tokens, resp[pos:])
            proposed += len(d.tokens)
            accepted += n
            step = resp[pos: pos + n + 1]
            pos += len(step)
            final = pos >= len(resp)
            t = pc()
            if combined and not final:
                d = c.step("bench", sid, step, 16)  # append + next draft, one round trip
                spec_lat.append(pc() - t)
                continue
            c.append("bench", sid, step, kind="response" if final else "generated")
            app_lat.append(pc() - t)
            if not final:
                t = pc()
                d = c.speculate("bench", sid, None, 16)
                spec_lat.append(pc() - t)
        if not keep:
            c.close_session("bench", sid)
    if stepper is not None:
        stepper.close()
    if keep and k:
        c.close_session("bench", sid)
    c.close()
    out[str(idx)] = {"spec": spec_lat, "app": app_lat, "acc": accepted, "prop": proposed,
                     "sessions": k}


def proc_worker(args: tuple[str, list[Any], float, int, int, float, str]) -> dict[str, Any]:
    target, turns, seconds, first, n_threads, start_at, mode = args
    out: dict[str, Any] = {}
    threads = [threading.Thread(target=_client_loop,
                                args=(target, turns, seconds, first + i, out, start_at, mode))
               for i in range(n_threads)]
    c0 = time.process_time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out["cpu_s"] = time.process_time() - c0
    return out


def bench_rpc(clients: int, seconds: float, procs: int, turns_n: int, extra: list[str],
              modes: list[str], prompt_tokens: int = 2048) -> None:
    # Each turn's prompt is the last prompt_tokens tokens of its context (at most 2,048).
    turns = [(p[-prompt_tokens:], r) for p, r in load_turns("spider_dev", turns_n)]
    for mode in modes:
        _bench_rpc_mode(clients, seconds, procs, turns, extra, mode)


def _bench_rpc_mode(clients: int, seconds: float, procs: int,
                    turns: list[tuple[list[int], list[int]]], extra: list[str],
                    mode: str) -> None:
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data"
        daemon = start_daemon(data_dir, *extra)
        target = daemon.target
        try:
            # Warm the global tree with the workload's responses, as a long-running daemon has.
            from suffixd.client import Client

            c = Client(target)
            sid = c.open_session("bench", "warm").session_id
            c.append_batch([("bench", sid, "response", r) for _, r in turns])
            c.close_session("bench", sid)
            c.close()
            start_at = time.time() + 2.0
            per = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
            firsts = [sum(per[:i]) for i in range(procs)]
            ctx = mp.get_context("spawn")
            with ctx.Pool(procs) as pool:
                # The daemon's CPU over the whole run (client start-up and the drain
                # included, so a slight over-estimate per call).
                cpu0 = cpu_s(daemon.pid)
                parts = pool.map(proc_worker, [(target, turns, seconds, firsts[i], per[i],
                                                 start_at, mode) for i in range(procs)])
                server_cpu = cpu_s(daemon.pid) - cpu0
        finally:
            daemon.stop(60)
    client_cpu = sum(p.pop("cpu_s") for p in parts)
    spec = [x for p in parts for r in p.values() for x in r["spec"]]
    app = [x for p in parts for r in p.values() for x in r["app"]]
    acc = sum(r["acc"] for p in parts for r in p.values())
    prop = sum(r["prop"] for p in parts for r in p.values())
    sessions = sum(r["sessions"] for p in parts for r in p.values())
    # Unary calls per turn besides the steps: open, (prompt append,) close; "+keep": one
    # session per client, so only the prompt append of the unary modes.
    keep = mode.endswith("+keep")
    per_turn = (0 if keep else 2) if mode.startswith("stream") else (1 if keep else 3)
    print(json.dumps({
        "bench": "rpc", "mode": mode, "load_before": load_before,
        "clients": clients, "client_procs": procs, "seconds": seconds,
        "prompt_tokens_mean": round(statistics.fmean(len(p) for p, _ in turns), 1),
        "speculate_rpc_s": round(len(spec) / seconds, 1),
        "all_rpc_s": round((len(spec) + len(app) + per_turn * sessions) / seconds, 1),
        "turns_s": round(sessions / seconds, 1),
        "speculate_ms_p50": round(pct(spec, 0.5), 3), "speculate_ms_p99": round(pct(spec, 0.99), 3),
        "append_ms_p50": round(pct(app, 0.5), 3), "append_ms_p99": round(pct(app, 0.99), 3),
        "speculate_ms_mean": round(statistics.fmean(spec) * 1000, 3) if spec else None,
        "draft_tokens_accepted_per_step": round(acc / max(1, len(spec)), 3),
        "accept_rate": round(acc / max(1, prop), 3),
        "server_cpu_us_per_speculate": round(server_cpu / max(1, len(spec)) * 1e6, 1),
        "client_cpu_us_per_speculate": round(client_cpu / max(1, len(spec)) * 1e6, 1),
        "server_cpu_s": round(server_cpu, 2), "client_cpu_s": round(client_cpu, 2),
    }), flush=True)
