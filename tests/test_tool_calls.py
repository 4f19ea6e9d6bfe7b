"""suffixd.daemon.http_api.tool_calls: parsing, rendering and streaming of tool calls in
the hermes, llama3_json, mistral and generic formats.

Mostly properties: rendered calls parse back to themselves, and ``call_start`` never lets a
character of a call out as streamed content (for rendered calls and for marker soup alike).
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path
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
    GenericFormat,
    Parsed,
    ToolCall,
    ToolFormat,
    call_id,
    detect_format,
)

SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

# --- strategies --------------------------------------------------------------------------

NAMES = st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True)
# Strings that look like the formats' markers or break naive JSON scanning.
TRICKY = st.sampled_from([
    '"', "\\", "{", "}", "[", "]", "</tool_call>", "<tool_call>", "[TOOL_CALLS]", "[ARGS]",
    "<|python_tag|>", "```", "\n", "é", "日本", "😀", "\u2028", "'", ";", "</think>",
])
STRINGS = st.lists(st.text(max_size=6) | TRICKY, max_size=4).map("".join)
SCALARS = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | STRINGS
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(STRINGS, inner, max_size=3),
    max_leaves=8,
)
ARGUMENTS = st.dictionaries(STRINGS, VALUES, max_size=4)
MISTRAL_IDS = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
                      min_size=9, max_size=9)


NO_IDS = st.just("")


def calls_strategy(ids: st.SearchStrategy[str] = NO_IDS) -> st.SearchStrategy[
    list[tuple[str, dict[str, Any], str]]
]:
    return st.lists(st.tuples(NAMES, ARGUMENTS, ids), min_size=1, max_size=3)


# Content before calls: no marker starts in it, no trailing whitespace (dropped before a call).
CONTENT = st.text(
    alphabet=st.characters(blacklist_characters="<[`{", blacklist_categories=("Cs",)),
    max_size=30,
).map(str.rstrip)

# Marker soup for the streaming property: anything may come out of it.
SOUP = st.lists(
    st.sampled_from([
        "<tool_call>", "</tool_call>", "<think>", "</think>", "{", "}", '"name"', ":", '"f"',
        ",", '"arguments"', '"parameters"', "{}", " ", "\n", "x", "[TOOL_CALLS]", "[ARGS]",
        "<|python_tag|>", "```json\n", "```", "<json>", "<function=f>", "</function>", ";",
        "<", "[", "<tool", "[TOOL", '"tool_call"', '"response"', '"hi"',
        # whole calls, so that some soups parse with calls
        '{"name": "f", "arguments": {}}', '{"name": "f", "parameters": {"a": 1}}',
        '[{"name": "f", "arguments": {}}]', 'f[ARGS]{"a": 1}', '{"tool_call": ',
        '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
        '[TOOL_CALLS][{"name": "f", "arguments": {}}]', '{"response": "hi"}',
        '{"tool_calls": [{"name": "f", "arguments": {}}]}',
    ]),
    max_size=12,
).map("".join)


def make_calls(raw: list[tuple[str, dict[str, Any], str]]) -> list[ToolCall]:
    return [ToolCall(name, json.dumps(args, ensure_ascii=False), cid) for name, args, cid in raw]


def assert_same_calls(got: list[ToolCall], want: list[ToolCall], *, ids: bool) -> None:
    assert [c.name for c in got] == [c.name for c in want]
    assert [json.loads(c.arguments) for c in got] == [json.loads(c.arguments) for c in want]
    # the canonical form of the arguments text
    assert [c.arguments for c in got] == [c.arguments for c in want]
    if ids:
        assert [c.id for c in got] == [c.id for c in want]


def streamed(fmt: ToolFormat, text: str) -> str:
    cut = fmt.call_start(text)
    return text if cut is None else text[:cut]


def assert_streaming_safe(fmt: ToolFormat, text: str) -> None:
    """Every prefix's releasable part is a prefix of the final content, and what was
    released is never taken back."""
    final = fmt.parse(text).content
    released = ""
    for k in range(len(text) + 1):
        out = streamed(fmt, text[:k])
        assert final.startswith(out), (text[:k], out, final)
        assert out.startswith(released), (text[:k], out, released)
        released = out


# --- round trips -------------------------------------------------------------------------


@SETTINGS
@given(raw=calls_strategy(), content=CONTENT)
def test_hermes_round_trip(raw: list[tuple[str, dict[str, Any], str]], content: str) -> None:
    calls = make_calls(raw)
    parsed = HERMES.parse(HERMES.render(calls, content))
    assert_same_calls(parsed.calls, calls, ids=False)
    assert parsed.content == content


@SETTINGS
@given(raw=calls_strategy(MISTRAL_IDS | st.just("")), content=CONTENT)
def test_mistral_round_trip(raw: list[tuple[str, dict[str, Any], str]], content: str) -> None:
    calls = make_calls(raw)
    parsed = MISTRAL.parse(MISTRAL.render(calls, content))
    assert_same_calls(parsed.calls, calls, ids=True)
    assert parsed.content == content


@SETTINGS
@given(raw=calls_strategy())
def test_llama3_round_trip(raw: list[tuple[str, dict[str, Any], str]]) -> None:
    calls = make_calls(raw)
    parsed = LLAMA3_JSON.parse(LLAMA3_JSON.render(calls))
    assert_same_calls(parsed.calls, calls, ids=False)
    assert parsed.content == ""


@SETTINGS
@given(raw=calls_strategy(st.from_regex(r"call_[A-Za-z0-9]{4,8}", fullmatch=True)))
def test_generic_round_trip(raw: list[tuple[str, dict[str, Any], str]]) -> None:
    calls = make_calls(raw)
    text = GENERIC.render(calls)
    assert json.loads(text).keys() == ({"tool_call"} if len(calls) == 1 else {"tool_calls"})
    parsed = GENERIC.parse(text)
    assert_same_calls(parsed.calls, calls, ids=True)
    assert parsed.content == ""


@SETTINGS
@given(content=STRINGS)
def test_generic_response_round_trip(content: str) -> None:
    text = GENERIC.render([], content)
    assert GENERIC.parse(text) == Parsed(content, [])


@pytest.mark.parametrize("fmt", [LLAMA3_JSON, MISTRAL, HERMES], ids=lambda f: f.name)
def test_render_without_calls_is_the_content(fmt: ToolFormat) -> None:
    assert fmt.render([], "just text") == "just text"
    assert fmt.parse("just text") == Parsed("just text", [])


def test_render_shapes() -> None:
    call = ToolCall("get_weather", '{"city": "Paris"}', "abcdefghi")
    assert HERMES.render([call], "Let me check.") == (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
        "\n</tool_call>"
    )
    assert MISTRAL.render([call]) == (
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, '
        '"id": "abcdefghi"}]'
    )
    assert LLAMA3_JSON.render([call]) == (
        '{"name": "get_weather", "parameters": {"city": "Paris"}}'
    )
    assert json.loads(GENERIC.render([call])) == {
        "tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcdefghi"}
    }
    # arguments a client sent that are not JSON are written, not refused
    assert "not json" in HERMES.render([ToolCall("f", "not json")])


# --- streaming ---------------------------------------------------------------------------


@SETTINGS
@given(raw=calls_strategy(), content=CONTENT, fmt=st.sampled_from(list(FORMATS.values())))
def test_call_start_never_releases_a_call(
    raw: list[tuple[str, dict[str, Any], str]], content: str, fmt: ToolFormat
) -> None:
    text = fmt.render(make_calls(raw), content)
    assert fmt.parse(text).calls  # the property below is about outputs with calls
    assert_streaming_safe(fmt, text)


@settings(max_examples=150, deadline=None)
@given(text=SOUP, fmt=st.sampled_from(list(FORMATS.values())))
def test_call_start_safe_on_marker_soup(text: str, fmt: ToolFormat) -> None:
    assert_streaming_safe(fmt, text)


@pytest.mark.parametrize(
    ("fmt", "text", "expected"),
    [
        (HERMES, "Hello", None),
        (HERMES, "Hello <tool_", 5),
        (HERMES, "Hello <", 5),
        (HERMES, "Hello\n", 5),
        (HERMES, "a < b", None),
        (HERMES, "use <tool_call> x", None),
        (HERMES, "use <tool_call>\n{", 3),
        (HERMES, "```py", None),
        (HERMES, "x ``", 1),
        (HERMES, "```json\n<tool_call>", 0),
        (HERMES, "<think>a <tool_call>{</think>\n", 29),
        (HERMES, "<think>a <tool_call>{", None),
        (MISTRAL, "Sure [TOOL", 4),
        (MISTRAL, "[1, 2]", None),
        (MISTRAL, "x[TOOL_CALLS][", 1),
        (LLAMA3_JSON, "  {", 0),
        (LLAMA3_JSON, "<|py", 0),
        (LLAMA3_JSON, "The answer", None),
        (GENERIC, "{", 0),
        (GENERIC, " \n", 0),
        (GENERIC, "Hi", None),
        (GENERIC, "", None),
    ],
)
def test_call_start_examples(fmt: ToolFormat, text: str, expected: int | None) -> None:
    assert fmt.call_start(text) == expected


# --- hermes specifics and malformed outputs ----------------------------------------------


def test_hermes_tolerances() -> None:
    text = (
        "<think>\nShould I use <tool_call>? Yes.\n</think>\n\n"
        '<tool_call>  {"name" : "f",\n "arguments": "{\\"a\\": 1}"}</tool_call>\n'
        '<tool_call>\n{"name": "g", "arguments": {"b": [1, {"c": "}"}]}}'
    )
    parsed = HERMES.parse(text)
    assert parsed.content == "<think>\nShould I use <tool_call>? Yes.\n</think>"
    assert parsed.calls == [ToolCall("f", '{"a": 1}'), ToolCall("g", '{"b": [1, {"c": "}"}]}')]
    # a close tag cut short by the end of the output
    assert HERMES.parse('<tool_call>{"name": "f", "arguments": {}}\n</tool_').calls == [
        ToolCall("f", "{}")
    ]


def test_hermes_llama_cpp_variants() -> None:
    cases = [
        '```json\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n```',
        '<function_call>{"name": "f", "arguments": {"a": 1}}</function_call>',
        '<function=f>{"a": 1}</function>',
        '<function name="f">{"a": 1}</function>',
    ]
    for text in cases:
        assert HERMES.parse("Ok.\n" + text) == Parsed("Ok.", [ToolCall("f", '{"a": 1}')])
    # a bare object is content (llama.cpp would take it; see the module docstring)
    bare = 'Here: {"name": "Bob", "age": 3}'
    assert HERMES.parse(bare) == Parsed(bare, [])


def test_hermes_content_between_and_after_calls() -> None:
    text = (
        'A\n<tool_call>{"name": "f", "arguments": {}}</tool_call>\nB\n'
        '<tool_call>{"name": "g"}</tool_call>\nC '
    )
    assert HERMES.parse(text) == Parsed("A\nB\nC", [ToolCall("f", "{}"), ToolCall("g", "{}")])


MALFORMED = [
    (HERMES, 'Hi <tool_call>\n{"name": "f", "arguments": {"a": }}\n</tool_call>'),
    (HERMES, '<tool_call>\n{"name": "f", "argu'),  # truncated
    (HERMES, '<tool_call>{"name": "f", "arguments": {}} and then text'),  # no close tag
    (HERMES, '<tool_call>{"arguments": {}}</tool_call>'),  # no name
    (HERMES, '<tool_call>{"name": "f", "arguments": [1]}</tool_call>'),
    (HERMES, '<tool_call>{"name": "f", "arguments": {"x": NaN}}</tool_call>'),
    (HERMES, "<think>unclosed <tool_call>{\"name\": \"f\"}</tool_call>"),
    (LLAMA3_JSON, '{"name": "f", "parameters": {broken'),
    (LLAMA3_JSON, '{"name": "f", "parameters": {"a": 1}'),  # truncated
    (LLAMA3_JSON, '{"answer": 42}'),  # JSON, but not a call
    (LLAMA3_JSON, "<|python_tag|>brave_search.call(query=\"x\")"),
    (MISTRAL, '[TOOL_CALLS][{"name": "f", "arguments": {"a"'),
    (MISTRAL, "Sure [TOOL_CALLS] garbage"),
    (MISTRAL, "[TOOL_CALLS][]"),
    (MISTRAL, '[TOOL_CALLS]f[ARGS]{"a": '),
    (GENERIC, "Plain answer, no JSON."),
    (GENERIC, '{"tool_call": {"name": "f", "arguments": {"a": 1}}'),  # truncated
    (GENERIC, '{"something": "else"}'),
    (GENERIC, '{"tool_call": {"name": "f", "arguments": {}}} trailing'),
    (GENERIC, '{"tool_calls": {"name": "f"}}'),
    (GENERIC, "[1, 2]"),
]


@pytest.mark.parametrize(("fmt", "text"), MALFORMED, ids=lambda v: getattr(v, "name", None))
def test_malformed_is_all_content(fmt: ToolFormat, text: str) -> None:
    assert fmt.parse(text) == Parsed(text, [])


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        (HERMES, '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'),
        (LLAMA3_JSON, '{"name": "rm_rf", "parameters": {}}'),
        (MISTRAL, '[TOOL_CALLS][{"name": "rm_rf", "arguments": {}}]'),
        (GENERIC, '{"tool_call": {"name": "rm_rf", "arguments": {}}}'),
    ],
    ids=lambda v: getattr(v, "name", None),
)
def test_unknown_function_is_still_a_call(fmt: ToolFormat, text: str) -> None:
    # As llama.cpp: common_chat_msg_parser::add_tool_call refuses only an empty name.
    assert fmt.parse(text, tool_names={"get_weather"}).calls == [ToolCall("rm_rf", "{}")]


# --- llama3_json, mistral, generic specifics ---------------------------------------------


def test_llama3_variants() -> None:
    text = (
        '<|python_tag|>{"name": "f", "parameters": {"a": 1}}; '
        '{"type": "function", "name": "g", "arguments": {}}\n'
        '{"name": "h", "parameters": "{\\"b\\": true}"}'
    )
    assert LLAMA3_JSON.parse(text) == Parsed(
        "", [ToolCall("f", '{"a": 1}'), ToolCall("g", "{}"), ToolCall("h", '{"b": true}')]
    )
    # what follows the calls is content, as in llama.cpp's parse_json_tool_calls
    assert LLAMA3_JSON.parse('{"name": "f", "parameters": {}} Done.') == Parsed(
        "Done.", [ToolCall("f", "{}")]
    )
    assert LLAMA3_JSON.parse("Paris is sunny.") == Parsed("Paris is sunny.", [])


def test_mistral_new_form() -> None:
    text = (
        'I will look.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
        '[TOOL_CALLS]get_time[CALL_ID]abcdefghi[ARGS]{}'
    )
    assert MISTRAL.parse(text) == Parsed(
        "I will look.",
        [ToolCall("get_weather", '{"city": "Paris"}'), ToolCall("get_time", "{}", "abcdefghi")],
    )
    # text after the array is content (llama.cpp fails the request instead)
    assert MISTRAL.parse('[TOOL_CALLS][{"name": "f", "arguments": {}}] ok') == Parsed(
        "ok", [ToolCall("f", "{}")]
    )


def test_generic_shapes() -> None:
    assert GENERIC.parse('  {"response": "Hello"}\n') == Parsed("Hello", [])
    assert GENERIC.parse('{"response": {"a": 1}}') == Parsed('{\n  "a": 1\n}', [])
    assert GENERIC.parse(
        '{"tool_calls": [{"name": "f", "arguments": {"a": 1}, "id": "c1"}, '
        '{"name": "g", "arguments": "{}"}]}'
    ) == Parsed("", [ToolCall("f", '{"a": 1}', "c1"), ToolCall("g", "{}")])
    # tool_calls wins over response, as in llama.cpp
    assert GENERIC.parse(
        '{"response": "x", "tool_calls": [{"name": "f", "arguments": {}}]}'
    ).calls == [ToolCall("f", "{}")]


def test_call_id() -> None:
    ids = {call_id() for _ in range(50)}
    assert len(ids) == 50
    assert all(re.fullmatch(r"call_[A-Za-z0-9]{24}", i) for i in ids)


# --- detect_format -----------------------------------------------------------------------

QWEN25 = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query." }}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and
arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>,
\\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- endif %}"""

LLAMA31 = """{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{%- elif message.role == "tool" or message.role == "ipython" %}
    {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
{{- '{"name": "' + tool_call.name + '", ' }}{{- '"parameters": ' }}
{{- "<|eot_id|>" }}"""

LLAMA32 = """{{- "<|start_header_id|>user<|end_header_id|>\\n\\n" -}}
{{- 'Respond in the format {"name": function name, "parameters": dictionary of argument
name and its value}. Do not use variables.\\n\\n' }}"""

MISTRAL_NEMO = """{%- elif message.tool_calls is defined and message.tool_calls is not none %}
    {{- "[TOOL_CALLS][" }}
    {%- for tool_call in message.tool_calls %}
        {{- ', "id": "' + tool_call.id + '"}' }}
{%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
    {{- '[TOOL_RESULTS]{"content": ' + content|string + ", " }}"""

CHATML = """{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' +
message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}
{{ '<|im_start|>assistant\\n' }}{% endif %}"""

GEMMA3 = """{{ bos_token }}{%- for message in messages -%}{{ '<start_of_turn>' + role + '\\n' }}
{%- endfor -%}{%- if add_generation_prompt -%}{{'<start_of_turn>model\\n'}}{%- endif -%}"""


@pytest.mark.parametrize(
    ("template", "name"),
    [
        (QWEN25, "hermes"),
        (LLAMA31, "llama3_json"),
        (LLAMA32, "llama3_json"),
        (MISTRAL_NEMO, "mistral"),
        (CHATML, "generic"),
        (GEMMA3, "generic"),
        ("", "generic"),
    ],
)
def test_detect_format(template: str, name: str) -> None:
    fmt = detect_format(template)
    assert fmt.name == name
    assert fmt is FORMATS[name]


def test_prefix_and_suffix() -> None:
    assert (HERMES.prefix, HERMES.suffix) == ("<tool_call>\n", "\n</tool_call>")
    assert (MISTRAL.prefix, MISTRAL.suffix) == ("[TOOL_CALLS][", "]")
    assert (LLAMA3_JSON.prefix, LLAMA3_JSON.suffix) == ("", "")
    assert (GENERIC.prefix, GENERIC.suffix) == ("", "")


# --- schemas and the generic prompt ------------------------------------------------------

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["C", "F"]},
                },
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "get_time"}},
]


def validates(value: Any, schema: dict[str, Any]) -> bool:
    """A structural check of the schema subset json_schema uses."""
    if "anyOf" in schema:
        return any(validates(value, branch) for branch in schema["anyOf"])
    if "const" in schema:
        return bool(value == schema["const"])
    if "enum" in schema:
        return value in schema["enum"]
    kind = schema.get("type")
    if kind == "object":
        if not isinstance(value, dict) or not set(schema.get("required", [])) <= value.keys():
            return False
        props = schema.get("properties", {})
        if schema.get("additionalProperties") is False and not value.keys() <= props.keys():
            return False
        return all(validates(value[k], props[k]) for k in value.keys() & props.keys())
    if kind == "array":
        return (
            isinstance(value, list)
            and len(value) >= schema.get("minItems", 0)
            and all(validates(v, schema.get("items", {})) for v in value)
        )
    if kind == "string":
        return isinstance(value, str) and (
            "pattern" not in schema or re.search(schema["pattern"], value) is not None
        )
    return kind is None


def test_generic_schema_converts_and_validates() -> None:
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    assert isinstance(GENERIC, GenericFormat)
    for required in (False, True):
        for parallel in (False, True):
            schema = GENERIC.json_schema(TOOLS, required=required, parallel=parallel)
            grammar = json_schema_to_gbnf(json.dumps(schema))
            assert "root ::=" in grammar and "get_weather" in grammar
            call = ToolCall("get_weather", '{"city": "Paris", "unit": "C"}')
            output = json.loads(GENERIC.render([call, call] if parallel else [call]))
            assert validates(output, schema)
            assert validates({"response": "hi"}, schema) is not required
            assert not validates(json.loads(GENERIC.render([ToolCall("nope", "{}")])), schema)
            assert not validates(
                {"tool_call": {"name": "get_time", "arguments": {}}, "x": 1}, schema
            )
    one_tool = GENERIC.json_schema(TOOLS[1:], required=True, parallel=False)
    assert one_tool["properties"]["tool_call"]["properties"]["arguments"] == {"type": "object"}
    with pytest.raises(ValueError):
        GENERIC.json_schema([], required=True, parallel=False)
    assert GENERIC.json_schema([], required=False, parallel=False)["required"] == ["response"]


@pytest.mark.parametrize("fmt", [HERMES, LLAMA3_JSON, MISTRAL], ids=lambda f: f.name)
def test_call_schema_converts_and_validates(fmt: ToolFormat) -> None:
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    schema = fmt.json_schema(TOOLS, required=False, parallel=True)
    assert "root ::=" in json_schema_to_gbnf(json.dumps(schema))
    call = ToolCall("get_weather", '{"city": "Paris"}', "abcdefghi")
    rendered = fmt.render([call])
    assert rendered.startswith(fmt.prefix) and rendered.endswith(fmt.suffix)
    body = rendered[len(fmt.prefix) : len(rendered) - len(fmt.suffix)]
    assert validates(json.loads(body), schema)


def test_generic_system_prompt() -> None:
    prompt = GENERIC.system_prompt(TOOLS, parallel=False)
    assert "Respond in JSON format, either with `tool_call` (a request to call tools)" in prompt
    assert "`response`" in prompt and "get_weather" in prompt and "The weather in a city" in prompt
    assert "`tool_calls` (a list" in GENERIC.system_prompt(TOOLS, parallel=True)
    with pytest.raises(ValueError):
        GENERIC.system_prompt([{"type": "function", "function": {}}], parallel=False)


def test_stands_alone() -> None:
    # Standard library only: no grpc, llama_cpp, starlette, nor the rest of suffixd. The
    # package's modules import each other (relative, level 1): those imports stay inside.
    import suffixd.daemon.http_api.tool_calls as package

    assert package.__file__ is not None
    modules = sorted(Path(package.__file__).parent.glob("*.py"))
    assert len(modules) > 1
    imported = {
        (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        for module in modules
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8")))
        if isinstance(node, ast.Import)
        or (isinstance(node, ast.ImportFrom) and node.level != 1)
        for alias in node.names
    }
    roots = {name.split(".")[0] for name in imported}
    assert roots and roots <= sys.stdlib_module_names | {"__future__"}, roots
