"""The soak's OpenAI-front clients: ``HttpWorker`` threads (chat, streams, conversations,
tools, JSON and generated schemas, completions, bad requests) and the checks of their
answers (``sse_events``, ``check_output``, ``HttpFailure``).
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import httpx
import jsonschema
from suffixd.client import Client, SuffixdError

from soak.books import Tally
from soak.grpc_workers import TEXTS
from soak.nodes import Node
from soak.schemas import SchemaGen

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
