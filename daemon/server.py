"""gRPC server setup for `suffixd serve`.

* Listeners: a Unix socket (default ``<data dir>/suffixd.sock``, mode 0600) and/or TCP
  (``HOST:PORT``), which requires a bearer token unless ``insecure`` is set explicitly;
  optional TLS on TCP.
* Services: suffixd.v1.Suffixd, the standard health service, server reflection, plus the
  extra services listed in EXTRA_SERVICES (one line per daemon module).
* One ``grpc.aio`` server on an event loop of its own thread (LoopServer). The hot path
  (SpeculateStream, Speculate) runs as coroutines on that loop: one thread does all of
  its RPC work, with no hand-over to a worker thread per message. Every other handler is
  an ordinary (sync) function that gRPC runs in the server's thread pool, so a slow one
  (Generate runs the model for seconds, warm ingests a corpus) never blocks the loop.
  Measured on the 2-core machine, 16 SpeculateStream clients: the sync server (one pool
  thread per stream, a GIL hand-over per message) spent ~500 us of daemon CPU per step,
  the loop ~200 us.
* One daemon per data directory (an exclusive ``flock`` on ``<data dir>/suffixd.lock``).
* Graceful shutdown on SIGTERM/SIGINT: stop accepting, let in-flight RPCs finish (grace
  period), then close the engine (counters flushed, LMDB closed cleanly).
* ``<data dir>/daemon.json`` announces the pid and the bound addresses once serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import gc
import importlib
import inspect
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from .auth import BearerTokenInterceptor
from .config import CacheConfig, Limits, default_socket_path

log = logging.getLogger("suffixd.server")

# ---------------------------------------------------------------------------------------
# EXTRA SERVICES: other daemon modules add ONE line each: "module:function", where
# function(server: LoopServer, engine: Engine) -> list[str] registers its servicer(s)
# and returns their full service names (for reflection and Info). A module that is not
# present in this installation is skipped.
EXTRA_SERVICES: list[str] = [
    # "suffixd.daemon.verifier:register",
    # "suffixd.daemon.corpus_service:register",
    "suffixd.daemon.corpus_service:register",
    "suffixd.daemon.metrics:register",
    "suffixd.daemon.generate_service:register",
]
# ---------------------------------------------------------------------------------------


class ServeError(Exception):
    """A configuration or start-up problem, reported to the user as one clear line."""


@dataclass
class ServeConfig:
    data_dir: Path
    listen: list[str] = field(default_factory=list)  # empty: the default Unix socket
    auth_token: str | None = None
    insecure: bool = False
    model: str | None = "default"
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # Threads for the sync handlers (everything but the hot path, see LoopServer).
    max_workers: int = 32
    # Open SpeculateStream calls at once (they run on the event loop; see daemon/service.py).
    max_streams: int = 64
    grace_s: float = 10.0
    limits: Limits = field(default_factory=Limits)
    cache: CacheConfig = field(default_factory=CacheConfig)
    sync: bool = True
    background_rebuild: bool = True
    extra: dict[str, Any] = field(default_factory=dict)  # options for extra services


def check_draft_vocabulary(engine: Any, path: Path) -> None:
    """Refuses a draft model whose vocabulary differs from the target's (its drafts
    would be token ids of another tokenizer)."""
    from .model import Tokenizer

    target = getattr(engine, "tokenizer", None)
    if target is None:
        raise ServeError("--draft-model needs a target model (not --model none)")
    try:
        draft = Tokenizer(path)
    except (OSError, ValueError, RuntimeError) as exc:
        raise ServeError(f"cannot load the draft model {path}: {exc}") from None
    if draft.fingerprint != target.fingerprint:
        raise ServeError(
            f"the draft model {path} does not share the target's vocabulary "
            f"({draft.vocab_size} tokens, fingerprint {draft.fingerprint} vs "
            f"{target.vocab_size} tokens, {target.fingerprint})"
        )


class DataDirLock:
    """Exclusive lock on a data directory, held for the daemon's lifetime."""

    def __init__(self, data_dir: Path, path: Path | None = None) -> None:
        self.path = path or data_dir / "suffixd.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise
            try:
                other = os.read(fd, 64).decode().strip() or "?"
            finally:
                os.close(fd)
            raise ServeError(
                f"another suffixd daemon (pid {other}) is already using the data directory "
                f"{self.path.parent}; stop it or pass another --data-dir"
                if self.path.name == "suffixd.lock" else
                f"another suffixd daemon (pid {other}) is listening on "
                f"{self.path.with_suffix('')}; stop it or listen elsewhere"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)
            self._fd = None


@dataclass
class Listener:
    kind: str  # "unix" or "tcp"
    address: str  # socket path, or host:port

    @property
    def target(self) -> str:
        return f"unix:{self.address}" if self.kind == "unix" else self.address


def parse_listen(spec: str) -> Listener:
    s = spec.strip()
    if s.startswith("unix://"):
        return Listener("unix", s[len("unix://"):])
    if s.startswith("unix:"):
        return Listener("unix", s[len("unix:"):])
    if s.startswith("tcp://"):
        s = s[len("tcp://"):]
    host, sep, port = s.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ServeError(f"--listen {spec!r}: expected unix:PATH or HOST:PORT")
    return Listener("tcp", s)


class JsonFormatter(logging.Formatter):
    _skip = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update({k: v for k, v in vars(record).items() if k not in self._skip})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class KeyValueFormatter(logging.Formatter):
    _skip = JsonFormatter._skip

    def format(self, record: logging.LogRecord) -> str:
        extra = " ".join(f"{k}={v}" for k, v in vars(record).items() if k not in self._skip)
        line = f"{time.strftime('%H:%M:%S', time.localtime(record.created))} " \
               f"{record.levelname.lower():5} {record.name}: {record.getMessage()}"
        if extra:
            line += " " + extra
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup_logging(json_logs: bool = False, level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_logs else KeyValueFormatter())
    root = logging.getLogger("suffixd")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def _load_extra(spec: str) -> Callable[[grpc.Server, Any], list[str] | None] | None:
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            return None
        raise
    fn: Callable[[grpc.Server, Any], list[str] | None] = getattr(module, attr)
    return fn


T = TypeVar("T")


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

    def stop(self, grace: float | None) -> threading.Event:
        """Stop accepting RPCs, let in-flight ones finish for up to ``grace`` seconds, then
        cancel the rest; returns once stopped (the Event is set)."""
        if not self._stopped.is_set():
            try:
                if self._started:
                    self.call(self.server.stop(grace))
            finally:
                self.loop.call_soon_threadsafe(self.loop.stop)
                self._thread.join()
                self.thread_pool.shutdown(wait=False, cancel_futures=True)
                self.loop.close()
                self._stopped.set()
        return self._stopped


def build_server(engine: Any, cfg: ServeConfig) -> tuple[LoopServer, list[Listener]]:
    """Create the server, register every service and bind the listeners (not started)."""

    listeners = [parse_listen(s) for s in cfg.listen] or [
        Listener("unix", str(default_socket_path(cfg.data_dir)))
    ]
    tcp = [lst for lst in listeners if lst.kind == "tcp"]
    token = cfg.auth_token
    if tcp and not token and not cfg.insecure:
        raise ServeError(
            "a TCP listener needs a bearer token (--auth-token or SUFFIXD_AUTH_TOKEN), "
            "or --insecure to accept anyone who can reach the port"
        )
    interceptors = [BearerTokenInterceptor(token)] if (tcp and token) else []
    options = [
        ("grpc.max_receive_message_length", cfg.limits.max_message_bytes),
        ("grpc.max_send_message_length", cfg.limits.max_message_bytes),
        # Two daemons must never share a port silently.
        ("grpc.so_reuseport", 0),
    ]
    server = LoopServer(cfg.max_workers, interceptors, options,
                        maximum_concurrent_rpcs=max(64, cfg.max_workers * 8))
    try:
        bound = _setup(server, engine, cfg, listeners)
    except BaseException:
        server.stop(0)  # its loop thread and pool too
        for lock in server.socket_locks:
            lock.release()
        raise
    return server, bound


def _setup(server: LoopServer, engine: Any, cfg: ServeConfig,
           listeners: list[Listener]) -> list[Listener]:
    """Register every service on ``server`` and bind the listeners."""
    from . import service

    names = service.register(server, engine, cfg.max_streams)
    for spec in EXTRA_SERVICES:
        fn = _load_extra(spec)
        if fn is not None:
            names.extend(fn(server, engine) or [])
    engine.extra_services = [n for n in names if n != "suffixd.v1.Suffixd"]

    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)

    async def serving() -> None:
        for n in ["", *names]:
            await health_servicer.set(n, health_pb2.HealthCheckResponse.SERVING)

    server.call(serving())
    server.health_servicer = health_servicer
    # The aio server itself: reflection picks its asyncio servicer from the server's type.
    server.call_sync(reflection.enable_server_reflection,
                     [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                      reflection.SERVICE_NAME],
                     server.server)

    bound: list[Listener] = []
    for lst in listeners:
        if lst.kind == "unix":
            path = Path(lst.address)
            path.parent.mkdir(parents=True, exist_ok=True)
            # One daemon per socket path, whatever its data dir (a lock beside the socket,
            # held while serving); a socket that still answers is never taken over, and
            # one left by a crashed daemon is removed only when nothing answers.
            lock = DataDirLock(path.parent, path.with_name(path.name + ".lock"))
            lock.acquire()
            server.socket_locks.append(lock)
            if path.is_socket():
                if unix_socket_answers(path):
                    raise ServeError(f"{path} is the socket of a running daemon; refusing to "
                                     "take it over (stop it or listen elsewhere)")
                path.unlink()
            elif path.exists():
                raise ServeError(f"{path} exists and is not a socket")
            # Create the socket with mode 0600 from the start (no window where it is open).
            old = os.umask(0o177)
            try:
                ok = server.add_insecure_port(lst.target)
            except RuntimeError as exc:
                raise ServeError(f"cannot listen on {lst.target}: {exc}") from None
            finally:
                os.umask(old)
            if not ok or not path.exists():
                raise ServeError(f"cannot listen on {lst.target}")
            os.chmod(path, 0o600)
            bound.append(lst)
        else:
            try:
                if cfg.tls_cert and cfg.tls_key:
                    creds = grpc.ssl_server_credentials(
                        [(Path(cfg.tls_key).read_bytes(), Path(cfg.tls_cert).read_bytes())]
                    )
                    port = server.add_secure_port(lst.address, creds)
                else:
                    port = server.add_insecure_port(lst.address)
            except RuntimeError as exc:
                raise ServeError(f"cannot listen on {lst.address}: {exc}") from None
            if not port:
                raise ServeError(f"cannot listen on {lst.address} (port in use?)")
            host = lst.address.rpartition(":")[0]
            bound.append(Listener("tcp", f"{host}:{port}"))
    return bound


def unix_socket_answers(path: Path) -> bool:
    """Whether something accepts connections on the Unix socket ``path``."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        try:
            sock.connect(str(path))
        except OSError:
            return False
    return True


def owner_only(data_dir: Path) -> None:
    """The data dir and everything in it owner-only (0700 / 0600), whatever modes an
    earlier run or an operator left: it holds the users' text and the store."""
    with contextlib.suppress(OSError):
        os.chmod(data_dir, 0o700)
    for root, dirs, files in os.walk(data_dir):
        for d in dirs:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(root, d), 0o700)
        for f in files:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(root, f), 0o600)


def freeze_startup_objects() -> None:
    """Move everything allocated so far (modules, the tokenizer's vocabulary, gRPC and
    protobuf machinery: ~50,000 objects) out of the cyclic garbage collector's reach.

    They live as long as the daemon, but every full (generation 2) collection walked them
    all again: 20-33 ms with the GIL held, measured under 16 clients at 3,000 steps/s,
    each one stalling every RPC and leaving a backlog that took a second to drain (the
    p99 of an open-loop run went from ~5 to ~50 ms). Frozen, a full collection walks only
    what was allocated since: the sessions and per-RPC objects."""
    gc.collect()
    gc.freeze()


def start_fleet(engine: Any, cfg: ServeConfig) -> None:
    """--fleet: replicate the global and corpus trees through Redis (daemon/fleet.py)."""
    import socket

    from .fleet import Fleet, FleetConfig, FleetError

    options = dict(cfg.extra.get("fleet_options") or {})
    try:
        Fleet(engine, FleetConfig(url=cfg.extra["fleet"],
                                  node_id=cfg.extra.get("node_id") or socket.gethostname(),
                                  **options)).start()
    except FleetError as exc:
        raise ServeError(str(exc)) from None


def run(cfg: ServeConfig, ready: Callable[[list[Listener]], None] | None = None) -> int:
    """Serve until SIGTERM/SIGINT. Raises ServeError for a start-up problem."""
    from suffixcache.store import TokenizerMismatchError

    from .engine import Engine

    cfg.data_dir = Path(cfg.data_dir).expanduser()
    cfg.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    from .startup import preflight, preload_generator

    preflight(cfg)  # seconds before the model loads and the trees rebuild
    owner_only(cfg.data_dir)
    if cfg.insecure:
        log.warning("--insecure: TCP and HTTP listeners accept anyone who can reach them, "
                    "without a token")
    lock = DataDirLock(cfg.data_dir)
    lock.acquire()
    announce = cfg.data_dir / "daemon.json"
    engine = None
    server = None
    http = None
    bound: list[Listener] = []
    socket_locks: list[DataDirLock] = []
    try:
        t0 = time.perf_counter()
        try:
            engine = Engine(cfg.data_dir, model_path=cfg.model, limits=cfg.limits,
                            cache_config=cfg.cache, sync=cfg.sync,
                            background_rebuild=cfg.background_rebuild)
        except TokenizerMismatchError as exc:
            raise ServeError(str(exc)) from None
        except FileNotFoundError as exc:
            raise ServeError(str(exc)) from None
        engine.serve_config = cfg  # type: ignore[attr-defined]
        if cfg.extra.get("fleet"):
            start_fleet(engine, cfg)
        draft_model = cfg.extra.get("draft_model")
        if draft_model:
            check_draft_vocabulary(engine, Path(draft_model))
            engine.draft_model_path = Path(draft_model)  # type: ignore[attr-defined]
        server, bound = build_server(engine, cfg)
        socket_locks = server.socket_locks
        stop = threading.Event()

        def on_signal(signum: int, frame: Any) -> None:
            log.info("signal received, shutting down", extra={"signal": signum})
            stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        if cfg.extra.get("http"):
            from .openai_api import start_http

            try:
                http = start_http(engine, str(cfg.extra["http"]), token=cfg.auth_token,
                                  insecure=cfg.insecure,
                                  max_body_bytes=cfg.limits.max_message_bytes)
            except (ValueError, OSError) as exc:
                raise ServeError(str(exc)) from None
        freeze_startup_objects()
        server.start()
        tmp = announce.with_suffix(".tmp")
        tmp.write_text(json.dumps({
            "pid": os.getpid(),
            "listen": [b.target for b in bound],
            "http": f"http://{http.address}/v1" if http is not None else None,
            "started_at": time.time(),
        }))
        os.replace(tmp, announce)
        log.info(
            "serving",
            extra={"listen": ",".join(b.target for b in bound),
                   "http": http.address if http is not None else "",
                   "model": str(engine.model_path or ""),
                   "rebuild_tokens": engine.rebuild_tokens,
                   "rebuild_s": round(engine.rebuild_seconds, 3),
                   "startup_s": round(time.perf_counter() - t0, 3)},
        )
        if cfg.extra.get("model_load", "first-use") == "startup":
            preload_generator(engine)
        if ready is not None:
            ready(bound)
        while not stop.wait(0.5):
            pass
        server.enter_graceful_shutdown()
        if http is not None:
            http.stop()
            http = None
        server.stop(cfg.grace_s).wait()
        server = None
        return 0
    finally:
        if http is not None:
            http.stop()
        if server is not None:
            server.stop(0)
        if engine is not None:
            engine.close()
        with contextlib.suppress(OSError):
            announce.unlink()
        for b in bound:
            if b.kind == "unix":
                with contextlib.suppress(OSError):
                    Path(b.address).unlink()
        for socket_lock in socket_locks:
            socket_lock.release()
        lock.release()
        log.info("stopped")
