"""asyncio client of the suffixd daemon (grpc.aio): the same methods as Client, awaitable.

    async with AsyncClient() as client:
        async with client.session(namespace="sql") as s:   # or: s = await client.session()
            await s.append(text="...", kind="prompt")
            draft = await s.speculate()
        async for chunk in client.generate("s1", prompt="SELECT name FROM"):
            print(chunk.text, end="")

Requests are built by the same functions as the sync client's (client/requests.py).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Mapping, Sequence
from typing import Any

import grpc
import grpc.aio
from suffixd.v1 import generate_pb2 as gpb
from suffixd.v1 import generate_pb2_grpc as gpb_grpc
from suffixd.v1 import suffixd_pb2 as pb
from suffixd.v1 import suffixd_pb2_grpc as pb_grpc

from . import requests as rq
from .client import auth_metadata, make_channel
from .errors import InternalError, UnavailableError, from_rpc_error
from .generate import GenerateChunk, status_to_dict
from .requests import DEFAULT_COST_PROFILE, CostProfileLike
from .types import (
    AppendResult,
    Draft,
    SessionInfo,
    StepperState,
    default_target,
    message_to_dict,
)


class AsyncStepper(StepperState):
    """A session's decoding loop on one SpeculateStream (asyncio; see client.Stepper)::

        async with session.stepper(max_tokens=16) as st:
            draft = await st.step()
            draft = await st.step(accepted + [bonus])
    """

    def __init__(self, client: AsyncClient, namespace: str, session_id: str,
                 max_tokens: int | None = None, cost_profile: CostProfileLike = None,
                 defer_commit: bool = False) -> None:
        super().__init__(namespace, session_id, max_tokens,
                         client.cost_profile if cost_profile is None else cost_profile,
                         defer_commit)
        self._call = client.stub.SpeculateStream(metadata=client.metadata)

    async def step(self, accepted_tokens: Sequence[int] = (), *, max_tokens: int | None = None,
                   final: bool = False, draft: bool = True,
                   defer_commit: bool | None = None, kind: str = "generated") -> Draft:
        """See client.Stepper.step."""
        req = self._next_request(accepted_tokens, max_tokens, final, draft, defer_commit, kind)
        try:
            await self._call.write(req)
            resp = await self._call.read()
        except grpc.RpcError as exc:
            self.closed = True
            raise from_rpc_error(exc) from None
        if resp is grpc.aio.EOF:  # read() raises for a non-OK status, so this was OK
            self.closed = True
            raise InternalError(grpc.StatusCode.INTERNAL,
                                "the daemon ended the stream without a reply")
        return Draft.from_pb(resp)

    async def close(self) -> None:
        """Half-close and wait for the status: then everything appended is committed."""
        if self.closed:
            return
        self.closed = True
        try:
            await self._call.done_writing()
            while await self._call.read() is not grpc.aio.EOF:
                pass
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    def cancel(self) -> None:
        """Abandon the stream without waiting (deferred commits may still be in flight)."""
        self.closed = True
        self._call.cancel()

    async def __aenter__(self) -> AsyncStepper:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncSession:
    """An open session (see client.Session); ``async with`` closes it on exit."""

    def __init__(self, client: AsyncClient, info: SessionInfo, keep_responses: bool = True) -> None:
        self.client = client
        self.info = info
        self.namespace = info.namespace
        self.id = info.session_id
        self.keep_responses = keep_responses
        self.closed = False

    async def append(self, tokens: Sequence[int] | None = None, *, text: str | None = None,
                     kind: str = "prompt") -> AppendResult:
        return await self.client.append(self.namespace, self.id, tokens, text=text, kind=kind)

    async def speculate(self, context: Sequence[int] | None = None, max_tokens: int | None = None,
                        cost_profile: CostProfileLike = None) -> Draft:
        return await self.client.speculate(self.namespace, self.id, context, max_tokens,
                                           cost_profile)

    async def step(self, accepted_tokens: Sequence[int], max_tokens: int | None = None,
                   final: bool = False, cost_profile: CostProfileLike = None) -> Draft:
        return await self.client.step(self.namespace, self.id, accepted_tokens, max_tokens,
                                      final, cost_profile)

    def stepper(self, max_tokens: int | None = None,
                cost_profile: CostProfileLike = None,
                defer_commit: bool = False) -> AsyncStepper:
        return self.client.stepper(self.namespace, self.id, max_tokens, cost_profile,
                                   defer_commit)

    async def describe(self, include_counters: bool = False, tail_tokens: int = 0
                       ) -> SessionInfo:
        return await self.client.describe_session(self.namespace, self.id, include_counters,
                                                  tail_tokens)

    async def close(self, keep_responses: bool | None = None) -> None:
        if self.closed:
            return
        keep = self.keep_responses if keep_responses is None else keep_responses
        await self.client.close_session(self.namespace, self.id, keep_responses=keep)
        self.closed = True

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _SessionOpening:
    """What ``AsyncClient.session()`` returns: ``async with client.session(...) as s``
    opens the session and closes it on exit; ``s = await client.session(...)`` opens it
    and leaves closing to the caller (``async with await ...`` works too)."""

    def __init__(self, client: AsyncClient, namespace: str, session_id: str | None,
                 metadata: Mapping[str, str] | None, keep_responses: bool,
                 tokens: Sequence[int] | None, text: str | None) -> None:
        self._client = client
        self._args = (namespace, session_id, metadata, tokens, text)
        self._keep = keep_responses
        self._session: AsyncSession | None = None

    async def _open(self) -> AsyncSession:
        info = await self._client.open_session(*self._args)
        self._session = AsyncSession(self._client, info, self._keep)
        return self._session

    def __await__(self) -> Generator[Any, None, AsyncSession]:
        return self._open().__await__()

    async def __aenter__(self) -> AsyncSession:
        return await self._open()

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()


class AsyncClient:
    """A connection to the daemon from asyncio code (see client.Client, same arguments)."""

    def __init__(
        self,
        target: str | None = None,
        *,
        token: str | None = None,
        timeout: float | None = 30.0,
        retries: int = 5,
        backoff: float = 0.05,
        root_certificates: bytes | None = None,
        tls: bool = False,
        max_message_bytes: int = 16 << 20,
        cost_profile: CostProfileLike = DEFAULT_COST_PROFILE,
    ) -> None:
        rq.resolve_cost_profile(cost_profile)
        self.cost_profile = cost_profile
        self.target = default_target(target)
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.metadata = auth_metadata(token)
        self.channel = make_channel(grpc.aio, self.target, tls=tls,
                                    root_certificates=root_certificates,
                                    max_message_bytes=max_message_bytes)
        self.stub = pb_grpc.SuffixdStub(self.channel)

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def stub_for(self, stub_class: Callable[[grpc.aio.Channel], Any]) -> Any:
        return stub_class(self.channel)

    async def call(self, method: Callable[..., Any], request: Any, timeout: float | None = None,
                   retry: bool = True) -> Any:
        """Invoke a unary method with auth metadata, error mapping and UNAVAILABLE retries."""
        attempt = 0
        while True:
            try:
                return await method(request, timeout=timeout or self.timeout,
                                    metadata=self.metadata)
            except grpc.RpcError as exc:
                err = from_rpc_error(exc)
                if not (retry and isinstance(err, UnavailableError)) or attempt >= self.retries:
                    raise err from None
            await asyncio.sleep(min(self.backoff * (2**attempt) * (0.5 + random.random()), 2.0))
            attempt += 1

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Wait until the daemon answers (e.g. right after starting it)."""
        deadline = time.monotonic() + timeout
        retryable = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        while True:
            try:
                await self.stub.Info(pb.InfoRequest(), timeout=1.0, metadata=self.metadata,
                                     wait_for_ready=True)
                return
            except grpc.RpcError as exc:
                err = from_rpc_error(exc)
                if err.code not in retryable or time.monotonic() >= deadline:
                    raise err from None
                await asyncio.sleep(0.05)

    async def info(self) -> dict[str, Any]:
        return message_to_dict(await self.call(self.stub.Info, pb.InfoRequest()))

    async def tokenize(self, text: str) -> list[int]:
        return list((await self.call(self.stub.Tokenize, pb.TokenizeRequest(text=text))).ids)

    async def detokenize(self, ids: Sequence[int]) -> str:
        r = await self.call(self.stub.Detokenize, pb.DetokenizeRequest(ids=list(ids)))
        return str(r.text)

    async def health(self, service: str = "") -> str:
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        stub = health_pb2_grpc.HealthStub(self.channel)
        r = await self.call(stub.Check, health_pb2.HealthCheckRequest(service=service))
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(r.status))

    async def ingest_stream(self, requests: Iterable[pb.AppendRequest]) -> dict[str, int]:
        """Client-streaming bulk ingest (not retried: the iterator cannot be replayed)."""
        try:
            r = await self.stub.IngestStream(iter(requests), metadata=self.metadata)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        return {"items": r.items, "tokens": r.tokens}

    async def open_session(self, namespace: str = "default", session_id: str | None = None,
                           metadata: Mapping[str, str] | None = None,
                           tokens: Sequence[int] | None = None, text: str | None = None
                           ) -> SessionInfo:
        req = rq.open_session_request(namespace, session_id, metadata, tokens, text)
        # Not retried: a lost reply would turn into ALREADY_EXISTS on the retry.
        return SessionInfo.from_pb(await self.call(self.stub.OpenSession, req, retry=False))

    def session(self, namespace: str = "default", session_id: str | None = None,
                metadata: Mapping[str, str] | None = None, keep_responses: bool = True,
                tokens: Sequence[int] | None = None, text: str | None = None
                ) -> _SessionOpening:
        """Open a session: ``async with client.session(...) as s:`` closes it on exit;
        ``s = await client.session(...)`` leaves it open."""
        return _SessionOpening(self, namespace, session_id, metadata, keep_responses,
                               tokens, text)

    async def close_session(self, namespace: str, session_id: str, keep_responses: bool = True
                            ) -> dict[str, Any]:
        req = rq.close_session_request(namespace, session_id, keep_responses)
        return message_to_dict(await self.call(self.stub.CloseSession, req))

    async def list_sessions(self, namespace: str | None = None) -> list[SessionInfo]:
        resp = await self.call(self.stub.ListSessions, rq.list_sessions_request(namespace))
        return [SessionInfo.from_pb(s) for s in resp.sessions]

    async def describe_session(self, namespace: str, session_id: str,
                               include_counters: bool = False, tail_tokens: int = 0
                               ) -> SessionInfo:
        """See Client.describe_session."""
        req = rq.describe_session_request(namespace, session_id, include_counters, tail_tokens)
        return SessionInfo.from_pb(await self.call(self.stub.DescribeSession, req))

    async def drop_namespace(self, namespace: str) -> dict[str, Any]:
        """See Client.drop_namespace."""
        req = rq.drop_namespace_request(namespace)
        return message_to_dict(await self.call(self.stub.DropNamespace, req))

    async def append(self, namespace: str, session_id: str, tokens: Sequence[int] | None = None,
                     *, text: str | None = None, kind: str = "prompt") -> AppendResult:
        req = rq.append_request(namespace, session_id, kind, tokens, text)
        r = await self.call(self.stub.Append, req)
        return AppendResult(r.appended, r.session_tokens, r.accepted, list(r.ids))

    async def append_batch(self, items: Iterable[tuple[str, str, str, Sequence[int]]]
                           ) -> dict[str, int]:
        r = await self.call(self.stub.AppendBatch, rq.append_batch_request(items))
        return {"items": r.items, "tokens": r.tokens}

    async def speculate(self, namespace: str, session_id: str | None = None,
                        context: Sequence[int] | None = None, max_tokens: int | None = None,
                        cost_profile: CostProfileLike = None) -> Draft:
        """See Client.speculate."""
        req = rq.speculate_request(namespace, session_id, context, max_tokens,
                                   self.cost_profile if cost_profile is None else cost_profile)
        return Draft.from_pb(await self.call(self.stub.Speculate, req))

    async def step(self, namespace: str, session_id: str, accepted_tokens: Sequence[int],
                   max_tokens: int | None = None, final: bool = False,
                   cost_profile: CostProfileLike = None) -> Draft:
        """Append a step's tokens and get the next draft in one round trip (see Client.step)."""
        req = rq.step_speculate_request(
            namespace, session_id, accepted_tokens, max_tokens, final,
            self.cost_profile if cost_profile is None else cost_profile)
        return Draft.from_pb(await self.call(self.stub.Speculate, req))

    def stepper(self, namespace: str, session_id: str, max_tokens: int | None = None,
                cost_profile: CostProfileLike = None,
                defer_commit: bool = False) -> AsyncStepper:
        """A decoding loop on one SpeculateStream (see AsyncStepper, client.Stepper)."""
        return AsyncStepper(self, namespace, session_id, max_tokens, cost_profile, defer_commit)

    async def stats(self, namespace: str | None = None, session_id: str | None = None,
                    include_sessions: bool = False, top_documents: int = 10,
                    page_size: int = 0) -> dict[str, Any]:
        """See Client.stats."""
        total: dict[str, Any] | None = None
        token = ""
        while True:
            req = rq.stats_request(namespace, session_id, include_sessions, top_documents,
                                   page_size, token)
            page = message_to_dict(await self.call(self.stub.Stats, req))
            total = rq.merge_stats_page(total, page)
            token = total["next_page_token"]
            if not token:
                return total

    async def generate(self, session: str | None = None, *, timeout: float | None = None,
                       **kwargs: Any) -> AsyncIterator[GenerateChunk]:
        """Stream a generation (see Client.generate): ``async for chunk in ...``."""
        req = rq.generate_request(session, **kwargs)
        stub = gpb_grpc.GeneratorStub(self.channel)
        try:
            async for c in stub.Generate(req, timeout=timeout, metadata=self.metadata):
                yield GenerateChunk.from_pb(c)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    async def generator_status(self, timeout: float | None = 10.0) -> dict[str, Any]:
        """See Client.generator_status."""
        stub = gpb_grpc.GeneratorStub(self.channel)
        try:
            r = await stub.GeneratorStatus(gpb.GeneratorStatusRequest(), timeout=timeout,
                                           metadata=self.metadata)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        return status_to_dict(r)
