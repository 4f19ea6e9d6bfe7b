"""Daemon configuration: limits and defaults shared by the engine, server and CLI."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


def default_data_dir() -> Path:
    """``$XDG_DATA_HOME/suffixd``, i.e. ``~/.local/share/suffixd`` by default."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "suffixd"


def default_socket_path(data_dir: str | Path) -> Path:
    return Path(data_dir) / "suffixd.sock"


@dataclass(frozen=True)
class Limits:
    """Limits enforced on every request; violations are answered with a clear status."""

    # gRPC receive limit; larger messages get RESOURCE_EXHAUSTED from gRPC itself.
    max_message_bytes: int = 16 << 20
    # Tokens in one Append / AppendBatch / IngestStream message / Speculate context.
    max_tokens_per_call: int = 1 << 20
    max_sessions_per_namespace: int = 10_000
    # Namespaces holding any state: open sessions, global or corpus sequences, stored
    # counters (a Speculate in a new namespace creates them), corpus files.
    max_namespaces: int = 1_000
    # Session trees in memory (~90 bytes a token): one session, and all of them. An append
    # that would go past one is refused (RESOURCE_EXHAUSTED, naming the limit); the bytes
    # are the trees' measured size, checked before each append.
    max_session_tokens: int = 2_000_000
    max_session_bytes: int = 256 << 20
    max_total_session_tokens: int = 16_000_000
    max_total_session_bytes: int = 2 << 30
    # Sessions untouched for this long are closed (responses kept). 0 disables.
    session_idle_timeout_s: float = 24 * 3600.0
    max_draft_tokens: int = 256
    max_name_bytes: int = 256
    max_metadata_entries: int = 64
    max_metadata_bytes: int = 16 << 10
    max_text_bytes: int = 8 << 20


@dataclass(frozen=True)
class CacheConfig:
    max_depth: int = 64
    global_budget_tokens: int = 4_000_000
    default_draft_tokens: int = 32
