"""The store's writer thread: group commit, fsync, map growth.

Every write goes through one writer thread that groups the writes queued while the
previous transaction was committing into a single transaction (group commit), commits it
(with fsync when the environment syncs) and only then completes the callers' futures. A
caller whose future is done therefore knows its data survives ``kill -9``; concurrent
callers share one fsync. Writes submitted ``lazy`` (nobody waits for them soon) may wait
``lazy_interval_s`` for company.

A transaction that hits ``MapFullError`` is aborted, the map doubled and the batch
replayed, so callers never see the error. A job that raises fails alone: the others of
its group are committed without it. A transaction that fails for want of disk space
raises ``DiskFullError`` (suffixcache/store_errors.py); the environment stays usable.

Interface: ``GroupCommitWriter(env, dbs, lock, max_batch=, lazy_interval_s=)`` starts the
thread; ``submit(fn, lazy=)`` -> ``Future`` of ``fn(txn)``'s result once committed;
``close()`` commits what is queued and joins the thread; ``commits`` and ``resizes``
count transactions and map doublings. ``lock`` is the store's: every transaction of the
process is taken under it, because LMDB resizes the map only while none is open.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import lmdb

from .store_errors import DiskFullError, free_bytes, is_disk_full
from .store_files import DAMAGE, damaged
from .store_layout import Databases
from .store_records import Txn


class _Job:
    __slots__ = ("fn", "future", "lazy")

    def __init__(self, fn: Callable[[Txn], Any], lazy: bool = False) -> None:
        self.fn = fn
        self.future: Future[Any] = Future()
        self.lazy = lazy


class GroupCommitWriter:
    """The thread that runs every write transaction of a store (see the module docstring)."""

    def __init__(
        self,
        env: lmdb.Environment,
        dbs: Databases,
        lock: threading.Lock,
        *,
        max_batch: int,
        lazy_interval_s: float,
    ) -> None:
        self.env = env
        self._dbs = dbs
        self._lock = lock
        self._max_batch = max_batch
        self._lazy_interval = lazy_interval_s
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.commits = 0
        self.resizes = 0
        self._thread = threading.Thread(
            target=self._run, name="suffixd-lmdb-writer", daemon=True
        )
        self._thread.start()

    def submit(self, fn: Callable[[Txn], Any], *, lazy: bool = False) -> Future[Any]:
        job = _Job(fn, lazy)
        self._queue.put(job)
        return job.future

    def close(self) -> None:
        """Commit what was submitted before, then stop the thread."""
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        stop = False
        last_end = 0.0
        while not stop:
            first = self._queue.get()
            if first is None:
                return
            jobs = [first]
            urgent = not first.lazy
            due = last_end + self._lazy_interval
            # Everything queued while the previous commit ran shares this transaction; a
            # group of lazy writes also takes what comes until it is due.
            while len(jobs) < self._max_batch:
                try:
                    wait = 0.0 if urgent else due - time.monotonic()
                    nxt = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                jobs.append(nxt)
                urgent = urgent or not nxt.lazy
            self._commit_group(jobs)
            last_end = time.monotonic()

    def _commit_group(self, jobs: list[_Job]) -> None:
        try:
            results = self._run_txn(jobs)
        except Exception as exc:
            if len(jobs) == 1:
                jobs[0].future.set_exception(exc)
                return
            # One job failed: isolate it so the others still commit.
            for job in jobs:
                try:
                    res = self._run_txn([job])
                except Exception as job_exc:
                    job.future.set_exception(job_exc)
                else:
                    job.future.set_result(res[0])
            return
        for job, res in zip(jobs, results, strict=True):
            job.future.set_result(res)

    def _run_txn(self, jobs: list[_Job]) -> list[Any]:
        while True:
            with self._lock:
                txn = self.env.begin(write=True)
                try:
                    t = Txn(self._dbs, txn)
                    results = [job.fn(t) for job in jobs]
                    txn.commit()
                    self.commits += 1
                    return results
                except lmdb.MapFullError:
                    txn.abort()
                    new_size = self.env.info()["map_size"] * 2
                    self.env.set_mapsize(new_size)
                    self.resizes += 1
                except BaseException as exc:
                    txn.abort()
                    path = self.env.path()
                    if isinstance(exc, DAMAGE):  # as reads say it: the file, the way out
                        raise damaged(Path(path), exc) from None
                    if isinstance(exc, (lmdb.Error, OSError)) and is_disk_full(path, exc):
                        raise DiskFullError(
                            f"disk full: the store {path} cannot take this write "
                            f"({free_bytes(path)} bytes free; {exc}); nothing of it was "
                            "stored: free some space"
                        ) from exc
                    raise
