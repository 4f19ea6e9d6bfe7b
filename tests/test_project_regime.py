"""bench/project_regime.py's projection (issue 48): the simulated draft model accepts as
its acceptance says, the draft model's cost counts, and the trees come first."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path
from types import ModuleType

from suffixcache.replay import Message, Session

ROOT = Path(__file__).resolve().parents[1]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("project_regime",
                                                  ROOT / "bench" / "project_regime.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["project_regime"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_simulated_draft_accepts_a_run_of_hits_at_its_rate() -> None:
    pr = _load()
    rng = random.Random(0)
    runs = [pr.SimulatedDraft(8, 0.7, rng).accepted_length(list(range(100)))
            for _ in range(20_000)]
    # P(run >= j) = 0.7^j: the mean of a run capped at 8 is sum_{j=1..8} 0.7^j
    expected = sum(0.7**j for j in range(1, 9))
    assert abs(sum(runs) / len(runs) - expected) < 0.05
    assert max(runs) == 8 and min(runs) == 0
    # never past the text that is left
    assert all(pr.SimulatedDraft(8, 1.0, rng).accepted_length([1, 2]) == 2 for _ in range(10))


def _sessions() -> list[Session]:
    # the same answer in every session: the trees draft it from the second one on
    answer = list(range(100, 160))
    return [Session(f"s{i}", [Message("user", [1], [2, 3, 4 + i]),
                              Message("assistant", [5], answer)]) for i in range(6)]


def test_projection_orders_and_costs_the_sources() -> None:
    pr = _load()
    # a perfect, free draft model: as good as it gets; the trees alone are not
    free = pr.project(_sessions(), pr.linear_profile(0.05), accept=1.0, draft_cost=0.0,
                      max_tokens=8, seed=0)
    assert free["model"]["model_k"] == 8
    assert free["model"]["speedup"] > 5
    assert free["trees+model"]["speedup"] >= free["trees"]["speedup"]
    # the trees first: where they draft, the draft model is not asked
    assert free["trees+model"]["model_steps"] < free["model"]["model_steps"]
    # a draft model as dear as the verifier never pays: the policy declines it (k = 0)
    dear = pr.project(_sessions(), pr.linear_profile(0.05), accept=0.7, draft_cost=1.0,
                      max_tokens=8, seed=0)
    assert dear["model"]["model_k"] == 0 and dear["model"]["speedup"] == 1.0
    assert dear["trees+model"]["speedup"] == dear["trees"]["speedup"]
