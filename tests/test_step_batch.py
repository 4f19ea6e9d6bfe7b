"""The step planner and batcher (daemon/generation/step_planner.py and step_batch.py),
without a model: plans against their rules and a brute-force optimum, the batcher's
exclusion and batching under real threads."""

from __future__ import annotations

import itertools
import math
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from suffixd.daemon.generation.step_batch import Interrupted, StepBatcher, Stopping
from suffixd.daemon.generation.step_cost import PAD_ROW_WEIGHT, Entry, StepCostModel, split_equal
from suffixd.daemon.generation.step_planner import (
    PROMPT_RESERVE,
    StepRows,
    cheapest_layout,
    joint_lengths,
    padded_rows,
    plan_step,
    step_cost,
    ubatch_cost,
)


def linear(n: int) -> float:
    return 0.0 if n <= 0 else 1.0 + 0.3 * (n - 1)


def cpu_like(n: int) -> float:  # piecewise, not convex: a 2-core CPU's measured shape
    table = {1: 1.0, 2: 1.3, 3: 1.7, 4: 1.8, 5: 2.6, 6: 2.6, 7: 2.7, 8: 2.7}
    return 0.0 if n <= 0 else table.get(n, 2.7 + 0.3 * (n - 8))


def _decode(seq: int, draft: list[float], pos0: int = 100, room: int = 64) -> StepRows:
    probs = sorted(draft, reverse=True)
    return StepRows(seq, list(range(1 + len(probs))), pos0, room, probs=probs)


requests = st.lists(
    st.tuples(st.integers(0, 7), st.lists(st.floats(0.0, 1.0), max_size=5),
              st.integers(1, 9), st.booleans()),
    min_size=1, max_size=6, unique_by=lambda t: t[0],
)


def _build(spec: list[tuple[int, list[float], int, bool]]) -> list[StepRows]:
    out = []
    for seq, draft, room, prompt in spec:
        if prompt:
            out.append(StepRows(seq, list(range(3 + 40 * room)), 0, 512, prompt=True))
        else:
            out.append(_decode(seq, draft, room=room))
    return out


def blocks_of_4(n: int, rows: int) -> int:
    """A logit_rows rule: past 4, round the rows with logits up to a multiple of 4."""
    return min(rows, -(-n // 4) * 4) if n > 4 else n


@settings(max_examples=300, deadline=None)
@given(requests, st.integers(4, 64), st.floats(0.5, 6.0), st.booleans(), st.booleans(),
       st.sampled_from([None, 4, 8, 16]))
def test_a_plan_keeps_every_rule(spec, n_batch, rate, modelled, logits, n_ubatch) -> None:
    pending = _build(spec)
    model = StepCostModel(cpu_like, n_batch) if modelled else None
    plan = plan_step(pending, n_batch, cpu_like, rate, model=model,
                     logit_rows=blocks_of_4 if logits else None, n_ubatch=n_ubatch)
    assert plan, "a plan is never empty while something waits"
    assert sum(r.rows for r in plan) <= n_batch
    offset = 0
    for r in plan:
        assert 1 <= r.kept <= len(r.tokens)
        assert r.kept <= r.rows
        assert r.rows <= max(r.room, r.kept)
        assert r.offset == offset  # rows laid out back to back
        assert r.shared == len(plan)
        offset += r.rows
        if r.prompt:
            assert r.rows == r.kept and r.outputs == 0
        elif not logits:
            assert r.outputs == r.kept
        else:  # every verified row has logits; padding may ask for them too
            assert r.kept <= r.outputs <= r.rows
    if logits:
        # per run of consecutive ids (a ubatch): the rule's rows with logits, as far as
        # the run's padding reaches
        decodes = [r for r in plan if not r.prompt]
        runs: list[list[StepRows]] = []
        for r in decodes:
            if runs and r.seq_id == runs[-1][-1].seq_id + 1:
                runs[-1].append(r)
            else:
                runs.append([r])
        for run in runs:
            kept, rows = sum(r.kept for r in run), sum(r.rows for r in run)
            assert sum(r.outputs for r in run) == min(blocks_of_4(kept, rows), rows)
    # no decode's rows span two of the ubatches llama.cpp splits the step into (a rolled
    # back draft that did parted from plain decoding)
    ubatches = split_equal([Entry(r.seq_id, r.rows, r.outputs, r.pos0, r.prompt)
                            for r in plan], n_ubatch or n_batch)
    for i, r in enumerate(plan):
        if not r.prompt:
            assert sum(i in u.members for u in ubatches) == 1, (plan, ubatches)
    # the decodes' ubatches, then the prompt chunks by id; planned by the step cost model
    # or with one decode, all by id (llama.cpp's split takes runs of consecutive ids in
    # batch order); every sequence at most once
    seqs = [r.seq_id for r in plan]
    n_dec = sum(not r.prompt for r in plan)
    if modelled or n_dec <= 1:
        assert seqs == sorted(seqs)
    else:
        assert not any(r.prompt for r in plan[:n_dec])
        assert seqs[n_dec:] == sorted(seqs[n_dec:])
    assert len({id(r) for r in plan}) == len(plan)


@settings(max_examples=300, deadline=None)
@given(requests, st.floats(0.5, 6.0))
def test_the_sequences_of_a_ubatch_get_equal_rows_when_room_and_budget_allow(spec, rate) -> None:
    pending = [r for r in _build(spec) if not r.prompt]
    if not pending:
        return
    plan = plan_step(pending, 512, cpu_like, rate)
    if len(plan) == 1:
        return
    entries = [Entry(r.seq_id, r.rows, r.outputs, r.pos0) for r in plan]
    for u in split_equal(entries, 512):
        rows = [plan[i].rows for i in u.members]
        if all(plan[i].room >= max(rows) for i in u.members):
            assert len(set(rows)) == 1, (plan, u)


@settings(max_examples=300, deadline=None)
@given(requests, st.integers(16, 512), st.floats(0.5, 6.0))
def test_no_decoding_sequence_waits_past_one_step(spec, n_batch, rate) -> None:
    """Fairness: while the step's budget holds a row for each, every sequence that handed
    in a decode is in the step (none waits a step for another's draft or a prompt), and a
    waiting prompt moves whenever the budget leaves a row."""
    pending = _build(spec)
    decodes = [r for r in pending if not r.prompt]
    prompts = [r for r in pending if r.prompt]
    budget = n_batch - (min(PROMPT_RESERVE, n_batch // 2) if prompts else 0)
    plan = plan_step(pending, n_batch, cpu_like, rate)
    if len(decodes) <= budget:
        assert all(r in plan for r in decodes)
    if prompts and sum(r.rows for r in plan if not r.prompt) < n_batch:
        assert any(r.prompt and r.kept >= 1 for r in plan)


def _plain_rate(reqs: list[StepRows], cost) -> float:
    """The plain plan's tokens per cost: one row per estimated draft, whole drafts as
    their rows (what joint_lengths raises its rate to)."""
    kept = [1 if r.probs is not None else r.kept for r in reqs]
    return sum(kept) / step_cost(cost, padded_rows(reqs, kept), kept)


def _value(reqs: list[StepRows], kept: list[int], cost, rate: float) -> float:
    expected = len(reqs) + sum(sum(r.probs[: k - 1]) for r, k in zip(reqs, kept, strict=True))
    return expected - rate * step_cost(cost, padded_rows(reqs, kept), kept)


def _reference_candidates(reqs: list[StepRows]) -> tuple[list[int], list[tuple[float, int, int]]]:
    """The plain plan's rows and every draft token as a candidate (-its acceptance, no
    higher than any before it; index; request), most probable first: both references'
    starting point, written plainly."""
    kept = [1 if r.probs is not None else r.kept for r in reqs]
    cands = []
    for i, r in enumerate(reqs):
        if r.probs is None:
            continue
        low = 1.0
        for j, p in enumerate(r.probs[: r.kept - 1]):
            low = min(low, float(p))
            cands.append((-low, j, i))
    cands.sort()
    return kept, cands


def _joint_lengths_reference(reqs: list[StepRows], cost, rate: float) -> list[int]:
    """The joint rule written plainly: every candidate, best first, re-pads the whole
    step (O(candidates x sequences)); joint_lengths keeps the same sums incrementally."""
    kept, cands = _reference_candidates(reqs)
    rate = max(rate, _plain_rate(reqs, cost))

    def value(expected: float) -> float:
        return expected - rate * step_cost(cost, padded_rows(reqs, kept), kept)

    expected = float(len(reqs))
    best, best_kept = value(expected), list(kept)
    for neg_p, j, i in cands:
        if kept[i] != j + 1:
            continue
        kept[i] += 1
        expected -= neg_p
        if (v := value(expected)) > best:
            best, best_kept = v, list(kept)
    return best_kept


joint_requests = st.lists(
    st.tuples(st.integers(0, 9), st.lists(st.floats(0.0, 1.0), max_size=6),
              st.integers(1, 9), st.integers(1, 8), st.booleans()),
    min_size=1, max_size=7, unique_by=lambda t: t[0],
)


@settings(max_examples=400, deadline=None)
@given(joint_requests, st.floats(0.2, 8.0), st.sampled_from([linear, cpu_like]))
def test_joint_lengths_equal_the_plain_reference(spec, rate, cost) -> None:
    reqs = []
    for seq, draft, room, kept, whole in spec:
        r = _decode(seq, draft, room=room)
        r.kept = min(len(r.tokens), kept)
        if whole:  # no estimates (a grammar's or a draft model's draft): kept as it is
            r.probs = None
        reqs.append(r)
    assert joint_lengths(reqs, cost, rate) == _joint_lengths_reference(reqs, cost, rate)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.floats(0.0, 1.0), max_size=4), min_size=2, max_size=3),
       st.floats(0.5, 6.0))
def test_joint_lengths_are_optimal_with_a_linear_cost_and_no_padding(drafts, rate) -> None:
    # sequence ids 0, 2, 4: no two consecutive, so nothing is padded and the objective is
    # separable and concave: the merged best-first rule must find the optimum
    reqs = [_decode(2 * i, d) for i, d in enumerate(drafts)]
    for r in reqs:
        r.kept = len(r.tokens)
    got = joint_lengths(reqs, linear, rate)
    rate = max(rate, _plain_rate(reqs, linear))  # the plan's floor: the plain plan's rate
    best = max(_value(reqs, list(k), linear, rate)
               for k in itertools.product(*[range(1, len(r.tokens) + 1) for r in reqs]))
    assert _value(reqs, got, linear, rate) >= best - 1e-9


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.floats(0.0, 1.0), max_size=5), min_size=2, max_size=4),
       st.floats(0.5, 6.0))
def test_joint_lengths_never_do_worse_than_whole_drafts_or_none(drafts, rate) -> None:
    reqs = [_decode(i, d) for i, d in enumerate(drafts)]  # consecutive: padding counts
    for r in reqs:
        r.kept = len(r.tokens)
    got = joint_lengths(reqs, cpu_like, rate)
    rate = max(rate, _plain_rate(reqs, cpu_like))
    assert all(1 <= k <= len(r.tokens) for r, k in zip(reqs, got, strict=True))
    v = _value(reqs, got, cpu_like, rate)
    assert v >= _value(reqs, [len(r.tokens) for r in reqs], cpu_like, rate) - 1e-9
    assert v >= _value(reqs, [1] * len(reqs), cpu_like, rate) - 1e-9


def _tokens_per_cost(reqs: list[StepRows], kept: list[int], cost, model=None) -> float:
    expected = sum(1.0 + (sum(r.probs[: k - 1]) if r.probs is not None else k - 1)
                   for r, k in zip(reqs, kept, strict=True))
    if model is not None:
        return expected / cheapest_layout(reqs, kept, model)[0]
    return expected / step_cost(cost, padded_rows(reqs, kept), kept)


def _model(cost, coefs: tuple[float, ...] | None) -> StepCostModel | None:
    """An exact oracle of shared steps: a step cost model whose coefficients are the
    step's true price (rows with logits, padding, sequences, attention, extra ubatches,
    prompt rows)."""
    if coefs is None:
        return None
    m = StepCostModel(cost, 512, unit_seconds=1.0)
    m.theta = __import__("numpy").array([1.0, *coefs])
    return m


shared_costs = st.one_of(st.none(), st.tuples(
    st.floats(0.1, 1.0), st.floats(0.0, 0.5), st.floats(0.0, 0.2), st.floats(0.0, 2.0),
    st.floats(0.0, 20.0)))


@settings(max_examples=500, deadline=None)
@given(joint_requests, st.floats(0.01, 8.0), st.sampled_from([linear, cpu_like]), shared_costs)
def test_the_chosen_plan_never_costs_more_per_token_than_the_plain_plan(
        spec, rate, cost, coefs) -> None:
    """With an exact cost oracle (the planner prices steps with the very cost the step
    then has: the profile's rows with every run padded, or the step cost model's ubatches
    under the cheapest layout), whatever the achieved rate says, the plan's expected
    tokens per unit of cost are at least the plain plan's (one row per sequence, whole
    drafts as they are)."""
    reqs = []
    for seq, draft, room, kept, whole in spec:
        r = _decode(seq, draft, room=room)
        r.kept = min(len(r.tokens), kept)
        if whole:
            r.probs = None
        reqs.append(r)
    model = _model(cost, coefs)
    got = joint_lengths(reqs, cost, rate, model)
    plain = [1 if r.probs is not None else r.kept for r in reqs]
    assert _tokens_per_cost(reqs, got, cost, model) >= \
        _tokens_per_cost(reqs, plain, cost, model) * (1 - 1e-9)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.floats(0.0, 1.0), max_size=5), min_size=2, max_size=8),
       st.floats(0.3, 6.0), shared_costs.filter(lambda c: c is not None))
def test_the_modelled_plan_is_the_best_of_whole_drafts_none_and_the_plain_rule(
        drafts, rate, coefs) -> None:
    """The modelled joint plan's objective (expected tokens - rate x its cheapest price)
    is at least that of every draft kept whole and of no drafts at all."""
    model = _model(linear, coefs)
    assert model is not None
    reqs = [_decode(i, d) for i, d in enumerate(drafts)]
    for r in reqs:
        r.kept = len(r.tokens)
    got = joint_lengths(reqs, linear, rate, model)
    plain = [1] * len(reqs)
    rate = max(rate, len(reqs) / cheapest_layout(reqs, plain, model)[0])

    def value(kept: list[int]) -> float:
        expected = len(reqs) + sum(sum(r.probs[: k - 1]) for r, k in zip(reqs, kept,
                                                                          strict=True))
        return expected - rate * cheapest_layout(reqs, kept, model)[0]

    assert value(got) >= value(plain) - 1e-9
    whole = [len(r.tokens) for r in reqs]
    # pruned candidates (below the cheapest row's worth) may stop short of whole drafts
    if all(p >= rate * model.cheapest_row() for r in reqs for p in r.probs):
        assert value(got) >= value(whole) - 1e-9


def test_a_plan_takes_the_layout_its_model_prices_lowest_unless_it_splits_a_draft() -> None:
    """The EPYC figures (step_cost.py): one long draft beside seven plain sequences is
    priced cheaper unpadded (two ubatches), but its rows would span both, so the draft is
    cut to the first ubatch's one row; three spread ones are cheaper padded to one ubatch."""
    model = StepCostModel(linear, 512, unit_seconds=0.011)

    def plan(lengths: list[int]) -> list[int]:
        reqs = [StepRows(i, list(range(k)), 1500, 64) for i, k in enumerate(lengths)]
        chosen = plan_step(reqs, 512, linear, 0.01, model=model)
        return [r.rows for r in sorted(chosen, key=lambda r: r.seq_id)]

    assert plan([4, 1, 1, 1, 1, 1, 1, 1]) == [1] * 8
    assert plan([4, 1, 1, 4, 1, 1, 4, 1]) == [4] * 8
    assert plan([1] * 8) == [1] * 8


def _partitions(n: int, breaks: set[int]):
    """Every partition of positions 0..n-1 into intervals, none spanning a break (a
    position whose id does not follow its predecessor's)."""
    if n == 0:
        yield []
        return
    for cut in range(n - 1, -1, -1):
        if any(b in breaks for b in range(cut + 1, n)):
            continue
        for rest in _partitions(cut, breaks):
            yield [*rest, range(cut, n)]


def _grouped_price_reference(reqs: list[StepRows], kept: list[int], cost,
                             n_ubatch: int) -> float:
    """The cheapest layout of ``kept`` by brute force: every partition of each run of
    consecutive ids into ubatches, each padded to its longest and priced by
    ``step_cost``; a ubatch of several sequences holds at most n_ubatch rows, and each of
    them room for the longest."""
    order = sorted(range(len(reqs)), key=lambda i: reqs[i].seq_id)
    ids = [reqs[i].seq_id for i in order]
    breaks = {k for k in range(1, len(ids)) if ids[k] != ids[k - 1] + 1}
    best = math.inf
    for part in _partitions(len(order), breaks):
        total = 0.0
        for g in part:
            members = [order[x] for x in g]
            longest = max(kept[i] for i in members)
            if len(members) > 1 and (longest * len(members) > n_ubatch
                                     or any(reqs[i].room < longest for i in members)):
                total = math.inf  # unequal rows, or too many: not one ubatch
                break
            total += step_cost(cost, [longest] * len(members), [kept[i] for i in members])
        best = min(best, total)
    return best


def _grouped_joint_reference(reqs: list[StepRows], cost, rate: float,
                             n_ubatch: int) -> list[int]:
    """The joint rule (best candidates first) with each plan priced by brute force."""
    if len(reqs) > 16:
        raise ValueError("the brute force is for steps the dynamic program plans")
    kept, cands = _reference_candidates(reqs)
    plain = _grouped_price_reference(reqs, kept, cost, n_ubatch)
    rate = max(rate, sum(kept) / plain)
    expected = float(len(reqs))
    best, best_kept = expected - rate * plain, list(kept)
    # candidates below what the cheapest row adds, at the profile's mean slope, are not
    # priced (the planner's bound on its own time)
    top = max(2, max(len(r.tokens) for r in reqs))
    floor = rate * (1 - PAD_ROW_WEIGHT) * (cost(top) - cost(1)) / (top - 1)
    for neg_p, j, i in cands:
        if kept[i] != j + 1:
            continue
        if -neg_p < floor:
            break
        kept[i] += 1
        expected -= neg_p
        v = expected - rate * _grouped_price_reference(reqs, kept, cost, n_ubatch)
        if v > best + 1e-9:
            best, best_kept = v, list(kept)
    return best_kept


@settings(max_examples=300, deadline=None)
@given(joint_requests, st.floats(0.2, 8.0), st.sampled_from([linear, cpu_like]),
       st.sampled_from([8, 16, 512]))
def test_grouped_joint_lengths_equal_the_brute_force_reference(spec, rate, cost,
                                                               n_ubatch) -> None:
    """A decode-only step's plan, each candidate priced under its cheapest ubatch layout
    (dynamic program, recomputed from the sequence that changed), equals the same rule
    priced by enumerating every layout."""
    reqs = []
    for seq, draft, room, kept, whole in spec:
        r = _decode(seq, draft, room=room)
        r.kept = min(len(r.tokens), kept)
        if whole:
            r.probs = None
        reqs.append(r)
    got = joint_lengths(reqs, cost, rate, grouped_ubatch=n_ubatch)
    want = _grouped_joint_reference(reqs, cost, rate, n_ubatch)
    # ties between plans of equal value may resolve either way: compare their values
    rate_ = max(rate, sum(1 if r.probs is not None else r.kept for r in reqs) /
                _grouped_price_reference(reqs, [1 if r.probs is not None else r.kept
                                                for r in reqs], cost, n_ubatch))

    def value(kept: list[int]) -> float:
        e = sum(1.0 + (sum(r.probs[: k - 1]) if r.probs is not None else 0.0)
                for r, k in zip(reqs, kept, strict=True))
        return e - rate_ * _grouped_price_reference(reqs, kept, cost, n_ubatch)

    assert value(got) == pytest.approx(value(want), abs=1e-9)


@settings(max_examples=300, deadline=None)
@given(joint_requests, st.floats(0.2, 8.0), st.sampled_from([linear, cpu_like]),
       st.sampled_from([16, 512]))
def test_a_decode_only_step_is_split_into_the_ubatches_it_was_priced_as(
        spec, rate, cost, n_ubatch) -> None:
    """llama.cpp's sequential split of the planned batch (its order as planned) gives the
    layout the plan priced: no decode spans two ubatches, and the ubatches' price is the
    cheapest layout's for the kept rows."""
    reqs = []
    for seq, draft, room, kept, whole in spec:
        r = _decode(seq, draft, room=room)
        r.kept = min(len(r.tokens), kept)
        if whole:
            r.probs = None
        reqs.append(r)
    plan = plan_step(reqs, 512, cost, rate, n_ubatch=n_ubatch)
    entries = [Entry(r.seq_id, r.rows, r.kept, r.pos0) for r in plan]
    ubatches = split_equal(entries, n_ubatch)
    for i in range(len(plan)):
        assert sum(i in u.members for u in ubatches) == 1, (plan, ubatches)
    if len(plan) > 1 and sum(r.rows for r in plan) <= 512:
        assert ubatch_cost(cost, plan, n_ubatch) == pytest.approx(
            _grouped_price_reference(plan, [r.kept for r in plan], cost, n_ubatch))


def test_a_sure_long_draft_takes_a_ubatch_of_its_own_instead_of_padding_its_neighbours() -> None:
    """Eight sequences, one with a sure 26-token copy (spider_dev at N = 8): the copy is
    verified whole in a ubatch of its own, and the seven others are not padded to it."""
    cost = linear
    reqs = [_decode(s, [0.05] * 4) for s in range(8)]
    reqs[5] = _decode(5, [0.99] * 26)
    for r in reqs:
        r.kept = len(r.tokens)
    plan = plan_step(reqs, 512, cost, 1.0)
    by_seq = {r.seq_id: r for r in plan}
    assert by_seq[5].kept == by_seq[5].rows == 27
    assert all(by_seq[s].rows == 1 for s in range(8) if s != 5)
    ubatches = split_equal([Entry(r.seq_id, r.rows, r.kept, r.pos0) for r in plan], 512)
    assert sorted(tuple(plan[i].seq_id for i in u.members) for u in ubatches) == \
        [(0, 1, 2, 3, 4), (5,), (6, 7)]
    # the old rule (every run of consecutive ids one ubatch) padded all eight to 27 rows
    # or cut the copy; the grouped plan costs less than either
    padded = step_cost(cost, [27] * 8, [1, 1, 1, 1, 1, 27, 1, 1])
    assert ubatch_cost(cost, plan, 512) < padded


def test_drafts_beside_a_prompt_chunk_keep_their_rows() -> None:
    """A prompt chunk amid the decodes' ids (swe_django, 4 agents: one agent's tool
    output while three decode): in id order the chunk's first row joined the decodes'
    ubatch at a depth of one, and every draft was cut to that row; after the decodes'
    ubatches it keeps them whole."""
    reqs = [_decode(0, [0.99] * 3), _decode(2, []), _decode(3, [0.99] * 4),
            StepRows(1, list(range(300)), 2000, 512, prompt=True)]
    plan = plan_step(reqs, 512, linear, 1.0)
    by_seq = {r.seq_id: r for r in plan}
    assert (by_seq[0].kept, by_seq[3].kept, by_seq[1].kept) == (4, 5, 300)
    entries = [Entry(r.seq_id, r.rows, r.outputs, r.pos0, r.prompt) for r in plan]
    ubatches = split_equal(entries, 512)
    for i, r in enumerate(plan):
        if not r.prompt:
            assert sum(i in u.members for u in ubatches) == 1


def test_past_the_grouped_limit_each_run_is_padded_to_one_ubatch_in_id_order() -> None:
    """More sequences than the dynamic program plans (its time grows with their square):
    the step keeps every run of consecutive ids one padded ubatch, by id."""
    from suffixd.daemon.generation.step_planner import GROUPED_MAX_SEQUENCES

    n = GROUPED_MAX_SEQUENCES + 4
    reqs = [_decode(s, [0.05] * 3) for s in range(n)]
    reqs[2] = _decode(2, [0.99] * 4)
    plan = plan_step(reqs, 512, linear, 1.0)
    assert [r.seq_id for r in plan] == list(range(n))
    assert len({r.rows for r in plan}) == 1
    assert len(split_equal([Entry(r.seq_id, r.rows, r.kept, r.pos0) for r in plan], 512)) == 1


def test_a_sure_draft_is_kept_and_a_hopeless_one_cut() -> None:
    sure, hopeless = _decode(0, [1.0] * 6), _decode(1, [0.01] * 6)
    for r in (sure, hopeless):
        r.kept = len(r.tokens)
    assert joint_lengths([sure, hopeless], linear, 2.0) == [7, 1]


def test_padding_costs_its_weight() -> None:
    # two sequences side by side, 1 and 5 verified rows: the first is padded to 5
    cost = step_cost(linear, [5, 5], [1, 5])
    assert abs(cost - (linear(6) + PAD_ROW_WEIGHT * (linear(10) - linear(6)))) < 1e-12


def test_prompts_fill_what_decoding_leaves_and_still_move_when_it_is_full() -> None:
    decodes = [StepRows(s, list(range(100)), 0, 512) for s in range(4)]
    prompt = StepRows(9, list(range(1000)), 0, 512, prompt=True)
    plan = plan_step([*decodes, prompt], 512, linear, 1.0)
    assert prompt in plan and prompt.kept >= 64
    assert sum(r.rows for r in plan) <= 512
    lone = StepRows(9, list(range(1000)), 0, 512, prompt=True)
    assert plan_step([lone], 512, linear, 1.0) == [lone] and lone.kept == 512


def test_prompts_are_served_first_come_first_served_by_when_they_began() -> None:
    # the older prompt's chunk came back after the newer one's, as each chunk re-queues
    newer = StepRows(1, list(range(1000)), 0, 512, prompt=True, since=20.0)
    older = StepRows(2, list(range(1000)), 0, 512, prompt=True, since=10.0)
    decode = StepRows(0, [5, 6], 0, 512)
    plan = plan_step([decode, newer, older], 512, linear, 1.0)
    assert older in plan and newer not in plan
    assert older.kept == 512 - decode.rows
    # with room left, the newer one takes the rest
    short = StepRows(2, list(range(100)), 0, 512, prompt=True, since=10.0)
    newer2 = StepRows(1, list(range(1000)), 0, 512, prompt=True, since=20.0)
    plan = plan_step([newer2, short], 512, linear, 1.0)
    assert [r.seq_id for r in plan] == [1, 2] and (short.kept, newer2.kept) == (100, 412)


class _FakeModel:
    """Records decodes; fails the test if a decode overlaps another or a reader."""

    def __init__(self) -> None:
        self.decoding = False
        self.readers = 0
        self.lock = threading.Lock()
        self.batches: list[list[int]] = []
        self.errors: list[str] = []

    def run(self, batch: list[StepRows]) -> None:
        with self.lock:
            if self.decoding or self.readers:
                self.errors.append("decode overlapped")
            self.decoding = True
        time.sleep(0.003)
        self.batches.append([r.seq_id for r in batch])
        with self.lock:
            self.decoding = False


def test_the_batcher_runs_every_active_sequence_in_one_decode_and_never_overlaps() -> None:
    model = _FakeModel()
    batcher = StepBatcher(model.run, 64, linear)
    n_threads, n_steps = 4, 30
    done = []
    excl_seen = []

    def gen(seq: int) -> None:
        batcher.join()
        try:
            for _ in range(n_steps):
                req = StepRows(seq, [1, 2, 3], 0, 64)
                with batcher.step(req):
                    with model.lock:
                        model.readers += 1
                        if model.decoding:
                            model.errors.append("read during a decode")
                    time.sleep(0.0005)
                    with model.lock:
                        model.readers -= 1
                    req.emitted = 1
            done.append(seq)
        finally:
            batcher.leave()

    def outsider() -> None:
        for _ in range(5):
            with batcher.exclusive():
                excl_seen.append(model.decoding or model.readers > 0)
            time.sleep(0.002)

    threads = [threading.Thread(target=gen, args=(s,)) for s in range(n_threads)]
    threads.append(threading.Thread(target=outsider))
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(done) == list(range(n_threads))
    assert not model.errors
    assert excl_seen == [False] * 5
    assert sum(len(b) for b in model.batches) == n_threads * n_steps
    assert all(len(set(b)) == len(b) for b in model.batches)
    # they shared steps: far fewer decodes than sequence-steps
    assert len(model.batches) < n_threads * n_steps * 0.6
    assert batcher.counters.max_sequences >= 2


def test_a_failed_decode_reaches_every_sequence_of_its_step_and_the_batcher_goes_on() -> None:
    calls = []

    def run(batch: list[StepRows]) -> None:
        calls.append(len(batch))
        if len(calls) == 1:
            raise RuntimeError("llama_decode failed")

    batcher = StepBatcher(run, 64, linear)
    req = StepRows(0, [1], 0, 64)
    try:
        with batcher.step(req):
            pass
        raise AssertionError("the error did not reach the sequence")
    except RuntimeError as exc:
        assert "llama_decode" in str(exc)
    with batcher.step(StepRows(0, [1], 0, 64)) as again:
        again.emitted = 1
    assert calls == [1, 1]


def test_a_lone_step_keeps_its_drafters_choice_and_a_shared_one_may_fill_padding() -> None:
    # offered 6 candidates, its drafter chose 2 of them (3 rows)
    lone = StepRows(0, list(range(7)), 100, 64, probs=[0.9] * 6, want=3)
    assert plan_step([lone], 64, cpu_like, 2.0) == [lone] and lone.kept == 3
    # beside a sure 6-token draft the step has 7 rows per sequence anyway: the short
    # draft's likely candidates take rows that would be padding
    sure = StepRows(1, list(range(7)), 100, 64, probs=[1.0] * 6, want=7)
    offered = StepRows(0, list(range(7)), 100, 64, probs=[0.9] * 6, want=3)
    plan = plan_step([offered, sure], 64, cpu_like, 2.0)
    assert sure.kept == 7 and offered.kept == 7 and offered.rows == 7
    batcher_counters = StepBatcher(lambda b: None, 64, cpu_like)
    with batcher_counters.step(StepRows(0, list(range(7)), 100, 64, probs=[0.9] * 6,
                                        want=3)) as r:
        r.emitted = 1
    assert batcher_counters.counters.extended_draft_tokens == 0  # a lone step: as chosen
    assert plan


def test_padding_asks_for_logits_where_the_rule_says_they_make_the_step_cheaper() -> None:
    # a lone step of 5 verified rows padded to 8: logits on all 8, or on its 5
    for rule, want in ((blocks_of_4, 8), (None, 5)):
        lone = StepRows(0, list(range(5)), 100, 64, probs=[0.9] * 4, want=5)
        plan = plan_step([lone], 64, cpu_like, 0.1, pad_to=lambda n, room: 3,
                         logit_rows=rule)
        assert plan == [lone] and (lone.kept, lone.rows, lone.outputs) == (5, 8, want)
    # two runs (ids 0-1 and 5): each its own ubatch, its own padding
    a = StepRows(0, list(range(4)), 100, 64, probs=[1.0] * 3)
    b = StepRows(1, list(range(2)), 100, 64, probs=[1.0])
    c = StepRows(5, list(range(3)), 100, 64, probs=[1.0] * 2)
    plan = plan_step([a, b, c], 64, linear, 0.1, logit_rows=blocks_of_4)
    plan.sort(key=lambda r: r.seq_id)
    assert [(r.kept, r.rows) for r in plan] == [(4, 4), (2, 4), (3, 3)]
    # run 0-1: 6 verified in 8 rows -> 8 with logits (b's padding); run 5: 3 stays 3
    assert [r.outputs for r in plan] == [4, 4, 3]
    # a rule asking more than the padding holds gets what there is
    plan = plan_step([a, b, c], 64, linear, 0.1, logit_rows=lambda n, rows: n + 5)
    plan.sort(key=lambda r: r.seq_id)
    assert [r.outputs for r in plan] == [4, 4, 3]


def test_the_measurement_waits_for_no_request_active_or_waiting() -> None:
    """A measurement batch takes the model only once no generation is active or waiting
    for a slot (StepBatcher.quiet_exclusive), and a stopping daemon ends the wait."""
    batcher = StepBatcher(lambda rows: None, 512, lambda n: float(n))
    with batcher.quiet_exclusive():  # nobody in: at once
        pass
    took = threading.Event()

    def measure() -> None:
        with batcher.quiet_exclusive():
            took.set()

    with batcher.request():  # arrived, waiting for a slot: not joined yet
        t = threading.Thread(target=measure)
        t.start()
        assert not took.wait(0.3)
        batcher.join()
        assert not took.wait(0.3)
        batcher.leave()
        assert not took.wait(0.3)  # still in (e.g. its slot's release)
    assert took.wait(30.0)
    t.join()
    stop = threading.Event()
    with batcher.request():
        threading.Timer(0.2, stop.set).start()
        with pytest.raises(Interrupted), batcher.quiet_exclusive(stop):
            pass


def test_a_stopped_batcher_refuses_every_later_step_and_still_lends_the_model() -> None:
    """stop() (the daemon stops): each generation ends at its next step with Stopping
    (UNAVAILABLE), and an exclusive hold (the model freed at the end) still gets the
    model."""
    decoded: list[int] = []
    batcher = StepBatcher(lambda rows: decoded.append(len(rows)), 64, linear)
    batcher.join()
    with batcher.step(StepRows(0, [1], 0, 64)) as req:
        batcher.stop()  # while a step is read: its sequence ends at the next one
        req.emitted = 1
    with pytest.raises(Stopping, match="the daemon is stopping"), \
            batcher.step(StepRows(0, [2], 1, 64)):
        pass
    batcher.leave()
    with batcher.exclusive():
        pass
    assert decoded == [1]
