"""`suffixd bench tools`' pure helpers and its gemma-3 chat template for llama-server (the
benchmark itself needs llama-server, which CI does not build)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from suffixd.benchkit.tools import (
    BASH,
    GEMMA3_TEMPLATE,
    chat_template_args,
    message_calls,
    to_tool_calls,
    whole_calls,
)
from suffixd.benchkit.workloads import first_turns

RECORDED = [
    {"role": "system", "content": "Use one bash block per turn."},
    {"role": "user", "content": "Fix the bug."},
    {"role": "assistant", "content": "THOUGHT: look first.\n\n```bash\nls -la\n```"},
    {"role": "user", "content": "<output>a.py</output>"},
]


def test_whole_calls_keeps_calls_with_whole_json_arguments() -> None:
    calls = [("bash", '{"command": "ls"}'), ("bash", '{"command": "grep -rn')]
    assert whole_calls(calls) == [("bash", {"command": "ls"})]
    assert whole_calls([]) == []


def test_message_calls_reads_openai_tool_calls() -> None:
    msg = {"role": "assistant", "content": "T", "tool_calls": [
        {"id": "x", "type": "function",
         "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]}
    assert message_calls(msg) == [("bash", '{"command": "ls"}')]
    assert message_calls({"role": "assistant", "content": "no call"}) == []
    assert message_calls({"role": "assistant", "content": None, "tool_calls": None}) == []


def test_chat_template_args(tmp_path: Path) -> None:
    assert chat_template_args("{{ messages }}", None) == ["--jinja"]
    assert chat_template_args("", None) == ["--jinja", "--chat-template-file",
                                            str(GEMMA3_TEMPLATE)]
    mine = tmp_path / "t.jinja"
    mine.write_text("{{ messages }}")
    assert chat_template_args("{{ messages }}", mine)[-1] == str(mine)


def _render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda v: json.dumps(v, ensure_ascii=False)  # as HF's
    template = env.from_string(GEMMA3_TEMPLATE.read_text())
    return template.render(messages=messages, tools=tools, bos_token="<bos>",
                           add_generation_prompt=True)


def test_gemma3_template_writes_gemma_turns_with_tools() -> None:
    messages = to_tool_calls("s", RECORDED)
    assert messages[2]["tool_calls"][0]["function"]["arguments"] == '{"command": "ls -la"}'
    text = _render(messages, [BASH])
    assert text.startswith("<bos><start_of_turn>user\nYou are a helpful assistant")
    assert '{"name": "bash", "description": ' in text  # the tool listed in the first turn
    assert text.count("<start_of_turn>user\n") == 2 and text.count("<start_of_turn>model\n") == 2
    # the thought, then the call as a list in one section; the result as the user's turn
    assert ('<start_of_turn>model\nTHOUGHT: look first.\n<tool_call>\n'
            '[{"name": "bash", "arguments": {"command": "ls -la"}}]\n</tool_call>'
            '<end_of_turn>\n') in text
    assert ("<start_of_turn>user\n<tool_response>\n<output>a.py</output>\n</tool_response>"
            "<end_of_turn>\n<start_of_turn>model\n") in text
    assert text.endswith("<start_of_turn>model\n")


@pytest.mark.parametrize("arguments", ['{"command": "ls"}', {"command": "ls"}])
def test_gemma3_template_parallel_calls_and_no_tools(arguments: Any) -> None:
    call = {"type": "function", "function": {"name": "bash", "arguments": arguments}}
    text = _render([{"role": "user", "content": "go"},
                    {"role": "assistant", "content": None, "tool_calls": [call, call]}], None)
    assert "You can call" not in text
    assert ('<start_of_turn>model\n<tool_call>\n[{"name": "bash", "arguments": '
            '{"command": "ls"}}, {"name": "bash", "arguments": {"command": "ls"}}]\n'
            '</tool_call><end_of_turn>\n') in text


def test_first_turns_keeps_each_sessions_first_n_in_order() -> None:
    turns = [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("b", 2)]
    assert first_turns(turns, 2) == [("a", 1), ("a", 2), ("b", 1), ("b", 2)]
    assert first_turns(turns, 1) == [("a", 1), ("b", 1)]
