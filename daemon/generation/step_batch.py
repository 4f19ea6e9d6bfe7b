"""One ``llama_decode`` per step for every active generation (continuous batching).

Each generation runs in its own thread and, at every step, hands the batcher what it
wants evaluated (``StepRows``): its last token and its draft, or a chunk of its prompt.
The first thread that finds the model free and every active generation's rows in (or
the others late by more than a few milliseconds) leads: it plans the step
(``plan_step``), runs one decode for all of them, and wakes them; each then verifies,
accepts and rolls back its own rows, exactly as alone, and leaves the step. The next
decode starts once every sequence of the last one has read its logits (they live in
llama.cpp's buffer until the next decode).

Planning a step (pure, unit-tested):

* Token budget: a row for every decoding sequence's last token, then their drafts
  (arrival order), then prompt chunks fill what is left, so a long new prompt joins the
  step in pieces instead of stalling the others, and no sequence waits a step for
  another's draft.
* Joint draft lengths: with several decoding sequences, each one's draft is cut to the
  prefix that maximises the step's expected tokens (1 per sequence, plus each draft
  token's calibrated acceptance probability) minus ``rate`` x the step's cost, where
  ``rate`` is the tokens per unit of cost the batcher achieves (Dinkelbach, as the
  drafter does for one sequence; the step's cost depends on the whole batch, so the
  lengths are chosen together over the candidates of every sequence, best first).
* Against the plain plan: a plan with drafts is taken only where it yields at least the
  plain plan's expected tokens per unit of cost (``joint_lengths``), and shared steps
  are priced by what steps of their shape cost while serving (``SharedStepPrices``).
* Equal rows per sequence: with a KV stream per sequence, llama.cpp splits a batch into
  ubatches holding the same number of rows of consecutive sequence ids; unequal drafts
  would cost one ubatch each. Rows are padded (no logits, rolled back with the rejected
  draft) to the longest of each run of consecutive ids, which on the 2-core CPU measured
  costs a padded row about PAD_ROW_WEIGHT of a row with logits (the 262k-wide output
  layer runs only for rows with logits).

Work that is not a step takes the model between two steps: ``exclusive()`` (KV changes,
certification) goes before the waiting steps; ``quiet_exclusive(stop)`` (the cost
measurement) only once no generation is active or waiting (``request()`` spans a
generation from its arrival, before its KV slot, to its end), so it never delays a
request by more than the one batch it has started. ``request()`` also times how long a
generation queued before its first step (``BatchCounters.queue_*``).

The batcher knows nothing of llama.cpp: the verifier gives it the decode to run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

# Cost of a padding row (no logits) relative to a verified row. gemma-3-270m, 2-core
# Sapphire Rapids, 4 sequences of 1,500 cached tokens: 30 padding rows added 81 ms to a
# 64-row batch where 60 verified rows cost 395 ms.
PAD_ROW_WEIGHT = 0.4
# A prompt chunk's share of a step when decoding rows would fill it: prompts still move.
PROMPT_RESERVE = 64
RATE_PRIOR = 8.0  # pseudo-steps at 1 token per unit of cost, before any feedback
RATE_DECAY = 0.99
# How long a step waits for active generations that have not handed in their rows,
# relative to the last decode's duration (bounded below and above, in seconds).
GATHER_FRACTION = 0.3
GATHER_MIN_S = 0.002
GATHER_MAX_S = 0.05


@dataclass(eq=False)
class StepRows:
    """What one sequence wants evaluated in a step, and what the step gave it."""

    seq_id: int
    tokens: list[int]  # a decode: [last token, *draft]; a prompt chunk: prompt tokens
    pos0: int
    room: int  # the most rows this sequence may take (the end of its context, n_batch)
    prompt: bool = False  # a prompt chunk: no logits; the plan may take only its head
    # A decode's draft tokens' calibrated cumulative acceptance probabilities: the plan
    # may cut the draft (None: the draft is kept whole)
    probs: Sequence[float] | None = None
    # Rows its drafter chose for a step of its own (0: all of ``tokens``). A shared step's
    # plan may take more of ``tokens`` (the candidates past the drafter's cut) where they
    # fill rows that would be padding anyway, or fewer.
    want: int = 0
    # set by the plan and the step
    kept: int = 0  # tokens of ``tokens`` evaluated
    rows: int = 0  # rows evaluated, padding included
    offset: int = 0  # batch index of its first row
    shared: int = 0  # sequences in the step
    step_s: float = 0.0  # the decode's duration
    emitted: int = 0  # set by the sequence after verifying: tokens it emitted
    arrived: float = 0.0
    done: bool = False
    error: BaseException | None = None
    decode_started: float = 0.0  # monotonic time its step's decode began

    @property
    def outputs(self) -> int:
        """Rows with logits: every kept row of a decode, none of a prompt chunk."""
        return 0 if self.prompt else self.kept


@dataclass
class BatchCounters:
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
            "reading_s": round(self.reading_s, 3),
            "by_sequences": {str(k): v for k, v in sorted(self.by_sequences.items())},
            "queued_requests": self.queued, "queue_s": round(self.queue_s, 3),
            "queue_max_s": round(self.queue_max_s, 3),
        }


def step_cost(cost: Callable[[int], float], rows: Sequence[int], outputs: Sequence[int]) -> float:
    """The modelled cost of a step: its verified rows at the profile's cost, its padding
    rows at PAD_ROW_WEIGHT of what they would add as verified rows."""
    return _cost_of(cost, sum(rows), sum(outputs))


def _cost_of(cost: Callable[[int], float], total: int, out: int) -> float:
    """step_cost from the step's row and output totals."""
    base = cost(out) if out else 0.0
    return base + PAD_ROW_WEIGHT * (cost(total) - base) if total > out else base


def _padded(kept: int, longest: int, room: int) -> int:
    """Rows of a request whose run of consecutive ids is padded to ``longest``."""
    return max(kept, min(longest, room))


def _runs(reqs: Sequence[StepRows]) -> list[list[StepRows]]:
    """Decoding requests grouped into runs of consecutive sequence ids."""
    runs: list[list[StepRows]] = []
    for r in sorted(reqs, key=lambda r: r.seq_id):
        if runs and r.seq_id == runs[-1][-1].seq_id + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return runs


def _pad_plan(reqs: Sequence[StepRows]) -> Callable[[Sequence[int]], list[int]]:
    """Rows per request, given the kept ones, once each run of consecutive ids is padded
    to its longest (the runs found once: the joint plan asks for every candidate)."""
    idx = {id(r): i for i, r in enumerate(reqs)}
    runs = [[idx[id(r)] for r in run] for run in _runs(reqs)]
    rooms = [r.room for r in reqs]

    def rows(kept: Sequence[int]) -> list[int]:
        out = list(kept)
        for run in runs:
            longest = max(kept[i] for i in run)
            for i in run:
                out[i] = _padded(kept[i], longest, rooms[i])
        return out

    return rows


def padded_rows(reqs: Sequence[StepRows], kept: Sequence[int]) -> list[int]:
    """Rows per request once each run of consecutive ids is padded to its longest."""
    return _pad_plan(reqs)(kept)


def joint_lengths(reqs: Sequence[StepRows], cost: Callable[[int], float],
                  rate: float, shape: Callable[[int, int], float] | None = None) -> list[int]:
    """Rows kept per decoding request (1 + draft tokens, at most its ``kept``), chosen
    together: the prefix of all candidates, most probable first, that maximises
    expected tokens - rate * cost.

    The plan is chosen against the plain plan (one row per sequence, no draft): ``rate``
    is raised to at least the plain plan's own tokens per cost, so that any plan taken
    instead yields at least as many expected tokens per unit of cost (taking x over the
    plain plan 0 means E(x) - E(0) >= rate * (C(x) - C(0)) >= E(0)/C(0) * (C(x) - C(0)),
    that is E(x)/C(x) >= E(0)/C(0)). With a low achieved ``rate`` (drafts that did not pay
    lately) the bare objective took drafts that cost more per token than plain batching.

    ``shape(sequences, rows)``: what a step of that many sequences, each up to ``rows``
    rows, costs relative to what ``cost`` says (``SharedStepPrices.factor``: measured
    while serving), or None.

    The step's rows are kept up to date per candidate (each run's longest kept and its
    padded rows) instead of padding every sequence again: O(candidates + sequences x
    draft) rather than O(candidates x sequences), which at a GPU's 16-64 sequences was
    8-170 ms a plan."""
    kept = [1 if r.probs is not None else r.kept for r in reqs]
    cands: list[tuple[float, int, int]] = []
    for i, r in enumerate(reqs):
        if r.probs is None:
            continue
        low = 1.0
        for j, p in enumerate(r.probs[: r.kept - 1]):
            low = min(low, float(p))  # a token is accepted only after those before it
            cands.append((-low, j, i))
    cands.sort()
    idx = {id(r): i for i, r in enumerate(reqs)}
    runs = [[idx[id(r)] for r in run] for run in _runs(reqs)]
    run_of = [0] * len(reqs)
    for k, run in enumerate(runs):
        for i in run:
            run_of[i] = k
    rooms = [r.room for r in reqs]
    longest = [max(kept[i] for i in run) for run in runs]

    def rows_of(i: int) -> int:
        return _padded(kept[i], longest[run_of[i]], rooms[i])

    outputs = sum(kept)
    total = sum(rows_of(i) for i in range(len(reqs)))
    n_seqs = len(reqs)

    def step_price() -> float:
        base = _cost_of(cost, total, outputs)
        return base * shape(n_seqs, max(longest)) if shape is not None else base

    # the drafts kept whole add a constant to the expected tokens: left out, except in
    # the plain plan's own rate, where they count as the rows they are
    expected = float(len(reqs))
    plain_tokens = sum(1.0 if r.probs is not None else float(k) for r, k in zip(
        reqs, kept, strict=True))
    plain_cost = step_price()
    if plain_cost > 0:
        rate = max(rate, plain_tokens / plain_cost)

    def value(expected: float) -> float:
        return expected - rate * step_price()

    start = list(kept)
    taken: list[int] = []  # the candidates added, in order (their sequences)
    best, best_n = value(expected), 0
    for neg_p, j, i in cands:
        if kept[i] != j + 1:  # a draft is a path: its tokens come in order
            continue
        taken.append(i)
        run = runs[run_of[i]]
        if kept[i] + 1 > longest[run_of[i]]:  # the run's padding grows with it
            before = sum(rows_of(m) for m in run)
            kept[i] += 1
            longest[run_of[i]] = kept[i]
            total += sum(rows_of(m) for m in run) - before
        else:
            before = rows_of(i)
            kept[i] += 1
            total += rows_of(i) - before
        outputs += 1
        expected -= neg_p
        v = value(expected)
        if v > best:
            best, best_n = v, len(taken)
    for i in taken[:best_n]:
        start[i] += 1
    return start


def plan_step(pending: Sequence[StepRows], n_batch: int, cost: Callable[[int], float],
              rate: float, pad_to: Callable[[int, int], int] | None = None,
              shape: Callable[[int, int], float] | None = None) -> list[StepRows]:
    """Choose this step's requests and set their ``kept``, ``rows`` and ``offset``; the
    rest wait for the next step. Never empty when ``pending`` is not."""
    decodes = [r for r in pending if not r.prompt]
    prompts = [r for r in pending if r.prompt]
    budget = n_batch - (min(PROMPT_RESERVE, n_batch // 2) if prompts else 0)
    # every decoding sequence's last token first (none waits a step for another's
    # draft), then the drafts in arrival order with what the budget leaves
    chosen = [r for r in decodes if r.room >= 1][:max(budget, 1)]
    used = len(chosen)
    for r in chosen:
        draft = min(len(r.tokens), r.room) - 1
        r.kept = 1 + min(draft, max(0, budget - used))
        used += r.kept - 1
    if len(chosen) > 1:
        for r, k in zip(chosen, joint_lengths(chosen, cost, rate, shape), strict=True):
            r.kept = min(r.kept, k)
    else:
        for r in chosen:  # a step of its own: as its drafter chose
            r.kept = min(r.kept, r.want or r.kept)
    rows = padded_rows(chosen, [r.kept for r in chosen])
    if len(chosen) == 1 and pad_to is not None:
        # one sequence: pad to a cheaper measured batch shape, as a lone step always did
        rows[0] += pad_to(rows[0], chosen[0].room)
    # padding must stay within the budget: drop it where it would not
    for i in range(len(rows) - 1, -1, -1):
        if sum(rows) <= n_batch:
            break
        rows[i] = chosen[i].kept
    for r, n in zip(chosen, rows, strict=True):
        r.rows = n
    used = sum(rows)
    for r in prompts:
        left = n_batch - used
        if left <= 0:
            break
        r.kept = r.rows = min(len(r.tokens), left, r.room)
        if r.kept < 1:
            continue
        chosen.append(r)
        used += r.rows
    if not chosen and pending:  # nothing fits the budget: the first request alone
        r = pending[0]
        r.kept = r.rows = max(1, min(len(r.tokens), r.room, n_batch))
        chosen.append(r)
    # decoding rows by sequence id (runs of consecutive ids share ubatches), prompts after
    chosen.sort(key=lambda r: (r.prompt, r.seq_id))
    offset = 0
    for r in chosen:
        r.offset = offset
        r.shared = len(chosen)
        offset += r.rows
    return chosen


class SharedStepPrices:
    """What shared steps cost, measured while serving, against what the profile says.

    The profile prices a step by its rows (measured on one sequence); a step of several
    sequences also pays for how llama.cpp splits it (a KV stream per sequence: ubatches of
    equal rows of consecutive ids), and that differs by shape. Each decode-only step's
    seconds per profile unit are kept per shape (sequences, rows of the longest), as a
    moving average; ``factor(sequences, rows)`` is that shape's figure over the average
    of all shapes seen (1.0 until the shape has been seen ``MIN_SEEN`` times), so that
    the plan compares the shapes it chooses between at what they cost here."""

    MIN_SEEN = 3
    ALPHA = 0.1
    MAX_ROWS_KEY = 64

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_shape: dict[tuple[int, int], tuple[float, int]] = {}  # s/unit, count
        self._overall = 0.0
        self._seen = 0

    @classmethod
    def key(cls, sequences: int, rows: int) -> tuple[int, int]:
        return sequences, min(rows, cls.MAX_ROWS_KEY)

    def observe(self, sequences: int, rows: int, modelled: float, seconds: float) -> None:
        if modelled <= 0 or seconds <= 0:
            return
        per_unit = seconds / modelled
        with self._lock:
            k = self.key(sequences, rows)
            old, n = self._by_shape.get(k, (per_unit, 0))
            self._by_shape[k] = (old + self.ALPHA * (per_unit - old) if n else per_unit, n + 1)
            self._overall = per_unit if not self._seen else \
                self._overall + self.ALPHA * 0.5 * (per_unit - self._overall)
            self._seen += 1

    def factor(self, sequences: int, rows: int) -> float:
        with self._lock:
            got = self._by_shape.get(self.key(sequences, rows))
            if got is None or got[1] < self.MIN_SEEN or self._overall <= 0:
                return 1.0
            return got[0] / self._overall

    def as_dict(self) -> dict[str, float]:
        with self._lock:
            return {f"{k[0]}x{k[1]}": round(v / self._overall, 3)
                    for k, (v, n) in sorted(self._by_shape.items())
                    if n >= self.MIN_SEEN and self._overall > 0}


class Interrupted(Exception):
    """A ``quiet_exclusive`` wait ended by its stop event (the daemon is stopping)."""


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


class StepBatcher:
    """Gathers the active generations' rows and runs one decode per step for them all."""

    def __init__(
        self,
        run: Callable[[list[StepRows]], None],
        n_batch: int,
        cost: Callable[[int], float],
        pad_to: Callable[[int, int], int] | None = None,
    ) -> None:
        """``run(rows)``: evaluate the planned rows in one decode. ``cost(n)``: what a
        step of n verified rows costs relative to one."""
        self._run = run
        self.n_batch = n_batch
        self._cost = cost
        self._pad_to = pad_to
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
        self.prices = SharedStepPrices()

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
                    self._cond.notify_all()

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

    def _submit(self, req: StepRows) -> None:
        cond = self._cond
        with cond:
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
        batch = plan_step(self._pending, self.n_batch, self._cost, self.rate, self._pad_to,
                          self.prices.factor)
        taken = {id(r) for r in batch}
        self._pending = [r for r in self._pending if id(r) not in taken]
        self._busy = True
        error: BaseException | None = None
        gap = time.monotonic() - self._free_since
        if gap < 1.0:  # not an idle model: the sequences' own work between two decodes
            self.counters.between_s += gap
        self._cond.release()
        started = time.monotonic()
        for r in batch:
            r.decode_started = started
        t0 = time.perf_counter()
        try:
            self._run(batch)
        except BaseException as exc:  # every sequence of the step gets it
            error = exc
        finally:
            dt = time.perf_counter() - t0
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
        if decodes:
            modelled = step_cost(self._cost, [r.rows for r in decodes],
                                 [r.kept for r in decodes])
            self._rate_tokens *= RATE_DECAY
            self._rate_cost = self._rate_cost * RATE_DECAY + modelled
            if error is None and len(decodes) == len(batch):  # prompt rows would skew it
                self.prices.observe(len(decodes), max(r.rows for r in decodes), modelled, dt)
        for r in batch:
            r.step_s = dt
            r.error = error
            r.done = True
        self._in_flight = 0 if error is not None else len(batch)
        if error is not None:
            self._free_since = time.monotonic()
        self._cond.notify_all()
