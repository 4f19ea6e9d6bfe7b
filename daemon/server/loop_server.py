"""One ``grpc.aio`` server on an event loop of its own thread, driven from sync code.

The hot path (SpeculateStream, Speculate) runs as coroutines on that loop: one thread
does all of its RPC work, with no hand-over to a worker thread per message. Every other
handler is an ordinary (sync) function that gRPC runs in the server's thread pool, so a
slow one (Generate runs the model for seconds, warm ingests a corpus) never blocks the
loop. Measured on the 2-core machine, 16 SpeculateStream clients: the sync server (one
pool thread per stream, a GIL hand-over per message) spent ~500 us of daemon CPU per
step, the loop ~200 us. A sync handler that streams its replies (a generator function)
is bridged: it runs in the pool, one reply at a time through a queue, and its aborts
become the RPC's status once the replies before them are sent.

Interface: ``LoopServer(max_workers, interceptors, options, maximum_concurrent_rpcs)``
with the sync server's verbs (``start()``, ``stop(grace)``, ``add_insecure_port``,
``add_secure_port``, ``add_generic_rpc_handlers``, ``add_registered_method_handlers``),
plus ``call(coro)`` / ``call_sync(fn, *args)`` (run on the loop and wait),
``enter_graceful_shutdown()``, ``thread_pool``, ``loop``, ``server`` (the aio server),
``health_servicer`` and ``socket_locks`` (the locks of the Unix sockets it listens on).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable, Coroutine
from concurrent import futures
from typing import Any, TypeVar

import grpc
import grpc.aio

from .datadir import DataDirLock

T = TypeVar("T")


# How long a stop waits for the loop's last tasks (grpc's per-RPC wrappers that finish
# after server.stop returns: sending a status, a sync handler's executor future).
SETTLE_S = 2.0


async def _settle_tasks(timeout: float) -> None:
    """Let the loop's remaining tasks finish, then cancel and await what is left, so that
    none is still suspended when the loop closes: grpc's RPC wrapper coroutine closed
    that way logs "Exception not handled by _handle_exceptions ... GeneratorExit" with a
    traceback after the daemon said it stopped."""
    me = asyncio.current_task()
    pending = {t for t in asyncio.all_tasks() if t is not me}
    if pending:
        _, pending = await asyncio.wait(pending, timeout=timeout)
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.wait(pending, timeout=timeout)


class _ThreadAbort(grpc.RpcError):
    """Raised in a pool thread by _ThreadContext.abort; the loop side sends the status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.status_code = code
        self.status_details = details


class _Gone(Exception):
    """The RPC ended (cancelled, server stopping) while a pool thread still produced."""


class _ThreadContext:
    """The servicer context a sync streaming handler sees in a pool thread: the sync
    server's verbs over the RPC's asyncio context (see _bridge_streaming)."""

    def __init__(self, context: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._context = context
        self._loop = loop

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise _ThreadAbort(code, details)

    def add_callback(self, callback: Callable[[], None]) -> bool:
        self._context.add_done_callback(lambda _ctx: callback())
        return True

    def is_active(self) -> bool:
        return not self._context.done()

    def __getattr__(self, name: str) -> Any:
        # set_code, set_details, invocation_metadata, peer, time_remaining, ...
        return getattr(self._context, name)


def _wait_on_loop(coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop,
                  gone: threading.Event) -> T:
    """From a pool thread: run ``coro`` on the loop and wait, unless the RPC ended."""
    fut = asyncio.run_coroutine_threadsafe(coro, loop)
    while True:
        try:
            return fut.result(0.5)
        except futures.TimeoutError:
            if gone.is_set():
                fut.cancel()
                raise _Gone() from None


class _ThreadRequests:
    """The request iterator of a request-streaming RPC, read from a pool thread."""

    def __init__(self, requests: Any, loop: asyncio.AbstractEventLoop,
                 gone: threading.Event) -> None:
        self._it = requests.__aiter__()
        self._loop = loop
        self._gone = gone

    def __iter__(self) -> _ThreadRequests:
        return self

    async def _next(self) -> Any:
        return await self._it.__anext__()

    def __next__(self) -> Any:
        try:
            return _wait_on_loop(self._next(), self._loop, self._gone)
        except StopAsyncIteration:
            raise StopIteration from None


def _bridge_streaming(fn: Callable[..., Any], request_streaming: bool) -> Callable[..., Any]:
    """A sync response-streaming handler (a generator function) as an async generator:
    the generator runs in the server's pool, one reply at a time through a queue, and
    its aborts become the RPC's status once the replies before them are sent. (grpc.aio's
    own migration runs the generator ahead of the writes, and an abort racing a pending
    write fails with GRPC_CALL_ERROR_TOO_MANY_OPERATIONS.)"""

    async def handler(request: Any, context: Any) -> Any:
        loop = asyncio.get_running_loop()
        gone = threading.Event()
        replies: asyncio.Queue[tuple[int, Any]] = asyncio.Queue(maxsize=1)

        def produce() -> None:
            arg = _ThreadRequests(request, loop, gone) if request_streaming else request
            gen = fn(arg, _ThreadContext(context, loop))
            try:
                try:
                    for item in gen:
                        _wait_on_loop(replies.put((0, item)), loop, gone)
                    out: tuple[int, Any] = (1, None)
                except _Gone:
                    return
                except BaseException as exc:  # handed to the loop side, which raises it
                    out = (2, exc)
                _wait_on_loop(replies.put(out), loop, gone)
            except _Gone:
                pass
            finally:
                gen.close()

        done = loop.run_in_executor(None, produce)
        try:
            while True:
                kind, value = await replies.get()
                if kind == 0:
                    yield value
                elif kind == 1:
                    break
                elif isinstance(value, _ThreadAbort):
                    await context.abort(value.status_code, value.status_details)
                else:
                    raise value
        finally:
            gone.set()
            while not replies.empty():  # unblock a producer waiting to put
                replies.get_nowait()
        await done

    return handler


def _bridged(handler: Any) -> Any:
    """``handler`` with a sync response-streaming function bridged (see above)."""
    if handler is None or not handler.response_streaming:
        return handler
    attr = "stream_stream" if handler.request_streaming else "unary_stream"
    fn = getattr(handler, attr)
    if inspect.isasyncgenfunction(fn) or inspect.iscoroutinefunction(fn):
        return handler
    return handler._replace(**{attr: _bridge_streaming(fn, handler.request_streaming)})


class _BridgedGenericHandler(grpc.GenericRpcHandler):
    def __init__(self, inner: grpc.GenericRpcHandler) -> None:
        self._inner = inner

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        return _bridged(self._inner.service(handler_call_details))


class LoopServer:
    """A ``grpc.aio`` server on an event loop running in a thread of its own, driven from
    ordinary (sync) code with the sync server's verbs: ``start()``, ``stop(grace)`` (its
    ``.wait()`` returns at once: stop waits itself), ``add_insecure_port`` and the
    registration calls the generated ``add_*Servicer_to_server`` functions make.

    Coroutine handlers run on the loop; sync handlers run in ``thread_pool`` (gRPC's
    migration pool), which the async handlers also use for work that may block
    (``run_in_executor``)."""

    def __init__(self, max_workers: int, interceptors: list[Any], options: list[Any],
                 maximum_concurrent_rpcs: int | None) -> None:
        self.thread_pool = futures.ThreadPoolExecutor(max_workers=max_workers,
                                                      thread_name_prefix="rpc")
        # Locks on the Unix socket paths it listens on (released by whoever removes the
        # sockets: run(), after the server stopped).
        self.socket_locks: list[DataDirLock] = []
        self.loop = asyncio.new_event_loop()
        # run_in_executor(None, ...) on the loop (bridged handlers, the servicers' blocking
        # steps) shares the pool of the sync handlers.
        self.loop.set_default_executor(self.thread_pool)
        self._thread = threading.Thread(target=self._run_loop, name="rpc-loop", daemon=True)
        self._thread.start()
        self._stopped = threading.Event()
        self._started = False
        self.health_servicer: Any = None

        async def make() -> grpc.aio.Server:
            return grpc.aio.server(
                migration_thread_pool=self.thread_pool,
                interceptors=interceptors,
                options=options,
                maximum_concurrent_rpcs=maximum_concurrent_rpcs,
            )

        self.server = self.call(make())

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def call_soon(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Schedule a coroutine on the server's loop without waiting for it (from any
        thread); dropped once the loop is closed."""
        try:
            asyncio.run_coroutine_threadsafe(coro, self.loop)
        except RuntimeError:
            coro.close()

    def call_sync(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a function on the loop's thread (the aio server's methods belong there)."""

        async def go() -> T:
            return fn(*args)

        return self.call(go())

    # What the generated add_*Servicer_to_server functions call. Sync unary handlers run
    # in the pool through grpc.aio's migration; sync streaming-reply ones are bridged.
    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self.call_sync(self.server.add_generic_rpc_handlers,
                       tuple(_BridgedGenericHandler(h) for h in handlers))

    def add_registered_method_handlers(self, service_name: str, handlers: Any) -> None:
        self.call_sync(self.server.add_registered_method_handlers, service_name,
                       {name: _bridged(h) for name, h in handlers.items()})

    def add_insecure_port(self, address: str) -> int:
        return int(self.call_sync(self.server.add_insecure_port, address))

    def add_secure_port(self, address: str, credentials: grpc.ServerCredentials) -> int:
        return int(self.call_sync(self.server.add_secure_port, address, credentials))

    def start(self) -> None:
        self.call(self.server.start())
        self._started = True

    def enter_graceful_shutdown(self) -> None:
        """Health checks answer NOT_SERVING from now on."""
        if self.health_servicer is not None and not self._stopped.is_set():
            self.call(self.health_servicer.enter_graceful_shutdown())

    def stop(self, grace: float | None, settle_s: float = SETTLE_S) -> threading.Event:
        """Stop accepting RPCs, let in-flight ones finish for up to ``grace`` seconds, then
        cancel the rest, and give the loop's last tasks up to twice ``settle_s``; returns
        once stopped (the Event is set)."""
        if not self._stopped.is_set():
            try:
                if self._started:
                    self.call(self.server.stop(grace))
                    self.call(_settle_tasks(settle_s))
            finally:
                self.loop.call_soon_threadsafe(self.loop.stop)
                self._thread.join()
                self.thread_pool.shutdown(wait=False, cancel_futures=True)
                self.loop.close()
                self._stopped.set()
        return self._stopped
