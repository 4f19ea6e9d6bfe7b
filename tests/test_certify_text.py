"""certify_text: a greedy output known by its text, judged by plain decoding's gap record.

Property tests on a vocabulary of one letter per token (so the text says which token began
it) against the rule written plainly: the first position where the text leaves the
reference's letters decides, by the reference's logit for the letter the text has there
(or for the end-of-generation token where the text ends).
"""

from __future__ import annotations

import string

from hypothesis import given
from hypothesis import strategies as st
from suffixd.daemon.generation.certify import NEAR_TIE_GAP, TokenGap, certify_text

LETTERS = string.ascii_lowercase
EOG = len(LETTERS)  # the end-of-generation token: no bytes


def piece(t: int) -> bytes:
    return b"" if t == EOG else LETTERS[t].encode()


def is_eog(t: int) -> bool:
    return t == EOG


@st.composite
def records(draw: st.DrawFn) -> list[TokenGap]:
    """A plain greedy record: each position's logits over a few candidates, the best
    chosen; it may end with the end-of-generation token."""
    n = draw(st.integers(1, 12))
    out = []
    for i in range(n):
        last = i == n - 1
        ids = draw(st.lists(st.integers(0, EOG if last else EOG - 1), min_size=2,
                            max_size=5, unique=True))
        logits = draw(st.lists(st.floats(-10, 10), min_size=len(ids), max_size=len(ids)))
        top = sorted(zip(ids, logits, strict=True), key=lambda p: -p[1])
        out.append(TokenGap(top[0][0], top[0][0], top[1][0], top[0][1] - top[1][1], top))
    return out


def text_of(tokens: list[int]) -> str:
    return "".join(LETTERS[t] for t in tokens if t != EOG)


def expected(reference: list[TokenGap], text: str) -> tuple[str, int | None]:
    for i, g in enumerate(reference):
        plain = None if g.token == EOG else LETTERS[g.token]
        served = text[i] if i < len(text) else None
        if plain == served:
            if plain is None:
                return "identical", None
            continue
        logit = dict(g.top).get(EOG if served is None else LETTERS.index(served))
        near = logit is not None and g.top[0][1] - logit <= NEAR_TIE_GAP
        return ("near_tie" if near else "diverged"), i
    return ("identical", None) if len(text) == len(reference) else ("diverged", len(reference))


@given(records())
def test_the_reference_text_is_identical(reference: list[TokenGap]) -> None:
    text = text_of([g.token for g in reference])
    assert certify_text(reference, text, piece, is_eog) == ("identical", None)


@given(records(), st.data())
def test_a_text_that_leaves_the_reference_is_judged_where_it_leaves(
        reference: list[TokenGap], data: st.DataObject) -> None:
    plain = [g.token for g in reference if g.token != EOG]
    cut = data.draw(st.integers(0, len(plain)))
    # what the served run wrote from there: often one of the recorded candidates
    at = min(cut, len(reference) - 1)
    first = data.draw(st.sampled_from([t for t, _ in reference[at].top] + [0, 7]))
    tail = data.draw(st.lists(st.integers(0, EOG - 1), max_size=4))
    text = text_of(plain[:cut] + [first] + tail)
    assert certify_text(reference, text, piece, is_eog) == expected(reference, text)


def test_a_character_split_over_two_tokens() -> None:
    """Tokens that are halves of one UTF-8 character (byte-fallback tokens)."""
    pieces = {0: b"\xc3", 1: b"\xa9", 2: b"x", 3: b""}

    def g(tok: int, *top: tuple[int, float]) -> TokenGap:
        return TokenGap(tok, top[0][0], top[1][0], top[0][1] - top[1][1], list(top))

    ref = [g(0, (0, 5.0), (2, 4.0)), g(1, (1, 6.0), (2, 1.0)), g(3, (3, 3.0), (2, 2.5))]
    judge = lambda text: certify_text(ref, text, pieces.__getitem__, lambda t: t == 3)  # noqa: E731
    assert judge("é") == ("identical", None)
    assert judge("éx") == ("near_tie", 2)  # x is 0.5 below the end there
    assert judge("x") == ("near_tie", 0)
    # the served run wrote x after the first half (5.0 below the second half): its text
    # holds a replacement character, so it tells that it diverged, not where
    assert judge("\ufffdx")[0] == "diverged"
