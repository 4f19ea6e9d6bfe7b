"""Sampling from the target's logits, and the lossless acceptance rule for temperature > 0.

Interface:

* ``target_probs(logits, temperature, top_k, top_p)``: the distribution the target
  samples from (temperature, then top-k, then top-p, as vLLM and Hugging Face order them).
* ``speculative_sample(rows, draft, dist, noise, start)``: (accepted, next token) for a
  deterministic draft, given the target's logit rows after each draft prefix, ``dist``
  mapping a row to its distribution (``target_probs`` with the request's parameters),
  the request's ``SamplingNoise`` and the position (tokens generated so far) of row 0.

Each emitted position samples by an exponential race: with ``E_v`` independent Exp(1)
noise per token (from a uniform ``u_v`` as ``-log(1 - u_v)``), the token with the
largest ``p(v) / E_v`` wins, which is a draw from ``p`` exactly. A draft token is
accepted when it wins its position's race: with probability ``p(x)``, as in speculative
sampling with a point-mass proposal (the best any rule can do for a deterministic
draft), and every emitted token has exactly the distribution ``p``. The noise of a
position depends only on the seed and the position, never on the drafts, so a seeded
request gives the same text with a cold cache, a warm one or no drafter. And a race
moves only when the two best ``p(v) / E_v`` are within the logits' rounding of each
other, so the different numerics of llama.cpp's batch shapes (a drafted step evaluates
several rows at once) rarely change a seeded text, where an inverse-CDF draw over 262k
cumulated probabilities moves with every rounding.

Pure numpy: no model, no state (the noise is a function of seed and position).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

import numpy as np


def target_probs(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """The sampling distribution over the vocabulary: temperature, then top-k, then top-p."""
    z = logits.astype(np.float64) / temperature
    n = z.shape[0]
    if 0 < top_k < n:
        keep = np.argpartition(-z, top_k - 1)[:top_k]
        masked = np.full(n, -np.inf)
        masked[keep] = z[keep]
        z = masked
    z = z - np.max(z)
    p = np.exp(z)
    p /= p.sum()
    if top_p < 1.0:
        # The nucleus almost always lives in the few hundred best tokens; sort only those.
        m = min(n, 1024)
        cand = np.argpartition(-p, m - 1)[:m] if m < n else np.arange(n)
        cand = cand[np.argsort(-p[cand], kind="stable")]
        cum = np.cumsum(p[cand])
        if cum[-1] < top_p and m < n:
            cand = np.argsort(-p, kind="stable")
            cum = np.cumsum(p[cand])
        cut = int(np.searchsorted(cum, top_p)) + 1  # smallest prefix with mass >= top_p
        out = np.zeros(n)
        out[cand[:cut]] = p[cand[:cut]]
        p = out / out.sum()
    return p


class SamplingNoise:
    """Race noise for one request: position ``i``'s noise depends only on (seed, i).

    Without a seed, a fresh random one per request."""

    def __init__(self, seed: int | None, vocab_size: int) -> None:
        if seed is None:
            # A SeedSequence made without entropy draws it: an int (numpy types it wider).
            seed = cast(int, np.random.SeedSequence().entropy)
        self.seed = int(seed) % 2**64
        self.vocab_size = vocab_size

    def at(self, position: int) -> np.ndarray:
        """Position ``position``'s noise: one uniform in [0, 1) per token (its race time
        is ``-log(1 - u)``, which ``race`` computes only where it can matter)."""
        return np.random.default_rng([self.seed, position]).random(self.vocab_size)


def speculative_sample(
    rows: Sequence[np.ndarray] | np.ndarray,
    draft: Sequence[int],
    dist: Callable[[np.ndarray], np.ndarray],
    noise: SamplingNoise,
    start: int,
    winner: Callable[[int, np.ndarray, np.ndarray], int] | None = None,
) -> tuple[int, int]:
    """Exact speculative sampling for a deterministic draft.

    ``rows[i]`` are the target logits after ``draft[:i]``; returns (accepted, next
    token). Row i's token is the winner of its race, ``race(p_i, noise.at(start + i))``;
    draft token x is kept when it wins (probability p_i(x)). The first row whose winner
    differs emits that winner; if every draft token is kept, the bonus is row k's.
    ``winner(i, row, u)`` replaces that race where the target is not ``dist(row)`` alone
    (a grammar: the verifier's constrained race).
    """
    def race_of(i: int, row: np.ndarray, u: np.ndarray) -> int:
        return race(dist(row), u)

    pick = winner or race_of
    for i, x in enumerate(draft):
        tok = pick(i, rows[i], noise.at(start + i))
        if tok != x:
            return i, tok
    k = len(draft)
    return k, pick(k, rows[k], noise.at(start + k))


def race(p: np.ndarray, u: np.ndarray) -> int:
    """The token with the largest ``p / E`` where ``E = -log(1 - u)``: a draw from the
    weights ``p`` (which need not be normalised) when ``u`` is i.i.d. uniform; never a
    zero-weight token.

    Only tokens that can beat the likeliest one are timed: a winner ``v`` has
    ``E_v <= p_v * E_a / p_a`` for the likeliest ``a``, and ``u_v <= E_v``, so
    ``u_v < p_v * E_a / p_a`` (with a slack for rounding) keeps every possible winner: a
    multiply and a compare over the vocabulary instead of a logarithm and a division.
    ``u`` as numpy's ``random()`` draws it: multiples of 2**-53.
    """
    a = int(np.argmax(p))
    e_a = -np.log1p(-u[a])
    if e_a <= 0.0:  # u_a == 0: time zero, nobody beats it
        return a
    # the slack covers rounding (for a tiny u, -log1p(-u) rounds to u itself)
    cand = np.flatnonzero(u < p * (e_a / p[a] * (1 + 1e-9)))  # strict: never p = 0
    if not len(cand):  # only underflow can leave out a itself
        return a
    with np.errstate(divide="ignore"):  # a candidate with u == 0 wins outright (inf)
        score = p[cand] / -np.log1p(-u[cand])
    return int(cand[np.argmax(score)])
