"""The soak's gRPC clients: ``Worker`` threads appending, speculating, streaming,
generating, reading stats and sending bad inputs to one node each.
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from suffixd.client import Client, SuffixdError

from soak.books import Book, Tally
from soak.nodes import Node

TEXTS = [
    "SELECT name, country, age FROM singer ORDER BY age DESC ;",
    "SELECT count(*) FROM concert WHERE year = 2014 OR year = 2015 ;",
    "def test_view(self):\n    response = self.client.get('/admin/')\n    self.assertEqual(",
    "The committee met on Tuesday to review the budget and the schedule of the works.",
    "git diff --stat HEAD~1 && pytest -q tests/test_models.py -k migration",
]

GENERATE_TURNS = 20  # Generate calls per session (op_generate)


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
        self.generated = 0

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
        # Closed after GENERATE_TURNS calls, as an agent's task ends: one session taking
        # every call grew without end (~100 MiB of session trees an hour), a budget the
        # daemon is right to grant and RSS that is never flat.
        gen = f"gen-{self.n}-{self.generated // GENERATE_TURNS}"
        self.call("Generate", lambda: list(self.client.generate(
            gen, namespace=self.ns, prompt=prompt, max_tokens=16)))
        self.generated += 1
        if self.generated % GENERATE_TURNS == 0:
            self.call("CloseSession", lambda: self.client.close_session(self.ns, gen))

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
