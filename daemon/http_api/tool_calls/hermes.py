"""The hermes format (Qwen 2.5 / 3, Hermes 2 Pro): HermesFormat and HermesStream.

In templates with ``<tool_call>``: content, then
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` per call. As llama.cpp
does it (``common_chat_parse_hermes_2_pro``) this also reads the wrappers models write by
mistake (``<function_call>``, ``<tools>``, ``<tool>``, ``<response>``, ``<json>``,
``<JSON>``, ``<xml>``, each optionally inside a Markdown code fence, plain or marked json or
xml) when ``{"name"`` follows, and ``<function=NAME>{...}</function>`` /
``<function name="NAME">``. A leading ``<think>...</think>`` stays in the content and calls
are looked for after it only.

Where it parts from llama.cpp, on purpose: a missing closing tag at the very end of the
output is accepted (generation stopped on the call's last token; llama.cpp drops the call);
a bare ``{"name": ...}`` object with no tag is not a call (llama.cpp takes it, which turns
any JSON the model shows as content into a call, and would hold back every ``{`` while
streaming).
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from .base import (
    Malformed,
    Parsed,
    ToolCall,
    ToolFormat,
    arguments_value,
    around_calls,
    call_from_object,
    canonical_arguments,
    decode_at,
    hold_from,
    partial_tail,
    skip_ws,
)
from .stream import CallStream, call_watch


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
                pos = skip_ws(text, pos)
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
    lead = skip_ws(text, 0)
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
    """The hermes format's parser (module docstring)."""

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
            at = min(partial_tail(text, head) for head in self._openers)
            if pos <= at < len(text):
                return at, None, len(text), ""
        return None

    @staticmethod
    def _read_call(text: str, at: int, opener: _Opener, end: int, name: str) -> tuple[
        ToolCall, int
    ]:
        if opener.named:
            args, pos = decode_at(text, skip_ws(text, end))
            call = ToolCall(name, canonical_arguments(args))
        else:
            obj, pos = decode_at(text, text.rfind("{", at, end))
            call = call_from_object(obj, ("arguments", "parameters"))
        for close in opener.closes:
            pos = skip_ws(text, pos)
            if text.startswith(close, pos):
                pos += len(close)
            elif close.startswith(text[pos:]):
                return call, len(text)  # the output stopped before (or inside) the close tag
            else:
                raise Malformed(f"no {close} after a call")
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
        except Malformed:
            return Parsed(text, [])
        return around_calls(text, pieces, pos, calls)

    def render(self, calls: Sequence[ToolCall], content: str = "") -> str:
        # As the Qwen templates write an assistant turn: content, newline, one block a call.
        blocks = [
            self.prefix
            + json.dumps({"name": c.name, "arguments": arguments_value(c.arguments)},
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
        return hold_from(text, floor, len(text) if found is None else found[0])

    def claims(self, chat_template: str) -> bool:
        return "<tool_call>" in chat_template


HERMES = HermesFormat()


class HermesStream(CallStream):
    """A hermes output read as it is generated: content, then opener, call JSON (or a named
    call's arguments) and close tags, over again."""

    def __init__(self, fmt: ToolFormat, *, strict: bool = False) -> None:
        super().__init__(fmt, strict=strict)
        self.closes: list[str] = []  # the close tags still to read after a call's JSON
        self._search = 0  # where to look for the next call

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
                    self.hold = hold_from(self.text, max(search, self.seg), at)
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
                    self._open_json(self.text.rfind("{", at, end), call_watch(0))
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
                    at = skip_ws(self.text, self.pos)
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
                        raise Malformed(f"no {close} after a call")
                self.seg = self._search = self.pos
                self.state = "content"
            else:  # pragma: no cover
                return
