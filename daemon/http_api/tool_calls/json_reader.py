"""The incremental JSON reader of the call streams: JsonReader, and the Spans it fills.

``JsonReader`` reads one JSON value as it is generated and re-serialises the values it
watches canonically, each into a ``Span``.

Canonical is what ``parse`` writes: ``json.dumps(value, ensure_ascii=False)``. The reader
writes it one character at a time as far as it is certain (a number goes out when it ends,
a string as it is written), so that whatever pieces the text comes in, the spans end the
same as the whole value dumped at once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from .base import DECODER, Malformed

Path = tuple[str | int, ...]  # keys and indexes from the value read down to one inside it
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


class Span:
    """The canonical text of one watched value, as far as it is known."""

    __slots__ = ("closed", "kind", "order", "parts")

    def __init__(self, kind: str) -> None:
        self.kind = kind  # its first character: '{', '[', '"', a digit or '-', or a letter
        self.parts: list[str] = []
        self.closed = False
        self.order = 0  # closed as the order-th watched value

    def text(self) -> str:
        """The canonical text read so far."""
        return "".join(self.parts)

    def value(self) -> Any:
        """The value read (of a closed span: an open one is not JSON yet)."""
        return DECODER.decode(self.text())


class _Frame:
    """An object or array being read: where in it the reader is."""

    __slots__ = ("count", "key", "kind", "path", "state")

    def __init__(self, kind: str, path: Path) -> None:
        self.kind, self.path = kind, path
        self.state = "first"  # first | key | colon | value | in | next
        self.count = 0  # array: the index of the element being read
        self.key = ""  # object: the key whose value is read


class JsonReader:
    """One JSON value read incrementally: ``feed(text, pos)`` reads what it can of the text
    (the whole output so far; it always starts where it stopped) and returns where it
    stopped; ``done`` once the value is complete. The values whose path ``watch`` accepts
    get a ``Span`` in ``spans``. Raises Malformed where the text stops being JSON (as
    Python's json module reads it: no NaN, no control characters in strings)."""

    def __init__(self, watch: Callable[[Path], bool]) -> None:
        self.watch = watch
        self.spans: dict[Path, Span] = {}
        self.done = False
        self._open: list[tuple[Path, Span]] = []  # watched values being read
        self._stack: list[_Frame] = []
        self._string: Path | None = None  # the path of the string being read
        self._closed = 0

    def _emit(self, text: str) -> None:
        for _, span in self._open:
            span.parts.append(text)

    def _start(self, path: Path, first: str) -> None:
        if self.watch(path):
            span = Span(first)
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
        """Reads on from ``pos`` (where the last call stopped) in ``text`` (the whole output
        so far) and returns where it stopped: the end of the value, or of what can be read.

        Raises:
            Malformed: the text stopped being JSON.
        """
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
                    raise Malformed("',' out of place")
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
                raise Malformed(f"unexpected {c!r} in an array")
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
                key = DECODER.decode(m.group())
            except ValueError as exc:
                raise Malformed(str(exc)) from exc
            if not isinstance(key, str):  # pragma: no cover - a JSON string decodes to str
                raise Malformed("a key is not a string")
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
        raise Malformed(f"unexpected {c!r} in an object")

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
            raise Malformed(f"unexpected {c!r} where a value starts")
        if run.end() == len(text):
            return pos
        token = run.group()
        if token in _LITERALS:
            canonical = token
        elif _NUMBER.fullmatch(token):
            canonical = json.dumps(DECODER.decode(token))
        else:
            raise Malformed(f"{token!r} is not a JSON value")
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
                raise Malformed("a control character in a string")
            if pos + 1 >= n:
                return pos
            e = text[pos + 1]
            if e in _SIMPLE_ESCAPES:
                self._emit(_dump_chars(_SIMPLE_ESCAPES[e]))
                pos += 2
                continue
            if e != "u":
                raise Malformed(f"invalid escape \\{e}")
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
            raise Malformed("invalid \\u escape")
        return int(digits, 16)
