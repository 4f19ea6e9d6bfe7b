"""The daemon's stop, bounded in time (`suffixd serve --stop-timeout`, default 10 s).

On SIGTERM/SIGINT ``run`` (daemon/server/serve.py) ends the in-flight generations at
their next step (``Generation.stop``: the fronts answer them UNAVAILABLE, 503 or a final
error event), lets the fronts send those answers and close, frees the model and closes
the engine (counters flushed, LMDB closed). Each phase gets what is left of the bound
(``StopClock.left``), the last ones a reserve of it, so that an orchestrator's grace
period (Kubernetes: 30 s) never ends in SIGKILL. What is still running once the bound
has passed is abandoned: one WARNING says what, and the process ends without the C exit
handlers (a thread inside llama.cpp crashed them). Abandoning loses no acknowledged
write: every acknowledged append was committed with fsync before its reply, and LMDB
survives an exit mid-transaction.

Interface: ``StopClock(timeout, stop)`` (``signalled()`` from the signal handler,
``left(reserve)``, ``reserve``, ``phase``, ``running``, ``abandon(what)``,
``finished()``), ``stop_generation(engine, timeout)``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("suffixd.server")

DEFAULT_STOP_TIMEOUT_S = 10.0


class StopClock:
    """The stop's time bound, from the signal on; a watchdog thread ends the process at
    its end whatever the stop is doing then."""

    def __init__(self, timeout: float, stop: threading.Event) -> None:
        self.timeout = max(0.0, timeout)
        self.stop = stop
        self.since: float | None = None  # when the first signal came (monotonic)
        self.phase = "starting up"  # what the daemon is doing, for the last warning
        # what may still run (``Generation.still_running``), for the watchdog's warning
        self.running: Callable[[], list[str]] = list
        self._lock = threading.Lock()
        self._ended = False
        self._done = threading.Event()
        threading.Thread(target=self._watch, name="suffixd-stop-watchdog", daemon=True).start()

    @property
    def reserve(self) -> float:
        """The end of the bound kept for freeing the model and closing the engine (fast
        when nothing is stuck: milliseconds)."""
        return min(2.0, self.timeout / 4)

    def signalled(self) -> None:
        """From the signal handler: the bound starts (at the first signal) and the daemon
        begins to stop. Starts no thread: the main thread, which a handler interrupts,
        may hold the lock that starting one takes."""
        if self.since is None:
            self.since = time.monotonic()
        self.stop.set()

    def left(self, reserve: float = 0.0) -> float:
        """Seconds of the bound left, less ``reserve`` (the whole bound before a signal:
        a stop after a start-up failure)."""
        since = self.since if self.since is not None else time.monotonic()
        return max(0.0, since + self.timeout - reserve - time.monotonic())

    def _watch(self) -> None:
        self.stop.wait()
        if self._done.wait(self.left()):
            return
        try:
            what = self.running()
        except Exception:  # the warning and the exit matter more than its detail
            what = []
        self.abandon(what or ["the rest of the stop"])

    def abandon(self, what: list[str], phase: str | None = None) -> None:
        """End the process now, past the bound (``phase``: what the stop was doing,
        ``self.phase`` by default): one WARNING says what is abandoned. Without the C
        exit handlers, which a thread inside llama.cpp crashes."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
            log.warning("stop timeout (%g s) passed while %s: abandoned %s; exiting now "
                        "(every acknowledged write is durable)",
                        self.timeout, phase or self.phase, ", ".join(what))
            logging.shutdown()
            os._exit(0)

    def finished(self) -> None:
        """The stop ended within the bound: the watchdog ends without a word."""
        with self._lock:
            self._ended = True
        self._done.set()
        self.stop.set()  # (wakes the watchdog of a run that never got a signal)


def stop_generation(engine: Any, timeout: float) -> list[str]:
    """Before the engine closes and the process exits: the generations ended and waited
    for, the cost measurement stopped and joined, the model freed (a thread left inside
    llama.cpp while the process exits crashes it: SIGSEGV after "stopped"). Returns what
    is still running after ``timeout`` seconds (nothing was freed then)."""
    generation = getattr(engine, "generator", None)
    if generation is None:
        return []
    try:
        if generation.close(timeout):
            return []
        return list(generation.still_running()) or ["the generator's threads"]
    except Exception:
        log.exception("stopping generation failed")
        return ["the generator (its stop failed)"]
