"""SuffixCache hierarchy and Drafter policy (library level, no daemon)."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from suffixcache import (
    CostProfile,
    Draft,
    DraftConfig,
    Drafter,
    SuffixCache,
    accepted_length,
    common_prefix_length,
)


def test_global_budget_evicts_oldest_first() -> None:
    cache = SuffixCache(max_depth=8, global_budget_tokens=10)
    assert cache.add_response("ns", 1, [1, 2, 3, 4]) == []
    assert cache.add_response("ns", 2, [5, 6, 7, 8]) == []
    assert cache.add_response("ns", 3, [9, 10, 11]) == [1]
    assert cache.response_ids("ns") == [2, 3]
    stats = cache.stats("ns")["ns"]["global"]
    assert stats["tokens"] == 7 and stats["evictions"] == 1
    cache.check_integrity()
    with pytest.raises(ValueError):
        cache.add_response("ns", 2, [1])


def test_sessions_grow_incrementally_and_close() -> None:
    cache = SuffixCache(max_depth=16)
    cache.open_session("a", "s", [1, 2, 3])
    cache.append_session("a", "s", [4, 5])
    assert cache.session_tokens("a", "s") == [1, 2, 3, 4, 5]
    assert cache.session_length("a", "s") == 5
    with pytest.raises(KeyError):
        cache.open_session("a", "s")
    cache.close_session("a", "s")
    assert not cache.has_session("a", "s")
    with pytest.raises(KeyError):
        cache.append_session("a", "s", [1])


def test_session_draft_ignores_the_contexts_own_tail() -> None:
    # The transcript ends with the context; only the earlier occurrence predicts.
    cache = SuffixCache(max_depth=32)
    transcript = [7, 8, 9, 10, 11, 12, 3, 7, 8, 9]
    cache.open_session("ns", "s", transcript)
    drafter = Drafter(cache, DraftConfig(calibrate=False, cost_aware=False))
    draft = drafter.propose("ns", "s", transcript)
    assert draft.tokens[:3] == [10, 11, 12]
    assert draft.probs[0] == pytest.approx(1.0)
    assert draft.source == "session"


def test_mixture_combines_sources() -> None:
    cache = SuffixCache(max_depth=32)
    cache.add_response("ns", 1, [1, 2, 3, 4, 5, 6])
    cache.add_corpus("ns", 1, [1, 2, 3, 4, 9, 9])
    drafter = Drafter(cache, DraftConfig(calibrate=False, cost_aware=False, max_spec_offset=8))
    draft = drafter.propose("ns", None, [1, 2, 3])
    # both sources agree on 4, so it is certain; then they disagree
    assert draft.tokens[0] == 4 and draft.probs[0] == pytest.approx(1.0)
    assert draft.tokens[1] == 5  # global weighs more than corpus by default
    assert draft.probs[1] < 1.0
    assert set(draft.sources) <= {"global", "corpus"}


def test_namespaces_are_isolated() -> None:
    cache = SuffixCache(max_depth=16)
    cache.add_response("a", 1, [40, 41, 42, 43, 44, 45])
    drafter = Drafter(cache, DraftConfig(calibrate=False, cost_aware=False))
    assert drafter.propose("a", None, [40, 41]).tokens
    assert drafter.propose("b", None, [40, 41]).tokens == []


def _long_confident_cache() -> SuffixCache:
    cache = SuffixCache(max_depth=64)
    seq = list(range(100, 140))
    for i in range(6):
        cache.add_response("ns", i, seq)
    return cache


def test_cost_profile_decides_length() -> None:
    cache = _long_confident_cache()
    ctx = list(range(100, 120))
    flat = Drafter(cache, DraftConfig(max_spec_offset=32), CostProfile.flat()).propose(
        "ns", None, ctx
    )
    steep = CostProfile.from_mapping({"1": 1.0, "2": 3.0, "32": 90.0})
    cpu = Drafter(cache, DraftConfig(max_spec_offset=32), steep).propose("ns", None, ctx)
    assert len(flat) == 20  # everything the tree offers
    assert len(cpu) < len(flat)


def test_cost_aware_drafter_declines_unlikely_drafts() -> None:
    cache = SuffixCache(max_depth=16)
    for i in range(10):  # after [1, 2], ten different continuations
        cache.add_response("ns", i, [1, 2, 50 + i, 60 + i])
    drafter = Drafter(cache, DraftConfig(min_token_prob=0.0))
    assert len(drafter.propose("ns", None, [1, 2])) == 0
    greedy = Drafter(cache, DraftConfig(min_token_prob=0.0, cost_aware=False, calibrate=False))
    assert len(greedy.propose("ns", None, [1, 2])) > 0


def test_calibration_learns_from_feedback() -> None:
    cache = _long_confident_cache()
    drafter = Drafter(cache, DraftConfig(max_spec_offset=32))
    ctx = list(range(100, 110))
    before = drafter.propose("ns", None, ctx)
    for _ in range(300):  # the verifier keeps rejecting the first token
        draft = drafter.propose("ns", None, ctx)
        drafter.observe(draft, 0)
    after = drafter.propose("ns", None, ctx)
    assert len(before) > 0
    assert len(after) < len(before)
    assert drafter.achieved_rate < 1.0


def test_the_verifiers_next_token_judges_the_first_declined_token() -> None:
    cache = _long_confident_cache()
    steep = CostProfile.from_mapping({"1": 1.0, "2": 3.0, "32": 90.0})
    drafter = Drafter(cache, DraftConfig(max_spec_offset=32), steep)
    ctx = list(range(100, 120))
    full = Drafter(cache, DraftConfig(max_spec_offset=32), CostProfile.flat()).propose(
        "ns", None, ctx
    )
    draft = drafter.propose("ns", None, ctx)
    n = len(draft)
    assert n < len(full) and draft.declined_tokens
    # the candidates after the cut, in order
    assert draft.declined_tokens == full.tokens[n:]
    truth = full.tokens
    # accepted whole, next token known: the declined token is judged too
    t0 = drafter.calibrator.trials
    drafter.observe(draft, n, truth[: n + 1])
    assert drafter.calibrator.trials == t0 + n + 1
    # without the next token, or when the draft was not accepted whole, it is not
    drafter.observe(draft, n, truth[:n])
    assert drafter.calibrator.trials == t0 + 2 * n + 1
    if n:
        drafter.observe(draft, n - 1, truth[: n - 1] + [truth[n - 1] + 1])
        assert drafter.calibrator.trials == t0 + 3 * n + 1
    # a declined token the response did not continue with counts as a miss: repeated,
    # the estimate for drafting past the cut falls and drafts get shorter
    for _ in range(200):
        d = drafter.propose("ns", None, ctx)
        drafter.observe(d, len(d), truth[: len(d)] + [-1])
    assert len(drafter.propose("ns", None, ctx)) <= n


def test_a_sessions_next_steps_judge_the_rest_of_a_declined_tail() -> None:
    cache = _long_confident_cache()
    for session in ("s", "s2", "s3"):
        cache.open_session("ns", session)
    steep = CostProfile.from_mapping({"1": 1.0, "2": 3.0, "32": 90.0})
    drafter = Drafter(cache, DraftConfig(max_spec_offset=32), steep)
    ctx = list(range(100, 120))
    truth = list(range(120, 140))  # what the response goes on with
    draft = drafter.propose("ns", "s", ctx)
    n = len(draft)
    assert len(draft.declined_tokens) >= 3 and draft.declined_tokens[1] == truth[n + 1]
    t0 = drafter.calibrator.trials
    # accepted whole, and the next token matches the first declined candidate: its n
    # tokens and that hit are learned at once; the draft waits for the session's next
    # step to judge the second candidate
    drafter.observe(draft, n, truth[: n + 1])
    assert drafter.calibrator.trials == t0 + n + 1
    assert drafter._held
    # the next step continues the same text with a token the second candidate is not:
    # the held draft learns that miss; the step itself, one miss
    ctx2 = ctx + truth[: n + 1]
    step2 = drafter.propose("ns", "s", ctx2)
    assert step2.tokens or step2.candidates
    drafter.observe(step2, 0, [-1])
    assert drafter.calibrator.trials == t0 + n + 1 + 1 + 1
    # a session whose next step does not continue the text (a new turn): the held
    # draft learns nothing more than what was known when it was held
    t1 = drafter.calibrator.trials
    other = drafter.propose("ns", "s2", ctx)
    drafter.observe(other, n, truth[: n + 1])
    assert drafter.calibrator.trials == t1 + n + 1
    unrelated = drafter.propose("ns", "s2", [7, 8, 9])
    assert not unrelated.tokens and unrelated.candidates is None
    drafter.observe(unrelated, 0, [5])
    assert drafter.calibrator.trials == t1 + n + 1
    assert not drafter._held.get(("ns", "s2"))
    # forgetting a session drops what it held
    drafter.observe(drafter.propose("ns", "s3", ctx), n, truth[: n + 1])
    drafter.forget_session("ns", "s3")
    assert not drafter._held


def test_draft_acceptance_on_paths_and_trees() -> None:
    path = Draft([5, 6, 7], [-1, 0, 1], [0.9, 0.8, 0.7], ["global"] * 3, 3, 2.4)
    assert path.accepted_length([5, 6, 9]) == 2
    assert path.path() == [5, 6, 7]
    tree = Draft([5, 6, 8, 7], [-1, 0, 0, 1], [0.9, 0.5, 0.4, 0.45], ["global"] * 4, 3, 2.25)
    assert not tree.is_path()
    assert tree.accepted_length([5, 8, 1]) == 2
    assert tree.accepted_length([5, 6, 7, 1]) == 3
    assert tree.path() == [5, 6, 7]


@st.composite
def _trees(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    n = draw(st.integers(0, 8))
    tokens = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    parents = [draw(st.integers(-1, i - 1)) for i in range(n)]  # parents come first
    return tokens, parents


@given(_trees(), st.lists(st.integers(0, 3), max_size=6))
def test_accepted_length_is_the_longest_matching_root_path(
    tree: tuple[list[int], list[int]], truth: list[int]
) -> None:
    tokens, parents = tree

    def root_path(i: int) -> list[int]:
        return [] if i < 0 else [*root_path(parents[i]), tokens[i]]

    # reference: every node's root path, the longest that is a prefix of truth
    want = max((len(p) for p in map(root_path, range(len(tokens)))
                if p == truth[: len(p)]), default=0)
    assert accepted_length(tokens, parents, truth) == want
    path = list(range(-1, len(tokens) - 1))
    assert accepted_length(tokens, None, truth) == accepted_length(tokens, path, truth)
    assert common_prefix_length(tokens, truth) == accepted_length(tokens, path, truth)


def test_tree_drafts_respect_the_budget() -> None:
    cache = SuffixCache(max_depth=16)
    for i in range(4):
        cache.add_response("ns", i, [1, 2, 10 + i, 20 + i, 30 + i])
    drafter = Drafter(
        cache,
        DraftConfig(
            use_tree=True, calibrate=False, cost_aware=False, min_token_prob=0.0, max_spec_offset=8
        ),
        CostProfile.flat(),
    )
    draft = drafter.propose("ns", None, [1, 2], max_tokens=6)
    assert len(draft) == 6
    assert not draft.is_path()
    assert all(p < i for i, p in enumerate(draft.parents))


def test_cost_profile_parsing() -> None:
    cpu = CostProfile.cpu_default()
    assert cpu.cost(1) == 1.0 and cpu.cost(8) == pytest.approx(2.53)
    assert cpu.cost(6) == pytest.approx((1.96 + 2.53) / 2)
    assert cpu.cost(40) > cpu.cost(32)
    assert CostProfile.from_json('{"2": 2.0, "4": 4.0}').cost(1) == 1.0
    for bad in ("[1, 2]", "{", '{"x": 1}', '{"1": -1}'):
        with pytest.raises(ValueError):
            CostProfile.from_json(bad)


def test_cost_past_the_profile_grows_at_its_upper_half_slope_not_its_last_segment() -> None:
    # a measured profile whose last two sizes cost the same (a padded shape, or noise):
    # rows past it still cost what the upper half of the profile says a row costs
    pts = {k: 1.0 + 0.37 * (k - 1) for k in range(1, 33)}
    pts[33] = pts[32]
    prof = CostProfile.from_mapping(pts)
    assert prof.tail_slope() == pytest.approx(0.37, rel=0.1)
    assert prof.cost(216) == pytest.approx(pts[33] + prof.tail_slope() * (216 - 33))
    assert prof.cost(216) > 60 * prof.cost(1)
    # a falling upper half (noise) stays flat, never cheaper than its last point
    falling = CostProfile.from_mapping({1: 1.0, 8: 3.0, 16: 2.5})
    assert falling.cost(40) == pytest.approx(2.5)
    assert CostProfile.flat().cost(500) == 1.0


def test_concurrent_readers_and_writers() -> None:
    cache = SuffixCache(max_depth=32, global_budget_tokens=2000)
    drafter = Drafter(cache)
    cache.open_session("ns", "s", [1, 2, 3])
    errors: list[BaseException] = []

    def writer(base: int) -> None:
        try:
            for i in range(200):
                cache.add_response("ns", base + i, [1, 2, 3, (base + i) % 50, 4, 5])
                cache.append_session("ns", "s", [i % 7, 1, 2])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def reader() -> None:
        try:
            for _ in range(400):
                drafter.propose("ns", "s", [1, 2, 3])
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(k * 1000,)) for k in range(2)]
    threads += [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    cache.check_integrity()


def test_draft_names_the_sequence_it_follows() -> None:
    cache = SuffixCache(max_depth=16)
    cache.add_corpus("ns", 42, [1, 2, 3, 4, 5, 6])
    cache.add_response("ns", 7, [9, 9, 9])
    drafter = Drafter(cache, DraftConfig(calibrate=False, cost_aware=False))
    draft = drafter.propose("ns", None, [1, 2, 3])
    assert draft.source == "corpus" and draft.seq_id == 42
    assert drafter.propose("ns", None, [8, 8]).seq_id is None


def test_draft_sources_hold_their_locks_only_inside_the_block() -> None:
    cache = SuffixCache()
    cache.open_session("ns", "s", [1, 2, 3])
    cache.add_response("ns", 1, [1, 2, 4])
    ns = cache.namespace("ns")
    locks = [ns.sessions["s"].lock, ns.global_tree.lock, ns.corpus_tree.lock]
    with cache.draft_sources("ns", "s") as sources:
        # the empty corpus tree is locked but not offered
        assert [name for name, _, _ in sources] == ["session", "global"]
        assert all(lock.locked() for lock in locks)
    assert not any(lock.locked() for lock in locks)
    with pytest.raises(RuntimeError), cache.draft_sources("ns", "s"):
        raise RuntimeError("the drafting failed")
    assert not any(lock.locked() for lock in locks)
    with pytest.raises(KeyError, match="no session"):
        cache.draft_sources("ns", "unknown")
    assert not any(lock.locked() for lock in locks)
    with cache.draft_sources("other", None) as sources:  # an unknown namespace has none
        assert sources == []
