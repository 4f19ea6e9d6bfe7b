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
   once gives probability 1 to its whole continuation). A native calibrator
   (csrc/calibrator.hpp) learns online how often a token with given features
   (raw probability, support, depth, match length, source, the session's
   previous acceptance) was really accepted, corrected by a logistic term
   learned over the tokens themselves (the token id, the token before it, the
   id crossed with source, previous acceptance and match length): some tokens
   are rejected whatever their counts say, e.g. the text that followed earlier
   responses when the current response is about to end. Two more kinds of
   feature come from the native draft itself: how often the last 1-3 tokens
   alone are continued with the token (a deep token a long match saw once is a
   guess unless its short context usually goes that way), and whether the
   session's transcript used the token, and the pair it forms with the token
   before it, in its last 32/128/512 tokens (a column of the schema in the
   prompt, an identifier of the code at hand). It learns from every token the
   verifier judged, and from the candidates past its own cut that the text
   which followed judged.
3. Length: given the verifier's cost profile (cost of checking k tokens
   relative to one), keep the prefix k that maximises
   (1 + expected accepted tokens) - rate * cost(k + 1), where rate is the
   tokens per unit of cost the drafter already achieves. Maximising that, not
   each step's own ratio, is what maximises the whole run's tokens per cost
   (Dinkelbach). With a flat (GPU) profile this drafts long; on a CPU it stops
   where the marginal token no longer pays for itself.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from suffixcache import _native
from suffixcache.cache import SuffixCache
from suffixcache.cost import CostProfile

SOURCES = ("session", "global", "corpus")
SOURCE_IDS = {name: i for i, name in enumerate(SOURCES)}
CALIBRATION_PRIOR_WEIGHT = 4.0
# An upper-confidence bonus, in standard errors, on the calibrated acceptance (the
# calibrator learns only from what it drafts). Off: once every step is fed back (empty
# drafts included) and the calibrator learns at its cut, the bonus gains nothing on the
# model's own outputs and costs on the replay (docs/research-log.md).
CALIBRATION_OPTIMISM = 0.0
MAX_TRACKED_SESSIONS = 100_000
RATE_DECAY = 0.999  # the achieved rate averages over roughly the last thousand steps
RATE_PRIOR = 20.0  # pseudo-steps at rate 1 before any feedback


@dataclass(frozen=True)
class DraftConfig:
    max_tokens: int = 32  # hard cap on draft tokens per step
    # draft length <= factor * match_len + offset; the cost-aware choice cuts it further
    max_spec_factor: float = 2.0
    max_spec_offset: float = 2.0
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


@dataclass(slots=True)
class Draft:
    """One step's draft. Treat it as immutable (not frozen: a frozen dataclass's
    constructor costs as much as the rest of the Python side of a step)."""

    tokens: list[int]
    parents: list[int]  # index of the parent token; -1 = hangs off the end of the context
    probs: list[float]  # estimated probability that the token is accepted (cumulative)
    sources: list[str]  # per token: the source that contributed most
    match_len: int  # longest matched context suffix over the sources
    score: float  # expected accepted tokens (sum of probs)
    key: tuple[str, str] | None = field(default=None, repr=False)  # (namespace, session)
    prev: int = field(default=-1, repr=False)  # session's previous-step acceptance when drafted
    # a sequence (of the first token's source tree) that holds the drafted text, e.g. the
    # corpus document a corpus draft came from; None for an empty draft
    seq_id: int | None = None
    last_token: int = field(default=-1, repr=False)  # the context's last token when drafted
    # Every candidate the trees offered, the drafted ones first, with the calibrator's
    # features, kept native (None when the trees offered none). The calibrator learns
    # the drafted ones from it, and, when the whole draft is accepted, those the length
    # rule declined as far as the text that follows judges them.
    candidates: _native.NativeDraft | None = field(default=None, repr=False)
    # the context's tail the draft was matched against: says whether a later step of
    # the same session continues this one (the text after the cut is then known)
    context_tail: Sequence[int] = field(default=(), repr=False)
    # The same draft with every candidate the trees offered, not cut by the length rule
    # for a step of its own (calibrated probabilities throughout): a verifier that shares
    # its steps with other sequences chooses the length over the whole step. None: no
    # candidates past the cut (or not a path).
    _extend: Callable[[], Draft] | None = field(default=None, repr=False, compare=False)
    _path: bool | None = field(default=None, init=False, repr=False, compare=False)
    _declined: list[int] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def declined_tokens(self) -> list[int]:
        """The candidate tokens the length rule declined (a path draft's only: a tree's
        declined branches are not a continuation of it)."""
        if self._declined is None:  # read once per step and per held draft: converted once
            c = self.candidates
            if c is None or len(c) == len(self.tokens) or not self.is_path():
                self._declined = []
            else:
                self._declined = c.tokens(len(self.tokens))
        return self._declined

    @property
    def source(self) -> str:
        return self.sources[0] if self.sources else "none"

    def __len__(self) -> int:
        return len(self.tokens)

    def is_path(self) -> bool:
        if self._path is None:
            self._path = all(p == i - 1 for i, p in enumerate(self.parents))
        return self._path

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

    def extended(self) -> Draft:
        """Every candidate, the length rule's cut undone (see ``_extend``)."""
        return self._extend() if self._extend is not None else self

    def head(self, k: int) -> Draft:
        """The draft cut to its first ``k`` tokens (a verifier that evaluated only those);
        a path draft's candidates past the cut count as declined, as the length rule's."""
        if k >= len(self.tokens):
            return self
        probs = self.probs[:k]
        return Draft(self.tokens[:k], self.parents[:k], probs, self.sources[:k],
                     self.match_len, sum(probs), self.key, self.prev,
                     self.seq_id if k else None, self.last_token, self.candidates,
                     self.context_tail)

    def accepted_length(self, truth: Sequence[int]) -> int:
        """Longest prefix of a root-to-leaf path of the draft that equals truth's prefix."""
        return accepted_length(self.tokens, None if self.is_path() else self.parents, truth)


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share: a path draft's accepted tokens."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def accepted_length(
    tokens: Sequence[int], parents: Sequence[int] | None, truth: Sequence[int]
) -> int:
    """Longest prefix of ``truth`` that follows a root-to-leaf path of a draft tree
    (``parents[i]``: the index of token i's parent, -1 at the root, parents first;
    None for a path)."""
    if parents is None:
        return common_prefix_length(tokens, truth)
    depth: dict[int, int] = {-1: 0}
    best = 0
    for i, (tok, parent) in enumerate(zip(tokens, parents, strict=True)):
        d = depth.get(parent)
        if d is None or d >= len(truth) or truth[d] != tok:
            continue
        depth[i] = d + 1
        best = max(best, d + 1)
    return best


EMPTY_DRAFT = Draft([], [], [], [], 0, 0.0)


class Drafter:
    """Proposes drafts for a session from the cache's trees (see the module docstring).

    Thread-safe: trees are locked by the cache; the calibrator's native calls
    hold the GIL; the achieved-rate and per-session state have their own lock.
    """

    def __init__(
        self,
        cache: SuffixCache,
        config: DraftConfig | None = None,
        cost_profile: CostProfile | None = None,
    ) -> None:
        self.cache = cache
        self.config = config or DraftConfig()
        self.calibrator = _native.Calibrator(CALIBRATION_PRIOR_WEIGHT, CALIBRATION_OPTIMISM)
        self.set_cost_profile(cost_profile or CostProfile.cpu_default())
        # tokens per unit of verification cost achieved so far (plain decoding: 1)
        self._rate_tokens = RATE_PRIOR
        self._rate_cost = RATE_PRIOR
        # (namespace, session) -> tokens accepted at its previous step (-1: no draft)
        self._prev: OrderedDict[tuple[str, str], int] = OrderedDict()
        # per session: drafts accepted whole whose declined tail awaits judgement
        self._held: OrderedDict[tuple[str, str], list[_Held]] = OrderedDict()
        self._lock = threading.Lock()

    def set_cost_profile(self, profile: CostProfile) -> None:
        self.cost_profile = profile
        self._cost = profile.table(max(self.config.max_tokens, 1) + 1)

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
        if not isinstance(tail, list):  # the native call takes a list; the Draft keeps it
            tail = list(tail)
        with self.cache.draft_sources(namespace, session_id) as sources:
            if not sources:
                return EMPTY_DRAFT
            names = [name for name, _, _ in sources]
            native = _native.draft_multi(
                [tree for _, tree, _ in sources],
                [SOURCE_IDS[name] for name in names],
                [float(cfg.weights.get(name, 0.0)) for name in names],
                [tail_seq for _, _, tail_seq in sources],
                tail,
                budget,
                cfg.max_spec_factor,
                cfg.max_spec_offset,
                cfg.min_token_prob,
                cfg.max_match,
                cfg.use_tree,
                cfg.match_power,
            )
        key = (namespace, session_id) if session_id is not None else None
        if not len(native):
            return Draft([], [], [], [], native.match_len, 0.0, key=key, context_tail=tail)
        last_token = int(tail[-1])
        prev = self._prev.get(key, -1) if key is not None else -1
        if cfg.calibrate:
            probs, keep = self.calibrator.choose_draft(
                native, prev, self._cost, self.achieved_rate, cfg.cost_aware, last_token
            )
        else:
            probs = native.probs
            keep = self._best_prefix(probs) if cfg.cost_aware else len(probs)
            probs = probs[:keep]
        def draft(n: int, p: list[float], extend: Callable[[], Draft] | None = None) -> Draft:
            tokens, parents, tree_index, seq_id = native.head(n)
            return Draft(tokens, parents, p, [names[i] for i in tree_index], native.match_len,
                         sum(p), key, prev, seq_id, last_token, native, tail, extend)

        def extend() -> Draft:
            every, n = self.calibrator.choose_draft(
                native, prev, self._cost, self.achieved_rate, False, last_token)
            return draft(n, list(every))

        return draft(keep, probs, extend if cfg.calibrate and keep < len(native) else None)

    def _best_prefix(self, probs: Sequence[float]) -> int:
        """Prefix length maximising expected tokens - rate * cost(prefix + 1).

        Maximising each step's own tokens/cost ratio is not what maximises the
        run's overall tokens/cost: a draft whose ratio beats plain decoding but
        falls short of the rate the drafter already achieves still drags the
        total down (Dinkelbach's argument). `rate` is that achieved rate,
        tracked from the drafter's own feedback. (The native calibrator applies
        the same rule when calibration is on.)
        """
        cost, rate = self._cost, self.achieved_rate
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

        Call it for every step the drafter was asked about, empty drafts included: a
        step without a draft is one token at the cost of one, and the achieved rate
        each draft must beat has to count it (without those steps the rate is
        overrated and the drafter drafts too little).

        ``accepted_tokens``: the tokens that followed the context, the accepted ones
        and, best, the verifier's own next token after them. For a tree draft they
        locate the accepted branch. After a draft accepted whole, the tokens past it
        also say whether the candidates the length rule declined would have been
        accepted: without that evidence the calibrator never sees the tokens past
        its cut and overrates them (bench/policy_cut.py measures the calibration
        there). The verifier's next token judges the first of them at
        once; the draft is held for the rest until the session's next steps, whose
        tokens continue the same text, have judged them.
        """
        n = len(draft.tokens)
        step_cost = self._cost[n + 1] if n + 1 < len(self._cost) else self.cost_profile.cost(n + 1)
        with self._lock:
            # exponentially forgotten sums: the rate follows the workload
            self._rate_tokens = self._rate_tokens * RATE_DECAY + accepted + 1
            self._rate_cost = self._rate_cost * RATE_DECAY + step_cost
            held: list[_Held] = []
            if draft.key is not None:
                if draft.candidates is not None:  # a step without candidates leaves it as it was
                    self._prev[draft.key] = accepted if n else -1
                    self._prev.move_to_end(draft.key)
                    if len(self._prev) > MAX_TRACKED_SESSIONS:
                        self._prev.popitem(last=False)
                held = self._held.pop(draft.key, [])
        if not self.config.calibrate:
            return
        still_held: list[_Held] = []
        for h in held:
            # the session's text goes on from where the held draft's known text ends,
            # unless this step's context does not end with it (a new turn)
            text, tail = h.text, draft.context_tail
            m = min(len(text), len(tail))
            if accepted_tokens is not None and m and list(tail[-m:]) == text[-m:]:
                text.extend(accepted_tokens)
                if not _judged(h.draft.declined_tokens, text[len(h.draft.tokens) :])[1]:
                    still_held.append(h)
                    continue
            self._learn(h.draft, len(h.draft.tokens), text, start=h.learned)
        if draft.candidates is not None:
            # learned at once as far as known (the calibrator's next choices need it);
            # the rest of a declined tail waits for the text that judges it
            learned = self._learn(draft, accepted, accepted_tokens)
            past = accepted_tokens[n:] if accepted_tokens is not None else []
            if (
                draft.key is not None  # a later step of the same session can go on judging it
                and accepted == n
                and past
                and draft.declined_tokens
                and not _judged(draft.declined_tokens, past)[1]
            ):
                still_held.append(_Held(draft, list(accepted_tokens or []), learned))
        if still_held and draft.key is not None:
            with self._lock:
                self._held[draft.key] = still_held
                if len(self._held) > MAX_TRACKED_SESSIONS:
                    self._held.popitem(last=False)

    def _learn(
        self, draft: Draft, n_accepted: int, truth: Sequence[int] | None = None, start: int = 0
    ) -> int:
        """Teaches the calibrator a judged draft: its tokens and, after a draft accepted
        whole, its declined candidates as far as ``truth`` (the text that followed the
        context) judges them; all but the first ``start`` (learned before). Returns how
        many tokens, drafted and declined, it has now learned."""
        native = draft.candidates
        if native is None:
            return 0
        n = len(draft.tokens)
        if draft.is_path():
            hits = [i < n_accepted for i in range(n)]
        else:
            hits = _on_path(draft, truth or [])
        if n_accepted == n and truth is not None and len(truth) > n:
            # the declined candidates continue the path: the native draft holds them next
            hits += _judged(draft.declined_tokens, truth[n:])[0]
        if len(hits) > start:
            self.calibrator.observe_draft(native, draft.prev, draft.last_token, hits, start)
        return len(hits)

    def forget_session(self, namespace: str, session_id: str) -> None:
        with self._lock:
            self._prev.pop((namespace, session_id), None)
            self._held.pop((namespace, session_id), None)


@dataclass
class _Held:
    """A draft accepted whole whose declined candidates await the text that follows."""

    draft: Draft
    text: list[int]  # the session's text after the draft's context, as far as known
    learned: int  # its tokens, drafted then declined, the calibrator has learned


def _judged(declined: Sequence[int], text: Sequence[int]) -> tuple[list[bool], bool]:
    """How ``text`` judges the declined candidate tokens (up to the first miss), and
    whether it judged all it ever will (a miss, or every candidate)."""
    hits: list[bool] = []
    for token, truth in zip(declined, text, strict=False):
        hits.append(token == truth)
        if token != truth:
            return hits, True
    return hits, len(hits) == len(declined)


def _on_path(draft: Draft, truth: Sequence[int]) -> list[bool]:
    """Which tree-draft tokens lie on the accepted path (truth = the accepted tokens)."""
    hit = [False] * len(draft.tokens)
    depth = [0] * len(draft.tokens)
    for i, (tok, parent) in enumerate(zip(draft.tokens, draft.parents, strict=True)):
        if parent >= 0 and not hit[parent]:
            continue
        d = 0 if parent < 0 else depth[parent] + 1
        depth[i] = d
        hit[i] = d < len(truth) and truth[d] == tok
    return hit
