"""What `suffixd serve` is asked to do: its configuration and listeners, and the error
that reports a start-up problem.

Interface: ``ServeConfig`` (everything ``daemon/server/serve.py:run`` needs), ``ServeError`` (a
configuration or start-up problem, reported to the user as one clear line),
``Listener`` and ``parse_listen`` (``unix:PATH`` or ``HOST:PORT``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..common.config import CacheConfig, Limits


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
    # Open SpeculateStream calls at once (they run on the event loop; see
    # daemon/grpc_api/suffixd_service.py).
    max_streams: int = 64
    grace_s: float = 10.0
    # From SIGTERM to exit at most (daemon/server/stopping.py); past it, what still runs
    # is abandoned.
    stop_timeout_s: float = 10.0
    limits: Limits = field(default_factory=Limits)
    cache: CacheConfig = field(default_factory=CacheConfig)
    sync: bool = True
    background_rebuild: bool = True
    extra: dict[str, Any] = field(default_factory=dict)  # options for extra services


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
