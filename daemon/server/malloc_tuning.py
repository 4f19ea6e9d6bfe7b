"""glibc's allocator, set for a long-running daemon of many threads, and trimmed.

An 8-minute soak (bench/soak/, one node, 16 clients) showed the free memory glibc's
arenas keep resident (the process memory's ``malloc_free``) growing 56 -> 102 MiB while
what was in use stayed flat. Two causes, two settings made at start (``tune``):

* arenas: glibc gives threads up to 8 per core of their own (16 on 2 cores, 512 on 64),
  each keeping its free memory. The daemon's threads (gRPC's pool, one per HTTP
  generation, llama.cpp's) allocate mostly under the GIL, so many arenas buy no
  parallelism, only memory held apart: ``M_ARENA_MAX`` caps them
  (``SUFFIXD_MALLOC_ARENA_MAX``, default 4);
* the mmap threshold: glibc serves blocks over 128 KiB with a mapping of their own
  (returned whole when freed) but raises that threshold to the size of each such block
  freed, up to 32 MiB. Prompt checkpoints (1-30 MiB each, evicted least recently used
  first) then come from the arenas, and their holes stay resident. A fixed
  ``M_MMAP_THRESHOLD`` (``SUFFIXD_MALLOC_MMAP_THRESHOLD_KB``, default 4096) keeps them
  out; blocks under it (a row of logits: 1 MiB) stay cheap.

And a thread, ``suffixd-malloc-trim``, calls ``malloc_trim(0)`` every
``SUFFIXD_MALLOC_TRIM_S`` seconds (default 5; 0: never), which hands every whole free
page inside the arenas back to the kernel (``MADV_DONTNEED``): what the caps leave.
Every 30 s (the first setting) left 0-27 MiB free in the arenas depending on when RSS was
read, and an hour's soak read that noise as growth (+12.8 MiB of its +22.5 in the last
20 minutes); a trim costs ~5-20 ms of one thread with each arena locked in turn, so every
5 s is ~0.3% of a core for a sixth of the noise.

glibc's own variables (``MALLOC_ARENA_MAX``, ``MALLOC_MMAP_THRESHOLD_``,
``GLIBC_TUNABLES``) win: a setting they make is left alone. Nothing is done where the C
library is not glibc.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from ..common.process_memory import (
    M_ARENA_MAX,
    M_MMAP_THRESHOLD,
    mallinfo,
    malloc_trim,
    mallopt,
)

log = logging.getLogger("suffixd.memory")

DEFAULT_ARENA_MAX = 4
DEFAULT_MMAP_THRESHOLD_KB = 4096
DEFAULT_TRIM_S = 5.0


def _env_number(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    try:
        return float(raw) if raw else default
    except ValueError:
        log.warning("%s=%r is not a number; using %g", name, raw, default)
        return default


def _glibc_set(variable: str, tunable: str) -> bool:
    """Whether the operator set this through glibc's own environment."""
    return variable in os.environ or tunable in os.environ.get("GLIBC_TUNABLES", "")


def tune() -> dict[str, int]:
    """Set the arena cap and the mmap threshold (once, at start, before the threads);
    returns what was set."""
    done: dict[str, int] = {}
    arenas = int(_env_number("SUFFIXD_MALLOC_ARENA_MAX", DEFAULT_ARENA_MAX))
    if arenas > 0 and not _glibc_set("MALLOC_ARENA_MAX", "glibc.malloc.arena_max") \
            and mallopt(M_ARENA_MAX, arenas):
        done["arena_max"] = arenas
    kb = int(_env_number("SUFFIXD_MALLOC_MMAP_THRESHOLD_KB", DEFAULT_MMAP_THRESHOLD_KB))
    if kb > 0 and not _glibc_set("MALLOC_MMAP_THRESHOLD_", "glibc.malloc.mmap_threshold") \
            and mallopt(M_MMAP_THRESHOLD, kb * 1024):
        done["mmap_threshold"] = kb * 1024
    if done:
        log.debug("malloc tuned", extra=done)
    return done


class Trimmer:
    """``malloc_trim(0)`` every ``interval_s`` seconds on a thread of its own."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.trims = 0
        self.seconds = 0.0  # spent in malloc_trim (each arena locked meanwhile)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="suffixd-malloc-trim",
                                        daemon=True)
        self._thread.start()

    def trim(self) -> None:
        t0 = time.perf_counter()
        malloc_trim()
        self.seconds += time.perf_counter() - t0
        self.trims += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.trim()
            except Exception:  # never worth the daemon: log once and stop trimming
                log.exception("malloc_trim failed; not trimming any more")
                return

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def register(server: Any, engine: Any) -> list[str]:
    """Daemon hook (server.EXTRA_SERVICES): start the trimmer. Registers no gRPC service."""
    interval = _env_number("SUFFIXD_MALLOC_TRIM_S", DEFAULT_TRIM_S)
    if interval <= 0 or mallinfo() is None:  # off, or not glibc
        return []
    trimmer = Trimmer(interval)
    trimmer.start()
    engine.malloc_trimmer = trimmer
    close = engine.close

    def close_after_trimmer(*args: Any, **kwargs: Any) -> Any:
        trimmer.close()
        return close(*args, **kwargs)

    engine.close = close_after_trimmer
    return []
