"""Soak: a fleet of two real daemons under gRPC and OpenAI clients for N minutes, nodes
stopped (SIGTERM) and killed (kill -9) at random moments, then kill -9 of both.

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
* among those, ``--schema-share`` of the requests carry a JSON schema drawn like the
  property test's (tests/schema_strategies.py: its ORDINARY and PATHOLOGICAL leaves,
  nested the way its ``schemas`` strategy nests them) as ``response_format`` json_schema
  (streamed or not) or as a required tool's ``parameters``: each answer must be a 200
  whose finished output (finish_reason stop / tool_calls) is valid against the schema
  (``jsonschema``), or a 400 within ``--refusal-bound`` seconds;
* with the fleet, a probe thread: every ``--probe-interval`` seconds a unique random
  token sequence is appended as a response on one node (alternating a -> b and b -> a) and
  the other node is asked to draft it from its first 12 tokens until it does: the
  replication lag, end to end (p50/p99); a probe never drafted within 60 s is a failure
  (unless a node was stopped meanwhile: counted apart);
* every ``--events-every`` seconds on average (at random moments, after the warm-up),
  one node, picked at random, is stopped: SIGTERM (``--sigterm-share`` of the events; it
  must exit 0) or kill -9 (it must die of the signal). It is restarted on its data dir at
  once and, while the load goes on: every session of that node's clients must still hold
  every token a reply acknowledged before the stop (a session absent is only excused if
  its client tried to close it), and once its rebuild is done it must still draft every
  probe it had acknowledged. Calls in flight at a stop, or sent while the node is down,
  are counted apart. ``--early-share`` of the restarts are hit again, by SIGTERM or kill -9,
  at a random moment of their first ``--early-window`` seconds (start-up: the store
  opening, the trees loading, the model loading for the first requests); the checks of
  the restart after that cover both. Any other exit of a node, a non-zero exit after
  SIGTERM or a stop that hangs is a crash (the node is restarted and checked the same way).

Sessions rotate (a session is closed, its responses kept, once it holds
``--session-tokens``; an automatic session of the OpenAI front is closed once its
namespace holds ``--auto-sessions``) so the global trees fill and their budget
(``--global-budget``, small so it is reached within minutes) evicts, and the daemons'
prompt caches have a small budget too (``--prompt-cache-mb``): each node's RSS should
then be flat. Every ``--memory-interval`` seconds each node's RSS and its parts (Stats'
process memory: model weights, store, libraries, llama.cpp's context, prompt cache,
trees, malloc in use, malloc's free memory held, stacks, unattributed) are sampled
(bench/rss_watch.py), and RSS must be flat over the run's last ``--flat-window`` minutes
(at most a third of the run): its least-squares trend over them at most the larger of
``--flat-mib`` (16) and ``--flat-pct`` (2) percent of its mean there (a failure with
``--require-flat``); the trend of each part says which one grew. ``--memory-report``
writes the samples and the verdicts as markdown. The HTTP clients need httpx and
jsonschema (the ``test`` extra).

Every reply that acknowledged an append records the session's acknowledged length. At
the end both nodes are killed with SIGKILL while the clients are still running, restarted
on their data dirs, and every open session's stored length is compared with the
acknowledged one (tokens lost must be 0 on each node); once each node's rebuild is done
(Info.rebuilding false), it must still draft every probe sequence it had acknowledged
(written there, or seen replicated there); then both are stopped with SIGTERM (exit 0).

Reports requests served, errors by kind (expected for bad inputs, and unexpected: a 5xx,
a wrong status, a timeout or a broken connection on a valid request, a schema answer
that breaks its schema, a slow refusal), the schema answers (valid, unfinished, refused),
the stops and kills with what each one checked, the crashes, each node's RSS at start
(after warm-up), every minute and at the end, its peak (VmHWM of each process) against
``--rss-budget-mib``, each namespace's global tree against its budget, p50/p99 per call,
the replication lag and the load average of the machine. Exits 1 when anything failed.
Not part of CI (minutes of two cores):

    python bench/soak.py [--minutes 10] [--clients 12] [--http-clients 4] [--no-fleet]
                         [--no-generate] [--schema-share 0.15] [--schema-in both]
                         [--refusal-bound 5] [--events-every 120]
                         [--sigterm-share 0.5] [--early-share 0.3] [--early-window 4]
                         [--rss-budget-mib 1536] [--prompt-cache-mb 64]
                         [--memory-interval 30] [--flat-window 20] [--flat-mib 16]
                         [--flat-pct 2] [--require-flat] [--memory-report memory.md]
                         [--seed 0] [--data-dir DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import functools
import importlib.util
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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jsonschema
from fleet_bench import Redis  # bench/: a redis-server on a free loopback port
from rss_watch import MemoryWatch, flat, markdown
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
STOP_TIMEOUT = 120.0  # a SIGTERM'd node past this (grace 10 s + closing) has hung
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
REFUSED = "refused"  # what a request function returns for a 400 it was allowed to get


def _strategy_leaves() -> list[Any]:
    """The property test's leaves (tests/schema_strategies.py), so that the soak sends the
    shapes that test shrinks toward, and follows it when it gains one. Loaded by path: the
    repository root need not be importable from bench/."""
    path = Path(__file__).resolve().parent.parent / "tests" / "schema_strategies.py"
    spec = importlib.util.spec_from_file_location("soak_schema_strategies", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [*module.ORDINARY, *module.PATHOLOGICAL]


# Property names as hypothesis's st.text(max_size=8) draws them: empty, quotes and
# backslashes, control characters, non-ASCII, astral characters.
KEY_CHARS = ("abcdefghijklmnopqrstuvwxyzABCXYZ0123456789_-.$#/ " + '"\\' + "\x00\x01\t\n\x7f"
             + "éßøЖ中文ʼ\u200b\u2028\ufeff" + "\U0001f600\U00010348")


class SchemaGen:
    """Seeded draws shaped like tests/schema_strategies.py's ``schemas``
    (``st.recursive(leaves, _extend, max_leaves=60)``), without hypothesis's ``.example()``
    (meant for the REPL, not for thousands of draws in a loop): a leaf, or an object of up
    to 6 properties (the first two required), an array with minItems 0-3, an anyOf of 1-4
    or an allOf of 1-3 alternatives, nested until the leaves run out."""

    def __init__(self, rng: random.Random, leaves: list[Any]) -> None:
        self.rng = rng
        self.leaves = leaves
        self.left = 0

    def draw(self) -> Any:
        self.left = self.rng.randint(1, 60)
        return self._node(0)

    def _leaf(self) -> Any:
        self.left -= 1
        return self.rng.choice(self.leaves)

    def _node(self, depth: int) -> Any:
        # Half the draws a bare leaf, as hypothesis's recursive draws often are; deeper
        # levels ever more likely to end.
        if self.left <= 1 or self.rng.random() < 0.5 + 0.1 * depth:
            return self._leaf()
        rng = self.rng
        kind = rng.randrange(4)
        if kind == 0:
            props: dict[str, Any] = {}
            for _ in range(rng.randint(0, 6)):
                key = "".join(rng.choice(KEY_CHARS) for _ in range(rng.randint(0, 8)))
                props[key] = self._node(depth + 1)
            return {"type": "object", "properties": props, "required": list(props)[:2]}
        if kind == 1:
            return {"type": "array", "items": self._node(depth + 1),
                    "minItems": rng.randint(0, 3)}
        alts = [self._node(depth + 1) for _ in range(rng.randint(1, 4 if kind == 2 else 3))]
        return {"anyOf": alts} if kind == 2 else {"allOf": alts}


def proc_mib(pid: int, field_name: str) -> float:
    """A ``/proc/PID/status`` size (VmRSS, VmHWM) in MiB; 0 once the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class NodeError(Exception):
    """A node did not start: the soak cannot go on with it."""


@dataclass
class Node:
    """One ``suffixd serve`` and how to reach it (both fronts), and where it stands: ``up``
    once its restart has announced itself, ``ready`` once its generator is (the HTTP
    /health says 503 until then, rightly), ``epoch`` counting its stops: a call begun in
    another epoch than the one it ends in was in flight at a stop."""

    name: str
    data: Path
    log: Path
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    proc: Any = None
    http: str = ""  # the OpenAI base URL, http://HOST:PORT/v1
    acked_probes: list[list[int]] = field(default_factory=list)  # it must draft these
    up: bool = False
    ready: bool = False
    epoch: int = 0
    starts: int = 0
    log_offset: int = 0  # the log's size when the process was spawned
    peak_mib: float = 0.0  # the highest VmHWM of its processes

    @property
    def target(self) -> str:
        return f"unix:{self.data / 'suffixd.sock'}"

    def mark(self) -> tuple[int, bool]:
        return self.epoch, self.up

    def spawn(self) -> None:
        """Start the process; ``announced()`` says when it serves."""
        announce = self.data / "daemon.json"
        if announce.exists():
            announce.unlink()
        self.log_offset = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "suffixd.cli.main", "serve", "--data-dir",
                 str(self.data), "--http", "127.0.0.1:0", *self.args],
                stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, "SUFFIXD_MODEL_LOAD": "first-use", **self.env},
            )
        self.starts += 1

    def announced(self) -> bool:
        """Whether this process has written its daemon.json (it serves both fronts)."""
        try:
            info = json.loads((self.data / "daemon.json").read_text())
            if info.get("pid") == self.proc.pid:
                self.http = info["http"]
                return True
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            pass
        return False

    def logged_since_spawn(self, needle: str) -> bool:
        try:
            with open(self.log, "rb") as f:
                f.seek(self.log_offset)
                return needle.encode() in f.read()
        except OSError:
            return False

    def wait_announced(self) -> None:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.announced():
                return
            if self.proc.poll() is not None:
                raise NodeError(f"daemon {self.name} exited ({self.proc.returncode}):\n"
                                + self.log_tail())
            time.sleep(0.1)
        self.proc.kill()
        raise NodeError(f"daemon {self.name} did not start in 180 s")

    def start(self) -> None:
        self.spawn()
        self.wait_announced()

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def rss(self) -> float:
        return proc_mib(self.proc.pid, "VmRSS")

    def note_peak(self) -> None:
        self.peak_mib = max(self.peak_mib, proc_mib(self.proc.pid, "VmHWM"))


class Tally:
    """Latencies per call, outcomes by status; thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lat: dict[str, list[float]] = collections.defaultdict(list)
        self.ok: collections.Counter[str] = collections.Counter()
        self.expected: collections.Counter[str] = collections.Counter()  # bad input refused
        self.unexpected: collections.Counter[str] = collections.Counter()
        self.unexpected_samples: list[str] = []
        # Set just before the final kill -9: calls in flight then fail with UNAVAILABLE (or
        # a broken connection), as they must, and are counted apart.
        self.killed = False
        self.at_kill: collections.Counter[str] = collections.Counter()
        # The same for the stops and kills during the run, per node.
        self.at_stop: collections.Counter[str] = collections.Counter()
        self.schema: collections.Counter[str] = collections.Counter()

    def record(self, rpc: str, seconds: float, status: str, bad: bool,
               node: Node | None = None, mark: tuple[int, bool] | None = None,
               detail: str = "") -> None:
        """``node``/``mark`` (the node's epoch and state when the call began): a failure of
        a call to a node that was down, or stopped while it ran, is no fault of the node."""
        with self.lock:
            if self.killed:
                self.at_kill[f"{rpc} {status}"] += 1
                return
            if status != "OK" and node is not None and mark is not None and (
                    not mark[1] or not node.up or node.epoch != mark[0]):
                self.at_stop[f"{rpc} {status}"] += 1
                return
            self.lat[rpc].append(seconds)
            if status == "OK" and not bad:
                self.ok[rpc] += 1
            elif bad and status != "OK":
                self.expected[f"{rpc} {status}"] += 1
            else:
                self.unexpected[f"{rpc} {status}"] += 1
                if detail and len(self.unexpected_samples) < 20:
                    self.unexpected_samples.append(detail)

    def count_schema(self, what: str) -> None:
        with self.lock:
            if not self.killed:
                self.schema[what] += 1


class Book:
    """The acknowledged length of every (node, namespace, session) a gRPC client appends
    to, and the sessions a client tried to close: after a restart, a session absent from
    the store is excused only if its client tried to close it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acked: dict[tuple[str, str, str], int] = {}
        self.closing: set[tuple[str, str, str]] = set()

    def ack(self, key: tuple[str, str, str], tokens: int) -> None:
        with self.lock:
            if tokens > self.acked.get(key, -1):
                self.acked[key] = tokens

    def will_close(self, key: tuple[str, str, str]) -> None:
        with self.lock:
            self.closing.add(key)

    def closed(self, key: tuple[str, str, str]) -> None:
        with self.lock:
            self.acked.pop(key, None)

    def snapshot(self, node: str) -> dict[tuple[str, str], int]:
        with self.lock:
            return {(ns, sid): v for (name, ns, sid), v in self.acked.items() if name == node}

    def excused(self, node: str) -> set[tuple[str, str]]:
        with self.lock:
            return {(ns, sid) for (name, ns, sid) in self.closing if name == node}


class Worker(threading.Thread):
    """A gRPC client of one node; it waits while its node is down and reconnects after a
    restart (a channel that saw its server go keeps backing off for up to minutes)."""

    def __init__(self, n: int, node: Node, tally: Tally, stop: threading.Event, book: Book,
                 args: argparse.Namespace) -> None:
        super().__init__(name=f"soak-{n}", daemon=True)
        self.n = n
        self.node = node
        self.rng = random.Random(args.seed * 7919 + 1000 + n)
        self.epoch = node.epoch
        self.client = Client(node.target, retries=0, timeout=120)
        self.tally = tally
        self.stop_event = stop
        self.book = book
        self.args = args
        # A few namespaces shared by all clients, so global trees fill and are shared.
        self.ns = f"soak{n % args.namespaces}"
        self.sessions: list[str] = []
        self.vocab = 0

    def call(self, rpc: str, fn: Callable[[], Any], bad: bool = False) -> Any:
        t0 = time.perf_counter()
        mark = self.node.mark()
        status, detail = "OK", ""
        try:
            return fn()
        except SuffixdError as exc:
            status = exc.code.name
            detail = f"{rpc} on {self.node.name}: {exc}"
            return None
        finally:
            self.tally.record(rpc, time.perf_counter() - t0, status, bad, self.node, mark,
                              detail)

    def key(self, sid: str) -> tuple[str, str, str]:
        return (self.node.name, self.ns, sid)

    def tokens(self, k: int) -> list[int]:
        text = self.rng.choice(TEXTS)
        ids: list[int] = self.client.tokenize(text)
        return (ids * (k // max(1, len(ids)) + 1))[:k]

    def open_session(self) -> None:
        info = self.call("OpenSession", lambda: self.client.open_session(self.ns))
        if info is not None:
            self.sessions.append(info.session_id)
            self.book.ack(self.key(info.session_id), 0)

    def rotate(self, sid: str, length: int) -> None:
        if length < self.args.session_tokens:
            return
        self.book.will_close(self.key(sid))
        if self.call("CloseSession", lambda: self.client.close_session(self.ns, sid)) is not None:
            self.sessions.remove(sid)
            self.book.closed(self.key(sid))
            self.open_session()

    def node_up(self) -> bool:
        if not self.node.up:
            self.stop_event.wait(0.2)
            return False
        if self.node.epoch != self.epoch:
            self.client.close()
            self.client = Client(self.node.target, retries=0, timeout=120)
            self.epoch = self.node.epoch
        return True

    def run(self) -> None:
        ops = [("append", 30), ("speculate", 30), ("stream", 15), ("stats", 3),
               ("generate", 2 if self.args.generate else 0), ("bad", 5)]
        names, weights = zip(*ops, strict=True)
        while not self.stop_event.is_set():
            if not self.node_up():
                continue
            mark = self.node.mark()
            try:
                if not self.vocab:
                    self.vocab = self.client.info()["vocab_size"]
                    for _ in range(2):
                        self.open_session()
                    continue
                if not self.sessions:
                    self.open_session()
                    continue
                op = self.rng.choices(names, weights)[0]
                getattr(self, f"op_{op}")(self.rng.choice(self.sessions))
            except SuffixdError as exc:  # Info or Tokenize (self.tokens) outside self.call
                self.tally.record("Tokenize/Info", 0.0, exc.code.name, False, self.node, mark,
                                  f"Tokenize/Info on {self.node.name}: {exc}")
        self.client.close()

    def op_append(self, sid: str) -> None:
        kind = self.rng.choice(["prompt", "tool", "generated", "response"])
        toks = self.tokens(self.rng.randint(8, 400))
        r = self.call("Append", lambda: self.client.append(self.ns, sid, toks, kind=kind))
        if r is not None:
            self.book.ack(self.key(sid), r.session_tokens)
            self.rotate(sid, r.session_tokens)

    def op_speculate(self, sid: str) -> None:
        if self.rng.random() < 0.5:
            self.call("Speculate", lambda: self.client.speculate(self.ns, sid, max_tokens=16))
        else:
            ctx = self.tokens(self.rng.randint(4, 64))
            self.call("Speculate", lambda: self.client.speculate(self.ns, None, ctx, 16))

    def op_stream(self, sid: str) -> None:
        t0 = time.perf_counter()
        mark = self.node.mark()
        status, detail = "OK", ""
        try:
            with self.client.stepper(self.ns, sid, max_tokens=16) as st:
                d = st.step()
                for i in range(self.rng.randint(3, 12)):
                    final = i == 11
                    toks = list(d.tokens[:3]) + self.tokens(1)
                    d = st.step(toks, final=final)
                    self.book.ack(self.key(sid), d.session_tokens)
                    if final:
                        break
                d = st.step(self.tokens(2), final=True, draft=False)
                self.book.ack(self.key(sid), d.session_tokens)
        except SuffixdError as exc:
            status = exc.code.name
            detail = f"SpeculateStream on {self.node.name}: {exc}"
        self.tally.record("SpeculateStream", time.perf_counter() - t0, status, False,
                          self.node, mark, detail)

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
    """A reply that is not what a valid request gets (the status is the tally's key).
    ``definite``: a whole answer that breaks its promise (output that is not JSON or breaks
    its schema), a failure even when a stop of the node overlapped the request."""

    def __init__(self, status: str, detail: str, definite: bool = False) -> None:
        super().__init__(detail)
        self.status = status
        self.definite = definite


@dataclass
class Streamed:
    events: int = 0
    done: bool = False  # ``[DONE]`` ended the events
    content: str = ""  # the chat deltas' content, joined
    finish: str | None = None


def sse_events(lines: Iterable[str], stop_after: int | None = None) -> Streamed:
    """The data events of a streamed answer; an error object in the stream raises
    HttpFailure."""
    out = Streamed()
    for line in lines:
        if not line.startswith("data: "):
            continue
        payload = line[len("data: "):]
        if payload == "[DONE]":
            out.done = True
            return out
        obj = json.loads(payload)
        if "error" in obj:
            raise HttpFailure("stream error", json.dumps(obj)[:300])
        out.events += 1
        for choice in obj.get("choices") or []:
            out.content += (choice.get("delta") or {}).get("content") or ""
            out.finish = choice.get("finish_reason") or out.finish
        if stop_after is not None and out.events >= stop_after:
            return out
    return out


def check_output(text: str, schema: Any, what: str) -> None:
    """A finished answer's JSON against the schema it was constrained to."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HttpFailure("output not JSON", f"{what}: {exc}: {text[:200]!r}; schema "
                          f"{json.dumps(schema)[:300]}", definite=True) from None
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as exc:
        raise HttpFailure("output breaks the schema", f"{what}: {exc.message[:200]}; "
                          f"output {text[:200]!r}; schema {json.dumps(schema)[:300]}",
                          definite=True) from None
    except jsonschema.SchemaError as exc:
        raise HttpFailure("200 for an invalid schema", f"{what}: {exc.message[:200]}; "
                          f"schema {json.dumps(schema)[:300]}", definite=True) from None
    except Exception as exc:  # an unresolvable $ref, ...: the schema should have been a 400
        raise HttpFailure("200 for a schema jsonschema cannot use",
                          f"{what}: {exc!r}"[:300] + f"; schema {json.dumps(schema)[:300]}",
                          definite=True) from None


class HttpWorker(threading.Thread):
    """A client of the nodes' OpenAI fronts (plain HTTP), alternating the nodes that are up."""

    def __init__(self, n: int, nodes: list[Node], tally: Tally, stop: threading.Event,
                 args: argparse.Namespace, leaves: list[Any]) -> None:
        super().__init__(name=f"soak-http-{n}", daemon=True)
        self.n = n
        self.nodes = nodes
        self.rng = random.Random(args.seed * 7919 + 5000 + n)
        self.schemas = SchemaGen(random.Random(args.seed * 7919 + 9000 + n), leaves)
        self.tally = tally
        self.stop_event = stop
        self.args = args
        self.http = httpx.Client(timeout=httpx.Timeout(120.0, connect=10.0))
        self.turn = 0
        # A conversation under the session header, on one node, closed after a few turns.
        self.conv_node = nodes[n % len(nodes)]
        self.conv_epoch = self.conv_node.epoch
        self.conv_grpc = Client(self.conv_node.target, retries=0, timeout=120)
        self.conv_sid = ""
        self.conv: list[dict[str, Any]] = []

    def node(self) -> Node:
        """The next node that is up (the next one anyway when none is: its calls are
        counted apart)."""
        for _ in range(len(self.nodes)):
            self.turn += 1
            node = self.nodes[(self.n + self.turn) % len(self.nodes)]
            if node.up:
                return node
        return node

    def sampling(self) -> dict[str, Any]:
        body: dict[str, Any] = {"model": "default", "max_tokens": self.rng.randint(8, 16)}
        if self.rng.random() < 0.3:
            body.update(temperature=0.8, seed=self.rng.randint(0, 1 << 31))
        else:
            body["temperature"] = 0
        return body

    def measured(self, what: str, fn: Callable[[], Any], node: Node,
                 want: int | None = None) -> None:
        """Run one request. ``want``: the documented status of a bad request. ``fn``
        returning REFUSED: a 400 the request was allowed to get (counted as refused)."""
        t0 = time.perf_counter()
        mark: tuple[int, bool] | None = node.mark()
        bad = want is not None
        status, detail = "OK", ""
        try:
            got = fn()
            if bad:
                if got != want:
                    raise HttpFailure(f"got {got} not {want}", f"{what}: status {got}")
                status = str(got)
            elif got == REFUSED:
                what, status, bad = f"{what} refused", "400", True
        except HttpFailure as exc:
            status, bad, detail = exc.status, False, f"HTTP {what} on {node.name}: {exc}"
            if exc.definite:
                mark = None  # no stop excuses it
        except httpx.TimeoutException as exc:
            status, bad = "timeout", False
            detail = f"HTTP {what} on {node.name}: timeout {exc!r}"
        except (httpx.HTTPError, json.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
            # a broken connection, or a body without the fields every answer has
            status, bad = type(exc).__name__, False
            detail = f"HTTP {what} on {node.name}: {exc!r}"
        self.tally.record(f"HTTP {what}", time.perf_counter() - t0, status, bad, node, mark,
                          detail)

    @staticmethod
    def check(r: httpx.Response) -> dict[str, Any]:
        if r.status_code != 200:
            raise HttpFailure(f"HTTP {r.status_code}", r.text[:300])
        return dict(r.json())

    def post(self, node: Node, path: str, body: dict[str, Any],
             headers: dict[str, str] | None = None) -> dict[str, Any]:
        return self.check(self.http.post(node.http + path, json=body, headers=headers))

    def stream(self, node: Node, path: str, body: dict[str, Any],
               headers: dict[str, str] | None = None, hang_up_after: int | None = None,
               ) -> Streamed:
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        with self.http.stream("POST", node.http + path, json=body, headers=headers) as r:
            if r.status_code != 200:
                r.read()
                raise HttpFailure(f"HTTP {r.status_code}", r.text[:300])
            got = sse_events(r.iter_lines(), hang_up_after)
            if hang_up_after is None and not got.done:
                raise HttpFailure("stream without [DONE]", f"{got.events} events")
            if got.events == 0:
                raise HttpFailure("empty stream", "no data event")
        # leaving the block early closes the connection: the daemon cancels the generation
        return got

    def run(self) -> None:
        ops = [("chat", 28), ("chat_stream", 18), ("conversation", 14), ("tools", 10),
               ("json", 8), ("completion", 10), ("models", 3), ("health", 3),
               ("hang_up", 4), ("bad", 6)]
        share = min(max(self.args.schema_share, 0.0), 0.95)
        base = sum(w for _, w in ops)
        ops.append(("schema", base * share / (1.0 - share)))
        names, weights = zip(*ops, strict=True)
        while not self.stop_event.is_set():
            if not any(n.up for n in self.nodes):
                self.stop_event.wait(0.2)
                continue
            getattr(self, f"op_{self.rng.choices(names, weights)[0]}")()
        self.http.close()
        self.conv_grpc.close()

    def ask(self) -> list[dict[str, Any]]:
        return [{"role": "user", "content": self.rng.choice(QUESTIONS)}]

    def op_chat(self) -> None:
        node, body = self.node(), {**self.sampling(), "messages": self.ask()}
        hdr = {"X-Suffixd-Namespace": f"soak{self.rng.randrange(self.args.namespaces)}"}
        self.measured("chat", lambda: self.post(node, "/chat/completions", body, hdr)
                      ["choices"][0]["message"], node)

    def op_chat_stream(self) -> None:
        node, body = self.node(), {**self.sampling(), "messages": self.ask()}
        self.measured("chat stream", lambda: self.stream(node, "/chat/completions", body), node)

    def op_conversation(self) -> None:
        """One turn of a conversation under the session header; after 3, it is closed."""
        node = self.conv_node
        if not node.up:
            self.op_chat()
            return
        if node.epoch != self.conv_epoch:
            self.conv_grpc.close()
            self.conv_grpc = Client(node.target, retries=0, timeout=120)
            self.conv_epoch = node.epoch
        if not self.conv_sid or len(self.conv) >= 5:
            if self.conv_sid:
                sid = self.conv_sid
                t0 = time.perf_counter()
                mark = node.mark()
                status, detail = "OK", ""
                try:
                    self.conv_grpc.close_session("http-conv", sid)
                except SuffixdError as exc:
                    status = exc.code.name
                    detail = f"CloseSession (HTTP conversation) on {node.name}: {exc}"
                self.tally.record("CloseSession", time.perf_counter() - t0, status, False,
                                  node, mark, detail)
            self.conv_sid, self.conv = f"conv-{self.n}-{uuid.uuid4().hex[:12]}", []
        self.conv.extend(self.ask())
        body = {**self.sampling(), "messages": self.conv}
        hdr = {"X-Suffixd-Namespace": "http-conv", "X-Suffixd-Session": self.conv_sid}

        def turn() -> None:
            msg = self.post(node, "/chat/completions", body, hdr)["choices"][0]["message"]
            self.conv.append({"role": "assistant", "content": msg.get("content") or ""})

        self.measured("chat session", turn, node)

    def op_tools(self) -> None:
        node, body = self.node(), self.sampling()
        choice: Any = self.rng.choice(["auto", "required", {
            "type": "function", "function": {"name": "get_weather"}}])
        body.update(messages=[{"role": "user", "content": QUESTIONS[0]}], tools=[WEATHER],
                    tool_choice=choice)
        if self.rng.random() < 0.5:
            self.measured("chat tools stream", lambda: self.stream(
                node, "/chat/completions", body), node)
        else:
            self.measured("chat tools", lambda: self.post(node, "/chat/completions", body)
                          ["choices"][0]["finish_reason"], node)

    def op_json(self) -> None:
        node, body = self.node(), {**self.sampling(), "messages": self.ask()}
        body["response_format"] = self.rng.choice([
            {"type": "json_object"},
            {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}])
        self.measured("chat json", lambda: self.post(node, "/chat/completions", body)
                      ["choices"][0]["message"], node)

    def op_schema(self) -> None:
        """A schema from the property test's generator, as a response_format (streamed or
        not) or as a required tool's parameters: a 200 whose finished output is valid
        against it, or a 400 in milliseconds (bounded by --refusal-bound)."""
        node, rng, schema = self.node(), self.rng, self.schemas.draw()
        where = rng.choice(["response_format", "tools"] if self.args.schema_in == "both"
                           else [self.args.schema_in])
        body: dict[str, Any] = {
            # A call's wrapper (the generic format's {"tool_call": {"name": ...,
            # "arguments": ...}}) takes ~15 tokens before its arguments: without more,
            # hardly any call would finish and be checked.
            "model": "default", "max_tokens": rng.randint(16, 40) if where ==
            "response_format" else rng.randint(40, 64),
            "messages": [{"role": "user", "content": "Answer in JSON."}],
            **({"temperature": 0.8, "seed": rng.randint(0, 1 << 31)} if rng.random() < 0.3
               else {"temperature": 0})}
        streamed = where == "response_format" and rng.random() < 0.3
        if where == "response_format":
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "x", "schema": schema}}
        else:
            body["tools"] = [{"type": "function", "function": {"name": "f",
                                                                "parameters": schema}}]
            body["tool_choice"] = rng.choice(
                ["required", {"type": "function", "function": {"name": "f"}}])
        what = f"schema {where}" + (" stream" if streamed else "")
        url = node.http + "/chat/completions"

        def refused(r: httpx.Response, took: float) -> str:
            if took > self.args.refusal_bound:
                raise HttpFailure("slow 400", f"{what}: a 400 in {took:.2f} s: {r.text[:200]}")
            self.tally.count_schema(f"{where}: 400")
            return REFUSED

        def go() -> str | None:
            t0 = time.perf_counter()
            if streamed:
                payload = {**body, "stream": True}
                with self.http.stream("POST", url, json=payload) as r:
                    if r.status_code != 200:
                        r.read()
                        if r.status_code == 400:
                            return refused(r, time.perf_counter() - t0)
                        raise HttpFailure(f"HTTP {r.status_code}", r.text[:300])
                    got = sse_events(r.iter_lines())
                if not got.done:
                    raise HttpFailure("stream without [DONE]", f"{got.events} events")
                finish, texts = got.finish, [got.content]
            else:
                r = self.http.post(url, json=body)
                if r.status_code == 400:
                    return refused(r, time.perf_counter() - t0)
                choice = self.check(r)["choices"][0]
                finish, message = choice["finish_reason"], choice["message"]
                calls = message.get("tool_calls") or []
                if where == "tools" and finish in ("stop", "tool_calls") and not calls:
                    raise HttpFailure("no call where one is required",
                                      f"{what}: {json.dumps(message)[:300]}", definite=True)
                if any(c["function"]["name"] != "f" for c in calls):
                    raise HttpFailure("call of an unknown function",
                                      f"{what}: {json.dumps(calls)[:300]}", definite=True)
                texts = ([c["function"]["arguments"] for c in calls] if where == "tools"
                         else [message.get("content") or ""])
            if finish not in ("stop", "tool_calls"):
                self.tally.count_schema(f"{where}: 200 unfinished ({finish})")
                return None
            for text in texts:
                check_output(text, schema, what)
            self.tally.count_schema(f"{where}: 200 valid")
            return None

        self.measured(what, go, node)

    def op_completion(self) -> None:
        node, body = self.node(), {**self.sampling(), "prompt": self.rng.choice(TEXTS)}
        if self.rng.random() < 0.5:
            self.measured("completion stream", lambda: self.stream(node, "/completions", body),
                          node)
        else:
            self.measured("completion", lambda: self.post(node, "/completions", body)
                          ["choices"][0]["text"], node)

    def op_models(self) -> None:
        node = self.node()
        self.measured("models", lambda: self.check(self.http.get(node.http + "/models"))
                      ["data"][0]["id"], node)

    def op_health(self) -> None:
        node = self.node()
        ready = node.ready

        def go() -> Any:
            r = self.http.get(node.http.removesuffix("/v1") + "/health")
            if r.status_code == 503 and not ready:
                return None  # restarted, its model not loaded yet: 503 is the documented answer
            return self.check(r)["status"]

        self.measured("health", go, node)

    def op_hang_up(self) -> None:
        node, body = self.node(), {**self.sampling(), "messages": self.ask(), "max_tokens": 64}
        self.measured("chat stream hung up", lambda: self.stream(
            node, "/chat/completions", body, hang_up_after=2), node)

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

        self.measured(f"bad {what}", go, node, want=want)



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


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


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


def serving(node: Node, timeout: float = 300.0) -> None:
    """A restarted node ready: its model loaded (a first generation) and its /health 200.
    Not its costs measured: a profile stored as measured under load is measured again in
    the gaps between requests, which a soak under full load may never leave."""
    c = Client(node.target, timeout=timeout)
    try:
        list(c.generate(None, prompt="Hello", max_tokens=2))
    finally:
        c.close()
    deadline = time.monotonic() + timeout
    while True:
        r = httpx.get(node.http.removesuffix("/v1") + "/health", timeout=30)
        if r.status_code == 200:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"/health of {node.name} still {r.status_code}: {r.text[:200]}")
        time.sleep(0.2)


def warm(node: Node) -> None:
    """The verifier loaded and its costs measured (or read back): a node is ready for the
    HTTP /health (and a measurement beside the soak's first minutes would distort it)."""
    c = Client(node.target, timeout=600)
    try:
        list(c.generate(None, prompt="Hello", max_tokens=2))
    finally:
        c.close()
    wait_measured(node.proc, node.target)


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


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
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
    ap.add_argument("--schema-share", type=float, default=0.15,
                    help="Share of the OpenAI-front requests that carry a schema from the "
                    "property test's generator (0: none).")
    ap.add_argument("--schema-in", choices=["both", "response_format", "tools"],
                    default="both", help="Where those schemas go: a response_format "
                    "json_schema, a required tool's parameters, or either.")
    ap.add_argument("--refusal-bound", type=float, default=5.0,
                    help="Seconds a 400 for a generated schema may take (refusals are "
                    "milliseconds; this leaves room for a loaded machine).")
    ap.add_argument("--events-every", type=float, default=120.0,
                    help="Mean seconds between stops/kills of a node during the run, at "
                    "random moments after the warm-up (0: none, only the final kill -9).")
    ap.add_argument("--sigterm-share", type=float, default=0.5,
                    help="Share of those events that are SIGTERM (the rest: kill -9).")
    ap.add_argument("--early-share", type=float, default=0.3,
                    help="Share of the restarts stopped again (SIGTERM or kill -9, by "
                    "--sigterm-share) at a random moment of their start-up.")
    ap.add_argument("--early-window", type=float, default=4.0,
                    help="Seconds after a restart's \"starting\" line within which such a "
                    "second stop comes (start-up takes 1-3 s, then the model loads).")
    ap.add_argument("--rss-budget-mib", type=float, default=1536.0,
                    help="Each node's RSS budget: the peak (VmHWM) of every process of it.")
    ap.add_argument("--prompt-cache-mb", type=int, default=64,
                    help="The daemons' --prompt-cache-mb (its budget; small, so it is "
                    "reached within minutes: ~5 MiB a minute of checkpoints come).")
    ap.add_argument("--memory-interval", type=float, default=30.0,
                    help="Seconds between samples of each node's RSS and its parts "
                    "(Stats' process memory).")
    ap.add_argument("--flat-window", type=float, default=20.0,
                    help="Minutes at the end of the run over which RSS must be flat (at "
                    "most a third of the run).")
    ap.add_argument("--flat-mib", type=float, default=16.0,
                    help="RSS is flat when its trend over the window is at most this many "
                    "MiB, or --flat-pct of it, whichever is larger.")
    ap.add_argument("--flat-pct", type=float, default=2.0,
                    help="... or this percentage of the window's mean RSS.")
    ap.add_argument("--require-flat", action="store_true",
                    help="Fail the run when a node's RSS is not flat over the window.")
    ap.add_argument("--memory-report", type=Path, default=None,
                    help="Also write the memory samples and verdicts here, as markdown.")
    ap.add_argument("--seed", type=int, default=0,
                    help="Seeds the schedule, the schemas and the clients' choices.")
    ap.add_argument("--data-dir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="Also write the report here.")
    args = ap.parse_args()

    work = args.data_dir or Path(tempfile.mkdtemp(prefix="suffixd-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    threads = args.threads or (1 if args.fleet else 2)
    daemon_args = ["--global-budget-tokens", str(args.global_budget), "--threads", str(threads),
                   "--prompt-cache-mb", str(args.prompt_cache_mb)]
    redis = Redis(work) if args.fleet else None
    names = "ab" if args.fleet else "a"
    nodes = [Node(n, work / n / "data", work / n / "daemon.log",
                  daemon_args + (["--fleet", redis.url, "--node-id", n] if redis else []),
                  {"SUFFIXD_AUTO_SESSIONS_PER_NAMESPACE": str(args.auto_sessions)})
             for n in names]
    load_start = os.getloadavg()
    try:
        report = soak(args, nodes, threads)
    except NodeError as exc:
        sys.exit(str(exc))
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
    if args.memory_report:
        args.memory_report.write_text(markdown({**report["memory"],
                                                "command": report["command"],
                                                "date": report["date"],
                                                "seconds": report["seconds"]}))
    sys.exit(0 if report["passed"] else 1)


def soak(args: argparse.Namespace, nodes: list[Node], threads: int) -> dict[str, Any]:
    for node in nodes:
        node.data.parent.mkdir(parents=True, exist_ok=True)
        node.start()
        node.up = True
        # The verifier loaded and its costs measured (or read back) before the clock
        # starts, one node after the other: two measurements at once distort both.
        warm(node)
        node.ready = True
    leaves = _strategy_leaves()
    tally = Tally()
    stop = threading.Event()
    book = Book()
    workers: list[threading.Thread] = [
        Worker(i, nodes[i % len(nodes)], tally, stop, book, args) for i in range(args.clients)]
    workers += [HttpWorker(i, nodes, tally, stop, args, leaves)
                for i in range(args.http_clients)]
    probe = Probe(nodes, tally, stop, args.probe_interval) if len(nodes) > 1 else None
    t0 = time.monotonic()
    warmup = min(30.0, args.minutes * 6)
    # The last event leaves time for its restart and checks before the final kill.
    schedule = make_schedule(args, nodes, warmup, args.minutes * 60 - 45)
    chaos = Chaos(nodes, tally, book, probe, schedule, t0, args)
    print("schedule: " + (", ".join(f"{e.sig.name} of {e.node.name} at {e.at_s:.0f} s"
                                    for e in schedule) or "none"), flush=True)
    for w in workers + ([probe] if probe else []):
        w.start()
    chaos.start()
    time.sleep(warmup)  # sessions opened, first trees built

    def sample() -> tuple[int, ...]:
        for n in nodes:
            if n.up:
                n.note_peak()
        return (round(time.monotonic() - t0), *(round(n.rss()) if n.up else 0 for n in nodes))

    rss = [sample()]
    trees: dict[str, list[tuple[int, int, int, int]]] = {n.name: [] for n in nodes}
    tree_over: list[str] = []

    def sample_trees(t: int) -> None:
        for n in nodes:
            tokens, evictions, sessions, over = tree_sample(n) if n.up else (-1, -1, -1, [])
            trees[n.name].append((t, tokens, evictions, sessions))
            tree_over.extend(f"{t} s, node {n.name}: {what}" for what in over)

    sample_trees(rss[0][0])
    memory_stop = threading.Event()
    watch = MemoryWatch(lambda: [(n.name, n.proc.pid, n.target) for n in nodes if n.up],
                        args.memory_interval, t0, memory_stop)
    watch.start()
    end = t0 + args.minutes * 60
    while time.monotonic() < end:
        time.sleep(min(60.0, max(0.0, end - time.monotonic())))
        rss.append(sample())
        sample_trees(rss[-1][0])
        lag = f"  probes {len(probe.lags)}/{probe.sent} seen" if probe else ""
        print(f"{rss[-1][0]:>5} s  " + "  ".join(
            f"{n.name}: RSS {m} MiB (peak {n.peak_mib:.0f}), global "
            f"{trees[n.name][-1][1] / 1e3:.0f}k tokens, {trees[n.name][-1][3]} open sessions"
            if m else f"{n.name}: down (restarting)"
            for n, m in zip(nodes, rss[-1][1:], strict=True))
            + f"  served {sum(tally.ok.values()):,}  unexpected "
            f"{sum(tally.unexpected.values())}  stops {len(chaos.events)}{lag}  "
            f"load {os.getloadavg()[0]:.1f}", flush=True)
        for n in nodes:
            last = (watch.of(n.name) or [{}])[-1]
            if last.get("parts"):
                print("        " + n.name + ": " + ", ".join(
                    f"{k} {v:.0f}" for k, v in last["parts"].items()) + " MiB", flush=True)
    # The schedule ends before the final kill, and an event under way finishes (its node
    # restarted and checked) first.
    memory_stop.set()
    watch.join(timeout=120)
    memory_end_s = time.monotonic() - t0
    chaos.stop_event.set()
    chaos.join(timeout=1800)  # a restart's checks are bounded (rebuild 600 s, model 300 s)
    if chaos.is_alive():
        chaos.failures.append("the stop/kill thread did not finish its last restart")
    load_end = os.getloadavg()
    for n in nodes:
        if n.up:
            n.note_peak()
    # kill -9 of every node with the clients still sending: whatever was acknowledged
    # must survive.
    live = [n for n in nodes if n.up]
    with book.lock, tally.lock:
        tally.killed = True
        for n in live:
            n.proc.send_signal(signal.SIGKILL)
    final_rc = {n.name: n.proc.wait() for n in live}
    snapshot = {n.name: book.snapshot(n.name) for n in live}
    if probe:
        with probe.lock:
            probes = {n.name: list(n.acked_probes) for n in nodes}
    else:
        probes = {n.name: [] for n in nodes}
    elapsed = time.monotonic() - t0
    stop.set()
    for w in workers + ([probe] if probe else []):
        w.join(timeout=60)
    after: dict[str, Any] = {}
    for n in live:  # restarted together: the fleet's peers come back at once
        n.start()
    for n in live:
        after[n.name] = {"rc": final_rc[n.name],
                         **check_lost(n.target, snapshot[n.name],
                                      functools.partial(book.excused, n.name)),
                         **check_probes(n, probes[n.name])}
    for n in live:
        n.proc.send_signal(signal.SIGTERM)
    crashes = list(chaos.crashes)
    for n in live:
        try:
            rc = n.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            n.proc.kill()
            rc = "hung"
        after[n.name]["sigterm_rc"] = rc
        if rc != 0:
            crashes.append({"node": n.name, "rc": rc, "what": "final SIGTERM",
                            "log_tail": n.log_tail(1500)})

    def rss_of(i: int, node: Node) -> dict[str, Any]:
        xs = [(s[0], s[1 + i] or None) for s in rss]
        up = [(t, m) for t, m in xs if m is not None]
        # Growth over the last process's life, where it spans the second half of the run.
        restarts = [e["at_s"] for e in chaos.events if e["node"] == node.name]
        last = [(t, m) for t, m in up if not restarts or t > max(restarts)]
        half = next((m for t, m in last if t >= xs[-1][0] / 2), None)
        return {"start": up[0][1] if up else None, "end": up[-1][1] if up else None,
                "max": max((m for _, m in up), default=None), "peak_hwm": round(node.peak_mib),
                "budget": args.rss_budget_mib,
                "within_budget": node.peak_mib <= args.rss_budget_mib,
                "growth_second_half": (last[-1][1] - half) if last and half is not None
                else None,
                "restarted_at_s": restarts, "samples": xs}

    lags = probe.lags if probe else []
    never = probe.never_seen if probe else []
    unexpected = sum(tally.unexpected.values())
    lost_all = sum(a["lost_tokens"] for a in [*after.values(), *chaos.events]
                   if "lost_tokens" in a)
    missing_sessions = sum(a.get("sessions_missing", 0) for a in [*after.values(),
                                                                    *chaos.events])
    missing = sum(a.get("probes_missing", 0) for a in [*after.values(), *chaos.events])
    rss_report = {n.name: rss_of(i, n) for i, n in enumerate(nodes)}
    over_rss = [n for n, r in rss_report.items() if not r["within_budget"]]
    failures = list(chaos.failures) + [f"node {n.name} down at the end" for n in nodes
                                       if n not in live]
    # RSS flat at the end: the last --flat-window minutes, at most a third of the run
    window_s = min(args.flat_window * 60, memory_end_s / 3)
    verdicts = {n.name: flat(watch.of(n.name), memory_end_s, window_s, args.flat_mib,
                             args.flat_pct / 100) for n in nodes}
    if args.require_flat:
        failures += [f"node {name}: RSS not flat over the last {window_s / 60:.0f} min "
                     f"({v.get('growth_mib')} MiB > {v.get('limit_mib')})"
                     if v["flat"] is False else
                     f"node {name}: RSS flatness not judged ({v.get('why')})"
                     for name, v in verdicts.items() if not v["flat"]]
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
        "schema_answers": dict(sorted(tally.schema.items())),
        "stops_and_kills": [{k: v for k, v in e.items() if k != "log_tail"}
                            for e in chaos.events],
        "crashes": crashes,
        "failures": failures,
        "in_flight_at_stops": dict(tally.at_stop),
        "in_flight_at_kill": dict(tally.at_kill),
        "rss_mib": rss_report,
        "memory": {"interval_s": args.memory_interval, "verdicts": verdicts,
                   "samples": {n.name: watch.of(n.name) for n in nodes}},
        "global_tokens_evictions_open_sessions": trees,
        "global_over_budget": tree_over,
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
        "passed": not (unexpected or lost_all or missing or never or crashes or failures
                       or missing_sessions or over_rss or tree_over),
    }


if __name__ == "__main__":
    main()
