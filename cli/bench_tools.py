"""`suffixd bench tools`: a tool-calling agent through the OpenAI endpoint, side by side
with llama-server on the same rendered prompts and the same grammar.

The recorded SWE-bench agent sessions (a THOUGHT and one bash block per turn) become
OpenAI tool calling (``to_tool_calls``): one ``bash`` tool; each recorded assistant turn
its thought as content and its command as a ``bash`` call; the command's output (the next
user message) a ``tool`` result; the system prompt asks for the tool instead of the
block. Every turn sends the conversation so far (the recorded history, as the replay
protocol has it) with ``tools=[bash]``, ``tool_choice: required``, no parallel calls,
greedy, up to ``--max-tokens``:

* suffixd: ``/v1/chat/completions`` with the official ``openai`` client; the session is
  named (``X-Suffixd-Session``), as an agent that resends recorded history would need;
* llama-server (its plain decoding and/or n-gram speculation, prompt cache on): the very
  prompt tokens and grammar the daemon builds for the request (the daemon's own
  ``Structure`` and chat renderer, in this process) on ``/completion``, and its text
  parsed by the daemon's parser.

Systems take turns, turn by turn. Reported per system: session wall time (mean over
sessions), turn mean and p95, decode tok/s, tokens per verifier step, calls parsed; and
how many turns gave the same call on both sides.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import tempfile
import time
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click

from .llama_server import llama_server_options

# openai is a benchmark dependency, imported where it runs. Messages read from a workload
# file go to it cast to its message types: the daemon checks them, not this process.
if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

BASH: ChatCompletionToolParam = {"type": "function", "function": {
    "name": "bash", "description": "Run one bash command (or commands joined with && or ||) "
    "in the repository and return its output.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"]}}}
SYSTEM = ("You are a helpful assistant that can interact multiple times with a computer "
          "shell to solve programming tasks. Call the bash tool with exactly one command "
          "(or commands connected with && or ||) per turn; explain your reasoning before.")
_BLOCK = re.compile(r"```bash\s*\n(.*?)```", re.S)


def to_tool_calls(session: str, messages: list[dict[str, str]]) -> list[dict[str, Any]]:
    """A recorded mini-swe-agent conversation as OpenAI tool calling."""
    out: list[dict[str, Any]] = []
    pending: str | None = None  # the id of the call whose output the next user turn is
    for i, m in enumerate(messages):
        role, content = m["role"], m["content"]
        if role == "system":
            out.append({"role": "system", "content": SYSTEM})
        elif role == "assistant":
            block = _BLOCK.search(content)
            if block is None:
                out.append({"role": "assistant", "content": content})
                pending = None
                continue
            pending = f"call_{zlib.crc32(session.encode()):08x}{i:04d}"
            thought = content[: block.start()].strip()
            out.append({"role": "assistant", "content": thought or None, "tool_calls": [
                {"id": pending, "type": "function", "function": {
                    "name": "bash",
                    "arguments": json.dumps({"command": block.group(1).strip()})}}]})
        elif role == "user" and pending is not None:
            out.append({"role": "tool", "tool_call_id": pending, "content": content})
            pending = None
        else:
            out.append({"role": role, "content": content})
    return out


@click.command("tools")
@click.argument("workload", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--sessions", default=2, show_default=True, help="Sessions to replay, whole.")
@click.option("--max-tokens", default=64, show_default=True, help="Tokens generated per turn.")
@click.option("--model", default=None, help="GGUF path or packaged name (default: embedded).")
@click.option("--threads", default=2, show_default=True)
@click.option("--ctx-size", default=32768, show_default=True,
              help="Context per session (capped at the model's trained length).")
@llama_server_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def tools_bench(workload: Path, sessions: int, max_tokens: int, model: str | None,
                threads: int, ctx_size: int, llama_server: str | None, spec_types: str | None,
                ls_flash_attn: str, ls_plain: bool, as_json: bool) -> None:
    """Replay WORKLOAD's sessions as a tool-calling agent, through the endpoint."""
    import openai

    from ..client import Client
    from ..daemon.generation.chat import ChatRenderer
    from ..daemon.generation.verifier import Verifier
    from ..daemon.http_api.structured import RawReplies, parse_structure
    from ..daemon.model import resolve_model_path
    from .bench_generate import load_session_turns, p95
    from .bench_http import _start_daemon
    from .llama_server import start_servers

    todo = load_session_turns(workload, sessions)
    if not todo:
        raise click.ClickException(f"{workload}: no assistant turns")
    model_path = resolve_model_path(model)
    # this process renders what the daemon renders, for llama-server (no decoding here)
    renderer_v = Verifier(model_path, n_ctx=256, n_slots=1, n_threads=1)
    renderer = ChatRenderer(renderer_v)
    n_ctx = min(ctx_size, renderer_v.n_ctx_train)
    tmp = Path(tempfile.mkdtemp(prefix="suffixd-bench-tools-"))
    servers: dict[str, Any] = {}
    proc = None
    systems = ["suffixd"]
    stats: dict[str, dict[str, Any]] = {}
    same = compared = skipped = ls_only = 0
    try:
        if llama_server:
            servers = start_servers(llama_server, model_path, threads=threads, n_ctx=n_ctx,
                                    spec_types_wanted=spec_types, flash_attn=ls_flash_attn,
                                    plain=ls_plain)
            systems += list(servers)
        proc, target, base_url = _start_daemon(tmp / "data", model, threads, ctx_size)
        client = Client(target)
        client.wait_ready()
        # loaded, and its costs measured (or stored): a measurement running beside the
        # benchmark would slow both
        while client.generator_status()["cost_profile_source"] in ("", "measuring"):
            time.sleep(0.5)
        client.close()
        oai = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=900)
        stats = {s: {"session_s": {}, "turn_s": [], "tokens": 0, "decode_s": 0.0,
                     "steps": 0, "calls": 0, "turns": 0} for s in systems}
        for n, (session, recorded) in enumerate(todo):
            messages = to_tool_calls(session, recorded)
            body = {"messages": messages, "tools": [BASH], "tool_choice": "required",
                    "parallel_tool_calls": False}
            structure = parse_structure(body, chat=True)
            structure.settle(renderer.template)
            msgs, tools = structure.messages(messages, RawReplies())
            prompt = renderer.tokens(msgs, tools=tools)
            if len(prompt) + max_tokens + 64 > n_ctx:
                skipped += 1
                continue
            gbnf = structure.grammar()
            calls: dict[str, Any] = {}
            order = systems if n % 2 == 0 else systems[::-1]
            for system in order:
                st = stats[system]
                t0 = time.perf_counter()
                if system == "suffixd":
                    r = oai.chat.completions.create(
                        model="default", tools=[BASH],
                        messages=cast("list[ChatCompletionMessageParam]", messages),
                        tool_choice="required", parallel_tool_calls=False, temperature=0,
                        max_tokens=max_tokens, extra_headers={
                            "X-Suffixd-Namespace": "bench-tools",
                            "X-Suffixd-Session": session})
                    wall = time.perf_counter() - t0
                    extra = (r.model_extra or {}).get("suffixd", {})
                    tokens = r.usage.completion_tokens if r.usage else 0
                    decode_s = float(extra.get("decode_seconds", 0.0))
                    steps = int(extra.get("steps", 0))
                    got = [(c.function.name, json.loads(c.function.arguments))
                           for c in r.choices[0].message.tool_calls or ()
                           if c.type == "function"]  # the only kind the daemon answers
                else:
                    turn = servers[system].complete(prompt, max_tokens, grammar=gbnf)
                    wall = time.perf_counter() - t0
                    tokens, decode_s = turn.predicted_n, turn.decode_s
                    steps = max(1, turn.predicted_n - turn.accepted)
                    assert structure.fmt is not None
                    parsed = structure.fmt.parse(renderer_v.detokenize(turn.tokens))
                    got = [(c.name, json.loads(c.arguments)) for c in parsed.calls]
                st["turn_s"].append(wall)
                st["session_s"][session] = st["session_s"].get(session, 0.0) + wall
                st["tokens"] += tokens
                st["decode_s"] += decode_s
                st["steps"] += steps
                st["calls"] += int(bool(got))
                st["turns"] += 1
                calls[system] = got
            for system in systems[1:]:
                compared += 1
                same += int(calls[system] == calls["suffixd"])
                ls_only += int(bool(calls[system]) and not calls["suffixd"])
    finally:
        for srv in servers.values():
            srv.close()
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        renderer_v.close()
        shutil.rmtree(tmp, ignore_errors=True)

    out: dict[str, Any] = {"workload": str(workload), "sessions": len({s for s, _ in todo}),
                           "turns": len(todo), "skipped_turns": skipped, "n_ctx": n_ctx,
                           "max_tokens": max_tokens, "threads": threads}
    for s in systems:
        st = stats[s]
        walls = list(st["session_s"].values())
        out[f"{s}_session_wall_s"] = round(sum(walls) / len(walls), 3) if walls else 0.0
        out[f"{s}_turn_s"] = round(sum(st["turn_s"]) / max(1, len(st["turn_s"])), 4)
        out[f"{s}_turn_p95_s"] = round(p95(st["turn_s"]), 4)
        out[f"{s}_decode_tok_s"] = round(st["tokens"] / st["decode_s"], 2) if st["decode_s"] \
            else 0.0
        out[f"{s}_tokens_per_step"] = round(st["tokens"] / max(1, st["steps"]), 3)
        out[f"{s}_calls_parsed"] = f"{st['calls']}/{st['turns']}"
    if len(systems) > 1:
        fastest = min(systems[1:], key=lambda s: out[f"{s}_session_wall_s"] or 1e18)
        out["ls_fastest"] = fastest
        out["suffixd_session_wall_vs_ls_fastest"] = round(
            out["suffixd_session_wall_s"] / max(out[f"{fastest}_session_wall_s"], 1e-9), 4)
        out["suffixd_decode_vs_ls_fastest"] = round(
            out["suffixd_decode_tok_s"] / max(out[f"{fastest}_decode_tok_s"], 1e-9), 4)
        out["same_call"] = f"{same}/{compared}"
        # turns where a llama-server system gave a call and suffixd none
        out["calls_parsed_by_llama_server_only"] = ls_only
    if as_json:
        click.echo(json.dumps(out))
        return
    click.echo(f"{workload.name} as tool calls: {out['sessions']} sessions, {out['turns']} "
               f"turns ({skipped} do not fit {n_ctx}), {max_tokens} tokens max")
    click.echo(f"{'system':<14} {'session s':>10} {'turn s':>8} {'p95 s':>7} "
               f"{'decode tok/s':>13} {'tok/step':>9} {'calls':>9}")
    for s in systems:
        click.echo(f"{s:<14} {out[f'{s}_session_wall_s']:>10.2f} {out[f'{s}_turn_s']:>8.3f} "
                   f"{out[f'{s}_turn_p95_s']:>7.3f} {out[f'{s}_decode_tok_s']:>13.2f} "
                   f"{out[f'{s}_tokens_per_step']:>9.2f} {out[f'{s}_calls_parsed']:>9}")
    for k in ("suffixd_session_wall_vs_ls_fastest", "suffixd_decode_vs_ls_fastest",
              "same_call", "calls_parsed_by_llama_server_only"):
        if k in out:
            click.echo(f"{k}: {out[k]}")
