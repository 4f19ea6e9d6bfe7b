"""The daemon's recent past for the dashboard: a bounded history of its counters.

With ``suffixd serve --http``, thread ``suffixd-history`` takes a sample
(daemon/http_api/dashboard_data.py ``take_sample``: every namespace's cumulative counters,
tree sizes, memory against the budgets, the prompt cache, the fleet's lag per node) every
``SUFFIXD_HISTORY_INTERVAL_S`` seconds (default 60) and keeps the last
``SUFFIXD_HISTORY_SAMPLES`` (default 1440: a day of minutes), so the page shows the past
on its first load. A sample is taken at start-up too: it is where counting starts.

The history is written to ``<data dir>/history.json`` after each sample (owner-only,
replaced atomically: ``datadir.write_private``) and read back at start-up (opened without
following a link, refused unless a regular file under ``MAX_FILE_BYTES``; a file that does
not parse is set aside as ``history.json.bad`` and the history starts empty; each sample
is checked on the way in, ``dashboard_data.clean_sample``, and one that is not a sample
this daemon could have written is dropped, the count in one warning), so a restart keeps
the day's curves. A daemon without ``--http`` records nothing: nobody could read it.

Prompt tokens per namespace are not among the engine's counters: they are counted here
from each finished generation's totals (``engine.on_generate``, chained after the
Prometheus hook of daemon/server/metrics.py when both are on), since start-up.

Interface: ``register(server, engine)`` (server.EXTRA_SERVICES) sets ``engine.history``,
a ``History``: ``samples()`` (oldest first), ``now()`` (a sample taken at once, not kept),
``interval_s``, ``max_samples``, ``close()``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections import deque
from pathlib import Path
from typing import Any

from ..generation.cost_store import NotRegular, read_regular
from ..http_api.dashboard_data import clean_sample, take_sample
from .datadir import write_private

log = logging.getLogger("suffixd.history")

DEFAULT_INTERVAL_S = 60.0
DEFAULT_SAMPLES = 1440
FILE_NAME = "history.json"
# A day of minutes with MAX_TRACKED busy namespaces is a few MB; far past that is no file
# this daemon wrote.
MAX_FILE_BYTES = 256 << 20


def _env_number(name: str, default: float, lo: float) -> float:
    raw = os.environ.get(name, "")
    try:
        value = float(raw) if raw else default
    except ValueError:
        log.warning("ignoring %s=%r: not a number", name, raw)
        return default
    return max(lo, value)


class History:
    def __init__(self, engine: Any, path: Path | None, *, interval_s: float = DEFAULT_INTERVAL_S,
                 max_samples: int = DEFAULT_SAMPLES) -> None:
        self.engine = engine
        self.path = path
        self.interval_s = interval_s
        self.max_samples = max_samples
        self._samples: deque[dict[str, Any]] = deque(maxlen=max_samples)
        self._lock = threading.Lock()
        self._prompt: dict[str, list[int]] = {}  # ns -> [prompt tokens, reused]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    # ------------------------------------------------------------------ counting
    def count_generation(self, ns: str, stats: Any) -> None:
        """One finished generation's totals (``engine.on_generate``)."""
        prompt = int(getattr(stats, "prompt_tokens", 0))
        reused = int(getattr(stats, "cached_prompt_tokens", 0))
        with self._lock:
            c = self._prompt.setdefault(ns, [0, 0])
            c[0] += prompt
            c[1] += reused

    def attach(self) -> None:
        """Count every generation's prompt tokens, after whatever hook is there."""
        before = getattr(self.engine, "on_generate", None)
        mine = self.count_generation

        def on_generate(ns: str, stats: Any) -> None:
            if before is not None:
                before(ns, stats)
            mine(ns, stats)

        self.engine.on_generate = on_generate

    # ------------------------------------------------------------------ samples
    def now(self) -> dict[str, Any]:
        with self._lock:
            prompt = {ns: (c[0], c[1]) for ns, c in self._prompt.items()}
        return take_sample(self.engine, prompt)

    def sample(self) -> dict[str, Any]:
        s = self.now()
        with self._lock:
            self._samples.append(s)
        return s

    def samples(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._samples)

    # ------------------------------------------------------------------ the file
    def load(self) -> None:
        if self.path is None:
            return
        try:
            data = json.loads(read_regular(self.path, MAX_FILE_BYTES))
            stored = data["samples"]
            if not isinstance(stored, list):
                raise TypeError("samples: not a list")
        except FileNotFoundError:
            return
        except (NotRegular, OSError) as exc:
            log.warning("history not read: %s", exc)
            return
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            # (RecursionError: JSON nested deeper than the parser goes)
            # kept for a person to look at; the next save would overwrite it
            log.warning("history unreadable (%s): set aside as %s.bad", exc, self.path.name)
            with contextlib.suppress(OSError):
                self.path.replace(self.path.with_name(self.path.name + ".bad"))
            return
        got = [c for c in map(clean_sample, stored) if c is not None]
        if len(got) < len(stored):
            log.warning("history: dropped %d of %d stored samples (not samples this daemon "
                        "writes: a value not a finite count or time, or a part of another "
                        "shape)", len(stored) - len(got), len(stored))
        with self._lock:
            self._samples.extend(sorted(got, key=lambda s: float(s["t"])))

    def save(self) -> None:
        if self.path is None:
            return
        with self._lock:
            samples = list(self._samples)
        write_private(self.path, json.dumps(
            {"interval_s": self.interval_s, "samples": samples}, separators=(",", ":")))

    # ------------------------------------------------------------------ the thread
    def start(self) -> None:
        self.load()
        self._tick()
        self._thread = threading.Thread(target=self._run, name="suffixd-history", daemon=True)
        self._thread.start()

    def _tick(self) -> None:
        try:
            self.sample()
            self.save()
        except Exception as exc:  # a sample must never take the daemon down
            # A full disk fails every save until space returns: one line when it starts
            # failing and one when it recovers, not one a minute. The samples stay in
            # memory meanwhile.
            if not self._failing and not self._stop.is_set():
                log.warning("history sample or save failed; retrying: %s", exc)
            self._failing = True
            return
        if self._failing:
            log.info("history saved again")
            self._failing = False

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._tick()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def register(server: Any, engine: Any) -> list[str]:
    """Daemon hook (server.EXTRA_SERVICES): keep the history when --http was given.
    Registers no gRPC service."""
    cfg = getattr(engine, "serve_config", None)
    if not (getattr(cfg, "extra", None) or {}).get("http"):
        return []
    data_dir = getattr(engine, "data_dir", None)
    history = History(
        engine, Path(data_dir) / FILE_NAME if data_dir is not None else None,
        interval_s=_env_number("SUFFIXD_HISTORY_INTERVAL_S", DEFAULT_INTERVAL_S, 0.5),
        max_samples=int(_env_number("SUFFIXD_HISTORY_SAMPLES", DEFAULT_SAMPLES, 2)))
    history.attach()
    history.start()
    engine.history = history
    close = engine.close

    def close_after_history(*args: Any, **kwargs: Any) -> Any:
        history.close()  # its thread reads the engine: it stops first
        return close(*args, **kwargs)

    engine.close = close_after_history
    return []
