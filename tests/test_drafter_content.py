"""The calibrator's content features: what a token is, not only what the counts say."""

from __future__ import annotations

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from suffixcache import _native
from suffixcache.cost import CostProfile

COSTS = CostProfile.cpu_default().table(40)


def _choose(cal: _native.Calibrator, token: int, last_token: int = 3) -> tuple[float, int]:
    probs, keep = cal.choose(
        [1.0], [1], [-1], [0], 4, -1, COSTS, 1.0, True, tokens=[token], last_token=last_token
    )
    return probs[0], keep


def _observe(cal: _native.Calibrator, token: int, hit: bool, last_token: int = 3) -> None:
    cal.observe([1.0], [1], [-1], [0], 4, -1, [hit], tokens=[token], last_token=last_token)


def test_token_identity_separates_tokens_the_counts_cannot() -> None:
    # Two tokens with identical count features: one is always rejected (like the role
    # header after every earlier response), the other always accepted. The bins alone
    # see a 50% token; the content correction tells them apart.
    cal = _native.Calibrator(4.0, 0.0)
    for _ in range(300):
        _observe(cal, 7, False)
        _observe(cal, 9, True)
    p_bad, keep_bad = _choose(cal, 7)
    p_good, keep_good = _choose(cal, 9)
    assert p_good - p_bad > 0.6
    assert keep_bad == 0 and keep_good == 1
    # a token never seen falls back to the bins' estimate, between the two
    p_new, _ = _choose(cal, 11)
    assert p_bad < p_new < p_good


def test_without_tokens_the_estimate_is_the_bins_alone() -> None:
    # Callers that pass no tokens get the count-based calibration unchanged by content.
    cal = _native.Calibrator(4.0, 0.0)
    for _ in range(100):
        cal.observe([1.0], [1], [-1], [0], 4, -1, [True])
    probs, keep = cal.choose([1.0], [1], [-1], [0], 4, -1, COSTS, 1.0, True)
    assert probs[0] > 0.9 and keep == 1


def test_token_lists_must_match_the_draft() -> None:
    cal = _native.Calibrator(4.0, 0.0)
    try:
        cal.choose([1.0, 1.0], [1, 1], [-1, 0], [0, 0], 4, -1, COSTS, 1.0, True, tokens=[1])
    except ValueError as exc:
        assert "tokens" in str(exc)
    else:
        raise AssertionError("a short token list was accepted")


def test_backoff_estimates_separate_guesses_from_reliable_continuations() -> None:
    # Same counts, same token: the one whose short context is rarely continued with it
    # (backoff 0.1) is rejected, the one it usually continues (0.9) accepted. The
    # backoff features learn the difference; without them the two look alike.
    cal = _native.Calibrator(4.0, 0.0)
    guess, reliable = [0.1, 0.1, 0.1], [0.9, 0.9, 0.9]

    def observe(backoff: list[float], hit: bool) -> None:
        cal.observe([1.0], [1], [-1], [0], 4, -1, [hit], tokens=[5], backoff=backoff)

    def estimate(backoff: list[float]) -> float:
        probs, _ = cal.choose(
            [1.0], [1], [-1], [0], 4, -1, COSTS, 1.0, True, tokens=[5], backoff=backoff
        )
        return probs[0]

    for _ in range(300):
        observe(guess, False)
        observe(reliable, True)
    assert estimate(reliable) - estimate(guess) > 0.6
    unknown = estimate([])  # no backoff given: in between
    assert estimate(guess) < unknown < estimate(reliable)
    try:
        estimate([0.5])
    except ValueError as exc:
        assert "backoff" in str(exc)
    else:
        raise AssertionError("a backoff list of the wrong length was accepted")


@pytest.mark.parametrize("feature", ["recency", "pair_recency"])
def test_recent_use_in_the_transcript_is_learned(feature: str) -> None:
    # Same counts, same backoff: a token (or pair) the conversation used in its last 32
    # tokens is accepted, one it never used is not; the recency features learn it.
    cal = _native.Calibrator(4.0, 0.0)

    def observe(bucket: int, hit: bool) -> None:
        cal.observe([1.0], [1], [-1], [0], 4, -1, [hit], tokens=[5], **{feature: [bucket]})

    def estimate(buckets: list[int]) -> float:
        probs, _ = cal.choose(
            [1.0], [1], [-1], [0], 4, -1, COSTS, 1.0, True, tokens=[5], **{feature: buckets}
        )
        return probs[0]

    for _ in range(300):
        observe(0, True)
        observe(3, False)
    assert estimate([0]) - estimate([3]) > 0.6
    with pytest.raises(ValueError, match=feature):
        estimate([0, 1])


@settings(max_examples=60, deadline=None)
@given(
    seqs=st.lists(st.lists(st.integers(0, 12), min_size=1, max_size=40), min_size=3, max_size=9),
    context=st.lists(st.integers(0, 12), min_size=1, max_size=12),
    kinds=st.permutations([0, 1, 2]),
    prev=st.integers(-1, 8),
    rate=st.floats(0.5, 3.0),
    judged=st.lists(st.booleans(), max_size=40),
    start=st.integers(0, 4),
)
def test_native_draft_calibrates_like_its_lists(
    seqs: list[list[int]],
    context: list[int],
    kinds: list[int],
    prev: int,
    rate: float,
    judged: list[bool],
    start: int,
) -> None:
    # The Drafter keeps a step's draft native (draft_multi, choose_draft, observe_draft);
    # the list API (speculate_multi, choose, observe) is the readable definition of the
    # same features, and both must estimate and learn alike.
    trees = [_native.SuffixTree(16) for _ in range(3)]
    for i, seq in enumerate(seqs):
        trees[i % 3].extend(i, seq)
    trees[0].extend(99, context)  # the session transcript ends with the context
    args = ([1.0, 1.0, 0.5], [99, -1, -1], context, 24, 2.0, 2.0, 0.0, 12)
    raw = _native.speculate_multi(trees, *args)
    native = _native.draft_multi(trees, kinds, *args)
    n = len(raw["tokens"])
    assert len(native) == n and native.tokens() == raw["tokens"]
    assert native.match_len == max(raw["match_lens"])
    assert native.probs == raw["probs"]
    k = n // 2
    tokens, parents, tree_index, seq_id = native.head(k)
    assert (tokens, parents, tree_index) == (
        raw["tokens"][:k],
        raw["parents"][:k],
        raw["sources"][:k],
    )
    assert seq_id == (raw["seq_ids"][0] if k else None)
    assert native.tokens(k) == raw["tokens"][k:]
    probs = raw["probs"]
    lists = {
        "conds": [
            p / probs[q] if q >= 0 and probs[q] > 0 else p
            for p, q in zip(probs, raw["parents"], strict=True)
        ],
        "supports": raw["counts"],
        "parents": raw["parents"],
        "sources": [kinds[s] for s in raw["sources"]],
        "tokens": raw["tokens"],
        "backoff": raw.get("backoff", []),
        "recency": raw.get("recency", []),
        "pair_recency": raw.get("pair_recency", []),
    }
    by_lists, by_native = _native.Calibrator(4.0, 0.0), _native.Calibrator(4.0, 0.0)
    last = context[-1]

    def both_choose() -> None:
        want, keep = by_lists.choose(
            lists["conds"],
            lists["supports"],
            lists["parents"],
            lists["sources"],
            native.match_len,
            prev,
            COSTS,
            rate,
            True,
            lists["tokens"],
            last,
            lists["backoff"],
            lists["recency"],
            lists["pair_recency"],
        )
        got, got_keep = by_native.choose_draft(native, prev, COSTS, rate, True, last)
        assert got_keep == keep and got == pytest.approx(want[:keep], rel=1e-12)

    both_choose()
    hits = judged[:n]
    event(f"draft tokens {min(n, 3)}+, learned {min(len(hits), 3)}+")
    m = len(hits)
    cut = {name: v[: m * 3] if name == "backoff" else v[:m] for name, v in lists.items()}
    for _ in range(3):
        by_lists.observe(
            cut["conds"],
            cut["supports"],
            cut["parents"],
            cut["sources"],
            native.match_len,
            prev,
            hits,
            cut["tokens"],
            last,
            cut["backoff"],
            cut["recency"],
            cut["pair_recency"],
            start,
        )
        by_native.observe_draft(native, prev, last, hits, start)
    assert by_native.trials == by_lists.trials
    both_choose()


def test_native_draft_rejects_bad_input() -> None:
    tree = _native.SuffixTree(8)
    tree.extend(1, [1, 2, 3, 1, 2, 4])
    native = _native.draft_multi([tree], [1], [1.0], [-1], [1, 2], 8, 2.0, 2.0, 0.0, 8)
    assert len(native) >= 1
    cal = _native.Calibrator()
    with pytest.raises(ValueError, match="more hits than draft tokens"):
        cal.observe_draft(native, -1, 2, [True] * (len(native) + 1))
    with pytest.raises(ValueError, match="start"):
        cal.observe_draft(native, -1, 2, [True], -1)
    with pytest.raises(ValueError, match="cost table too short"):
        cal.choose_draft(native, -1, [1.0], 1.0)
    with pytest.raises(ValueError, match="one source kind per tree"):
        _native.draft_multi([tree], [], [1.0], [-1], [1, 2])
    with pytest.raises(TypeError):
        cal.choose_draft([1, 2], -1, COSTS, 1.0)
