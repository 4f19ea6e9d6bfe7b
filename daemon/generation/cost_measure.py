"""What verifying a batch of k tokens costs on this machine, and the padding it implies.

llama.cpp's CPU kernels work in blocks of rows, so some batch sizes cost less than
smaller ones; a batch is then padded up to the cheaper size (the padding is evaluated
but never accepted). The relative costs feed ``suffixcache.CostProfile`` so drafts
stay within what pays.

Interface:

* ``plan_batch_shapes(seconds)``: from seconds per batch size, the padding plan and
  the cost of every size after padding.
* ``CostMeasurement``, a mixin of ``Verifier`` (the host calls ``_init_costs`` in its
  constructor; what the measurement uses of it is spelt out by ``_Host``):

  - ``measure_cost_profile(ks, reps)``: times batches on a scratch slot (while serving:
    each in a gap between requests), sets ``cost_seconds`` / ``raw_cost_seconds``, the
    padding plan, ``costs_distorted`` and ``cost_load`` (the load it was taken under),
    and returns the profile relative to one token; ``MeasurementStopped`` when stopped;
  - ``_observe_cost(n, seconds)``: one verification step of ``n`` tokens while serving
    (called by the step loop, once per step);
  - ``restore_costs(raw, padded)``: the same state from a stored measurement;
  - ``live_cost_profile(min_samples)``: the profile as serving measures it;
  - ``_padding(n, limit)`` and ``batch_padding``: the padding plan.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Protocol

import numpy as np

from .kv_slots import Slot

log = logging.getLogger("suffixd.verifier")

# A bigger batch shape is used in place of a smaller one only when it is at least this
# much cheaper, so that measurement noise does not make every batch a padded one.
PAD_MARGIN = 0.95
# Weight of each new verification step in the serving cost averages (~30 steps' memory).
LIVE_COST_ALPHA = 0.03
# Rounds of the cost measurement while it still looks load-distorted (see
# measure_cost_profile); one round of 33 sizes takes about 1.5 s here.
MAX_PROFILE_ROUNDS = 8
# Batch sizes the measurement times by default, 1 to COST_SIZES: a draft of up to 32
# tokens and its bonus row (SUFFIXD_COST_SIZES lowers it: generation/pipeline.py).
COST_SIZES = 33
# A measurement whose kept (fastest) batches spent more than this share of their
# threads' time waiting for a CPU (other processes, or more threads than cores) was
# taken under load: stored as distorted, and measured again at the next start.
CPU_WAIT_DISTORTED = 0.10
# ... and one whose one-token batch was slower than serving's own one-token steps (an
# average, so normally slower than a fastest-of-rounds) by more than this factor.
SERVING_MARGIN = 1.5
SERVING_MIN_STEPS = 16


class MeasurementStopped(Exception):
    """The cost measurement was stopped (the daemon stops) before it ended."""


def thread_cpu_times() -> tuple[int, int] | None:
    """Nanoseconds this process's threads have run, and waited runnable for a CPU, so
    far (Linux schedstat; None elsewhere)."""
    run = wait = 0
    try:
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
                    fields = f.read().split()
            except FileNotFoundError:  # the thread ended meanwhile
                continue
            run += int(fields[0])
            wait += int(fields[1])
    except (OSError, ValueError, IndexError):
        return None
    return run, wait


def cpu_wait_share(before: tuple[int, int] | None,
                   after: tuple[int, int] | None) -> float | None:
    """The share of the threads' time between two ``thread_cpu_times`` that they spent
    waiting for a CPU: 0 on an idle machine, ~0.5 with a busy process per core."""
    if before is None or after is None:
        return None
    run, wait = after[0] - before[0], after[1] - before[1]
    if run <= 0 or wait < 0:
        return None
    return wait / (run + wait)


def _plausible(samples: dict[int, list[float]]) -> bool:
    """Whether the fastest one-token time is at most every other size's fastest time."""
    if 1 not in samples or not samples[1]:
        return True
    one = min(samples[1])
    return all(min(v) >= one for k, v in samples.items() if v and k > 1)


def pad_candidates(k: int, sizes: Sequence[int]) -> list[int]:
    """The padded shapes measured for a batch of ``k`` rows: the next multiple of 4
    (llama.cpp's CPU matrix kernels work in blocks of 4 and 8 rows)."""
    j = -(-k // 4) * 4
    return [j] if k > 1 and j != k and j in sizes else []


def plan_batch_shapes(
    seconds: dict[int, float], padded: dict[tuple[int, int], float] | None = None
) -> tuple[dict[int, int], dict[int, float]]:
    """From measured seconds per batch size (every row with logits) and, in ``padded``,
    seconds of a batch of j tokens with logits for its first k rows (keyed (k, j)): which
    sizes to pad to a cheaper, larger shape, and the cost of every size after padding.

    A j-token batch asking logits for k of its rows costs at most its all-rows figure
    (the output layer and the last layer's feed-forward skip the other rows)."""
    padded = padded or {}
    sizes = sorted(seconds)
    pad_to: dict[int, int] = {}
    effective: dict[int, float] = {}
    for i, n in enumerate(sizes):
        options = {j: min(seconds[j], padded.get((n, j), seconds[j])) for j in sizes[i:]}
        best = min(options, key=lambda j: (options[j], j))
        # One token (plain decoding) takes llama.cpp's vector path and is never padded:
        # a larger batch measuring cheaper than it is load noise, not a kernel effect.
        if n > 1 and best != n and options[best] < PAD_MARGIN * seconds[n]:
            pad_to[n] = best
            effective[n] = options[best]
        else:
            effective[n] = seconds[n]
    return pad_to, effective


def padding_logits(seconds: dict[int, float], padded: dict[tuple[int, int], float],
                   pad_to: dict[int, int]) -> set[int]:
    """The padded sizes (``pad_to``'s keys) whose larger shape is cheaper with logits for
    every row than for the real rows only: there the padding asks for logits too (wasted,
    but llama.cpp's output layer, 262k wide for gemma-3, runs its row-blocked kernel on
    them instead of a vector pass per left-over row: on the 2-core EPYC 8 rows with 7
    logits cost 62 ms, with 8 logits 43 ms)."""
    return {n for n, j in pad_to.items() if seconds[j] <= padded.get((n, j), seconds[j])}


class _Host(Protocol):
    """What ``measure_cost_profile`` uses of its host (``Verifier``), its own state included."""

    n_batch: int
    n_ctx: int
    vocab_size: int
    cost_seconds: dict[int, float]
    costs_distorted: bool
    cost_load: dict[str, object]
    measured_batches: int
    _live_s: dict[int, float]
    _live_n: dict[int, int]
    raw_cost_seconds: dict[int, float]
    padded_cost_seconds: dict[tuple[int, int], float]
    _pad_to: dict[int, int]
    _pad_logits: set[int]

    @property
    def bos_token(self) -> int: ...
    def _measure_turn(self) -> AbstractContextManager[None]: ...
    def _timed_batch(self, key: str, base: list[int], k: int,
                     j: int) -> tuple[float, float | None] | None: ...
    def _decode(self, seq_id: int, tokens: Sequence[int], pos0: int, all_logits: bool,
                outputs: int | None = None) -> None: ...
    def _logits_view(self, i: int) -> np.ndarray: ...
    def _seq_rm(self, seq_id: int, p0: int) -> None: ...
    def _try_acquire_slot(self, key: str) -> Slot | None: ...
    def _release_slot(self, slot: Slot) -> None: ...
    def _make_room(self, slot: Slot, needed: int) -> None: ...
    def forget(self, session_key: str) -> None: ...
    def _on_new_costs(self, one_row_seconds: float) -> None: ...


class CostMeasurement:
    """The verifier's batch costs: measured at start-up, averaged while serving."""

    def _init_costs(self) -> None:
        # Measured by measure_cost_profile: seconds per batch of k tokens as verified
        # (after padding), the raw measurement, and the padding plan.
        self.cost_seconds: dict[int, float] = {}
        self.raw_cost_seconds: dict[int, float] = {}
        # seconds of a j-token batch with logits for its first k rows, keyed (k, j)
        self.padded_cost_seconds: dict[tuple[int, int], float] = {}
        self._pad_to: dict[int, int] = {}
        self._pad_logits: set[int] = set()  # padded sizes whose padding asks for logits
        # The last measurement looked distorted by machine load, and the figures that
        # say so (see measure_cost_profile).
        self.costs_distorted = False
        self.cost_load: dict[str, object] = {}
        self.measured_batches = 0  # batches the measurement has timed (its progress)
        # What verification steps cost while serving, by tokens verified (draft + 1):
        # an exponential average of seconds and a sample count (see live_cost_profile).
        self._live_s: dict[int, float] = {}
        self._live_n: dict[int, int] = {}

    @property
    def batch_padding(self) -> dict[int, int]:
        """Batch sizes that are padded up to a cheaper measured size (size -> padded)."""
        return dict(self._pad_to)

    def _padding(self, n: int, limit: int) -> int:
        """How many tokens to add to a batch of ``n`` to reach a cheaper measured shape."""
        target = self._pad_to.get(n, n)
        return target - n if n < target <= limit else 0

    def _logit_rows(self, n: int, rows: int) -> int:
        """Rows of a ubatch of ``rows`` rows, ``n`` of them verified, that ask for logits:
        ``n``, or the padded shape's size where logits on every row of it measured
        cheaper (``padding_logits``) and the ubatch has that many rows."""
        target = self._pad_to.get(n, n)
        return target if n in self._pad_logits and n < target <= rows else n

    def measure_cost_profile(
        self: _Host, ks: Sequence[int] = tuple(range(1, COST_SIZES + 1)), reps: int = 5,
        max_rounds: int = MAX_PROFILE_ROUNDS,
    ) -> dict[int, float]:
        """Time one verification batch of k tokens (logits for every row) relative to k = 1,
        and each k padded to the next multiple of 4 (logits for its k rows).

        Runs on a scratch slot at a realistic context length, sizes interleaved so
        that a burst of machine load does not hit one size only; each size keeps its
        fastest repetition. While serving, each timed batch takes the model only once no
        generation is active or waiting (``_measure_turn``) and the scratch slot only for
        that batch, so a request never waits for the measurement longer than one batch;
        ``MeasurementStopped`` once ``stop_measuring`` is set (the daemon stops).
        llama.cpp's CPU kernels work in blocks of rows, so some batch sizes cost less
        than smaller ones (here 8 tokens cost less than 5); a batch is then padded up to
        the cheaper size, and the returned profile is the cost after padding. It feeds
        ``suffixcache.CostProfile`` so drafts stay within what pays.

        ``costs_distorted`` says honestly whether machine load shaped the result: the
        kept (fastest) batches waited for a CPU (``CPU_WAIT_DISTORTED``, from the
        kernel's per-thread run-queue times), one token was not the cheapest batch, or
        the one-token batch was slower than serving's own one-token steps
        (``SERVING_MARGIN``); ``cost_load`` holds the figures.
        """
        key = "\x00cost-profile"
        ks = sorted({int(k) for k in ks if 1 <= int(k) <= self.n_batch})
        # a realistic context: 512 tokens, or what a small context leaves room for
        n_base = max(1, min(512, self.n_ctx - max(ks) - 1))
        base = [self.bos_token] + [(7 * i + 100) % self.vocab_size for i in range(n_base - 1)]
        samples: dict[int, list[float]] = {k: [] for k in ks}
        # (k, j): j tokens, logits for the first k rows (a padded batch of k)
        shapes = [(k, k) for k in ks] + [(k, j) for k in ks for j in pad_candidates(k, ks)]
        shapes.sort(key=lambda s: (s[0], s[1]))
        padded: dict[tuple[int, int], list[float]] = {s: [] for s in shapes if s[0] != s[1]}
        # each sample's share of the llama.cpp threads' time spent waiting for a CPU
        waits: dict[tuple[int, int], list[float | None]] = {s: [] for s in shapes}
        rounds = 0
        try:
            # One token is the cheapest batch there is. Under heavy load (more busy
            # threads than cores) llama.cpp's threads wait for each other at every op,
            # which inflates small batches most: one such measurement had one token
            # dearer than eight. So while the fastest one-token time is not below every
            # other size's, measure more rounds (up to a cap).
            while rounds < reps or (rounds < max_rounds and not _plausible(samples)):
                rounds += 1
                for k, j in shapes:
                    while True:  # until this shape is timed (the base context may go first)
                        timed = self._timed_batch(key, base, k, j)
                        if timed is not None:
                            break
                    dt, wait = timed
                    (samples[k] if k == j else padded[(k, j)]).append(dt)
                    waits[(k, j)].append(wait)
        finally:
            self.forget(key)
        # The fastest of the repetitions: other processes on the machine only ever add
        # time, and a profile inflated by a burst of load makes the drafter too timid.
        raw = {k: float(np.min(v)) for k, v in samples.items()}
        best_padded = {s: float(np.min(v)) for s, v in padded.items()}
        kept_waits = [w[int(np.argmin(samples[k] if k == j else padded[(k, j)]))]
                      for (k, j), w in waits.items()]
        known = [w for w in kept_waits if w is not None]
        cpu_wait = float(np.mean(known)) if known else None
        serving_one = self._live_s.get(1) if self._live_n.get(1, 0) >= SERVING_MIN_STEPS \
            else None
        implausible = not _plausible(samples)
        loaded = cpu_wait is not None and cpu_wait > CPU_WAIT_DISTORTED
        slower = serving_one is not None and raw.get(1, 0.0) > SERVING_MARGIN * serving_one
        self.costs_distorted = implausible or loaded or slower
        self.cost_load = {
            "rounds": rounds,
            "cpu_wait_share": None if cpu_wait is None else round(cpu_wait, 3),
            "one_token_s": round(raw.get(1, 0.0), 6),
            "serving_one_token_s": None if serving_one is None else round(serving_one, 6),
            "one_token_not_cheapest": implausible,
            "distorted": self.costs_distorted,
        }
        if self.costs_distorted:
            log.warning(
                "verifier cost profile measured under load (%s); it is used, stored as "
                "distorted and measured again at the next start",
                ", ".join(why for why, hit in (
                    (f"its batches waited for a CPU {cpu_wait or 0:.0%} of the time", loaded),
                    ("one token not the cheapest batch", implausible),
                    ("one token slower than serving's own steps", slower)) if hit),
            )
        if implausible:
            # larger batches are taken to cost at least one token
            floor = raw.get(1, min(raw.values()))
            raw = {k: max(t, floor) for k, t in raw.items()}
            best_padded = {s: max(t, floor) for s, t in best_padded.items()}
        CostMeasurement.restore_costs(
            self, {**self.raw_cost_seconds, **raw}, {**self.padded_cost_seconds, **best_padded})
        one = self.cost_seconds[min(self.cost_seconds)]
        return {k: round(self.cost_seconds[k] / one, 3) for k in ks}

    def one_token_seconds(self: _Host, reps: int = 3, context: int = 64) -> float:
        """One token's decode after a short context, the fastest of ``reps``: a figure
        for a provisional plan (the draft model's, before the profile is measured) in a
        fraction of a second, where the full measurement takes seconds to minutes."""
        key = "\x00one-token"
        base = [self.bos_token] + [(7 * i + 100) % self.vocab_size for i in range(context - 1)]
        times: list[float] = []
        try:
            while len(times) < reps:
                timed = CostMeasurement._timed_batch(self, key, base, 1, 1)
                if timed is not None:
                    times.append(timed[0])
        finally:
            self.forget(key)
        return min(times)

    def _timed_batch(self: _Host, key: str, base: list[int], k: int,
                     j: int) -> tuple[float, float | None] | None:
        """One timed batch of ``j`` tokens (logits for ``k`` rows) after ``base`` on the
        scratch slot ``key``: its seconds and the share of its threads' time spent waiting
        for a CPU (None where the kernel does not say). None when the slot had lost its
        base context (a session took the slot meanwhile) and this turn evaluated it again.
        The slot is taken for this batch only, inside the measurement's turn (every slot
        is then free of requests), and between batches an idle session keeps its KV."""
        # The model first, then the slot: a request counts as waiting from before it
        # takes its slot, so a measurement that held the only slot while it waited for no
        # request to be waiting would wait forever (one KV slot: the first request hung).
        with self._measure_turn():
            slot = self._try_acquire_slot(key)
            if slot is not None:
                return CostMeasurement._timed_on(self, slot, base, k, j)
        time.sleep(0.05)  # every slot held outside a request (a certification): later
        return None

    def _timed_on(self: _Host, slot: Slot, base: list[int], k: int,
                  j: int) -> tuple[float, float | None] | None:
        """``_timed_batch`` on ``slot``, the model held; releases the slot."""
        try:
            if slot.tokens != base:
                self._make_room(slot, len(base) + j)
                self._seq_rm(slot.seq_id, 0)
                slot.tokens = []
                self._decode(slot.seq_id, base, 0, all_logits=False)
                slot.tokens = list(base)
                return None
            before = thread_cpu_times()
            t0 = time.perf_counter()
            self._decode(slot.seq_id, base[1 : j + 1], len(base), all_logits=True,
                         outputs=k)
            self._logits_view(k - 1)
            dt = time.perf_counter() - t0
            after = thread_cpu_times()
            self._seq_rm(slot.seq_id, len(base))
            self.measured_batches += 1
        finally:
            self._release_slot(slot)
        return dt, cpu_wait_share(before, after)

    def _on_new_costs(self, one_row_seconds: float) -> None:
        """A measured or loaded profile is in use (the verifier rescales its shared-step
        model from it)."""

    def restore_costs(
        self: _Host, raw: dict[int, float], padded: dict[tuple[int, int], float]
    ) -> dict[int, float]:
        """Take a measurement made earlier (``raw_cost_seconds``, ``padded_cost_seconds``;
        the data dir keeps one, generation/cost_store.py): the padding plan is made again
        from it, and the profile relative to one token is returned."""
        # Steps on other threads read these while serving: each is replaced whole, never
        # changed in place (a step planned with the old padding and the new costs only
        # changes a batch's shape, never which tokens are accepted).
        pad_to, cost = plan_batch_shapes(raw, padded)
        self.raw_cost_seconds, self.padded_cost_seconds = dict(raw), dict(padded)
        self._pad_to = pad_to
        self._pad_logits = padding_logits(raw, padded, pad_to)
        self.cost_seconds = cost
        one = cost[min(cost)]
        self._on_new_costs(one)
        return {k: round(v / one, 3) for k, v in sorted(cost.items())}

    def _observe_cost(self, n: int, seconds: float) -> None:
        old = self._live_s.get(n)
        self._live_s[n] = seconds if old is None else old + LIVE_COST_ALPHA * (seconds - old)
        self._live_n[n] = self._live_n.get(n, 0) + 1

    def live_cost_profile(self, min_samples: int = 16) -> dict[int, float] | None:
        """The cost profile as serving measures it (relative to one token), for the sizes
        verified at least ``min_samples`` times, the start-up measurement elsewhere; None
        until plain steps (one token) have been seen that often.

        The start-up profile is one moment of this machine: other processes, another
        session's long prompt or a thermal limit change what a batch costs relative to
        one token (under load, llama.cpp's threads wait for each other at every op, which
        makes small batches dearer), and a drafter planning with a stale profile drafts
        too much or too little."""
        if self._live_n.get(1, 0) < min_samples or not self.cost_seconds:
            return None
        one = self._live_s[1]
        measured = self.cost_seconds[min(self.cost_seconds)]
        start = {k: v / measured for k, v in self.cost_seconds.items()}
        live = {k: self._live_s[k] / one for k, n in self._live_n.items()
                if n >= min_samples and k > 1}
        # Sizes serving has not seen keep the start-up shape, moved by how much the
        # sizes it has seen moved (so the profile stays one consistent curve).
        moved = [live[k] / start[k] for k in live if k in start]
        factor = float(np.exp(np.mean(np.log(moved)))) if moved else 1.0
        out = {k: v * factor for k, v in start.items()}
        out.update(live)
        out[1] = 1.0
        return {k: round(max(v, 1.0), 3) for k, v in sorted(out.items())}
