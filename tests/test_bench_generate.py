"""`suffixd bench generate` end to end on the real embedded model (a few short turns)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from suffixd.cli.main import main

TIER = "model"  # tests/conftest.py: the benchmarks run the model in-process

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


FIXTURES = Path(__file__).resolve().parent / "fixtures"


def test_bench_agent_replays_every_turn_of_whole_sessions() -> None:
    """Two short sessions (tests/fixtures/agent_sessions.jsonl), every turn, the recorded
    history resent each turn: the later turns of a session reuse its KV cache."""
    result = CliRunner().invoke(
        main,
        ["bench", "agent", str(FIXTURES / "agent_sessions.jsonl"), "--max-tokens", "4",
         "--n-ctx", "2048", "--sessions", "2", "--json"],
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.output.strip().splitlines()[-1])
    assert out["sessions"] == 2 and out["turns"] == 5 and out["skipped_turns"] == 0
    assert out["n_ctx"] == 2048
    for m in ("plain", "suffixd"):
        assert out[f"{m}_session_wall_s"] > 0 and out[f"{m}_turn_p95_s"] > 0
        # every turn resends the whole conversation; only its new part is evaluated
        assert 0 < out[f"{m}_prompt_tokens_evaluated"] < out[f"{m}_prompt_tokens_total"]
    assert sum(out["verdicts"]["suffixd"].values()) == 5


def test_bench_agent_counts_turns_that_do_not_fit() -> None:
    result = CliRunner().invoke(
        main,
        ["bench", "agent", str(FIXTURES / "agent_sessions.jsonl"), "--max-tokens", "4",
         "--n-ctx", "256", "--modes", "plain", "--json"],
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.output.strip().splitlines()[-1])
    # the last session's second turn holds a long tool output: it is counted, not dropped
    assert out["sessions"] == 3 and out["turns"] == 6 and out["skipped_turns"] == 1
    assert [u["session"] for u in out["unfit_turns"]] == ["long-tool-output"]
    assert out["unfit_turns"][0]["prompt_tokens"] + 4 + 64 > out["n_ctx"]
