"""What every tool-call format shares: ToolCall and Parsed, the JSON helpers, ToolFormat.

The JSON helpers are what the parsers read and write calls with; ``ToolFormat`` is the class
each format subclasses.

The helpers keep two rules of the package (``__init__``): a call of the wrong shape is
``Malformed`` (the caller falls back to the whole text as content), and whitespace between
content and a call is dropped, so content is held back up to it while streaming.
"""

from __future__ import annotations

import json
import secrets
import string
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text of an object; canonical: json.dumps(obj, ensure_ascii=False)
    id: str = ""  # "" when the model wrote none


@dataclass(frozen=True)
class Parsed:
    content: str  # the text that is not part of a call, markers removed; "" if none
    calls: list[ToolCall]


class Malformed(Exception):
    """A call began but is not one: the caller returns the whole text as content."""


def _no_constant(name: str) -> Any:
    # NaN/Infinity would be written back as non-JSON into function.arguments.
    raise ValueError(f"{name} is not JSON")


DECODER = json.JSONDecoder(parse_constant=_no_constant)
ID_ALPHABET = string.ascii_letters + string.digits


def call_id() -> str:
    """A fresh OpenAI-style tool call id."""
    return "call_" + "".join(secrets.choice(ID_ALPHABET) for _ in range(24))


def skip_ws(text: str, pos: int) -> int:
    """The first position at or after ``pos`` that is not whitespace (len(text) if none)."""
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def decode_at(text: str, pos: int) -> tuple[Any, int]:
    """The JSON value that starts at ``pos``, and where it ends.

    Raises:
        Malformed: the text there is not JSON (or holds a NaN or Infinity).
    """
    try:
        return DECODER.raw_decode(text, pos)
    except ValueError as exc:  # JSONDecodeError, or a NaN
        raise Malformed(str(exc)) from exc


def canonical_arguments(value: Any) -> str:
    """The canonical JSON text of a call's arguments: an object, or a string holding one
    (some models quote it); missing or empty means no arguments.

    Raises:
        Malformed: the arguments are not an object (nor a string holding one).
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        value = {}
    elif isinstance(value, str):
        try:
            value = DECODER.decode(value.strip())
        except ValueError as exc:
            raise Malformed("arguments are not JSON") from exc
    if not isinstance(value, dict):
        raise Malformed("arguments are not an object")
    return json.dumps(value, ensure_ascii=False)


def call_from_object(obj: Any, args_keys: Sequence[str]) -> ToolCall:
    """A ToolCall from a decoded ``{"name": ..., <args key>: ..., "id": ...}`` object; the
    first of ``args_keys`` present holds the arguments.

    Raises:
        Malformed: not an object, no name, or arguments that are not an object.
    """
    if not isinstance(obj, dict):
        raise Malformed("a call is not an object")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise Malformed("a call has no name")
    args = next((obj[key] for key in args_keys if key in obj), None)
    cid = obj.get("id")
    return ToolCall(name, canonical_arguments(args), cid if isinstance(cid, str) else "")


def arguments_value(arguments: str) -> Any:
    """A call's arguments as a JSON value to write back; text that is not JSON (a client may
    send anything in its history) goes in as a string rather than failing the request."""
    if not arguments.strip():
        return {}
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def hold_from(text: str, floor: int, at: int) -> int | None:
    """Where to stop releasing content, given the earliest place a call may start (``at``,
    len(text) if none): whitespace before it (down to ``floor``) is held too, since it is
    dropped when a call follows. None: release all of it."""
    while at > floor and text[at - 1].isspace():
        at -= 1
    return None if at == len(text) else at


def partial_tail(text: str, marker: str) -> int:
    """Where a proper prefix of ``marker`` ends the text (it may become the marker), else
    len(text)."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return len(text) - k
    return len(text)


def around_calls(text: str, pieces: list[str], pos: int, calls: list[ToolCall]) -> Parsed:
    """The parse of ``text``: the content ``pieces`` around the calls (and the rest after
    ``pos``), or all of it as content when no call was found."""
    if not calls:
        return Parsed(text, [])
    pieces.append(text[pos:])
    return Parsed(join_content(pieces), calls)


def join_content(pieces: Sequence[str]) -> str:
    """The content around calls. The first piece keeps its start (it may have been streamed
    already); whitespace next to calls goes."""
    parts = [pieces[0].rstrip(), *(piece.strip() for piece in pieces[1:])]
    return "\n".join(part for part in parts if part)


def tool_functions(tools: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The function objects of OpenAI ``tools`` entries (bare function objects accepted).

    Raises:
        ValueError: a tool without a function name.
    """
    functions = []
    for tool in tools:
        fn = tool.get("function", tool)
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ValueError(f"a tool without a function name: {tool!r}")
        functions.append(fn)
    return functions


def parameters_schema(fn: Mapping[str, Any]) -> dict[str, Any]:
    """A function's parameters schema; none (or an empty one) is any object."""
    params = fn.get("parameters")
    return dict(params) if isinstance(params, Mapping) and params else {"type": "object"}


class ToolFormat:
    """How one model family writes tool calls. Subclasses set the class attributes and
    implement parse, render, call_start and claims; the registry pairs each with the
    ``CallStream`` subclass that reads it while it is generated."""

    name: str = ""
    prefix: str = ""  # the literal text before one call's JSON object
    suffix: str = ""  # and after it
    args_key: str = "arguments"  # the key holding the arguments in the call object

    def parse(self, text: str, tool_names: Collection[str] | None = None) -> Parsed:
        """The calls in a finished output and the content around them. ``tool_names`` is
        accepted for the caller's convenience; calls to other names are kept, as
        llama.cpp keeps them (the package's docstring)."""
        raise NotImplementedError

    def render(self, calls: Sequence[ToolCall], content: str = "") -> str:
        """The text the model writes for these calls (and content, where the format has
        room for it)."""
        raise NotImplementedError

    def call_start(self, text: str) -> int | None:
        """In a partial output: the index from which text must be held back because a call
        may have begun there (or the whitespace before one); None if all of it is content."""
        raise NotImplementedError

    def claims(self, chat_template: str) -> bool:
        """Whether a GGUF's Jinja chat template is this family's (llama.cpp's test for it);
        ``detect_format`` asks the registered formats in turn."""
        return False

    def mint_id(self) -> str:
        """An id for a call the model wrote none for (or writes after its arguments)."""
        return call_id()

    def _call_schema(self, fn: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {"name": {"const": fn["name"]}, self.args_key: parameters_schema(fn)},
            "required": ["name", self.args_key],
            "additionalProperties": False,
        }

    def json_schema(
        self, tools: Sequence[Mapping[str, Any]], *, required: bool, parallel: bool
    ) -> dict[str, Any]:
        """The JSON schema of ONE call object, any of the tools. ``required`` and
        ``parallel`` belong to the text around calls (prefix, suffix, repetition), which the
        grammar's builder writes; they change nothing here.

        Raises:
            ValueError: no tools, or a tool without a function name.
        """
        branches = [self._call_schema(fn) for fn in tool_functions(tools)]
        if not branches:
            raise ValueError("no tools")
        return branches[0] if len(branches) == 1 else {"anyOf": branches}

    def __repr__(self) -> str:
        return f"<ToolFormat {self.name}>"
