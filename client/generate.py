"""``Client.generate``: streamed generation by the daemon's colocated verifier.

    from suffixd.client import Client

    with Client() as client:
        for chunk in client.generate("s1", messages=[{"role": "user", "content": "Hi"}],
                                     max_tokens=64):
            print(chunk.text, end="", flush=True)
        print(chunk.finish_reason, chunk.totals)   # the last chunk has both

The session is opened by the daemon if it does not exist; its prompt and the
response are appended to the session's tree (and the response to the
namespace's global tree) durably.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict
from suffixd.v1 import generate_pb2 as gpb
from suffixd.v1 import generate_pb2_grpc as gpb_grpc

from .errors import from_rpc_error


@dataclass
class GenerateChunk:
    text: str
    token_ids: list[int]
    source: str  # session | global | corpus | draft_model | none
    proposed: int
    accepted: int
    finish_reason: str | None = None  # "stop" | "length" on the last chunk
    totals: dict[str, Any] = field(default_factory=dict)  # last chunk only


def build_request(
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
        req.messages.messages.extend(
            gpb.ChatMessage(role=m["role"], content=m["content"]) for m in messages
        )
    return req


class GenerateMixin:
    """Adds ``generate`` to the sync client (uses its channel, auth metadata and errors)."""

    channel: grpc.Channel
    metadata: tuple[tuple[str, str], ...]

    def generate(
        self, session: str | None = None, *, timeout: float | None = None, **kwargs: Any
    ) -> Iterator[GenerateChunk]:
        """Stream a generation; see ``build_request`` for the parameters.

        ``session=None`` generates without a session (nothing is remembered).
        Errors raise the client's exceptions (InvalidArgumentError, ...).
        """
        req = build_request(session, **kwargs)
        stub = gpb_grpc.GeneratorStub(self.channel)
        try:
            for c in stub.Generate(req, timeout=timeout, metadata=self.metadata):
                yield GenerateChunk(
                    text=c.text,
                    token_ids=list(c.token_ids),
                    source=c.source,
                    proposed=c.proposed,
                    accepted=c.accepted,
                    finish_reason=c.finish_reason or None,
                    totals=MessageToDict(c.totals, preserving_proto_field_name=True)
                    if c.HasField("totals")
                    else {},
                )
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
