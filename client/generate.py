"""``Client.generate``: streamed generation by the daemon's colocated verifier.

    from suffixd.client import Client

    with Client() as client:
        for chunk in client.generate("s1", prompt="SELECT name FROM singer WHERE",
                                     max_tokens=64):
            print(chunk.text, end="", flush=True)
        print(chunk.finish_reason, chunk.totals)   # the last chunk has both

The session is opened by the daemon if it does not exist; its prompt and the
response are appended to the session's tree (and the response to the
namespace's global tree) durably. AsyncClient.generate is the same, as an async
iterator.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict
from suffixd.v1 import generate_pb2 as gpb
from suffixd.v1 import generate_pb2_grpc as gpb_grpc

from .errors import from_rpc_error
from .requests import generate_request

# The former name of requests.generate_request.
build_request = generate_request


@dataclass
class GenerateChunk:
    text: str
    token_ids: list[int]
    source: str  # session | global | corpus | draft_model | none
    proposed: int
    accepted: int
    finish_reason: str | None = None  # "stop" | "length" on the last chunk
    totals: dict[str, Any] = field(default_factory=dict)  # last chunk only

    @classmethod
    def from_pb(cls, c: gpb.GenerateChunk) -> GenerateChunk:
        return cls(
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


class GenerateMixin:
    """Adds ``generate`` to the sync client (uses its channel, auth metadata and errors)."""

    channel: grpc.Channel
    metadata: tuple[tuple[str, str], ...]

    def generate(
        self, session: str | None = None, *, timeout: float | None = None, **kwargs: Any
    ) -> Iterator[GenerateChunk]:
        """Stream a generation; see ``requests.generate_request`` for the parameters.

        ``session=None`` generates without a session (nothing is remembered).
        Errors raise the client's exceptions (InvalidArgumentError, ...).
        """
        req = generate_request(session, **kwargs)
        stub = gpb_grpc.GeneratorStub(self.channel)
        try:
            for c in stub.Generate(req, timeout=timeout, metadata=self.metadata):
                yield GenerateChunk.from_pb(c)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    def generator_status(self, timeout: float | None = 10.0) -> dict[str, Any]:
        """The daemon's verifier: whether it is loaded, what it is doing (``phase``), its
        measured cost profile."""
        stub = gpb_grpc.GeneratorStub(self.channel)
        try:
            r = stub.GeneratorStatus(gpb.GeneratorStatusRequest(), timeout=timeout,
                                     metadata=self.metadata)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        return status_to_dict(r)


def status_to_dict(r: gpb.GeneratorStatusResponse) -> dict[str, Any]:
    return {
        "loaded": r.loaded,
        "model": r.model,
        "phase": r.phase,
        "phase_seconds": r.phase_seconds,
        "cost_profile": {int(k): v for k, v in r.cost_profile.items()},
        "batch_padding": {int(k): int(v) for k, v in r.batch_padding.items()},
        "draft_model": r.draft_model,
        "batching": json.loads(r.batching) if r.batching else None,
        "prompt_cache": json.loads(r.prompt_cache) if r.prompt_cache else None,
        "cost_profile_source": r.cost_profile_source,
        "determinism": json.loads(r.determinism) if r.determinism else None,
    }
