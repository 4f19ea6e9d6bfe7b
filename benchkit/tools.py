"""A tool-calling agent through the OpenAI endpoint, side by side with llama-server
(`suffixd bench tools`), in two comparisons (labelled in the output):

* **same grammar** (``ls-*``): llama-server is fed the very prompt tokens and GBNF grammar
  the daemon builds for the request (the daemon's own ``Structure`` and chat renderer, in
  this process) on ``/completion``, and its text parsed by the daemon's parser: the same
  constrained decoding on both sides, to compare the decoding alone;
* **native** (``ls-*-native``, ``--ls-native``): llama-server gets the same OpenAI request
  on its own ``/v1/chat/completions`` (``--jinja``) and builds its own prompt, grammar and
  parsed ``tool_calls`` from a chat template: the model's own, or for a GGUF without one
  (the embedded gemma-3-270m) ``--ls-chat-template`` (default
  bench/fixtures/gemma3_chat_template.jinja, gemma-3's turns with tools written by us).

The recorded SWE-bench agent sessions (a THOUGHT and one bash block per turn) become
OpenAI tool calling (``to_tool_calls``): one ``bash`` tool; each recorded assistant turn
its thought as content and its command as a ``bash`` call; the command's output (the next
user message) a ``tool`` result; the system prompt asks for the tool instead of the
block. Every turn sends the conversation so far (the recorded history, as the replay
protocol has it) with ``tools=[bash]``, ``tool_choice: required``, no parallel calls,
greedy, up to ``--max-tokens``; suffixd gets it through the official ``openai`` client,
its session named (``X-Suffixd-Session``), as an agent that resends recorded history
would need.

What llama-server does with tools (the llama.cpp it is built from: common/chat.cpp and the
chat auto-parser, common/chat-diff-analyzer.cpp and chat-auto-parser-generator.cpp):

* A GGUF without a template and no ``--chat-template``: it falls back to ChatML
  (``<|im_start|>role``), not the model's turns.
* Tools are handled only by a template that renders tool calls (the Jinja capability
  probe: does rendering read ``messages[i].tool_calls``). It renders the template with and
  without a probe call and reads the call's layout off the difference (whole JSON objects,
  tags with JSON arguments, or tagged arguments; section and per-call markers), then
  builds a PEG parser and a GBNF grammar whose arguments follow the tool's schema through
  llama.cpp's own converter (json-schema-to-grammar.cpp). With ``tool_choice: required``
  the grammar holds from the first token: free text up to the call marker, then the
  call(s). There is no generic JSON fallback any more (older llama.cpp had one): a
  template without tool calls (ChatML included) gets no grammar even when a call is
  required, no tool list in the prompt, earlier calls rendered as empty turns, and no
  parsed ``tool_calls``, only content. With per-call markers (one ``<tool_call>`` block
  per call, as Hermes/Qwen write them) the grammar takes one or more calls whatever
  ``parallel_tool_calls`` says; our gemma-3 template writes a turn's calls as a JSON list
  in one section, which llama.cpp limits to one call when ``parallel_tool_calls`` is
  false.

So the two sides differ in the native comparison by more than the decoding: suffixd's
generic format renders a call turn as its JSON alone (``{"tool_call": ...}``) and holds the
whole reply to that JSON; llama-server's prompt keeps each turn's thought before the call,
and its grammar lets the model write a thought first, which ``--max-tokens`` may cut
before the call.

Systems take turns, turn by turn. Reported per system: session wall time (mean over
sessions), turn mean and p95, decode tok/s, tokens per verifier step, calls parsed (a
call whose arguments are whole JSON: a reply cut by ``--max-tokens`` inside a call has
none), replies cut by ``--max-tokens``; and per comparison, how many turns gave the same
call (name and arguments) as suffixd.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
import urllib.request
import zlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from .errors import BenchError
from .workloads import first_turns, load_session_turns

# openai is a benchmark dependency, imported where it runs. Messages read from a workload
# file go to it cast to its message types: the daemon checks them, not this process.
if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

    from ..daemon.http_api.structured import Structure

BASH: ChatCompletionToolParam = {"type": "function", "function": {
    "name": "bash", "description": "Run one bash command (or commands joined with && or ||) "
    "in the repository and return its output.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"]}}}
SYSTEM = ("You are a helpful assistant that can interact multiple times with a computer "
          "shell to solve programming tasks. Call the bash tool with exactly one command "
          "(or commands connected with && or ||) per turn; explain your reasoning before.")
_BLOCK = re.compile(r"```bash\s*\n(.*?)```", re.S)


# For a GGUF without its own chat template (bench/, not installed: the bench runs from a
# checkout, as bench/build_llama_server.sh does).
GEMMA3_TEMPLATE = Path(__file__).resolve().parents[1] / "bench" / "fixtures" / \
    "gemma3_chat_template.jinja"
SAME_GRAMMAR = "same grammar"
NATIVE = "native"


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


def whole_calls(calls: Iterable[tuple[str, str]]) -> list[tuple[str, Any]]:
    """(name, arguments) of the calls whose arguments text is whole JSON, parsed, in
    order: both servers hand back a call cut by max_tokens with its arguments as far as
    they were written, which is no call an agent could run."""
    out: list[tuple[str, Any]] = []
    for name, arguments in calls:
        try:
            out.append((name, json.loads(arguments)))
        except json.JSONDecodeError:
            continue
    return out


def message_calls(message: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(name, arguments text) of an OpenAI chat message's ``tool_calls``."""
    return [(str(c["function"]["name"]), str(c["function"].get("arguments") or ""))
            for c in message.get("tool_calls") or ()]


def chat_template_args(model_template: str, template_file: Path | None) -> list[str]:
    """llama-server's chat template options for the native comparison: ``template_file``
    when given, else the GGUF's own template, else our gemma-3 one (llama-server would
    fall back to ChatML, which handles no tools)."""
    if template_file is None and model_template:
        return ["--jinja"]
    path = template_file or GEMMA3_TEMPLATE
    if not path.is_file():
        raise BenchError(f"{path}: no such template (run from a checkout, or pass "
                         "--ls-chat-template)")
    return ["--jinja", "--chat-template-file", str(path)]


def _ls_chat(url: str, body: Mapping[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=900) as r:
        out: dict[str, Any] = json.loads(r.read())
    return out


def run_tools(workload: Path, sessions: int, turns_per_session: int, max_tokens: int,
              model: str | None, threads: int, ctx_size: int, *,
              llama_server: str | None = None, spec_types: str | None = None,
              ls_flash_attn: str = "auto", ls_plain: bool = True,
              ls_same_grammar: bool = True, ls_native: bool = False,
              ls_chat_template: Path | None = None) -> dict[str, Any]:
    """WORKLOAD's first ``sessions`` sessions (each its first ``turns_per_session`` turns;
    0: all) as tool calls, through suffixd's endpoint and the llama-server comparisons
    asked for (``ls_same_grammar``, ``ls_native``); the figures as one JSON object."""
    todo = load_session_turns(workload, sessions)
    if turns_per_session > 0:
        todo = first_turns(todo, turns_per_session)
    if not todo:
        raise BenchError(f"{workload}: no assistant turns")
    run = ToolsRun(model, max_tokens, threads, ctx_size, ls_chat_template)
    try:
        run.start(llama_server, spec_types, ls_flash_attn, ls_plain, ls_same_grammar,
                  ls_native)
        for n, (session, recorded) in enumerate(todo):
            run.turn(n, session, recorded)
    finally:
        run.close()
    return run.figures(workload, todo)


class _Answer(NamedTuple):
    """One system's reply to one turn, as the figures count it."""

    wall: float  # seconds, the request's whole round trip
    tokens: int
    decode_s: float
    steps: int  # verifier steps (llama-server: tokens less those accepted from drafts)
    calls: list[tuple[str, Any]]  # the calls with whole JSON arguments (``whole_calls``)


class ToolsRun:
    """One ``run_tools``: the renderer (the daemon's prompt and grammar, built here for
    llama-server), the systems and the tallies of their turns. ``start`` launches the
    systems, ``turn`` sends them one turn in alternating order, ``close`` stops them,
    ``figures`` gives the result (``tools_lines``: as the text table)."""

    def __init__(self, model: str | None, max_tokens: int, threads: int, ctx_size: int,
                 ls_chat_template: Path | None) -> None:
        from ..daemon.generation.chat import ChatRenderer
        from ..daemon.generation.verifier import Verifier
        from ..daemon.model import resolve_model_path

        self.model, self.max_tokens, self.threads, self.ctx_size = \
            model, max_tokens, threads, ctx_size
        self.model_path = resolve_model_path(model)
        # this process renders what the daemon renders, for llama-server (no decoding here)
        self.renderer_v = Verifier(self.model_path, n_ctx=256, n_slots=1, n_threads=1)
        self.renderer = ChatRenderer(self.renderer_v)
        self.n_ctx = min(ctx_size, self.renderer_v.n_ctx_train)
        self.template_args = chat_template_args(self.renderer.template, ls_chat_template)
        self.tmp = Path(tempfile.mkdtemp(prefix="suffixd-bench-tools-"))
        self.servers: dict[str, Any] = {}
        self.mode: dict[str, str] = {}  # llama-server system -> its comparison
        self.daemon: Any = None
        self.oai: Any = None  # the openai client of the daemon's endpoint
        self.systems = ["suffixd"]
        self.stats: dict[str, dict[str, Any]] = {}
        self.same = {SAME_GRAMMAR: 0, NATIVE: 0}
        self.compared = {SAME_GRAMMAR: 0, NATIVE: 0}
        self.ls_only = {SAME_GRAMMAR: 0, NATIVE: 0}
        self.skipped = 0

    def start(self, llama_server: str | None, spec_types: str | None, ls_flash_attn: str,
              ls_plain: bool, ls_same_grammar: bool, ls_native: bool) -> None:
        """llama-server's systems (each comparison asked for), then the daemon, once its
        costs are measured."""
        import openai

        from .daemons import start_daemon, wait_measured
        from .llama_server import start_servers

        if llama_server:
            kw: dict[str, Any] = {"threads": self.threads, "n_ctx": self.n_ctx,
                                  "spec_types_wanted": spec_types, "flash_attn": ls_flash_attn,
                                  "plain": ls_plain}
            if ls_same_grammar:
                for name, srv in start_servers(llama_server, self.model_path, **kw).items():
                    self.servers[name], self.mode[name] = srv, SAME_GRAMMAR
            if ls_native:
                native = start_servers(llama_server, self.model_path,
                                       extra_args=self.template_args, **kw)
                for name, srv in native.items():
                    self.servers[name + "-native"], self.mode[name + "-native"] = srv, NATIVE
            self.systems += list(self.servers)
        self.daemon = start_daemon(self.tmp / "data", self.model, self.threads, self.ctx_size)
        wait_measured(self.daemon.proc, self.daemon.target)
        self.oai = openai.OpenAI(base_url=self.daemon.http, api_key="none", max_retries=0,
                                 timeout=900)
        self.stats = {s: {"session_s": {}, "turn_s": [], "tokens": 0, "decode_s": 0.0,
                          "steps": 0, "calls": 0, "cut": 0, "turns": 0} for s in self.systems}

    def close(self) -> None:
        """Every system stopped, the renderer's model freed, the daemon's data removed."""
        for srv in self.servers.values():
            srv.close()
        if self.daemon is not None:
            self.daemon.stop(30)
        self.renderer_v.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # ------------------------------------------------------------------ one turn
    def turn(self, n: int, session: str, recorded: list[dict[str, str]]) -> None:
        """Turn ``n`` to every system (the order reversed every other turn, so that
        neither side always goes first), its figures tallied and the calls compared."""
        from ..daemon.http_api.structured import RawReplies, parse_structure

        messages = to_tool_calls(session, recorded)
        body = {"messages": messages, "tools": [BASH], "tool_choice": "required",
                "parallel_tool_calls": False}
        structure = parse_structure(body, chat=True)
        structure.settle(self.renderer.template)
        msgs, tools = structure.messages(messages, RawReplies())
        prompt = self.renderer.tokens(msgs, tools=tools)
        if len(prompt) + self.max_tokens + 64 > self.n_ctx:
            self.skipped += 1
            return
        gbnf = structure.grammar()
        calls: dict[str, list[tuple[str, Any]]] = {}
        order = self.systems if n % 2 == 0 else self.systems[::-1]
        for system in order:
            if system == "suffixd":
                answer = self.ask_suffixd(session, messages)
            elif self.mode[system] == NATIVE:
                answer = self.ask_native(system, body)
            else:
                answer = self.ask_same_grammar(system, prompt, gbnf, structure)
            self.tally(system, session, answer)
            calls[system] = answer.calls
        for system in self.systems[1:]:
            m = self.mode[system]
            self.compared[m] += 1
            self.same[m] += int(calls[system] == calls["suffixd"])
            self.ls_only[m] += int(bool(calls[system]) and not calls["suffixd"])

    def ask_suffixd(self, session: str, messages: list[dict[str, Any]]) -> _Answer:
        """The turn through the official ``openai`` client, its session named."""
        t0 = time.perf_counter()
        r = self.oai.chat.completions.create(
            model="default", tools=[BASH],
            messages=cast("list[ChatCompletionMessageParam]", messages),
            tool_choice="required", parallel_tool_calls=False, temperature=0,
            max_tokens=self.max_tokens, extra_headers={
                "X-Suffixd-Namespace": "bench-tools",
                "X-Suffixd-Session": session})
        wall = time.perf_counter() - t0
        extra = (r.model_extra or {}).get("suffixd", {})
        return _Answer(
            wall, r.usage.completion_tokens if r.usage else 0,
            float(extra.get("decode_seconds", 0.0)), int(extra.get("steps", 0)),
            whole_calls((c.function.name, c.function.arguments)
                        for c in r.choices[0].message.tool_calls or ()
                        if c.type == "function"))  # the only kind answered

    def ask_native(self, system: str, body: Mapping[str, Any]) -> _Answer:
        """The same request on llama-server's own /v1/chat/completions."""
        t0 = time.perf_counter()
        answer = _ls_chat(self.servers[system].url, {
            **body, "temperature": 0.0, "max_tokens": self.max_tokens,
            "cache_prompt": True})
        wall = time.perf_counter() - t0
        t = answer.get("timings", {})
        tokens = int(t.get("predicted_n", 0))
        return _Answer(wall, tokens, float(t.get("predicted_ms", 0.0)) / 1e3,
                       max(1, tokens - int(t.get("draft_n_accepted", 0) or 0)),
                       whole_calls(message_calls(answer["choices"][0]["message"])))

    def ask_same_grammar(self, system: str, prompt: list[int], gbnf: str | None,
                         structure: Structure) -> _Answer:
        """suffixd's prompt tokens and grammar on llama-server's /completion, its text read
        by suffixd's parser."""
        t0 = time.perf_counter()
        turn = self.servers[system].complete(prompt, self.max_tokens, grammar=gbnf)
        wall = time.perf_counter() - t0
        assert structure.fmt is not None
        parsed = structure.fmt.parse(self.renderer_v.detokenize(turn.tokens))
        return _Answer(wall, turn.predicted_n, turn.decode_s,
                       max(1, turn.predicted_n - turn.accepted),
                       whole_calls((c.name, c.arguments) for c in parsed.calls))

    def tally(self, system: str, session: str, answer: _Answer) -> None:
        """One turn of ``system`` into its figures (a reply of ``max_tokens`` counts as cut)."""
        st = self.stats[system]
        st["turn_s"].append(answer.wall)
        st["session_s"][session] = st["session_s"].get(session, 0.0) + answer.wall
        st["tokens"] += answer.tokens
        st["decode_s"] += answer.decode_s
        st["steps"] += answer.steps
        st["calls"] += int(bool(answer.calls))
        st["cut"] += int(answer.tokens >= self.max_tokens)
        st["turns"] += 1

    # ------------------------------------------------------------------ the figures
    def figures(self, workload: Path, todo: Sequence[tuple[str, Any]]) -> dict[str, Any]:
        """The run's JSON object: the setup, each system's figures, and per comparison
        suffixd against the fastest llama-server system and the calls they agree on."""
        from .generate import p95

        mode = self.mode
        out: dict[str, Any] = {"workload": str(workload),
                               "sessions": len({s for s, _ in todo}),
                               "turns": len(todo), "skipped_turns": self.skipped,
                               "n_ctx": self.n_ctx, "max_tokens": self.max_tokens,
                               "threads": self.threads, "ls_comparison": mode}
        if any(m == NATIVE for m in mode.values()):
            out["ls_native_args"] = self.template_args
        for s in self.systems:
            st = self.stats[s]
            walls = list(st["session_s"].values())
            out[f"{s}_session_wall_s"] = round(sum(walls) / len(walls), 3) if walls else 0.0
            out[f"{s}_turn_s"] = round(sum(st["turn_s"]) / max(1, len(st["turn_s"])), 4)
            out[f"{s}_turn_p95_s"] = round(p95(st["turn_s"]), 4)
            out[f"{s}_decode_tok_s"] = round(st["tokens"] / st["decode_s"], 2) \
                if st["decode_s"] else 0.0
            out[f"{s}_tokens_per_step"] = round(st["tokens"] / max(1, st["steps"]), 3)
            out[f"{s}_calls_parsed"] = f"{st['calls']}/{st['turns']}"
            out[f"{s}_cut_by_max_tokens"] = st["cut"]
        # same-grammar keys as before the native comparison, native ones with "native" in
        # them
        for m, tag in ((SAME_GRAMMAR, "ls"), (NATIVE, "ls_native")):
            group = [s for s in self.systems[1:] if mode[s] == m]
            if not group:
                continue
            fastest = min(group, key=lambda s: out[f"{s}_session_wall_s"] or 1e18)
            out[f"{tag}_fastest"] = fastest
            out[f"suffixd_session_wall_vs_{tag}_fastest"] = round(
                out["suffixd_session_wall_s"] / max(out[f"{fastest}_session_wall_s"], 1e-9), 4)
            out[f"suffixd_decode_vs_{tag}_fastest"] = round(
                out["suffixd_decode_tok_s"] / max(out[f"{fastest}_decode_tok_s"], 1e-9), 4)
            suffix = "" if m == SAME_GRAMMAR else "_native"
            out[f"same_call{suffix}"] = f"{self.same[m]}/{self.compared[m]}"
            # turns where a llama-server system gave a call and suffixd none
            out[f"calls_parsed_by_llama_server{suffix}_only"] = self.ls_only[m]
        return out


def tools_lines(out: Mapping[str, Any], workload: Path) -> list[str]:
    """``run_tools``' figures as the text table (its systems: suffixd, then those of
    ``ls_comparison``)."""
    mode: Mapping[str, str] = out["ls_comparison"]
    lines = [f"{workload.name} as tool calls: {out['sessions']} sessions, "
             f"{out['turns']} turns ({out['skipped_turns']} do not fit {out['n_ctx']}), "
             f"{out['max_tokens']} tokens max"]
    if any(m == NATIVE for m in mode.values()):
        lines.append("llama-server native: " + " ".join(out["ls_native_args"]))
    lines.append(f"{'system':<21} {'comparison':<13} {'session s':>10} {'turn s':>8} "
                 f"{'p95 s':>7} {'decode tok/s':>13} {'tok/step':>9} {'calls':>9} {'cut':>4}")
    for s in ["suffixd", *mode]:
        lines.append(f"{s:<21} {mode.get(s, '-'):<13} "
                     f"{out[f'{s}_session_wall_s']:>10.2f} "
                     f"{out[f'{s}_turn_s']:>8.3f} {out[f'{s}_turn_p95_s']:>7.3f} "
                     f"{out[f'{s}_decode_tok_s']:>13.2f} {out[f'{s}_tokens_per_step']:>9.2f} "
                     f"{out[f'{s}_calls_parsed']:>9} {out[f'{s}_cut_by_max_tokens']:>4}")
    for label, suffix, tag in ((SAME_GRAMMAR, "", "ls"), (NATIVE, "_native", "ls_native")):
        if f"same_call{suffix}" not in out:
            continue
        lines.append(f"{label}: suffixd/{out[f'{tag}_fastest']} session wall "
                     f"{out[f'suffixd_session_wall_vs_{tag}_fastest']}x, decode "
                     f"{out[f'suffixd_decode_vs_{tag}_fastest']}x; same call "
                     f"{out[f'same_call{suffix}']}; a call from llama-server only "
                     f"{out[f'calls_parsed_by_llama_server{suffix}_only']}")
    return lines
