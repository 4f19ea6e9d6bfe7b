"""The llama3_json format (Llama 3.1-3.3): Llama3JsonFormat and Llama3JsonStream.

The output is ``{"name": ..., "parameters": {...}}`` (``"arguments"`` accepted too), after an
optional ``<|python_tag|>``; several calls separated by ``;`` or newlines. Anything else is
content. llama.cpp's ``common_chat_parse_llama_3_1`` (through ``parse_json_tool_calls``)
reads one call and leaves the rest as content; this reads several, on purpose.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import ClassVar

from .base import (
    Malformed,
    Parsed,
    ToolCall,
    ToolFormat,
    arguments_value,
    call_from_object,
    decode_at,
    skip_ws,
)
from .stream import CallStream, call_watch

_PYTHON_TAG = "<|python_tag|>"


class Llama3JsonFormat(ToolFormat):
    """The llama3_json format's parser (module docstring)."""

    name = "llama3_json"
    args_key = "parameters"

    def parse(self, text: str, tool_names: Collection[str] | None = None) -> Parsed:
        calls: list[ToolCall] = []
        pos = skip_ws(text, 0)
        try:
            while True:
                start = pos
                if text.startswith(_PYTHON_TAG, pos):
                    pos = skip_ws(text, pos + len(_PYTHON_TAG))
                if not text.startswith("{", pos):
                    pos = start
                    break
                obj, pos = decode_at(text, pos)
                calls.append(call_from_object(obj, ("parameters", "arguments")))
                pos = skip_ws(text, pos)
                if text.startswith(";", pos):
                    pos = skip_ws(text, pos + 1)
        except Malformed:
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
            json.dumps({"name": c.name, "parameters": arguments_value(c.arguments)},
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

    def claims(self, chat_template: str) -> bool:
        t = chat_template
        return "<|start_header_id|>" in t and (
            "ipython" in t or _PYTHON_TAG in t or '"parameters"' in t
        )


LLAMA3_JSON = Llama3JsonFormat()


class Llama3JsonStream(CallStream):
    """A llama3_json output read as it is generated: calls first (each an optional python
    tag and a JSON object), then, after them, content."""

    calls_look_like_answers: ClassVar[bool] = True

    def _advance(self, final: bool) -> None:
        while True:
            if self.state == "content":  # where a call may start
                start = skip_ws(self.text, self.pos)
                rest = self.text[start:]
                at = start
                if rest.startswith(_PYTHON_TAG):
                    at = skip_ws(self.text, start + len(_PYTHON_TAG))
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
                self._open_json(at, call_watch(0))
            elif self.state == "json":
                if not self._feed_json():
                    return
                at = skip_ws(self.text, self.pos)
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
