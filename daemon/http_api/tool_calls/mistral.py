"""The mistral format (templates with ``[TOOL_CALLS]``): MistralFormat and MistralStream.

``[TOOL_CALLS][{"name", "arguments", "id"}, ...]``, or the newer ``[TOOL_CALLS]NAME[ARGS]{...}``
(``[CALL_ID]ID`` allowed before ``[ARGS]``), after optional content; as llama.cpp's
``common_chat_parse_mistral_nemo`` (through ``parse_prefixed_json_tool_call_array``) reads
it, except that text after a call array is content here (llama.cpp fails the request:
``common_chat_msg_parser::finish``).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from .base import (
    ID_ALPHABET,
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

_TOOL_CALLS = "[TOOL_CALLS]"
# [TOOL_CALLS]NAME[ARGS]{...}, with [CALL_ID]ID before [ARGS] in some releases.
_NEW_MISTRAL_HEAD = re.compile(r"\s*([^\s\[\]{}\"]+)\s*(?:\[CALL_ID\]\s*([^\s\[\]]+)\s*)?\[ARGS\]")


class MistralFormat(ToolFormat):
    """The mistral format's parser (module docstring)."""

    name = "mistral"
    prefix = _TOOL_CALLS + "["
    suffix = "]"

    def mint_id(self) -> str:
        # Mistral's templates take 9 alphanumerics and nothing else back in the history.
        return "".join(secrets.choice(ID_ALPHABET) for _ in range(9))

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
        start = skip_ws(text, pos)
        if text.startswith(("[", "{"), start):
            value, end = decode_at(text, start)
            items = value if isinstance(value, list) else [value]
            if not items:
                raise Malformed("an empty call list")
            return [call_from_object(item, ("arguments",)) for item in items], end
        head = _NEW_MISTRAL_HEAD.match(text, pos)
        if head is None:
            raise Malformed("no call after [TOOL_CALLS]")
        args, end = decode_at(text, skip_ws(text, head.end()))
        return [ToolCall(head.group(1), canonical_arguments(args), head.group(2) or "")], end

    def parse(self, text: str, tool_names: Collection[str] | None = None) -> Parsed:
        pieces: list[str] = []
        calls: list[ToolCall] = []
        pos = 0
        try:
            while (at := text.find(_TOOL_CALLS, pos)) >= 0:
                pieces.append(text[pos:at])
                block, pos = self._read_block(text, at + len(_TOOL_CALLS))
                calls.extend(block)
        except Malformed:
            return Parsed(text, [])
        return around_calls(text, pieces, pos, calls)

    def render(self, calls: Sequence[ToolCall], content: str = "") -> str:
        if not calls:
            return content
        items = []
        for c in calls:
            item: dict[str, Any] = {"name": c.name, "arguments": arguments_value(c.arguments)}
            if c.id:
                item["id"] = c.id
            items.append(json.dumps(item, ensure_ascii=False))
        return content + self.prefix + ", ".join(items) + self.suffix

    def call_start(self, text: str) -> int | None:
        at = text.find(_TOOL_CALLS)
        return hold_from(text, 0, partial_tail(text, _TOOL_CALLS) if at < 0 else at)

    def claims(self, chat_template: str) -> bool:
        return _TOOL_CALLS in chat_template


MISTRAL = MistralFormat()


class MistralStream(CallStream):
    """A mistral output read as it is generated: content, then after each ``[TOOL_CALLS]``
    a call array, one call object, or a named call's head and its arguments."""

    def __init__(self, fmt: ToolFormat, *, strict: bool = False) -> None:
        super().__init__(fmt, strict=strict)
        self._array = False  # the calls after the marker come as a JSON array
        self._elements = 0  # calls created from the array's elements
        self._search = 0  # where to look for the next marker

    def _advance(self, final: bool) -> None:
        while True:
            if self.state == "content":
                at = self.text.find(_TOOL_CALLS, self._search)
                if at < 0:
                    cut = len(self.text) if final else partial_tail(self.text, _TOOL_CALLS)
                    self.hold = hold_from(self.text, self.seg, cut)
                    return
                self.pieces.append(self.text[self.seg:at])
                self.hold = None
                self.pos, self.state = at + len(_TOOL_CALLS), "head"
            elif self.state == "head":
                start = skip_ws(self.text, self.pos)
                if start == len(self.text):
                    return
                self._array = self.text[start] == "["
                if self.text[start] == "{":
                    self._new_call((), ("arguments",))
                    self._open_json(start, call_watch(0))
                elif self._array:
                    self._elements = 0
                    self._open_json(start, call_watch(1))
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
                    raise Malformed("an empty call list")
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
