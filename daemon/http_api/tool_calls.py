"""Tool calls in a model's generated text: parsing them out, and writing them back.

Interface: ``ToolCall`` (name, arguments as JSON text, id) and ``Parsed`` (content, calls);
one ``ToolFormat`` per model family, each with ``parse(text, tool_names)``,
``render(calls, content)``, ``call_start(text)`` (where streaming must stop releasing
content), ``json_schema(tools, required=, parallel=)`` and the ``prefix``/``suffix`` text
around one call (to build a grammar as prefix + call JSON + suffix); ``FORMATS`` (by name),
``detect_format(chat_template)`` and ``call_id()``. The generic format also gives
``system_prompt(tools, parallel)``. ``call_stream(fmt)`` -> ``CallStream`` reads one output
as it is generated (``feed(piece)`` -> content and ``CallDelta``s that may go out now,
``finish()`` -> ``StreamEnd``): what the endpoint streams, and, fed at once, what it answers
(the section "reading calls while they are generated" below). Standard library only: it
knows nothing of the daemon.

Formats (the ones llama.cpp's server, llama-server, parses for these families):

- ``hermes`` (Qwen 2.5 / 3, Hermes 2 Pro; templates with ``<tool_call>``): content, then
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` per call. As llama.cpp
  does it also reads the wrappers models write by mistake (``<function_call>``, ``<tools>``,
  ``<tool>``, ``<response>``, ``<json>``, ``<JSON>``, ``<xml>``, each optionally inside a
  Markdown code fence, plain or marked json or xml) when ``{"name"`` follows, and
  ``<function=NAME>{...}</function>`` / ``<function name="NAME">``. A leading
  ``<think>...</think>`` stays in the content and calls are looked for after it only.
- ``llama3_json`` (Llama 3.1-3.3): the output is ``{"name": ..., "parameters": {...}}``
  (``"arguments"`` accepted too), after an optional ``<|python_tag|>``; several calls
  separated by ``;`` or newlines. Anything else is content.
- ``mistral`` (templates with ``[TOOL_CALLS]``): ``[TOOL_CALLS][{"name", "arguments", "id"},
  ...]``, or the newer ``[TOOL_CALLS]NAME[ARGS]{...}`` (``[CALL_ID]ID`` allowed before
  ``[ARGS]``), after optional content.
- ``generic`` (templates without tool support): the whole output is one JSON object,
  ``{"tool_call": {...}}``, ``{"tool_calls": [...]}`` or ``{"response": "TEXT"}``; the model
  is told so by ``system_prompt`` and held to it by the grammar of ``json_schema``.

What llama.cpp does, read in ggml-org/llama.cpp (``common/chat-parser.cpp`` at 05e5139a)
(``common_chat_parse_hermes_2_pro``; ``common_chat_parse_llama_3_1`` through
``parse_json_tool_calls``; ``common_chat_parse_mistral_nemo`` through
``parse_prefixed_json_tool_call_array``; ``common_chat_parse_generic``) and ``common/chat.cpp``
(``common_chat_params_init_generic``, ``common_chat_templates_apply_jinja``):

- Unknown function names: kept as calls. Every parser hands its calls to
  ``common_chat_msg_parser::add_tool_call``, which refuses only an empty name; nothing
  compares the name with the request's tools (the grammar built from the tools is what keeps
  a model to their names). So ``tool_names`` does not filter here either: the caller gets the
  call and decides.
- Broken JSON after a marker: the parsers throw ``common_chat_msg_partial_exception``, and
  ``common_chat_parse`` (for a finished output) drops the calls and re-reads the whole text as
  content (``common_chat_parse_content_only``). Same here: no calls, the whole text as
  content, nothing lost. A call of the wrong shape (no name, arguments not an object) counts
  as broken too.
- Generic shapes: ``tool_calls`` is looked at first, then ``tool_call``, then ``response``
  (a non-string response is dumped as JSON, indent 2); anything else is content.

Where this module parts from llama.cpp, on purpose: a missing closing tag at the very end of
a hermes output is accepted (generation stopped on the call's last token; llama.cpp drops
the call); llama3_json reads several calls (llama.cpp reads one and leaves the rest as
content); a bare ``{"name": ...}`` object with no tag is not a hermes call (llama.cpp takes
it, which turns any JSON the model shows as content into a call, and would hold back every
``{`` while streaming); text after a mistral call array is content (llama.cpp fails the
request: ``common_chat_msg_parser::finish``).

Whitespace between content and a call is dropped (``render`` puts a newline there), so
``call_start`` holds back trailing whitespace too: content released while streaming is always
a prefix of the content ``parse`` gives for the whole output.
"""

from __future__ import annotations

import contextlib
import enum
import json
import re
import secrets
import string
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FORMATS",
    "GENERIC",
    "HERMES",
    "LLAMA3_JSON",
    "MISTRAL",
    "CallDelta",
    "CallStream",
    "GenericFormat",
    "HermesFormat",
    "Llama3JsonFormat",
    "MistralFormat",
    "Parsed",
    "StreamEnd",
    "ToolCall",
    "ToolFormat",
    "call_id",
    "call_stream",
    "detect_format",
]


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text of an object; canonical: json.dumps(obj, ensure_ascii=False)
    id: str = ""  # "" when the model wrote none


@dataclass(frozen=True)
class Parsed:
    content: str  # the text that is not part of a call, markers removed; "" if none
    calls: list[ToolCall]


class _Malformed(Exception):
    """A call began but is not one: the caller returns the whole text as content."""


def _no_constant(name: str) -> Any:
    # NaN/Infinity would be written back as non-JSON into function.arguments.
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_no_constant)
_ID_ALPHABET = string.ascii_letters + string.digits


def call_id() -> str:
    """A fresh OpenAI-style tool call id."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _decode(text: str, pos: int) -> tuple[Any, int]:
    """The JSON value that starts at pos, and where it ends."""
    try:
        return _DECODER.raw_decode(text, pos)
    except ValueError as exc:  # JSONDecodeError, or a NaN
        raise _Malformed(str(exc)) from exc


def _arguments(value: Any) -> str:
    """The canonical JSON text of a call's arguments: an object, or a string holding one
    (some models quote it); missing or empty means no arguments."""
    if value is None or (isinstance(value, str) and not value.strip()):
        value = {}
    elif isinstance(value, str):
        try:
            value = _DECODER.decode(value.strip())
        except ValueError as exc:
            raise _Malformed("arguments are not JSON") from exc
    if not isinstance(value, dict):
        raise _Malformed("arguments are not an object")
    return json.dumps(value, ensure_ascii=False)


def _call(obj: Any, args_keys: Sequence[str]) -> ToolCall:
    """A ToolCall from a decoded {"name": ..., <args key>: ..., "id": ...} object."""
    if not isinstance(obj, dict):
        raise _Malformed("a call is not an object")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise _Malformed("a call has no name")
    args = next((obj[key] for key in args_keys if key in obj), None)
    cid = obj.get("id")
    return ToolCall(name, _arguments(args), cid if isinstance(cid, str) else "")


def _args_value(arguments: str) -> Any:
    """A call's arguments as a JSON value to write back; text that is not JSON (a client may
    send anything in its history) goes in as a string rather than failing the request."""
    if not arguments.strip():
        return {}
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def _hold_from(text: str, floor: int, at: int) -> int | None:
    """Where to stop releasing content, given the earliest place a call may start (``at``,
    len(text) if none): whitespace before it is held too, since it is dropped when a call
    follows."""
    while at > floor and text[at - 1].isspace():
        at -= 1
    return None if at == len(text) else at


def _partial_tail(text: str, marker: str) -> int:
    """Where a proper prefix of marker ends the text (it may become the marker), else
    len(text)."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return len(text) - k
    return len(text)


def _around_calls(text: str, pieces: list[str], pos: int, calls: list[ToolCall]) -> Parsed:
    """The parse of ``text``: the content pieces around the calls (and the rest after
    ``pos``), or all of it as content when no call was found."""
    if not calls:
        return Parsed(text, [])
    pieces.append(text[pos:])
    return Parsed(_join_content(pieces), calls)


def _join_content(pieces: Sequence[str]) -> str:
    """The content around calls. The first piece keeps its start (it may have been streamed
    already); whitespace next to calls goes."""
    parts = [pieces[0].rstrip(), *(piece.strip() for piece in pieces[1:])]
    return "\n".join(part for part in parts if part)


def _functions(tools: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The function objects of OpenAI ``tools`` entries (bare function objects accepted)."""
    functions = []
    for tool in tools:
        fn = tool.get("function", tool)
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ValueError(f"a tool without a function name: {tool!r}")
        functions.append(fn)
    return functions


def _parameters(fn: Mapping[str, Any]) -> dict[str, Any]:
    params = fn.get("parameters")
    return dict(params) if isinstance(params, Mapping) and params else {"type": "object"}


class ToolFormat:
    """How one model family writes tool calls. Subclasses set the class attributes and
    implement parse, render and call_start."""

    name: str = ""
    prefix: str = ""  # the literal text before one call's JSON object
    suffix: str = ""  # and after it
    args_key: str = "arguments"  # the key holding the arguments in the call object

    def parse(self, text: str, tool_names: Collection[str] | None = None) -> Parsed:
        """The calls in a finished output and the content around them. ``tool_names`` is
        accepted for the caller's convenience; calls to other names are kept, as
        llama.cpp keeps them (module docstring)."""
        raise NotImplementedError

    def render(self, calls: Sequence[ToolCall], content: str = "") -> str:
        """The text the model writes for these calls (and content, where the format has
        room for it)."""
        raise NotImplementedError

    def call_start(self, text: str) -> int | None:
        """In a partial output: the index from which text must be held back because a call
        may have begun there (or the whitespace before one); None if all of it is content."""
        raise NotImplementedError

    def mint_id(self) -> str:
        """An id for a call the model wrote none for (or writes after its arguments)."""
        return call_id()

    def _call_schema(self, fn: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {"name": {"const": fn["name"]}, self.args_key: _parameters(fn)},
            "required": ["name", self.args_key],
            "additionalProperties": False,
        }

    def json_schema(
        self, tools: Sequence[Mapping[str, Any]], *, required: bool, parallel: bool
    ) -> dict[str, Any]:
        """The JSON schema of ONE call object, any of the tools. ``required`` and
        ``parallel`` belong to the text around calls (prefix, suffix, repetition), which the
        grammar's builder writes; they change nothing here."""
        branches = [self._call_schema(fn) for fn in _functions(tools)]
        if not branches:
            raise ValueError("no tools")
        return branches[0] if len(branches) == 1 else {"anyOf": branches}

    def __repr__(self) -> str:
        return f"<ToolFormat {self.name}>"


# --- hermes ------------------------------------------------------------------------------


class _Slot(enum.Enum):
    WS = "optional whitespace"
    NAME = "a function name"


_FULL, _PARTIAL, _NO = "full", "partial", "no"
_NOT_NAME = frozenset('<>"')


@dataclass(frozen=True)
class _Opener:
    """The text that opens one kind of call: literals and slots, matched left to right.
    Matching reports "partial" when the text ends while it still fits (streaming must hold
    it back)."""

    elements: tuple[str | _Slot, ...]
    closes: tuple[str, ...]  # literals after the JSON, each after optional whitespace
    named: bool  # the name is in the tag and the JSON holds only the arguments

    def match(self, text: str, pos: int) -> tuple[str, int, str]:
        name = ""
        for element in self.elements:
            if element is _Slot.WS:
                pos = _skip_ws(text, pos)
                if pos == len(text):
                    return _PARTIAL, pos, ""
            elif element is _Slot.NAME:
                start = pos
                while pos < len(text) and not text[pos].isspace() and text[pos] not in _NOT_NAME:
                    pos += 1
                if pos == len(text):
                    return _PARTIAL, pos, ""
                if pos == start:
                    return _NO, pos, ""
                name = text[start:pos]
            else:
                assert isinstance(element, str)
                chunk = text[pos : pos + len(element)]
                if chunk == element:
                    pos += len(element)
                elif pos + len(chunk) == len(text) and element.startswith(chunk):
                    return _PARTIAL, len(text), ""
                else:
                    return _NO, pos, ""
        return _FULL, pos, name


def _hermes_openers() -> tuple[_Opener, ...]:
    # The wrappers llama.cpp's common_chat_parse_hermes_2_pro accepts. Only the real
    # <tool_call> opens a call on "{" alone; the others need {"name" after them, as they
    # also occur in ordinary content.
    ws, brace, name = _Slot.WS, "{", '"name"'
    openers = [_Opener(("<tool_call>", ws, brace), ("</tool_call>",), False)]
    tags = ("<tool_call>", "<function_call>", "<tools>", "<tool>", "<response>", "<json>",
            "<JSON>", "<xml>")
    for tag in tags[1:]:
        openers.append(_Opener((tag, ws, brace, ws, name), ("</" + tag[1:],), False))
    for fence in ("```json\n", "```xml\n", "```\n"):
        for tag in tags:
            openers.append(
                _Opener((fence, ws, tag, ws, brace, ws, name), ("</" + tag[1:], "```"), False)
            )
    openers.append(_Opener(("<function=", _Slot.NAME, ">"), ("</function>",), True))
    openers.append(_Opener(('<function name="', _Slot.NAME, '">'), ("</function>",), True))
    return tuple(openers)


_THINK, _END_THINK = "<think>", "</think>"


def _after_think(text: str) -> int:
    """Where calls may start: after a leading <think> block (llama.cpp parses reasoning
    first, so a <tool_call> written while thinking is not a call); -1 while it is open."""
    lead = _skip_ws(text, 0)
    if not text.startswith(_THINK, lead):
        return 0
    close = text.find(_END_THINK, lead + len(_THINK))
    return -1 if close < 0 else close + len(_END_THINK)


def _by_head(openers: Sequence[_Opener]) -> dict[str, tuple[_Opener, ...]]:
    heads: dict[str, list[_Opener]] = {}
    for opener in openers:
        head = opener.elements[0]
        assert isinstance(head, str)
        heads.setdefault(head, []).append(opener)
    # At most one head can match at a position only if none is a prefix of another.
    assert not any(a != b and b.startswith(a) for a in heads for b in heads)
    return {head: tuple(group) for head, group in heads.items()}


class HermesFormat(ToolFormat):
    name = "hermes"
    prefix = "<tool_call>\n"
    suffix = "\n</tool_call>"
    _openers = _by_head(_hermes_openers())
    # call_start runs on every streamed token: the regex engine finds the heads.
    _heads = re.compile("|".join(re.escape(head) for head in _openers))

    def _find(
        self, text: str, pos: int, *, partial: bool
    ) -> tuple[int, _Opener | None, int, str] | None:
        """The first opener at or after pos: (start, opener, end, name); with partial, also
        one the text ends inside (then opener is None)."""
        for head in self._heads.finditer(text, pos):
            at = head.start()
            for opener in self._openers[head.group()]:
                status, end, name = opener.match(text, at)
                if status == _FULL:
                    return at, opener, end, name
                if status == _PARTIAL and partial:
                    return at, None, end, name
        if partial:
            # A head cut short by the end of the text (none contains another, so no full
            # head can lie after it).
            at = min(_partial_tail(text, head) for head in self._openers)
            if pos <= at < len(text):
                return at, None, len(text), ""
        return None

    @staticmethod
    def _read_call(text: str, at: int, opener: _Opener, end: int, name: str) -> tuple[
        ToolCall, int
    ]:
        if opener.named:
            args, pos = _decode(text, _skip_ws(text, end))
            call = ToolCall(name, _arguments(args))
        else:
            obj, pos = _decode(text, text.rfind("{", at, end))
            call = _call(obj, ("arguments", "parameters"))
        for close in opener.closes:
            pos = _skip_ws(text, pos)
            if text.startswith(close, pos):
                pos += len(close)
            elif close.startswith(text[pos:]):
                return call, len(text)  # the output stopped before (or inside) the close tag
            else:
                raise _Malformed(f"no {close} after a call")
        return call, pos

    def parse(self, text: str, tool_names: Collection[str] | None = None) -> Parsed:
        search = _after_think(text)
        if search < 0:
            return Parsed(text, [])
        pieces: list[str] = []
        calls: list[ToolCall] = []
        pos = 0
        try:
            while (found := self._find(text, search, partial=False)) is not None:
                at, opener, end, name = found
                assert opener is not None
                pieces.append(text[pos:at])
                call, pos = self._read_call(text, at, opener, end, name)
                calls.append(call)
                search = pos
        except _Malformed:
            return Parsed(text, [])
        return _around_calls(text, pieces, pos, calls)

    def render(self, calls: Sequence[ToolCall], content: str = "") -> str:
        # As the Qwen templates write an assistant turn: content, newline, one block a call.
        blocks = [
            self.prefix
            + json.dumps({"name": c.name, "arguments": _args_value(c.arguments)},
                         ensure_ascii=False)
            + self.suffix
            for c in calls
        ]
        return "\n".join([content, *blocks] if content else blocks)

    def call_start(self, text: str) -> int | None:
        floor = _after_think(text)
        if floor < 0:
            return None  # inside the think block: content, whatever it says
        found = self._find(text, floor, partial=True)
        return _hold_from(text, floor, len(text) if found is None else found[0])


# --- llama3_json -------------------------------------------------------------------------

_PYTHON_TAG = "<|python_tag|>"


class Llama3JsonFormat(ToolFormat):
    name = "llama3_json"
    args_key = "parameters"

    def parse(self, text: str, tool_names: Collection[str] | None = None) -> Parsed:
        calls: list[ToolCall] = []
        pos = _skip_ws(text, 0)
        try:
            while True:
                start = pos
                if text.startswith(_PYTHON_TAG, pos):
                    pos = _skip_ws(text, pos + len(_PYTHON_TAG))
                if not text.startswith("{", pos):
                    pos = start
                    break
                obj, pos = _decode(text, pos)
                calls.append(_call(obj, ("parameters", "arguments")))
                pos = _skip_ws(text, pos)
                if text.startswith(";", pos):
                    pos = _skip_ws(text, pos + 1)
        except _Malformed:
            return Parsed(text, [])
        if not calls:
            return Parsed(text, [])
        # As llama.cpp's parse_json_tool_calls: what follows the calls is content.
        return Parsed(text[pos:].strip(), calls)

    def render(self, calls: Sequence[ToolCall], content: str = "") -> str:
        # The Llama 3.x templates write a call turn as the JSON alone: content has no room.
        if not calls:
            return content
        return "\n".join(
            json.dumps({"name": c.name, "parameters": _args_value(c.arguments)},
                       ensure_ascii=False)
            for c in calls
        )

    def call_start(self, text: str) -> int | None:
        # A call is the whole output, so it can only start at the beginning.
        head = text.lstrip()
        if not text:
            return None
        if not head or head.startswith(("{", _PYTHON_TAG)) or _PYTHON_TAG.startswith(head):
            return 0
        return None


# --- mistral -----------------------------------------------------------------------------

_TOOL_CALLS = "[TOOL_CALLS]"
# [TOOL_CALLS]NAME[ARGS]{...}, with [CALL_ID]ID before [ARGS] in some releases.
_NEW_MISTRAL_HEAD = re.compile(r"\s*([^\s\[\]{}\"]+)\s*(?:\[CALL_ID\]\s*([^\s\[\]]+)\s*)?\[ARGS\]")


class MistralFormat(ToolFormat):
    name = "mistral"
    prefix = _TOOL_CALLS + "["
    suffix = "]"

    def mint_id(self) -> str:
        # Mistral's templates take 9 alphanumerics and nothing else back in the history.
        return "".join(secrets.choice(_ID_ALPHABET) for _ in range(9))

    def _call_schema(self, fn: Mapping[str, Any]) -> dict[str, Any]:
        # As llama.cpp's common_chat_params_init_mistral_nemo: the model writes the id, and
        # Mistral's templates refuse any but 9 alphanumerics when it comes back in history.
        schema = super()._call_schema(fn)
        schema["properties"]["id"] = {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}
        schema["required"].append("id")
        return schema

    @staticmethod
    def _read_block(text: str, pos: int) -> tuple[list[ToolCall], int]:
        """The calls after one [TOOL_CALLS] (pos just after it)."""
        start = _skip_ws(text, pos)
        if text.startswith(("[", "{"), start):
            value, end = _decode(text, start)
            items = value if isinstance(value, list) else [value]
            if not items:
                raise _Malformed("an empty call list")
            return [_call(item, ("arguments",)) for item in items], end
        head = _NEW_MISTRAL_HEAD.match(text, pos)
        if head is None:
            raise _Malformed("no call after [TOOL_CALLS]")
        args, end = _decode(text, _skip_ws(text, head.end()))
        return [ToolCall(head.group(1), _arguments(args), head.group(2) or "")], end

    def parse(self, text: str, tool_names: Collection[str] | None = None) -> Parsed:
        pieces: list[str] = []
        calls: list[ToolCall] = []
        pos = 0
        try:
            while (at := text.find(_TOOL_CALLS, pos)) >= 0:
                pieces.append(text[pos:at])
                block, pos = self._read_block(text, at + len(_TOOL_CALLS))
                calls.extend(block)
        except _Malformed:
            return Parsed(text, [])
        return _around_calls(text, pieces, pos, calls)

    def render(self, calls: Sequence[ToolCall], content: str = "") -> str:
        if not calls:
            return content
        items = []
        for c in calls:
            item: dict[str, Any] = {"name": c.name, "arguments": _args_value(c.arguments)}
            if c.id:
                item["id"] = c.id
            items.append(json.dumps(item, ensure_ascii=False))
        return content + self.prefix + ", ".join(items) + self.suffix

    def call_start(self, text: str) -> int | None:
        at = text.find(_TOOL_CALLS)
        return _hold_from(text, 0, _partial_tail(text, _TOOL_CALLS) if at < 0 else at)


# --- generic -----------------------------------------------------------------------------


class GenericFormat(ToolFormat):
    name = "generic"

    def parse(self, text: str, tool_names: Collection[str] | None = None) -> Parsed:
        start = _skip_ws(text, 0)
        if not text.startswith("{", start):
            return Parsed(text, [])
        try:
            obj, end = _decode(text, start)
            if _skip_ws(text, end) != len(text) or not isinstance(obj, dict):
                raise _Malformed("not one JSON object")
            # The order of llama.cpp's common_chat_parse_generic.
            if "tool_calls" in obj:
                if not isinstance(obj["tool_calls"], list):
                    raise _Malformed("tool_calls is not a list")
                return Parsed("", [_call(item, ("arguments",)) for item in obj["tool_calls"]])
            if "tool_call" in obj:
                return Parsed("", [_call(obj["tool_call"], ("arguments",))])
            if "response" in obj:
                response = obj["response"]
                if not isinstance(response, str):
                    response = json.dumps(response, indent=2, ensure_ascii=False)
                return Parsed(response, [])
        except _Malformed:
            pass
        return Parsed(text, [])

    def render(self, calls: Sequence[ToolCall], content: str = "") -> str:
        # What the grammar lets the model write: the calls, or else the response.
        if not calls:
            return json.dumps({"response": content}, ensure_ascii=False)
        items = []
        for c in calls:
            item: dict[str, Any] = {"name": c.name, "arguments": _args_value(c.arguments)}
            if c.id:
                item["id"] = c.id
            items.append(item)
        shape = {"tool_call": items[0]} if len(items) == 1 else {"tool_calls": items}
        return json.dumps(shape, ensure_ascii=False)

    def call_start(self, text: str) -> int | None:
        # The answer is one JSON object: nothing of it is content until it is complete.
        head = text.lstrip()
        if head.startswith("{") or (text and not head):
            return 0
        return None

    def json_schema(
        self, tools: Sequence[Mapping[str, Any]], *, required: bool, parallel: bool,
        response: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The schema of the whole output: the call(s) shape, or else (unless ``required``)
        ``{"response": str}``, or ``{"response": <response>}`` with a response format's
        schema; as llama.cpp's common_chat_params_init_generic, without the ids it demands
        for parallel calls (call ids are minted by the server)."""
        functions = _functions(tools)
        branches: list[dict[str, Any]] = []
        if functions:
            schemas = [self._call_schema(fn) for fn in functions]
            call = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
            if parallel:
                calls = {"type": "array", "items": call, "minItems": 1}
                branches.append(_wrapper("tool_calls", calls))
            else:
                branches.append(_wrapper("tool_call", call))
        elif required:
            raise ValueError("a tool call is required but there are no tools")
        if not required:
            branches.append(_wrapper("response", dict(response or {"type": "string"})))
        return branches[0] if len(branches) == 1 else {"anyOf": branches}

    def system_prompt(self, tools: Sequence[Mapping[str, Any]], parallel: bool) -> str:
        """The instructions that go into the system message: the tools, and the JSON shapes
        to answer with (llama.cpp's generic prompt, plus the tool list, which a template
        without tool support does not render)."""
        listing = [
            {key: fn[key] for key in ("name", "description", "parameters") if key in fn}
            for fn in _functions(tools)
        ]
        example_call = {"name": "tool_name", "arguments": {"arg1": "some_value"}}
        if parallel:
            shape = "`tool_calls` (a list of requests to call tools)"
            example: dict[str, Any] = {"tool_calls": [example_call]}
        else:
            shape = "`tool_call` (a request to call tools)"
            example = {"tool_call": example_call}
        return (
            "You can call any of the following tools to satisfy the user's requests:\n"
            f"{json.dumps(listing, indent=2, ensure_ascii=False)}\n\n"
            f"Respond in JSON format, either with {shape} or with `response` reply to the "
            "user's request. Answer with exactly one JSON object and nothing else.\n\n"
            f"Example tool call syntax:\n{json.dumps(example, indent=2)}\n\n"
            f"Example response syntax:\n{json.dumps({'response': '...'}, indent=2)}"
        )


def _wrapper(key: str, value: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {key: value},
        "required": [key],
        "additionalProperties": False,
    }


HERMES = HermesFormat()
LLAMA3_JSON = Llama3JsonFormat()
MISTRAL = MistralFormat()
GENERIC = GenericFormat()

FORMATS: dict[str, ToolFormat] = {f.name: f for f in (HERMES, LLAMA3_JSON, MISTRAL, GENERIC)}


def detect_format(chat_template: str) -> ToolFormat:
    """The format a model writes calls in, from its GGUF's Jinja chat template; the checks
    and their order follow llama.cpp's common_chat_templates_apply_jinja."""
    t = chat_template
    if "<tool_call>" in t:
        return HERMES
    if "<|start_header_id|>" in t and (
        "ipython" in t or _PYTHON_TAG in t or '"parameters"' in t
    ):
        return LLAMA3_JSON
    if _TOOL_CALLS in t:
        return MISTRAL
    return GENERIC


# --- reading calls while they are generated ---------------------------------------------
#
# ``CallStream`` reads one output as it is generated and says, after every piece, what may
# go out: content (only up to where a call may begin, as ``call_start``) and call deltas
# (a call's id and name once its name is read, then its arguments as they are written).
# The arguments streamed are the canonical text ``parse`` gives (json.dumps with
# ensure_ascii=False) as far as it is certain: ``_Json`` re-serialises the model's JSON
# one character at a time, so a number goes out when it ends and a string as it is
# written. Whatever the pieces, the result is the same as reading the whole output at once.

Path = tuple[str | int, ...]
_JSON_WS = " \t\n\r"
_STRING_RUN = re.compile(r'[^"\\\x00-\x1f]+')
_KEY = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NUMBER_RUN = re.compile(r"[-+0-9.eE]+")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_LITERAL_RUN = re.compile(r"[a-zA-Z]+")
_LITERALS = frozenset(("true", "false", "null"))
_HEX4 = re.compile(r"[0-9a-fA-F]{4}")
_SIMPLE_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n",
                   "r": "\r", "t": "\t"}


def _dump_chars(text: str) -> str:
    """``text`` as the inside of a canonical JSON string."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


class _Span:
    """The canonical text of one watched value, as far as it is known."""

    __slots__ = ("closed", "kind", "order", "parts")

    def __init__(self, kind: str) -> None:
        self.kind = kind  # its first character: '{', '[', '"', a digit or '-', or a letter
        self.parts: list[str] = []
        self.closed = False
        self.order = 0  # closed as the order-th watched value

    def text(self) -> str:
        return "".join(self.parts)

    def value(self) -> Any:
        return _DECODER.decode(self.text())


class _Frame:
    __slots__ = ("count", "key", "kind", "path", "state")

    def __init__(self, kind: str, path: Path) -> None:
        self.kind, self.path = kind, path
        self.state = "first"  # first | key | colon | value | in | next
        self.count = 0  # array: the index of the element being read
        self.key = ""  # object: the key whose value is read


class _Json:
    """One JSON value read incrementally: ``feed(text, pos)`` reads what it can of the text
    (the whole output so far; it always starts where it stopped) and returns where it
    stopped; ``done`` once the value is complete. The values whose path ``watch`` accepts
    get a ``_Span`` in ``spans``. Raises _Malformed where the text stops being JSON (as
    Python's json module reads it: no NaN, no control characters in strings)."""

    def __init__(self, watch: Callable[[Path], bool]) -> None:
        self.watch = watch
        self.spans: dict[Path, _Span] = {}
        self.done = False
        self._open: list[tuple[Path, _Span]] = []  # watched values being read
        self._stack: list[_Frame] = []
        self._string: Path | None = None  # the path of the string being read
        self._closed = 0

    def _emit(self, text: str) -> None:
        for _, span in self._open:
            span.parts.append(text)

    def _start(self, path: Path, first: str) -> None:
        if self.watch(path):
            span = _Span(first)
            self.spans[path] = span
            self._open.append((path, span))
        if self._stack:
            self._stack[-1].state = "in"

    def _end(self, path: Path) -> None:
        if self._open and self._open[-1][0] == path:
            span = self._open.pop()[1]
            self._closed += 1
            span.closed, span.order = True, self._closed
        if self._stack:
            self._stack[-1].state = "next"
        else:
            self.done = True

    def feed(self, text: str, pos: int) -> int:
        n = len(text)
        while pos < n and not self.done:
            if self._string is not None:
                pos = self._read_string(text, pos)
                if self._string is not None:
                    return pos  # the text ends inside the string
                continue
            c = text[pos]
            if c in _JSON_WS:
                pos += 1
                continue
            frame = self._stack[-1] if self._stack else None
            if frame is None or frame.state in ("value", "in") or (
                    frame.kind == "[" and frame.state == "first" and c != "]"):
                if frame is None:
                    path: Path = ()
                elif frame.kind == "{":
                    path = (*frame.path, frame.key)
                else:
                    path = (*frame.path, frame.count)
                end = self._value(text, pos, path)
                if end == pos:
                    return pos  # a number or literal that may go on
                pos = end
            elif frame.kind == "{":
                pos = self._in_object(frame, text, pos)
                if pos < 0:
                    return -pos - 1
            elif c == ",":
                if frame.state != "next":
                    raise _Malformed("',' out of place")
                self._emit(", ")
                frame.count += 1
                frame.state = "value"
                pos += 1
            elif c == "]" and frame.state in ("first", "next"):
                self._emit("]")
                self._stack.pop()
                self._end(frame.path)
                pos += 1
            else:
                raise _Malformed(f"unexpected {c!r} in an array")
        return pos

    def _in_object(self, frame: _Frame, text: str, pos: int) -> int:
        """One step inside an object, at a character that is not whitespace; -(pos + 1)
        when it must wait for more text."""
        c = text[pos]
        if frame.state in ("first", "key") and c == '"':
            m = _KEY.match(text, pos)
            if m is None:
                return -(pos + 1)  # keys are short: read whole once their quote closes
            try:
                key = _DECODER.decode(m.group())
            except ValueError as exc:
                raise _Malformed(str(exc)) from exc
            if not isinstance(key, str):  # pragma: no cover - a JSON string decodes to str
                raise _Malformed("a key is not a string")
            self._emit(json.dumps(key, ensure_ascii=False) + ": ")
            frame.key, frame.state = key, "colon"
            return m.end()
        if frame.state == "colon" and c == ":":
            frame.state = "value"
            return pos + 1
        if frame.state == "next" and c == ",":
            self._emit(", ")
            frame.state = "key"
            return pos + 1
        if frame.state in ("first", "next") and c == "}":
            self._emit("}")
            self._stack.pop()
            self._end(frame.path)
            return pos + 1
        raise _Malformed(f"unexpected {c!r} in an object")

    def _value(self, text: str, pos: int, path: Path) -> int:
        """The start of a value at pos; returns pos unchanged when a number or literal
        reaches the end of the text (it may go on)."""
        c = text[pos]
        if c in "{[":
            self._start(path, c)
            self._emit(c)
            self._stack.append(_Frame(c, path))
            return pos + 1
        if c == '"':
            self._start(path, c)
            self._emit('"')
            self._string = path
            return pos + 1
        run = (_NUMBER_RUN if c == "-" or c.isdigit() else _LITERAL_RUN).match(text, pos)
        if run is None:
            raise _Malformed(f"unexpected {c!r} where a value starts")
        if run.end() == len(text):
            return pos
        token = run.group()
        if token in _LITERALS:
            canonical = token
        elif _NUMBER.fullmatch(token):
            canonical = json.dumps(_DECODER.decode(token))
        else:
            raise _Malformed(f"{token!r} is not a JSON value")
        self._start(path, c)
        self._emit(canonical)
        self._end(path)
        return run.end()

    def _read_string(self, text: str, pos: int) -> int:
        """Inside a string value: what can be read of it from pos (an escape cut short by the
        end of the text waits, as does a high surrogate whose pair may follow)."""
        n = len(text)
        while pos < n:
            run = _STRING_RUN.match(text, pos)
            if run is not None:
                self._emit(run.group())
                pos = run.end()
                continue
            c = text[pos]
            if c == '"':
                self._emit('"')
                path, self._string = self._string, None
                assert path is not None
                self._end(path)
                return pos + 1
            if c != "\\":
                raise _Malformed("a control character in a string")
            if pos + 1 >= n:
                return pos
            e = text[pos + 1]
            if e in _SIMPLE_ESCAPES:
                self._emit(_dump_chars(_SIMPLE_ESCAPES[e]))
                pos += 2
                continue
            if e != "u":
                raise _Malformed(f"invalid escape \\{e}")
            if pos + 6 > n:
                return pos
            code = self._hex(text, pos + 2)
            end = pos + 6
            if 0xD800 <= code <= 0xDBFF:
                # as Python's scanner: a low surrogate escape right after joins it
                follow = text[end:end + 6]
                if follow[:2] == "\\u"[: len(follow[:2])] and len(follow) < 6:
                    return pos  # the pair may be on its way
                if follow[:2] == "\\u":
                    low = self._hex(text, end + 2)
                    if 0xDC00 <= low <= 0xDFFF:
                        code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                        end += 6
            self._emit(_dump_chars(chr(code)))
            pos = end
        return pos

    @staticmethod
    def _hex(text: str, pos: int) -> int:
        digits = text[pos:pos + 4]
        if not _HEX4.fullmatch(digits):
            raise _Malformed("invalid \\u escape")
        return int(digits, 16)


@dataclass(frozen=True)
class CallDelta:
    """What one call gained: its first delta has the id and name (and arguments ""), the
    next ones arguments only."""

    index: int
    arguments: str = ""
    id: str = ""
    name: str = ""


@dataclass
class StreamEnd:
    """The end of an output: what is still to send, and the reply as a whole."""

    content_rest: str  # content not sent yet
    deltas: list[CallDelta]  # calls or arguments not sent yet
    content: str  # the whole content
    calls: list[ToolCall]  # the whole calls, with the ids the client got
    aliases: dict[str, str]  # an id the client got -> the id the model wrote for that call


class _Call:
    """One call being read: its name and id once known, the arguments sent so far."""

    def __init__(self, index: int, path: Path | None, name: str = "", model_id: str = "",
                 args_paths: Sequence[Path] = ()) -> None:
        self.index, self.path = index, path  # path None: the JSON read is the arguments
        self.name = name
        self.model_id = model_id
        self.args_paths = tuple(args_paths)
        self.id = ""
        self.announced = False
        self.args_span: _Span | None = None
        self.taken = 0  # parts of args_span sent
        self.arguments = ""
        self.done = False


class CallStream:
    """One output of ``fmt`` read as it is generated: ``feed(piece)`` -> (content, call
    deltas) that may go out now; ``finish()`` -> ``StreamEnd``.

    A call counts from the moment its name is read: its first delta goes out then. Before
    that, text that turns out not to be a call is content and everything is as ``parse``
    reads the finished output (a malformed call makes the whole output content). After
    it, nothing can be taken back: if the output then stops being well-formed (cut by
    max_tokens, or broken JSON where no grammar holds it), the calls read so far stay,
    the last with its arguments as far as they went (OpenAI does the same for a call cut
    by max_tokens), and the rest of the output is not read. The generic format's string
    ``response`` counts the same way: it goes out as content while it is written. For
    every output that ``parse`` reads as calls, the result is ``parse``'s (tested
    property); a call's id is the model's only where it wrote it before the name.

    ``strict``: a Llama 3.x JSON object is a call only if it has arguments too (with
    ``response_format``, the answer may be an object with a "name")."""

    def __init__(self, fmt: ToolFormat, *, strict: bool = False) -> None:
        self.fmt = fmt
        # only llama3_json's calls look like an answer: the others have their markers
        self.strict = strict and fmt.name == LLAMA3_JSON.name
        self.text = ""
        self.pos = 0  # where reading stopped
        self.seg = 0  # where the content piece being read starts
        self.hold: int | None = None  # where content must stop (None: the end)
        self.pieces: list[str] = []  # the content pieces before calls
        self.calls: list[_Call] = []
        self.content_sent = ""
        self.state = "content"  # content | json | close | all-content | frozen | ...
        self.json: _Json | None = None
        self.closes: list[str] = []
        self.response: _Span | None = None  # generic: the "response" string being read
        self.response_taken = 0
        self.response_text = ""
        self._deltas: list[CallDelta] = []
        self._elements = 0  # calls created from an array's elements
        self._array = False  # mistral: the calls come as a JSON array
        self._search = 0  # where to look for the next call

    @property
    def committed(self) -> bool:
        return self.response is not None or any(c.announced for c in self.calls)

    # ---------------------------------------------------------------- driving
    def feed(self, piece: str) -> tuple[str, list[CallDelta]]:
        self.text += piece
        self._run(final=False)
        return self._content_delta(self._content()), self._take_deltas()

    def finish(self) -> StreamEnd:
        self._run(final=True)
        aliases: dict[str, str] = {}
        if not self.committed:
            # Nothing went out as a call: the reading of the finished output decides.
            parsed = Parsed(self.text, []) if self.strict else self.fmt.parse(self.text)
            content, calls = parsed.content, [
                ToolCall(c.name, c.arguments, c.id or self.fmt.mint_id()) for c in parsed.calls]
            deltas = [d for i, c in enumerate(calls) for d in (
                CallDelta(i, "", c.id, c.name), CallDelta(i, c.arguments))]
        else:
            content = self._content(final=True)
            deltas = self._take_deltas()
            calls = []
            for c in self.calls:
                if not c.announced:
                    continue
                calls.append(ToolCall(c.name, c.arguments, c.id))
                if c.model_id and c.model_id != c.id:
                    aliases[c.id] = c.model_id
        rest = self._content_delta(content)
        return StreamEnd(rest, [d for d in deltas if d.name or d.arguments], content, calls,
                         aliases)

    def _run(self, final: bool) -> None:
        if self.state in ("frozen", "all-content"):
            return
        try:
            self._advance(final)
            if final and self.state in ("json", "close", "head", "args"):
                self._incomplete()
        except _Malformed:
            self._break()

    def _break(self) -> None:
        # Before any call went out, a malformed call makes the whole output content (as
        # parse reads it); after, what went out stays.
        self.state = "frozen" if self.committed else "all-content"
        self.hold = None

    def _incomplete(self) -> None:
        """The output ended inside a call (cut by max_tokens)."""
        if self.json is not None:
            self._on_json()
        self._break()

    def _take_deltas(self) -> list[CallDelta]:
        out, self._deltas = self._deltas, []
        return out

    # ---------------------------------------------------------------- content
    def _content(self, final: bool = False) -> str:
        if self.state == "all-content":
            return self.text
        if self.response is not None:
            return self.response_text
        if self.state == "content":
            end = len(self.text) if final or self.hold is None else self.hold
            return _join_content([*self.pieces, self.text[self.seg:end]])
        return _join_content(self.pieces) if self.pieces else ""

    def _content_delta(self, content: str) -> str:
        if not content.startswith(self.content_sent):  # pragma: no cover - a bug if seen
            return ""
        out = content[len(self.content_sent):]
        self.content_sent = content
        return out

    # ---------------------------------------------------------------- calls
    def _open_json(self, pos: int, watch: Callable[[Path], bool]) -> None:
        self.json = _Json(watch)
        self.pos = pos
        self.state = "json"

    def _open_arguments(self) -> bool:
        """A named call's arguments object, once its first character is in (False: not
        yet)."""
        start = _skip_ws(self.text, self.pos)
        if start == len(self.text):
            return False
        self._open_json(start, lambda path: path == ())
        return True

    def _feed_json(self) -> bool:
        """Reads on in the JSON; True once it is complete. What was read before a
        malformed part still goes out, so that the pieces the text came in change
        nothing."""
        assert self.json is not None
        try:
            self.pos = self.json.feed(self.text, self.pos)
        except _Malformed:
            with contextlib.suppress(_Malformed):
                self._on_json()
            raise
        self._on_json()
        return self.json.done

    def _on_json(self) -> None:
        """After JSON was read: the calls it holds."""
        self._update_calls()

    def _update_calls(self) -> None:
        assert self.json is not None
        spans = self.json.spans
        for call in self.calls:
            if call.done:
                continue
            obj = spans.get(call.path) if call.path is not None else None
            if call.path is not None and obj is None:
                continue
            if obj is not None and obj.kind != "{":
                raise _Malformed("a call is not an object")
            if not call.announced:
                if not call.name and call.path is not None:  # bare arguments come named
                    name = spans.get((*call.path, "name"))
                    if name is None or not name.closed:
                        if obj is not None and obj.closed:
                            raise _Malformed("a call has no name")
                        continue
                    value = name.value()
                    if not isinstance(value, str) or not value:
                        raise _Malformed("a call has no name")
                    call.name = value
                    # The model's id goes out if it was written before the name; one
                    # written later is too late for the first delta (the text decides,
                    # not how it was cut into pieces).
                    given = spans.get((*call.path, "id"))
                    if given is not None and given.closed and given.order < name.order \
                            and isinstance(given.value(), str):
                        call.model_id = given.value()
                if self.strict and call.path is not None and not any(
                        p in spans for p in call.args_paths):
                    if obj is not None and obj.closed:
                        raise _Malformed("no arguments: not a call")
                    continue
                self._announce(call)
            if call.args_span is None:
                call.args_span = next((spans[p] for p in call.args_paths if p in spans), None)
            span = call.args_span
            if span is not None and span.kind == "{":
                piece = "".join(span.parts[call.taken:])
                call.taken = len(span.parts)
                self._send_args(call, piece)
            elif span is not None and span.closed and not call.arguments:
                self._send_args(call, _arguments(span.value()))  # a string holding JSON
            if obj is not None and obj.closed or call.path is None and span is not None \
                    and span.closed:
                if span is None:
                    self._send_args(call, "{}")
                if call.path is not None:
                    given = spans.get((*call.path, "id"))
                    if given is not None and isinstance(given.value(), str):
                        call.model_id = given.value()
                call.done = True

    def _send_args(self, call: _Call, piece: str) -> None:
        if piece:
            call.arguments += piece
            self._deltas.append(CallDelta(call.index, piece))

    def _new_call(self, path: Path | None, args_keys: Sequence[str], name: str = "") -> _Call:
        args_paths = [(*path, k) for k in args_keys] if path is not None else [()]
        call = _Call(len(self.calls), path, name, "", args_paths)
        self.calls.append(call)
        return call

    def _announce(self, call: _Call) -> None:
        call.id = call.model_id or self.fmt.mint_id()
        call.announced = True
        self._deltas.append(CallDelta(call.index, "", call.id, call.name))

    def _advance(self, final: bool) -> None:
        raise NotImplementedError


def _call_watch(prefix_len: int) -> Callable[[Path], bool]:
    """Watch call objects at depth ``prefix_len`` and their members."""
    def watch(path: Path) -> bool:
        return len(path) in (prefix_len, prefix_len + 1)
    return watch


class _HermesStream(CallStream):
    def _advance(self, final: bool) -> None:
        fmt = self.fmt
        assert isinstance(fmt, HermesFormat)
        while True:
            if self.state == "content":
                floor = _after_think(self.text) if not self.calls else self._search
                if floor < 0:
                    self.hold = None  # inside a leading think block: content
                    return
                search = max(floor, self._search)
                found = fmt._find(self.text, search, partial=not final)
                if found is None or found[1] is None:
                    at = len(self.text) if found is None else found[0]
                    self.hold = _hold_from(self.text, max(search, self.seg), at)
                    return
                at, opener, end, name = found
                assert opener is not None
                self.pieces.append(self.text[self.seg:at])
                self.hold = None
                if opener.named:
                    self._announce(self._new_call(None, (), name))
                    self.pos, self.state = end, "args"
                else:
                    self._new_call((), ("arguments", "parameters"))
                    self._open_json(self.text.rfind("{", at, end), _call_watch(0))
                self.closes = list(opener.closes)
            elif self.state == "args":  # <function=NAME>: the arguments object follows
                if not self._open_arguments():
                    return
            elif self.state == "json":
                if not self._feed_json():
                    return
                self.state = "close"
            elif self.state == "close":
                while self.closes:
                    at = _skip_ws(self.text, self.pos)
                    close = self.closes[0]
                    if self.text.startswith(close, at):
                        self.pos = at + len(close)
                        self.closes.pop(0)
                    elif close.startswith(self.text[at:]):
                        if not final:
                            return
                        self.pos = len(self.text)  # stopped before or inside the close tag
                        self.closes = []
                    else:
                        raise _Malformed(f"no {close} after a call")
                self.seg = self._search = self.pos
                self.state = "content"
            else:  # pragma: no cover
                return


class _Llama3Stream(CallStream):
    def _advance(self, final: bool) -> None:
        while True:
            if self.state == "content":  # where a call may start
                start = _skip_ws(self.text, self.pos)
                rest = self.text[start:]
                at = start
                if rest.startswith(_PYTHON_TAG):
                    at = _skip_ws(self.text, start + len(_PYTHON_TAG))
                    rest = self.text[at:]
                    if not rest and not final:
                        return
                elif rest and _PYTHON_TAG.startswith(rest) and not final:
                    return
                if not rest:
                    return
                if rest[0] != "{":
                    if not self.calls:
                        self.state = "all-content"
                        return
                    self.seg, self.state = start, "tail"
                    return
                self._new_call((), ("parameters", "arguments"))
                self._open_json(at, _call_watch(0))
            elif self.state == "json":
                if not self._feed_json():
                    return
                at = _skip_ws(self.text, self.pos)
                if at == len(self.text) and not final:
                    return
                if self.text.startswith(";", at):
                    at += 1
                self.pos, self.state = at, "content"
            else:
                return

    def _content(self, final: bool = False) -> str:
        # Calls come first or not at all: before them nothing is content yet; after
        # them, what is not a call.
        if self.state == "tail":
            return self.text[self.seg:].strip()
        return self.text if self.state == "all-content" else ""


class _MistralStream(CallStream):
    def _advance(self, final: bool) -> None:
        while True:
            if self.state == "content":
                at = self.text.find(_TOOL_CALLS, self._search)
                if at < 0:
                    cut = len(self.text) if final else _partial_tail(self.text, _TOOL_CALLS)
                    self.hold = _hold_from(self.text, self.seg, cut)
                    return
                self.pieces.append(self.text[self.seg:at])
                self.hold = None
                self.pos, self.state = at + len(_TOOL_CALLS), "head"
            elif self.state == "head":
                start = _skip_ws(self.text, self.pos)
                if start == len(self.text):
                    return
                self._array = self.text[start] == "["
                if self.text[start] == "{":
                    self._new_call((), ("arguments",))
                    self._open_json(start, _call_watch(0))
                elif self._array:
                    self._elements = 0
                    self._open_json(start, _call_watch(1))
                else:
                    head = _NEW_MISTRAL_HEAD.match(self.text, self.pos)
                    if head is None:
                        return  # it may still come; finish() treats it as malformed
                    call = self._new_call(None, (), head.group(1))
                    call.model_id = head.group(2) or ""
                    self._announce(call)
                    self.pos, self.state = head.end(), "args"
            elif self.state == "args":  # NAME[ARGS]: the arguments object follows
                if not self._open_arguments():
                    return
            elif self.state == "json":
                if not self._feed_json():
                    return
                if self._array and not self._elements:
                    raise _Malformed("an empty call list")
                self.seg = self._search = self.pos
                self.state = "content"
            else:
                return

    def _on_json(self) -> None:
        assert self.json is not None
        if self._array:
            while (self._elements,) in self.json.spans:
                self._new_call((self._elements,), ("arguments",))
                self._elements += 1
        self._update_calls()


class _GenericStream(CallStream):
    def _advance(self, final: bool) -> None:
        if self.state == "content":
            start = _skip_ws(self.text, 0)
            if start == len(self.text):
                self.hold = 0 if not final else None
                return
            if self.text[start] != "{":
                self.state = "all-content"
                return
            self.hold = 0

            def watch(path: Path) -> bool:
                if not path or path[0] not in ("tool_call", "tool_calls", "response"):
                    return False
                return len(path) <= (2 if path[0] == "tool_call" else 3) and (
                    path[0] != "response" or len(path) == 1)

            self._open_json(start, watch)
        if self.state == "json":
            assert self.json is not None
            if not self._feed_json():
                return
            if _skip_ws(self.text, self.pos) != len(self.text):
                raise _Malformed("not one JSON object")
            if not self.committed and not final:
                return  # parse decides at the end (no calls, or a non-string response)
            self.state = "done"

    def _on_json(self) -> None:
        assert self.json is not None
        spans = self.json.spans
        listed = spans.get(("tool_calls",))
        if listed is not None and listed.kind != "[":
            raise _Malformed("tool_calls is not a list")
        if ("tool_call",) in spans and not self.calls:
            self._new_call(("tool_call",), ("arguments",))
        while ("tool_calls", self._elements) in spans:
            self._new_call(("tool_calls", self._elements), ("arguments",))
            self._elements += 1
        self._update_calls()
        response = spans.get(("response",))
        if response is not None and response.kind == '"' and not self.calls:
            # a string answer: content, decoded as it is written
            self.response = response
            for part in response.parts[self.response_taken:]:
                self.response_text += _DECODER.decode(f'"{part}"') if part != '"' else ""
            self.response_taken = len(response.parts)

    def _content(self, final: bool = False) -> str:
        if self.state == "all-content" or self.response is not None:
            return super()._content(final)
        return ""


_STREAMS: dict[str, type[CallStream]] = {
    "hermes": _HermesStream, "llama3_json": _Llama3Stream, "mistral": _MistralStream,
    "generic": _GenericStream,
}


def call_stream(fmt: ToolFormat, *, strict: bool = False) -> CallStream:
    """A reader of one output of ``fmt`` as it is generated (``CallStream``)."""
    return _STREAMS[fmt.name](fmt, strict=strict)
