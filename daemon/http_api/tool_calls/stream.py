"""The base of the call streams: CallStream, and what it hands out (CallDelta, StreamEnd).

``CallStream`` reads one output as it is generated and says, after every piece, what may go
out (content, ``CallDelta``s); ``finish`` gives ``StreamEnd``.

Content goes out only up to where a call may begin (as the format's ``call_start``); a call
goes out as deltas: its id and name once its name is read, then its arguments as they are
written. The arguments streamed are the canonical text ``parse`` gives (json.dumps with
ensure_ascii=False) as far as it is certain: ``JsonReader`` re-serialises the model's JSON
one character at a time. Whatever the pieces, the result is the same as reading the whole
output at once. Each format's module subclasses ``CallStream`` with its ``_advance``: the
steps that read that format's markers and open the JSON of its calls.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from .base import (
    Malformed,
    Parsed,
    ToolCall,
    ToolFormat,
    canonical_arguments,
    join_content,
    skip_ws,
)
from .json_reader import JsonReader, Path, Span


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
        self.args_span: Span | None = None
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
    ``response_format``, the answer may be an object with a "name").

    A subclass implements ``_advance`` (reading on from ``pos`` through the states of its
    format) and may extend ``_on_json`` (the calls in the JSON read) and ``_content``."""

    # Only a format whose calls are bare JSON objects can take an answer for a call (the
    # others have their markers): strict applies to it alone.
    calls_look_like_answers: ClassVar[bool] = False

    def __init__(self, fmt: ToolFormat, *, strict: bool = False) -> None:
        self.fmt = fmt
        self.strict = strict and self.calls_look_like_answers
        self.text = ""
        self.pos = 0  # where reading stopped
        self.seg = 0  # where the content piece being read starts
        self.hold: int | None = None  # where content must stop (None: the end)
        self.pieces: list[str] = []  # the content pieces before calls
        self.calls: list[_Call] = []
        self.content_sent = ""
        self.state = "content"  # content | json | close | all-content | frozen | ...
        self.json: JsonReader | None = None
        self._deltas: list[CallDelta] = []

    @property
    def committed(self) -> bool:
        """Whether something went out that cannot be taken back (a call, so far)."""
        return any(c.announced for c in self.calls)

    # ---------------------------------------------------------------- driving
    def feed(self, piece: str) -> tuple[str, list[CallDelta]]:
        """Reads the next piece of the output: the content and call deltas that may go out
        now (the content is what follows what went out before)."""
        self.text += piece
        self._run(final=False)
        return self._content_delta(self._content()), self._take_deltas()

    def finish(self) -> StreamEnd:
        """The output ended: what is left to send, and the reply as a whole."""
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
        except Malformed:
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
        """The content known so far (``final``: the output is finished)."""
        if self.state == "all-content":
            return self.text
        if self.state == "content":
            end = len(self.text) if final or self.hold is None else self.hold
            return join_content([*self.pieces, self.text[self.seg:end]])
        return join_content(self.pieces) if self.pieces else ""

    def _content_delta(self, content: str) -> str:
        if not content.startswith(self.content_sent):  # pragma: no cover - a bug if seen
            return ""
        out = content[len(self.content_sent):]
        self.content_sent = content
        return out

    # ---------------------------------------------------------------- calls
    def _open_json(self, pos: int, watch: Callable[[Path], bool]) -> None:
        self.json = JsonReader(watch)
        self.pos = pos
        self.state = "json"

    def _open_arguments(self) -> bool:
        """A named call's arguments object, once its first character is in (False: not
        yet)."""
        start = skip_ws(self.text, self.pos)
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
        except Malformed:
            with contextlib.suppress(Malformed):
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
                raise Malformed("a call is not an object")
            if not call.announced:
                if not call.name and call.path is not None:  # bare arguments come named
                    name = spans.get((*call.path, "name"))
                    if name is None or not name.closed:
                        if obj is not None and obj.closed:
                            raise Malformed("a call has no name")
                        continue
                    value = name.value()
                    if not isinstance(value, str) or not value:
                        raise Malformed("a call has no name")
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
                        raise Malformed("no arguments: not a call")
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
                self._send_args(call, canonical_arguments(span.value()))  # a string holding JSON
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
        """Reads on as far as the text allows (``final``: no more will come); raises
        Malformed where the output stops being what the format writes."""
        raise NotImplementedError


def call_watch(prefix_len: int) -> Callable[[Path], bool]:
    """A watch (``JsonReader``) for the call objects at depth ``prefix_len`` and their members."""
    def watch(path: Path) -> bool:
        return len(path) in (prefix_len, prefix_len + 1)
    return watch
