"""`suffixd serve --draft-model`: the draft model's vocabulary is checked when the daemon starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from suffixd.daemon.model import embedded_model_path

# tests/conftest.py: every daemon here measures its costs (the tests are about that)
DAEMONS_MEASURE = True


def test_draft_model_with_the_targets_vocabulary_is_accepted(daemon_factory: Any) -> None:
    from tests.conftest import wait_costs_measured

    proc = daemon_factory(args=["--draft-model", str(embedded_model_path())])
    client = proc.client()
    assert client.info()["vocab_size"] > 0
    # The first generate loads the models and is served at once; the draft-model policy
    # starts once both models' costs are measured (meanwhile, on a thread of their own).
    for _ in client.generate(None, prompt="Once", max_tokens=1, namespace="load"):
        pass
    assert wait_costs_measured(client)["cost_profile_source"] == "measured"
    # a prompt with nothing in the trees: the draft-model policy decides, and says so
    for _ in client.generate(None, prompt="Once upon a time", max_tokens=8):
        pass
    client.close()
    out = subprocess.run(
        [sys.executable, "-m", "suffixd.cli.main", "stats", "--json", "--address", proc.socket],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)["generator"]["draft_model"]
    # every step without a tree draft was either drafted by the model or declined
    assert d["used"] + d["skipped"] >= 1 and d["planned_k"] >= 0
    assert d["draft_ms_per_token"] > 0 and "1" in d["verify_ms"]


def test_the_draft_model_drafts_before_any_cost_measurement(daemon_factory: Any) -> None:
    """A daemon whose verifier costs are never measured (SUFFIXD_COST_ROUNDS=0, as a busy
    daemon's measurement may not end for a long time) still drafts with the draft model
    from its first request, on provisional costs, and stats say so. Before, the draft
    model waited for the measurement: never used."""
    target = str(embedded_model_path())
    proc = daemon_factory(args=["--draft-model", target], env={"SUFFIXD_COST_ROUNDS": "0"})
    client = proc.client()
    # a prompt with nothing in the trees: each step is the draft model's to draft or not
    for _ in client.generate(None, prompt="Once upon a time", max_tokens=12):
        pass
    status = client.generator_status()
    assert status["cost_profile_source"] == "conservative", status
    client.close()
    out = subprocess.run(
        [sys.executable, "-m", "suffixd.cli.main", "stats", "--address", proc.socket],
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if "draft model" in x)
    assert target in line and "provisional costs" in line, out.stdout
    js = subprocess.run(
        [sys.executable, "-m", "suffixd.cli.main", "stats", "--json", "--address", proc.socket],
        capture_output=True, text=True, timeout=60)
    d = json.loads(js.stdout)["generator"]["draft_model"]
    # every step without a tree draft was the policy's to decide (here it declines: the
    # draft model is the target itself, as dear per token as a decode)
    assert d["costs"] == "provisional" and d["used"] + d["skipped"] >= 1, d
    assert d["draft_ms_per_token"] > 0 and d["verify_ms"]["2"] > d["verify_ms"]["1"], d


def test_unloadable_draft_model_is_refused_clearly(daemon_factory: Any, tmp_path: Path) -> None:
    bogus = tmp_path / "not-a-model.gguf"
    bogus.write_bytes(b"this is not a GGUF file")
    proc = daemon_factory(args=["--draft-model", str(bogus)], expect_ready=False)
    assert proc.wait(120) == 2
    log = proc.log()
    assert "--draft-model" in log and "not a GGUF model file" in log
    assert "Traceback" not in log
