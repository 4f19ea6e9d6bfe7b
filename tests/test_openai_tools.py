"""Tool calls and structured output through the OpenAI endpoint, with the official
``openai`` client against a real daemon (`suffixd serve --http`) on the embedded model
(gemma-3, whose GGUF has no chat template: calls come in the generic JSON format, held to
the tools' schemas by a grammar)."""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"},
                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
        },
    },
}
RUN = {
    "type": "function",
    "function": {
        "name": "run_shell",
        "description": "Run a shell command and return its output.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                       "required": ["command"]},
    },
}
ASK = [{"role": "system", "content": "You are a helpful assistant with tools."},
       {"role": "user", "content": "What is the weather in Paris, in celsius?"}]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tests.conftest import DaemonProcess

    proc = DaemonProcess(tmp_path_factory.mktemp("tools") / "data",
                         ["--http", "127.0.0.1:0"]).start()
    proc.oai = openai.OpenAI(base_url=proc.http, api_key="none", max_retries=0, timeout=300)
    yield proc
    proc.stop()


def _valid_weather_args(arguments: str) -> dict[str, Any]:
    args = json.loads(arguments)
    assert set(args) == {"city", "unit"}
    assert isinstance(args["city"], str) and args["unit"] in ("celsius", "fahrenheit")
    return args


@pytest.mark.parametrize("choice", ["required", "named"])
def test_a_required_or_named_call_is_parsed_and_schema_valid(daemon: Any, choice: str) -> None:
    tool_choice: Any = "required" if choice == "required" else {
        "type": "function", "function": {"name": "get_weather"}}
    r = daemon.oai.chat.completions.create(
        model="default", messages=ASK, tools=[RUN, WEATHER], tool_choice=tool_choice,
        parallel_tool_calls=False, max_tokens=96, temperature=0,
        extra_headers={"X-Suffixd-Namespace": f"tools-{choice}"})
    choice0 = r.choices[0]
    assert choice0.finish_reason == "tool_calls"
    calls = choice0.message.tool_calls
    assert calls and len(calls) == 1
    call = calls[0]
    assert call.id.startswith("call_") and call.type == "function"
    if choice == "named":
        assert call.function.name == "get_weather"
    if call.function.name == "get_weather":
        _valid_weather_args(call.function.arguments)
    else:
        assert call.function.name == "run_shell"
        assert isinstance(json.loads(call.function.arguments)["command"], str)


def _stream(daemon: Any, ns: str, ids: list[int] | None = None, **kwargs: Any
            ) -> tuple[str, dict[int, dict[str, Any]], str | None]:
    """A streamed answer as the SDK's deltas add up: content, calls (with each call's
    argument fragments and the event each arrived in), finish reason; the events'
    ``token_ids`` joined into ``ids``."""
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    content = ""
    for n, ev in enumerate(daemon.oai.chat.completions.create(
            **kwargs, stream=True, extra_headers={"X-Suffixd-Namespace": ns})):
        if not ev.choices:
            continue
        delta = ev.choices[0].delta
        if ids is not None:
            ids += (ev.choices[0].model_extra or {}).get("token_ids") or []
        content += delta.content or ""
        for tc in delta.tool_calls or ():
            slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": "",
                                               "first": None, "fragments": []})
            if slot["first"] is None:  # the call's first delta: id, type, name, no arguments
                assert tc.id and tc.type == "function" and tc.function.name
                assert tc.function.arguments == ""
                slot["first"] = n
            slot["id"] += tc.id or ""
            if tc.function is not None:
                slot["name"] += tc.function.name or ""
                if tc.function.arguments:
                    slot["arguments"] += tc.function.arguments
                    slot["fragments"].append((n, tc.function.arguments))
        if ev.choices[0].finish_reason:
            finish = ev.choices[0].finish_reason
            end = n
    for slot in calls.values():
        slot["end"] = end
    return content, calls, finish


@pytest.mark.parametrize("parallel", [False, True])
def test_streamed_calls_stream_and_assemble_as_the_sdk_does(daemon: Any, parallel: bool,
                                                             ) -> None:
    """Streamed, a call's id and name come first, then its arguments as they are generated
    (the first fragment long before the call is complete); assembled, the calls are the
    answer that was not streamed."""
    kwargs: dict[str, Any] = dict(
        model="default", messages=ASK, tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        parallel_tool_calls=parallel, max_tokens=96, temperature=0,
        extra_body={"return_token_ids": True})
    whole = daemon.oai.chat.completions.create(
        **kwargs, extra_headers={"X-Suffixd-Namespace": f"tools-whole-{parallel}"})
    ids: list[int] = []
    content, calls, finish = _stream(daemon, f"tools-stream-{parallel}", ids, **kwargs)
    # the call's text is held back while it may still be a call: its steps' token ids go
    # in events of their own, and joined they are the whole answer's
    assert ids and ids == whole.choices[0].model_extra["token_ids"]
    # Allowed parallel calls, the 270M model may go on adding calls until max_tokens: then
    # the last is cut short, in both answers alike (as OpenAI answers a cut call).
    assert finish == whole.choices[0].finish_reason
    assert finish == "tool_calls" or parallel and finish == "length"
    assert content == ""
    want = whole.choices[0].message.tool_calls
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (c.function.name, c.function.arguments) for c in want]
    assert all(c["id"].startswith("call_") for c in calls.values())
    first = calls[0]
    assert first["name"] == "get_weather"
    if finish == "tool_calls" or len(calls) > 1:
        _valid_weather_args(first["arguments"])
    # the arguments came in pieces as they were generated: the first piece, a proper
    # prefix of them, in an event before the one that completed them
    assert len(first["fragments"]) > 2
    (at, piece), (last_at, _) = first["fragments"][0], first["fragments"][-1]
    assert first["arguments"].startswith(piece) and piece != first["arguments"]
    assert first["first"] <= at < last_at < first["end"]


def test_a_tool_loop_continues_its_session_and_reuses_its_kv(daemon: Any) -> None:
    """The agent loop: call, tool result in the history, next turn. The second request
    carries no session header; it is found from the history, and the reply rendered
    back as the model wrote it keeps the whole first turn in the KV cache."""
    ns = {"X-Suffixd-Namespace": "tools-loop"}
    msgs: list[Any] = list(ASK)
    first = daemon.oai.chat.completions.create(
        model="default", messages=msgs, tools=[WEATHER], tool_choice="required",
        parallel_tool_calls=False, max_tokens=96, temperature=0, extra_headers=ns)
    meta1 = first.model_extra["suffixd"]
    assert first.choices[0].finish_reason == "tool_calls"
    call = first.choices[0].message.tool_calls[0]
    msgs.append(first.choices[0].message.model_dump(exclude_none=True))
    msgs.append({"role": "tool", "tool_call_id": call.id,
                 "content": json.dumps({"temperature": 18, "sky": "clear"})})
    second = daemon.oai.chat.completions.create(
        model="default", messages=msgs, tools=[WEATHER], tool_choice="auto",
        parallel_tool_calls=False, max_tokens=48, temperature=0, extra_headers=ns)
    meta2 = second.model_extra["suffixd"]
    assert meta2["session_found"] and meta2["session"] == meta1["session"]
    # everything up to the first reply's end was in the KV cache already
    assert second.usage.prompt_tokens_details.cached_tokens >= \
        first.usage.prompt_tokens + first.usage.completion_tokens - 1
    # auto on the generic format: a call, or a reply in content; never raw JSON
    # (a call cut by max_tokens stays a call, finish_reason "length", as OpenAI's)
    msg2 = second.choices[0].message
    if msg2.tool_calls:
        assert msg2.tool_calls[0].function.name == "get_weather"
        assert second.choices[0].finish_reason in ("tool_calls", "length")
    else:
        assert second.choices[0].finish_reason != "tool_calls"
        assert not (msg2.content or "").lstrip().startswith('{"response"')


def test_response_format_json_schema_validates(daemon: Any) -> None:
    schema = {"type": "object",
              "properties": {"name": {"type": "string", "maxLength": 40},
                             "age": {"type": "integer"},
                             "tags": {"type": "array", "maxItems": 3,
                                      "items": {"type": "string", "maxLength": 20}}},
              "required": ["name", "age", "tags"], "additionalProperties": False}
    r = daemon.oai.chat.completions.create(
        model="default", temperature=0, max_tokens=160,
        messages=[{"role": "user", "content": "Describe a person as JSON."}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": schema}},
        extra_headers={"X-Suffixd-Namespace": "json"})
    assert r.choices[0].finish_reason == "stop"
    obj = json.loads(r.choices[0].message.content)
    assert set(obj) == {"name", "age", "tags"}
    assert isinstance(obj["name"], str) and isinstance(obj["age"], int)
    assert all(isinstance(t, str) for t in obj["tags"])
    r2 = daemon.oai.chat.completions.create(
        model="default", temperature=0, max_tokens=48,
        messages=[{"role": "user", "content": "Describe a person."}],
        response_format={"type": "json_object"}, extra_headers={"X-Suffixd-Namespace": "json"})
    # Unconstrained, the model answers this in prose. Held to a JSON object, the 270M model
    # goes on adding keys until max_tokens: the text so far must be that object's start.
    text = r2.choices[0].message.content
    assert text.startswith("{")
    if r2.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:
        assert _json_prefix(text), text


def _json_prefix(text: str) -> bool:
    """Whether ``text`` is the start of some JSON document: closed by what it left open
    (a string, a literal, a value after a key, its brackets), it parses."""
    stack, in_str, esc = [], False, False
    for ch in text:
        if in_str:
            esc, in_str = (False, True) if esc else (ch == "\\", ch != '"')
        elif ch == '"':
            in_str = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]" and (not stack or stack.pop() != ch):
            return False
    tail = text + (("n" if esc else "") + '"' if in_str else "")
    closers = "".join(reversed(stack))
    for fill in ("", "null", 'e": null', "ue", "se", "ll", "0", ": null"):
        for cut in ("", ","):
            body = tail.rstrip()
            body = body[: -len(cut)] if cut and body.endswith(cut) else body
            try:
                json.loads(body + fill + closers)
                return True
            except ValueError:
                continue
    return False


def test_constrained_greedy_with_drafts_equals_without(daemon: Any) -> None:
    """The same constrained request twice in one namespace: the second is drafted from
    the first (its response is in the global tree) and must give the same tokens."""
    kwargs: dict[str, Any] = dict(
        model="default", messages=ASK, tools=[RUN, WEATHER], tool_choice="required",
        parallel_tool_calls=False, max_tokens=96, temperature=0)
    one = daemon.oai.chat.completions.create(
        **kwargs, extra_headers={"X-Suffixd-Namespace": "tools-drafted",
                                 "X-Suffixd-Session": "s-plain"})
    two = daemon.oai.chat.completions.create(
        **kwargs, extra_headers={"X-Suffixd-Namespace": "tools-drafted",
                                 "X-Suffixd-Session": "s-drafted"})
    assert two.model_extra["suffixd"]["accepted"] > 0  # drafts were used
    a, b = one.choices[0].message.tool_calls, two.choices[0].message.tool_calls
    assert [(c.function.name, c.function.arguments) for c in a] == \
        [(c.function.name, c.function.arguments) for c in b]


@pytest.mark.parametrize(("body", "param"), [
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]},
     "tools[0].function.name"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format"),
    ({"messages": [{"role": "user", "content": "hi"},
                   {"role": "tool", "tool_call_id": "call_nowhere", "content": "18 C"}]},
     "messages[1].tool_call_id"),
    ({"messages": [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": "{}"}}]},
                   {"role": "tool", "tool_call_id": "call_2", "content": "18 C"}]},
     "messages[3].tool_call_id"),
])
def test_bad_tools_and_formats_are_400s(daemon: Any, body: dict[str, Any], param: str) -> None:
    r = httpx.post(f"{daemon.http}/chat/completions", timeout=120, json={
        "model": "default", "max_tokens": 4,
        "messages": [{"role": "user", "content": "hi"}], **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_the_readme_example_works_as_written(daemon: Any, capsys: pytest.CaptureFixture[str],
                                             ) -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = readme.split("<!-- readme-tools-example -->", 1)[1]
    code = block.split("```python\n", 1)[1].split("```", 1)[0]
    assert 'base_url="http://127.0.0.1:8080/v1"' in code
    exec(code.replace("http://127.0.0.1:8080/v1", daemon.http), {})  # noqa: S102
    first, second = capsys.readouterr().out.strip().splitlines()
    name, args = first.split(" ", 1)
    assert name == "get_weather"
    assert "'city'" in args and "'unit'" in args
    person = ast.literal_eval(second)
    assert set(person) == {"name", "age"} and isinstance(person["age"], int)


PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 30},
                         "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
PERSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}


def _person(text: str) -> None:
    obj = json.loads(text)
    assert set(obj) == {"name", "age"}
    assert isinstance(obj["name"], str) and isinstance(obj["age"], int)


def test_response_format_with_tools_is_calls_or_the_format(daemon: Any) -> None:
    """As OpenAI serves both: tools when called, the format otherwise."""
    ask = [{"role": "user", "content": "Describe a person: name and age."}]
    base: dict[str, Any] = dict(model="default", tools=[WEATHER],
                                response_format=PERSON_FORMAT, max_tokens=64, temperature=0)
    # no call allowed: the format's JSON, in content
    r = daemon.oai.chat.completions.create(
        **base, messages=ask, tool_choice="none",
        extra_headers={"X-Suffixd-Namespace": "fmt-tools"})
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.tool_calls is None
    _person(r.choices[0].message.content)
    # a call required: the call, the format has no say
    r = daemon.oai.chat.completions.create(
        **base, messages=ASK, tool_choice="required", parallel_tool_calls=False,
        extra_headers={"X-Suffixd-Namespace": "fmt-tools"})
    assert r.choices[0].finish_reason == "tool_calls"
    _valid_weather_args(r.choices[0].message.tool_calls[0].function.arguments)
    # auto: one or the other, and streamed the same as not
    for messages in (ask, ASK):
        kwargs = dict(base, messages=messages, tool_choice="auto", parallel_tool_calls=False)
        r = daemon.oai.chat.completions.create(
            **kwargs, extra_headers={"X-Suffixd-Namespace": "fmt-tools-auto"})
        msg = r.choices[0].message
        content, calls, finish = _stream(daemon, "fmt-tools-auto-stream", **kwargs)
        assert finish == r.choices[0].finish_reason
        if finish == "tool_calls":
            assert msg.tool_calls and not content
            _valid_weather_args(msg.tool_calls[0].function.arguments)
            assert [(c["name"], c["arguments"]) for c in calls.values()] == [
                (c.function.name, c.function.arguments) for c in msg.tool_calls]
        else:
            assert finish == "stop" and msg.tool_calls is None and not calls
            _person(msg.content)
            assert content == msg.content
