"""The suffixd.v1.Suffixd servicer: protobuf <-> Engine, errors -> gRPC status codes.

Per-RPC work is kept to converting messages; everything else is the engine's.

It runs on the daemon's grpc.aio server (daemon/server/loop_server.py, LoopServer). The hot path is
coroutines on the server's event loop, calling the engine directly (a step is ~50-70 us
of CPU that never waits for I/O): SpeculateStream and Speculate without an append. A
step that must be durable does not block the loop for its fsync: its commit is queued
(as with defer_commit) and the reply awaits it. Every other method is a plain function
that gRPC runs in the server's thread pool; a durable unary append waits there.

A coroutine may still wait on a session's lock if a thread-pool RPC holds it across a
commit of the same session (a unary Append racing the session's own stream): rare,
and bounded by one group commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent import futures
from typing import Any, TypeVar

import grpc
import grpc.aio
from suffixd.v1 import suffixd_pb2 as pb
from suffixd.v1 import suffixd_pb2_grpc as pb_grpc

from suffixcache.store import DiskFullError, StoreClosedError

from ..common.errors import EngineError, InvalidArgument, ResourceExhausted, Unavailable
from ..engine import Engine
from ..generation.memory import process_memory

log = logging.getLogger("suffixd.service")

KIND_NAMES: dict[int, str] = {
    pb.KIND_PROMPT: "prompt",
    pb.KIND_TOOL: "tool",
    pb.KIND_RESPONSE: "response",
    pb.KIND_GENERATED: "generated",
}

F = TypeVar("F", bound=Callable[..., Any])


def _abort(context: grpc.ServicerContext, exc: BaseException) -> None:
    if isinstance(exc, EngineError):
        context.abort(getattr(grpc.StatusCode, exc.code), str(exc))
    if isinstance(exc, DiskFullError):
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
    if isinstance(exc, StoreClosedError):
        context.abort(grpc.StatusCode.UNAVAILABLE, "the daemon is shutting down")
    log.exception("internal error in RPC")
    context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")


async def _abort_aio(context: grpc.aio.ServicerContext[Any, Any], exc: BaseException) -> None:
    """_abort for a coroutine handler (aio's abort is awaited; it raises)."""
    if isinstance(exc, EngineError):
        await context.abort(getattr(grpc.StatusCode, exc.code), str(exc))
    if isinstance(exc, DiskFullError):
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
    if isinstance(exc, StoreClosedError):
        await context.abort(grpc.StatusCode.UNAVAILABLE, "the daemon is shutting down")
    log.exception("internal error in RPC", exc_info=exc)
    await context.abort(grpc.StatusCode.INTERNAL,
                        f"internal error: {type(exc).__name__}: {exc}")


def rpc(fn: F) -> F:
    """Map engine errors to status codes (context.abort raises, ending the RPC)."""

    @functools.wraps(fn)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return fn(self, request, context)
        except Exception as exc:
            if isinstance(exc, grpc.RpcError) or type(exc).__name__ == "_AbortError":
                raise
            _abort(context, exc)
            raise  # unreachable: abort raises

    return wrapper  # type: ignore[return-value]


def _kind(value: int) -> str:
    name = KIND_NAMES.get(value)
    if name is None:
        raise InvalidArgument(
            "kind must be one of KIND_PROMPT, KIND_TOOL, KIND_RESPONSE, KIND_GENERATED"
        )
    return name


def counters_pb(c: dict[str, Any]) -> pb.Counters:
    return pb.Counters(
        requests=c["requests"],
        steps=c["steps"],
        draft_tokens_proposed=c["draft_tokens_proposed"],
        draft_tokens_accepted=c["draft_tokens_accepted"],
        acceptance_rate=c["acceptance_rate"],
        mean_accepted_per_step=c["mean_accepted_per_step"],
        by_source=[
            pb.SourceCount(source=src, steps=v["steps"], proposed=v["proposed"],
                           accepted=v["accepted"])
            for src, v in c["by_source"].items()
        ],
        forward_passes_saved=c["forward_passes_saved"],
        generated_tokens=c["generated_tokens"],
        speculate_calls=c["speculate_calls"],
    )


def session_pb(info: dict[str, Any]) -> pb.SessionInfo:
    msg = pb.SessionInfo(
        namespace=info["namespace"],
        session_id=info["session_id"],
        metadata=info["metadata"],
        tokens=info["tokens"],
        created_at=info["created_at"],
        last_active_at=info["last_active_at"],
        responses=info["responses"],
    )
    if "counters" in info:
        msg.counters.CopyFrom(counters_pb(info["counters"]))
    return msg


def _tree_pb(d: dict[str, Any]) -> pb.TreeSize:
    return pb.TreeSize(
        sequences=int(d.get("sequences", d.get("count", 0))),
        tokens=int(d.get("tokens", 0)),
        nodes=int(d.get("nodes", 0)),
        bytes=int(d.get("bytes", 0)),
        evictions=int(d.get("evictions", 0)),
    )


def _namespace_pb(ns: str, e: dict[str, Any]) -> pb.NamespaceStats:
    cache = e["cache"]
    nsm = pb.NamespaceStats(namespace=ns, counters=counters_pb(e["counters"]),
                            open_sessions=e["open_sessions"])
    getattr(nsm, "global").CopyFrom(_tree_pb(cache.get("global", {})))
    nsm.corpus.CopyFrom(_tree_pb(cache.get("corpus", {})))
    nsm.sessions.CopyFrom(_tree_pb(cache.get("sessions", {})))
    for key, acc in e["top_documents"]:
        nsm.top_documents.add(doc_key=key, accepted=acc)
    for sid, s in e.get("sessions", {}).items():
        nsm.session_stats.add(session_id=sid, counters=counters_pb(s["counters"]),
                              tokens=s["tokens"])
    return nsm


# Namespaces per Stats reply unless the request says otherwise.
DEFAULT_STATS_PAGE = 1000


def _page_token(after: str | None) -> str:
    """The name the next page starts after, opaque to clients (hex of its UTF-8)."""
    return "n" + (after or "").encode("utf-8").hex()


def _page_after(token: str) -> str | None:
    if not token:
        return None
    try:
        if not token.startswith("n"):
            raise ValueError
        return bytes.fromhex(token[1:]).decode("utf-8")
    except ValueError:
        raise InvalidArgument("invalid page_token (pass next_page_token as it came)") from None


def _cost_profile(msg: pb.CostProfile) -> dict[str, Any] | None:
    if not msg.k and not msg.cost:
        return None
    if len(msg.k) != len(msg.cost):
        raise InvalidArgument("cost_profile: k and cost must have the same length")
    return {str(k): float(c) for k, c in zip(msg.k, msg.cost, strict=True)}


class _CommitWaits:
    """Await store commits (concurrent futures completed by the store's writer thread) on
    the event loop with one wake-up per burst of completions.

    asyncio.wrap_future costs a call_soon_threadsafe, so a write to the loop's self-pipe
    and a wake-up, per future; a commit group completes the futures of all the durable
    steps it holds one after the other, and here only the first of them wakes the loop,
    which then resolves every waiter completed so far."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._done: list[asyncio.Future[None]] = []

    def wait(self, fut: futures.Future[Any]) -> asyncio.Future[None]:
        waiter: asyncio.Future[None] = self.loop.create_future()
        fut.add_done_callback(lambda _f: self._completed(waiter))
        return waiter

    def _completed(self, waiter: asyncio.Future[None]) -> None:
        # In the writer thread (or at once on the loop if the commit was already done).
        with self._lock:
            self._done.append(waiter)
            first = len(self._done) == 1
        if first:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            done, self._done = self._done, []
        for w in done:
            if not w.done():  # a cancelled RPC's waiter is done already
                w.set_result(None)


# Open SpeculateStream calls at once by default. An open stream costs no thread (it runs
# on the event loop) and no CPU while idle; the limit bounds memory and per-stream state.
DEFAULT_MAX_STREAMS = 64


class SuffixdServicer(pb_grpc.SuffixdServicer):
    def __init__(self, engine: Engine, max_streams: int = DEFAULT_MAX_STREAMS,
                 pool: futures.Executor | None = None) -> None:
        self.engine = engine
        self.max_streams = max(1, max_streams)
        self._open_streams = 0  # only touched on the event loop
        # Where the coroutines send work that waits for a commit (None: the loop's default).
        self.pool = pool
        self._commit_waits: _CommitWaits | None = None  # made on the loop, at first use

    def _tokens_of(self, request: Any) -> list[int]:
        which = request.WhichOneof("content")
        if which == "text":
            return self.engine.tokenize(request.text)
        if which == "tokens":
            return list(request.tokens.ids)
        return []

    @rpc
    def Info(self, request: pb.InfoRequest, context: grpc.ServicerContext) -> pb.InfoResponse:
        i = self.engine.info()
        lim = i["limits"]
        return pb.InfoResponse(
            version=i["version"],
            model_path=i["model_path"],
            vocab_size=i["vocab_size"],
            tokenizer_fingerprint=i["tokenizer_fingerprint"],
            data_dir=i["data_dir"],
            limits=pb.Limits(
                max_message_bytes=lim.max_message_bytes,
                max_tokens_per_call=lim.max_tokens_per_call,
                max_sessions_per_namespace=lim.max_sessions_per_namespace,
                session_idle_timeout_s=lim.session_idle_timeout_s,
                max_draft_tokens=lim.max_draft_tokens,
                max_namespaces=lim.max_namespaces,
                max_session_tokens=lim.max_session_tokens,
                max_session_bytes=lim.max_session_bytes,
                max_total_session_tokens=lim.max_total_session_tokens,
                max_total_session_bytes=lim.max_total_session_bytes,
            ),
            services=i["services"],
            rebuilding=i["rebuilding"],
            rebuild_tokens=i["rebuild_tokens"],
            rebuild_seconds=i["rebuild_seconds"],
        )

    @rpc
    def Tokenize(self, request: pb.TokenizeRequest, context: grpc.ServicerContext) -> Any:
        return pb.TokenizeResponse(ids=self.engine.tokenize(request.text))

    @rpc
    def Detokenize(self, request: pb.DetokenizeRequest, context: grpc.ServicerContext) -> Any:
        return pb.DetokenizeResponse(text=self.engine.detokenize(list(request.ids)))

    @rpc
    def OpenSession(self, request: pb.OpenSessionRequest, context: grpc.ServicerContext) -> Any:
        which = request.WhichOneof("initial")
        if which == "text":
            toks = self.engine.tokenize(request.text)
        elif which == "tokens":
            toks = list(request.tokens.ids)
        else:
            toks = []
        info = self.engine.open_session(
            request.namespace, request.session_id or None, dict(request.metadata), toks
        )
        return session_pb(info)

    @rpc
    def CloseSession(self, request: pb.CloseSessionRequest, context: grpc.ServicerContext) -> Any:
        keep = request.keep_responses if request.HasField("keep_responses") else True
        r = self.engine.close_session(request.namespace, request.session_id, keep)
        return pb.CloseSessionResponse(tokens=r["tokens"], responses_kept=r["responses_kept"])

    @rpc
    def ListSessions(self, request: pb.ListSessionsRequest, context: grpc.ServicerContext) -> Any:
        infos = self.engine.list_sessions(request.namespace or None)
        return pb.ListSessionsResponse(sessions=[session_pb(i) for i in infos])

    @rpc
    def DescribeSession(
        self, request: pb.DescribeSessionRequest, context: grpc.ServicerContext
    ) -> Any:
        limit = self.engine.limits.max_tokens_per_call
        if request.tail_tokens > limit:
            raise ResourceExhausted(f"tail_tokens {request.tail_tokens} is above the limit of "
                                    f"tokens per call ({limit})")
        info = self.engine.describe_session(
            request.namespace, request.session_id, request.tail_tokens, request.include_counters
        )
        msg = session_pb(info)
        msg.tail.extend(info.get("tail", ()))
        return msg

    @rpc
    def DropNamespace(self, request: pb.DropNamespaceRequest,
                      context: grpc.ServicerContext) -> Any:
        r = self.engine.drop_namespace(request.namespace)
        return pb.DropNamespaceResponse(found=r["found"], sessions=r["sessions"],
                                        sequences=r["sequences"], documents=r["documents"])

    @rpc
    def Append(self, request: pb.AppendRequest, context: grpc.ServicerContext) -> Any:
        kind = _kind(request.kind)
        toks = self._tokens_of(request)
        r = self.engine.append(request.namespace, request.session_id, kind, toks)
        resp = pb.AppendResponse(appended=r.appended, session_tokens=r.session_tokens,
                                 accepted=r.accepted)
        if request.WhichOneof("content") == "text":
            resp.ids.extend(toks)
        return resp

    def _items(self, requests: Iterator[pb.AppendRequest]) -> list[tuple[str, str, str, list[int]]]:
        return [(r.namespace, r.session_id, _kind(r.kind), self._tokens_of(r)) for r in requests]

    @rpc
    def AppendBatch(self, request: pb.AppendBatchRequest, context: grpc.ServicerContext) -> Any:
        results = self.engine.append_many(self._items(iter(request.items)))
        return pb.IngestSummary(items=len(results), tokens=sum(r.appended for r in results))

    @rpc
    def IngestStream(
        self, request_iterator: Iterator[pb.AppendRequest], context: grpc.ServicerContext
    ) -> Any:
        # Commit in groups so a long stream neither holds everything in memory nor pays
        # one fsync per item; the reply comes after the last group committed.
        items, tokens, buf_tokens = 0, 0, 0
        buf: list[tuple[str, str, str, list[int]]] = []
        limit = self.engine.limits.max_tokens_per_call
        for req in request_iterator:
            item = (req.namespace, req.session_id, _kind(req.kind), self._tokens_of(req))
            if buf and buf_tokens + len(item[3]) > limit:
                res = self.engine.append_many(buf)
                items += len(res)
                tokens += sum(r.appended for r in res)
                buf, buf_tokens = [], 0
            buf.append(item)
            buf_tokens += len(item[3])
        if buf:
            res = self.engine.append_many(buf)
            items += len(res)
            tokens += sum(r.appended for r in res)
        return pb.IngestSummary(items=items, tokens=tokens)

    async def Speculate(self, request: pb.SpeculateRequest,
                        context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        # Drafting alone runs on the loop; an append waits for its commit in the pool.
        try:
            if request.HasField("append"):
                loop = asyncio.get_running_loop()
                return await loop.run_in_executor(self.pool, self._speculate, request)
            return self._speculate(request)
        except Exception as exc:
            await _abort_aio(context, exc)

    def _speculate(self, request: pb.SpeculateRequest) -> pb.SpeculateResponse:
        ctx = list(request.context.ids) if request.HasField("context") else None
        appended = None
        if request.HasField("append"):
            if not request.session_id:
                raise InvalidArgument("append needs a session_id")
            kind = _kind(request.append_kind or pb.KIND_GENERATED)
            appended = self.engine.append(request.namespace, request.session_id, kind,
                                          list(request.append.ids))
        draft = self.engine.propose(
            request.namespace,
            request.session_id or None,
            ctx,
            request.max_tokens or None,
            _cost_profile(request.cost_profile) if request.HasField("cost_profile") else None,
        )
        resp = pb.SpeculateResponse(
            tokens=draft.tokens,
            parents=draft.parents,
            probs=draft.probs,
            match_len=draft.match_len,
            source=draft.source,
            sources=draft.sources,
            score=draft.score,
        )
        if appended is not None:
            resp.accepted = appended.accepted
            resp.session_tokens = appended.session_tokens
        else:
            resp.accepted = -1
        return resp

    async def SpeculateStream(
        self, request_iterator: AsyncIterator[pb.StepRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[pb.SpeculateResponse]:
        """See SpeculateStream in suffixd.proto. The hot path of a verifier: per message one
        engine.step (append + draft) and one response, on the event loop."""
        if self._open_streams >= self.max_streams:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{self.max_streams} SpeculateStream calls are open; the limit is "
                f"{self.max_streams} (close some, or use unary Speculate)",
            )
        self._open_streams += 1
        try:
            engine = self.engine
            step = engine.step
            Response = pb.SpeculateResponse
            loop = asyncio.get_running_loop()
            sess: Any = None
            ns = sid = ""
            drafter = None
            deferred: dict[int, Any] = {}  # sessions with deferred commits, awaited at the end
            # A message that fails is answered with its status, which ends the stream: the
            # client cannot tell which later messages it already sent would have applied.
            async for req in request_iterator:
                try:
                    rns, rsid = req.namespace, req.session_id
                    if sess is None or ((rns or rsid) and (rns != ns or rsid != sid)):
                        # The first message, or one naming another session: resolved and
                        # validated like any RPC naming it (namespaces stay isolated).
                        sess = engine.stream_session(rns, rsid)
                        ns, sid = rns, rsid
                    if req.HasField("cost_profile"):
                        drafter = engine.drafter_for(_cost_profile(req.cost_profile))
                    kind = KIND_NAMES.get(req.append_kind or pb.KIND_GENERATED)
                    if kind is None:
                        raise InvalidArgument(
                            "append_kind must be one of KIND_PROMPT, KIND_TOOL, "
                            "KIND_RESPONSE, KIND_GENERATED"
                        )
                    if kind == "response" and req.append:
                        # Ends the response: a new global-tree sequence whose id the
                        # engine waits for, so the whole step waits in the pool.
                        appended, draft = await loop.run_in_executor(
                            self.pool, step, sess, kind, req.append, req.max_tokens or None,
                            drafter, not req.no_draft, False)
                    else:
                        # Applied at once, its commit queued behind the session's earlier
                        # writes; a durable step's reply awaits that commit (a failed one
                        # is undone: _step_committed).
                        appended, draft = step(sess, kind, req.append, req.max_tokens or None,
                                               drafter, not req.no_draft, True,
                                               not req.defer_commit)
                        if appended is not None:
                            if req.defer_commit:
                                deferred[id(sess)] = sess
                            else:
                                await self._step_committed(sess, appended)
                except Exception as exc:
                    await _abort_aio(context, exc)
                if draft is not None:
                    resp = Response(tokens=draft.tokens, parents=draft.parents,
                                    probs=draft.probs, match_len=draft.match_len,
                                    sources=draft.sources, score=draft.score)
                    resp.source = draft.source
                else:
                    resp = Response()
                if appended is not None:
                    resp.accepted = appended.accepted
                    resp.session_tokens = appended.session_tokens
                else:
                    resp.accepted = -1
                    resp.session_tokens = int(sess.rec.get("tokens", 0))
                resp.durable_tokens = sess.durable_tokens
                yield resp
            # The client half-closed: the OK status promises that everything is committed.
            try:
                for s in deferred.values():
                    await self._committed(s, kick=True)
            except Exception as exc:
                await _abort_aio(context, exc)
        finally:
            self._open_streams -= 1

    async def _step_committed(self, sess: Any, appended: Any) -> None:
        """Await a durable step's own commit without blocking the loop. If it failed, the
        step is undone in the pool (engine.undo_step: the session's tree and record go
        back to what the store holds) and its refusal raised: nothing of it applied."""
        fut = appended.commit
        if fut is None:
            await self._committed(sess)
            return
        if not fut.done():
            waits = self._commit_waits
            if waits is None:
                waits = self._commit_waits = _CommitWaits(asyncio.get_running_loop())
            await waits.wait(fut)
        if fut.exception() is None:
            return
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.pool, self.engine.undo_step, sess, fut,
                                   appended.session_tokens)

    async def _committed(self, sess: Any, kick: bool = False) -> None:
        """Await the session's queued commits without blocking the loop (engine.wait_commits
        as a coroutine); Unavailable if one failed. ``kick``: they may be deferred (lazy)
        writes waiting for company; commit them now."""
        fut = sess.last_commit
        if fut is not None and not fut.done():
            if kick:
                self.engine.store.kick()
            waits = self._commit_waits
            if waits is None:
                waits = self._commit_waits = _CommitWaits(asyncio.get_running_loop())
            await waits.wait(fut)  # a failure is reported through write_error
        if sess.write_error is not None:
            self.engine.wait_commits(sess)  # raises Unavailable with the engine's message
            raise Unavailable("a commit failed")  # unreachable: wait_commits raised

    @rpc
    def Stats(self, request: pb.StatsRequest, context: grpc.ServicerContext) -> Any:
        """One page of namespaces (StatsRequest.page_size, and at most half the message
        limit), in name order, resuming after the name page_token carries."""
        page_size = request.page_size or DEFAULT_STATS_PAGE
        after = _page_after(request.page_token)
        total, remaining, window = self.engine.stats_page(request.namespace or None, after,
                                                          page_size)
        out = pb.StatsResponse(namespaces_total=total)
        if after is None:
            fleet = getattr(self.engine, "fleet", None)
            if fleet is not None:
                out.fleet_json = json.dumps(fleet.status())
            for m in self.engine.memory():
                out.memory.add(**m)
            out.process_memory_json = json.dumps(process_memory(self.engine))
        budget = self.engine.limits.max_message_bytes // 2 - out.ByteSize()
        st = self.engine.stats(request.namespace or None, request.session_id or None,
                               request.include_sessions, request.top_documents or 10,
                               names=window)
        size = done = 0
        for ns in window:
            e = st.get(ns)
            if e is not None:  # (None: dropped since the names were listed)
                nsm = _namespace_pb(ns, e)
                n = nsm.ByteSize() + 8  # the field's tag and length
                if out.namespaces and size + n > budget:
                    break  # the next page starts with it
                out.namespaces.append(nsm)
                size += n
            done += 1
        if done < remaining:
            out.next_page_token = _page_token(window[done - 1] if done else after)
        return out


def register(server: Any, engine: Engine,
             max_streams: int = DEFAULT_MAX_STREAMS) -> list[str]:
    """Add the servicer to the daemon's aio server (daemon/server/loop_server.py, LoopServer)."""
    servicer = SuffixdServicer(engine, max_streams, getattr(server, "thread_pool", None))
    pb_grpc.add_SuffixdServicer_to_server(servicer, server)
    return [pb.DESCRIPTOR.services_by_name["Suffixd"].full_name]
