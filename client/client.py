"""Synchronous client of the suffixd daemon.

    from suffixd.client import Client

    with Client() as client:                       # default socket of the default data dir
        with client.session(namespace="sql") as s:  # closed (responses kept) on exit
            s.append(text="<user>\\nHow many singers?", kind="prompt")
            draft = s.speculate(max_tokens=16)
            s.append(tokens=accepted_tokens, kind="response")

Errors are raised as subclasses of SuffixdError (NotFoundError, InvalidArgumentError, ...).
UNAVAILABLE (daemon restarting, socket not there yet) is retried with exponential
backoff, ``retries`` times.
"""

from __future__ import annotations

import contextlib
import queue
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import grpc
from suffixd.v1 import suffixd_pb2 as pb
from suffixd.v1 import suffixd_pb2_grpc as pb_grpc

from . import requests as rq
from .errors import InternalError, UnavailableError, from_rpc_error
from .generate import GenerateMixin
from .requests import DEFAULT_COST_PROFILE, CostProfileLike
from .types import (
    AppendResult,
    Draft,
    SessionInfo,
    StepperState,
    default_target,
    message_to_dict,
)

T = TypeVar("T")


def channel_options(max_message_bytes: int) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
    ]


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


def make_channel(grpc_module: Any, target: str, *, tls: bool, root_certificates: bytes | None,
                 max_message_bytes: int) -> Any:
    """A channel from ``grpc`` or ``grpc.aio`` (same factory signatures)."""
    opts = channel_options(max_message_bytes)
    if tls or root_certificates:
        creds = grpc.ssl_channel_credentials(root_certificates=root_certificates)
        return grpc_module.secure_channel(target, creds, options=opts)
    return grpc_module.insecure_channel(target, options=opts)


class Stepper(StepperState):
    """A session's decoding loop on one SpeculateStream: one message and one reply per step,
    far cheaper for the daemon than a unary RPC. Use as a context manager::

        with session.stepper(max_tokens=16) as st:
            draft = st.step()                       # the first draft, from the session tail
            while ...:                              # verify the draft with your model
                draft = st.step(accepted + [bonus]) # append them, get the next draft
            st.step(last_tokens, final=True, draft=False)   # ends the response

    Each step's tokens are committed durably before its reply (``defer_commit=True``:
    answered at once, committed right behind; ``draft.durable_tokens`` tells how much is
    committed, and closing the stepper waits for all of it). A failed step raises the
    status's SuffixdError and ends the stream (nothing of that step was applied); no
    retries, no deadline. Not thread-safe: one decoding loop per stepper.
    """

    def __init__(
        self,
        client: Client,
        namespace: str,
        session_id: str,
        max_tokens: int | None = None,
        cost_profile: CostProfileLike = None,
        defer_commit: bool = False,
    ) -> None:
        super().__init__(namespace, session_id, max_tokens,
                         client.cost_profile if cost_profile is None else cost_profile,
                         defer_commit)
        # The stream's request iterator: gRPC's sending thread blocks on this queue; None
        # half-closes the stream.
        self._requests: queue.SimpleQueue[pb.StepRequest | None] = queue.SimpleQueue()
        self._call = client.stub.SpeculateStream(iter(self._requests.get, None),
                                                 metadata=client.metadata)

    def step(
        self,
        accepted_tokens: Sequence[int] = (),
        *,
        max_tokens: int | None = None,
        final: bool = False,
        draft: bool = True,
        defer_commit: bool | None = None,
        kind: str = "generated",
    ) -> Draft:
        """Append the tokens the verifier produced since the last step (``kind``
        "generated"; ``final``: "response", which ends the response; "prompt" or "tool" for
        other content, e.g. the prompt on the first step; none: nothing appended), then
        draft from the session's new tail (``draft=False``: append only).
        ``draft.accepted``: how many tokens of the previous draft the appended ones matched
        (-1: nothing appended or no draft pending)."""
        req = self._next_request(accepted_tokens, max_tokens, final, draft, defer_commit, kind)
        self._requests.put(req)
        try:
            resp = next(self._call)
        except grpc.RpcError as exc:
            self._end()
            raise from_rpc_error(exc) from None
        except StopIteration:
            self._end()
            raise InternalError(grpc.StatusCode.INTERNAL,
                                "the daemon ended the stream without a reply") from None
        return Draft.from_pb(resp)

    def _end(self) -> None:
        if not self.closed:
            self.closed = True
            self._requests.put(None)  # releases gRPC's sending thread

    def close(self) -> None:
        """Half-close the stream and wait for its status: once this returns, everything
        the stepper appended is committed (also with defer_commit)."""
        if self.closed:
            return
        self._end()
        try:
            for _ in self._call:
                pass
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    def cancel(self) -> None:
        """Abandon the stream without waiting (deferred commits may still be in flight)."""
        self._end()
        with contextlib.suppress(Exception):
            self._call.cancel()

    def __enter__(self) -> Stepper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Session:
    """An open session; use as a context manager to close it on exit."""

    def __init__(self, client: Client, info: SessionInfo, keep_responses: bool = True) -> None:
        self.client = client
        self.info = info
        self.namespace = info.namespace
        self.id = info.session_id
        self.keep_responses = keep_responses
        self.closed = False

    def append(
        self,
        tokens: Sequence[int] | None = None,
        *,
        text: str | None = None,
        kind: str = "prompt",
    ) -> AppendResult:
        return self.client.append(self.namespace, self.id, tokens, text=text, kind=kind)

    def speculate(
        self,
        context: Sequence[int] | None = None,
        max_tokens: int | None = None,
        cost_profile: CostProfileLike = None,
    ) -> Draft:
        """A draft continuing the session's tail (or ``context``), sized for the verifier
        ``cost_profile`` describes (None: the client's, see Client)."""
        return self.client.speculate(self.namespace, self.id, context, max_tokens, cost_profile)

    def step(self, accepted_tokens: Sequence[int], max_tokens: int | None = None,
             final: bool = False, cost_profile: CostProfileLike = None) -> Draft:
        return self.client.step(self.namespace, self.id, accepted_tokens, max_tokens, final,
                                cost_profile)

    def stepper(self, max_tokens: int | None = None,
                cost_profile: CostProfileLike = None,
                defer_commit: bool = False) -> Stepper:
        """The session's decoding loop on one stream (see Stepper)."""
        return self.client.stepper(self.namespace, self.id, max_tokens, cost_profile,
                                   defer_commit)

    def describe(self, include_counters: bool = False, tail_tokens: int = 0) -> SessionInfo:
        return self.client.describe_session(self.namespace, self.id, include_counters,
                                            tail_tokens)

    def close(self, keep_responses: bool | None = None) -> None:
        if self.closed:
            return
        keep = self.keep_responses if keep_responses is None else keep_responses
        self.client.close_session(self.namespace, self.id, keep_responses=keep)
        self.closed = True

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Client(GenerateMixin):  # generate(): client/generate.py
    """A connection to the daemon.

    ``cost_profile``: the cost of verifying k draft tokens on the caller's verifier,
    relative to one token; drafts are sized for it (see requests.CostProfileLike). The
    default "flat" suits a GPU verifier and any verifier suffixd cannot see; pass "cpu"
    or measured points ({1: 1.0, 8: 2.5, ...}) for a CPU verifier, or "daemon" for the
    daemon's own drafter (tuned to its colocated model). Each call may override it.
    """

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
        rq.resolve_cost_profile(cost_profile)  # a bad one fails here, not at each call
        self.cost_profile = cost_profile
        self.target = default_target(target)
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.metadata = auth_metadata(token)
        self.channel = make_channel(grpc, self.target, tls=tls,
                                    root_certificates=root_certificates,
                                    max_message_bytes=max_message_bytes)
        self.stub = pb_grpc.SuffixdStub(self.channel)

    # -- plumbing ----------------------------------------------------------
    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stub_for(self, stub_class: Callable[[grpc.Channel], T]) -> T:
        """A stub of another suffixd service on this client's channel (use with .call)."""
        return stub_class(self.channel)

    def call(self, method: Callable[..., Any], request: Any, timeout: float | None = None,
             retry: bool = True) -> Any:
        """Invoke a unary method with auth metadata, error mapping and UNAVAILABLE retries."""
        attempt = 0
        while True:
            try:
                return method(request, timeout=timeout or self.timeout, metadata=self.metadata)
            except grpc.RpcError as exc:
                err = from_rpc_error(exc)
                if not (retry and isinstance(err, UnavailableError)) or attempt >= self.retries:
                    raise err from None
            delay = self.backoff * (2**attempt) * (0.5 + random.random())
            time.sleep(min(delay, 2.0))
            attempt += 1

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Block until the daemon answers (e.g. right after starting it)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.stub.Info(pb.InfoRequest(), timeout=1.0, metadata=self.metadata,
                               wait_for_ready=True)
                return
            except grpc.RpcError as exc:
                err = from_rpc_error(exc)
                retryable = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
                if err.code not in retryable or time.monotonic() >= deadline:
                    raise err from None
                time.sleep(0.05)

    # -- info ----------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        return message_to_dict(self.call(self.stub.Info, pb.InfoRequest()))

    def tokenize(self, text: str) -> list[int]:
        return list(self.call(self.stub.Tokenize, pb.TokenizeRequest(text=text)).ids)

    def detokenize(self, ids: Sequence[int]) -> str:
        return str(self.call(self.stub.Detokenize, pb.DetokenizeRequest(ids=list(ids))).text)

    # -- sessions ------------------------------------------------------------
    def open_session(
        self,
        namespace: str = "default",
        session_id: str | None = None,
        metadata: Mapping[str, str] | None = None,
        tokens: Sequence[int] | None = None,
        text: str | None = None,
    ) -> SessionInfo:
        req = rq.open_session_request(namespace, session_id, metadata, tokens, text)
        # Not retried: a lost reply would turn into ALREADY_EXISTS on the retry.
        return SessionInfo.from_pb(self.call(self.stub.OpenSession, req, retry=False))

    def session(
        self,
        namespace: str = "default",
        session_id: str | None = None,
        metadata: Mapping[str, str] | None = None,
        keep_responses: bool = True,
        tokens: Sequence[int] | None = None,
        text: str | None = None,
    ) -> Session:
        """Open a session; ``with client.session(...) as s:`` closes it on exit."""
        info = self.open_session(namespace, session_id, metadata, tokens, text)
        return Session(self, info, keep_responses)

    def close_session(self, namespace: str, session_id: str, keep_responses: bool = True
                      ) -> dict[str, Any]:
        req = rq.close_session_request(namespace, session_id, keep_responses)
        return message_to_dict(self.call(self.stub.CloseSession, req))

    def list_sessions(self, namespace: str | None = None) -> list[SessionInfo]:
        resp = self.call(self.stub.ListSessions, rq.list_sessions_request(namespace))
        return [SessionInfo.from_pb(s) for s in resp.sessions]

    def describe_session(self, namespace: str, session_id: str, include_counters: bool = False,
                         tail_tokens: int = 0) -> SessionInfo:
        """A session's record; ``tail_tokens``: also its last N tokens (``info.tail``)."""
        req = rq.describe_session_request(namespace, session_id, include_counters, tail_tokens)
        return SessionInfo.from_pb(self.call(self.stub.DescribeSession, req))

    def drop_namespace(self, namespace: str) -> dict[str, Any]:
        """Delete a namespace and everything in it, durably (see DropNamespace)."""
        req = rq.drop_namespace_request(namespace)
        return message_to_dict(self.call(self.stub.DropNamespace, req))

    # -- ingest ----------------------------------------------------------------
    def append(
        self,
        namespace: str,
        session_id: str,
        tokens: Sequence[int] | None = None,
        *,
        text: str | None = None,
        kind: str = "prompt",
    ) -> AppendResult:
        """Append to a session; returns once the daemon committed it durably."""
        req = rq.append_request(namespace, session_id, kind, tokens, text)
        r = self.call(self.stub.Append, req)
        return AppendResult(r.appended, r.session_tokens, r.accepted, list(r.ids))

    def append_batch(self, items: Iterable[tuple[str, str, str, Sequence[int]]]) -> dict[str, int]:
        """Items (namespace, session_id, kind, tokens), applied in order, committed together."""
        r = self.call(self.stub.AppendBatch, rq.append_batch_request(items))
        return {"items": r.items, "tokens": r.tokens}

    def ingest_stream(self, requests: Iterable[pb.AppendRequest]) -> dict[str, int]:
        """Client-streaming bulk ingest (not retried: the iterator cannot be replayed)."""
        try:
            r = self.stub.IngestStream(iter(requests), timeout=None, metadata=self.metadata)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        return {"items": r.items, "tokens": r.tokens}

    # -- drafts ------------------------------------------------------------------
    def speculate(
        self,
        namespace: str,
        session_id: str | None = None,
        context: Sequence[int] | None = None,
        max_tokens: int | None = None,
        cost_profile: CostProfileLike = None,
    ) -> Draft:
        """A draft continuing ``context`` (default: the session's tail), sized for the
        verifier ``cost_profile`` describes (None: this client's, see Client)."""
        req = rq.speculate_request(namespace, session_id, context, max_tokens,
                                   self.cost_profile if cost_profile is None else cost_profile)
        return Draft.from_pb(self.call(self.stub.Speculate, req))

    def step(
        self,
        namespace: str,
        session_id: str,
        accepted_tokens: Sequence[int],
        max_tokens: int | None = None,
        final: bool = False,
        cost_profile: CostProfileLike = None,
    ) -> Draft:
        """One decoding step in one round trip: append the tokens the verifier produced
        (durably; kind "generated", or "response" when ``final``), then draft from the
        session's new tail. ``draft.accepted`` tells how many of the previous draft's
        tokens the appended ones matched."""
        req = rq.step_speculate_request(
            namespace, session_id, accepted_tokens, max_tokens, final,
            self.cost_profile if cost_profile is None else cost_profile)
        return Draft.from_pb(self.call(self.stub.Speculate, req))

    def stepper(
        self,
        namespace: str,
        session_id: str,
        max_tokens: int | None = None,
        cost_profile: CostProfileLike = None,
        defer_commit: bool = False,
    ) -> Stepper:
        """A decoding loop on one SpeculateStream: ``with client.stepper(ns, sid) as st:
        draft = st.step(accepted_tokens)`` (see Stepper)."""
        return Stepper(self, namespace, session_id, max_tokens, cost_profile, defer_commit)

    def stats(
        self,
        namespace: str | None = None,
        session_id: str | None = None,
        include_sessions: bool = False,
        top_documents: int = 10,
        page_size: int = 0,
    ) -> dict[str, Any]:
        """Every page of the Stats RPC as one reply (``page_size`` namespaces per call;
        0: the daemon's default)."""
        total: dict[str, Any] | None = None
        token = ""
        while True:
            req = rq.stats_request(namespace, session_id, include_sessions, top_documents,
                                   page_size, token)
            total = rq.merge_stats_page(total, message_to_dict(self.call(self.stub.Stats, req)))
            token = total["next_page_token"]
            if not token:
                return total

    def health(self, service: str = "") -> str:
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        stub = health_pb2_grpc.HealthStub(self.channel)
        r = self.call(stub.Check, health_pb2.HealthCheckRequest(service=service))
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(r.status))
