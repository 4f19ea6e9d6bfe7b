"""The generic format (templates without tool support): GenericFormat and GenericStream.

The whole output is one JSON object, ``{"tool_call": {...}}``, ``{"tool_calls": [...]}`` or
``{"response": "TEXT"}``; the model is told so by ``system_prompt`` and held to it by the
grammar of ``json_schema`` (llama.cpp's ``common_chat_params_init_generic``). Read as
``common_chat_parse_generic`` reads it: ``tool_calls`` is looked at first, then
``tool_call``, then ``response`` (a non-string response is dumped as JSON, indent 2);
anything else is content.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from .base import (
    DECODER,
    Malformed,
    Parsed,
    ToolCall,
    ToolFormat,
    arguments_value,
    call_from_object,
    decode_at,
    skip_ws,
    tool_functions,
)
from .json_reader import Path, Span
from .stream import CallStream


class GenericFormat(ToolFormat):
    """The generic format's parser and prompt (module docstring)."""

    name = "generic"

    def parse(self, text: str, tool_names: Collection[str] | None = None) -> Parsed:
        start = skip_ws(text, 0)
        if not text.startswith("{", start):
            return Parsed(text, [])
        try:
            obj, end = decode_at(text, start)
            if skip_ws(text, end) != len(text) or not isinstance(obj, dict):
                raise Malformed("not one JSON object")
            # The order of llama.cpp's common_chat_parse_generic.
            if "tool_calls" in obj:
                if not isinstance(obj["tool_calls"], list):
                    raise Malformed("tool_calls is not a list")
                items = obj["tool_calls"]
                return Parsed("", [call_from_object(item, ("arguments",)) for item in items])
            if "tool_call" in obj:
                return Parsed("", [call_from_object(obj["tool_call"], ("arguments",))])
            if "response" in obj:
                response = obj["response"]
                if not isinstance(response, str):
                    response = json.dumps(response, indent=2, ensure_ascii=False)
                return Parsed(response, [])
        except Malformed:
            pass
        return Parsed(text, [])

    def render(self, calls: Sequence[ToolCall], content: str = "") -> str:
        # What the grammar lets the model write: the calls, or else the response.
        if not calls:
            return json.dumps({"response": content}, ensure_ascii=False)
        items = []
        for c in calls:
            item: dict[str, Any] = {"name": c.name, "arguments": arguments_value(c.arguments)}
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

    def claims(self, chat_template: str) -> bool:
        return True  # any template: the fallback, asked last

    def json_schema(
        self, tools: Sequence[Mapping[str, Any]], *, required: bool, parallel: bool,
        response: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The schema of the whole output: the call(s) shape, or else (unless ``required``)
        ``{"response": str}``, or ``{"response": <response>}`` with a response format's
        schema; as llama.cpp's common_chat_params_init_generic, without the ids it demands
        for parallel calls (call ids are minted by the server)."""
        functions = tool_functions(tools)
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
            for fn in tool_functions(tools)
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


GENERIC = GenericFormat()


class GenericStream(CallStream):
    """A generic output read as it is generated: one JSON object, whose calls go out as
    they are written, and whose string ``response`` goes out as content."""

    def __init__(self, fmt: ToolFormat, *, strict: bool = False) -> None:
        super().__init__(fmt, strict=strict)
        self._elements = 0  # calls created from tool_calls' elements
        self.response: Span | None = None  # the "response" string being read
        self.response_taken = 0  # its parts decoded into response_text
        self.response_text = ""

    @property
    def committed(self) -> bool:
        return self.response is not None or super().committed

    def _advance(self, final: bool) -> None:
        if self.state == "content":
            start = skip_ws(self.text, 0)
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
            if skip_ws(self.text, self.pos) != len(self.text):
                raise Malformed("not one JSON object")
            if not self.committed and not final:
                return  # parse decides at the end (no calls, or a non-string response)
            self.state = "done"

    def _on_json(self) -> None:
        assert self.json is not None
        spans = self.json.spans
        listed = spans.get(("tool_calls",))
        if listed is not None and listed.kind != "[":
            raise Malformed("tool_calls is not a list")
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
                self.response_text += DECODER.decode(f'"{part}"') if part != '"' else ""
            self.response_taken = len(response.parts)

    def _content(self, final: bool = False) -> str:
        # The object is the answer: its string response, or all of it if it is not one.
        if self.state == "all-content":
            return super()._content(final)
        return self.response_text if self.response is not None else ""
