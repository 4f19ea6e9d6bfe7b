"""The OpenAI endpoint's requests: parsing and validation, and its error objects.

Interface: ``ApiError`` (an OpenAI-shaped error with its HTTP status; ``body()``);
``api_error(exc)`` (any exception as the ApiError the client gets: engine errors by
their gRPC code, a context overflow as ``context_length_exceeded``, a bad chat template
or value as 400, anything else as a logged 500); ``apply_sampling(body, req)`` (the
fields chat and text completions share: sampling, stop, max tokens; refuses the fields
that would change the output and that suffixd does not implement);
``chat_messages(body)``, ``render_message(m)``, ``completion_prompt(body, req)``,
``stream_flag(body)`` and ``return_token_ids(body)``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from suffixcache.store import DiskFullError, StoreClosedError

from ..common.errors import EngineError
from ..generation.chat import VALID_ROLES, ChatTemplateError
from ..generation.pipeline import MAX_TOKENS_LIMIT, GenerationRequest
from ..generation.verifier import ContextOverflowError
from .session_finder import message_text

log = logging.getLogger("suffixd.http")

MAX_STOP = 4  # as OpenAI
_STATUS_BY_CODE = {
    "INVALID_ARGUMENT": 400, "NOT_FOUND": 404, "ALREADY_EXISTS": 409,
    "RESOURCE_EXHAUSTED": 429, "FAILED_PRECONDITION": 400, "UNAVAILABLE": 503,
    "UNAUTHENTICATED": 401,
}
# Fields that change what is generated and that suffixd does not implement: refused
# unless they carry their neutral value.
_REFUSED_UNLESS_NEUTRAL: dict[str, Callable[[Any], bool]] = {
    "logprobs": lambda v: v in (None, False, 0),
    "top_logprobs": lambda v: v in (None, 0),
    "frequency_penalty": lambda v: v in (None, 0, 0.0),
    "presence_penalty": lambda v: v in (None, 0, 0.0),
    "logit_bias": lambda v: not v,
    "best_of": lambda v: v in (None, 1),
    "echo": lambda v: v in (None, False),
    "suffix": lambda v: v in (None, ""),
}


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = (
            status, message, param, code, kind)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}


def _number(body: dict[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ApiError(400, f"'{name}' must be a number", param=name)
    if not lo <= v <= hi:
        raise ApiError(400, f"'{name}' must be between {lo} and {hi}", param=name)
    return float(v)


def _int(body: dict[str, Any], name: str) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ApiError(400, f"'{name}' must be an integer", param=name)
    return v


def _boolean(body: dict[str, Any], name: str) -> bool:
    """An optional boolean field: absent is false, anything but a boolean a 400 naming it."""
    v = body.get(name)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise ApiError(400, f"'{name}' must be a boolean", param=name)
    return v


def stream_flag(body: dict[str, Any]) -> bool:
    """``stream``: a boolean, as OpenAI checks it (``"yes"`` or 1 is no answer to stream)."""
    return _boolean(body, "stream")


def return_token_ids(body: dict[str, Any]) -> bool:
    """vLLM's ``return_token_ids``: the generated token ids in the answer's choice (what a
    client needs to check an answer token by token, e.g. against plain decoding)."""
    return _boolean(body, "return_token_ids")


def apply_sampling(body: dict[str, Any], req: GenerationRequest) -> None:
    """The sampling fields shared by chat and text completions."""
    for name, neutral in _REFUSED_UNLESS_NEUTRAL.items():
        if name in body and not neutral(body[name]):
            raise ApiError(400, f"'{name}' is not supported by suffixd", param=name,
                           code="unsupported_parameter")
    n = _int(body, "n")
    if n not in (None, 1):
        raise ApiError(400, "only n=1 is supported", param="n", code="unsupported_parameter")
    req.temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    req.top_p = _number(body, "top_p", 1.0, 0.0, 1.0) or 1.0
    top_k = _int(body, "top_k")  # llama-server and vLLM accept it
    if top_k is not None:
        if top_k < 0:
            raise ApiError(400, "'top_k' must be >= 0", param="top_k")
        req.top_k = top_k
    seed = _int(body, "seed")
    req.seed = seed if seed is None else seed & 0xFFFFFFFFFFFFFFFF
    stop = body.get("stop")
    if stop is None:
        req.stop = ()
    elif isinstance(stop, str):
        req.stop = (stop,) if stop else ()
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        if len(stop) > MAX_STOP:
            raise ApiError(400, f"at most {MAX_STOP} stop sequences", param="stop")
        req.stop = tuple(s for s in stop if s)
    else:
        raise ApiError(400, "'stop' must be a string or a list of strings", param="stop")
    for name in ("max_completion_tokens", "max_tokens"):
        v = _int(body, name)
        if v is None:
            continue
        if v < 1:
            raise ApiError(400, f"'{name}' must be >= 1", param=name)
        if v > MAX_TOKENS_LIMIT:
            raise ApiError(400, f"'{name}' is above the limit of {MAX_TOKENS_LIMIT}",
                           param=name)
        req.max_tokens = v
        break
    if "ignore_eos" in body:
        req.ignore_eos = bool(body["ignore_eos"])


def chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's messages, checked as OpenAI checks them: shapes, and every ``tool``
    message answering a ``tool_calls`` id of an earlier assistant message (a result
    that answers no call would reach the model as an answer to nothing)."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ApiError(400, "'messages' must be a non-empty list", param="messages")
    call_ids: set[str] = set()
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"messages[{i}] must be an object with a 'role'",
                           param=f"messages[{i}]")
        if m["role"] not in VALID_ROLES:
            raise ApiError(400, f"messages[{i}].role {m['role']!r} is not one of "
                           f"{', '.join(sorted(VALID_ROLES))}", param=f"messages[{i}].role")
        content = m.get("content")
        if content is not None and not isinstance(content, str | list):
            raise ApiError(400, f"messages[{i}].content must be a string or a list of parts",
                           param=f"messages[{i}].content")
        calls = m.get("tool_calls")
        if calls is not None:
            if m["role"] != "assistant" or not isinstance(calls, list):
                raise ApiError(400, f"messages[{i}].tool_calls must be a list, on an "
                               "assistant message", param=f"messages[{i}].tool_calls")
            call_ids.update(c["id"] for c in calls
                            if isinstance(c, dict) and isinstance(c.get("id"), str))
        if m["role"] == "tool":
            cid = m.get("tool_call_id")
            if not isinstance(cid, str) or cid not in call_ids:
                raise ApiError(400, f"messages[{i}] has role 'tool' but its tool_call_id "
                               f"{cid!r} is no tool_calls id of an earlier assistant "
                               "message: a tool message must answer a call",
                               param=f"messages[{i}].tool_call_id")
    return msgs


def render_message(m: dict[str, Any]) -> dict[str, str]:
    """An OpenAI message as the chat template's {role, content}: content parts joined,
    an assistant's tool calls written out as JSON (the model sees what it called)."""
    role = "system" if m["role"] == "developer" else m["role"]
    text = message_text(m.get("content"))
    calls = [c.get("function") for c in m.get("tool_calls") or () if isinstance(c, dict)]
    if calls:
        rendered = "\n".join(
            json.dumps({"name": f.get("name"), "arguments": f.get("arguments")},
                       ensure_ascii=False)
            for f in calls if isinstance(f, dict)
        )
        text = f"{text}\n{rendered}" if text else rendered
    return {"role": role, "content": text}


def completion_prompt(body: dict[str, Any], req: GenerationRequest) -> None:
    """A text completion's ``prompt`` (a string, or one list of token ids) into ``req``."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        req.text = prompt
    elif isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        req.tokens = list(prompt)
    else:
        raise ApiError(400, "'prompt' must be a string or a list of token ids "
                       "(one prompt per request)", param="prompt")


def api_error(exc: BaseException) -> ApiError:
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ContextOverflowError):
        return ApiError(400, str(exc), code="context_length_exceeded")
    if isinstance(exc, DiskFullError):
        # as gRPC's RESOURCE_EXHAUSTED: writes resume once space is freed, and OpenAI
        # clients retry a 429 with backoff
        return ApiError(429, str(exc), code="disk_full", kind="server_error")
    if isinstance(exc, StoreClosedError):
        return ApiError(503, "the daemon is shutting down", kind="server_error")
    if isinstance(exc, EngineError):
        return ApiError(_STATUS_BY_CODE.get(exc.code, 500), str(exc),
                        kind="invalid_request_error" if exc.code != "INTERNAL" else
                        "server_error")
    if isinstance(exc, ChatTemplateError | ValueError):
        return ApiError(400, str(exc))
    log.exception("internal error in the HTTP front", exc_info=exc)
    return ApiError(500, f"internal error: {type(exc).__name__}: {exc}", kind="server_error")
