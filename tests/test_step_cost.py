"""The shared-step cost model (daemon/generation/step_cost.py): its ubatch split against
a transcription of llama.cpp's token loop and against llama.cpp itself, and its fit."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from suffixd.daemon.generation.step_cost import (
    FEATURES,
    Entry,
    StepCostModel,
    sorted_step_price,
    split_equal,
    step_features,
)


def linear(n: int) -> float:
    return 0.0 if n <= 0 else 1.0 + 0.3 * (n - 1)


def _reference_split(entries: list[Entry], n_ubatch: int) -> list[list[tuple[int, int]]]:
    """llama_batch_allocr::split_equal(n_ubatch, sequential=true) token by token: the
    ubatches as (sequence id, rows) lists."""
    seq = [e.seq_id for e in entries for _ in range(e.rows)]
    used = [False] * len(seq)
    out = []
    while True:
        cur: list[int] = []
        for i, s in enumerate(seq):
            if used[i] or s in cur:
                continue
            if cur and s != cur[-1] + 1:
                continue
            cur.append(s)
            if len(cur) > n_ubatch:
                break
        if not cur:
            return out
        rows_of = {s: [i for i, t in enumerate(seq) if t == s and not used[i]] for s in cur}
        depth = 0
        while all(depth < len(rows_of[s]) for s in cur):
            for s in cur:
                used[rows_of[s][depth]] = True
            depth += 1
            if (depth + 1) * len(cur) > n_ubatch:
                break
        out.append([(s, depth) for s in cur])


batches = st.lists(st.tuples(st.integers(0, 11), st.integers(1, 9)), min_size=1, max_size=9,
                   unique_by=lambda t: t[0])


@settings(max_examples=400, deadline=None)
@given(batches, st.booleans(), st.sampled_from([4, 16, 512]))
def test_the_split_is_llama_cpps_token_loop(spec, by_id, n_ubatch) -> None:
    if by_id:
        spec = sorted(spec)
    entries = [Entry(s, n, n, 100) for s, n in spec]
    got = [[(entries[i].seq_id, u.depth) for i in u.members]
           for u in split_equal(entries, n_ubatch)]
    assert got == _reference_split(entries, n_ubatch)
    assert sum(u.depth * len(u.members) for u in split_equal(entries, n_ubatch)) == \
        sum(n for _, n in spec)


_LLAMA_SPLIT = textwrap.dedent("""
    import ctypes, json, sys
    import llama_cpp
    from llama_cpp import _internals
    from suffixd.daemon.model import embedded_model_path
    lines = []
    @llama_cpp.llama_log_callback
    def on_log(level, text, user):
        lines.append(text.decode("utf-8", "replace"))
    llama_cpp.llama_log_set(on_log, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    model = _internals.LlamaModel(path_model=str(embedded_model_path()),
                                  params=llama_cpp.llama_model_default_params(), verbose=True)
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = 8 * 256, 64, 64, 8
    cp.n_threads = cp.n_threads_batch = 1
    cp.kv_unified, cp.swa_full = False, False
    ctx = _internals.LlamaContext(model=model, params=cp, verbose=True)
    batch = _internals.LlamaBatch(n_tokens=64, embd=0, n_seq_max=1, verbose=True)
    out = []
    for shape in json.loads(sys.argv[1]):
        b, n = batch.batch, 0
        for seq, rows in shape:
            for i in range(rows):
                b.token[n], b.pos[n], b.n_seq_id[n] = 100 + i, i, 1
                b.seq_id[n][0], b.logits[n] = seq, True
                n += 1
        b.n_tokens = n
        lines.clear()
        assert llama_cpp.llama_decode(ctx.ctx, b) == 0
        for seq, _ in shape:
            llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(ctx.ctx), seq, -1, -1)
        got, depth, split = [], None, False
        for line in lines:
            if "added ubatch to split" in line:  # not the input batch's own print
                split = True
            if split and "n_seq_tokens =" in line and "ubatch_print" in line:
                depth = int(line.split("=")[1])
            if "seq_id_unq =" in line and "ubatch_print" in line and depth is not None:
                ids = line.split("[")[1].split("]")[0].split()
                got.append([[int(s), depth] for s in ids])
                depth, split = None, False
        out.append(got)
    print(json.dumps(out))
""")


def test_the_split_is_the_one_llama_cpp_makes() -> None:
    """llama.cpp's own ubatches (LLAMA_BATCH_DEBUG) for the shapes the planner lays out."""
    shapes = [[(0, 4), (1, 1), (2, 1), (3, 1)], [(0, 4), (1, 1), (2, 4), (3, 1)],
              [(0, 2), (1, 2), (2, 1), (3, 1), (4, 1)], [(0, 1), (1, 1), (2, 9), (3, 1)],
              [(1, 3), (2, 3), (4, 3), (5, 1)], [(0, 1)]]
    proc = subprocess.run([sys.executable, "-c", _LLAMA_SPLIT, json.dumps(shapes)],
                          capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "LLAMA_BATCH_DEBUG": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    want = [[[[entries[i].seq_id, u.depth] for i in u.members]
             for u in split_equal(entries, 64)]
            for entries in ([Entry(s, n, n, 0) for s, n in shape] for shape in shapes)]
    assert got == want


def _random_step(rng: np.random.Generator) -> list[Entry]:
    n = int(rng.integers(1, 9))
    ids = sorted(rng.choice(12, size=n, replace=False).tolist())
    out = []
    for s in ids:
        if rng.random() < 0.15:
            out.append(Entry(s, int(rng.integers(4, 300)), 0, int(rng.integers(0, 3000)),
                             prompt=True))
        else:
            kept = int(rng.integers(1, 9))
            out.append(Entry(s, kept + int(rng.integers(0, 4)), kept,
                             int(rng.integers(100, 5000))))
    return out


def test_the_model_learns_the_prices_of_the_steps_it_serves() -> None:
    """Fed steps whose seconds follow other coefficients than its prior, the fit finds
    them, and then prices unseen shapes within a few percent."""
    rng = np.random.default_rng(3)
    true = np.array([0.010, 0.007, 0.004, 0.0005, 0.020, 0.09])
    model = StepCostModel(linear, 512, unit_seconds=0.012)
    for _ in range(600):
        step = _random_step(rng)
        model.observe(step, float(step_features(step, 512, linear) @ true))
    assert model.observed == 600
    assert np.allclose(model.theta, true, rtol=0.05, atol=2e-4), model.theta
    for _ in range(50):
        step = _random_step(rng)
        want = float(step_features(step, 512, linear) @ true)
        assert abs(model.seconds(step) - want) <= 0.03 * want
    d = model.as_dict()
    assert set(d["seconds"]) == set(FEATURES) and d["units"]["rows"] == 1.0


def test_the_prior_prices_the_measured_shapes_in_their_order() -> None:
    """Before any step is served the prior orders the EPYC measurements right: a long
    draft beside plain sequences is cheaper unpadded, three spread ones padded."""
    model = StepCostModel(linear, 512, unit_seconds=0.011)

    def price(rows: list[int], kept: list[int] | None = None) -> float:
        kept = kept or rows
        return model.price([Entry(i, r, k, 1500)
                            for i, (r, k) in enumerate(zip(rows, kept, strict=True))])

    one = [1] * 8
    assert price(one) < price([2] * 8) < price([4] * 8)
    spread = [4, 1, 1, 4, 1, 1, 4, 1]
    assert price([4] * 8, spread) < price(spread)
    lone = [4, 1, 1, 1, 1, 1, 1, 1]
    assert price(lone) < price([4] * 8, lone)


def test_a_new_profile_starts_the_fit_again_at_its_scale() -> None:
    model = StepCostModel(linear, 512, unit_seconds=0.012)
    step = [Entry(0, 1, 1, 100)]
    for _ in range(50):
        model.observe(step, 0.5)
    model.rescale(0.002)
    assert model.observed == 0 and abs(model.theta[0] - 0.002) < 1e-12


@settings(max_examples=300, deadline=None)
@given(batches, st.lists(st.floats(0.0, 0.05), min_size=5, max_size=5))
def test_the_planners_written_out_price_is_the_models(spec, coefs) -> None:
    """``sorted_step_price`` (the planner's inner loop) prices decoding rows as the
    features do."""
    spec = sorted(spec)
    entries = [Entry(s, n + n % 3, n, 50 * s) for s, n in spec]
    theta = [0.01, *coefs]  # rows, padding, sequences, attention, ubatches, prompt rows
    want = float(step_features(entries, 512, linear) @ np.array(theta))
    got = sorted_step_price(theta, [e.seq_id for e in entries], [e.rows for e in entries],
                            [e.outputs for e in entries],
                            [e.pos0 + e.rows for e in entries], 512, linear)
    assert abs(got - want) <= 1e-9 * max(1.0, want)
