"""What a step of several sequences costs: llama.cpp's ubatch split, and a price for it
fitted to the steps served (no llama.cpp here: the batcher and its tests use it).

With a KV stream per sequence (``kv_unified`` off), llama.cpp splits a batch into
ubatches with ``llama_batch_allocr::split_equal(n_ubatch, sequential=true)``: each
ubatch takes a run of consecutive sequence ids (starting at the first row not yet
taken, in batch order) and the same number of rows from each, as many as the shortest
of them has left. Rows per sequence 4,1,1,1,1,1,1,1 (ids 0-7) are two ubatches (8 x 1,
then 1 x 3); 4,1,4,1,... three; padding every sequence to 4 makes one of 8 x 4.

Measured on the 2-core EPYC VM (``bench/shared_step_cost.py --sequences 8``; 1 row of
one sequence 11 ms): 8 sequences x 1 row 55 ms, 1 sequence x 8 rows 41 ms (a sequence
in a ubatch costs ~2 ms beyond its rows); 4,1,1,1,1,1,1,1 in one decode 88 ms, padded
to 8 x 4 109 ms; 2,2,2,2,1,1,1,1 92 ms, padded 70 ms; each ubatch after the first ~10
ms beyond its rows. So a step's price is, summed over its ubatches:

* ``rows``: the one-sequence profile's cost of the ubatch's rows with logits;
* ``padding``: what the profile adds for its rows without logits (padding; the prior
  weighs it PAD_ROW_WEIGHT: no output layer for them);
* ``sequences``: sequences beyond the first in the ubatch;
* ``attention``: rows x the longest context among the ubatch's sequences (thousands of
  cells: with streams, attention runs over the longest stream's cells for every row);
* ``ubatches``: ubatches after the first;
* ``prompt``: prompt rows (hundreds; no logits, outside the one-row profile's range).

``StepCostModel`` fits the six coefficients (seconds) by recursive least squares with
forgetting to every step served, starting from pseudo-observations of a prior (the
figures above, scaled to the profile's one-row seconds), and prices in units of a
one-row step, as the drafters' profiles do.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

# Cost of a padding row (no logits) relative to a verified row. gemma-3-270m, 2-core
# Sapphire Rapids, 4 sequences of 1,500 cached tokens: 30 padding rows added 81 ms to a
# 64-row batch where 60 verified rows cost 395 ms.
PAD_ROW_WEIGHT = 0.4

FEATURES = ("rows", "padding", "sequences", "attention", "ubatches", "prompt")
# Prior coefficients in units of the profile's one-row step (see the module docstring:
# EPYC 2 cores, 11 ms a row): ~2 ms a sequence, nothing for attention beyond what the
# profile's own context holds, ~10 ms an extra ubatch, ~1.2 ms a prompt row.
PRIOR_UNITS = (1.0, PAD_ROW_WEIGHT, 0.19, 0.0, 0.9, 11.0)


@dataclass(frozen=True)
class Entry:
    """One sequence's rows in a step, in batch order."""

    seq_id: int
    rows: int  # rows in the batch, padding included
    outputs: int  # its first ``outputs`` rows have logits
    pos0: int  # position of its first row
    prompt: bool = False


@dataclass(frozen=True)
class Ubatch:
    members: tuple[int, ...]  # indices into the step's entries
    depth: int  # rows taken from each
    first: tuple[int, ...]  # for each member, the index of its first row taken


def split_equal(entries: Sequence[Entry], n_ubatch: int) -> list[Ubatch]:
    """The ubatches llama.cpp makes of a batch with a KV stream per sequence (each
    sequence's rows contiguous in batch order), as ``split_equal(n_ubatch, true)``."""
    left = [e.rows for e in entries]
    taken = [0] * len(entries)
    out: list[Ubatch] = []
    while True:
        members: list[int] = []
        last = -2
        for i, e in enumerate(entries):
            if left[i] == 0:
                continue
            if members and e.seq_id != last + 1:
                continue
            members.append(i)
            last = e.seq_id
            if len(members) > n_ubatch:
                break
        if not members:
            return out
        depth = min(min(left[i] for i in members), max(1, n_ubatch // len(members)))
        out.append(Ubatch(tuple(members), depth, tuple(taken[i] for i in members)))
        for i in members:
            left[i] -= depth
            taken[i] += depth


def step_features(entries: Sequence[Entry], n_ubatch: int,
                  cost: Callable[[int], float]) -> np.ndarray:
    """The six features of a step (see the module docstring); ``cost(n)``: the
    one-sequence profile's cost of n rows with logits, relative to one."""
    f = np.zeros(len(FEATURES))
    for k, u in enumerate(split_equal(entries, n_ubatch)):
        outs = total = prompt = 0
        longest = 0
        for i, first in zip(u.members, u.first, strict=True):
            e = entries[i]
            longest = max(longest, e.pos0 + first + u.depth)
            if e.prompt:
                prompt += u.depth
                continue
            total += u.depth
            outs += max(0, min(e.outputs, first + u.depth) - first)
        if total:
            base = cost(outs) if outs else 0.0
            f[0] += base
            f[1] += cost(total) - base if total > outs else 0.0
        f[2] += len(u.members) - 1
        f[3] += (total + prompt) * longest / 1000.0
        f[4] += 1 if k else 0
        f[5] += prompt / 100.0
    return f


def sorted_step_price(theta: Sequence[float], ids: Sequence[int], rows: Sequence[int],
                      outs: Sequence[int], ends: Sequence[int], n_ubatch: int,
                      cost: Callable[[int], float]) -> float:
    """``features @ theta`` for decoding rows only, given in increasing sequence id
    (``ends``: each one's last position + 1): the planner's inner loop, written out."""
    t0, tp, t1, t2, t3 = theta[0], theta[1], theta[2], theta[3], theta[4]
    n = len(ids)
    left = list(rows)
    total_price = 0.0
    k = 0
    start = 0
    while True:
        while start < n and left[start] == 0:
            start += 1
        if start == n:
            return total_price
        j = start + 1
        depth = left[start]
        while j < n and left[j] and ids[j] == ids[j - 1] + 1:
            if left[j] < depth:
                depth = left[j]
            j += 1
        members = j - start
        depth = min(depth, max(1, n_ubatch // members))
        o = t = 0
        longest = 0
        for i in range(start, j):
            first = rows[i] - left[i]
            t += depth
            got = outs[i] - first
            o += depth if got >= depth else (got if got > 0 else 0)
            end = ends[i] - left[i] + depth
            if end > longest:
                longest = end
            left[i] -= depth
        base = cost(o) if o else 0.0
        total_price += t0 * base + (tp * (cost(t) - base) if t > o else 0.0) \
            + t1 * (members - 1) + t2 * t * longest / 1000.0 + (t3 if k else 0.0)
        k += 1


class StepCostModel:
    """A step's price from its features, fitted to the seconds of the steps served.

    Recursive least squares with forgetting (``DECAY`` a step) over the six
    coefficients, started from ``PRIOR_WEIGHT`` pseudo-observations of the prior at a few
    typical shapes; coefficients are kept non-negative. ``price`` is in units of the
    fitted cost of one row of one sequence (the ``rows`` coefficient), as ``cost`` is."""

    DECAY = 0.998
    PRIOR_WEIGHT = 1.0
    RIDGE = 1e-4  # keeps the solve defined along features no step has shown yet

    def __init__(self, cost: Callable[[int], float], n_ubatch: int,
                 unit_seconds: float = 0.012) -> None:
        self._cost = cost
        self.n_ubatch = n_ubatch
        self._lock = threading.Lock()
        self.observed = 0
        self._reset(unit_seconds)

    def _reset(self, unit_seconds: float) -> None:
        self.unit_seconds = unit_seconds
        prior = np.array(PRIOR_UNITS) * unit_seconds
        self._prior = prior
        n = len(FEATURES)
        self._a = np.zeros((n, n))
        self._b = np.zeros(n)
        for shape in _prior_shapes():
            x = step_features(shape, self.n_ubatch, self._cost)
            self._a += self.PRIOR_WEIGHT * np.outer(x, x)
            self._b += self.PRIOR_WEIGHT * x * float(x @ prior)
        self._theta: np.ndarray | None = prior.copy()

    def rescale(self, unit_seconds: float) -> None:
        """A new one-row profile (measured, or loaded): start again from the prior at
        its scale."""
        with self._lock:
            self.observed = 0
            self._reset(unit_seconds)

    def features(self, entries: Sequence[Entry]) -> np.ndarray:
        return step_features(entries, self.n_ubatch, self._cost)

    def observe(self, entries: Sequence[Entry], seconds: float) -> None:
        if seconds <= 0 or not entries:
            return
        x = self.features(entries)
        with self._lock:
            self._a = self.DECAY * self._a + np.outer(x, x)
            self._b = self.DECAY * self._b + x * seconds
            self.observed += 1
            self._theta = None  # solved when next asked for, not on the step's path

    @property
    def theta(self) -> np.ndarray:
        """The fitted coefficients (seconds per unit of each feature)."""
        with self._lock:
            if self._theta is None:
                # scaled per feature: the features' magnitudes differ by orders
                ridge = self.RIDGE * np.maximum(np.diag(self._a), 1e-12)
                theta = np.linalg.solve(self._a + np.diag(ridge),
                                        self._b + ridge * self._prior)
                # a row always costs something: the price is in its units
                theta[0] = max(theta[0], 0.05 * self._prior[0])
                self._theta = np.maximum(theta, 0.0)
            return self._theta

    @theta.setter
    def theta(self, value: np.ndarray) -> None:
        """Fixed coefficients (an exact oracle in tests), until the next observation."""
        with self._lock:
            self._theta = np.asarray(value, dtype=float)

    def marginal_row(self) -> float:
        """What a row adds to a large step on the profile, in units of one row (the
        profile's average slope from 1 to 32 rows)."""
        return max(0.0, (self._cost(33) - self._cost(1)) / 32.0)

    def cheapest_row(self) -> float:
        """The least a draft token's row adds to a step, in units: a new padding row's
        share of a row, or turning a padding row into one with logits (the planner's
        candidates below this many expected tokens per unit cannot pay)."""
        theta = self.theta
        pad = float(theta[1] / theta[0])
        return min(PAD_ROW_WEIGHT, pad, max(0.0, 1.0 - pad)) * self.marginal_row()

    def seconds(self, entries: Sequence[Entry]) -> float:
        return float(self.features(entries) @ self.theta)

    @property
    def cost(self) -> Callable[[int], float]:
        """The one-sequence profile it prices rows with."""
        return self._cost

    def price_sorted(self, ids: Sequence[int], rows: Sequence[int], outs: Sequence[int],
                     ends: Sequence[int], cost: Callable[[int], float] | None = None) -> float:
        """``price`` of decoding rows given in increasing sequence id (the planner's);
        ``cost``: the profile, memoised by the caller."""
        theta: list[float] = self.theta.tolist()
        return sorted_step_price(theta, ids, rows, outs, ends, self.n_ubatch,
                                 cost or self._cost) / theta[0]

    def price(self, entries: Sequence[Entry]) -> float:
        """The step's modelled cost in units of one row of one sequence."""
        theta = self.theta
        return float(self.features(entries) @ theta) / float(theta[0])

    def as_dict(self) -> dict[str, object]:
        theta = self.theta
        return {"observed_steps": self.observed,
                "seconds": {k: round(float(v), 6) for k, v in zip(FEATURES, theta,
                                                                   strict=True)},
                "units": {k: round(float(v / theta[0]), 4) for k, v in zip(FEATURES, theta,
                                                                         strict=True)}}


def _prior_shapes() -> list[list[Entry]]:
    """Typical steps the prior is spread over: plain and drafted, alone and shared, with
    padding, split into several ubatches, and beside a prompt chunk."""
    def decodes(rows: Sequence[int], kept: Sequence[int] | None = None,
                ctx: int = 1500) -> list[Entry]:
        kept = kept or rows
        return [Entry(i, r, k, ctx) for i, (r, k) in enumerate(zip(rows, kept, strict=True))]

    return [
        decodes([1]), decodes([4]), decodes([16]), decodes([1], ctx=4000),
        decodes([1] * 4), decodes([1] * 8), decodes([2] * 8), decodes([4] * 8),
        decodes([4] * 8, [4, 1, 1, 1, 1, 1, 1, 1]), decodes([4, 1, 1, 1, 1, 1, 1, 1]),
        decodes([4, 1, 4, 1, 1, 1, 1, 1]), decodes([2, 2, 2, 2, 1, 1, 1, 1]),
        [*decodes([1] * 7), Entry(7, 128, 0, 1500, prompt=True)],
        [Entry(0, 256, 0, 0, prompt=True)],
    ]
