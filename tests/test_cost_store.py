"""The stored cost profile (daemon/generation/cost_store.py): its key, atomic owner-only
writes, and files that must be ignored (another key, corrupt); the verifier's state
restored from it; the measurement's way of giving generations the model first."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from suffixd.daemon.generation.cost_measure import CostMeasurement, plan_batch_shapes
from suffixd.daemon.generation.cost_store import ProfileStore, StoredCosts, profile_key

COSTS = StoredCosts(raw={1: 0.020, 2: 0.024, 3: 0.031, 4: 0.027, 5: 0.040, 8: 0.036},
                    padded={(3, 4): 0.026, (5, 8): 0.035}, draft_seconds_per_token=0.004)


def key(model: Path, **over: Any) -> dict[str, Any]:
    kw: dict[str, Any] = dict(n_threads=2, n_batch=512, n_ctx=8192, n_slots=4, n_gpu_layers=0,
                              extra_buffers=False, rounds=5)
    kw.update(over)
    return profile_key(model, **kw)


@pytest.fixture
def model(tmp_path: Path) -> Path:
    m = tmp_path / "m.gguf"
    m.write_bytes(b"GGUF" + bytes(100))
    return m


def test_the_key_names_what_the_costs_depend_on(model: Path) -> None:
    k = key(model)
    assert k == key(model)  # the same settings, the same key
    assert k["model"]["path"] == str(model.resolve()) and k["model"]["size"] == 104
    assert k["cpu"] and k["cpu_count"] >= 1 and k["cores_allowed"] >= 1 and "cpu_flags" in k
    assert k["llama_cpp_python"] and k["draft_model"] is None
    for change in ({"n_threads": 4}, {"n_batch": 256}, {"n_ctx": 512}, {"n_slots": 8},
                   {"n_gpu_layers": 99}, {"extra_buffers": True}, {"rounds": 1},
                   {"draft_model": model}):
        assert key(model, **change) != k, change
    with pytest.MonkeyPatch.context() as mp:  # OpenMP's wait policy: another key
        mp.setenv("OMP_WAIT_POLICY", "passive")
        assert key(model) != k and key(model)["omp_wait_policy"] == "PASSIVE"
    # the same path holding another file (re-downloaded, replaced): another key
    st = model.stat()
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert key(model) != k


def test_saved_atomically_owner_only_and_loaded_back(model: Path, tmp_path: Path) -> None:
    path = tmp_path / "cost_profile.json"
    # a temporary file left by a crash, readable by others: the new file is not
    leftover = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    leftover.write_text("junk")
    leftover.chmod(0o644)
    store = ProfileStore(path, key(model))
    assert store.load() == (None, "none stored")
    store.save(COSTS)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir() if p.name != "m.gguf"] == [path.name]
    got, why = ProfileStore(path, key(model)).load()
    assert why == "stored" and got == COSTS
    assert json.loads(path.read_text())["key"]["n_threads"] == 2


def test_another_key_is_not_reused_and_says_what_differs(model: Path, tmp_path: Path) -> None:
    path = tmp_path / "cost_profile.json"
    ProfileStore(path, key(model)).save(COSTS)
    got, why = ProfileStore(path, key(model, n_threads=4)).load()
    assert got is None and "other settings" in why and "n_threads 2 -> 4" in why


@pytest.mark.parametrize("text", [
    "", "{not json", "[]", '{"key": 1}',
    None,  # the right key, costs that are no measurement (filled in below)
])
def test_a_corrupt_file_is_ignored(model: Path, tmp_path: Path, text: str | None) -> None:
    path = tmp_path / "cost_profile.json"
    store = ProfileStore(path, key(model))
    if text is None:
        store.save(COSTS)
        data = json.loads(path.read_text())
        bad = [{**data["costs"], "raw": {"1": -1.0}},
               {**data["costs"], "raw": {"2": 0.1}},  # no one-token cost
               {**data["costs"], "padded": [[4, 3, 0.1]]},
               {**data["costs"], "raw": {"1": "fast"}},
               {k: v for k, v in data["costs"].items() if k != "padded"}]
        for costs in bad:
            path.write_text(json.dumps({**data, "costs": costs}))
            got, why = store.load()
            assert got is None and why.startswith("corrupt"), costs
        return
    path.write_text(text)
    got, why = store.load()
    assert got is None and (why.startswith("corrupt") or "other settings" in why)


def test_restored_costs_plan_the_padding_as_measured_ones() -> None:
    host = CostMeasurement()
    host._init_costs()
    profile = host.restore_costs(COSTS.raw, COSTS.padded)
    pad_to, cost = plan_batch_shapes(COSTS.raw, COSTS.padded)
    assert host.batch_padding == pad_to and host.cost_seconds == cost
    assert host.raw_cost_seconds == COSTS.raw and host.padded_cost_seconds == COSTS.padded
    assert profile[1] == 1.0 and profile[5] == round(cost[5] / cost[1], 3)
    assert host._padding(5, 64) == pad_to.get(5, 5) - 5
