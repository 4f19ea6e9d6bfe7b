"""`suffixd serve`: build the gRPC server, run it, shut it down.

* ``run(cfg)``: checks what needs no model (daemon/server/startup.py), locks the data directory
  and makes it owner-only (daemon/server/datadir.py), claims its Unix socket paths
  (``claim_sockets``: before the store opens, so a daemon refused a live daemon's socket
  leaves its store alone and says so at once), opens the Engine, joins the fleet, builds
  the server, starts the HTTP front, writes ``<data dir>/daemon.json`` (the pid and the
  bound addresses) once serving; on SIGTERM/SIGINT stops accepting, ends the in-flight
  generations at their next step (their clients are told the daemon is stopping), lets
  the other in-flight RPCs finish (grace period), then closes the engine (counters
  flushed, LMDB closed cleanly), all within ``--stop-timeout`` (daemon/server/stopping.py:
  past it, what still runs is abandoned and the process exits); the same stop, exit
  status 2, when the background rebuild finds the store unreadable (damaged pages).
* ``build_server(engine, cfg, claimed=None)``: one LoopServer
  (daemon/server/loop_server.py: a ``grpc.aio`` server on an event loop of its own
  thread) with suffixd.v1.Suffixd, the standard health service (everything SERVING
  but suffixd.v1.Generator, which is NOT_SERVING until a generation can be served:
  ``Generation.when_ready``), server reflection and the extra services listed in
  EXTRA_SERVICES (one line per daemon module), bound to the listeners: a Unix socket
  (default ``<data dir>/suffixd.sock``, mode 0600, one daemon per socket path) and/or
  TCP (``HOST:PORT``), which requires a bearer token unless ``insecure`` is set
  explicitly; optional TLS on TCP.

The log lines are daemon/common/logs.py's (``configure``); the configuration (``ServeConfig``,
``ServeError``, listeners) is daemon/server/serve_config.py.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ..common.config import default_socket_path
from ..grpc_api.registrar import ServiceRegistrar
from . import malloc_tuning
from .auth import BearerTokenInterceptor
from .datadir import DataDirLock, check_store_dir, owner_only, write_private
from .loop_server import LoopServer
from .serve_config import Listener, ServeConfig, ServeError, parse_listen
from .startup import check_draft_vocabulary, preflight, preload_generator
from .stopping import StopClock, stop_generation

log = logging.getLogger("suffixd.server")

# ---------------------------------------------------------------------------------------
# EXTRA SERVICES: other daemon modules add ONE line each: "module:function", where
# function(server: LoopServer, engine: Engine) -> list[str] registers its servicer(s)
# and returns their full service names (for reflection and Info). A module that is not
# present in this installation is skipped.
EXTRA_SERVICES: list[str] = [
    "suffixd.daemon.grpc_api.corpus_service:register",
    "suffixd.daemon.server.metrics:register",
    "suffixd.daemon.grpc_api.generate_service:register",
    "suffixd.daemon.server.history:register",
    "suffixd.daemon.server.malloc_tuning:register",
]
# ---------------------------------------------------------------------------------------
GENERATOR_SERVICE = "suffixd.v1.Generator"  # NOT_SERVING in gRPC health until ready


def _load_extra(spec: str) -> Callable[[ServiceRegistrar, Any], list[str] | None] | None:
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            return None
        raise
    fn: Callable[[ServiceRegistrar, Any], list[str] | None] = getattr(module, attr)
    return fn


def _listeners(cfg: ServeConfig) -> list[Listener]:
    return [parse_listen(s) for s in cfg.listen] or [
        Listener("unix", str(default_socket_path(cfg.data_dir)))
    ]


def build_server(engine: Any, cfg: ServeConfig,
                 claimed: dict[str, DataDirLock] | None = None,
                 ) -> tuple[LoopServer, list[Listener]]:
    """Create the server, register every service and bind the listeners (not started).
    ``claimed``: Unix socket paths already claimed (``claim_sockets``); the server takes
    their locks over (``server.socket_locks``)."""
    listeners = _listeners(cfg)
    claimed = dict(claimed or {})
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
        bound = _setup(server, engine, cfg, listeners, claimed)
    except BaseException:
        server.stop(0)  # its loop thread and pool too
        for lock in [*server.socket_locks, *claimed.values()]:
            lock.release()
        raise
    return server, bound


def _setup(server: LoopServer, engine: Any, cfg: ServeConfig,
           listeners: list[Listener], claimed: dict[str, DataDirLock]) -> list[Listener]:
    """Register every service on ``server`` and bind the listeners."""
    from ..grpc_api import suffixd_service as service

    names = service.register(server, engine, cfg.max_streams)
    for spec in EXTRA_SERVICES:
        fn = _load_extra(spec)
        if fn is not None:
            names.extend(fn(server, engine) or [])
    engine.extra_services = [n for n in names if n != "suffixd.v1.Suffixd"]

    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    # The Generator is SERVING once a generation can be served (the model loaded; with
    # --model none never): before, a Generate waits for the load, so a client or load
    # balancer checking it must not send one yet. The daemon itself ("") and the
    # draft-cache services serve from the start: they need no model.
    generation = getattr(engine, "generator", None)
    gen_ready = generation is not None and generation.loaded is not None
    serving_ = health_pb2.HealthCheckResponse.SERVING

    async def serving() -> None:
        for n in ["", *names]:
            up = n != GENERATOR_SERVICE or gen_ready
            await health_servicer.set(
                n, serving_ if up else health_pb2.HealthCheckResponse.NOT_SERVING)

    server.call(serving())
    if generation is not None and GENERATOR_SERVICE in names and not gen_ready:
        generation.when_ready(
            lambda: server.call_soon(health_servicer.set(GENERATOR_SERVICE, serving_)))
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
            lock = claimed.pop(str(path), None) or claim_socket(path)
            server.socket_locks.append(lock)
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


def _warn_open_listeners(cfg: ServeConfig, bound: list[Listener]) -> None:
    """A gRPC listener off loopback without a token (--insecure), by its address: the
    generic --insecure line does not say which ports are open to others (the HTTP front
    says so of itself, daemon/http_api/app.py)."""
    tcp = [lst for lst in bound if lst.kind == "tcp"]
    if cfg.auth_token or not tcp:
        return
    from ..http_api.app import _is_loopback

    for lst in tcp:
        if not _is_loopback(lst.address.rpartition(":")[0].strip("[]")):
            log.warning("the gRPC listener at %s has no token: anyone who can reach the "
                        "port can use the daemon", lst.address)


def claim_socket(path: Path) -> DataDirLock:
    """Take the Unix socket path ``path`` for this daemon: one daemon per socket path,
    whatever its data dir (a lock beside the socket, held while serving); a socket that
    still answers is never taken over, and one left by a crashed daemon is removed only
    when nothing answers. ServeError when another daemon has it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = DataDirLock(path.parent, path.with_name(path.name + ".lock"))
    lock.acquire()
    try:
        if path.is_socket():
            if unix_socket_answers(path):
                raise ServeError(f"{path} is the socket of a running daemon; refusing to "
                                 "take it over (stop it or listen elsewhere)")
            path.unlink()
        elif path.exists():
            raise ServeError(f"{path} exists and is not a socket")
    except BaseException:
        lock.release()
        raise
    return lock


def claim_sockets(cfg: ServeConfig) -> dict[str, DataDirLock]:
    """Every Unix socket path the daemon will listen on, claimed (``claim_socket``) by
    path: before the store opens and the trees rebuild (minutes for a large store), so a
    daemon that cannot serve there refuses at once and leaves its data dir alone."""
    claimed: dict[str, DataDirLock] = {}
    try:
        for lst in _listeners(cfg):
            if lst.kind == "unix" and lst.address not in claimed:
                claimed[lst.address] = claim_socket(Path(lst.address))
    except BaseException:
        for lock in claimed.values():
            lock.release()
        raise
    return claimed


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
    """--fleet: replicate the global and corpus trees through Redis (daemon/fleet/node.py)."""
    import socket

    from ..fleet.config import FleetConfig, FleetError
    from ..fleet.node import Fleet

    options = dict(cfg.extra.get("fleet_options") or {})
    try:
        Fleet(engine, FleetConfig(url=cfg.extra["fleet"],
                                  node_id=cfg.extra.get("node_id") or socket.gethostname(),
                                  **options)).start()
    except FleetError as exc:
        raise ServeError(str(exc)) from None


def _exit_status(engine: Any) -> int:
    """2 when the stop was the background rebuild's failure (the blocking rebuild's
    refusal exits 2 too), else 0."""
    return 2 if engine.rebuild_error is not None else 0


def run(cfg: ServeConfig, ready: Callable[[list[Listener]], None] | None = None) -> int:
    """Serve until SIGTERM/SIGINT (0), or until a background rebuild finds the store
    unreadable (2). Raises ServeError for a start-up problem."""
    from suffixcache.store import StoreError

    from ..engine import Engine

    started = time.monotonic()
    # Before the daemon's threads exist: the arena cap applies to arenas made later
    # (daemon/server/malloc_tuning.py: what held RSS growing under a soak's load).
    malloc_tuning.tune()
    # From the start: a SIGTERM during start-up (the store opening, the trees loading)
    # ends it cleanly too, instead of Python's default of dying mid-write.
    stop = threading.Event()
    clock = StopClock(cfg.stop_timeout_s, stop)

    def on_signal(signum: int, frame: Any) -> None:
        log.info("signal received, shutting down", extra={"signal": signum})
        clock.signalled()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    cfg.data_dir = Path(cfg.data_dir).expanduser()
    cfg.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    preflight(cfg)  # seconds before the model loads and the trees rebuild
    # after the preflight: a mistake it finds is the one line the command prints
    log.info("starting", extra={"data_dir": str(cfg.data_dir), "pid": os.getpid()})
    owner_only(cfg.data_dir)
    if cfg.insecure:
        log.warning("--insecure: TCP and HTTP listeners accept anyone who can reach them, "
                    "without a token")
    lock = DataDirLock(cfg.data_dir)
    lock.acquire()
    try:
        check_store_dir(cfg.data_dir / "store")
        claimed = claim_sockets(cfg)
    except BaseException:
        lock.release()
        raise
    announce = cfg.data_dir / "daemon.json"
    engine = None
    server = None
    http = None
    bound: list[Listener] = []
    socket_locks: list[DataDirLock] = []
    try:
        t0 = time.perf_counter()
        try:
            # A background rebuild that cannot read the store (it logs the one line the
            # blocking one is refused with) stops the daemon: the data it acknowledged
            # would never be served.
            engine = Engine(cfg.data_dir, model_path=cfg.model, limits=cfg.limits,
                            cache_config=cfg.cache, sync=cfg.sync,
                            background_rebuild=cfg.background_rebuild,
                            on_rebuild_failure=lambda exc: stop.set())
        except StoreError as exc:
            # another tokenizer's data, a store file that is a link, empty, truncated or
            # damaged: the message names the file and the way out
            raise ServeError(str(exc)) from None
        except FileNotFoundError as exc:
            raise ServeError(str(exc)) from None
        engine.serve_config = cfg  # type: ignore[attr-defined]
        engine.serve_started = started  # type: ignore[attr-defined]  # "generation ready" line
        if cfg.extra.get("fleet"):
            start_fleet(engine, cfg)
        draft_model = cfg.extra.get("draft_model")
        if draft_model:
            check_draft_vocabulary(engine, Path(draft_model))
            engine.draft_model_path = Path(draft_model)  # type: ignore[attr-defined]
        server, bound = build_server(engine, cfg, claimed)
        claimed = {}  # the server holds them now
        _warn_open_listeners(cfg, bound)
        generator = getattr(engine, "generator", None)
        if generator is not None:  # what the stop's last warning lists
            clock.running = generator.still_running
        socket_locks = server.socket_locks
        if stop.is_set():
            return _exit_status(engine)
        if cfg.extra.get("http"):
            from ..http_api.app import start_http

            try:
                http = start_http(engine, str(cfg.extra["http"]), token=cfg.auth_token,
                                  insecure=cfg.insecure,
                                  max_body_bytes=cfg.limits.max_message_bytes,
                                  allowed_hosts=cfg.extra.get("allowed_hosts") or ())
            except (ValueError, OSError) as exc:
                raise ServeError(str(exc)) from None
        freeze_startup_objects()
        server.start()
        write_private(announce, json.dumps({
            "pid": os.getpid(),
            "listen": [b.target for b in bound],
            "http": f"http://{http.address}/v1" if http is not None else None,
            "started_at": time.time(),
        }))
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
        clock.phase = "ending the generations"  # (the next thing it does)
        while not stop.wait(0.5):
            pass
        server.enter_graceful_shutdown()
        # The generations end at their next step, told why (UNAVAILABLE, 503, a final
        # error event), before the fronts close: waiting for their own end took longer
        # than an orchestrator's grace period, and a stream still open when the HTTP
        # front closed was cut with a traceback.
        generation = getattr(engine, "generator", None)
        if generation is not None:
            generation.stop(clock.left(clock.reserve))
        if http is not None:
            clock.phase = "closing the HTTP front"
            http.stop(clock.left(clock.reserve))
            http = None
        clock.phase = "stopping the gRPC server"
        server.stop(min(cfg.grace_s, clock.left(clock.reserve)),
                    settle_s=clock.reserve / 4).wait()
        server = None
        return _exit_status(engine)
    finally:
        if http is not None:
            http.stop(clock.left(clock.reserve))
        if server is not None:
            server.stop(0)
        abandoned: list[str] = []
        if engine is not None:
            clock.phase = "freeing the model"
            # what is left but a moment for closing the engine (fast: a flush and a close)
            abandoned = stop_generation(engine, clock.left(clock.reserve / 4))
            clock.phase = "closing the engine"
            engine.close()
        with contextlib.suppress(OSError):
            announce.unlink()
        for b in bound:
            if b.kind == "unix":
                with contextlib.suppress(OSError):
                    Path(b.address).unlink()
        for socket_lock in [*socket_locks, *claimed.values()]:
            socket_lock.release()
        lock.release()
        log.info("stopped")
        if abandoned:
            # The store is closed and flushed; what remains is a thread that may be inside
            # llama.cpp, which the C library's exit handlers would crash under.
            clock.abandon(abandoned, "freeing the model")
        clock.finished()
