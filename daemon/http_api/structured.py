"""Tool calls and structured output of one request: ``tools``, ``tool_choice``,
``parallel_tool_calls`` and ``response_format``, from the request body to the reply.

Interface:

* ``parse_structure(body, chat)`` -> ``Structure`` (400s for what is malformed);
* ``Structure.settle(template)`` once the model is known: the call format its chat
  template writes (tool_calls/: Hermes/Qwen, Llama 3.x JSON, Mistral, or the generic
  JSON format for templates without tool support, the embedded gemma-3 among them);
* ``Structure.messages(messages, replies)`` -> the messages (and ``tools``) the chat
  template renders; ``Structure.grammar()`` -> the GBNF that constrains the output, or
  None;
* ``ReplyShaper``: the generated text into what the client gets, step by step: OpenAI
  deltas (content up to where a call may begin; a call's id and name once its name is
  read, then its arguments as they are written: tool_calls.CallStream), and at the end
  the message those deltas add up to (``tool_calls``, ``finish_reason: "tool_calls"``),
  the same whether the answer was streamed or not;
* ``RawReplies``: what the model wrote for each reply it served, so that the reply,
  sent back in the history as parsed calls, renders as the very tokens the session's KV
  cache and suffix tree already hold (with the model's own call ids where the client got
  others: a mistral id written after the arguments comes too late for the first delta).

When calls are constrained (as llama-server does it): the generic format always (the
output is one JSON object: ``tool_call(s)``, or ``response`` unless a call is required);
a native format when ``tool_choice`` is ``required`` or names a function (the format's
call markers around schema-valid call JSON). ``response_format`` ``json_object`` /
``json_schema`` constrains the output to JSON (matching the schema).

``response_format`` together with ``tools``, as OpenAI serves it (tools when called, the
format otherwise):

* tool_choice ``none``: the format alone, as without tools;
* ``required`` or a named function: the calls alone (the answer is a call, so the format
  has nothing to hold);
* ``auto``, generic format: the ``response`` alternative of the one JSON object takes the
  format's schema instead of a string (what llama.cpp's common_chat_params_init_generic
  does with a json_schema); its content is that JSON;
* ``auto``, a native format: held to the format's calls or the format's JSON (a grammar
  with both alternatives), where without a response_format auto is not constrained at
  all. Leaving it unconstrained would break the format's promise whenever the model
  answers in prose; holding it to the JSON alone would forbid calls. The alternative keeps
  both promises and still lets the model choose, in its own call syntax (llama.cpp instead
  falls back to its generic format for tools with a schema, which takes a Qwen or Llama
  model out of the call syntax it was trained on). Llama 3.x calls are bare JSON objects,
  so with a response_format an object counts as a call only if it has arguments too
  (``CallStream``'s strict mode): an answer may well have a "name". The cost: the grammar
  has no room for prose before a call, nor for a ``<think>`` block.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..generation.grammar import GrammarError, grammar_for_schema, json_grammar
from .requests import ApiError, render_message
from .session_finder import canonical_message, message_text
from .tool_calls import (
    GENERIC,
    HERMES,
    LLAMA3_JSON,
    MISTRAL,
    CallDelta,
    ToolCall,
    ToolFormat,
    call_stream,
    detect_format,
)

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MAX_TOOLS = 128


@dataclass
class Structure:
    functions: list[dict[str, Any]] = field(default_factory=list)  # OpenAI function objects
    choice: str = "auto"  # "none" | "auto" | "required" | "named"
    named: str = ""
    parallel: bool = True
    response_schema: dict[str, Any] | None = None  # json_object: {"type": "object"}
    fmt: ToolFormat | None = None  # set by settle() when calls are expected

    @property
    def calls_expected(self) -> bool:
        return bool(self.functions) and self.choice != "none"

    @property
    def active(self) -> bool:
        return self.calls_expected or self.response_schema is not None

    @property
    def calls_or_format(self) -> bool:
        """The answer is either calls or the response_format's JSON (tool_choice auto)."""
        return self.calls_expected and self.choice == "auto" and \
            self.response_schema is not None

    def settle(self, chat_template: str) -> None:
        if self.calls_expected:
            self.fmt = detect_format(chat_template)

    # ------------------------------------------------------------------ rendering
    def messages(self, messages: Sequence[Mapping[str, Any]], replies: RawReplies,
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        """The messages for the chat template, and the ``tools`` it gets (native formats;
        the generic format lists them in the system message instead)."""
        if self.fmt is None:
            return [render_message(dict(m)) for m in messages], None
        generic = self.fmt is GENERIC
        names_by_id: dict[str, str] = {}
        written_ids: dict[str, str] = {}  # an id the client got -> the one the raw text has
        out: list[dict[str, Any]] = []
        for m in messages:
            role = "system" if m["role"] == "developer" else m["role"]
            text = message_text(m.get("content"))
            if role == "assistant":
                calls = _calls_of(m)
                for c in calls:
                    names_by_id[c.id] = c.name
                raw = replies.get(m)
                if raw is not None:
                    written_ids.update(replies.aliases(m))
                    out.append({"role": "assistant", "content": raw})
                elif generic:
                    out.append({"role": "assistant", "content": GENERIC.render(calls, text)})
                elif calls:
                    out.append({"role": "assistant", "content": text, "tool_calls": [
                        {"id": c.id, "type": "function",
                         "function": {"name": c.name, "arguments": _json_or_text(c.arguments)}}
                        for c in calls]})
                else:
                    out.append({"role": "assistant", "content": text})
            elif role == "tool":
                cid = str(m.get("tool_call_id") or "")
                name = str(m.get("name") or names_by_id.get(cid, ""))
                cid = written_ids.get(cid, cid)
                if generic:  # a template without a tool role: the result as the user's turn
                    out.append({"role": "user", "content": json.dumps(
                        {"tool_response": {"tool": name, "tool_call_id": cid, "content": text}},
                        ensure_ascii=False)})
                else:
                    out.append({"role": "tool", "content": text, "tool_call_id": cid,
                                "name": name})
            else:
                out.append({"role": role, "content": text})
        if not generic:
            return out, [{"type": "function", "function": f} for f in self.functions]
        prompt = GENERIC.system_prompt(self.functions, self.parallel)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{prompt}"}
        else:
            out.insert(0, {"role": "system", "content": prompt})
        return out, None

    # ------------------------------------------------------------------ grammar
    def grammar(self) -> str | None:
        try:
            if self.response_schema is not None and not self.calls_expected:
                if self.response_schema == {"type": "object"}:
                    return json_grammar()
                return grammar_for_schema(self.response_schema)
            if self.fmt is None:
                return None
            fns = [f for f in self.functions if self.choice != "named" or f["name"] == self.named]
            required = self.choice in ("required", "named")
            if self.fmt is GENERIC:
                return grammar_for_schema(
                    GENERIC.json_schema(fns, required=required, parallel=self.parallel,
                                        response=self.response_schema))
            if not required and not self.calls_or_format:
                return None  # auto: the model may answer in prose; its calls are parsed
            call = grammar_for_schema(
                self.fmt.json_schema(fns, required=True, parallel=self.parallel))
            calls = _wrap_calls(self.fmt, call, self.parallel)
            if required:
                return calls
            # calls or else the format's JSON: the format's grammar alone, as with no tools
            answer = replace(self, functions=[], choice="none", fmt=None).grammar()
            assert answer is not None
            return _either(calls, answer)
        except (GrammarError, ValueError) as exc:
            raise ApiError(400, f"cannot constrain the output: {exc}",
                           param="tools" if self.response_schema is None
                           else "response_format") from exc


def _wrap_calls(fmt: ToolFormat, call_gbnf: str, parallel: bool) -> str:
    """A native format's calls around the call object's grammar: Hermes repeats its tags
    per call, Mistral lists the calls in one array, Llama 3 separates them with ';'."""
    rules = re.sub(r"(?m)^root ::=", "call ::=", call_gbnf)
    if fmt is HERMES:
        item = f"{_lit(fmt.prefix)} call {_lit(fmt.suffix)}"
        root = f"{item} ({_lit(chr(10))} {item})*" if parallel else item
    elif fmt is MISTRAL:
        more = ' ("," " "? call)*' if parallel else ""
        root = f"{_lit(fmt.prefix)} call{more} {_lit(fmt.suffix)}"
    elif fmt is LLAMA3_JSON:
        root = 'call (";" " "? call)*' if parallel else "call"
    else:  # pragma: no cover - the generic format has its own schema
        raise ValueError(f"no call grammar for the {fmt.name} format")
    return f"root ::= {root}\n{rules}"


# A GBNF text as tokens: literals and character classes (whose contents are not names),
# comments, names, and anything else one character at a time.
_GBNF_TOKEN = re.compile(
    r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|#[^\n]*|[A-Za-z0-9_-]+|.', re.DOTALL)
_GBNF_RULE = re.compile(r"^([A-Za-z0-9_-]+)\s*::=", re.MULTILINE)


def _renamed(gbnf: str, prefix: str) -> str:
    """The grammar with every rule it defines renamed ``prefix`` + name, so that two
    grammars (each with its own "root", "space", "string", ...) can live in one."""
    names = set(_GBNF_RULE.findall(gbnf))
    return "".join(prefix + t if t in names else t for t in _GBNF_TOKEN.findall(gbnf))


def _either(first: str, second: str) -> str:
    """The language of either grammar."""
    return (f"root ::= c-root | r-root\n{_renamed(first, 'c-')}\n{_renamed(second, 'r-')}")


def _lit(text: str) -> str:
    """A GBNF string literal."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") \
        .replace("\r", "\\r").replace("\t", "\\t")
    return f'"{escaped}"'


def _json_or_text(arguments: str) -> Any:
    # chat templates render arguments with |tojson: give them the object, as llama-server
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def _calls_of(m: Mapping[str, Any]) -> list[ToolCall]:
    calls = []
    for c in m.get("tool_calls") or ():
        fn = c.get("function") if isinstance(c, Mapping) else None
        if isinstance(fn, Mapping):
            calls.append(ToolCall(str(fn.get("name", "")), str(fn.get("arguments") or "{}"),
                                  str(c.get("id") or "")))
    return calls


# ---------------------------------------------------------------------- the request
def parse_structure(body: Mapping[str, Any], chat: bool) -> Structure:
    s = Structure()
    tools = body.get("tools")
    if tools is not None:
        if not chat:
            raise ApiError(400, "'tools' is for chat completions", param="tools")
        if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
            raise ApiError(400, f"'tools' must be a list of at most {MAX_TOOLS} tools",
                           param="tools")
        for i, t in enumerate(tools):
            s.functions.append(_function(t, i))
        names = [f["name"] for f in s.functions]
        if len(set(names)) != len(names):
            raise ApiError(400, "'tools' names a function twice", param="tools")
    if body.get("functions") is not None:
        raise ApiError(400, "'functions' is deprecated: use 'tools'", param="functions",
                       code="unsupported_parameter")
    choice = body.get("tool_choice")
    if choice is None:
        s.choice = "auto"
    elif choice in ("none", "auto", "required"):
        s.choice = choice
    elif isinstance(choice, Mapping) and choice.get("type") == "function" and isinstance(
            choice.get("function"), Mapping) and isinstance(choice["function"].get("name"), str):
        s.choice, s.named = "named", choice["function"]["name"]
        if s.named not in {f["name"] for f in s.functions}:
            raise ApiError(400, f"'tool_choice' names '{s.named}', which is not in 'tools'",
                           param="tool_choice")
    else:
        raise ApiError(400, "'tool_choice' must be 'none', 'auto', 'required' or "
                       "{\"type\": \"function\", \"function\": {\"name\": ...}}",
                       param="tool_choice")
    if s.choice in ("required", "named") and not s.functions:
        raise ApiError(400, f"'tool_choice' is '{s.choice}' but there are no 'tools'",
                       param="tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ApiError(400, "'parallel_tool_calls' must be a boolean",
                       param="parallel_tool_calls")
    s.parallel = True if parallel is None else parallel
    s.response_schema = _response_schema(body.get("response_format"))
    return s


def _function(tool: Any, i: int) -> dict[str, Any]:
    where = f"tools[{i}]"
    if not isinstance(tool, Mapping) or tool.get("type", "function") != "function" \
            or not isinstance(tool.get("function"), Mapping):
        raise ApiError(400, f"{where} must be {{\"type\": \"function\", \"function\": {{...}}}}",
                       param=where)
    fn = tool["function"]
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ApiError(400, f"{where}.function.name must be 1-64 letters, digits, '_', '-' "
                       "or '.'", param=f"{where}.function.name")
    out: dict[str, Any] = {"name": name}
    if fn.get("description") is not None:
        if not isinstance(fn["description"], str):
            raise ApiError(400, f"{where}.function.description must be a string",
                           param=f"{where}.function.description")
        out["description"] = fn["description"]
    params = fn.get("parameters")
    if params is not None:
        if not isinstance(params, Mapping):
            raise ApiError(400, f"{where}.function.parameters must be a JSON schema object",
                           param=f"{where}.function.parameters")
        if not _object_root(params):
            # a call's arguments are an object (OpenAI refuses any other root): a number
            # or an array there would be written by the grammar and read by no call format
            raise ApiError(400, f"{where}.function.parameters must be the schema of an "
                           "object (\"type\": \"object\" at its root)",
                           param=f"{where}.function.parameters")
        out["parameters"] = dict(params)
    return out


_NOT_OBJECT_ROOT = ("anyOf", "oneOf", "allOf", "enum", "const", "$ref", "items",
                    "prefixItems", "pattern", "format", "minLength", "maxLength")


def _object_root(schema: Mapping[str, Any]) -> bool:
    """Whether a schema's root is an object: ``"type": "object"``, or no type and nothing
    that makes it another kind of value (``{}`` and ``{"properties": ...}`` are objects)."""
    if "type" in schema:
        return bool(schema["type"] == "object")
    return not any(k in schema for k in _NOT_OBJECT_ROOT)


def _response_schema(fmt: Any) -> dict[str, Any] | None:
    if fmt is None:
        return None
    if not isinstance(fmt, Mapping):
        raise ApiError(400, "'response_format' must be an object", param="response_format")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if not isinstance(schema, Mapping):
            raise ApiError(400, "'response_format.json_schema.schema' must be a JSON schema "
                           "object", param="response_format")
        # an empty schema means any object, as llama-server reads it
        return dict(schema) if schema else {"type": "object"}
    raise ApiError(400, "'response_format.type' must be 'text', 'json_object' or "
                   "'json_schema'", param="response_format")


# ---------------------------------------------------------------------- the reply
class ReplyShaper:
    """The generated text as the client sees it. ``feed`` returns the deltas that may go
    out now (OpenAI ``delta`` objects: ``{"content": ...}`` or ``{"tool_calls": [...]}``):
    without tools all the text; with them, content up to where a call may begin and each
    call's id and name once read, then its arguments as they are written
    (tool_calls.CallStream). ``finish`` gives the whole message, its finish reason and the
    deltas still to send; the message is what the deltas add up to, streamed or not."""

    def __init__(self, structure: Structure) -> None:
        self.s = structure
        self.text = ""
        fmt = structure.fmt
        self.stream = call_stream(fmt, strict=structure.calls_or_format) \
            if fmt is not None else None
        self.aliases: dict[str, str] = {}  # call ids the client got -> the model's own

    def feed(self, piece: str) -> list[dict[str, Any]]:
        self.text += piece
        if self.stream is None:
            return [{"content": piece}] if piece else []
        content, calls = self.stream.feed(piece)
        return _deltas(content, calls)

    def finish(self, finish_reason: str | None) -> tuple[dict[str, Any], str,
                                                         list[dict[str, Any]]]:
        finish = finish_reason or "stop"
        if self.stream is None:
            return {"role": "assistant", "content": self.text}, finish, []
        end = self.stream.finish()
        self.aliases = end.aliases
        rest = _deltas(end.content_rest, end.deltas)
        if not end.calls:
            return {"role": "assistant", "content": end.content}, finish, rest
        message = {"role": "assistant", "content": end.content or None, "tool_calls": [
            {"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}}
            for c in end.calls]}
        return message, "tool_calls" if finish == "stop" else finish, rest


def _deltas(content: str, calls: Sequence[CallDelta]) -> list[dict[str, Any]]:
    """OpenAI deltas: the content, then one per call delta (a call's consecutive argument
    pieces as one), the first of a call with its id, type and name, as OpenAI sends them."""
    out: list[dict[str, Any]] = [{"content": content}] if content else []
    last: dict[str, Any] | None = None
    for d in calls:
        if d.id:
            last = {"index": d.index, "id": d.id, "type": "function",
                    "function": {"name": d.name, "arguments": d.arguments}}
            out.append({"tool_calls": [last]})
        elif last is not None and last["index"] == d.index and "id" not in last:
            last["function"]["arguments"] += d.arguments
        else:
            last = {"index": d.index, "function": {"arguments": d.arguments}}
            out.append({"tool_calls": [last]})
    return out


class RawReplies:
    """Bounded map: a served reply (as the client will send it back) -> the text the
    model wrote for it, and the call ids the client got that differ from the ones in that
    text (mistral ids written after the arguments, which the stream could not wait for)."""

    def __init__(self, max_entries: int = 10_000) -> None:
        self._lock = threading.Lock()
        self._raw: OrderedDict[bytes, tuple[str, dict[str, str]]] = OrderedDict()
        self.max_entries = max_entries

    @staticmethod
    def _key(message: Mapping[str, Any]) -> bytes:
        return hashlib.blake2b(canonical_message(message), digest_size=16).digest()

    def put(self, message: Mapping[str, Any], raw: str,
            aliases: Mapping[str, str] | None = None) -> None:
        key = self._key(message)
        with self._lock:
            self._raw[key] = (raw, dict(aliases or {}))
            self._raw.move_to_end(key)
            while len(self._raw) > self.max_entries:
                self._raw.popitem(last=False)

    def get(self, message: Mapping[str, Any]) -> str | None:
        key = self._key(message)
        with self._lock:
            entry = self._raw.get(key)
        return None if entry is None else entry[0]

    def aliases(self, message: Mapping[str, Any]) -> dict[str, str]:
        key = self._key(message)
        with self._lock:
            entry = self._raw.get(key)
        return {} if entry is None else dict(entry[1])
