"""The OpenAI endpoint's answers: a generation handed from its worker thread to the
event loop, and the chunks as a JSON body or as server-sent events.

Interface: ``Run(generation, req, prompt, loop)`` (``start()`` the worker thread,
``await next()`` the next chunk, ``cancel()`` between two steps; a generation the
daemon's stop ended is ``stopping_error``, a 503); ``completion_body``
(the JSON of an answer that is not streamed); ``EventStream`` (the response of one that
is: ``sse_events``, its event stream); ``usage`` and ``draft_stats`` (what every answer
reports: OpenAI's ``usage``, and the ``suffixd`` object with the draft counts by source).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import AsyncGenerator, Callable, Iterator
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from ..generation.pipeline import Generation, GenerationRequest
from ..generation.step_batch import Stopping
from ..generation.verifier import Chunk
from .requests import ApiError, api_error
from .structured import ReplyShaper

log = logging.getLogger("suffixd.http")

# Logged once per request whose client hung up before its answer was complete, streamed
# or not (app._cancel_on_disconnect for an answer that is not streamed).
HUNG_UP = "client disconnected; generation cancelled"


def _merged(chunks: list[Chunk], last: Chunk) -> Chunk:
    """Several steps' chunks as one (the last one's finish reason and totals)."""
    return Chunk(
        text="".join(c.text for c in chunks) + last.text,
        tokens=[t for c in chunks for t in c.tokens] + last.tokens,
        source=last.source,
        proposed=sum(c.proposed for c in chunks) + last.proposed,
        accepted=sum(c.accepted for c in chunks) + last.accepted,
        finish_reason=last.finish_reason, stats=last.stats,
    )


def stopping_error(message: str = "the daemon is stopping") -> ApiError:
    """What a request the daemon's stop ended gets: a 503 (an answer not yet started, or
    one that is not streamed) or, streamed, a final error event; a client may retry it
    on another replica."""
    return ApiError(503, message, kind="unavailable_error", code="daemon_stopping")


class Run:
    """One generation on a worker thread, its chunks handed to the event loop. cancel()
    stops it between two steps (the verifier's slot is released when it returns)."""

    _END = object()

    def __init__(self, generation: Generation, req: GenerationRequest, prompt: list[int],
                 loop: asyncio.AbstractEventLoop, *, whole: bool = False) -> None:
        """``whole``: an answer that is not streamed: after the first chunk (which says
        the generation started, or why not) the rest comes as one chunk at the end. Every
        hand-over wakes the event loop, and Python work beside a decode slows all of the
        step's sequences (llama.cpp's threads wait for each other at every op)."""
        self._generation, self._req, self._prompt, self._loop = generation, req, prompt, loop
        self._whole = whole
        self.namespace, self.session_id = req.namespace, req.session_id
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self.cancelled = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._work, name="suffixd-http-generate", daemon=True).start()

    def _put(self, item: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone: the daemon is stopping
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def _work(self) -> None:
        try:
            it: Iterator[Chunk] = self._generation.run(
                self._req, self.cancelled, prompt=self._prompt)
            held: list[Chunk] = []
            for n, chunk in enumerate(it):
                if self._whole and n and chunk.finish_reason is None:
                    held.append(chunk)
                else:
                    self._put(_merged(held, chunk) if held else chunk)
                    held = []
                if self.cancelled.is_set():
                    break
        except BaseException as exc:
            self._put(exc)
        finally:
            self._put(self._END)

    async def next(self) -> Chunk:
        item = await self._queue.get()
        if item is self._END:
            if self._generation.stopping:  # its cancel came from the stop, not the client
                raise stopping_error()
            raise ApiError(500, "generation ended without a final chunk", kind="server_error")
        if isinstance(item, Stopping):
            raise stopping_error(str(item)) from item
        if isinstance(item, BaseException):
            raise item
        return item  # type: ignore[no-any-return]

    def cancel(self) -> None:
        self.cancelled.set()


def completion_body(rid: str, model: str, chat: bool, text: str, last: Chunk,
                    meta: dict[str, Any], message: dict[str, Any] | None = None,
                    finish: str | None = None,
                    token_ids: list[int] | None = None) -> dict[str, Any]:
    """The JSON body of an answer that is not streamed (``message``: the chat reply as
    parsed, with its tool calls; ``finish`` its finish reason; ``token_ids``: the
    generated tokens, in the choice as vLLM's ``return_token_ids`` puts them)."""
    finish = finish or last.finish_reason or "stop"
    if chat:
        choice: dict[str, Any] = {
            "index": 0, "finish_reason": finish, "logprobs": None,
            "message": message or {"role": "assistant", "content": text}}
    else:
        choice = {"index": 0, "finish_reason": finish, "logprobs": None, "text": text}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return {
        "id": rid, "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()), "model": model, "choices": [choice],
        "usage": usage(last), "suffixd": draft_stats(last, meta),
    }


async def sse_events(run: Run, first: Chunk, rid: str, model: str, chat: bool,
                     include_usage: bool, meta: dict[str, Any],
                     end: Callable[[dict[str, Any] | None, bool], None],
                     shaper: ReplyShaper, token_ids: bool = False
                     ) -> AsyncGenerator[bytes, None]:
    """The server-sent events of a streamed answer, from its first chunk on, ending in
    ``data: [DONE]``; an error after the headers goes in the stream as an error object.
    Each step's text goes out as ``shaper`` allows: content (with tools, up to where a call
    may begin), and tool calls as OpenAI streams them (a call's id, type and name first,
    with arguments "", then its arguments as they are generated). With ``token_ids`` each
    step's generated tokens go in its first event's choice (an event with an empty delta
    where the shaper holds the step's text back), so that the events' ``token_ids`` joined
    are the answer's. At the end ``end`` gets the reply message (None when it did not
    finish) and whether the client hung up."""
    created = int(time.time())
    obj = "chat.completion.chunk" if chat else "text_completion"

    def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        payload = {"id": rid, "object": obj, "created": created, "model": model,
                   "choices": choices, **extra}
        return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"

    def choice(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        if chat:
            return {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return {"index": 0, "text": delta.get("content", ""), "finish_reason": finish,
                "logprobs": None}

    def step_events(deltas: list[dict[str, Any]], tokens: list[int]) -> list[bytes]:
        """A step's events; with ``token_ids``, its tokens in the first (an empty delta
        where the shaper holds the step's text back)."""
        if not (token_ids and tokens):
            return [event([choice(d, None)]) for d in deltas]
        out = []
        for i, d in enumerate(deltas or [{}]):
            c = choice(d, None)
            if i == 0:
                c["token_ids"] = tokens
            out.append(event([c]))
        return out

    chunk: Chunk | None = first
    message: dict[str, Any] | None = None
    hung_up = False
    try:
        if chat:
            yield event([choice({"role": "assistant", "content": ""}, None)])
        while chunk is not None:
            deltas = shaper.feed(chunk.text)
            if chunk.finish_reason is not None:
                message, finish, rest = shaper.finish(chunk.finish_reason)
                for ev in step_events(deltas + rest, chunk.tokens):
                    yield ev
                yield event([choice({"content": ""}, finish)],
                            suffixd=draft_stats(chunk, meta))
                if include_usage:
                    yield event([], usage=usage(chunk))
                break
            for ev in step_events(deltas, chunk.tokens):
                yield ev
            try:
                chunk = await run.next()
            except Exception as exc:  # after the headers: the error goes in the stream
                err = exc if isinstance(exc, ApiError) else api_error(exc)
                yield b"data: " + json.dumps(err.body()).encode() + b"\n\n"
                break
        yield b"data: [DONE]\n\n"
    except (asyncio.CancelledError, GeneratorExit):
        # Starlette cancels the response once the client hangs up, or it closes these
        # events after a send failed (EventStream)
        hung_up = True
        raise
    finally:
        end(message, hung_up)


class EventStream(StreamingResponse):
    """The response of a streamed answer: ``sse_events``. However it ends, the run is
    cancelled and ``release`` (when given) gets the reply message once (None when it did
    not finish), and a client that hung up before the end is logged once."""

    def __init__(self, run: Run, first: Chunk, rid: str, model: str, chat: bool,
                 include_usage: bool, meta: dict[str, Any],
                 release: Callable[[dict[str, Any] | None], None] | None,
                 shaper: ReplyShaper, token_ids: bool = False) -> None:
        self._run, self._release, self._ended = run, release, False
        self._events = sse_events(run, first, rid, model, chat, include_usage, meta,
                                  self._end, shaper, token_ids)
        super().__init__(self._events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    def _end(self, message: dict[str, Any] | None, hung_up: bool) -> None:
        if self._ended:
            return
        self._ended = True
        self._run.cancel()
        if hung_up:
            log.info(HUNG_UP, extra={"namespace": self._run.namespace,
                                     "session": self._run.session_id})
        if self._release is not None:
            self._release(message)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                # Events suspended at a yield whose send was cancelled end now, not once
                # the response is collected.
                await self._events.aclose()
            finally:
                # Events that never started (the client left before the first send) run
                # no code of their own: they end here.
                self._end(None, True)


def usage(last: Chunk) -> dict[str, Any]:
    st = last.stats
    prompt = st.prompt_tokens if st else 0
    completion = st.completion_tokens if st else 0
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": st.cached_prompt_tokens if st else 0}}


def draft_stats(last: Chunk, meta: dict[str, Any]) -> dict[str, Any]:
    st = last.stats
    out = dict(meta)
    if st is not None:
        out.update(
            steps=st.steps, proposed=st.drafted_tokens, accepted=st.accepted_tokens,
            by_source={k: {"proposed": v[0], "accepted": v[1]} for k, v in st.by_source.items()},
            prompt_seconds=round(st.prompt_s, 6), first_token_seconds=round(st.first_token_s, 6),
            decode_seconds=round(st.decode_s, 6),
        )
    return out
