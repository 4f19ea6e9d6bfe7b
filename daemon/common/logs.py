"""Structured logs: one line per event, ``key=value`` for people or JSON for machines.

Code logs events with fields instead of prose::

    from suffixd.daemon.common.logs import event
    event(log, "corpus.warm", ns="sql", files=3, tokens=1200)

which renders as ``2026-11-23T09:50:01.123Z INFO suffixd.corpus corpus.warm ns=sql
files=3 tokens=1200`` or, with ``configure(json_lines=True)``, as
``{"ts": "...", "level": "info", "logger": "suffixd.corpus", "event": "corpus.warm",
"ns": "sql", "files": 3, "tokens": 1200}``. Plain ``log.info("text")`` calls from
other modules and libraries become events too (the message is the event), so
a log pipeline never sees a multi-line or unstructured record.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import IO, Any

# LogRecord attributes that are not user fields (anything else set via `extra` is one).
_STD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


def event(logger: logging.Logger, name: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log one event with structured fields.

    Fields become plain attributes of the record (``extra``), which is what any
    structured formatter renders, including the daemon's own; names that clash
    with LogRecord attributes get a ``field_`` prefix instead of raising.
    """
    if logger.isEnabledFor(level):
        extra = {(f"field_{k}" if k in _STD else k): v for k, v in fields.items()}
        logger.log(level, name, extra=extra, stacklevel=2)


def _timestamp(created: float) -> str:
    ms = int((created % 1) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{ms:03d}Z"


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items() if k not in _STD and not k.startswith("_")}


def _plain(value: Any) -> str:
    s = value if isinstance(value, str) else json.dumps(value, default=str)
    if s == "" or any(c.isspace() or c in '"=' for c in s):
        return json.dumps(s)  # quoted, with newlines escaped: the line stays one line
    return s


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        parts = [
            _timestamp(record.created),
            record.levelname,
            record.name,
            _plain(record.getMessage()),
        ]
        parts += [f"{k}={_plain(v)}" for k, v in _fields(record).items()]
        if record.exc_info:
            parts.append("exc=" + _plain(self.formatException(record.exc_info)))
        return " ".join(parts)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        obj: dict[str, Any] = {
            "ts": _timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        for k, v in _fields(record).items():
            obj[k if k not in obj else f"field_{k}"] = v
        if record.exc_info:
            obj["exc"] = self.formatException(record.exc_info)
        return json.dumps(obj, default=str, ensure_ascii=False)


def configure(
    level: int | str = "INFO", json_lines: bool = False, stream: IO[str] | None = None
) -> logging.Handler:
    """Route the ``suffixd`` loggers (and warnings of libraries) to one structured handler.

    Idempotent: calling it again replaces the handler it installed before.
    """
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else KeyValueFormatter())
    handler.set_name("suffixd-structured")
    root = logging.getLogger()
    for h in list(root.handlers):
        if h.get_name() == "suffixd-structured":
            root.removeHandler(h)
    root.addHandler(handler)
    lvl = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    if not isinstance(lvl, int):
        raise ValueError(f"unknown log level: {level}")
    logging.getLogger("suffixd").setLevel(lvl)
    # Records of suffixd loggers reach the handler whatever the root level; the root level
    # only filters other libraries' loggers, which are noise below WARNING unless debugging.
    root.setLevel(logging.WARNING if lvl >= logging.INFO else lvl)
    return handler
