"""Tools through a chat template that has them (a Qwen-2.5-style Jinja template, Hermes
calls): what the template is given, what it renders, and the grammar of a required call,
which must accept exactly the calls the format writes (checked token by token on the
embedded model's vocabulary)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from llama_cpp.llama_chat_format import Jinja2ChatFormatter
from suffixd.daemon.generation.grammar import Grammar
from suffixd.daemon.generation.verifier import Verifier
from suffixd.daemon.http_api.requests import ApiError, chat_messages
from suffixd.daemon.http_api.structured import RawReplies, ReplyShaper, parse_structure
from suffixd.daemon.http_api.tool_calls import GENERIC, HERMES, ToolCall
from suffixd.daemon.model import embedded_model_path

from tests.conftest import THREADS

QWEN_LIKE = """{%- if tools %}<|im_start|>system
{{ messages[0]['content'] if messages[0]['role'] == 'system' else 'You are helpful.' }}

# Tools
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
Return each call as JSON within <tool_call></tool_call> tags.<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant
{{ message.content }}{% for tc in message.tool_calls %}
<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% elif not (message.role == 'system' and tools) %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "Let me look.", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C, clear"},
]


@pytest.fixture(scope="module")
def verifier() -> Iterator[Verifier]:
    v = Verifier(embedded_model_path(), n_threads=THREADS, n_ctx=256, n_slots=1)
    yield v
    v.close()


def _structure(choice: Any = "auto", **body: Any) -> Any:
    s = parse_structure({"tools": [WEATHER], "tool_choice": choice, "messages": HISTORY,
                         **body}, chat=True)
    s.settle(QWEN_LIKE)
    return s


def test_a_template_with_tools_gets_them_and_the_structured_history() -> None:
    s = _structure()
    assert s.fmt is HERMES
    msgs, tools = s.messages(HISTORY, RawReplies())
    assert tools == [WEATHER]
    assert msgs[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert msgs[3] == {"role": "tool", "content": "18 C, clear", "tool_call_id": "call_1",
                       "name": "get_weather"}
    prompt = Jinja2ChatFormatter(template=QWEN_LIKE, eos_token="<|im_end|>",
                                 bos_token="")(messages=msgs, tools=tools).prompt
    assert '"name": "get_weather"' in prompt and "<tools>" in prompt
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n' \
           "</tool_call>" in prompt
    assert "<tool_response>\n18 C, clear\n</tool_response>" in prompt
    # what the template wrote for the assistant turn parses back as the call it was
    turn = prompt.split("<|im_start|>assistant\n", 1)[1].split("<|im_end|>", 1)[0]
    parsed = HERMES.parse(turn)
    assert parsed.content == "Let me look."
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [
        ("get_weather", {"city": "Paris"})]


def test_a_served_reply_renders_as_the_model_wrote_it() -> None:
    s = _structure()
    replies = RawReplies()
    raw = 'Let me look.\n<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris"}}\n' \
          "</tool_call>"
    replies.put(HISTORY[2], raw)
    msgs, _ = s.messages(HISTORY, replies)
    assert msgs[2] == {"role": "assistant", "content": raw}


def test_the_generic_format_lists_the_tools_and_wraps_the_history() -> None:
    s = parse_structure({"tools": [WEATHER]}, chat=True)
    s.settle("")
    assert s.fmt is GENERIC
    msgs, tools = s.messages(HISTORY, RawReplies())
    assert tools is None
    assert msgs[0]["role"] == "system" and msgs[0]["content"].startswith("Be brief.")
    assert '"get_weather"' in msgs[0]["content"]
    assert json.loads(msgs[2]["content"]) == {
        "tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}, "id": "call_1"}}
    assert msgs[3]["role"] == "user"
    assert json.loads(msgs[3]["content"])["tool_response"]["tool"] == "get_weather"


@pytest.mark.parametrize("parallel", [False, True])
def test_a_required_hermes_call_grammar_accepts_the_calls_the_format_writes(
        verifier: Verifier, parallel: bool) -> None:
    s = _structure("required", parallel_tool_calls=parallel)
    gbnf = s.grammar()
    assert gbnf is not None and gbnf.startswith("root ::= ")
    calls = [ToolCall("get_weather", json.dumps({"city": "Paris"}))]
    if parallel:
        calls.append(ToolCall("get_weather", json.dumps({"city": "Rome"})))
    text = HERMES.render(calls)
    state = Grammar(verifier, gbnf).start()
    for tok in verifier.tokenize(text):
        assert state.allows(tok), (text, verifier.detokenize([tok]))
        state.accept(tok)
    eos = verifier.eos_token
    assert state.allows(eos)  # the grammar is complete there
    # and it refuses prose where a call must be
    assert not Grammar(verifier, gbnf).start().allows(verifier.tokenize("Sure")[0])


def test_auto_on_a_native_format_is_not_constrained() -> None:
    assert _structure("auto").grammar() is None
    assert _structure("none").fmt is None


def test_an_unconvertible_schema_is_a_400() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"$ref": "#/nowhere"}}, "required": ["x"]}}}
    s = parse_structure({"tools": [tool], "tool_choice": "required"}, chat=True)
    s.settle("")
    with pytest.raises(ApiError) as err:
        s.grammar()
    assert err.value.status == 400


PERSON = {"type": "object", "properties": {"name": {"type": "string"}},
          "required": ["name"], "additionalProperties": False}
PERSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}


def _walks(verifier: Verifier, gbnf: str, text: str) -> bool:
    """Whether the grammar takes ``text`` (as the model's tokens) and may end there."""
    state = Grammar(verifier, gbnf).start()
    for tok in verifier.tokenize(text):
        if not state.allows(tok):
            return False
        state.accept(tok)
    return state.allows(verifier.eos_token)


def test_native_auto_with_a_response_format_is_calls_or_the_formats_json(
        verifier: Verifier) -> None:
    s = _structure("auto", response_format=PERSON_FORMAT)
    assert s.calls_or_format
    gbnf = s.grammar()
    assert gbnf is not None
    call = HERMES.render([ToolCall("get_weather", json.dumps({"city": "Paris"}))])
    assert _walks(verifier, gbnf, call)
    assert _walks(verifier, gbnf, '{"name": "Ada"}')
    assert not _walks(verifier, gbnf, '{"city": "Paris"}')  # neither a call nor a person
    assert not Grammar(verifier, gbnf).start().allows(verifier.tokenize("Sure")[0])
    # a call required: the format has no say; tool_choice none: the format alone
    required = _structure("required", response_format=PERSON_FORMAT).grammar()
    assert required is not None and _walks(verifier, required, call)
    assert not _walks(verifier, required, '{"name": "Ada"}')
    alone = _structure("none", response_format=PERSON_FORMAT).grammar()
    assert alone is not None and _walks(verifier, alone, '{"name": "Ada"}')


def test_generic_response_takes_the_formats_schema(verifier: Verifier) -> None:
    s = parse_structure({"tools": [WEATHER], "response_format": PERSON_FORMAT}, chat=True)
    s.settle("")
    gbnf = s.grammar()
    assert gbnf is not None
    assert _walks(verifier, gbnf, '{"response": {"name": "Ada"}}')
    assert not _walks(verifier, gbnf, '{"response": "Ada"}')
    assert _walks(verifier, gbnf,
                  '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}')
    shaper = ReplyShaper(s)
    shaper.feed('{"response": {"name": "Ada"}}')
    message, finish, _ = shaper.finish("stop")
    assert json.loads(message["content"]) == {"name": "Ada"} and finish == "stop"


def test_a_reply_streams_to_the_message_it_finishes_as() -> None:
    s = _structure("auto")
    text = ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris"}}\n</tool_call>')
    shaper = ReplyShaper(s)
    deltas = [d for ch in text for d in shaper.feed(ch)]
    message, finish, rest = shaper.finish("stop")
    deltas += rest
    content = "".join(d.get("content", "") for d in deltas)
    calls: dict[int, dict[str, str]] = {}
    for d in deltas:
        for tc in d.get("tool_calls", ()):
            slot = calls.setdefault(tc["index"], {"id": "", "name": "", "arguments": ""})
            slot["id"] += tc.get("id", "")
            slot["name"] += tc.get("function", {}).get("name", "")
            slot["arguments"] += tc["function"]["arguments"]
    assert finish == "tool_calls" and content == message["content"] == "Let me look."
    assert [{"id": c["id"], "name": c["function"]["name"], "arguments": c["function"][
        "arguments"]} for c in message["tool_calls"]] == list(calls.values())
    # the first delta of the call: id, type and name, arguments ""
    first = next(d["tool_calls"][0] for d in deltas if "tool_calls" in d)
    assert first["type"] == "function" and first["function"] == {
        "name": "get_weather", "arguments": ""}


def test_mistral_ids_the_client_got_render_as_the_model_wrote_them() -> None:
    s = parse_structure({"tools": [WEATHER]}, chat=True)
    s.settle("[TOOL_CALLS] {{ messages }}")
    raw = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, ' \
          '"id": "abcdefghi"}]'
    shaper = ReplyShaper(s)
    shaper.feed(raw)
    message, _, _ = shaper.finish("stop")
    got = message["tool_calls"][0]["id"]
    assert got != "abcdefghi" and shaper.aliases == {got: "abcdefghi"}
    replies = RawReplies()
    replies.put(message, raw, shaper.aliases)
    history = [{"role": "user", "content": "Weather in Paris?"}, message,
               {"role": "tool", "tool_call_id": got, "content": "18 C"}]
    msgs, _ = s.messages(history, replies)
    assert msgs[1] == {"role": "assistant", "content": raw}
    assert msgs[2]["tool_call_id"] == "abcdefghi"


@pytest.mark.parametrize(("messages", "param"), [
    ([{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "x", "content": "1"}],
     "messages[1].tool_call_id"),
    (HISTORY[:2] + [{"role": "tool", "content": "1"}], "messages[2].tool_call_id"),
    (HISTORY[:3] + [{"role": "tool", "tool_call_id": "call_2", "content": "1"}],
     "messages[3].tool_call_id"),
    (HISTORY[:2] + [{"role": "assistant", "tool_calls": {"id": "call_1"}}],
     "messages[2].tool_calls"),
])
def test_a_tool_message_must_answer_an_earlier_call(messages: list[Any], param: str) -> None:
    with pytest.raises(ApiError) as err:
        chat_messages({"messages": messages})
    assert err.value.status == 400 and err.value.param == param
    assert chat_messages({"messages": HISTORY}) == HISTORY
