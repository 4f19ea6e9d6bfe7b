"""The protobuf requests of every client call, built by pure functions.

Client (sync) and AsyncClient (asyncio) differ only in how they send a request;
both build it here, so a field added to an RPC is filled in one place.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from suffixd.v1 import generate_pb2 as gpb
from suffixd.v1 import suffixd_pb2 as pb

KINDS = {
    "prompt": pb.KIND_PROMPT,
    "tool": pb.KIND_TOOL,
    "response": pb.KIND_RESPONSE,
    "generated": pb.KIND_GENERATED,
}

# How a caller names the cost of verifying k draft tokens on ITS verifier (relative to
# one token): suffixd sizes drafts so that the expected accepted tokens pay for it.
#   "flat"   - a verifier whose cost barely grows with k (a GPU serving one sequence):
#              the default for external callers, whose verifier suffixd cannot see.
#   "cpu"    - suffixcache's CPU profile (gemma-3-270m via llama.cpp on 2 cores): steep,
#              so drafts are short unless they are very likely accepted.
#   "daemon" - whatever the daemon's own drafter uses (its colocated verifier's measured
#              profile once the model is loaded, else the CPU profile).
#   {k: cost, ...} - measured points, e.g. {1: 1.0, 8: 1.3, 32: 2.1}.
CostProfileLike = Mapping[int, float] | Mapping[str, float] | str | None
DEFAULT_COST_PROFILE = "flat"
_FLAT: dict[int, float] = {1: 1.0, 64: 1.0}
# suffixcache.cost.CPU_DEFAULT_POINTS (a test keeps them equal): the client does not load
# the native suffix-tree module for five numbers.
_CPU: dict[int, float] = {1: 1.0, 4: 1.96, 8: 2.53, 16: 5.13, 32: 7.71}


class _HasContent(Protocol):
    text: str

    @property
    def tokens(self) -> Any: ...


def resolve_cost_profile(profile: CostProfileLike) -> dict[int, float] | None:
    """The points to send for ``profile`` (None: send none, the daemon's own drafter)."""
    if profile is None or profile == "daemon":
        return None
    if isinstance(profile, str):
        if profile == "flat":
            return dict(_FLAT)
        if profile == "cpu":
            return dict(_CPU)
        raise ValueError(
            f"cost_profile {profile!r}: expected 'flat', 'cpu', 'daemon' or {{k: cost}}"
        )
    out = {int(k): float(v) for k, v in profile.items()}
    if not out:
        raise ValueError("cost_profile: give at least one {k: cost} point")
    return out


def cost_profile_message(profile: Mapping[int, float]) -> pb.CostProfile:
    return pb.CostProfile(k=list(profile), cost=list(profile.values()))


def kind_value(kind: str) -> pb.Kind:
    try:
        return KINDS[kind]
    except KeyError:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}") from None


def content(msg: _HasContent, tokens: Sequence[int] | None, text: str | None) -> None:
    """Fill a message's ``tokens``/``text`` oneof (exactly one must be given)."""
    if text is not None and tokens is None:
        msg.text = text
    elif tokens is not None and text is None:
        msg.tokens.ids.extend(int(t) for t in tokens)
    else:
        raise ValueError("give exactly one of tokens or text")


def open_session_request(
    namespace: str,
    session_id: str | None,
    metadata: Mapping[str, str] | None,
    tokens: Sequence[int] | None,
    text: str | None,
) -> pb.OpenSessionRequest:
    req = pb.OpenSessionRequest(namespace=namespace, session_id=session_id or "",
                                metadata=dict(metadata or {}))
    if tokens is not None or text is not None:
        content(req, tokens, text)
    return req


def close_session_request(namespace: str, session_id: str,
                          keep_responses: bool) -> pb.CloseSessionRequest:
    return pb.CloseSessionRequest(namespace=namespace, session_id=session_id,
                                  keep_responses=keep_responses)


def list_sessions_request(namespace: str | None) -> pb.ListSessionsRequest:
    return pb.ListSessionsRequest(namespace=namespace or "")


def describe_session_request(namespace: str, session_id: str, include_counters: bool,
                             tail_tokens: int = 0) -> pb.DescribeSessionRequest:
    if tail_tokens < 0:
        raise ValueError("tail_tokens must be >= 0")
    return pb.DescribeSessionRequest(namespace=namespace, session_id=session_id,
                                     include_counters=include_counters,
                                     tail_tokens=tail_tokens)


def drop_namespace_request(namespace: str) -> pb.DropNamespaceRequest:
    if not namespace:
        raise ValueError("drop_namespace needs a namespace")
    return pb.DropNamespaceRequest(namespace=namespace)


def append_request(
    namespace: str, session_id: str, kind: str, tokens: Sequence[int] | None, text: str | None
) -> pb.AppendRequest:
    req = pb.AppendRequest(namespace=namespace, session_id=session_id, kind=kind_value(kind))
    content(req, tokens, text)
    return req


def append_batch_request(
    items: Iterable[tuple[str, str, str, Sequence[int]]],
) -> pb.AppendBatchRequest:
    return pb.AppendBatchRequest(
        items=[append_request(ns, sid, kind, toks, None) for ns, sid, kind, toks in items]
    )


def speculate_request(
    namespace: str,
    session_id: str | None,
    context: Sequence[int] | None,
    max_tokens: int | None,
    cost_profile: CostProfileLike,
) -> pb.SpeculateRequest:
    req = pb.SpeculateRequest(namespace=namespace, session_id=session_id or "",
                              max_tokens=max_tokens or 0)
    if context is not None:
        req.context.ids.extend(int(t) for t in context)
    points = resolve_cost_profile(cost_profile)
    if points:
        req.cost_profile.CopyFrom(cost_profile_message(points))
    return req


def step_speculate_request(
    namespace: str,
    session_id: str,
    accepted_tokens: Sequence[int],
    max_tokens: int | None,
    final: bool,
    cost_profile: CostProfileLike,
) -> pb.SpeculateRequest:
    """A unary Speculate that first appends a decoding step's tokens (see Client.step)."""
    req = speculate_request(namespace, session_id, None, max_tokens, cost_profile)
    req.append.ids.extend(int(t) for t in accepted_tokens)
    req.append_kind = KINDS["response" if final else "generated"]
    return req


def step_request(
    namespace: str,
    session_id: str,
    first: bool,
    accepted_tokens: Sequence[int],
    max_tokens: int | None,
    cost_profile: CostProfileLike,
    kind: str,
    draft: bool,
    defer_commit: bool,
) -> pb.StepRequest:
    """One SpeculateStream message; the session is named in the first message only."""
    k = kind_value(kind)
    req = pb.StepRequest(append=[int(t) for t in accepted_tokens], max_tokens=max_tokens or 0,
                         no_draft=not draft, defer_commit=defer_commit)
    if first:
        req.namespace = namespace
        req.session_id = session_id
    if k != pb.KIND_GENERATED:
        req.append_kind = k
    points = resolve_cost_profile(cost_profile)
    if points:
        req.cost_profile.CopyFrom(cost_profile_message(points))
    return req


def stats_request(namespace: str | None, session_id: str | None, include_sessions: bool,
                  top_documents: int, page_size: int = 0,
                  page_token: str = "") -> pb.StatsRequest:
    return pb.StatsRequest(namespace=namespace or "", session_id=session_id or "",
                           include_sessions=include_sessions, top_documents=top_documents,
                           page_size=page_size, page_token=page_token)


def merge_stats_page(total: dict[str, Any] | None, page: dict[str, Any]) -> dict[str, Any]:
    """Stats replies come in pages (StatsResponse.next_page_token): the pages so far as
    one reply, ``total`` None for the first."""
    if total is None:
        return page
    total["namespaces"].extend(page["namespaces"])
    total["next_page_token"] = page["next_page_token"]
    return total


def generate_request(
    session: str | None,
    *,
    prompt: str | None = None,
    tokens: Sequence[int] | None = None,
    messages: Sequence[Mapping[str, str]] | None = None,
    namespace: str = "default",
    max_tokens: int = 256,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int | None = None,
    stop: Sequence[str] = (),
    add_bos: bool = True,
    ignore_eos: bool = False,
    max_draft_tokens: int = 0,
) -> gpb.GenerateRequest:
    """A Generate request: exactly one of ``prompt`` (text), ``tokens`` or ``messages``
    (chat, rendered with the model's template). ``session=None``: a one-off request."""
    if sum(x is not None for x in (prompt, tokens, messages)) != 1:
        raise ValueError("give exactly one of prompt, tokens or messages")
    req = gpb.GenerateRequest(
        namespace=namespace,
        session_id=session or "",
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        stop=list(stop),
        no_bos=not add_bos,
        ignore_eos=ignore_eos,
        max_draft_tokens=max_draft_tokens,
    )
    if seed is not None:
        req.seed = seed
    if prompt is not None:
        req.text = prompt
    elif tokens is not None:
        req.tokens.ids.extend(int(t) for t in tokens)
    else:
        assert messages is not None
        try:
            req.messages.messages.extend(
                gpb.ChatMessage(role=m["role"], content=m["content"]) for m in messages
            )
        except (KeyError, TypeError):
            raise ValueError("messages must be {role, content} objects") from None
    return req
