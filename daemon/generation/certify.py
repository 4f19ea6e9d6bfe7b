"""Certifying greedy losslessness: gap records, their comparison, and fresh re-evaluations.

Greedy speculative decoding equals plain decoding up to llama.cpp's batch-shape
dependent rounding. A run with ``record_gaps`` keeps, per generated token, what the
target's logits said there and the batch they came from (``TokenGap``); two runs are
compared with ``certify_greedy``, and a parting is judged by evaluating the same
tokens again on a scratch slot with chosen batch shapes. The daemon never certifies;
the benchmarks (benchkit/generate.py, benchkit/certify.py, bench/) and the tests do.

Interface:

* ``NEAR_TIE_GAP``: the largest logit gap batch-shape rounding is taken to flip.
* ``TokenGap``, ``token_gap(row, token)``: one position's record (the step loop makes
  them from its logit rows).
* ``certify_greedy(reference, candidate, threshold)``: "identical", "near_tie" or
  "diverged", and where.
* ``certify_tokens(reference, tokens, is_eog, threshold)``: the same verdicts for an
  output known only by its tokens (an endpoint's reply), judged by the reference's logits.
* ``cut_shortfall(logits, token, temperature, top_k, top_p)`` and
  ``certify_sampled(...)``: a sampled token against plain decoding's top-k / top-p cut:
  "inside", "near_tie" (outside, its logit within ``NEAR_TIE_GAP`` of the cut) or
  "outside".
* ``noisy_drafts(reference, prompt_len, seed)``: a drafter whose drafts are partly right,
  to put accepted and rejected rows, padding and rollbacks in the runs being certified.
* ``Certification``, a mixin of ``Verifier``: ``logit_rows``, ``next_logits``,
  ``reproduces``, ``fresh_choice``, ``replayed_choice``, ``schedule_flip`` and
  ``logit_drift``, each on a scratch slot of the verifier (nothing is cached); what it
  uses of the verifier is spelt out by ``_Host``.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .kv_slots import Slot
from .sampling import target_probs

# Largest top-1/top-2 logit gap that llama.cpp's batch-shape rounding can flip on
# this CPU. Evaluating the same tokens in batches of 1, 4, 9 and 17 (5 spider
# prompts, 48 generated tokens each) changed single logits by up to 1.74 and the
# top-1/top-2 gap by up to 0.95 (Gemma's logits span ~+-30; Q4_K kernels quantise
# activations differently per batch shape). The threshold is twice the largest
# gap drift, rounded up; tests/test_verifier.py re-measures the drift and fails
# if it ever exceeds this. A greedy output that parts from plain decoding where
# the gap is larger is reported as a real divergence.
NEAR_TIE_GAP = 2.0

# Enough candidates that, where many tokens are within a logit of each other, the other
# run's choice is still among them: with 8, a run once parted from plain decoding where
# plain's token had dropped out of its 8 best, and the parting could not be judged.
TOP_RECORDED = 32


@dataclass
class TokenGap:
    """What the target's logits said at one generated position (greedy runs only)."""

    token: int
    top1: int
    top2: int
    gap: float  # logit(top1) - logit(top2)
    top: list[tuple[int, float]] = field(default_factory=list)  # best TOP_RECORDED (id, logit)
    # The llama_decode batch these logits came from: its first position, its tokens and
    # the row, so a divergence can be re-evaluated with exactly the same batch shape.
    pos0: int = -1
    batch: tuple[int, ...] = ()
    row: int = -1
    outputs: int = -1  # rows of that batch that had logits (-1: all)

    def shortfall(self, token: int) -> float:
        """How far ``token``'s logit is below the best one (inf if not among the recorded)."""
        for t, logit in self.top:
            if t == token:
                return self.top[0][1] - logit
        return float("inf")


def token_gap(row: np.ndarray, token: int) -> TokenGap:
    """The record of ``token`` chosen from logit ``row`` (its batch shape left unset)."""
    best = np.argpartition(-row, TOP_RECORDED)[:TOP_RECORDED]
    best = best[np.argsort(-row[best], kind="stable")]
    top = [(int(t), float(row[t])) for t in best]
    if top[0][0] != token and row[token] == top[0][1]:  # exact tie: put the chosen one first
        top.sort(key=lambda p: (-p[1], p[0] != token))
    return TokenGap(token, top[0][0], top[1][0], top[0][1] - top[1][1], top)


def certify_greedy(
    reference: Sequence[TokenGap], candidate: Sequence[TokenGap], threshold: float = NEAR_TIE_GAP
) -> tuple[str, int | None]:
    """Compare two greedy runs of the same prompt, token by token (from their gap records).

    Returns ("identical", None); ("near_tie", i) when they first part at i and
    each run's logits put the other run's choice within ``threshold`` of their
    best (a rounding flip between tokens the model finds equally likely, not a
    bug); or ("diverged", i) otherwise.
    """
    for i, (r, c) in enumerate(zip(reference, candidate, strict=False)):
        if r.token == c.token:
            continue
        tie = r.shortfall(c.token) <= threshold and c.shortfall(r.token) <= threshold
        return ("near_tie" if tie else "diverged", i)
    if len(reference) != len(candidate):
        return "diverged", min(len(reference), len(candidate))
    return "identical", None



def cut_shortfall(logits: np.ndarray, token: int, temperature: float, top_k: int,
                  top_p: float) -> float:
    """How far ``token``'s logit lies below the weakest token that plain decoding's
    top-k / top-p cut keeps after ``logits``; 0 when the cut keeps it."""
    p = target_probs(logits, temperature, top_k, top_p)
    if p[token] > 0:
        return 0.0
    return float(np.min(logits[p > 0]) - logits[token])


def certify_sampled(logits: np.ndarray, token: int, temperature: float, top_k: int,
                    top_p: float, threshold: float = NEAR_TIE_GAP) -> str:
    """A token sampled where plain decoding's logits are ``logits``: "inside" its cut;
    "near_tie" just outside it (batch-shape rounding moved the token across the cut, as
    it flips a greedy near-tie); "outside" otherwise, which no rounding explains."""
    short = cut_shortfall(logits, token, temperature, top_k, top_p)
    if short == 0.0:
        return "inside"
    return "near_tie" if short <= threshold else "outside"

def certify_tokens(
    reference: Sequence[TokenGap], tokens: Sequence[int], is_eog: Callable[[int], bool],
    threshold: float = NEAR_TIE_GAP,
) -> tuple[str, int | None]:
    """Judge a greedy output known only by its tokens (an endpoint's ``token_ids``: no
    end-of-generation token, no logits) against plain decoding's gap record of the same
    prompt (its end-of-generation token included, as ``record_gaps`` runs keep it).

    Where they first part, the output's token (or, where it ended, an end-of-generation
    token) must be within ``threshold`` of plain decoding's best there: ("near_tie", i),
    else ("diverged", i). One-sided: the other run's logits are unknown, so a near-tie
    is as far as its tokens can tell, while "diverged" is certain.
    """
    for i, g in enumerate(reference):
        if i == len(tokens):
            if is_eog(g.token):
                return "identical", None
            tie = any(is_eog(t) and g.shortfall(t) <= threshold for t, _ in g.top)
            return ("near_tie" if tie else "diverged"), i
        if tokens[i] != g.token:
            return ("near_tie" if g.shortfall(tokens[i]) <= threshold else "diverged"), i
    if len(tokens) == len(reference):
        return "identical", None
    return "diverged", len(reference)


def noisy_drafts(reference: Sequence[int], prompt_len: int, seed: int
                 ) -> Callable[[list[int], int], list[int]]:
    """Drafts from ``reference`` (what plain decoding generates after a prompt of
    ``prompt_len`` tokens), of random lengths up to 7, one token in five wrong: the
    sequences of a step then want different numbers of rows and roll some of them back."""
    rnd = random.Random(seed)

    def propose(ctx: list[int], k: int) -> list[int]:
        at = len(ctx) - prompt_len
        d = reference[at : at + rnd.randint(0, min(k, 7))]
        return [t if rnd.random() < 0.8 else (t + 11) % 1000 for t in d]

    return propose


class _Host(Protocol):
    """What ``Certification`` uses of its host (``Verifier``), its own methods included."""

    _llama_cpp: Any
    _mem: Any
    n_batch: int

    @property
    def _turns(self) -> AbstractContextManager[None]: ...
    def _decode(self, seq_id: int, tokens: Sequence[int], pos0: int, all_logits: bool,
                outputs: int | None = None) -> None: ...
    def _logits(self, i: int) -> np.ndarray: ...
    def _logits_view(self, i: int) -> np.ndarray: ...
    def _seq_rm(self, seq_id: int, p0: int) -> None: ...
    def _acquire_slot(self, key: str) -> Slot: ...
    def _release_slot(self, slot: Slot) -> None: ...
    def _make_room(self, slot: Slot, needed: int) -> None: ...
    def forget(self, session_key: str) -> None: ...
    def _rows(
        self, seq_id: int, tokens: Sequence[int], pos0: int, batch_size: int
    ) -> list[np.ndarray]: ...
    def _scratch(
        self, prefix: Sequence[int], chunk: int, room: int
    ) -> AbstractContextManager[int]: ...
    def logit_rows(
        self, tokens: Sequence[int], n_prefix: int, batch_size: int
    ) -> list[np.ndarray]: ...
    def fresh_choice(self, context: Sequence[int], gap: TokenGap, chunk: int) -> int: ...
    def replayed_choice(
        self, context: Sequence[int], steps: Sequence[TokenGap], gap: TokenGap, chunk: int
    ) -> int: ...


class Certification:
    """Fresh evaluations on scratch slots of the verifier, for the checks above."""

    def _rows(
        self: _Host, seq_id: int, tokens: Sequence[int], pos0: int, batch_size: int
    ) -> list[np.ndarray]:
        rows: list[np.ndarray] = []
        for j in range(0, len(tokens), batch_size):
            part = tokens[j : j + batch_size]
            with self._turns:
                self._decode(seq_id, part, pos0 + j, all_logits=True)
                rows.extend(self._logits(i) for i in range(len(part)))
        return rows

    def next_logits(self: _Host, tokens: Sequence[int]) -> np.ndarray:
        """The target's logits after ``tokens`` (a scratch slot; nothing is cached)."""
        return self.logit_rows(tokens, len(tokens) - 1, 1)[-1]

    @contextlib.contextmanager
    def _scratch(self: _Host, prefix: Sequence[int], chunk: int, room: int) -> Iterator[int]:
        """A fresh scratch slot holding ``prefix``, evaluated ``chunk`` tokens at a time
        without logits, with ``room`` more cells; yields its sequence id, then forgets it."""
        key = "\x00scratch"
        slot = self._acquire_slot(key)
        try:
            self._make_room(slot, len(prefix) + room)
            self._llama_cpp.llama_memory_seq_rm(self._mem, slot.seq_id, -1, -1)
            slot.tokens = []
            step = min(chunk, self.n_batch)
            for j in range(0, len(prefix), step):
                with self._turns:
                    self._decode(slot.seq_id, prefix[j : j + step], j, all_logits=False)
            yield slot.seq_id
        finally:
            self._release_slot(slot)
            self.forget(key)

    def logit_rows(
        self: _Host, tokens: Sequence[int], n_prefix: int, batch_size: int
    ) -> list[np.ndarray]:
        """Logits after each of ``tokens[n_prefix:]``, evaluated ``batch_size`` at a time."""
        tokens = list(tokens)
        with self._scratch(tokens[:n_prefix], self.n_batch, len(tokens) - n_prefix) as seq_id:
            return self._rows(seq_id, tokens[n_prefix:], n_prefix, batch_size)

    def reproduces(self: _Host, context: Sequence[int], gap: TokenGap) -> bool:
        """Whether a fresh evaluation of ``context`` with the batch shape ``gap`` was
        computed in (same first position, same batch tokens, same row; everything
        before it in n_batch chunks on a scratch slot) picks ``gap.token`` again.

        Certifies a greedy divergence as llama.cpp's batch-shape arithmetic rather
        than state of the generation loop (a stale or misplaced KV cell, a wrong
        position): the same tokens with the same shape give the same choice.
        """
        return self.fresh_choice(context, gap, self.n_batch) == gap.token

    def fresh_choice(self: _Host, context: Sequence[int], gap: TokenGap, chunk: int) -> int:
        """The token a fresh evaluation picks at ``gap``'s position: ``context`` before
        the recorded batch evaluated in chunks of ``chunk`` tokens on a scratch slot, then
        the recorded batch itself. Different chunkings of the same tokens compute the KV
        cache with different batch shapes, which moves later logits on this CPU."""
        return self.replayed_choice(context, (), gap, chunk)

    def replayed_choice(
        self: _Host,
        context: Sequence[int],
        steps: Sequence[TokenGap],
        gap: TokenGap,
        chunk: int,
    ) -> int:
        """The token picked at ``gap``'s position when a fresh slot is built the way the
        run built it: ``context`` up to the run's first recorded batch in chunks of
        ``chunk`` tokens, then every batch the run evaluated before ``gap``'s (``steps``:
        its gap records, one or more per batch, in order), each rolled back to what the
        run kept, then ``gap``'s own batch. Without ``steps``, a fresh evaluation."""
        if gap.pos0 < 0 or not gap.batch or not 0 <= gap.row < len(gap.batch):
            raise ValueError("this gap record has no batch shape (record_gaps=True runs do)")
        if chunk < 1:
            raise ValueError("chunk must be >= 1")
        ctx = list(context)
        if ctx[gap.pos0 :] != list(gap.batch[: gap.row + 1]):
            raise ValueError("context does not end with the recorded batch")
        batches: list[tuple[int, tuple[int, ...]]] = []
        for g in steps:
            if g.pos0 < 0 or not g.batch:
                raise ValueError("a step record has no batch shape")
            if g.pos0 >= gap.pos0:
                break
            if not batches or batches[-1][0] != g.pos0:
                batches.append((g.pos0, g.batch))
        start = batches[0][0] if batches else gap.pos0
        room = max(p + len(b) for p, b in [*batches, (gap.pos0, gap.batch)]) - start
        with self._scratch(ctx[:start], chunk, room) as seq_id:
            # each batch keeps what the run kept: the positions before the next batch
            ends = [p for p, _ in batches[1:]] + [gap.pos0] * bool(batches)
            for (pos0, batch), keep in zip(batches, ends, strict=True):
                with self._turns:
                    self._decode(seq_id, batch, pos0, all_logits=True)
                    self._seq_rm(seq_id, keep)
            with self._turns:
                self._decode(seq_id, gap.batch, gap.pos0, all_logits=True,
                             outputs=gap.outputs if gap.outputs > 0 else None)
                return int(np.argmax(self._logits_view(gap.row)))

    def schedule_flip(
        self: _Host,
        context: Sequence[int],
        a: TokenGap,
        b: TokenGap,
        chunks: Sequence[int] = (512, 256, 128, 64, 32),
    ) -> bool:
        """Whether both runs' choices at a parting are choices of llama.cpp itself for
        these exact tokens: fresh evaluations of the common ``context``, with each run's
        batch shape and the context chunked in several ways, pick ``a.token`` under
        some batch schedule and ``b.token`` under another. Then the parting is
        the arithmetic of batch schedules (which the generation loop only chooses), not
        a token the model would never produce for this context."""
        seen: set[int] = set()
        for chunk in chunks:
            for g in (a, b):
                seen.add(self.fresh_choice(context, g, chunk))
                if a.token in seen and b.token in seen:
                    return True
        return False

    def logit_drift(
        self: _Host, tokens: Sequence[int], n_prefix: int, batch_size: int
    ) -> tuple[float, float]:
        """How much batch shape moves the logits: evaluate ``tokens[n_prefix:]`` one at a
        time and ``batch_size`` at a time; return (max |logit change|, max change of the
        gap between the 1-token evaluation's top two tokens)."""
        single = self.logit_rows(tokens, n_prefix, 1)
        batched = self.logit_rows(tokens, n_prefix, batch_size)
        d = g = 0.0
        for a, b in zip(single, batched, strict=True):
            d = max(d, float(np.max(np.abs(a - b))))
            t1 = int(np.argmax(a))
            a2 = a.copy()
            a2[t1] = -np.inf
            t2 = int(np.argmax(a2))
            g = max(g, abs(float((a[t1] - a[t2]) - (b[t1] - b[t2]))))
        return d, g
