"""A deliberately simple pure-Python model of the native suffix tree: the oracle.

It stores the sequences and counts occurrences by brute force, with none of the
native core's structure (no compression, no incremental state), and implements
the drafting semantics documented in suffix_tree.hpp:

* count(w): occurrences of w (len(w) <= max_depth) over live sequences;
* a source matches the longest suffix of the context (at most max_match
  tokens) occurring at least 1 + discount times, where discount is 1 when the
  source's tail sequence ends with the context window (that occurrence predicts
  nothing and is not counted);
* P_s(x | w) = count(w x) / (count(w) - discount at the match point);
* the mixture over sources weights each by weight * match_len ** power, and a
  path's probability is sum_s prior_s * P_s(path) / sum_s prior_s.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Sequence


class RefTree:
    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.seqs: dict[int, list[int]] = {}
        self._counts: Counter[tuple[int, ...]] | None = None

    def extend(self, seq_id: int, tokens: Sequence[int]) -> None:
        self.seqs.setdefault(seq_id, []).extend(tokens)
        self._counts = None

    def remove(self, seq_id: int) -> bool:
        self._counts = None
        return self.seqs.pop(seq_id, None) is not None

    @property
    def counts(self) -> Counter[tuple[int, ...]]:
        if self._counts is None:
            c: Counter[tuple[int, ...]] = Counter()
            for seq in self.seqs.values():
                for end in range(len(seq)):
                    for length in range(1, min(self.max_depth, end + 1) + 1):
                        c[tuple(seq[end - length + 1 : end + 1])] += 1
            self._counts = c
        return self._counts

    def count(self, w: Sequence[int]) -> int:
        if not w or len(w) > self.max_depth:
            return 0
        return self.counts.get(tuple(w), 0)

    def children(self, w: tuple[int, ...]) -> dict[int, int]:
        if len(w) >= self.max_depth:
            return {}
        return {k[-1]: v for k, v in self.counts.items() if len(k) == len(w) + 1 and k[:-1] == w}

    @property
    def num_tokens(self) -> int:
        return sum(len(s) for s in self.seqs.values())

    def ends_with(self, seq_id: int, tail: Sequence[int]) -> bool:
        seq = self.seqs.get(seq_id)
        return (
            seq is not None and len(seq) >= len(tail) and seq[len(seq) - len(tail) :] == list(tail)
        )


def _best(children: dict[int, int]) -> int | None:
    if not children:
        return None
    return min(children, key=lambda t: (-children[t], t))


def _match_roots(
    trees: Sequence[RefTree], weights: Sequence[float], tail_seqs: Sequence[int],
    context: Sequence[int], max_match: int, match_power: float, match_lens: list[int],
) -> tuple[list[tuple[tuple[int, ...], int, float] | None], list[float]]:
    """Per source: the state its draft starts from (the longest matched context suffix,
    the discount of its own tail, probability 1) or None, and its prior weight; each
    source's match length goes into ``match_lens``."""
    ns, n = len(trees), len(context)
    # state per source: (string so far, discount, prob) or None
    root: list[tuple[tuple[int, ...], int, float] | None] = [None] * ns
    prior = [0.0] * ns
    for s, tree in enumerate(trees):
        mm = max_match if max_match > 0 else tree.max_depth - 1
        window = min(n, mm)
        discount = (
            1 if tail_seqs[s] >= 0 and tree.ends_with(tail_seqs[s], context[n - window :]) else 0
        )
        m = 0
        for start in range(n - window, n):
            w = tuple(context[start:])
            if tree.count(w) >= 1 + discount:
                m = n - start
                break
        match_lens[s] = m
        if m <= 0 or weights[s] <= 0.0:
            continue
        prior[s] = weights[s] * float(m) ** match_power
        root[s] = (tuple(context[n - m :]), discount, 1.0)
    return root, prior


def ref_speculate_multi(
    trees: Sequence[RefTree],
    weights: Sequence[float],
    tail_seqs: Sequence[int],
    context: Sequence[int],
    max_tokens: int = 32,
    max_spec_factor: float = 1.0,
    max_spec_offset: float = 0.0,
    min_token_prob: float = 0.1,
    max_match: int = 0,
    use_tree: bool = False,
    match_power: float = 1.0,
) -> dict[str, object]:
    ns = len(trees)
    out: dict[str, object] = {
        "tokens": [],
        "parents": [],
        "probs": [],
        "sources": [],
        "match_lens": [0] * ns,
        "score": 0.0,
    }
    if ns == 0 or max_tokens <= 0 or not context:
        return out
    match_lens: list[int] = out["match_lens"]  # type: ignore[assignment]
    root, prior = _match_roots(trees, weights, tail_seqs, context, max_match, match_power,
                               match_lens)
    z = sum(prior)
    best_match = max((m for m, st in zip(match_lens, root, strict=True) if st is not None),
                     default=0)
    if z <= 0.0:
        return out
    import math

    max_len = int(
        min(max_tokens, math.floor(max_spec_factor * best_match + max_spec_offset + 1e-9))
    )
    if max_len <= 0:
        return out

    def cond(s: int, state: tuple[tuple[int, ...], int, float], token: int) -> float | None:
        w, discount, _ = state
        tree = trees[s]
        if len(w) >= tree.max_depth:
            return None
        total = tree.count(w) - discount
        if total <= 0:
            return None
        c = tree.count(w + (token,))
        if c == 0:
            return None
        return c / total

    def candidates(states: list, all_children: bool) -> list[int]:
        toks: set[int] = set()
        for s, st in enumerate(states):
            if st is None or st[2] <= 0.0:
                continue
            w, discount, _ = st
            tree = trees[s]
            if len(w) >= tree.max_depth or tree.count(w) - discount <= 0:
                continue
            ch = tree.children(w)
            if all_children:
                toks.update(ch)
            else:
                b = _best(ch)
                if b is not None:
                    toks.add(b)
        return sorted(toks)

    def mix(states: list, token: int) -> float:
        p = 0.0
        for s, st in enumerate(states):
            if st is None or st[2] <= 0.0:
                continue
            c = cond(s, st, token)
            if c is not None:
                p += prior[s] * st[2] * c
        return p / z

    def advance(states: list, token: int) -> tuple[list, int]:
        new: list = [None] * ns
        top, top_src = -1.0, 0
        for s, st in enumerate(states):
            if st is None or st[2] <= 0.0:
                continue
            c = cond(s, st, token)
            if c is None:
                continue
            new[s] = (st[0] + (token,), 0, st[2] * c)
            contrib = prior[s] * new[s][2]
            if contrib > top:
                top, top_src = contrib, s
        return new, top_src

    tokens: list[int] = out["tokens"]  # type: ignore[assignment]
    parents: list[int] = out["parents"]  # type: ignore[assignment]
    probs: list[float] = out["probs"]  # type: ignore[assignment]
    sources: list[int] = out["sources"]  # type: ignore[assignment]
    node_states: list[list] = []
    node_depth: list[int] = []

    def emit(parent: int, token: int, prob: float, states: list) -> None:
        new, src = advance(states, token)
        node_states.append(new)
        node_depth.append(1 if parent < 0 else node_depth[parent] + 1)
        tokens.append(token)
        parents.append(parent)
        probs.append(prob)
        sources.append(src)
        out["score"] = float(out["score"]) + prob  # type: ignore[arg-type]

    if not use_tree:
        states, at = root, -1
        while len(tokens) < max_len:
            best_tok, best_p = None, -1.0
            for t in candidates(states, False):
                p = mix(states, t)
                if p < min_token_prob:
                    continue
                if p > best_p or (p == best_p and best_tok is not None and t < best_tok):
                    best_tok, best_p = t, p
            if best_tok is None:
                break
            emit(at, best_tok, best_p, states)
            at = len(tokens) - 1
            states = node_states[at]
        return out

    heap: list[tuple[float, int, int]] = []  # (-prob, parent, token)

    def push_children(states: list, parent: int, depth: int) -> None:
        if depth >= max_len:
            return
        for t in candidates(states, True):
            p = mix(states, t)
            if p >= min_token_prob:
                heapq.heappush(heap, (-p, parent, t))

    push_children(root, -1, 0)
    while heap and len(tokens) < max_tokens:
        negp, parent, t = heapq.heappop(heap)
        emit(parent, t, -negp, root if parent < 0 else node_states[parent])
        idx = len(tokens) - 1
        push_children(node_states[idx], idx, node_depth[idx])
    return out


BACKOFF_ORDERS = (1, 2, 3)
BACKOFF_TOKENS = 6  # only a draft's first tokens get them (kBackoffTokens)


def ref_backoff(
    trees: Sequence[RefTree], context: Sequence[int], tokens: Sequence[int], parents: Sequence[int]
) -> list[float]:
    """For each of a draft's first BACKOFF_TOKENS tokens and k in BACKOFF_ORDERS:
    count(w token) / (count(w) + 1), counts summed over the trees, w = the k tokens
    before it (context, then its path); -1 for the later tokens."""
    out: list[float] = []
    for i, tok in enumerate(tokens):
        if i >= BACKOFF_TOKENS:
            out += [-1.0] * len(BACKOFF_ORDERS)
            continue
        path: list[int] = []
        p = parents[i]
        while p >= 0:
            path.append(tokens[p])
            p = parents[p]
        before = list(context) + path[::-1]
        for k in BACKOFF_ORDERS:
            if len(before) < k:
                out.append(-1.0)
                continue
            w = before[len(before) - k :]
            total = sum(t.count(w) for t in trees)
            nxt = sum(t.count([*w, tok]) for t in trees)
            out.append(nxt / (total + 1))
    return out


RECENCY_WINDOWS = (32, 128, 512)


def ref_recency(transcript: Sequence[int], tokens: Sequence[int]) -> list[int]:
    """For each token, the smallest window at the end of the transcript holding it."""
    out = []
    for tok in tokens:
        inside = [w for w in RECENCY_WINDOWS if tok in transcript[max(0, len(transcript) - w) :]]
        out.append(RECENCY_WINDOWS.index(inside[0]) if inside else len(RECENCY_WINDOWS))
    return out


def ref_pair_recency(
    transcript: Sequence[int], tokens: Sequence[int], parents: Sequence[int]
) -> list[int]:
    """ref_recency for each token's pair (the token before it, the token)."""
    out = []
    for i, tok in enumerate(tokens):
        pair = (transcript[-1] if parents[i] < 0 else tokens[parents[i]], tok)
        found = len(RECENCY_WINDOWS)
        for j, w in enumerate(RECENCY_WINDOWS):
            start = max(1, len(transcript) - w)
            if any(
                (transcript[q - 1], transcript[q]) == pair for q in range(start, len(transcript))
            ):
                found = j
                break
        out.append(found)
    return out
