"""Watching a corpus folder: watchdog events, debounced into batches of changes.

Editors and `git checkout` produce bursts (write temp file, rename, chmod,
modify twice ...). Reacting to each event would re-warm the same file several
times, so events are collected per path and handed out once the folder has
been quiet for ``quiet_s`` seconds, or at the latest ``max_delay_s`` after the
first pending event, so a folder that never stops changing is still followed.
Per path only the last state matters: the consumer looks at the file when it
processes the batch (an "upsert" of a file that is gone by then is a delete).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Literal

from suffixd.cli.corpus.units import matches, relative_key

Op = Literal["upsert", "delete"]


class Debouncer:
    """Coalesces (path, op) events; thread-safe. ``clock`` is injectable for tests."""

    def __init__(
        self,
        quiet_s: float = 0.3,
        max_delay_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if quiet_s < 0 or max_delay_s < quiet_s:
            raise ValueError("need 0 <= quiet_s <= max_delay_s")
        self.quiet_s = quiet_s
        self.max_delay_s = max_delay_s
        self._clock = clock
        self._pending: dict[str, Op] = {}
        self._first: float | None = None
        self._last: float | None = None
        self._cond = threading.Condition()
        self._closed = False

    def add(self, path: str, op: Op) -> None:
        now = self._clock()
        with self._cond:
            # dict order is first-seen order; re-inserting keeps it, only the op changes
            self._pending[path] = op
            if self._first is None:
                self._first = now
            self._last = now
            self._cond.notify_all()

    def pending(self) -> int:
        with self._cond:
            return len(self._pending)

    def deadline(self) -> float | None:
        """Clock time at which the pending batch is due (None when nothing is pending)."""
        with self._cond:
            return self._deadline_locked()

    def _deadline_locked(self) -> float | None:
        if self._first is None or self._last is None:
            return None
        return min(self._last + self.quiet_s, self._first + self.max_delay_s)

    def due(self) -> bool:
        with self._cond:
            d = self._deadline_locked()
            return d is not None and self._clock() >= d

    def take(self) -> dict[str, Op]:
        """The pending batch (path -> last op), emptied, whether due or not."""
        with self._cond:
            batch, self._pending = self._pending, {}
            self._first = self._last = None
            return batch

    def poll(self) -> dict[str, Op] | None:
        """The batch if it is due, else None (non-blocking)."""
        with self._cond:
            d = self._deadline_locked()
            if d is None or self._clock() < d:
                return None
            batch, self._pending = self._pending, {}
            self._first = self._last = None
            return batch

    def wait(self, timeout: float | None = None) -> dict[str, Op] | None:
        """Block until a batch is due (returned), ``timeout`` passes or close() (None).

        Uses the real clock to sleep; with an injected clock use ``poll``.
        """
        end = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._closed:
                d = self._deadline_locked()
                now = self._clock()
                if d is not None and now >= d:
                    batch, self._pending = self._pending, {}
                    self._first = self._last = None
                    return batch
                sleep = None if d is None else d - now
                if end is not None:
                    left = end - time.monotonic()
                    if left <= 0:
                        return None
                    sleep = left if sleep is None else min(sleep, left)
                self._cond.wait(sleep)
            return None

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class CorpusWatcher:
    """A watchdog observer on ``root`` feeding a Debouncer with selected files' changes.

    Paths handed out are absolute. A deleted or moved-away folder is reported
    as one "delete" of the folder path: the consumer drops every warm file
    under it. A created or moved-in folder is an "upsert" of the folder: the
    consumer walks it (inotify does not report the files of a folder moved in).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        includes: Sequence[str] = (),
        excludes: Sequence[str] = (),
        debouncer: Debouncer | None = None,
    ) -> None:
        from watchdog.events import FileSystemEvent, FileSystemEventHandler
        from watchdog.observers import Observer

        self.root = os.path.abspath(root)
        self.includes = tuple(includes)
        self.excludes = tuple(excludes)
        self.debouncer = debouncer or Debouncer()
        watcher = self

        class _Handler(FileSystemEventHandler):
            def on_any_event(self, event: FileSystemEvent) -> None:
                watcher._on_event(event)

        self._observer = Observer()
        self._observer.schedule(_Handler(), self.root, recursive=True)

    def _selected(self, path: str, is_dir: bool) -> bool:
        rel = relative_key(self.root, path)
        if rel is None:
            return False
        return is_dir or matches(rel, self.includes, self.excludes)

    def _on_event(self, event: object) -> None:
        kind = getattr(event, "event_type", "")
        is_dir = bool(getattr(event, "is_directory", False))
        src = os.fsdecode(getattr(event, "src_path", ""))
        if kind in ("opened", "closed_no_write"):
            return  # reads change nothing
        if kind == "moved":
            dest = os.fsdecode(getattr(event, "dest_path", ""))
            if self._selected(src, is_dir):
                self.debouncer.add(src, "delete")
            if self._selected(dest, is_dir):
                self.debouncer.add(dest, "upsert")
            return
        if kind == "deleted":
            if self._selected(src, is_dir):
                self.debouncer.add(src, "delete")
            return
        if is_dir and kind != "created":
            return  # a folder's own mtime changes whenever a file in it does
        if self._selected(src, is_dir):
            self.debouncer.add(src, "upsert")

    def start(self) -> None:
        self._observer.start()

    def stop(self) -> None:
        self.debouncer.close()
        self._observer.stop()
        self._observer.join(timeout=5)

    def __enter__(self) -> CorpusWatcher:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
