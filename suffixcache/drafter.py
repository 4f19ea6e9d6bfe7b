"""The drafting policy: which trees to ask, how to combine them, how long to draft.

One class, one `propose` method (in the manner of vLLM's spec-decode
proposers). The policy:

1. Sources, most local first: the session's own tree, the namespace's global
   tree of previous responses, the corpus tree. The native core drafts from all
   of them at once, as a mixture of their continuation distributions weighted by
   each source's prior weight and match length, re-weighted along the path by
   how well each source predicted it. A source that agrees with another adds
   to the draft's confidence instead of being discarded.
2. Calibration: the count-based probabilities are optimistic (a sequence seen
   once gives probability 1 to its whole continuation). The drafter learns,
   online, how often a token with a given raw probability at a given depth was
   really accepted, and uses that estimate.
3. Length: given the verifier's cost profile (cost of checking k tokens
   relative to one), keep the prefix of the draft that maximises expected
   tokens per unit of verification cost: (1 + sum of acceptance
   probabilities) / cost(k + 1). An empty draft (plain decoding) scores 1.
   With a flat (GPU) profile this drafts long; on a CPU it stops where the
   marginal token no longer pays for itself.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from suffixcache import _native
from suffixcache.cache import SuffixCache
from suffixcache.cost import CostProfile

SOURCES = ("session", "global", "corpus")


@dataclass(frozen=True)
class DraftConfig:
    max_tokens: int = 32           # hard cap on draft tokens per step
    max_spec_factor: float = 1.0   # draft length <= factor * match_len + offset
    max_spec_offset: float = 0.0
    min_token_prob: float = 0.05   # raw cumulative probability below which drafting stops
    max_match: int = 32            # longest context suffix matched (leaves max_depth - max_match to draft)
    use_tree: bool = False         # draft a tree of branches instead of one path
    match_power: float = 1.0       # source weight grows as match_len ** match_power
    weights: Mapping[str, float] = field(
        default_factory=lambda: {"session": 1.0, "global": 1.0, "corpus": 0.5}
    )
    cost_aware: bool = True
    calibrate: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.max_tokens <= 1024:
            raise ValueError("max_tokens must be in [0, 1024]")
        if self.max_match < 1:
            raise ValueError("max_match must be >= 1")
        unknown = set(self.weights) - set(SOURCES)
        if unknown:
            raise ValueError(f"unknown draft sources in weights: {sorted(unknown)}")


@dataclass(frozen=True)
class Draft:
    tokens: list[int]
    parents: list[int]      # index of the parent token; -1 = hangs off the end of the context
    probs: list[float]      # estimated probability that the token is accepted (cumulative)
    sources: list[str]      # per token: the source that contributed most
    match_len: int          # longest matched context suffix over the sources
    score: float            # expected accepted tokens (sum of probs)
    raw_probs: list[float] = field(default_factory=list, repr=False)

    @property
    def source(self) -> str:
        return self.sources[0] if self.sources else "none"

    def __len__(self) -> int:
        return len(self.tokens)

    def is_path(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def path(self) -> list[int]:
        """The most probable root-to-leaf path (the whole draft when it is a path)."""
        if self.is_path():
            return list(self.tokens)
        best_leaf, best_p = -1, -1.0
        has_child = {p for p in self.parents if p >= 0}
        for i, p in enumerate(self.probs):
            if i not in has_child and p > best_p:
                best_leaf, best_p = i, p
        out: list[int] = []
        while best_leaf >= 0:
            out.append(self.tokens[best_leaf])
            best_leaf = self.parents[best_leaf]
        return out[::-1]

    def accepted_length(self, truth: Sequence[int]) -> int:
        """Longest prefix of a root-to-leaf path of the draft that equals truth's prefix."""
        if not self.tokens or not truth:
            return 0
        if self.is_path():
            n = 0
            for a, b in zip(self.tokens, truth, strict=False):
                if a != b:
                    break
                n += 1
            return n
        depth: dict[int, int] = {-1: 0}
        best = 0
        for i, (tok, parent) in enumerate(zip(self.tokens, self.parents, strict=True)):
            d = depth.get(parent)
            if d is None or d >= len(truth) or truth[d] != tok:
                continue
            depth[i] = d + 1
            best = max(best, d + 1)
        return best


EMPTY_DRAFT = Draft([], [], [], [], 0, 0.0)


class Calibrator:
    """Online estimate of P(token accepted) from (raw probability, depth in the draft).

    Each bin keeps accepted / drafted counts starting from a conservative
    prior; `observe` feeds the outcome of every verified draft back.
    """

    PROB_BUCKETS = 10
    DEPTH_EDGES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 1 << 30)
    PRIOR_WEIGHT = 4.0
    PRIOR_SCALE = 0.6  # before any evidence, trust raw probabilities only this much

    def __init__(self) -> None:
        nd = len(self.DEPTH_EDGES)
        self._hits = [[0.0] * nd for _ in range(self.PROB_BUCKETS)]
        self._trials = [[0.0] * nd for _ in range(self.PROB_BUCKETS)]
        self._depth_bucket = [self._bucket_of_depth(d) for d in range(1025)]
        self._lock = threading.Lock()

    def _bucket_of_depth(self, depth: int) -> int:
        for i, edge in enumerate(self.DEPTH_EDGES):
            if depth <= edge:
                return i
        return len(self.DEPTH_EDGES) - 1

    def _prob_bucket(self, p: float) -> int:
        return min(int(p * self.PROB_BUCKETS), self.PROB_BUCKETS - 1)

    def estimate(self, raw: float, depth: int) -> float:
        pb, db = self._prob_bucket(raw), self._depth_bucket[min(depth, 1024)]
        prior = raw * self.PRIOR_SCALE
        return (self._hits[pb][db] + self.PRIOR_WEIGHT * prior) / (
            self._trials[pb][db] + self.PRIOR_WEIGHT
        )

    def observe(self, raw_probs: Sequence[float], depths: Sequence[int], accepted_depth: int) -> None:
        with self._lock:
            for raw, depth in zip(raw_probs, depths, strict=True):
                pb, db = self._prob_bucket(raw), self._depth_bucket[min(depth, 1024)]
                self._trials[pb][db] += 1.0
                if depth <= accepted_depth:
                    self._hits[pb][db] += 1.0

    def observe_hits(
        self, raw_probs: Sequence[float], depths: Sequence[int], hits: Sequence[bool]
    ) -> None:
        with self._lock:
            for raw, depth, hit in zip(raw_probs, depths, hits, strict=True):
                pb, db = self._prob_bucket(raw), self._depth_bucket[min(depth, 1024)]
                self._trials[pb][db] += 1.0
                if hit:
                    self._hits[pb][db] += 1.0


class Drafter:
    """Proposes drafts for a session from the cache's trees (see the module docstring)."""

    def __init__(
        self,
        cache: SuffixCache,
        config: DraftConfig | None = None,
        cost_profile: CostProfile | None = None,
    ) -> None:
        self.cache = cache
        self.config = config or DraftConfig()
        self.calibrator = Calibrator()
        self.set_cost_profile(cost_profile or CostProfile.cpu_default())

    def set_cost_profile(self, profile: CostProfile) -> None:
        self.cost_profile = profile
        self._cost = profile.table(max(self.config.max_tokens, 1) + 1)

    def propose(
        self,
        namespace: str,
        session_id: str | None,
        context: Sequence[int],
        max_tokens: int | None = None,
    ) -> Draft:
        cfg = self.config
        budget = cfg.max_tokens if max_tokens is None else min(max_tokens, cfg.max_tokens)
        if budget <= 0 or not context:
            return EMPTY_DRAFT
        # Only the tail can match: converting a 30k-token prompt on every step would dominate.
        tail = context[-cfg.max_match :]
        with self.cache.draft_sources(namespace, session_id) as sources:
            if not sources:
                return EMPTY_DRAFT
            names = [name for name, _, _ in sources]
            raw = _native.speculate_multi(
                [tree for _, tree, _ in sources],
                [float(cfg.weights.get(name, 0.0)) for name in names],
                [tail for _, _, tail in sources],
                tail if isinstance(tail, list) else list(tail),
                budget,
                cfg.max_spec_factor,
                cfg.max_spec_offset,
                cfg.min_token_prob,
                cfg.max_match,
                cfg.use_tree,
                cfg.match_power,
            )
        tokens: list[int] = raw["tokens"]
        if not tokens:
            return Draft([], [], [], [], max(raw["match_lens"], default=0), 0.0)
        parents: list[int] = raw["parents"]
        raw_probs: list[float] = raw["probs"]
        depths = _depths(parents)
        if cfg.calibrate:
            est = self.calibrator.estimate
            probs = [est(p, d) for p, d in zip(raw_probs, depths, strict=True)]
            # acceptance of a token implies acceptance of its parent
            for i, parent in enumerate(parents):
                if parent >= 0 and probs[i] > probs[parent]:
                    probs[i] = probs[parent]
        else:
            probs = list(raw_probs)
        keep = self._best_prefix(probs) if cfg.cost_aware else len(tokens)
        src = [names[i] for i in raw["sources"][:keep]]
        return Draft(
            tokens[:keep],
            parents[:keep],
            probs[:keep],
            src,
            max(raw["match_lens"]),
            sum(probs[:keep]),
            raw_probs[:keep],
        )

    def _best_prefix(self, probs: Sequence[float]) -> int:
        """Prefix length maximising (1 + expected accepted) / cost(prefix + 1)."""
        cost = self._cost
        best_k, best_value, expected = 0, 1.0 / cost[1], 1.0
        for k, p in enumerate(probs, start=1):
            expected += p
            value = expected / cost[k + 1]
            if value > best_value:
                best_k, best_value = k, value
        return best_k

    def observe(
        self, draft: Draft, accepted: int, accepted_tokens: Sequence[int] | None = None
    ) -> None:
        """Feeds back how many draft tokens the verifier accepted.

        For a tree draft pass the accepted tokens too, so that only the nodes on
        the accepted branch count as hits.
        """
        if not draft.tokens or not self.config.calibrate:
            return
        depths = _depths(draft.parents)
        if draft.is_path():
            self.calibrator.observe(draft.raw_probs, depths, accepted)
            return
        on_path = _on_path(draft, accepted_tokens or [])
        self.calibrator.observe_hits(draft.raw_probs, depths, on_path)


def _on_path(draft: Draft, truth: Sequence[int]) -> list[bool]:
    hit = [False] * len(draft.tokens)
    for i, (tok, parent) in enumerate(zip(draft.tokens, draft.parents, strict=True)):
        depth = 0 if parent < 0 else None
        if parent >= 0 and hit[parent]:
            depth = 0
            j = parent
            while j >= 0:
                depth += 1
                j = draft.parents[j]
        if depth is not None and depth < len(truth) and truth[depth] == tok:
            hit[i] = True
    return hit


def _depths(parents: Sequence[int]) -> list[int]:
    depths: list[int] = []
    for parent in parents:
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return depths
