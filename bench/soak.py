"""Soak: a real daemon under 16 clients for N minutes, bad inputs sprinkled in, then kill -9.

Starts ``suffixd serve`` (embedded gemma model, LMDB with fsync) on a fresh data dir and
runs ``--clients`` threads, each with its own connection, mixing for ``--minutes``:

* append (unary, prompt/tool/generated/response kinds) to the client's sessions,
* speculate (with and without a context),
* streams (a SpeculateStream of a few durable steps ending a response),
* generate (short, greedy, through the daemon's verifier),
* stats (all namespaces, all pages),
* bad inputs (~5%: token ids out of range, empty or over-long names, unknown sessions,
  draft sizes over the limit, a tail over the limit, a corrupt page token, ...),

rotating sessions (a session is closed, its responses kept, once it holds
``--session-tokens``) so the global trees fill and their budget (``--global-budget``,
small so it is reached within minutes) evicts: the daemon's RSS should then be flat.

Every reply that acknowledged an append records the session's acknowledged length. At
the end the daemon is killed with SIGKILL while the clients are still running, restarted
on the same data dir, and every open session's stored length is compared with the
acknowledged one: tokens lost must be 0.

Reports requests served, errors by status (expected for bad inputs, and unexpected),
RSS at start (after warm-up), every minute and at the end, p50/p99 per RPC, and the load
average of the machine. Not part of CI (minutes of two cores):

    python bench/soak.py [--minutes 10] [--clients 16] [--no-generate] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from suffixd.client import Client, SuffixdError

TEXTS = [
    "SELECT name, country, age FROM singer ORDER BY age DESC ;",
    "SELECT count(*) FROM concert WHERE year = 2014 OR year = 2015 ;",
    "def test_view(self):\n    response = self.client.get('/admin/')\n    self.assertEqual(",
    "The committee met on Tuesday to review the budget and the schedule of the works.",
    "git diff --stat HEAD~1 && pytest -q tests/test_models.py -k migration",
]


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def start_daemon(data_dir: Path, log: Path, args: list[str]) -> subprocess.Popen[bytes]:
    announce = data_dir / "daemon.json"
    if announce.exists():
        announce.unlink()
    proc = subprocess.Popen(
        [sys.executable, "-m", "suffixd.cli.main", "serve", "--data-dir", str(data_dir), *args],
        stdout=open(log, "ab"), stderr=subprocess.STDOUT,  # noqa: SIM115
        env={**os.environ, "SUFFIXD_MODEL_LOAD": "first-use"},
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit("daemon exited:\n" + log.read_text())
        try:
            if json.loads(announce.read_text()).get("pid") == proc.pid:
                return proc
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        time.sleep(0.1)
    proc.kill()
    sys.exit("daemon did not start")


class Tally:
    """Latencies per RPC, outcomes by status; thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lat: dict[str, list[float]] = collections.defaultdict(list)
        self.ok: collections.Counter[str] = collections.Counter()
        self.expected: collections.Counter[str] = collections.Counter()  # bad input refused
        self.unexpected: collections.Counter[str] = collections.Counter()
        self.unexpected_samples: list[str] = []
        # Set just before the kill -9: calls in flight then fail with UNAVAILABLE, as they
        # must, and are counted apart.
        self.killed = False
        self.at_kill: collections.Counter[str] = collections.Counter()

    def record(self, rpc: str, seconds: float, status: str, bad_input: bool) -> None:
        with self.lock:
            if self.killed:
                self.at_kill[f"{rpc} {status}"] += 1
                return
            self.lat[rpc].append(seconds)
            if status == "OK" and not bad_input:
                self.ok[rpc] += 1
            elif bad_input and status != "OK":
                self.expected[f"{rpc} {status}"] += 1
            else:
                self.unexpected[f"{rpc} {status}"] += 1


class Worker(threading.Thread):
    def __init__(self, n: int, target: str, tally: Tally, stop: threading.Event,
                 acked: dict[tuple[str, str], int], acked_lock: threading.Lock,
                 args: argparse.Namespace) -> None:
        super().__init__(name=f"soak-{n}", daemon=True)
        self.n = n
        self.rng = random.Random(1000 + n)
        self.client = Client(target, retries=0, timeout=120)
        self.tally = tally
        self.stop_event = stop
        self.acked = acked
        self.acked_lock = acked_lock
        self.args = args
        # A few namespaces shared by all clients, so global trees fill and are shared.
        self.ns = f"soak{n % args.namespaces}"
        self.sessions: list[str] = []
        self.vocab = 0

    def call(self, rpc: str, fn: Any, bad: bool = False) -> Any:
        t0 = time.perf_counter()
        status = "OK"
        try:
            return fn()
        except SuffixdError as exc:
            status = exc.code.name
            if not bad and not self.tally.killed and len(self.tally.unexpected_samples) < 20:
                self.tally.unexpected_samples.append(f"{rpc}: {exc}")
            return None
        finally:
            self.tally.record(rpc, time.perf_counter() - t0, status, bad)

    def ack(self, sid: str, tokens: int) -> None:
        key = (self.ns, sid)
        with self.acked_lock:
            if tokens > self.acked.get(key, 0):
                self.acked[key] = tokens

    def tokens(self, k: int) -> list[int]:
        text = self.rng.choice(TEXTS)
        ids = self.client.tokenize(text)
        return (ids * (k // max(1, len(ids)) + 1))[:k]

    def open_session(self) -> None:
        info = self.call("OpenSession", lambda: self.client.open_session(self.ns))
        if info is not None:
            self.sessions.append(info.session_id)
            self.ack(info.session_id, 0)

    def rotate(self, sid: str, length: int) -> None:
        if length < self.args.session_tokens:
            return
        if self.call("CloseSession", lambda: self.client.close_session(self.ns, sid)) is not None:
            self.sessions.remove(sid)
            with self.acked_lock:
                self.acked.pop((self.ns, sid), None)
            self.open_session()

    def run(self) -> None:
        self.vocab = self.client.info()["vocab_size"]
        for _ in range(2):
            self.open_session()
        ops = [("append", 30), ("speculate", 30), ("stream", 15), ("stats", 3),
               ("generate", 2 if self.args.generate else 0), ("bad", 5)]
        names, weights = zip(*ops, strict=True)
        while not self.stop_event.is_set():
            if not self.sessions:
                self.open_session()
                continue
            op = self.rng.choices(names, weights)[0]
            getattr(self, f"op_{op}")(self.rng.choice(self.sessions))
        self.client.close()

    def op_append(self, sid: str) -> None:
        kind = self.rng.choice(["prompt", "tool", "generated", "response"])
        toks = self.tokens(self.rng.randint(8, 400))
        r = self.call("Append", lambda: self.client.append(self.ns, sid, toks, kind=kind))
        if r is not None:
            self.ack(sid, r.session_tokens)
            self.rotate(sid, r.session_tokens)

    def op_speculate(self, sid: str) -> None:
        if self.rng.random() < 0.5:
            self.call("Speculate", lambda: self.client.speculate(self.ns, sid, max_tokens=16))
        else:
            ctx = self.tokens(self.rng.randint(4, 64))
            self.call("Speculate", lambda: self.client.speculate(self.ns, None, ctx, 16))

    def op_stream(self, sid: str) -> None:
        t0 = time.perf_counter()
        status = "OK"
        try:
            with self.client.stepper(self.ns, sid, max_tokens=16) as st:
                d = st.step()
                for i in range(self.rng.randint(3, 12)):
                    final = i == 11
                    toks = list(d.tokens[:3]) + self.tokens(1)
                    d = st.step(toks, final=final)
                    self.ack(sid, d.session_tokens)
                    if final:
                        break
                d = st.step(self.tokens(2), final=True, draft=False)
                self.ack(sid, d.session_tokens)
        except SuffixdError as exc:
            status = exc.code.name
            if not self.tally.killed and len(self.tally.unexpected_samples) < 20:
                self.tally.unexpected_samples.append(f"SpeculateStream: {exc}")
        self.tally.record("SpeculateStream", time.perf_counter() - t0, status, False)

    def op_stats(self, sid: str) -> None:
        self.call("Stats", lambda: self.client.stats(top_documents=3))

    def op_generate(self, sid: str) -> None:
        prompt = self.rng.choice(TEXTS)
        # A session of its own: its length is not checked at the end (generation appends).
        self.call("Generate", lambda: list(self.client.generate(
            f"gen-{self.n}", namespace=self.ns, prompt=prompt, max_tokens=16)))

    def op_bad(self, sid: str) -> None:
        c, ns, rng = self.client, self.ns, self.rng
        cases = [
            ("Append", lambda: c.append(ns, sid, [self.vocab + rng.randint(0, 9)], kind="tool")),
            ("Append", lambda: c.append(ns, sid, [-1], kind="tool")),
            ("Append", lambda: c.append(ns, "no-such-session", [1, 2], kind="tool")),
            ("Append", lambda: c.append("", sid, [1, 2], kind="tool")),
            ("Speculate", lambda: c.speculate("x" * 300, None, [1, 2, 3], 8)),
            ("Speculate", lambda: c.speculate(ns, sid, None, 100_000)),
            ("Speculate", lambda: c.speculate(ns, "no-such-session", None, 8)),
            ("DescribeSession", lambda: c.describe_session(ns, sid, tail_tokens=1 << 30)),
            ("OpenSession", lambda: c.open_session(ns, metadata={f"k{i}": "v"
                                                                 for i in range(100)})),
            ("Stats", lambda: c.call(c.stub.Stats, __import__(
                "suffixd.client.requests", fromlist=["x"]).stats_request(
                    None, None, False, 1, 0, "not-a-token"))),
            ("Detokenize", lambda: c.detokenize([self.vocab + 5])),
        ]
        rpc, fn = rng.choice(cases)
        self.call(rpc, fn, bad=True)


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def check_lost(target: str, acked: dict[tuple[str, str], int]) -> tuple[int, int, int]:
    """(sessions checked, tokens acknowledged, tokens lost) after the restart."""
    c = Client(target, retries=10, timeout=60)
    c.wait_ready()
    stored = {(s.namespace, s.session_id): s.tokens for s in c.list_sessions()}
    c.close()
    lost = total = checked = 0
    for key, n in acked.items():
        if key not in stored:  # closed by its worker just before the kill
            continue
        checked += 1
        total += n
        lost += max(0, n - stored[key])
    return checked, total, lost


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--namespaces", type=int, default=4, help="Shared by the clients.")
    ap.add_argument("--session-tokens", type=int, default=20_000,
                    help="A session is closed (and another opened) past this length.")
    ap.add_argument("--global-budget", type=int, default=300_000,
                    help="The daemon's --global-budget-tokens (per namespace).")
    ap.add_argument("--no-generate", dest="generate", action="store_false")
    ap.add_argument("--data-dir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="Also write the report here.")
    args = ap.parse_args()

    work = args.data_dir or Path(tempfile.mkdtemp(prefix="suffixd-soak-"))
    data, log = work / "data", work / "daemon.log"
    daemon_args = ["--global-budget-tokens", str(args.global_budget)]
    load_start = os.getloadavg()
    proc = start_daemon(data, log, daemon_args)
    target = f"unix:{data / 'suffixd.sock'}"
    if args.generate:  # load the verifier before the clock starts (~20 s of CPU)
        c = Client(target, timeout=600)
        list(c.generate(None, prompt="Hello", max_tokens=2))
        c.close()
    tally = Tally()
    stop = threading.Event()
    acked: dict[tuple[str, str], int] = {}
    acked_lock = threading.Lock()
    workers = [Worker(i, target, tally, stop, acked, acked_lock, args)
               for i in range(args.clients)]
    t0 = time.monotonic()
    for w in workers:
        w.start()
    time.sleep(min(30.0, args.minutes * 6))  # warm-up: sessions opened, first trees built
    rss = [(round(time.monotonic() - t0), rss_mib(proc.pid))]
    end = t0 + args.minutes * 60
    while time.monotonic() < end:
        time.sleep(min(60.0, max(0.0, end - time.monotonic())))
        rss.append((round(time.monotonic() - t0), rss_mib(proc.pid)))
        print(f"{rss[-1][0]:>5} s  RSS {rss[-1][1]:.0f} MiB  served {sum(tally.ok.values()):,}",
              flush=True)
    load_end = os.getloadavg()
    # kill -9 with the clients still sending: whatever was acknowledged must survive.
    with acked_lock:
        tally.killed = True
        proc.send_signal(signal.SIGKILL)
        snapshot = dict(acked)
    proc.wait()
    elapsed = time.monotonic() - t0
    stop.set()
    for w in workers:
        w.join(timeout=30)
    proc = start_daemon(data, log, daemon_args)
    checked, acked_total, lost = check_lost(target, snapshot)
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)

    report = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "seconds": round(elapsed, 1),
        "clients": args.clients,
        "cpus": os.cpu_count(),
        "load_average_start": [round(x, 2) for x in load_start],
        "load_average_end": [round(x, 2) for x in load_end],
        "requests_served": sum(tally.ok.values()),
        "served_by_rpc": dict(tally.ok),
        "bad_inputs_refused": dict(tally.expected),
        "unexpected_errors": dict(tally.unexpected),
        "unexpected_samples": tally.unexpected_samples[:10],
        "in_flight_at_kill": dict(tally.at_kill),
        "rss_mib": {"start": rss[0][1], "end": rss[-1][1], "samples": rss},
        "latency_ms": {rpc: {"n": len(v), "p50": round(1e3 * percentile(v, 0.5), 2),
                             "p99": round(1e3 * percentile(v, 0.99), 2)}
                       for rpc, v in sorted(tally.lat.items())},
        "kill9": {"sessions_checked": checked, "acknowledged_tokens": acked_total,
                  "lost_tokens": lost},
    }
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    sys.exit(1 if lost else 0)


if __name__ == "__main__":
    main()
