"""Plain result types of the client and the conversions from/to protobuf."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from suffixd.v1 import suffixd_pb2 as pb

# The request builders live in requests.py; these names stay importable from here.
from .requests import (  # noqa: F401
    KINDS,
    CostProfileLike,
    append_request,
    content,
    speculate_request,
    step_request,
)


@dataclass
class Draft:
    tokens: list[int]
    parents: list[int]
    probs: list[float]
    match_len: int
    source: str
    sources: list[str]
    score: float
    # Only when the speculate call carried an append (see Client.step).
    accepted: int = -1
    session_tokens: int = 0
    # Only from a stepper: the session's tokens committed when the reply was sent
    # (session_tokens unless defer_commit was used).
    durable_tokens: int = 0

    def __len__(self) -> int:
        return len(self.tokens)

    def path(self) -> list[int]:
        """The most probable root-to-leaf path (all tokens for a path draft)."""
        if all(p == i - 1 for i, p in enumerate(self.parents)):
            return list(self.tokens)
        # Tree: follow the most probable child from the root.
        children: dict[int, list[int]] = {}
        for i, p in enumerate(self.parents):
            children.setdefault(p, []).append(i)
        out, node = [], -1
        while children.get(node):
            node = max(children[node], key=lambda c: self.probs[c] if c < len(self.probs) else 0)
            out.append(self.tokens[node])
        return out

    @classmethod
    def from_pb(cls, m: pb.SpeculateResponse) -> Draft:
        return cls(list(m.tokens), list(m.parents), list(m.probs), m.match_len, m.source,
                   list(m.sources), m.score, m.accepted, m.session_tokens, m.durable_tokens)


@dataclass
class SessionInfo:
    namespace: str
    session_id: str
    metadata: dict[str, str]
    tokens: int
    created_at: float
    last_active_at: float
    responses: int
    counters: dict[str, Any] | None = None
    tail: list[int] = field(default_factory=list)  # describe(tail_tokens=N): the last N

    @classmethod
    def from_pb(cls, m: pb.SessionInfo) -> SessionInfo:
        return cls(
            m.namespace, m.session_id, dict(m.metadata), m.tokens, m.created_at,
            m.last_active_at, m.responses,
            message_to_dict(m.counters) if m.HasField("counters") else None,
            list(m.tail),
        )


@dataclass
class AppendResult:
    appended: int
    session_tokens: int
    accepted: int  # -1: no speculate was pending
    ids: list[int] = field(default_factory=list)  # the token ids, when text was sent


def message_to_dict(m: Any) -> dict[str, Any]:
    """A message as plain Python (ints stay ints, unlike the JSON mapping of uint64)."""
    out: dict[str, Any] = {}
    for f in m.DESCRIPTOR.fields:
        v = getattr(m, f.name)
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            out[f.name] = dict(v)
        elif f.message_type is not None:
            if f.is_repeated:
                out[f.name] = [message_to_dict(x) for x in v]
            else:
                out[f.name] = message_to_dict(v) if m.HasField(f.name) else None
        elif f.is_repeated:
            out[f.name] = list(v)
        else:
            out[f.name] = v
    return out


class StepperState:
    """What a stepper (sync or asyncio) keeps between messages: the session it works on,
    its defaults, and whether the next message must name the session."""

    def __init__(self, namespace: str, session_id: str, max_tokens: int | None,
                 cost_profile: CostProfileLike, defer_commit: bool) -> None:
        self.namespace = namespace
        self.session_id = session_id
        self.max_tokens = max_tokens
        self.cost_profile = cost_profile
        self.defer_commit = defer_commit
        self.closed = False
        self._first = True

    def use_session(self, namespace: str, session_id: str) -> None:
        """Work on another session from the next step on, on the same stream (cheaper
        than a stream per session: a verifier worker can keep one for all its requests)."""
        self.namespace = namespace
        self.session_id = session_id
        self._first = True  # the next message names it

    def _next_request(self, accepted_tokens: Sequence[int], max_tokens: int | None,
                      final: bool, draft: bool, defer_commit: bool | None,
                      kind: str) -> pb.StepRequest:
        if self.closed:
            raise ValueError("this stepper is closed")
        req = step_request(
            self.namespace, self.session_id, self._first, accepted_tokens,
            self.max_tokens if max_tokens is None else max_tokens,
            self.cost_profile if self._first else None, "response" if final else kind, draft,
            self.defer_commit if defer_commit is None else defer_commit,
        )
        self._first = False
        return req


def default_target(target: str | os.PathLike[str] | None) -> str:
    """unix:PATH or HOST:PORT. None: $SUFFIXD_ADDRESS, else the default data dir's socket."""
    if target is None:
        env = os.environ.get("SUFFIXD_ADDRESS")
        if env:
            return default_target(env)
        base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        return f"unix:{Path(base) / 'suffixd' / 'suffixd.sock'}"
    t = os.fspath(target)
    if t.startswith(("unix:", "dns:", "ipv4:", "ipv6:")):
        return t
    if t.startswith("/") or t.startswith("."):
        return f"unix:{Path(t).resolve()}"
    return t
