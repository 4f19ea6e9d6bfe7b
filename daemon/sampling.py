"""Sampling from the target's logits, and the lossless acceptance rule for temperature > 0.

Interface:

* ``target_probs(logits, temperature, top_k, top_p)``: the distribution the target
  samples from (temperature, then top-k, then top-p, as vLLM and Hugging Face order them).
* ``speculative_sample(rows, draft, rng, dist)``: (accepted, next token) for a
  deterministic draft, given the target's logit rows after each draft prefix and
  ``dist`` mapping a row to its distribution (``target_probs`` with the request's
  parameters). A draft token ``x`` is accepted with probability ``p(x)``; on rejection
  the token is drawn from ``p`` with ``x`` removed and renormalised. This is speculative
  sampling with a point-mass proposal, so every emitted token has exactly the target
  distribution ``p``.

Pure numpy: no model, no state besides the caller's ``rng``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

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


def speculative_sample(
    rows: Sequence[np.ndarray] | np.ndarray,
    draft: Sequence[int],
    rng: np.random.Generator,
    dist: Callable[[np.ndarray], np.ndarray],
) -> tuple[int, int]:
    """Exact speculative sampling for a deterministic draft.

    ``rows[i]`` are the target logits after ``draft[:i]``; returns (accepted,
    next token). Draft token x at position i is kept with probability p_i(x);
    the first rejected one is replaced by a draw from p_i without x,
    renormalised; if every draft token is kept the bonus is a draw from p_k.
    """
    for i, x in enumerate(draft):
        p = dist(rows[i])
        px = float(p[x])
        if rng.random() < px:
            continue
        p = p.copy()
        p[x] = 0.0
        return i, _draw(p, rng)
    return len(draft), _draw(dist(rows[len(draft)]), rng)


def _draw(p: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from the (unnormalised) weights ``p``, over its support only."""
    support = np.flatnonzero(p)
    cdf = np.cumsum(p[support])
    i = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return int(support[min(i, len(support) - 1)])
