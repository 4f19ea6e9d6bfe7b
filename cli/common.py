"""What the client commands (generate, warm, stats, sessions) share: how they find the
daemon (--address/--socket/--data-dir/--auth-token) and how a failed call reads (one
line, the same in every command, with a hint when the daemon is not running)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click
import grpc


def resolve_target(address: str | None, socket: str | None, data_dir: str | None) -> str | None:
    """--address, else --socket, else --data-dir's socket; None lets the Client decide
    ($SUFFIXD_ADDRESS, else the default data dir's socket)."""
    if address:
        return address
    if socket:
        return "unix:" + os.path.abspath(socket)
    if data_dir:
        from suffixd.daemon.common.config import default_socket_path

        return "unix:" + str(default_socket_path(Path(data_dir).absolute()))
    return None


def connect(address: str | None, socket: str | None, data_dir: str | None,
            token: str | None, **kwargs: Any) -> Any:
    from suffixd.client import Client

    return Client(resolve_target(address, socket, data_dir), token=token or None, **kwargs)


def connection_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--address/--socket/--data-dir/--auth-token, shared by the client commands."""
    fn = click.option("--auth-token", envvar="SUFFIXD_AUTH_TOKEN", default=None,
                      help="Bearer token for a TCP daemon (env SUFFIXD_AUTH_TOKEN).")(fn)
    fn = click.option("--data-dir", type=click.Path(file_okay=False), default=None,
                      help="Daemon data directory whose socket to use (default: XDG).")(fn)
    fn = click.option("--socket", "socket_path", type=click.Path(dir_okay=False), default=None,
                      help="Unix socket of the daemon.")(fn)
    fn = click.option("--address", default=None,
                      help="Daemon address: unix:PATH or HOST:PORT (env SUFFIXD_ADDRESS).")(fn)
    return fn


def describe_error(exc: Exception, target: str) -> str:
    """One clear line for a failed RPC (grpc.RpcError or the client's SuffixdError)."""
    code = getattr(exc, "code", None)
    code = code() if callable(code) else code
    details = getattr(exc, "details", None)
    details = details() if callable(details) else (details or str(exc))
    if code == grpc.StatusCode.UNAVAILABLE and _unreachable(str(details)):
        where = target[len("unix:"):] if target.startswith("unix:") else target
        return (f"the daemon is not running at {where} (start it with `suffixd serve`, "
                "or point --address/--socket/--data-dir at a running one)")
    name = code.name if isinstance(code, grpc.StatusCode) else type(exc).__name__
    return f"{details} ({name})"


def _unreachable(details: str) -> bool:
    # gRPC's texts for "nobody listens there" (no socket file, refused, no route).
    d = details.lower()
    return any(s in d for s in ("failed to connect", "no such file", "connection refused",
                                "connect failed", "unavailable", "deadline"))


def fail(exc: Exception, target: str) -> NoReturn:
    """Exit with the one-line description of a failed call (click prints "Error: ...")."""
    raise click.ClickException(describe_error(exc, target)) from None
