"""The loop benchmark: the per-step cost alone, closed loop or open loop (``--rate``).

    bench_loop(clients, steps, modes, serve_args, seconds=0.0, procs=1, use_async=False,
               rate=0.0, poisson=False, samples_out=None)
        one fresh daemon per mode ("unary", "step", "stream", "stream-deferred"), one JSON
        line each; with ``rate`` and ``samples_out``, every step to
        ``<samples_out>.<mode>.jsonl``

What it measures is told in daemon_bench's docstring (``daemon_bench.py loop``).
"""

from __future__ import annotations

import gc
import json
import multiprocessing as mp
import os
import random
import statistics
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from daemon_harness import cpu_s, pct, start_daemon


class _Schedule:
    """When a client sends its steps. Closed loop (``period`` None): each step as soon as
    the previous reply came. Open loop: step k is due at ``phase + k * period`` after the
    common start (or at Poisson arrivals of that mean rate), whatever the replies do; a
    client whose previous reply is late sends at once, and the step's latency counts from
    when it was due, so a stalled daemon shows as latency instead of as fewer samples
    (no coordinated omission, as in wrk2)."""

    def __init__(self, period: float | None, phase: float, poisson: bool, seed: int) -> None:
        self.period = period
        self.phase = phase
        self.rng = random.Random(seed) if poisson else None

    def due(self, k: int, prev: float) -> float:
        """Seconds after the start at which step k is due (``prev``: step k-1's)."""
        assert self.period is not None
        if self.rng is not None:
            return (self.phase if k == 0 else prev) + self.rng.expovariate(1.0 / self.period)
        return self.phase + k * self.period

    def remaining(self, k: int, due: float, stop: float) -> int:
        """How many steps from step k (due ``due`` seconds after the start) on are due
        before ``stop``: the unsent rest of a client that fell hopelessly behind."""
        n = 0
        while due < stop:
            n += 1
            k += 1
            due = self.due(k, due)
        return n


class _Rec:
    """One client's samples: latency from the due time (open loop) or the send (closed),
    the service time (send to reply), the send's lag behind its due time, unsent steps."""

    __slots__ = ("lat", "svc", "lag", "due", "unsent")

    def __init__(self) -> None:
        self.due: list[float] = []  # open loop: each step's due time, seconds after start
        self.lat: list[float] = []
        self.svc: list[float] = []
        self.lag: list[float] = []
        self.unsent = 0

    def record(self, due: float, lat: float, svc: float, lag: float) -> None:
        self.due.append(due)
        self.lat.append(lat)
        self.svc.append(svc)
        self.lag.append(lag)


def _loop_sync(target: str, i: int, steps: float, mode: str, seconds: float, rec: _Rec,
               sched: _Schedule, ready: Callable[[], float]) -> None:
    from suffixd.client import Client

    c = Client(target, retries=0)
    base = list(range(1000, 1064))
    sid = c.open_session("loop", f"l{mode}{i}", tokens=base).session_id
    st = None
    if mode.startswith("stream"):
        st = c.stepper("loop", sid, max_tokens=16, defer_commit=mode == "stream-deferred")
        st.step()

    def one(j: int) -> None:
        if st is not None:
            st.step([base[j % 64]])
        elif mode == "step":
            c.step("loop", sid, [base[j % 64]], 16)
        else:
            c.speculate("loop", sid, None, 16)
            c.append("loop", sid, [base[j % 64]], kind="generated")

    start_at = ready()
    pc = time.perf_counter
    _wait_until(start_at)
    t0 = pc() - (time.time() - start_at)  # the common start on this clock
    stop = t0 + seconds if seconds else float("inf")
    j = 0
    if sched.period is None:
        while j < steps and pc() < stop:
            t = pc()
            one(j)
            rec.lat.append(pc() - t)
            j += 1
    else:
        hard = stop + _open_loop_grace(seconds)
        due = t0 + sched.due(0, 0.0)
        while due < stop:
            now = pc()
            if now >= hard:  # hopelessly behind: the rest of the schedule is unsent
                rec.unsent += sched.remaining(j, due - t0, stop - t0)
                break
            if due > now:
                time.sleep(due - now)
            t = pc()
            one(j)
            done = pc()
            rec.record(due - t0, done - due, done - t, t - due)
            j += 1
            due = t0 + sched.due(j, due - t0)
    if st is not None:
        st.close()
    c.close()


def _open_loop_grace(seconds: float) -> float:
    """How long past the schedule's end a lagging client may still send its due steps."""
    return max(2.0, 0.1 * seconds)


async def _loop_async(target: str, i: int, steps: float, mode: str, seconds: float, rec: _Rec,
                      sched: _Schedule, ready: Callable[[], Awaitable[float]]) -> None:
    import asyncio

    from suffixd.client import AsyncClient

    c = AsyncClient(target, retries=0)
    base = list(range(1000, 1064))
    sid = (await c.open_session("loop", f"l{mode}{i}", tokens=base)).session_id
    st = None
    if mode.startswith("stream"):
        st = c.stepper("loop", sid, max_tokens=16, defer_commit=mode == "stream-deferred")
        await st.step()

    async def one(j: int) -> None:
        if st is not None:
            await st.step([base[j % 64]])
        elif mode == "step":
            await c.step("loop", sid, [base[j % 64]], 16)
        else:
            await c.speculate("loop", sid, None, 16)
            await c.append("loop", sid, [base[j % 64]], kind="generated")

    start_at = await ready()
    pc = time.perf_counter
    await asyncio.sleep(max(0.0, start_at - time.time()))
    t0 = pc() - (time.time() - start_at)
    stop = t0 + seconds if seconds else float("inf")
    j = 0
    if sched.period is None:
        while j < steps and pc() < stop:
            t = pc()
            await one(j)
            rec.lat.append(pc() - t)
            j += 1
    else:
        hard = stop + _open_loop_grace(seconds)
        due = t0 + sched.due(0, 0.0)
        while due < stop:
            now = pc()
            if now >= hard:
                rec.unsent += sched.remaining(j, due - t0, stop - t0)
                break
            if due > now:
                # asyncio rounds a sleep up to the next millisecond (epoll's resolution):
                # such lateness shows in ``lag`` and counts in the latency from the due time.
                await asyncio.sleep(due - now)
            t = pc()
            await one(j)
            done = pc()
            rec.record(due - t0, done - due, done - t, t - due)
            j += 1
            due = t0 + sched.due(j, due - t0)
    if st is not None:
        await st.close()
    await c.close()


def _wait_until(t: float) -> None:
    while time.time() < t:
        time.sleep(0.001)


def _signal_ready_and_wait(sync_dir: str, k: int) -> float:
    """Client process ``k``: say that its clients have their sessions and streams open,
    then wait for the common start time, which the parent writes once every process is
    ready (a process still importing or connecting would otherwise start behind its
    schedule, and an open loop would count its catching up as latency).

    The process's start-up objects are frozen out of the garbage collector's reach first,
    as the daemon does with its own: a full collection walking all of them (tens of ms on
    this machine) would otherwise count as the daemon's latency."""
    gc.collect()
    gc.freeze()
    Path(sync_dir, f"ready.{k}").touch()
    go = Path(sync_dir, "go")
    while not go.exists():
        time.sleep(0.002)
    return float(go.read_text())


def _start_when_ready(sync_dir: str, procs: int, timeout: float = 300.0) -> float:
    """Parent: once every client process is ready, publish a start time shortly ahead."""
    t_end = time.time() + timeout
    while sum(1 for k in range(procs) if Path(sync_dir, f"ready.{k}").exists()) < procs:
        if time.time() > t_end:
            raise TimeoutError("the client processes did not get ready")
        time.sleep(0.005)
    start_at = time.time() + 0.3
    tmp = Path(sync_dir, "go.tmp")
    tmp.write_text(repr(start_at))
    os.replace(tmp, Path(sync_dir, "go"))
    return start_at


def _loop_proc(args: tuple[str, int, int, int, float, str, float, bool, float, int, bool, str]
               ) -> dict[str, Any]:
    """Client process ``k``: ``n`` clients (threads, or asyncio tasks on one loop)."""
    (target, k, first, n, steps, mode, seconds, use_async, rate, clients, poisson,
     sync_dir) = args
    recs = [_Rec() for _ in range(n)]
    # Open loop: the aggregate rate spread evenly over all clients, their phases staggered
    # so that the daemon sees evenly spaced arrivals (or independent Poisson streams).
    period = clients / rate if rate else None
    scheds = [_Schedule(period, (first + j) * (period or 0.0) / clients, poisson, first + j)
              for j in range(n)]
    c0 = time.process_time()
    if use_async:
        import asyncio

        async def all_clients() -> None:
            waiting = 0
            go = asyncio.Event()
            start: list[float] = []

            async def ready() -> float:
                nonlocal waiting
                waiting += 1
                if waiting == n:
                    start.append(await asyncio.to_thread(_signal_ready_and_wait, sync_dir, k))
                    go.set()
                await go.wait()
                return start[0]

            await asyncio.gather(*(_loop_async(target, first + j, steps, mode, seconds,
                                               recs[j], scheds[j], ready) for j in range(n)))

        asyncio.run(all_clients())
    else:
        start: list[float] = []
        barrier = threading.Barrier(
            n, action=lambda: start.append(_signal_ready_and_wait(sync_dir, k)))

        def ready() -> float:
            barrier.wait()
            return start[0]

        threads = [threading.Thread(target=_loop_sync, args=(target, first + j, steps, mode,
                                                             seconds, recs[j], scheds[j], ready))
                   for j in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return {"lat": [x for r in recs for x in r.lat], "svc": [x for r in recs for x in r.svc],
            "lag": [x for r in recs for x in r.lag], "unsent": sum(r.unsent for r in recs),
            # Open loop only (closed-loop steps have no due time).
            "samples": [[first + j, d, x, v] for j, r in enumerate(recs)
                        for d, x, v in zip(r.due, r.lat, r.svc, strict=False)],
            "cpu_s": time.process_time() - c0, "done": time.time()}


def bench_loop(clients: int, steps: int, modes: list[str], extra: list[str],
               seconds: float = 0.0, procs: int = 1, use_async: bool = False,
               rate: float = 0.0, poisson: bool = False, samples_out: str | None = None) -> None:
    if rate and not seconds:
        raise SystemExit("--rate needs --seconds (the schedule's length)")
    for mode in modes:
        load_before = os.getloadavg()[0]
        per = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
        with tempfile.TemporaryDirectory() as tmp:
            daemon = start_daemon(Path(tmp) / "data", *extra)
            target = daemon.target
            sync_dir = Path(tmp) / "sync"
            sync_dir.mkdir()
            try:
                # Every client opens its session and stream first; steps start together.
                n_steps = float("inf") if seconds else float(steps)
                ctx = mp.get_context("spawn")
                with ctx.Pool(procs) as pool:
                    res = pool.map_async(_loop_proc, [
                        (target, k, sum(per[:k]), per[k], n_steps, mode, seconds, use_async,
                         rate, clients, poisson, str(sync_dir))
                        for k in range(procs)])
                    start_at = _start_when_ready(str(sync_dir), procs)
                    _wait_until(start_at)
                    s0 = cpu_s(daemon.pid)
                    parts = res.get()
                    server = cpu_s(daemon.pid) - s0
            finally:
                daemon.stop(60)
        lat = [x for p in parts for x in p["lat"]]
        wall = max(p["done"] for p in parts) - start_at
        if samples_out and rate:
            # One line per step: client, due (s after the start), latency and service (s).
            with open(f"{samples_out}.{mode}.jsonl", "w") as f:
                for p in parts:
                    for row in p["samples"]:
                        f.write(json.dumps(row) + "\n")
        n = len(lat)
        # Client CPU includes start-up (imports, channels): a slight over-estimate per step.
        client = sum(p["cpu_s"] for p in parts)
        out: dict[str, Any] = {
            "bench": "loop", "mode": mode, "clients": clients, "client_procs": procs,
            "client": "async" if use_async else "threads",
            "loop": "open" if rate else "closed",
            "steps": n, "seconds": round(wall, 2), "load_before": load_before,
            "steps_s": round(n / wall),
            "step_ms_p50": round(pct(lat, 0.5), 3), "step_ms_p99": round(pct(lat, 0.99), 3),
            "step_ms_p999": round(pct(lat, 0.999), 3),
            "step_ms_mean": round(statistics.fmean(lat) * 1000, 3) if lat else None,
            "server_cpu_us_per_step": round(server / max(1, n) * 1e6, 1),
            "client_cpu_us_per_step": round(client / max(1, n) * 1e6, 1),
        }
        if rate:
            # The step_ms_* figures count from each step's due time; "service" from its
            # actual send; "lag" is how late the sends were against the schedule.
            svc = [x for p in parts for x in p["svc"]]
            lag = [x for p in parts for x in p["lag"]]
            unsent = sum(p["unsent"] for p in parts)
            out.update({
                "target_steps_s": rate, "arrivals": "poisson" if poisson else "uniform",
                "achieved_steps_s": round(n / seconds),
                "unsent": unsent,
                "service_ms_p50": round(pct(svc, 0.5), 3),
                "service_ms_p99": round(pct(svc, 0.99), 3),
                "lag_ms_p50": round(pct(lag, 0.5), 3), "lag_ms_p99": round(pct(lag, 0.99), 3),
                "lag_ms_max": round(max(lag) * 1000, 3) if lag else None,
                "late_over_1ms": round(sum(1 for x in lag if x > 1e-3) / max(1, len(lag)), 4),
                "finished_after_s": round(wall - seconds, 3),
            })
        print(json.dumps(out), flush=True)
