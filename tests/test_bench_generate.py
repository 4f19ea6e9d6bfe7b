"""`suffixd bench generate` end to end on the real embedded model (a few short turns)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from suffixd.cli.main import main

WORKLOAD = Path(__file__).resolve().parents[1] / "examples" / "workloads" / "sql_agent.jsonl"


def test_bench_generate_json_reports_all_modes() -> None:
    result = CliRunner().invoke(
        main,
        ["bench", "generate", str(WORKLOAD), "--turns", "3",
         "--max-tokens", "12", "--json"],
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.output.strip().splitlines()[-1])
    for key in ("plain_tok_s", "suffixd_tok_s", "pld_tok_s", "speedup_vs_plain",
                "speedup_vs_pld", "identical_turns", "near_tie_turns", "identical_outputs"):
        assert key in out, key
    assert out["turns"] == 3 and out["plain_tokens"] > 0 and out["plain_tok_s"] > 0
    v = out["verdicts"]["suffixd"]
    assert sum(v.values()) == 3  # each turn gets one verdict (losslessness: test_verifier)
    assert out["identical_turns"] == v["identical"] and out["near_tie_turns"] == v["near_tie"]
    # the measured profile covers every batch size a 32-token draft needs, after padding
    prof = {int(k): c for k, c in out["cost_profile"].items()}
    assert set(prof) == set(range(1, 34)) and prof[1] == 1.0
    assert all(prof[k] <= out["raw_cost_profile"][str(k)] + 1e-9 for k in prof)


def test_bench_generate_rejects_bad_modes() -> None:
    result = CliRunner().invoke(
        main, ["bench", "generate", str(WORKLOAD), "--modes", "suffixd"]
    )
    assert result.exit_code != 0 and "including plain" in result.output
