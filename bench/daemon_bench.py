"""Daemon benchmarks: RPC throughput, restart time, durable ingest rate, kill -9 crash test.

    python bench/daemon_bench.py rpc --clients 16 --seconds 30 [--procs 4]
    python bench/daemon_bench.py rpc --mode unary --mode stream --mode stream-deferred
    python bench/daemon_bench.py loop --clients 8 --steps 500 --mode stream
    python bench/daemon_bench.py loop --clients 16 --seconds 30 --procs 2 --async --mode stream
    python bench/daemon_bench.py loop --clients 16 --seconds 30 --procs 2 --async --rate 3000
    python bench/daemon_bench.py restart --tokens 5000000
    python bench/daemon_bench.py crash --rounds 3

Each starts a real `suffixd serve` subprocess on a temporary data dir (Unix socket, real
LMDB with fsync, embedded gemma tokenizer) and prints one JSON object per result.

rpc: each client replays spider_dev agent turns (tokenized with the daemon's vocabulary) as
an external verifier would: open a session, append the prompt, then per step Speculate on
the session's tail and Append (kind generated) the accepted tokens plus one bonus token, so
every Append is durable. Reported: speculate RPC/s, all RPC/s, p50/p99 latency per method,
and the daemon's CPU time per speculate (from /proc). Modes (one fresh daemon each, run one
after the other so they compare side by side):

* ``unary``: Speculate + Append RPCs per step;
* ``step``: one Speculate RPC carrying the append per step;
* ``stream``: one SpeculateStream per session (Client.stepper), one message per step, each
  step's append committed before its reply;
* ``stream-deferred``: the same with defer_commit (replies do not wait for the fsync; the
  final response append still does).

loop: the per-step cost alone. Each client opens one session with 64 tokens and runs
``--steps`` steps (or ``--seconds``) of one token (cycling through those 64, so drafts
match), all starting together: steps/s, step latency (p50/p99/mean: a step is one stream
message, one Speculate carrying the append, or Speculate + Append), and the client's and
the daemon's CPU time per step. No prompts, no session churn. Clients are threads in
``--procs`` processes (default 1), or with ``--async`` AsyncClient tasks on one event loop
per process (the client side of a 2-core machine shares the cores with the daemon).

That is a closed loop: 16 clients with no think time keep 16 steps in flight, so at X
steps/s their mean latency is 16/X (Little's law): it measures capacity, and its latency
is tied to it. ``--rate R`` runs an open loop instead: the aggregate R steps/s spread
evenly over the clients (``--poisson``: Poisson arrivals), each client sending its steps
when they are due whatever the daemon does, one at a time on its stream (a verifier
cannot send a step before the previous draft came back), so a client whose previous reply
is late sends at once. Latency counts from the due time, so a stalled daemon shows in the
percentiles instead of in fewer samples (no coordinated omission); also reported: the
achieved rate, the service time (send to reply), how late the sends were against their
schedule, and the steps still unsent when the schedule ended plus a grace period.

``--keep-session``: each client keeps one session for the whole run (an agent's
conversation: per turn append the prompt, decode the response) instead of opening and
closing a session per turn. ``--prompt-tokens N``: prompts of at most N tokens (default
2,048), so the per-step loop rather than ingesting prompts dominates.
"""

from __future__ import annotations

import gc
import json
import multiprocessing as mp
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("SUFFIXD_DATA", ROOT.parent / "shared" / "data"))
if not DATA.exists():
    DATA = Path("/work/shared/data")


def start_daemon(data_dir: Path, *args: str, timeout: float = 120.0) -> tuple[Any, str, float]:
    announce = data_dir / "daemon.json"
    if announce.exists():
        announce.unlink()
    t0 = time.perf_counter()
    log = open(data_dir.parent / f"{data_dir.name}.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "suffixd.cli.main", "serve", "--data-dir",
                             str(data_dir), *args], stdout=log, stderr=subprocess.STDOUT)
    from suffixd.client import Client

    while time.perf_counter() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"daemon exited {proc.returncode}")
        if announce.exists():
            try:
                info = json.loads(announce.read_text())
            except json.JSONDecodeError:
                continue
            if info.get("pid") == proc.pid:
                target = info["listen"][0]
                c = Client(target, retries=0)
                c.info()  # serving: answers an RPC
                c.close()
                return proc, target, time.perf_counter() - t0
        time.sleep(0.01)
    proc.kill()
    raise TimeoutError("daemon did not start")


def stop_daemon(proc: Any) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def require_data(workloads: list[str]) -> None:
    """Exit with a message (not a traceback) when the benchmark traces are missing."""
    missing = [w for w in workloads if not (DATA / "workloads" / f"{w}.jsonl").is_file()]
    if missing:
        sys.exit(f"daemon_bench needs the recorded traces {', '.join(missing)} in "
                 f"{DATA / 'workloads'} (../shared/data beside the repository, or set "
                 "SUFFIXD_DATA)")


def load_turns(workload: str, limit: int) -> list[tuple[list[int], list[int]]]:
    """(prompt tokens, response tokens) per assistant turn, replay-protocol tokenization."""
    require_data([workload])
    from suffixd.daemon.model import Tokenizer, embedded_model_path

    tok = Tokenizer(embedded_model_path())
    turns: list[tuple[list[int], list[int]]] = []
    with open(DATA / "workloads" / f"{workload}.jsonl") as f:
        for line in f:
            sess = json.loads(line)
            prompt: list[int] = []
            for m in sess["messages"]:
                toks = tok.tokenize(f"<{m['role']}>\n") + tok.tokenize(m["content"])
                if m["role"] == "assistant":
                    head = tok.tokenize("<assistant>\n")
                    body = toks[len(head):]
                    turns.append((prompt[-2048:] + head, body))
                prompt = prompt + toks
                if len(turns) >= limit:
                    return turns
    return turns


def load_responses(workloads: list[str]) -> list[list[int]]:
    """Every assistant message of the workloads, tokenized (replay protocol)."""
    require_data(workloads)
    from suffixd.daemon.model import Tokenizer, embedded_model_path

    tok = Tokenizer(embedded_model_path())
    out: list[list[int]] = []
    for w in workloads:
        with open(DATA / "workloads" / f"{w}.jsonl") as f:
            for line in f:
                for m in json.loads(line)["messages"]:
                    if m["role"] == "assistant":
                        out.append(tok.tokenize(m["content"]))
    return out


# ----------------------------------------------------------------------------- rpc
def _accepted(draft: list[int], truth: list[int]) -> int:
    """Draft tokens a verifier replaying ``truth`` accepts: their common prefix."""
    n = 0
    for a, b in zip(draft, truth, strict=False):
        if a != b:
            break
        n += 1
    return n


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
        n = _accepted(d.tokens, resp[pos:])
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
            n = _accepted(d.tokens, resp[pos:])
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


def _proc_worker(args: tuple[str, list[Any], float, int, int, float, str]) -> dict[str, Any]:
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


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000


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
        proc, target, _ = start_daemon(data_dir, *extra)
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
                cpu0 = _cpu_s(proc.pid)
                parts = pool.map(_proc_worker, [(target, turns, seconds, firsts[i], per[i],
                                                 start_at, mode) for i in range(procs)])
                server_cpu = _cpu_s(proc.pid) - cpu0
        finally:
            stop_daemon(proc)
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


# ----------------------------------------------------------------------------- loop
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
            proc, target, _ = start_daemon(Path(tmp) / "data", *extra)
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
                    s0 = _cpu_s(proc.pid)
                    parts = res.get()
                    server = _cpu_s(proc.pid) - s0
            finally:
                stop_daemon(proc)
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


# ----------------------------------------------------------------------------- restart
def _ingest(target: str, seqs: list[list[int]], batch_tokens: int,
            per_session: int = 40) -> tuple[int, float]:
    """Ingest responses as agents do: sessions of ``per_session`` responses each, closed
    (responses kept in the global tree) when done; one durable AppendBatch per batch."""
    from suffixd.client import Client

    c = Client(target, timeout=600)
    t0 = time.perf_counter()
    n = 0
    for first in range(0, len(seqs), per_session):
        sid = c.open_session("restart").session_id
        batch: list[tuple[str, str, str, list[int]]] = []
        size = 0
        for s in seqs[first: first + per_session]:
            batch.append(("restart", sid, "response", s))
            size += len(s)
            if size >= batch_tokens:
                n += c.append_batch(batch)["tokens"]
                batch, size = [], 0
        if batch:
            n += c.append_batch(batch)["tokens"]
        c.close_session("restart", sid)
    dt = time.perf_counter() - t0
    c.close()
    return n, dt


def bench_restart(tokens: int, batch_tokens: int) -> None:
    responses = load_responses(["swe_django", "spider_dev"])
    seqs: list[list[int]] = []
    total = 0
    while total < tokens:  # the agents' own responses, repeated if the workloads are short
        for r in responses:
            r = r[: tokens - total]
            seqs.append(r)
            total += len(r)
            if total >= tokens:
                break
    budget = str(int(total * 1.2))
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data"
        proc, target, first_start = start_daemon(data_dir, "--global-budget-tokens", budget)
        n, dt = _ingest(target, seqs, batch_tokens)
        stop_daemon(proc)
        t0 = time.perf_counter()
        proc, target, restart = start_daemon(data_dir, "--global-budget-tokens", budget)
        from suffixd.client import Client

        c = Client(target)
        while c.info()["rebuilding"]:
            time.sleep(0.05)
        rebuilt = time.perf_counter() - t0
        st = c.stats("restart")["namespaces"][0]
        c.close()
        stop_daemon(proc)
        proc, target, restart_blocking = start_daemon(data_dir, "--global-budget-tokens", budget,
                                                      "--rebuild", "blocking")
        stop_daemon(proc)
        proc, target, restart_kill = start_daemon(data_dir, "--global-budget-tokens", budget)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc, target, restart_after_kill9 = start_daemon(data_dir, "--global-budget-tokens",
                                                         budget)
        stop_daemon(proc)
        store_bytes = sum(f.stat().st_size for f in (data_dir / "store").iterdir())
    print(json.dumps({
        "bench": "restart", "tokens": n, "sequences": len(seqs),
        "durable_ingest_tok_s": round(n / dt), "ingest_s": round(dt, 2),
        "batch_tokens": batch_tokens,
        "empty_start_s": round(first_start, 2), "restart_serving_s": round(restart, 2),
        "restart_trees_rebuilt_s": round(rebuilt, 2),
        "restart_blocking_rebuild_s": round(restart_blocking, 2),
        "restart_after_kill9_s": round(restart_after_kill9, 2),
        "global_tree_tokens": st["global"]["tokens"], "global_tree_bytes": st["global"]["bytes"],
        "lmdb_bytes": store_bytes,
    }))


# ----------------------------------------------------------------------------- crash
def bench_crash(rounds: int, writers: int) -> None:
    from suffixd.client import Client

    from suffixcache.store import Store

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data"
        acked: list[list[int]] = []
        lock = threading.Lock()
        for rnd in range(rounds):
            proc, target, _ = start_daemon(data_dir)
            stop = threading.Event()

            def write(i: int, rnd: int = rnd, target: str = target,
                      stop: threading.Event = stop) -> None:
                rng = random.Random(rnd * 1000 + i)
                c = Client(target, retries=0, timeout=5)
                try:
                    sid = c.open_session("crash", f"r{rnd}w{i}").session_id
                    while not stop.is_set():
                        s = [rng.randrange(1000, 260_000) for _ in range(32)]
                        c.append("crash", sid, s, kind="response")
                        with lock:
                            acked.append(s)
                except Exception:
                    pass

            ts = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
            for t in ts:
                t.start()
            time.sleep(random.uniform(1.0, 3.0))
            proc.send_signal(signal.SIGKILL)  # mid-write
            proc.wait()
            stop.set()
            for t in ts:
                t.join()
            results.append(len(acked))
        with Store(data_dir / "store") as store:
            stored = {tuple(r["tokens"]) for r in store.iter_sequences()}
        lost = sum(1 for s in acked if tuple(s) not in stored)
    print(json.dumps({"bench": "crash", "rounds": rounds, "writers": writers,
                      "acknowledged": len(acked), "lost": lost}))


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("rpc")
    r.add_argument("--clients", type=int, default=16)
    r.add_argument("--seconds", type=float, default=30)
    r.add_argument("--procs", type=int, default=4, help="client processes sharing the clients")
    r.add_argument("--turns", type=int, default=400)
    r.add_argument("--serve-arg", action="append", default=[], help="extra `serve` argument")
    r.add_argument("--step", action="store_true",
                   help="one Speculate-with-append RPC per step (same as --mode step)")
    r.add_argument("--stream", action="store_true",
                   help="one SpeculateStream per session (same as --mode stream)")
    r.add_argument("--prompt-tokens", type=int, default=2048,
                   help="prompt per turn: the last N tokens of the turn's context (max 2048)")
    r.add_argument("--keep-session", action="store_true",
                   help="one session per client for the whole run (per turn: append the "
                   "prompt, decode the response) instead of one session per turn")
    r.add_argument("--mode", action="append", default=[],
                   choices=["unary", "step", "stream", "stream-deferred"],
                   help="repeatable; each mode on a fresh daemon, one after the other")
    lp = sub.add_parser("loop")
    lp.add_argument("--clients", type=int, default=8)
    lp.add_argument("--steps", type=int, default=500, help="steps per client")
    lp.add_argument("--seconds", type=float, default=0.0,
                    help="run each mode this long instead of a number of steps")
    lp.add_argument("--procs", type=int, default=1, help="client processes sharing the clients")
    lp.add_argument("--async", dest="use_async", action="store_true",
                    help="AsyncClient: each process runs its clients as tasks on one loop")
    lp.add_argument("--mode", action="append", default=[],
                    choices=["unary", "step", "stream", "stream-deferred"])
    lp.add_argument("--serve-arg", action="append", default=[], help="extra `serve` argument")
    lp.add_argument("--rate", type=float, default=0.0,
                    help="open loop: aggregate steps/s, spread over the clients, each sending "
                    "on its own schedule; latency counts from each step's due time "
                    "(needs --seconds)")
    lp.add_argument("--poisson", action="store_true",
                    help="with --rate: Poisson arrivals per client instead of evenly spaced")
    lp.add_argument("--samples-out", metavar="PREFIX",
                    help="with --rate: write every step (client, due s, latency s, service s) "
                    "to PREFIX.MODE.jsonl, to see when the slow steps happened")
    s = sub.add_parser("restart")
    s.add_argument("--tokens", type=int, default=5_000_000)
    s.add_argument("--batch-tokens", type=int, default=65536)
    c = sub.add_parser("crash")
    c.add_argument("--rounds", type=int, default=3)
    c.add_argument("--writers", type=int, default=8)
    a = ap.parse_args()
    if a.cmd == "rpc":
        modes = a.mode + ["step"] * a.step + ["stream"] * a.stream
        modes = [m + "+keep" * a.keep_session for m in modes or ["unary"]]
        bench_rpc(a.clients, a.seconds, a.procs, a.turns, a.serve_arg, modes, a.prompt_tokens)
    elif a.cmd == "loop":
        bench_loop(a.clients, a.steps, a.mode or ["unary", "step", "stream", "stream-deferred"],
                   a.serve_arg, a.seconds, a.procs, a.use_async, a.rate, a.poisson,
                   a.samples_out)
    elif a.cmd == "restart":
        bench_restart(a.tokens, a.batch_tokens)
    else:
        bench_crash(a.rounds, a.writers)


if __name__ == "__main__":
    main()
