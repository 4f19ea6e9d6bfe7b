"""A fleet node's configuration and its side of Redis: the connection, the key names,
stream ids (the protocol is in daemon/fleet/node.py's docstring).

Interface: ``FleetConfig``; ``FleetError`` (a start-up problem: bad option, another
tokenizer); ``redact(url)`` (the URL without credentials, for logs and status);
``connect(cfg, url_shown)`` (a ``redis.Redis`` from the URL, the password from
``$SUFFIXD_REDIS_PASSWORD`` when the URL has none); ``RedisKeys`` (every key of one
fleet: ``<prefix>:<tokenizer tag>:...``); ``stream_id`` (a stream entry id as a
comparable pair).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit


class FleetError(Exception):
    """A fleet start-up problem (bad option, another tokenizer)."""


@dataclass
class FleetConfig:
    url: str
    node_id: str
    prefix: str = "suffixd"
    max_backlog: int = 100_000  # outbox entries kept while Redis is unreachable
    max_entries: int = 100_000  # stream length per namespace before snapshot + trim
    heartbeat_s: float = 1.0
    read_count: int = 512


def redact(url: str) -> str:
    """The URL without its credentials (for logs and status)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<invalid url>"
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, f"***@{host}", parts.path, "", ""))


def connect(cfg: FleetConfig, url_shown: str) -> Any:
    """A Redis client for ``cfg.url`` (no connection is made yet)."""
    import redis

    kwargs: dict[str, Any] = {"socket_timeout": 5.0, "socket_connect_timeout": 2.0}
    try:
        has_password = urlsplit(cfg.url).password is not None
    except ValueError:
        has_password = False
    if not has_password and os.environ.get("SUFFIXD_REDIS_PASSWORD"):
        kwargs["password"] = os.environ["SUFFIXD_REDIS_PASSWORD"]
    try:
        return redis.Redis.from_url(cfg.url, **kwargs)
    except ValueError as exc:
        # The message may quote the URL: name only the redacted one.
        raise FleetError(f"invalid --fleet URL {url_shown}: "
                         f"{str(exc).replace(cfg.url, url_shown)}") from None


def stream_id(s: bytes | str) -> tuple[int, int]:
    text = s.decode() if isinstance(s, bytes) else s
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


class RedisKeys:
    """The keys of one fleet in Redis; ``base`` is ``<prefix>:<tokenizer tag>``."""

    def __init__(self, prefix: str, base: str) -> None:
        self.base = base
        # the fleet's tokenizer, under the bare prefix: read before the tag is trusted
        self.fleet = f"{prefix}:fleet"
        self.namespaces = f"{base}:namespaces"
        self.nodes = f"{base}:nodes"

    def stream(self, ns: str) -> str:
        return f"{self.base}:log:{ns}"

    def ns_of(self, key: bytes | str) -> str:
        """The namespace of a stream key."""
        k = key.decode() if isinstance(key, bytes) else key
        return k[len(self.base) + 5:]

    def snap(self, ns: str) -> str:
        return f"{self.base}:snap:{ns}"

    def snapmeta(self, ns: str) -> str:
        return f"{self.base}:snapmeta:{ns}"

    def lock(self, ns: str) -> str:
        return f"{self.base}:lock:{ns}"
