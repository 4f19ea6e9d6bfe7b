"""Property tests: the native suffix tree against the brute-force reference model."""

from __future__ import annotations

import math

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from suffixcache import SuffixTree, speculate_multi
from tests.reference_tree import (
    RefTree,
    ref_backoff,
    ref_pair_recency,
    ref_recency,
    ref_speculate_multi,
)

ALPHABET = st.integers(min_value=0, max_value=4)  # small, so that strings repeat
TOKENS = st.lists(ALPHABET, min_size=0, max_size=12)

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("extend"), st.integers(0, 3), TOKENS),
        st.tuples(st.just("remove"), st.integers(0, 3), st.just([])),
        st.tuples(st.just("spec"), st.integers(0, 3), st.lists(ALPHABET, min_size=1, max_size=10)),
    ),
    max_size=25,
)

SPEC_PARAMS = st.fixed_dictionaries(
    {
        "max_tokens": st.integers(0, 8),
        "max_spec_factor": st.sampled_from([0.5, 1.0, 2.0, 8.0]),
        "max_spec_offset": st.sampled_from([0.0, 1.0, 3.0]),
        "min_token_prob": st.sampled_from([0.0, 0.1, 0.3, 0.6]),
        "max_match": st.integers(0, 6),
        "use_tree": st.booleans(),
    }
)


def assert_same_draft(got: dict, want: dict) -> None:
    assert got["tokens"] == want["tokens"]
    assert got["parents"] == want["parents"]
    assert got["sources"] == want["sources"]
    assert got["match_lens"] == want["match_lens"]
    assert len(got["probs"]) == len(want["probs"])
    for a, b in zip(got["probs"], want["probs"], strict=True):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def all_patterns(ref: RefTree, extra: list[list[int]]) -> list[list[int]]:
    pats = [list(k) for k in ref.counts][:200]
    return pats + extra


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(depth=st.integers(1, 7), ops=OPS, params=SPEC_PARAMS)
def test_single_tree_matches_reference(depth: int, ops: list, params: dict) -> None:
    tree, ref = SuffixTree(depth), RefTree(depth)
    for op, seq, arg in ops:
        if op == "extend":
            tree.extend(seq, arg)
            ref.extend(seq, arg)
        elif op == "remove":
            assert tree.remove(seq) == ref.remove(seq)
        else:
            got = tree.speculate(arg, **params)
            want = ref_speculate_multi([ref], [1.0], [-1], arg, match_power=0.0, **params)
            assert_same_draft(got, want)
        tree.check_integrity()
        assert tree.num_tokens == ref.num_tokens
        assert tree.num_sequences == len(ref.seqs)
        for pat in all_patterns(ref, [[0], [1, 2], [4, 4, 4]]):
            assert tree.count(pat) == ref.count(pat), pat


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    depth=st.integers(2, 7),
    contents=st.lists(
        st.lists(st.tuples(st.integers(0, 2), TOKENS), max_size=4), min_size=3, max_size=3
    ),
    context=st.lists(ALPHABET, min_size=1, max_size=10),
    weights=st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=3, max_size=3),
    session_holds_context=st.booleans(),
    match_power=st.sampled_from([0.0, 1.0, 2.0]),
    params=SPEC_PARAMS,
)
def test_mixture_matches_reference(
    depth: int,
    contents: list,
    context: list[int],
    weights: list[float],
    session_holds_context: bool,
    match_power: float,
    params: dict,
) -> None:
    trees = [SuffixTree(depth) for _ in range(3)]
    refs = [RefTree(depth) for _ in range(3)]
    for tree, ref, seqs in zip(trees, refs, contents, strict=True):
        for seq, toks in seqs:
            tree.extend(seq, toks)
            ref.extend(seq, toks)
    if session_holds_context:  # the session transcript ends with the drafting context
        trees[0].extend(9, context)
        refs[0].extend(9, context)
    tails = [9, -1, -1]
    got = speculate_multi(trees, weights, tails, context, match_power=match_power, **params)
    want = ref_speculate_multi(refs, weights, tails, context, match_power=match_power, **params)
    assert_same_draft(got, want)
    # each token's backoff estimates, from counts over all three trees
    backoff = ref_backoff(refs, context, want["tokens"], want["parents"])  # type: ignore[arg-type]
    assert got.get("backoff", []) == pytest.approx(backoff, rel=1e-6)
    # how recently the transcript holding the context used each token
    if session_holds_context and want["tokens"]:
        transcript = refs[0].seqs[9]
        assert got["recency"] == ref_recency(transcript, want["tokens"])  # type: ignore[arg-type]
        pairs = ref_pair_recency(transcript, want["tokens"], want["parents"])  # type: ignore[arg-type]
        assert got["pair_recency"] == pairs
    else:
        assert "recency" not in got and "pair_recency" not in got


@settings(max_examples=100, deadline=None)
@given(
    transcript=st.lists(st.integers(0, 40), min_size=1, max_size=700),
    tokens=st.lists(st.integers(0, 45), min_size=1, max_size=20),
)
def test_recency_buckets_match_reference(transcript: list[int], tokens: list[int]) -> None:
    # A session transcript holding the context: the draft tokens' recency in it. The
    # draft comes from another tree; the transcript's own tree only holds the context.
    session, other = SuffixTree(8), SuffixTree(8)
    session.extend(1, transcript)
    other.extend(1, transcript[-3:] + tokens)
    got = speculate_multi(
        [session, other], [0.0, 1.0], [1, -1], transcript[-3:], 32, 8.0, 8.0, 0.0, 3
    )
    assert got["tokens"]
    assert got["recency"] == ref_recency(transcript, got["tokens"])
    assert got["pair_recency"] == ref_pair_recency(transcript, got["tokens"], got["parents"])


@settings(max_examples=50, deadline=None)
@given(seqs=st.lists(st.lists(st.integers(0, 50), min_size=1, max_size=60), min_size=1, max_size=8))
def test_remove_restores_counts_exactly(seqs: list[list[int]]) -> None:
    tree = SuffixTree(16)
    ref = RefTree(16)
    for i, s in enumerate(seqs):
        tree.extend(i, s)
        ref.extend(i, s)
    before = {k: tree.count(list(k)) for k in ref.counts}
    tree.extend(100, seqs[0] + seqs[-1])
    tree.remove(100)
    tree.check_integrity()
    assert {k: tree.count(list(k)) for k in ref.counts} == before
    for i in range(len(seqs)):
        tree.remove(i)
    tree.check_integrity()
    assert tree.num_nodes == 0 and tree.num_tokens == 0


def test_incremental_extend_equals_one_shot() -> None:
    a, b = SuffixTree(8), SuffixTree(8)
    seq = [1, 2, 3, 1, 2, 3, 4, 1, 2, 3, 1, 2] * 5
    a.extend(0, seq)
    for tok in seq:
        b.extend(0, [tok])
    ref = RefTree(8)
    ref.extend(0, seq)
    for pat in ref.counts:
        assert a.count(list(pat)) == b.count(list(pat)) == ref.count(pat)


@pytest.mark.parametrize(
    "bad, exc",
    [
        ([-1], ValueError),
        ([2**31], ValueError),
        (["a"], TypeError),
        ("abc", TypeError),
        ([1.5], TypeError),
        ([None], TypeError),
        (5, TypeError),
    ],
)
def test_invalid_tokens_raise_clear_errors(bad: object, exc: type[Exception]) -> None:
    tree = SuffixTree(8)
    with pytest.raises(exc):
        tree.extend(0, bad)  # type: ignore[arg-type]
    with pytest.raises(exc):
        tree.speculate(bad)  # type: ignore[arg-type]
    assert tree.num_tokens == 0
    tree.check_integrity()


def test_vocab_size_and_parameter_validation() -> None:
    tree = SuffixTree(8, vocab_size=10)
    with pytest.raises(ValueError, match="vocabulary size"):
        tree.extend(0, [3, 10])
    with pytest.raises(ValueError):
        SuffixTree(0)
    with pytest.raises(ValueError):
        SuffixTree(8, vocab_size=-1)
    with pytest.raises(ValueError):
        tree.extend(-5, [1])
    with pytest.raises(ValueError):
        tree.speculate([1], max_tokens=10**9)
    with pytest.raises(ValueError):
        tree.speculate([1], min_token_prob=float("nan"))
    with pytest.raises(ValueError):
        speculate_multi([tree, tree], [1.0, 1.0], [-1, -1], [1])
    with pytest.raises(KeyError):
        tree.seq_tokens(42)


def test_numpy_and_array_inputs() -> None:
    import array

    import numpy as np

    tree = SuffixTree(8)
    tree.extend(0, np.array([1, 2, 3, 1, 2, 4], dtype=np.int32))
    tree.extend(1, array.array("i", [1, 2, 3]))
    assert tree.count([1, 2]) == 3
    assert tree.speculate(np.array([1, 2]), min_token_prob=0.0)["tokens"][0] == 3


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    depth=st.integers(2, 12),
    chunks=st.lists(
        st.tuples(st.integers(0, 2), st.lists(st.integers(0, 2), min_size=1, max_size=40)),
        min_size=1,
        max_size=12,
    ),
)
def test_interleaved_long_extends_match_reference(depth: int, chunks: list) -> None:
    # Long extends make leaves grow in place across many tokens ("open" leaves),
    # interleaving sequences makes other sequences split them.
    tree, ref = SuffixTree(depth), RefTree(depth)
    for seq, toks in chunks:
        tree.extend(seq, toks)
        ref.extend(seq, toks)
        tree.check_integrity()
    for pat in ref.counts:
        assert tree.count(list(pat)) == ref.counts[pat]
    for seq in list(ref.seqs):
        tree.remove(seq)
        ref.remove(seq)
        tree.check_integrity()
        for pat in ref.counts:
            assert tree.count(list(pat)) == ref.counts[pat]
