"""The scripts that read a daemon's step log (issue 45): bench/perfect_draft_oracle.py's
ceiling (prompt rows priced at the run's own prompt-only steps, every emitted token at the
profile's cheapest shape per row) and bench/step_log_summary.py's pricing of mixed steps."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "perfect_draft_oracle.py"


def _load(name: str = "perfect_draft_oracle") -> ModuleType:
    sys.path.insert(0, str(SCRIPT.parent))  # the oracle imports step_log_summary beside it
    try:
        spec = importlib.util.spec_from_file_location(name, SCRIPT.parent / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return module


def _step(t: float, s: float, *seqs: list[int]) -> dict[str, object]:
    # a row of "seqs": [seq_id, prompt, tokens, want, kept, rows, emitted, pos0]
    return {"t": t, "s": s, "read": 0.0, "gap": 0.0, "seqs": [list(x) for x in seqs]}


COSTS = {"raw": {"1": 0.010, "2": 0.016, "4": 0.024, "8": 0.048}}  # 4 rows: 6 ms a row


def test_prompts_at_their_measured_rate_tokens_at_the_cheapest_shape() -> None:
    oracle = _load()
    run = [
        _step(0.0, 1.0, [0, 1, 500, 0, 500, 500, 0, 0]),  # 500 rows in 1 s: 2 ms a row
        _step(1.1, 0.2, [0, 0, 5, 0, 5, 5, 3, 500]),
        _step(1.4, 0.5, [0, 1, 100, 0, 100, 100, 0, 0], [1, 0, 2, 0, 2, 2, 2, 600]),
    ]
    out = oracle.ceiling(run, COSTS)
    assert out["best_rows"] == 4 and out["best_s_per_token"] == pytest.approx(0.006)
    assert out["prompt_rows"] == 600  # the mixed step's prompt rows at the same rate
    assert out["prompts_s"] == pytest.approx(1.2)
    assert out["emitted"] == 5
    assert out["wall_floor_s"] == pytest.approx(1.2 + 5 * 0.006)
    assert out["wall_s"] == pytest.approx(1.4 + 1.0)


def test_a_log_is_cut_into_daemons_by_pauses() -> None:
    summary = _load("step_log_summary")
    recs = [_step(t, 0.1, [0, 0, 1, 0, 1, 1, 1, 0]) for t in (0.0, 0.5, 10.0, 10.2)]
    assert [len(r) for r in summary.split(recs, 2.5)] == [2, 2]


def test_a_file_that_is_not_a_step_log_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "workload.jsonl"
    f.write_text(json.dumps({"session": "x", "messages": []}) + "\n")
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"costs": COSTS}))
    r = subprocess.run([sys.executable, str(SCRIPT), str(f), "--profile", str(profile)],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "not a step log" in r.stderr
    assert "Traceback" not in r.stderr


def test_mixed_steps_priced_as_their_parts_in_separate_steps() -> None:
    summary = _load("step_log_summary")

    def prompt_s(rows: int, pos: int) -> float:
        return 0.003 * rows + 0.0002 * rows * (pos + rows / 2) / 1000 + 0.01

    def decode_s(seqs: list[tuple[int, int]]) -> float:
        return 0.05 + 0.004 * sum(r for r, _ in seqs) + 0.002 * len(seqs) + \
            0.0001 * sum(r * p for r, p in seqs) / 1000

    log, t = [], 0.0
    for i in range(6):
        t += 1
        log.append(_step(t, prompt_s(100 + 50 * i, 300 * i), [0, 1, 9, 0, 9, 100 + 50 * i, 0,
                                                                300 * i]))
    for i in range(8):
        seqs = [(1 + i % 3, 500 + 100 * i), (2, 900 + 40 * i)][: 1 + i % 2]
        t += 1
        log.append(_step(t, decode_s(seqs), *[[j, 0, 9, 0, r, r, r, p]
                                              for j, (r, p) in enumerate(seqs)]))
    mixed = prompt_s(200, 1000) + decode_s([(3, 700)]) + 0.5  # half a second dearer
    log.append(_step(t + 1, mixed, [0, 1, 9, 0, 200, 200, 0, 1000], [1, 0, 9, 0, 3, 3, 3, 700]))
    out = summary.price_mixed(log, log)
    assert out is not None and out["mixed_steps"] == 1
    assert out["took_s"] - out["separately_s"] == pytest.approx(0.5, abs=1e-6)


def test_hindsight_prices_only_the_rejected_rows_under_the_runs_own_fit() -> None:
    oracle = _load()

    def decode_s(seqs: list[tuple[int, int]]) -> float:  # (rows, position) a sequence
        return 0.02 + 0.005 * sum(r for r, _ in seqs) + 0.003 * len(seqs) + \
            0.0002 * sum(r * p for r, p in seqs) / 1000

    log, t, rejected, saved = [], 0.0, 0, 0.0
    for i in range(10):
        seqs = [(1 + i % 4, 400 + 50 * i), (1 + (i + 1) % 3, 800 + 30 * i)][: 1 + i % 2]
        # (rows, position, emitted): up to 2 rows of a draft rejected
        rows = [(r, p, max(1, r - i % 3)) for r, p in seqs]
        t += 1
        log.append(_step(t, decode_s(seqs), *[[j, 0, 9, 0, r, r, e, p]
                                              for j, (r, p, e) in enumerate(rows)]))
        rejected += sum(r - e for r, _, e in rows)
        saved += decode_s(seqs) - decode_s([(e, p) for _, p, e in rows])
    log.append(_step(t + 1, 0.7, [0, 1, 9, 0, 300, 300, 0, 2000]))  # a prompt: not touched
    out = oracle.hindsight(log)
    assert out is not None and out["rejected_rows"] == rejected > 0
    assert out["fit_s_per_row"] == pytest.approx(0.005)
    assert out["rejected_rows_s"] == pytest.approx(saved)
    wall = log[-1]["t"] - log[0]["t"] + log[0]["s"]  # as ceiling() counts it
    assert out["hindsight_wall_s"] == pytest.approx(wall - saved)


def test_hindsight_needs_decode_steps_to_fit() -> None:
    oracle = _load()
    assert oracle.hindsight([_step(0.0, 1.0, [0, 1, 9, 0, 500, 500, 0, 0])]) is None
