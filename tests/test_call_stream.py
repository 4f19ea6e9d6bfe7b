"""suffixd.daemon.http_api.tool_calls.CallStream: tool calls read while they are generated.

Properties: fed in any pieces, the stream gives what ``parse`` gives for the finished
output (content, names, arguments text) whenever that output has calls; what it releases
is never taken back; a call's id and name go out once its name is read and its arguments
while they are written. No model: the formats' own rendering makes the outputs.
"""

from __future__ import annotations

import json
import random
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings
from suffixd.daemon.http_api.tool_calls import (
    FORMATS,
    GENERIC,
    HERMES,
    LLAMA3_JSON,
    MISTRAL,
    CallStream,
    ToolFormat,
    call_stream,
)

from tests.test_tool_calls import (
    CONTENT,
    MALFORMED,
    MISTRAL_IDS,
    SOUP,
    VALUES,
    calls_strategy,
    make_calls,
)

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Client:
    """What an OpenAI client assembles from the deltas, and when each arrived."""

    def __init__(self) -> None:
        self.content = ""
        self.calls: dict[int, dict[str, str]] = {}
        self.first_args_at: dict[int, int] = {}  # call index -> characters fed by then

    def take(self, content: str, deltas: list[Any], fed: int) -> None:
        self.content += content
        for d in deltas:
            slot = self.calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
            if d.id:
                assert not slot["id"], "a call's id is sent once"
                assert d.name and not d.arguments
            slot["id"] += d.id
            slot["name"] += d.name
            slot["arguments"] += d.arguments
            if d.arguments:
                self.first_args_at.setdefault(d.index, fed)


def run(fmt: ToolFormat, text: str, cuts: list[int] | None = None, *,
        strict: bool = False) -> tuple[Client, Any, CallStream]:
    stream = call_stream(fmt, strict=strict)
    client = Client()
    bounds = sorted({0, len(text), *(c for c in cuts or () if 0 < c < len(text))})
    for a, b in zip(bounds, bounds[1:], strict=False):
        content, deltas = stream.feed(text[a:b])
        client.take(content, deltas, b)
    end = stream.finish()
    client.take(end.content_rest, end.deltas, len(text))
    assert client.content == end.content
    assert [(c["id"], c["name"], c["arguments"]) for c in client.calls.values()] == [
        (c.id, c.name, c.arguments) for c in end.calls]
    return client, end, stream


def every_char(text: str) -> list[int]:
    return list(range(1, len(text)))


def assert_as_parse(fmt: ToolFormat, text: str, end: Any) -> None:
    parsed = fmt.parse(text)
    assert end.content == parsed.content
    assert [(c.name, c.arguments) for c in end.calls] == [
        (c.name, c.arguments) for c in parsed.calls]


# --- the JSON re-serialiser ----------------------------------------------------------------


def _layouts(value: Any, rnd: random.Random) -> str:
    """``value`` as a model may lay it out: any JSON whitespace, escaped or not."""
    ws = lambda: rnd.choice(["", " ", "\n  ", "\t", "\r\n"])  # noqa: E731
    if isinstance(value, dict):
        items = [f"{ws()}{json.dumps(k, ensure_ascii=rnd.random() < 0.5)}{ws()}:{ws()}"
                 f"{_layouts(v, rnd)}{ws()}" for k, v in value.items()]
        return "{" + ",".join(items) + ws() + "}"
    if isinstance(value, list):
        return "[" + ",".join(ws() + _layouts(v, rnd) + ws() for v in value) + ws() + "]"
    if isinstance(value, float):
        return rnd.choice([repr(value), f"{value:e}"])
    return json.dumps(value, ensure_ascii=rnd.random() < 0.5)


JSON_VALUES = st.recursive(
    VALUES | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=3),
    max_leaves=10,
)


@SETTINGS
@given(args=st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=4),
       seed=st.integers(0, 2**16))
def test_arguments_stream_as_their_canonical_text(args: dict[str, Any], seed: int) -> None:
    rnd = random.Random(seed)
    raw = _layouts(args, rnd)
    text = f'<tool_call>\n{{"name": "f", "arguments": {raw}}}\n</tool_call>'
    client, end, _ = run(HERMES, text, every_char(text) if seed % 4 == 0 else
                         [rnd.randrange(len(text)) for _ in range(8)])
    canonical = json.dumps(json.loads(raw), ensure_ascii=False)
    assert [c.arguments for c in end.calls] == [canonical]
    assert_as_parse(HERMES, text, end)


def test_surrogate_pairs_and_escapes_split_anywhere() -> None:
    raw = r'{"s": "a\ud83d\ude00b\u00e9\"\\\/\n\u0001\ud800x"}'
    text = f'{{"name": "f", "parameters": {raw}}}'
    want = json.dumps(json.loads(raw), ensure_ascii=False)
    for cut in range(1, len(text)):
        _, end, _ = run(LLAMA3_JSON, text, [cut])
        assert end.calls[0].arguments == want
    _, end, _ = run(LLAMA3_JSON, text, every_char(text))
    assert end.calls[0].arguments == want


# --- every format: rendered calls stream back as parse reads them ----------------------


@SETTINGS
@given(raw=calls_strategy(), content=CONTENT, fmt=st.sampled_from(list(FORMATS.values())),
       seed=st.integers(0, 2**16))
def test_rendered_calls_stream_as_parsed(raw: list[tuple[str, dict[str, Any], str]],
                                         content: str, fmt: ToolFormat, seed: int) -> None:
    text = fmt.render(make_calls(raw), content)
    rnd = random.Random(seed)
    cuts = every_char(text) if seed % 3 == 0 else [rnd.randrange(len(text) + 1)
                                                   for _ in range(rnd.randrange(12))]
    client, end, _ = run(fmt, text, cuts)
    assert_as_parse(fmt, text, end)
    assert end.calls and all(c.id for c in end.calls)
    if seed % 3 == 0:
        # fed a character at a time, every call's arguments began before the output ended
        assert all(client.first_args_at[i] < len(text) for i in client.calls)


@SETTINGS
@given(raw=calls_strategy(MISTRAL_IDS), content=CONTENT, seed=st.integers(0, 2**16))
def test_mistral_ids_written_after_the_arguments_are_aliased(
        raw: list[tuple[str, dict[str, Any], str]], content: str, seed: int) -> None:
    text = MISTRAL.render(make_calls(raw), content)
    rnd = random.Random(seed)
    _, end, _ = run(MISTRAL, text, [rnd.randrange(len(text)) for _ in range(6)])
    assert_as_parse(MISTRAL, text, end)
    # The client gets ids the stream could send first; the history maps them back.
    assert [end.aliases.get(c.id, c.id) for c in end.calls] == [cid for _, _, cid in raw]
    assert all(len(c.id) == 9 and c.id.isalnum() for c in end.calls)


@settings(max_examples=300, deadline=None)
@given(text=SOUP, fmt=st.sampled_from(list(FORMATS.values())), seed=st.integers(0, 2**16))
def test_marker_soup(text: str, fmt: ToolFormat, seed: int) -> None:
    """Anything may come out of the model: pieces never change the result, nothing sent
    is taken back (run() checks it), and whatever parse reads as calls streams as such."""
    rnd = random.Random(seed)
    _, whole, stream = run(fmt, text)
    _, chars, _ = run(fmt, text, every_char(text))
    _, pieces, _ = run(fmt, text, [rnd.randrange(len(text) + 1) for _ in range(5)])
    for end in (chars, pieces):
        assert end.content == whole.content
        assert [(c.name, c.arguments) for c in end.calls] == [
            (c.name, c.arguments) for c in whole.calls]
    if fmt.parse(text).calls or not stream.committed:
        assert_as_parse(fmt, text, whole)


@pytest.mark.parametrize(("fmt", "text"), MALFORMED, ids=lambda v: getattr(v, "name", None))
def test_malformed_before_a_name_is_all_content(fmt: ToolFormat, text: str) -> None:
    _, end, stream = run(fmt, text, every_char(text))
    if not stream.committed:
        assert end.content == text and not end.calls


# --- what goes out when ------------------------------------------------------------------


def _trace(fmt: ToolFormat, text: str) -> list[tuple[str, str, list[Any]]]:
    """(text fed so far, content released, deltas) for every character."""
    stream = call_stream(fmt)
    out = []
    for k in range(1, len(text) + 1):
        content, deltas = stream.feed(text[k - 1])
        out.append((text[:k], content, deltas))
    return out


@pytest.mark.parametrize(("fmt", "text", "name_after", "args_after"), [
    (HERMES, 'Hi.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
             "</tool_call>", '"get_weather"', '{"city": "P'),
    (HERMES, '<function=get_weather>{"city": "Paris"}</function>', "<function=get_weather>",
     '{"city": "P'),
    (LLAMA3_JSON, '{"name": "get_weather", "parameters": {"city": "Paris"}}',
     '"get_weather"', '{"city": "P'),
    (MISTRAL, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, '
              '"id": "abcdefghi"}]', '"get_weather"', '{"city": "P'),
    (MISTRAL, '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', "[ARGS]", '{"city": "P'),
    (GENERIC, '{\n  "tool_call": {\n    "name": "get_weather",\n    "arguments": {\n'
              '      "city": "Paris"\n    }\n  }\n}', '"get_weather"', '"city": "P'),
])
def test_name_then_arguments_as_written(fmt: ToolFormat, text: str, name_after: str,
                                        args_after: str) -> None:
    trace = _trace(fmt, text)
    named = next(i for i, (_, _, deltas) in enumerate(trace) if any(d.name for d in deltas))
    first = next(i for i, (_, _, deltas) in enumerate(trace)
                 if any(d.arguments for d in deltas))
    fed_at_name = trace[named][0]
    assert fed_at_name.endswith(name_after)  # at once, not later
    assert trace[first][0].endswith("{")  # the arguments' "{" goes out as soon as it is read
    got = ""
    for fed, _, deltas in trace:
        got += "".join(d.arguments for d in deltas)
        if fed.endswith(args_after):
            assert got.endswith('"city": "P')  # the string as far as it was written
            break
    else:  # pragma: no cover
        raise AssertionError("never saw the arguments' text")
    assert not any(content for _, content, _ in trace[named:])


def test_content_streams_before_and_between_calls() -> None:
    text = ('I will look.\n<tool_call>{"name": "f", "arguments": {}}</tool_call>\n'
            'And more.\n<tool_call>{"name": "g", "arguments": {"a": 1}}</tool_call>\nDone ')
    trace = _trace(HERMES, text)
    released = "".join(c for _, c, _ in trace)
    assert released == "I will look.\nAnd more.\nDone"
    # "I will look." went out before the first call was read
    at = next(i for i, (_, c, _) in enumerate(trace) if "look." in "".join(
        x for _, x, _ in trace[:i + 1]))
    assert "<tool_call>" not in trace[at][0]


def test_generic_response_streams_as_content() -> None:
    text = '{\n  "response": "Paris is \\"sunny\\",\\n 18 C."\n}'
    trace = _trace(GENERIC, text)
    released = "".join(c for _, c, _ in trace)
    assert released == 'Paris is "sunny",\n 18 C.'
    assert any(c for fed, c, _ in trace if not fed.endswith("}"))
    _, end, _ = run(GENERIC, text)
    assert end.content == released and not end.calls


def test_cut_by_max_tokens_keeps_the_call_as_far_as_it_went() -> None:
    text = '<tool_call>\n{"name": "f", "arguments": {"command": "ls -l'
    client, end, stream = run(HERMES, text, every_char(text))
    assert stream.committed
    assert [(c.name, c.arguments) for c in end.calls] == [("f", '{"command": "ls -l')]
    assert end.content == ""
    # a call whose name was not read yet is content, as parse reads it
    _, end, _ = run(HERMES, 'Hi <tool_call>\n{"na')
    assert end.content == 'Hi <tool_call>\n{"na' and not end.calls


def test_strict_llama3_reads_an_object_without_arguments_as_content() -> None:
    answer = '{"name": "Bob", "age": 3}'
    _, end, _ = run(LLAMA3_JSON, answer, strict=True)
    assert end.content == answer and not end.calls
    call = '{"name": "f", "parameters": {"a": 1}}'
    _, end, _ = run(LLAMA3_JSON, call, every_char(call), strict=True)
    assert [(c.name, c.arguments) for c in end.calls] == [("f", '{"a": 1}')]
