"""llama.cpp's log, through this process's ``logging`` (logger ``suffixd.llama``).

llama-cpp-python installs a log callback of its own that prints to stderr by a level table
older than llama.cpp's (ggml renumbered its levels: DEBUG is 1, INFO 2, WARN 3, ERROR 4),
so debug lines printed as info and warnings as errors, between a command's own output
(``state_read_meta: cell_count = ...`` at every prompt-cache restore). ``route_llama_logs``
replaces it, once per process, wherever a model is loaded (the verifier, the tokenizer):
every complete line becomes one record of ``suffixd.llama`` at its own level, so the
daemon's handler (daemon/common/logs.py) formats it like any other line and ``--log-level``
filters it.

llama.cpp's INFO is its own bookkeeping (every key of the model file, buffer sizes,
context parameters: about a hundred lines per load), so it is logged at DEBUG with its
DEBUG lines; WARN and ERROR keep their levels, but for the warnings in ``_BENIGN``.
Every line, whatever its level, also goes to ``llama_buffers.BUFFERS``, which keeps the
sizes of the buffers llama.cpp makes (the process memory breakdown's ``llama_context``).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
from typing import Any

from .llama_buffers import BUFFERS

log = logging.getLogger("suffixd.llama")

# ggml_log_level (ggml.h): NONE 0 (unlevelled prints), DEBUG 1, INFO 2, WARN 3, ERROR 4,
# CONT 5 (continues the previous message: the level it had)
_LEVELS = {0: logging.DEBUG, 1: logging.DEBUG, 2: logging.DEBUG, 3: logging.WARNING,
           4: logging.ERROR}
_CONT = 5
# Warnings that tell an operator nothing to do, logged at DEBUG: the embedded gemma-3 (as
# many GGUF conversions) marks '</s>' as a normal token, which llama.cpp corrects itself
# at every load ("control-looking token: 212 '</s>' was not control-type; ... overridden").
_BENIGN = ("load: control-looking token:",)

_lock = threading.Lock()
_callback: Any = None  # the ctypes function llama.cpp holds: kept alive as long as it may call
_pending = threading.local()  # per thread: (level, the text of a line not ended yet)


def _receive(level: int, text: bytes | None) -> None:
    if level == _CONT:
        lvl, head = getattr(_pending, "line", (logging.DEBUG, ""))
    else:
        lvl, head = _LEVELS.get(level, logging.DEBUG), ""
        if getattr(_pending, "line", None):
            # a message that never ended its line: flushed before the next one starts
            _flush(*_pending.line)
    chunk = head + (text or b"").decode("utf-8", errors="replace")
    *lines, rest = chunk.split("\n")
    for line in lines:
        _flush(lvl, line)
    _pending.line = (lvl, rest) if rest else None


def _flush(level: int, line: str) -> None:
    line = line.rstrip()
    # every line, whatever the level: the buffers' sizes are logged at INFO (-> DEBUG)
    with contextlib.suppress(Exception):
        BUFFERS.observe(line)
    if level == logging.WARNING and line.startswith(_BENIGN):
        level = logging.DEBUG
    if line and log.isEnabledFor(level):
        log.log(level, line)


def route_llama_logs() -> None:
    """Send llama.cpp's log to the ``suffixd.llama`` logger (idempotent)."""
    global _callback
    with _lock:
        if _callback is not None:
            return
        import llama_cpp

        # ctypes' CFUNCTYPE types carry no signature for the checker
        @llama_cpp.llama_log_callback  # type: ignore[untyped-decorator]
        def callback(level: int, text: bytes | None, user_data: ctypes.c_void_p) -> None:
            # an exception must not cross back into llama.cpp
            with contextlib.suppress(Exception):
                _receive(level, text)

        llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))
        _callback = callback
