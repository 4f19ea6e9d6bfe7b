"""The fallback draft model: a second, smaller GGUF that drafts when the trees have nothing.

It must share the target's vocabulary (checked at load). Whether it is used is
decided step by step from measurements on this machine: what verifying a batch
of k tokens costs the target, what one draft-model token costs, and how often
its tokens are accepted. It drafts only while the expected tokens per second
beat plain decoding; otherwise the verifier decodes plainly. The decisions are
counted (``stats()``) so that `suffixd stats` and the final chunk can show them.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from suffixcache import common_prefix_length

from .verifier import Verifier

PRIOR_ACCEPT = 0.6  # per-token acceptance assumed before any feedback
PRIOR_WEIGHT = 8.0  # pseudo-trials behind the prior
DECAY = 0.98  # acceptance follows the recent steps (about the last fifty)
PROBE_EVERY = 64  # while unprofitable, draft once in a while to re-measure acceptance
# Optimism under uncertainty: the draft model also drafts where acceptance this many
# standard errors above its estimate would pay. A probe every 64 steps left the estimate
# at its prior (0.6 after 8 pseudo-trials, one probe of 2 accepted tokens: 0.683) through
# whole benchmarks, below what the F32 pair needs (0.85 at the daemon's measured costs),
# so it never drafted. At the prior the bound is 0.95: a new draft model is tried. The
# standard error counts every token tried so far (not decayed), so the bound closes on
# the estimate once the draft model has been tried enough.
EXPLORE_Z = 2.0
# Before its first draft after a new prompt the draft model evaluates what its slot does
# not hold yet. That catch-up is priced at CATCH_UP_ROW of a drafted token a row (a
# Q4_K_M prompt row 3.3 ms against a drafted token's 15-19 ms on the 2-core EPYC) and
# must be won back within DRAFT_HORIZON tokens at the plan's gain: on swe_django (~800
# new prompt tokens a turn) the draft model re-read every prompt and took the F32
# verifier's one agent from 78.8 s (llama-server's best) to 103.7 s.
CATCH_UP_ROW = 0.2
DRAFT_HORIZON = 64
# ... but the trees come first (FallbackProposer): the draft model drafts in episodes, from
# a step where the trees have nothing to the next where they have something, and a
# catch-up must be won back within the episode it opens. On an F32 verifier's prose
# (2026-11-30, Zen 3) the episodes were short: 519 context tokens caught up for 197
# drafted, each use's catch-up (~7 rows, ~38 ms) above its draft's saving (~33 ms), and
# the daemon 18% slower with the draft model. A restart's horizon is the episodes' recent
# mean (tokens yielded), DRAFT_HORIZON before any. A call is an episode's continuation when
# its slot lacks at most the verifier's step since its last draft: its last drafted token
# and the verifier's own (``behind`` <= CONTINUING).
EPISODE_EMA = 0.3
CONTINUING = 2
# The weight of each draft's own timing in the drafted token's cost
DRAFT_TIME_EMA = 0.2
MARGIN = 1.05  # demand a 5% expected gain before paying for drafts


class VocabularyMismatchError(ValueError):
    pass


def vocabulary_digest(model: Any) -> str:
    """A hash of every token's bytes, in id order (``model`` has vocab_size/token_bytes)."""
    h = hashlib.sha256(str(model.vocab_size).encode())
    for t in range(model.vocab_size):
        h.update(model.token_bytes(t))
        h.update(b"\x00")
    return h.hexdigest()


def check_vocabulary(target: Any, draft: Any, draft_path: str | Path = "draft model") -> None:
    if target.vocab_size != draft.vocab_size:
        raise VocabularyMismatchError(
            f"{draft_path}: vocabulary of {draft.vocab_size} tokens, the target model has "
            f"{target.vocab_size}; a draft model must share the target's tokenizer"
        )
    if vocabulary_digest(target) != vocabulary_digest(draft):
        raise VocabularyMismatchError(
            f"{draft_path}: same vocabulary size as the target but different tokens; "
            "a draft model must share the target's tokenizer"
        )


@dataclass
class ModelDraft:
    tokens: list[int]
    source: str = "draft_model"
    parents: list[int] = field(default_factory=list)

    def path(self) -> list[int]:
        return list(self.tokens)

    def __len__(self) -> int:
        return len(self.tokens)


class DraftModel:
    """Greedy drafts from a second GGUF, with a KV slot per session as the target has
    (least recently used evicted): each session's context stays evaluated between its
    drafts and is followed by prefix reuse.

    With one slot shared by every session, each switch between sessions evaluated the
    other's whole context again on the draft model (thousands of tokens per switch on
    coding-agent prompts), so several agents at once made the draft model a prompt
    evaluator. Drafts still run one at a time (``_lock``): the draft model shares the
    cores with the target, and a draft is a few short decodes."""

    def __init__(
        self,
        path: str | Path,
        target: Verifier,
        *,
        n_ctx: int | None = None,
        n_threads: int | None = None,
        n_slots: int | None = None,
    ) -> None:
        self.path = Path(path)
        self._llm = Verifier(
            self.path,
            n_ctx=n_ctx or target.n_ctx,
            n_threads=n_threads or target.n_threads,
            n_slots=n_slots or target.n_slots,
            # slots follow their sessions by prefix reuse: prompt checkpoints would only
            # hold memory (the default budget is 1 GiB)
            prompt_cache_mb=0,
        )
        try:
            check_vocabulary(target, self._llm, self.path)
        except Exception:
            self._llm.close()
            raise
        self._lock = threading.Lock()  # one draft at a time (see the class docstring)
        # context tokens the draft model evaluated, and those its slots already held
        self.context_evaluated = 0
        self.context_reused = 0
        self.last_evaluate_s = 0.0  # the last draft's catch-up (AdaptiveDrafter prices it)
        # the context each key's slot last held (most recent last): what it is behind by
        self._held: dict[str, list[int]] = {}
        self._held_max = 2 * (n_slots or target.n_slots)

    def behind(self, context: Sequence[int], key: str = "draft") -> int:
        """The tokens of ``context`` the draft model would evaluate before drafting after
        it in ``key``'s slot (an estimate: its slots are evicted least recently used)."""
        held = self._held.get(key, [])
        if list(context[: len(held)]) == held:  # the usual case, compared in C
            return len(context) - len(held)
        return len(context) - common_prefix_length(held, context)

    def draft(self, context: Sequence[int], k: int, key: str = "draft") -> list[int]:
        """Up to ``k`` greedy tokens after ``context``, in the KV slot of ``key`` (the
        session's: its earlier drafts' context is reused)."""
        with self._lock:
            got = self._llm.greedy_draft(f"draft\x00{key}", context, k)
            self.last_evaluate_s = got.evaluate_s
            self.context_reused += got.reused
            self.context_evaluated += got.evaluated
            self._held.pop(key, None)
            self._held[key] = [*context, *got.tokens[:-1]]  # what the slot holds now
            while len(self._held) > self._held_max:
                del self._held[next(iter(self._held))]
        return got.tokens

    def seconds_per_token(self, context: Sequence[int], k: int = 8, reps: int = 2) -> float:
        """Time of one drafted token at the given context (prompt already cached)."""
        self.draft(context, 1)
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            self.draft(context, k)
            best = min(best, (time.perf_counter() - t0) / k)
            self.draft(context, 1)  # roll the KV back to the context
        return best

    def close(self) -> None:
        self._llm.close()


class AdaptiveDrafter:
    """Decides, per step, whether the draft model pays and how many tokens to draft.

    With per-token acceptance a, k drafted tokens yield 1 + a + ... + a^k tokens
    for k * t_draft + t_verify(k + 1) seconds; plain decoding yields one token
    per t_verify(1). Drafts of the best k are used only while their expected
    rate beats plain decoding by ``MARGIN``.
    """

    def __init__(
        self,
        draft: Callable[[Sequence[int], int, str], list[int]],
        verify_seconds: dict[int, float],
        draft_seconds: float,
        max_tokens: int = 8,
        behind: Callable[[Sequence[int], str], int] | None = None,
        evaluate_seconds: Callable[[], float] | None = None,
    ) -> None:
        self._draft = draft
        self._behind = behind
        self.verify_seconds = dict(sorted(verify_seconds.items()))
        self.draft_seconds = draft_seconds
        self.max_tokens = max_tokens
        self._hits = PRIOR_ACCEPT * PRIOR_WEIGHT
        self._trials = PRIOR_WEIGHT
        self._tried = 0  # per-token trials observed, not decayed
        self._since_probe = 0
        self._lock = threading.Lock()
        self.counts = {"used": 0, "skipped": 0, "probes": 0, "explored": 0, "drafted": 0,
                       "accepted": 0, "behind": 0, "caught_up": 0, "episodes": 0}
        self.draft_s = 0.0  # in the draft calls used, catch-ups included
        self._evaluate_s = evaluate_seconds
        # a row of catch-up, measured (evaluate_seconds) on restarts
        self.catch_up_row_s = CATCH_UP_ROW * draft_seconds
        self.episode_tokens = float(DRAFT_HORIZON)  # the recent mean (tokens yielded)
        self._episode = 0  # tokens yielded in the episode under way
        # "measured": both models' costs timed; "provisional": see provisional()
        self.costs = "measured"

    def carry_from(self, earlier: AdaptiveDrafter) -> None:
        """Keep what an earlier policy of this daemon learned (acceptance, its counts):
        new costs change the plan, not what the draft model was seen to get right."""
        with earlier._lock:
            hits, trials, counts = earlier._hits, earlier._trials, dict(earlier.counts)
            tried, draft_s = earlier._tried, earlier.draft_s
            episode_tokens, catch_up_row_s = earlier.episode_tokens, earlier.catch_up_row_s
        with self._lock:
            self._hits, self._trials, self.counts = hits, trials, counts
            self._tried, self.draft_s = tried, draft_s
            self.episode_tokens, self.catch_up_row_s = episode_tokens, catch_up_row_s

    @property
    def acceptance(self) -> float:
        return self._hits / self._trials

    def optimistic_acceptance(self) -> float:
        """The estimate plus ``EXPLORE_Z`` of its standard error (Bernoulli trials: the
        prior's and every token tried)."""
        a = self.acceptance
        return min(1.0, a + EXPLORE_Z * math.sqrt(a * (1.0 - a) / (PRIOR_WEIGHT + self._tried)))

    def _t_verify(self, k: int) -> float:
        ks = list(self.verify_seconds)
        if k in self.verify_seconds:
            return self.verify_seconds[k]
        if k > ks[-1]:  # extrapolate linearly from the last two points
            a, b = ks[-2], ks[-1]
            slope = (self.verify_seconds[b] - self.verify_seconds[a]) / (b - a)
            return self.verify_seconds[b] + slope * (k - b)
        lo = max(x for x in ks if x < k)
        hi = min(x for x in ks if x > k)
        f = (k - lo) / (hi - lo)
        return self.verify_seconds[lo] * (1 - f) + self.verify_seconds[hi] * f

    def worth_catching_up(self, behind: int, gain: float) -> bool:
        """Whether evaluating ``behind`` context tokens first (a new episode's catch-up)
        is won back within an episode's tokens (``episode_tokens``) decoded at ``gain``
        times plain decoding's rate."""
        if behind <= CONTINUING:
            return True
        if gain <= 1.0:
            return False
        saved = self.episode_tokens * self._t_verify(1) * (1.0 - 1.0 / gain)
        return behind * self.catch_up_row_s <= saved

    def plan(self, limit: int, acceptance: float | None = None) -> tuple[int, float]:
        """(best k, its expected tokens/s relative to plain decoding); k = 0: don't draft."""
        a = self.acceptance if acceptance is None else acceptance
        plain = 1.0 / self._t_verify(1)
        best_k, best = 0, 1.0
        expected = 1.0
        for k in range(1, min(limit, self.max_tokens) + 1):
            expected += a**k
            rate = expected / (k * self.draft_seconds + self._t_verify(k + 1))
            if rate / plain > best:
                best_k, best = k, rate / plain
        return (best_k, best) if best >= MARGIN else (0, best)

    def __call__(self, context: Sequence[int], limit: int,
                 key: str = "draft") -> ModelDraft | None:
        """A draft for ``context`` (None: not worth it now); ``key``: the session, whose
        KV slot of the draft model holds its context (``DraftModel.draft``)."""
        with self._lock:
            k, gain = self.plan(limit)
            explored = probe = False
            if k == 0:
                k, gain = self.plan(limit, self.optimistic_acceptance())
                explored = k > 0
            if k == 0:
                # Acceptance may have improved since it was measured: probe now and
                # then, but only if perfect acceptance could pay at all.
                self._since_probe += 1
                if self._since_probe >= PROBE_EVERY:
                    k, gain = self.plan(limit, 1.0)
                    probe = k > 0
                if not probe:
                    self.counts["skipped"] += 1
                    return None
            # only now (a context can be tens of thousands of tokens)
            behind = self._behind(context, key) if self._behind is not None else 0
            if not self.worth_catching_up(behind, gain):
                self.counts["skipped"] += 1
                self.counts["behind"] += 1  # of the skipped: its catch-up would not pay
                return None
            if probe:
                self._since_probe = 0
                self.counts["probes"] += 1
                k = min(limit, 2)
            if explored:
                self.counts["explored"] += 1
            self.counts["used"] += 1
            self.counts["caught_up"] += behind  # context tokens evaluated before drafting
            restart = behind > CONTINUING
            if restart:
                if self._episode:
                    self.episode_tokens += EPISODE_EMA * (self._episode - self.episode_tokens)
                self._episode = 0
                self.counts["episodes"] += 1
        t0 = time.perf_counter()
        tokens = self._draft(context, k, key)
        if tokens:
            # what a drafted token costs in use (the call's own prefill of the tokens
            # accepted since, the daemon's step machinery): the start-up timing measures
            # the decode loop alone and priced F32 drafts at 15 ms where prose paid more.
            # A restart's catch-up is priced apart (catch_up_row_s), not per token.
            took = time.perf_counter() - t0
            loop = took
            with self._lock:
                if restart and self._evaluate_s is not None:
                    caught = min(self._evaluate_s(), took)
                    loop -= caught
                    self.catch_up_row_s += DRAFT_TIME_EMA * (caught / behind - self.catch_up_row_s)
                self.draft_s += took
                self.draft_seconds += DRAFT_TIME_EMA * (loop / len(tokens) - self.draft_seconds)
        return ModelDraft(tokens) if tokens else None

    def observe(self, draft: Any, accepted: int, new: Sequence[int] | None = None) -> None:
        """Learn the per-token acceptance (a verifier's on_step; ``new`` is not needed)."""
        n = len(draft.path())
        with self._lock:
            self._episode += accepted + 1  # with the verifier's own token
            # per-token acceptance: a run of `accepted` hits ended by a miss (if any)
            trials = accepted + (1 if accepted < n else 0)
            self._hits = self._hits * DECAY**trials + accepted
            self._trials = self._trials * DECAY**trials + trials
            self._tried += trials
            self.counts["drafted"] += n
            self.counts["accepted"] += accepted

    def stats(self) -> dict[str, Any]:
        with self._lock:
            k, gain = self.plan(self.max_tokens)
            return {
                **self.counts,
                "acceptance": round(self.acceptance, 3),
                "draft_ms_per_token": round(self.draft_seconds * 1000, 3),
                "in_use_ms_per_token": round(
                    1000 * self.draft_s / max(1, self.counts["drafted"]), 3),
                "catch_up_ms_per_row": round(1000 * self.catch_up_row_s, 3),
                "episode_tokens": round(self.episode_tokens, 1),
                "verify_ms": {k_: round(v * 1000, 3) for k_, v in self.verify_seconds.items()},
                "planned_k": k,
                "expected_speedup": round(gain, 3),
                "costs": self.costs,
            }


def draft_seconds_per_token(target: Verifier, draft_model: DraftModel) -> float:
    """Time one drafted token on this machine, the target's steps held off meanwhile
    (serving may go on: its decodes would share the cores with the timing)."""
    ctx = [target.bos_token] + [(13 * i + 200) % target.vocab_size for i in range(127)]
    with target._turns:
        return draft_model.seconds_per_token(ctx)


# Until the verifier's profile is measured, verifying k tokens is taken to cost
# 1 + PROVISIONAL_ROW * (k - 1) one-token decodes: dearer than any CPU profile measured
# here (0.33-0.39 per extra row for gemma-3-270m on 2 cores), so that a provisional plan
# drafts only where the draft model clearly pays.
PROVISIONAL_ROW = 0.5


def provisional(target: Verifier, draft_model: DraftModel,
                max_tokens: int = 8) -> AdaptiveDrafter:
    """The draft model's policy before the verifier's costs are measured (a busy daemon
    may not measure for a long time, and one with SUFFIXD_COST_ROUNDS=0 never does):
    one token of each model timed now, in well under a second, and verification priced
    conservatively (PROVISIONAL_ROW). Acceptance is learned as with measured costs."""
    one = target.one_token_seconds()
    verify = {k: one * (1 + PROVISIONAL_ROW * (k - 1)) for k in range(1, max_tokens + 2)}
    policy = AdaptiveDrafter(draft_model.draft, verify,
                             draft_seconds_per_token(target, draft_model), max_tokens,
                             draft_model.behind, lambda: draft_model.last_evaluate_s)
    policy.costs = "provisional"
    return policy


def measure(target: Verifier, draft_model: DraftModel, max_tokens: int = 8,
            draft_seconds: float | None = None) -> AdaptiveDrafter:
    """Measure both models on this machine and build the adaptive drafter;
    ``draft_seconds``: the draft model's seconds per token measured earlier (the data
    dir keeps it with the target's costs), else timed now."""
    ks = tuple(range(1, max_tokens + 2))
    if not all(k in target.cost_seconds for k in ks):
        target.measure_cost_profile(ks=ks, reps=3)
    verify_seconds = {k: target.cost_seconds[k] for k in ks}
    per_token = draft_seconds if draft_seconds is not None \
        else draft_seconds_per_token(target, draft_model)
    return AdaptiveDrafter(draft_model.draft, verify_seconds, per_token, max_tokens,
                           draft_model.behind, lambda: draft_model.last_evaluate_s)


class FallbackProposer:
    """Suffix-tree drafts first; the adaptive draft model when the trees offer nothing."""

    def __init__(
        self,
        primary: Callable[[list[int], int], Any] | None,
        fallback: AdaptiveDrafter | None,
        primary_observe: Callable[[Any, int, Sequence[int] | None], None] | None = None,
    ) -> None:
        self.primary = primary
        self.fallback = fallback
        self.primary_observe = primary_observe

    def __call__(self, context: list[int], k: int) -> Any:
        draft = self.primary(context, k) if self.primary is not None else None
        if draft is not None and len(draft.path() if hasattr(draft, "path") else draft) > 0:
            return draft
        model_draft = self.fallback(context, k) if self.fallback is not None else None
        return model_draft if model_draft is not None else draft

    def observe(self, draft: Any, accepted: int, new: Sequence[int] | None = None) -> None:
        if isinstance(draft, ModelDraft):
            if self.fallback is not None:
                self.fallback.observe(draft, accepted)
        elif self.primary_observe is not None:
            self.primary_observe(draft, accepted, new)
