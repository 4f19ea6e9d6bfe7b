"""`suffixd bench replay` end to end on the example text-to-SQL workload (real tokenizer)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from suffixcache import CostProfile, DraftConfig
from suffixcache.replay import Message, Session, SuffixSource, replay

SQL_AGENT = Path(__file__).resolve().parents[1] / "examples" / "workloads" / "sql_agent.jsonl"


def _msg(role: str, content: list[int]) -> Message:
    return Message(role, [1000, len(role)], content)


def test_replay_protocol_counts_steps_and_costs() -> None:
    # A response that repeats the prompt exactly is drafted from the session tree.
    prompt = list(range(10, 40))
    session = Session("s", [_msg("user", prompt), _msg("assistant", prompt)])
    res = replay(
        [session],
        SuffixSource(CostProfile.flat(), DraftConfig(calibrate=False)),
        CostProfile.flat(),
    )
    fig = res.figures()
    assert fig["out_tokens"] == 30
    assert fig["steps"] < 30
    assert fig["tokens_per_step"] == pytest.approx(30 / fig["steps"])
    assert fig["cpu_model_speedup"] == pytest.approx(
        fig["tokens_per_step"]
    )  # flat: cost 1 per step


def test_replay_without_reuse_is_plain_decoding() -> None:
    session = Session("s", [_msg("user", [1, 2, 3]), _msg("assistant", list(range(50, 80)))])
    res = replay([session], SuffixSource(CostProfile.cpu_default()), CostProfile.cpu_default())
    assert res.steps == 30 and res.proposed == 0
    assert res.figures()["cpu_model_speedup"] == pytest.approx(1.0)


def test_bench_replay_cli_json_side_by_side(tmp_path: Path) -> None:
    small = tmp_path / "spider3.jsonl"
    small.write_text("".join(SQL_AGENT.read_text(encoding="utf-8").splitlines(keepends=True)[:3]))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "suffixd.cli.main",
            "bench",
            "replay",
            str(small),
            "--source",
            "suffixd",
            "--source",
            "pld",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    data = json.loads(out.stdout)
    suffixd, pld = data["sources"]["suffixd"], data["sources"]["pld"]
    for fig in (
        "tokens_per_step",
        "cpu_model_speedup",
        "accept_rate",
        "spec_us_per_call",
        "update_us_per_token",
        "out_tokens",
        "steps",
    ):
        assert fig in suffixd and fig in pld
    assert suffixd["out_tokens"] == pld["out_tokens"] > 0
    # suffix drafts beat prompt lookup on this workload in cost-aware speed-up
    assert suffixd["cpu_model_speedup"] > pld["cpu_model_speedup"]
    assert suffixd["cpu_model_speedup"] > 1.0


def test_bench_replay_rejects_bad_input(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json}\n")
    out = subprocess.run(
        [sys.executable, "-m", "suffixd.cli.main", "bench", "replay", str(bad)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode != 0
    assert "not a workload session" in out.stderr
    assert "Traceback" not in out.stderr
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "suffixd.cli.main",
            "bench",
            "replay",
            str(bad),
            "--cost-profile",
            "{oops",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode != 0 and "Traceback" not in out.stderr


def test_bench_tree_cli_reports_native_figures() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "suffixd.cli.main",
            "bench",
            "tree",
            str(SQL_AGENT),
            "--sessions",
            "2",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    data = json.loads(out.stdout)
    assert data["tokens"] > 0 and data["sequences"] > 0
    assert 1.0 <= data["nodes_per_token"] <= 2.5  # path compression: O(1) nodes per token
    assert data["insert_us_per_token"] > 0 and data["speculate_us_per_call"] > 0
