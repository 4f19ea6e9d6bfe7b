"""The statistics bench/trace_replay.py reports the oracle's gap with: the isotonic refit
and the AUC, against brute-force references."""

from __future__ import annotations

import importlib.util
from itertools import product
from pathlib import Path
from types import ModuleType

from hypothesis import given
from hypothesis import strategies as st


def _load() -> ModuleType:
    path = Path(__file__).resolve().parent.parent / "bench" / "trace_replay.py"
    spec = importlib.util.spec_from_file_location("trace_replay", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tr = _load()
pairs_st = st.lists(
    st.tuples(st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.7, 0.9, 1.0]), st.booleans()),
    min_size=1,
    max_size=7,
)


def _sse(fit: dict[float, float], pairs: list[tuple[float, bool]]) -> float:
    return sum((fit[e] - h) ** 2 for e, h in pairs)


@given(pairs_st)
def test_isotonic_is_the_least_squares_monotone_fit(pairs: list[tuple[float, bool]]) -> None:
    fit = tr._isotonic(pairs)
    levels = sorted({e for e, _ in pairs})
    got = {e: fit(e) for e in levels}
    assert all(got[a] <= got[b] + 1e-12 for a, b in zip(levels, levels[1:], strict=False))
    # brute force over monotone fits whose values are means of the hits (PAV's values are
    # means of blocks of levels; a grid of candidate values covers them)
    grid = sorted({i / j for j in range(1, len(pairs) + 1) for i in range(j + 1)})
    best = min(
        _sse(dict(zip(levels, vals, strict=True)), pairs)
        for vals in product(grid, repeat=len(levels))
        if all(a <= b for a, b in zip(vals, vals[1:], strict=False))
    ) if len(levels) <= 3 else None
    if best is not None:
        assert abs(_sse(got, pairs) - best) < 1e-9


@given(pairs_st)
def test_auc_counts_pairs_ranked_right(pairs: list[tuple[float, bool]]) -> None:
    pos = [e for e, h in pairs if h]
    neg = [e for e, h in pairs if not h]
    if not pos or not neg:
        assert tr._auc(pairs) == 0.5
        return
    want = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))
    assert abs(tr._auc(pairs) - want) < 1e-12
