"""One thread for every llama.cpp graph evaluation in the process.

llama.cpp's CPU backend (built with OpenMP) runs each graph in an OpenMP parallel region
and syncs its threads at an OpenMP barrier after every node. libgomp keeps a pool of
worker threads per thread that opens a region, and counts every pool's threads as
managed: once they outnumber the CPUs it stops spinning at barriers (100 spins instead of
300,000) and puts the waiting thread to sleep on a futex at each of a graph's ~800
barriers. Decodes called from whichever request thread leads a step (four agents: four
pools) therefore ran with a core idle much of the time: on a 2-core AMD EPYC (Zen 3) a
5-row decode cost 74 ms against 46 from a single thread, 3 sequences x 3 rows 137 against
89, a 503-row prompt chunk 1.95 s against 1.84 (bench/omp_masters.py). Calling
every decode (and the model loads, whose weight repacking may open a region too) from
this one thread keeps a single pool, whatever thread asks.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class _Call:
    __slots__ = ("fn", "done", "result", "error")

    def __init__(self, fn: Callable[[], object]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.result: object = None
        self.error: BaseException | None = None


class ComputeThread:
    """A daemon thread that runs the callables it is given, one at a time, in order.
    ``call`` blocks its caller until its callable ran and returns (or raises) what it
    did; called from the compute thread itself it runs the callable at once."""

    def __init__(self, name: str = "llama-compute") -> None:
        self._name = name
        self._queue: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def _ensure_started(self) -> threading.Thread:
        t = self._thread
        if t is None:
            with self._start_lock:
                t = self._thread
                if t is None:
                    t = threading.Thread(target=self._loop, name=self._name, daemon=True)
                    t.start()
                    self._thread = t
        return t

    def _loop(self) -> None:
        while True:
            c = self._queue.get()
            try:
                c.result = c.fn()
            except BaseException as exc:  # handed to the caller, who raises it
                c.error = exc
            finally:
                c.done.set()

    def call(self, fn: Callable[[], T]) -> T:
        if threading.current_thread() is self._ensure_started():
            return fn()
        c = _Call(fn)
        self._queue.put(c)
        c.done.wait()
        if c.error is not None:
            raise c.error
        return c.result  # type: ignore[return-value]


# Process-wide: libgomp's count of managed threads is the process's.
compute = ComputeThread()
