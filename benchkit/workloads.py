"""Workloads as the benchmarks read them: session-shaped JSONL files, tokenized for the
replay protocol (``load_workload``, ``tokenized_workload``) or as an agent's turns (the
messages before each assistant turn: ``load_session_turns``, ``load_turns``,
``first_turns``), and whether a turn fits a context (``fits_side_by_side``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from suffixcache.replay import Message, Session

from .errors import BenchError

T = TypeVar("T", bound=tuple[str, Any])


def load_workload(path: Path, tokenizer: object, limit_sessions: int | None) -> list[Session]:
    """Reads a session-shaped JSONL workload and tokenizes it as the replay protocol says."""
    tokenize = tokenizer.tokenize  # type: ignore[attr-defined]
    headers: dict[str, list[int]] = {}
    sessions: list[Session] = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                raw_messages = obj["messages"]
                name = str(obj.get("session", f"line{lineno}"))
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise BenchError(f"{path}:{lineno}: not a workload session ({exc})") from None
            messages = []
            for m in raw_messages:
                role, content = str(m.get("role", "")), str(m.get("content", ""))
                if role not in headers:
                    headers[role] = tokenize("<" + role + ">\n")
                messages.append(Message(role, headers[role], tokenize(content)))
            sessions.append(Session(name, messages))
            if limit_sessions is not None and len(sessions) >= limit_sessions:
                break
    return sessions


def tokenized_workload(
    workload: Path, tokenizer_path: Path | None, limit_sessions: int | None
) -> list[Session]:
    """``load_workload`` with the vocabulary of the GGUF ``tokenizer_path`` (None: the
    embedded model's)."""
    from ..daemon.model import Tokenizer, resolve_model_path

    try:
        tokenizer = Tokenizer(resolve_model_path(tokenizer_path))
    except (FileNotFoundError, ValueError, RuntimeError) as exc:
        raise BenchError(f"cannot load the tokenizer: {exc}") from None
    return load_workload(workload, tokenizer, limit_sessions)


def load_session_turns(path: Path, sessions: int) -> list[tuple[str, list[dict[str, str]]]]:
    """Every assistant turn of the first ``sessions`` sessions, in order: (session, the
    messages before the turn), as an agent sends them (recorded history)."""
    turns: list[tuple[str, list[dict[str, str]]]] = []
    with path.open() as f:
        for n, line in enumerate(f):
            if n >= sessions:
                break
            if not line.strip():
                continue
            rec = json.loads(line)
            msgs = rec["messages"]
            turns += [(str(rec["session"]), msgs[:i]) for i, m in enumerate(msgs)
                      if m["role"] == "assistant"]
    return turns


def load_turns(path: Path, limit: int) -> list[tuple[str, list[dict[str, str]]]]:
    """The first ``limit`` assistant turns of the file, across sessions: (session, the
    messages before the turn)."""
    turns: list[tuple[str, list[dict[str, str]]]] = []
    with path.open() as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            msgs = rec["messages"]
            for i, m in enumerate(msgs):
                if m["role"] == "assistant":
                    turns.append((str(rec["session"]), msgs[:i]))
                    if len(turns) >= limit:
                        return turns
    return turns


def first_turns(todo: Sequence[T], k: int) -> list[T]:
    """The first ``k`` turns of each session (all for ``k`` 0), in order (as
    ``load_session_turns`` gives them: (session, ...) each)."""
    if k <= 0:
        return list(todo)
    seen: dict[str, int] = {}
    out = []
    for turn in todo:
        seen[turn[0]] = seen.get(turn[0], 0) + 1
        if seen[turn[0]] <= k:
            out.append(turn)
    return out


def fits_side_by_side(prompt_len: int, max_tokens: int, n_ctx: int) -> bool:
    """Whether a turn fits a session's context (each mode keeps its own KV slot)."""
    return prompt_len + max_tokens + 64 <= n_ctx
