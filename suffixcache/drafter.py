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
RATE_DECAY = 0.999  # the achieved rate averages over roughly the last thousand steps
RATE_PRIOR = 20.0  # pseudo-steps at rate 1 before any feedback


@dataclass(frozen=True)
class DraftConfig:
    max_tokens: int = 32  # hard cap on draft tokens per step
    max_spec_factor: float = 1.0  # draft length <= factor * match_len + offset
    max_spec_offset: float = 0.0
    min_token_prob: float = 0.05  # raw cumulative probability below which drafting stops
    max_match: int = 32  # longest context suffix matched (leaves max_depth - max_match to draft)
    use_tree: bool = False  # draft a tree of branches instead of one path
    match_power: float = 1.0  # source weight grows as match_len ** match_power
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
    parents: list[int]  # index of the parent token; -1 = hangs off the end of the context
    probs: list[float]  # estimated probability that the token is accepted (cumulative)
    sources: list[str]  # per token: the source that contributed most
    match_len: int  # longest matched context suffix over the sources
    score: float  # expected accepted tokens (sum of probs)
    conds: list[float] = field(default_factory=list, repr=False)  # raw P(token | parent)
    supports: list[int] = field(default_factory=list, repr=False)  # occurrences behind each token

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
    """Online estimate of P(token accepted | its parent was accepted).

    Features of a draft token: its raw conditional probability (its cumulative
    probability over its parent's), how many occurrences support it, and its
    depth in the draft. Each bin counts accepted / verified tokens, starting
    from a prior centred on the raw probability. Only tokens whose parent was
    accepted are evidence (the verifier never judged the others), so the
    estimate stays unbiased however the drafts were truncated.
    """

    COND_EDGES = (0.3, 0.6, 0.9, 0.99, 2.0)
    SUPPORT_EDGES = (1, 2, 4, 8, 16, 1 << 30)
    DEPTH_EDGES = (1, 3, 7, 1 << 30)
    MATCH_EDGES = (2, 5, 10, 1 << 30)
    PRIOR_WEIGHT = 2.0

    def __init__(self) -> None:
        n = (
            len(self.COND_EDGES)
            * len(self.SUPPORT_EDGES)
            * len(self.DEPTH_EDGES)
            * len(self.MATCH_EDGES)
        )
        self._hits = [0.0] * n
        self._trials = [0.0] * n
        # Lookup tables instead of searches: this runs for every draft token.
        ns, nd, nm = len(self.SUPPORT_EDGES), len(self.DEPTH_EDGES), len(self.MATCH_EDGES)
        self._cond_base = [
            _bucket(i / 1000, self.COND_EDGES) * ns * nd * nm for i in range(1001)
        ]
        self._support_off = [_bucket(c, self.SUPPORT_EDGES) * nd * nm for c in range(65)]
        self._depth_off = [_bucket(d, self.DEPTH_EDGES) * nm for d in range(1025)]
        self._match_off = [_bucket(m, self.MATCH_EDGES) for m in range(1025)]
        self._lock = threading.Lock()

    def _bin(self, cond: float, support: int, depth: int, match_len: int) -> int:
        return (
            self._cond_base[int(cond * 1000)]
            + self._support_off[support if support < 64 else 64]
            + self._depth_off[depth if depth < 1024 else 1024]
            + self._match_off[match_len if match_len < 1024 else 1024]
        )

    def estimate(self, cond: float, support: int, depth: int, match_len: int) -> float:
        b = self._bin(cond, support, depth, match_len)
        return (self._hits[b] + self.PRIOR_WEIGHT * cond) / (self._trials[b] + self.PRIOR_WEIGHT)

    def path_estimates(
        self, conds: Sequence[float], supports: Sequence[int], parents: Sequence[int],
        depths: Sequence[int], match_len: int,
    ) -> list[float]:
        """Cumulative acceptance estimates of a draft's tokens (a token needs its parent)."""
        cond_base, support_off, depth_off = self._cond_base, self._support_off, self._depth_off
        hits, trials, w = self._hits, self._trials, self.PRIOR_WEIGHT
        m_off = self._match_off[match_len if match_len < 1024 else 1024]
        out: list[float] = []
        for c, sup, parent, d in zip(conds, supports, parents, depths, strict=True):
            b = (
                cond_base[int(c * 1000)]
                + support_off[sup if sup < 64 else 64]
                + depth_off[d if d < 1024 else 1024]
                + m_off
            )
            r = (hits[b] + w * c) / (trials[b] + w)
            out.append(r if parent < 0 else r * out[parent])
        return out

    def observe(
        self,
        conds: Sequence[float],
        supports: Sequence[int],
        depths: Sequence[int],
        match_len: int,
        parent_ok: Sequence[bool],
        accepted: Sequence[bool],
    ) -> None:
        with self._lock:
            for cond, sup, depth, judged, ok in zip(
                conds, supports, depths, parent_ok, accepted, strict=True
            ):
                if not judged:
                    continue
                b = self._bin(cond, sup, depth, match_len)
                self._trials[b] += 1.0
                if ok:
                    self._hits[b] += 1.0


def _bucket(value: float, edges: Sequence[float]) -> int:
    for i, edge in enumerate(edges):
        if value <= edge:
            return i
    return len(edges) - 1


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
        # tokens per unit of verification cost achieved so far (plain decoding: 1)
        self._rate_tokens = RATE_PRIOR
        self._rate_cost = RATE_PRIOR
        self._rate_lock = threading.Lock()

    def set_cost_profile(self, profile: CostProfile) -> None:
        self.cost_profile = profile
        self._cost = profile.table(max(self.config.max_tokens, 1) + 1)

    def _cost_of(self, k: int) -> float:
        return self._cost[k] if k < len(self._cost) else self.cost_profile.cost(k)

    @property
    def achieved_rate(self) -> float:
        """Recent tokens per unit of verification cost (the speed-up over plain decoding)."""
        return self._rate_tokens / self._rate_cost

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
        supports: list[int] = raw["counts"]
        depths = _depths(parents)
        conds = [
            p / raw_probs[parent] if parent >= 0 and raw_probs[parent] > 0 else p
            for p, parent in zip(raw_probs, parents, strict=True)
        ]
        if cfg.calibrate:
            probs = self.calibrator.path_estimates(
                conds, supports, parents, depths, max(raw["match_lens"])
            )
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
            conds[:keep],
            supports[:keep],
        )

    def _best_prefix(self, probs: Sequence[float]) -> int:
        """Prefix length maximising expected tokens - rate * cost(prefix + 1).

        Maximising each step's own tokens/cost ratio is not what maximises the
        run's overall tokens/cost: a draft whose ratio beats plain decoding but
        falls short of the rate the drafter already achieves still drags the
        total down (Dinkelbach's argument). `rate` is that achieved rate,
        tracked from the drafter's own feedback.
        """
        cost = self._cost
        rate = self._rate_tokens / self._rate_cost
        best_k, best_value, expected = 0, 1.0 - rate * cost[1], 1.0
        for k, p in enumerate(probs, start=1):
            expected += p
            value = expected - rate * cost[k + 1]
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
        with self._rate_lock:
            # exponentially forgotten sums: the rate follows the workload
            self._rate_tokens = self._rate_tokens * RATE_DECAY + accepted + 1
            self._rate_cost = self._rate_cost * RATE_DECAY + self._cost_of(len(draft.tokens) + 1)
        if not draft.tokens or not self.config.calibrate:
            return
        depths = _depths(draft.parents)
        if draft.is_path():
            hit = [i < accepted for i in range(len(draft.tokens))]
        else:
            hit = _on_path(draft, accepted_tokens or [])
        parent_ok = [p < 0 or hit[p] for p in draft.parents]
        self.calibrator.observe(
            draft.conds, draft.supports, depths, draft.match_len, parent_ok, hit
        )


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
