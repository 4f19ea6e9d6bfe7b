"""certify_tokens: a greedy output known by its tokens, judged by plain decoding's gap
record; property tests against the rule written plainly."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from suffixd.daemon.generation.certify import (
    NEAR_TIE_GAP,
    TokenGap,
    certify_sampled,
    certify_tokens,
    cut_shortfall,
)

EOG = 9  # the end-of-generation token (ids 0-8 are text)


def is_eog(t: int) -> bool:
    return t == EOG


@st.composite
def records(draw: st.DrawFn) -> list[TokenGap]:
    """A plain greedy record: each position's logits over a few candidates, the best
    chosen; it may end with the end-of-generation token."""
    n = draw(st.integers(1, 10))
    out = []
    for _ in range(n):
        ids = draw(st.lists(st.integers(0, EOG), min_size=2, max_size=5, unique=True))
        logits = draw(st.lists(st.floats(-10, 10), min_size=len(ids), max_size=len(ids)))
        top = sorted(zip(ids, logits, strict=True), key=lambda p: -p[1])
        out.append(TokenGap(top[0][0], top[0][0], top[1][0], top[0][1] - top[1][1], top))
        if is_eog(top[0][0]):
            break  # a run ends at its end-of-generation token
    return out


def expected(reference: list[TokenGap], tokens: list[int]) -> tuple[str, int | None]:
    plain = [g.token for g in reference]
    text = [t for t in plain if not is_eog(t)]
    if tokens == text:
        return "identical", None
    i = next(i for i in range(len(plain) + 1)
             if i >= len(tokens) or i >= len(plain) or tokens[i] != plain[i])
    if i >= len(plain):
        return "diverged", i  # it went on past the reference's max tokens
    served = EOG if i >= len(tokens) else tokens[i]
    logit = dict(reference[i].top).get(served)
    near = logit is not None and reference[i].top[0][1] - logit <= NEAR_TIE_GAP
    return ("near_tie" if near else "diverged"), i


@given(records(), st.data())
def test_tokens_are_judged_where_they_leave_plain_decoding(
        reference: list[TokenGap], data: st.DataObject) -> None:
    text = [g.token for g in reference if not is_eog(g.token)]
    assert certify_tokens(reference, text, is_eog) == ("identical", None)
    cut = data.draw(st.integers(0, len(text)))
    at = min(cut, len(reference) - 1)
    # what the served run wrote from there: often one of the recorded candidates
    first = data.draw(st.sampled_from([t for t, _ in reference[at].top if not is_eog(t)]
                                      + [0, 7]))
    tail = data.draw(st.lists(st.integers(0, EOG - 1), max_size=3))
    served = data.draw(st.sampled_from([text[:cut], text[:cut] + [first] + tail]))
    assert certify_tokens(reference, served, is_eog) == expected(reference, served)


def test_a_sampled_token_is_inside_near_or_outside_plain_decodings_cut() -> None:
    logits = np.array([14.0, 13.0, 12.2, 12.1, 11.9, 9.0, 1.0])
    # top-4: the cut keeps 0..3, its weakest logit 12.1
    assert [certify_sampled(logits, t, 1.0, 4, 1.0) for t in range(4)] == ["inside"] * 4
    assert cut_shortfall(logits, 4, 1.0, 4, 1.0) == pytest.approx(0.2)
    assert certify_sampled(logits, 4, 1.0, 4, 1.0) == "near_tie"
    assert cut_shortfall(logits, 5, 1.0, 4, 1.0) == pytest.approx(3.1)
    assert certify_sampled(logits, 5, 1.0, 4, 1.0) == "outside"
    assert certify_sampled(logits, 5, 1.0, 4, 1.0, threshold=3.5) == "near_tie"
    # top-p: the nucleus of 0.5 keeps token 0 alone (p ~ 0.55 at temperature 1)
    assert certify_sampled(logits, 0, 1.0, 0, 0.5) == "inside"
    assert cut_shortfall(logits, 1, 1.0, 0, 0.5) == pytest.approx(1.0)
    assert certify_sampled(logits, 1, 1.0, 0, 0.5) == "near_tie"
    assert certify_sampled(logits, 6, 1.0, 0, 0.5) == "outside"
    assert NEAR_TIE_GAP == 2.0
