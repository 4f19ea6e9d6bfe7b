"""The calibrator's content features: what a token is, not only what the counts say."""

from __future__ import annotations

import pytest

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
