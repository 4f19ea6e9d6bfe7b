"""The step batcher (continuous batching): one ``llama_decode`` per step for every generation.

Each generation runs in its own thread and, at every step, hands the batcher what it
wants evaluated (``StepRows``): its last token and its draft, or a chunk of its prompt.
The first thread that finds the model free and every active generation's rows in (or
the others late by more than a few milliseconds) leads: it plans the step
(``step_planner.plan_step``: the token budget, joint draft lengths, padding, logits),
runs one decode for all of them, and wakes them; each then verifies, accepts and rolls
back its own rows, exactly as alone, and leaves the step. The next decode starts once
every sequence of the last one has read its logits (they live in llama.cpp's buffer
until the next decode). The batcher keeps the achieved rate the plan weighs drafts by
(tokens per unit of step cost) and the step counters (``BatchCounters``).

Work that is not a step takes the model between two steps: ``exclusive()`` (KV changes,
certification) goes before the waiting steps; ``quiet_exclusive(stop)`` (the cost
measurement) only once no generation is active or waiting (``request()`` spans a
generation from its arrival, before its KV slot, to its end), so it never delays a
request by more than the one batch it has started. ``request()`` also times how long a
generation queued before its first step (``BatchCounters.queue_*``).

``stop()`` (the daemon stops): every later step is refused with ``Stopping``, so each
generation ends at its next step, a long prompt's evaluation between two of its chunks;
steps already queued run (one decode at most).

The batcher knows nothing of llama.cpp: the verifier gives it the decode to run.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..common.errors import Unavailable
from .step_cost import Entry, StepCostModel
from .step_planner import StepRows, plan_step, ubatch_cost

RATE_PRIOR = 8.0  # pseudo-steps at 1 token per unit of cost, before any feedback
RATE_DECAY = 0.99
# How long a step waits for active generations that have not handed in their rows,
# relative to the last decode's duration (bounded below and above, in seconds).
GATHER_FRACTION = 0.3
GATHER_MIN_S = 0.002
GATHER_MAX_S = 0.05


@dataclass
class BatchCounters:
    """What the steps did (``batch_stats``), updated by the batcher under its lock."""

    steps: int = 0
    sequences: int = 0  # summed over steps
    rows: int = 0  # evaluated, padding included
    padding_rows: int = 0
    prompt_rows: int = 0
    trimmed_draft_tokens: int = 0  # draft tokens the joint plan cut from the drafters' choice
    extended_draft_tokens: int = 0  # candidates past the drafters' cut it verified instead
    max_sequences: int = 0
    decode_s: float = 0.0  # in the model
    between_s: float = 0.0  # from the last sequence leaving a step to the next decode
    reading_s: float = 0.0  # from a decode's end to its last sequence leaving the step
    plan_s: float = 0.0  # planning the steps (before each decode)
    by_sequences: dict[int, int] = field(default_factory=dict)  # sequences -> steps
    # Generations that reached their first step, and how long they queued before it
    # (for a KV slot, behind other steps and exclusive work): summed and the longest.
    queued: int = 0
    queue_s: float = 0.0
    queue_max_s: float = 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "steps": self.steps, "sequences": self.sequences, "rows": self.rows,
            "padding_rows": self.padding_rows, "prompt_rows": self.prompt_rows,
            "trimmed_draft_tokens": self.trimmed_draft_tokens,
            "extended_draft_tokens": self.extended_draft_tokens,
            "max_sequences": self.max_sequences,
            "decode_s": round(self.decode_s, 3), "between_s": round(self.between_s, 3),
            "reading_s": round(self.reading_s, 3), "plan_s": round(self.plan_s, 3),
            "by_sequences": {str(k): v for k, v in sorted(self.by_sequences.items())},
            "queued_requests": self.queued, "queue_s": round(self.queue_s, 3),
            "queue_max_s": round(self.queue_max_s, 3),
        }


def _entries(reqs: Sequence[StepRows], rows: Sequence[int], kept: Sequence[int]) -> list[Entry]:
    """The step as the cost model sees it (``reqs`` in batch order, as planned)."""
    return [Entry(r.seq_id, n, 0 if r.prompt else k, r.pos0, r.prompt)
            for r, n, k in zip(reqs, rows, kept, strict=True)]


class Interrupted(Exception):
    """A ``quiet_exclusive`` wait ended by its stop event (the daemon is stopping)."""


class Stopping(Unavailable):
    """The daemon is stopping: a generation ends here (UNAVAILABLE on gRPC, 503 on the
    OpenAI endpoint), not by its own finish."""

    def __init__(self, message: str = "the daemon is stopping") -> None:
        super().__init__(message)


class Request:
    """One generation in the batcher, from its arrival (``StepBatcher.request``)."""

    __slots__ = ("arrived", "queue_s")

    def __init__(self) -> None:
        self.arrived = time.monotonic()
        self.queue_s: float | None = None  # set at its first step

    def first_step(self, rows: StepRows, counters: BatchCounters) -> None:
        if self.queue_s is None:
            self.queue_s = max(0.0, rows.decode_started - self.arrived)
            counters.queued += 1
            counters.queue_s += self.queue_s
            counters.queue_max_s = max(counters.queue_max_s, self.queue_s)


_CLK_TCK = os.sysconf("SC_CLK_TCK")


def machine_cpu_seconds() -> tuple[float, float]:
    """The whole machine's busy and idle CPU seconds so far (/proc/stat: idle and I/O
    wait count as idle), at the kernel's clock tick (10 ms)."""
    with open("/proc/stat", encoding="ascii") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return (sum(v) - idle) / _CLK_TCK, idle / _CLK_TCK


def _cpu_now() -> tuple[float, float, float, float]:
    """For the step log: the leading thread's CPU seconds, this process's, the whole
    machine's busy and idle seconds (was the step's compute shared with other work?)."""
    t = os.times()
    return (time.thread_time(), t.user + t.system, *machine_cpu_seconds())


class StepBatcher:
    """Gathers the active generations' rows and runs one decode per step for them all."""

    def __init__(
        self,
        run: Callable[[list[StepRows]], None],
        n_batch: int,
        cost: Callable[[int], float],
        pad_to: Callable[[int, int], int] | None = None,
        n_ubatch: int | None = None,
        logit_rows: Callable[[int, int], int] | None = None,
    ) -> None:
        """``run(rows)``: evaluate the planned rows in one decode. ``cost(n)``: what a
        step of n verified rows costs relative to one. ``pad_to(n, room)``: rows to add
        to a lone step of n; ``logit_rows(n, rows)``: how many rows of a ubatch of
        ``rows``, n of them verified, ask for logits (see ``plan_step``)."""
        self._run = run
        self.n_batch = n_batch
        self._cost = cost
        self._pad_to = pad_to
        self._logit_rows = logit_rows
        self._cond = threading.Condition()
        self._pending: list[StepRows] = []
        self._members = 0  # generations between join() and leave()
        self._in_flight = 0  # sequences of the last step still reading their logits
        self._busy = False  # a decode or an exclusive holder has the model
        self._exclusive_waiting = 0
        self._requests = 0  # generations between request() entry and exit
        self._free_since = time.monotonic()
        self._decoded_at = self._free_since
        self._decode_s = 0.02
        self._rate_tokens = RATE_PRIOR
        self._rate_cost = RATE_PRIOR
        self.counters = BatchCounters()
        self.model = StepCostModel(cost, n_ubatch or n_batch)
        # Plan shared steps with the fitted model (off: the profile, every run padded).
        # Off by default: fitted to within 1-5% of the served steps' seconds, it still
        # took riskier drafts than the padded-run rule and lost (spider_dev, 8 agents,
        # EPYC: 33.6-34.5 s against 31.1-32.7 s; BENCHMARKS.md); it keeps fitting for
        # the status and SUFFIXD_STEP_MODEL=1.
        self.use_model = False
        # No ubatch takes a single row of a sequence (the verifier's deterministic mode)
        self.no_single_rows = False
        # SUFFIXD_STEP_LOG=PATH: one JSON line per step (its plan, duration and what each
        # sequence emitted), for finding where a benchmark's time went
        log_path = os.environ.get("SUFFIXD_STEP_LOG")
        self._step_log = open(log_path, "a", encoding="utf-8") if log_path else None  # noqa: SIM115
        self._last_batch: list[StepRows] = []
        self._last_gap = 0.0
        self._last_cpu: list[float] = []
        self._stopping = False

    @property
    def rate(self) -> float:
        """Tokens emitted per unit of step cost, recently."""
        return self._rate_tokens / self._rate_cost

    def shared(self) -> bool:
        """Whether other generations are active (a step is likely shared)."""
        return self._members > 1

    @contextmanager
    def request(self) -> Iterator[Request]:
        """A generation, from its arrival (before it waits for a KV slot) to its end: while
        any is in, ``quiet_exclusive`` waits. Pass what it yields to ``step`` to time its
        queueing before the first step."""
        req = Request()
        with self._cond:
            self._requests += 1
        try:
            yield req
        finally:
            with self._cond:
                self._requests -= 1
                self._cond.notify_all()

    def join(self) -> None:
        with self._cond:
            self._members += 1

    def leave(self) -> None:
        with self._cond:
            self._members -= 1
            self._cond.notify_all()

    @contextmanager
    def step(self, req: StepRows, request: Request | None = None) -> Iterator[StepRows]:
        """Evaluate ``req`` in the next step; inside the block its logits are readable
        (rows ``offset .. offset + kept``) and its KV may be rolled back. Set
        ``req.emitted`` before leaving it. ``request``: the generation it belongs to
        (its first step ends its queueing)."""
        self._submit(req)
        if request is not None and request.queue_s is None:
            with self._cond:
                request.first_step(req, self.counters)
        try:
            yield req
        finally:
            with self._cond:
                self._rate_tokens += req.emitted
                self._in_flight -= 1
                if self._in_flight == 0:
                    self._free_since = time.monotonic()
                    self.counters.reading_s += self._free_since - self._decoded_at
                    if self._step_log is not None:
                        self._write_step_log()
                    self._cond.notify_all()

    def _write_step_log(self) -> None:
        assert self._step_log is not None
        batch = self._last_batch
        rec = {"t": round(self._decoded_at, 4), "s": round(batch[0].step_s, 5) if batch else 0,
               "read": round(self._free_since - self._decoded_at, 5),
               "gap": round(self._last_gap, 5), "cpu": self._last_cpu,
               "seqs": [[r.seq_id, int(r.prompt), len(r.tokens), r.want, r.kept, r.rows,
                         r.emitted, r.pos0] for r in batch]}
        self._step_log.write(json.dumps(rec) + "\n")
        self._step_log.flush()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """The model alone, between two steps (cost measurement, certification, KV
        surgery on a slot that is not stepping)."""
        with self._cond:
            self._exclusive_waiting += 1
            while self._busy or self._in_flight:
                self._cond.wait()
            self._exclusive_waiting -= 1
            self._busy = True
        try:
            yield
        finally:
            self._release_model()

    def _release_model(self) -> None:
        """The end of an exclusive hold: the model is free for the next step."""
        with self._cond:
            self._busy = False
            self._free_since = time.monotonic()
            self._cond.notify_all()

    def _quiet(self) -> bool:
        return not (self._requests or self._members or self._pending or self._busy
                    or self._in_flight or self._exclusive_waiting)

    @contextmanager
    def quiet_exclusive(self, stop: threading.Event | None = None,
                        poll_s: float = 0.1) -> Iterator[None]:
        """The model alone, once no generation is active or waiting: work that must never
        delay a request (the cost measurement while serving) runs only in the gaps
        between requests, one piece per gap check. Raises ``Interrupted`` once ``stop``
        is set instead of waiting on."""
        with self._cond:
            while not self._quiet():
                if stop is not None and stop.is_set():
                    raise Interrupted
                self._cond.wait(poll_s)
            if stop is not None and stop.is_set():
                raise Interrupted
            self._busy = True
        try:
            yield
        finally:
            self._release_model()

    def stop(self) -> None:
        """Refuse every later step (``Stopping``): the daemon stops, and a generation must
        not run the hundreds of steps to its own end (nor a long prompt's chunks)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def _submit(self, req: StepRows) -> None:
        cond = self._cond
        with cond:
            if self._stopping:
                raise Stopping
            req.arrived = time.monotonic()
            req.done, req.error = False, None
            self._pending.append(req)
            cond.notify_all()
            while not req.done:
                if self._busy or self._in_flight or self._exclusive_waiting \
                        or not self._pending:
                    cond.wait()
                    continue
                start = max(self._free_since, min(r.arrived for r in self._pending))
                gather = min(GATHER_MAX_S, max(GATHER_MIN_S, GATHER_FRACTION * self._decode_s))
                left = start + gather - time.monotonic()
                if len(self._pending) < self._members and left > 0:
                    cond.wait(left)
                    continue
                self._lead()
            if req.error is not None:
                raise req.error

    def _lead(self) -> None:
        """Plan and run one step (called with the condition held; released meanwhile)."""
        t_plan = time.perf_counter()
        batch = plan_step(self._pending, self.n_batch, self._cost, self.rate, self._pad_to,
                          self.model if self.use_model else None, self._logit_rows,
                          self.model.n_ubatch, self.no_single_rows)
        self.counters.plan_s += time.perf_counter() - t_plan
        taken = {id(r) for r in batch}
        self._pending = [r for r in self._pending if id(r) not in taken]
        self._busy = True
        error: BaseException | None = None
        gap = time.monotonic() - self._free_since
        self._last_gap = gap
        if gap < 1.0:  # not an idle model: the sequences' own work between two decodes
            self.counters.between_s += gap
        self._cond.release()
        started = time.monotonic()
        for r in batch:
            r.decode_started = started
        cpu0 = _cpu_now() if self._step_log is not None else None
        t0 = time.perf_counter()
        try:
            self._run(batch)
        except BaseException as exc:  # every sequence of the step gets it
            error = exc
        finally:
            dt = time.perf_counter() - t0
            if cpu0 is not None:
                self._last_cpu = [round(b - a, 4) for a, b in zip(cpu0, _cpu_now(), strict=True)]
            self._cond.acquire()
        self._busy = False
        self._decoded_at = time.monotonic()
        self._decode_s += 0.2 * (dt - self._decode_s)
        c = self.counters
        c.steps += 1
        c.decode_s += dt
        c.sequences += len(batch)
        c.rows += sum(r.rows for r in batch)
        c.padding_rows += sum(r.rows - r.kept for r in batch)
        c.prompt_rows += sum(r.rows for r in batch if r.prompt)
        decodes = [r for r in batch if not r.prompt]
        c.trimmed_draft_tokens += sum(max(0, (r.want or len(r.tokens)) - r.kept) for r in decodes)
        c.extended_draft_tokens += sum(max(0, r.kept - (r.want or len(r.tokens)))
                                       for r in decodes)
        c.max_sequences = max(c.max_sequences, len(batch))
        c.by_sequences[len(batch)] = c.by_sequences.get(len(batch), 0) + 1
        if error is None:
            self.model.observe(_entries(batch, [r.rows for r in batch],
                                        [r.outputs for r in batch]), dt)
        if decodes:
            # the achieved rate in the planner's own units (what it compares plans in)
            modelled = self.model.price(_entries(decodes, [r.rows for r in decodes],
                                                 [r.kept for r in decodes])) \
                if self.use_model else ubatch_cost(self._cost, decodes, self.model.n_ubatch)
            self._rate_tokens *= RATE_DECAY
            self._rate_cost = self._rate_cost * RATE_DECAY + modelled
        for r in batch:
            r.step_s = dt
            r.error = error
            r.done = True
        self._last_batch = batch
        self._in_flight = 0 if error is not None else len(batch)
        if error is not None:
            self._free_since = time.monotonic()
        self._cond.notify_all()
