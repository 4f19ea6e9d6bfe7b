"""Soak: a fleet of two real daemons under gRPC and OpenAI clients for N minutes, then kill -9.

Starts a ``redis-server`` (loopback, no persistence) and two ``suffixd serve --fleet``
nodes, a and b (embedded gemma model, LMDB with fsync, ``--http`` on a free port, data
dirs of their own); ``--no-fleet`` starts node a alone. For ``--minutes`` it runs:

* ``--clients`` gRPC threads, split between the nodes, each with its own connection,
  mixing append (unary, prompt/tool/generated/response kinds) to its sessions, speculate
  (with and without a context), streams (a SpeculateStream of a few durable steps ending
  a response), generate (short, greedy), stats (all namespaces, all pages) and bad inputs
  (~5%: token ids out of range, empty or over-long names, unknown sessions, draft sizes
  over the limit, a tail over the limit, a corrupt page token, ...);
* ``--http-clients`` threads on the nodes' OpenAI fronts (plain HTTP, httpx), alternating
  nodes: chat completions streamed or not (8-16 tokens, greedy or seeded at 0.8), short
  conversations under the session header (closed after a few turns) and requests without
  it (the daemon finds the conversation), function tools with ``tool_choice`` auto /
  required / named, ``response_format`` json_object / json_schema, text completions,
  /v1/models, /health, a stream the client hangs up on after two chunks, and ~5% bad
  requests (invalid or too deeply nested JSON, an unknown model, max_tokens < 1, no
  messages, a prompt past the context window, ...) that must get their documented 4xx;
* with the fleet, a probe thread: every ``--probe-interval`` seconds a unique random
  token sequence is appended as a response on one node (alternating a -> b and b -> a) and
  the other node is asked to draft it from its first 12 tokens until it does: the
  replication lag, end to end (p50/p99); a probe never drafted within 60 s is a failure.

Sessions rotate (a session is closed, its responses kept, once it holds
``--session-tokens``; an automatic session of the OpenAI front is closed once its
namespace holds ``--auto-sessions``) so the global trees fill and their budget
(``--global-budget``, small so it is reached within minutes) evicts: each node's RSS
should then be flat. The HTTP clients need httpx (the ``test`` extra).

Every reply that acknowledged an append records the session's acknowledged length. At
the end both nodes are killed with SIGKILL while the clients are still running, restarted
on their data dirs, and every open session's stored length is compared with the
acknowledged one (tokens lost must be 0 on each node); once each node's rebuild is done
(Info.rebuilding false), it must still draft every probe sequence it had acknowledged
(written there, or seen replicated there).

Reports requests served, errors by kind (expected for bad inputs, and unexpected: a 5xx,
a wrong status, a timeout or a broken connection on a valid request), each node's RSS at
start (after warm-up), every minute and at the end, p50/p99 per call, the replication lag
and the load average of the machine. Exits 1 when anything failed. Not part of CI
(minutes of two cores):

    python bench/soak.py [--minutes 10] [--clients 12] [--http-clients 4] [--no-fleet]
                         [--no-generate] [--json out.json]
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
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from fleet_bench import Redis  # bench/: a redis-server on a free loopback port
from suffixd.cli.bench_http import wait_measured
from suffixd.client import Client, SuffixdError

TEXTS = [
    "SELECT name, country, age FROM singer ORDER BY age DESC ;",
    "SELECT count(*) FROM concert WHERE year = 2014 OR year = 2015 ;",
    "def test_view(self):\n    response = self.client.get('/admin/')\n    self.assertEqual(",
    "The committee met on Tuesday to review the budget and the schedule of the works.",
    "git diff --stat HEAD~1 && pytest -q tests/test_models.py -k migration",
]
PROBE_NS = "soak-probe"
PROBE_CONTEXT = 12  # tokens of a probe given as the context; the rest must be drafted
PROBE_DEADLINE = 60.0  # seconds for a probe to be drafted by the other node
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string"},
                                  "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}
PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
QUESTIONS = ["What is the weather in Paris, in celsius?", "Write one SQL query on singers.",
             "Name three rivers in Europe.", "Explain what git rebase does, briefly.",
             "Describe a person as JSON."]


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


@dataclass
class Node:
    """One ``suffixd serve`` and how to reach it (both fronts)."""

    name: str
    data: Path
    log: Path
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    proc: Any = None
    http: str = ""  # the OpenAI base URL, http://HOST:PORT/v1
    acked_probes: list[list[int]] = field(default_factory=list)  # it must draft these

    @property
    def target(self) -> str:
        return f"unix:{self.data / 'suffixd.sock'}"

    def start(self) -> None:
        announce = self.data / "daemon.json"
        if announce.exists():
            announce.unlink()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "suffixd.cli.main", "serve", "--data-dir", str(self.data),
             "--http", "127.0.0.1:0", *self.args],
            stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,  # noqa: SIM115
            env={**os.environ, "SUFFIXD_MODEL_LOAD": "first-use", **self.env},
        )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"daemon {self.name} exited:\n" + self.log.read_text()[-4000:])
            try:
                info = json.loads(announce.read_text())
                if info.get("pid") == self.proc.pid:
                    self.http = info["http"]
                    return
            except (FileNotFoundError, json.JSONDecodeError, KeyError):
                pass
            time.sleep(0.1)
        self.proc.kill()
        sys.exit(f"daemon {self.name} did not start")

    def rss(self) -> float:
        return rss_mib(self.proc.pid)


class Tally:
    """Latencies per call, outcomes by status; thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lat: dict[str, list[float]] = collections.defaultdict(list)
        self.ok: collections.Counter[str] = collections.Counter()
        self.expected: collections.Counter[str] = collections.Counter()  # bad input refused
        self.unexpected: collections.Counter[str] = collections.Counter()
        self.unexpected_samples: list[str] = []
        # Set just before the kill -9: calls in flight then fail with UNAVAILABLE (or a
        # broken connection), as they must, and are counted apart.
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

    def sample(self, what: str) -> None:
        with self.lock:
            if not self.killed and len(self.unexpected_samples) < 20:
                self.unexpected_samples.append(what)


class Worker(threading.Thread):
    """A gRPC client of one node."""

    def __init__(self, n: int, node: Node, tally: Tally, stop: threading.Event,
                 acked: dict[tuple[str, str, str], int], acked_lock: threading.Lock,
                 args: argparse.Namespace) -> None:
        super().__init__(name=f"soak-{n}", daemon=True)
        self.n = n
        self.node = node.name
        self.rng = random.Random(1000 + n)
        self.client = Client(node.target, retries=0, timeout=120)
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
            if not bad:
                self.tally.sample(f"{rpc} on {self.node}: {exc}")
            return None
        finally:
            self.tally.record(rpc, time.perf_counter() - t0, status, bad)

    def ack(self, sid: str, tokens: int) -> None:
        key = (self.node, self.ns, sid)
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
                self.acked.pop((self.node, self.ns, sid), None)
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
            try:
                getattr(self, f"op_{op}")(self.rng.choice(self.sessions))
            except SuffixdError as exc:  # a Tokenize (self.tokens) outside self.call
                self.tally.record("Tokenize", 0.0, exc.code.name, False)
                self.tally.sample(f"Tokenize on {self.node}: {exc}")
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
            self.tally.sample(f"SpeculateStream on {self.node}: {exc}")
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


class HttpFailure(Exception):
    """A reply that is not what a valid request gets (the status is the tally's key)."""

    def __init__(self, status: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status


def sse_events(lines: Any, stop_after: int | None = None) -> tuple[int, bool]:
    """(data events, whether ``[DONE]`` ended them) of a streamed answer; an error object in
    the stream raises HttpFailure."""
    events = 0
    for line in lines:
        if not line.startswith("data: "):
            continue
        payload = line[len("data: "):]
        if payload == "[DONE]":
            return events, True
        obj = json.loads(payload)
        if "error" in obj:
            raise HttpFailure("stream error", json.dumps(obj)[:300])
        events += 1
        if stop_after is not None and events >= stop_after:
            return events, False
    return events, False


class HttpWorker(threading.Thread):
    """A client of the nodes' OpenAI fronts (plain HTTP), alternating nodes."""

    def __init__(self, n: int, nodes: list[Node], tally: Tally, stop: threading.Event,
                 args: argparse.Namespace) -> None:
        super().__init__(name=f"soak-http-{n}", daemon=True)
        self.n = n
        self.nodes = nodes
        self.rng = random.Random(5000 + n)
        self.tally = tally
        self.stop_event = stop
        self.args = args
        self.http = httpx.Client(timeout=httpx.Timeout(120.0, connect=10.0))
        self.turn = 0
        # A conversation under the session header, on one node, closed after a few turns.
        self.conv_node = nodes[n % len(nodes)]
        self.conv_grpc = Client(self.conv_node.target, retries=0, timeout=120)
        self.conv_sid = ""
        self.conv: list[dict[str, Any]] = []

    def node(self) -> Node:
        self.turn += 1
        return self.nodes[(self.n + self.turn) % len(self.nodes)]

    def sampling(self) -> dict[str, Any]:
        body: dict[str, Any] = {"model": "default", "max_tokens": self.rng.randint(8, 16)}
        if self.rng.random() < 0.3:
            body.update(temperature=0.8, seed=self.rng.randint(0, 1 << 31))
        else:
            body["temperature"] = 0
        return body

    def measured(self, what: str, fn: Any, want: int | None = None) -> None:
        """Run one request. ``want``: the documented status of a bad request."""
        t0 = time.perf_counter()
        bad = want is not None
        status = "OK"
        try:
            got = fn()
            if bad:
                if got != want:
                    raise HttpFailure(f"got {got} not {want}", f"{what}: status {got}")
                status = str(got)
        except HttpFailure as exc:
            status, bad = exc.status, False
            self.tally.sample(f"HTTP {what}: {exc}")
        except httpx.TimeoutException as exc:
            status, bad = "timeout", False
            self.tally.sample(f"HTTP {what}: timeout {exc!r}")
        except (httpx.HTTPError, json.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
            # a broken connection, or a body without the fields every answer has
            status, bad = type(exc).__name__, False
            self.tally.sample(f"HTTP {what}: {exc!r}")
        self.tally.record(f"HTTP {what}", time.perf_counter() - t0, status, bad)

    @staticmethod
    def check(r: httpx.Response) -> dict[str, Any]:
        if r.status_code != 200:
            raise HttpFailure(f"HTTP {r.status_code}", r.text[:300])
        return dict(r.json())

    def post(self, node: Node, path: str, body: dict[str, Any],
             headers: dict[str, str] | None = None) -> dict[str, Any]:
        return self.check(self.http.post(node.http + path, json=body, headers=headers))

    def stream(self, node: Node, path: str, body: dict[str, Any],
               headers: dict[str, str] | None = None, hang_up_after: int | None = None) -> None:
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        with self.http.stream("POST", node.http + path, json=body, headers=headers) as r:
            if r.status_code != 200:
                r.read()
                raise HttpFailure(f"HTTP {r.status_code}", r.text[:300])
            events, done = sse_events(r.iter_lines(), hang_up_after)
            if hang_up_after is None and not done:
                raise HttpFailure("stream without [DONE]", f"{events} events")
            if events == 0:
                raise HttpFailure("empty stream", "no data event")
        # leaving the block early closes the connection: the daemon cancels the generation

    def run(self) -> None:
        ops = [("chat", 28), ("chat_stream", 18), ("conversation", 14), ("tools", 10),
               ("json", 8), ("completion", 10), ("models", 3), ("health", 3),
               ("hang_up", 4), ("bad", 6)]
        names, weights = zip(*ops, strict=True)
        while not self.stop_event.is_set():
            getattr(self, f"op_{self.rng.choices(names, weights)[0]}")()
        self.http.close()
        self.conv_grpc.close()

    def ask(self) -> list[dict[str, Any]]:
        return [{"role": "user", "content": self.rng.choice(QUESTIONS)}]

    def op_chat(self) -> None:
        node, body = self.node(), {**self.sampling(), "messages": self.ask()}
        hdr = {"X-Suffixd-Namespace": f"soak{self.rng.randrange(self.args.namespaces)}"}
        self.measured("chat", lambda: self.post(node, "/chat/completions", body, hdr)
                      ["choices"][0]["message"])

    def op_chat_stream(self) -> None:
        node, body = self.node(), {**self.sampling(), "messages": self.ask()}
        self.measured("chat stream", lambda: self.stream(node, "/chat/completions", body))

    def op_conversation(self) -> None:
        """One turn of a conversation under the session header; after 3, it is closed."""
        node = self.conv_node
        if not self.conv_sid or len(self.conv) >= 5:
            if self.conv_sid:
                sid = self.conv_sid
                t0 = time.perf_counter()
                try:
                    self.conv_grpc.close_session("http-conv", sid)
                    status = "OK"
                except SuffixdError as exc:
                    status = exc.code.name
                    self.tally.sample(f"CloseSession (HTTP conversation): {exc}")
                self.tally.record("CloseSession", time.perf_counter() - t0, status, False)
            self.conv_sid, self.conv = f"conv-{self.n}-{uuid.uuid4().hex[:12]}", []
        self.conv.extend(self.ask())
        body = {**self.sampling(), "messages": self.conv}
        hdr = {"X-Suffixd-Namespace": "http-conv", "X-Suffixd-Session": self.conv_sid}

        def turn() -> None:
            msg = self.post(node, "/chat/completions", body, hdr)["choices"][0]["message"]
            self.conv.append({"role": "assistant", "content": msg.get("content") or ""})

        self.measured("chat session", turn)

    def op_tools(self) -> None:
        node, body = self.node(), self.sampling()
        choice: Any = self.rng.choice(["auto", "required", {
            "type": "function", "function": {"name": "get_weather"}}])
        body.update(messages=[{"role": "user", "content": QUESTIONS[0]}], tools=[WEATHER],
                    tool_choice=choice)
        if self.rng.random() < 0.5:
            self.measured("chat tools stream", lambda: self.stream(
                node, "/chat/completions", body))
        else:
            self.measured("chat tools", lambda: self.post(node, "/chat/completions", body)
                          ["choices"][0]["finish_reason"])

    def op_json(self) -> None:
        node, body = self.node(), {**self.sampling(), "messages": self.ask()}
        body["response_format"] = self.rng.choice([
            {"type": "json_object"},
            {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}])
        self.measured("chat json", lambda: self.post(node, "/chat/completions", body)
                      ["choices"][0]["message"])

    def op_completion(self) -> None:
        node, body = self.node(), {**self.sampling(), "prompt": self.rng.choice(TEXTS)}
        if self.rng.random() < 0.5:
            self.measured("completion stream", lambda: self.stream(node, "/completions", body))
        else:
            self.measured("completion", lambda: self.post(node, "/completions", body)
                          ["choices"][0]["text"])

    def op_models(self) -> None:
        node = self.node()
        self.measured("models", lambda: self.check(self.http.get(node.http + "/models"))
                      ["data"][0]["id"])

    def op_health(self) -> None:
        node = self.node()
        self.measured("health", lambda: self.check(
            self.http.get(node.http.removesuffix("/v1") + "/health"))["status"])

    def op_hang_up(self) -> None:
        node, body = self.node(), {**self.sampling(), "messages": self.ask(), "max_tokens": 64}
        self.measured("chat stream hung up", lambda: self.stream(
            node, "/chat/completions", body, hang_up_after=2))

    def op_bad(self) -> None:
        node = self.node()
        url = node.http + "/chat/completions"
        ok = {"model": "default", "max_tokens": 8, "messages": self.ask()}
        nested: Any = "x"
        for _ in range(100):
            nested = [nested]
        long_prompt = "lorem ipsum dolor " * 4000  # past the 8,192-token context window
        cases: list[tuple[str, int, Any]] = [
            ("invalid json", 400, lambda: self.http.post(
                url, content=b'{"model": "default", "messages": [', headers={
                    "content-type": "application/json"})),
            ("nested json", 400, lambda: self.http.post(url, json={**ok, "x": nested})),
            ("unknown model", 404, lambda: self.http.post(url, json={**ok, "model": "gpt-9"})),
            ("max_tokens < 1", 400, lambda: self.http.post(url, json={**ok, "max_tokens": -1})),
            ("no messages", 400, lambda: self.http.post(url, json={"model": "default"})),
            ("temperature 5", 400, lambda: self.http.post(url, json={**ok, "temperature": 5})),
            ("n=2", 400, lambda: self.http.post(url, json={**ok, "n": 2})),
            ("response_format xml", 400, lambda: self.http.post(
                url, json={**ok, "response_format": {"type": "xml"}})),
            ("tool_choice without tools", 400, lambda: self.http.post(
                url, json={**ok, "tool_choice": "required"})),
            ("bad namespace", 400, lambda: self.http.post(
                url, json=ok, headers={"X-Suffixd-Namespace": "x" * 300})),
            ("no route", 404, lambda: self.http.get(node.http + "/embeddings")),
            ("GET chat", 405, lambda: self.http.get(url)),
            ("context overflow", 400, lambda: self.http.post(
                node.http + "/completions",
                json={"model": "default", "max_tokens": 8, "prompt": long_prompt})),
        ]
        what, want, fn = self.rng.choice(cases)

        def go() -> int:
            r = fn()
            if what == "context overflow" and r.status_code == want:
                code = r.json()["error"]["code"]
                if code != "context_length_exceeded":
                    raise HttpFailure(f"code {code}", r.text[:300])
            return int(r.status_code)

        self.measured(f"bad {what}", go, want=want)


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
        self.sent = 0
        self.lock = threading.Lock()  # the nodes' acked_probes, read at the kill

    def run(self) -> None:
        clients = [Client(n.target, retries=0, timeout=60) for n in self.nodes]
        vocab = clients[0].info()["vocab_size"]
        k = 0
        while not self.stop_event.wait(self.interval if k else 1.0):
            k += 1
            src, dst = (0, 1) if k % 2 else (1, 0)
            seq = [self.rng.randrange(1000, vocab - 1000) for _ in range(40)]
            t0 = time.perf_counter()
            try:
                with clients[src].session(PROBE_NS) as s:
                    s.append(seq[:4], kind="prompt")
                    s.append(seq, kind="response")
            except SuffixdError as exc:
                self.tally.record("probe write", time.perf_counter() - t0, exc.code.name, False)
                self.tally.sample(f"probe write on {self.nodes[src].name}: {exc}")
                continue
            written = time.perf_counter()
            self.tally.record("probe write", written - t0, "OK", False)
            with self.lock:
                self.nodes[src].acked_probes.append(seq)
            self.sent += 1
            seen = False
            while not self.stop_event.is_set() and time.perf_counter() - written < PROBE_DEADLINE:
                try:
                    got = list(clients[dst].speculate(PROBE_NS, None, seq[:PROBE_CONTEXT],
                                                      8).tokens)
                except SuffixdError as exc:
                    self.tally.record("probe read", 0.0, exc.code.name, False)
                    self.tally.sample(f"probe read on {self.nodes[dst].name}: {exc}")
                    break
                if len(got) >= 4 and got == seq[PROBE_CONTEXT:PROBE_CONTEXT + len(got)]:
                    seen = True
                    break
                time.sleep(0.01)
            if seen:
                self.lags.append(time.perf_counter() - written)
                with self.lock:
                    self.nodes[dst].acked_probes.append(seq)
            elif not self.stop_event.is_set() and not self.tally.killed:
                self.never_seen.append(f"{self.nodes[src].name}->{self.nodes[dst].name} #{k}")
        for c in clients:
            c.close()


def tree_sample(node: Node) -> tuple[int, int, int]:
    """(global tree tokens, their evictions, open sessions) summed over the node's
    namespaces: whether the budgets are reached, beside the RSS."""
    c = Client(node.target, retries=0, timeout=60)
    try:
        nss = c.stats(top_documents=0)["namespaces"]
    except SuffixdError:
        return (-1, -1, -1)
    finally:
        c.close()
    return (sum(int(e["global"].get("tokens", 0)) for e in nss),
            sum(int(e["global"].get("evictions", 0)) for e in nss),
            sum(int(e.get("open_sessions", 0)) for e in nss))


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


def check_probes(node: Node, probes: list[list[int]]) -> dict[str, Any]:
    """After the restart: the rebuild's time, and the acknowledged probes it no longer drafts."""
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=12, help="gRPC clients, split between nodes.")
    ap.add_argument("--http-clients", type=int, default=4,
                    help="OpenAI-front clients (alternating nodes).")
    ap.add_argument("--fleet", action=argparse.BooleanOptionalAction, default=True,
                    help="Two nodes replicating through a redis-server (--no-fleet: one).")
    ap.add_argument("--probe-interval", type=float, default=5.0,
                    help="Seconds between replication probes (with the fleet).")
    ap.add_argument("--threads", type=int, default=None,
                    help="Each node's --threads [default: 1 with the fleet, else 2].")
    ap.add_argument("--namespaces", type=int, default=4, help="Shared by the clients.")
    ap.add_argument("--session-tokens", type=int, default=20_000,
                    help="A session is closed (and another opened) past this length.")
    ap.add_argument("--global-budget", type=int, default=300_000,
                    help="The daemons' --global-budget-tokens (per namespace).")
    ap.add_argument("--auto-sessions", type=int, default=50,
                    help="Automatic sessions (chat without a session header) a namespace "
                    "keeps open (the daemons' SUFFIXD_AUTO_SESSIONS_PER_NAMESPACE; small, so "
                    "the oldest are closed within minutes instead of after their idle hour).")
    ap.add_argument("--no-generate", dest="generate", action="store_false",
                    help="No gRPC Generate (the HTTP clients still generate).")
    ap.add_argument("--data-dir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="Also write the report here.")
    args = ap.parse_args()

    work = args.data_dir or Path(tempfile.mkdtemp(prefix="suffixd-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    threads = args.threads or (1 if args.fleet else 2)
    daemon_args = ["--global-budget-tokens", str(args.global_budget), "--threads", str(threads)]
    redis = Redis(work) if args.fleet else None
    names = "ab" if args.fleet else "a"
    nodes = [Node(n, work / n / "data", work / n / "daemon.log",
                  daemon_args + (["--fleet", redis.url, "--node-id", n] if redis else []),
                  {"SUFFIXD_AUTO_SESSIONS_PER_NAMESPACE": str(args.auto_sessions)})
             for n in names]
    load_start = os.getloadavg()
    try:
        report = soak(args, nodes, threads)
    finally:
        for n in nodes:
            if n.proc is not None and n.proc.poll() is None:
                n.proc.kill()
        if redis is not None:
            redis.stop()
    report["load_average_start"] = [round(x, 2) for x in load_start]
    report["work_dir"] = str(work)
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    sys.exit(0 if report["passed"] else 1)


def soak(args: argparse.Namespace, nodes: list[Node], threads: int) -> dict[str, Any]:
    for node in nodes:
        node.data.parent.mkdir(parents=True, exist_ok=True)
        node.start()
        # The verifier loaded and its costs measured (or read back) before the clock
        # starts, one node after the other: two measurements at once distort both.
        c = Client(node.target, timeout=600)
        list(c.generate(None, prompt="Hello", max_tokens=2))
        c.close()
        wait_measured(node.proc, node.target)
    tally = Tally()
    stop = threading.Event()
    acked: dict[tuple[str, str, str], int] = {}
    acked_lock = threading.Lock()
    workers: list[threading.Thread] = [
        Worker(i, nodes[i % len(nodes)], tally, stop, acked, acked_lock, args)
        for i in range(args.clients)]
    workers += [HttpWorker(i, nodes, tally, stop, args) for i in range(args.http_clients)]
    probe = Probe(nodes, tally, stop, args.probe_interval) if len(nodes) > 1 else None
    t0 = time.monotonic()
    for w in workers + ([probe] if probe else []):
        w.start()
    time.sleep(min(30.0, args.minutes * 6))  # warm-up: sessions opened, first trees built

    def sample() -> tuple[int, ...]:
        return (round(time.monotonic() - t0), *(round(n.rss()) for n in nodes))

    rss = [sample()]
    trees: dict[str, list[tuple[int, int, int, int]]] = {
        n.name: [(rss[0][0], *tree_sample(n))] for n in nodes}
    end = t0 + args.minutes * 60
    while time.monotonic() < end:
        time.sleep(min(60.0, max(0.0, end - time.monotonic())))
        rss.append(sample())
        for n in nodes:
            trees[n.name].append((rss[-1][0], *tree_sample(n)))
        lag = f"  probes {len(probe.lags)}/{probe.sent} seen" if probe else ""
        print(f"{rss[-1][0]:>5} s  " + "  ".join(
            f"{n.name}: RSS {m} MiB, global {trees[n.name][-1][1] / 1e3:.0f}k tokens, "
            f"{trees[n.name][-1][3]} open sessions"
            for n, m in zip(nodes, rss[-1][1:], strict=True))
            + f"  served {sum(tally.ok.values()):,}  unexpected "
            f"{sum(tally.unexpected.values())}{lag}  load {os.getloadavg()[0]:.1f}", flush=True)
    load_end = os.getloadavg()
    # kill -9 of every node with the clients still sending: whatever was acknowledged
    # must survive.
    with acked_lock, tally.lock:
        tally.killed = True
        for n in nodes:
            n.proc.send_signal(signal.SIGKILL)
        snapshot = dict(acked)
    if probe:
        with probe.lock:
            probes = {n.name: list(n.acked_probes) for n in nodes}
    else:
        probes = {n.name: [] for n in nodes}
    for n in nodes:
        n.proc.wait()
    elapsed = time.monotonic() - t0
    stop.set()
    for w in workers + ([probe] if probe else []):
        w.join(timeout=60)
    after: dict[str, Any] = {}
    for n in nodes:  # restarted together: the fleet's peers come back at once
        n.start()
    for n in nodes:
        mine = {(ns, sid): v for (name, ns, sid), v in snapshot.items() if name == n.name}
        checked, acked_total, lost = check_lost(n.target, mine)
        after[n.name] = {"sessions_checked": checked, "acknowledged_tokens": acked_total,
                         "lost_tokens": lost, **check_probes(n, probes[n.name])}
    for n in nodes:
        n.proc.send_signal(signal.SIGTERM)
    for n in nodes:
        n.proc.wait(60)

    def rss_of(i: int) -> dict[str, Any]:
        xs = [(s[0], s[1 + i]) for s in rss]
        half = next((m for t, m in xs if t >= xs[-1][0] / 2), xs[-1][1])
        return {"start": xs[0][1], "end": xs[-1][1], "max": max(m for _, m in xs),
                "growth_second_half": xs[-1][1] - half, "samples": xs}

    lags = probe.lags if probe else []
    never = probe.never_seen if probe else []
    unexpected = sum(tally.unexpected.values())
    lost_all = sum(a["lost_tokens"] for a in after.values())
    missing = sum(a["probes_missing"] for a in after.values())
    return {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "seconds": round(elapsed, 1),
        "nodes": len(nodes), "threads_per_node": threads,
        "grpc_clients": args.clients, "http_clients": args.http_clients,
        "cpus": os.cpu_count(),
        "load_average_end": [round(x, 2) for x in load_end],
        "requests_served": sum(tally.ok.values()),
        "served_by_call": dict(sorted(tally.ok.items())),
        "bad_inputs_refused": dict(sorted(tally.expected.items())),
        "bad_inputs_refused_total": sum(tally.expected.values()),
        "unexpected_errors": dict(tally.unexpected),
        "unexpected_total": unexpected,
        "unexpected_samples": tally.unexpected_samples[:10],
        "in_flight_at_kill": dict(tally.at_kill),
        "rss_mib": {n.name: rss_of(i) for i, n in enumerate(nodes)},
        "global_tokens_evictions_open_sessions": trees,
        "latency_ms": {rpc: {"n": len(v), "p50": round(1e3 * percentile(v, 0.5), 2),
                             "p99": round(1e3 * percentile(v, 0.99), 2)}
                       for rpc, v in sorted(tally.lat.items())},
        "replication": {"probes": probe.sent if probe else 0, "seen": len(lags),
                        "never_seen": never,
                        "lag_ms_p50": round(1e3 * percentile(lags, 0.5), 1),
                        "lag_ms_p99": round(1e3 * percentile(lags, 0.99), 1),
                        "lag_ms_max": round(1e3 * max(lags, default=0.0), 1)},
        "kill9": after,
        "passed": not (unexpected or lost_all or missing or never),
    }


if __name__ == "__main__":
    main()
