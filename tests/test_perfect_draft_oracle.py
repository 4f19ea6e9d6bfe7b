"""bench/perfect_draft_oracle.py's ceiling (issue 45): prompt rows priced at the run's own
prompt-only steps, every emitted token at the profile's cheapest shape per row."""

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


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("perfect_draft_oracle", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
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
    oracle = _load()
    recs = [_step(t, 0.1, [0, 0, 1, 0, 1, 1, 1, 0]) for t in (0.0, 0.5, 10.0, 10.2)]
    assert [len(r) for r in oracle.runs(recs, 2.5)] == [2, 2]


def test_a_file_that_is_not_a_step_log_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "workload.jsonl"
    f.write_text(json.dumps({"session": "x", "messages": []}) + "\n")
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"costs": COSTS}))
    r = subprocess.run([sys.executable, str(SCRIPT), str(f), "--profile", str(profile)],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "not a step log" in r.stderr
    assert "Traceback" not in r.stderr
