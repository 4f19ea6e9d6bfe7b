"""Deterministic mode's step plan (daemon/generation/step_planner.py, ``no_single_rows``),
without a model: whatever the step holds, no ubatch of llama.cpp's split takes a single
row of a sequence (ggml-cpu multiplies one row by other kernels than two or more), and
the plan's other rules still hold."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from suffixd.daemon.generation.step_cost import Entry, split_equal
from suffixd.daemon.generation.step_planner import StepRows, plan_step


def cpu_like(n: int) -> float:
    table = {1: 1.0, 2: 1.3, 3: 1.7, 4: 1.8, 5: 2.6, 6: 2.6, 7: 2.7, 8: 2.7}
    return 0.0 if n <= 0 else table.get(n, 2.7 + 0.3 * (n - 8))


steps = st.lists(
    # (sequence id, draft length, room, prompt tokens (0: a decode))
    st.tuples(st.integers(0, 7), st.integers(0, 6), st.integers(1, 40),
              st.sampled_from([0, 0, 1, 2, 3, 5, 9, 40, 200])),
    min_size=1, max_size=6, unique_by=lambda t: t[0],
)


def _build(spec: list[tuple[int, int, int, int]]) -> list[StepRows]:
    out = []
    for seq, draft, room, prompt in spec:
        if prompt:
            out.append(StepRows(seq, list(range(prompt)), 0, 512, prompt=True))
        else:
            probs = [0.9 ** (i + 1) for i in range(draft)]
            out.append(StepRows(seq, list(range(1 + draft)), 100, room, probs=probs))
    return out


@settings(max_examples=400, deadline=None)
@given(steps, st.sampled_from([8, 16, 64, 512]), st.sampled_from([None, 4, 8]),
       st.floats(0.5, 6.0))
def test_no_ubatch_takes_a_single_row(spec, n_batch, n_ubatch, rate) -> None:
    pending = _build(spec)
    plan = plan_step(pending, n_batch, cpu_like, rate, n_ubatch=n_ubatch,
                     no_single_rows=True)
    assert plan, "a step is never empty"
    assert sum(r.rows for r in plan) <= n_batch
    ub = n_ubatch or n_batch
    entries = [Entry(r.seq_id, r.rows, r.outputs, r.pos0, r.prompt) for r in plan]
    spans: dict[int, int] = {}
    for u in split_equal(entries, ub):
        assert u.depth >= 2, ([(r.seq_id, r.kept, r.rows, r.prompt) for r in plan], u)
        for i in u.members:
            spans[i] = spans.get(i, 0) + 1
    for i, r in enumerate(plan):
        assert 1 <= r.kept <= r.rows
        assert r.kept <= len(r.tokens)
        if not r.prompt:
            assert spans[i] == 1, "a decode stays in one ubatch"
            assert r.outputs >= r.kept
        # the padding row past a sequence's room is the one cell deterministic mode keeps
        assert r.rows <= max(r.room, 2)
    offsets = [r.offset for r in plan]
    assert offsets == [sum(r.rows for r in plan[:i]) for i in range(len(plan))]


def test_a_lone_plain_step_and_a_one_token_prompt_chunk_get_a_padding_row() -> None:
    plain = StepRows(0, [5], 100, 64)
    assert plan_step([plain], 512, cpu_like, 1.0, no_single_rows=True) == [plain]
    assert (plain.kept, plain.rows, plain.outputs) == (1, 2, 1)
    chunk = StepRows(1, [7], 10, 512, prompt=True)
    assert plan_step([chunk], 512, cpu_like, 1.0, no_single_rows=True) == [chunk]
    assert (chunk.kept, chunk.rows, chunk.outputs) == (1, 2, 0)
    # without the mode, both stay a single row
    plain, chunk = StepRows(0, [5], 100, 64), StepRows(1, [7], 10, 512, prompt=True)
    plan_step([plain], 512, cpu_like, 1.0)
    plan_step([chunk], 512, cpu_like, 1.0)
    assert plain.rows == chunk.rows == 1


def test_a_prompt_chunk_left_one_row_after_the_decodes_ubatch_is_evened_out() -> None:
    # decode of 3 rows (seq 0) and a 4-token prompt chunk (seq 1): split_equal would take
    # 3 + 3 and leave the chunk's last row alone in a ubatch of its own
    decode = StepRows(0, [1, 2, 3], 100, 64, probs=[0.99, 0.98])
    chunk = StepRows(1, [7, 8, 9, 10], 10, 512, prompt=True)
    plan = plan_step([decode, chunk], 512, cpu_like, 0.5, no_single_rows=True)
    entries = [Entry(r.seq_id, r.rows, r.outputs, r.pos0, r.prompt) for r in plan]
    assert all(u.depth >= 2 for u in split_equal(entries, 512)), \
        [(r.seq_id, r.kept, r.rows) for r in plan]
