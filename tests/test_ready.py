"""Ready at once, honestly (issue 26): a real daemon on the embedded model and a real data
dir. The verifier's measured costs are stored in the data dir and reused at the next
start; until a generation can be served, HTTP /health answers 503 and gRPC health says
the Generator is NOT_SERVING; a stored file made under other settings, or corrupt, is
ignored and measured again."""

from __future__ import annotations

import json
import re
import shutil
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import DaemonProcess, wait_costs_measured

# tests/conftest.py: every daemon here measures its costs (the tests are about that)
DAEMONS_MEASURE = True
# the profile's sizes 1-8 are all these tests read (a third of the measurement's time)
DAEMONS_MEASURE_SIZES = 8

# One round of the cost measurement (a quicker, noisier profile, stored under its own key).
ENV = {"SUFFIXD_COST_ROUNDS": "1"}
LOADING = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}


def start(data_dir: Path, *args: str) -> DaemonProcess:
    logs = len(list(data_dir.parent.glob(f"{data_dir.name}-*.log")))
    return DaemonProcess(data_dir, ["--http", "127.0.0.1:0", *args], env=ENV,
                         log_path=data_dir.parent / f"{data_dir.name}-{logs}.log").start()


def poll_health(proc: DaemonProcess, timeout: float = 300.0) -> list[tuple[int, Any]]:
    """/health from right after the daemon announced itself until it answers 200: every
    distinct answer, in order."""
    assert proc.http
    url = proc.http.removesuffix("/v1") + "/health"
    seen: list[tuple[int, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = httpx.get(url, timeout=30)
        if not seen or seen[-1] != (r.status_code, r.json()):
            seen.append((r.status_code, r.json()))
        if r.status_code == 200:
            return seen
        time.sleep(0.02)
    raise AssertionError(f"/health never answered 200: {seen}\n{proc.log()}")


def ready_line(proc: DaemonProcess) -> dict[str, str]:
    lines = [ln for ln in proc.log().splitlines() if '"generation ready"' in ln]
    assert len(lines) == 1, proc.log()
    return dict(re.findall(r"(\w+)=(\S+)", lines[0]))


def complete(proc: DaemonProcess, max_tokens: int = 2) -> str:
    r = httpx.post(f"{proc.http}/completions", timeout=600, json={
        "model": "default", "prompt": "SELECT name FROM singer", "max_tokens": max_tokens})
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["text"])


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A data dir whose first start measured the costs in the background and stored them;
    a generation is served meanwhile."""
    data = tmp_path_factory.mktemp("ready") / "data"
    proc = start(data, "--model-load", "startup")
    try:
        seen = poll_health(proc)
        assert all(body == LOADING for status, body in seen if status == 503), seen
        assert seen[-1] == (200, {"status": "ok"})
        assert ready_line(proc)["cost_profile"] == "measuring"
        complete(proc)  # served with conservative costs, or measured ones if that was quick
        with proc.client() as c:
            assert c.health("suffixd.v1.Generator") == "SERVING"
            assert wait_costs_measured(c)["cost_profile_source"] == "measured"
        assert "verifier costs measured" in proc.log()
    finally:
        proc.stop()
    yield data


def test_restart_serves_at_once_on_the_stored_profile(measured: Path, tmp_path: Path) -> None:
    path = measured / "cost_profile.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    stored = json.loads(path.read_text())
    assert stored["key"]["rounds"] == 1 and stored["costs"]["raw"]["1"] > 0
    if stored["costs"]["distorted"]:
        # measured under heavy load (a busy test machine): such a profile is used and
        # measured again; this test is about one that is simply reused
        stored["costs"]["distorted"] = False
        path.write_text(json.dumps(stored))
    before = path.stat().st_mtime_ns
    proc = start(measured, "--model-load", "startup")
    try:
        seen = poll_health(proc)
        # 503 "Loading model" until a generation can be served (the model loads in the
        # background once serving), then 200: never "ok" before that
        assert [s for s, _ in seen[:-1]] == [503] * (len(seen) - 1) and seen[-1][0] == 200
        assert all(body == LOADING for _, body in seen[:-1]), seen
        ready = ready_line(proc)
        assert ready["cost_profile"] == "stored"
        # no measurement before serving: ready as the model is loaded (the load itself is
        # what takes the time; generous for a loaded 2-core machine)
        assert float(ready["since_start_s"]) - float(ready["load_s"]) < 30, ready
        t0 = time.monotonic()
        assert complete(proc, max_tokens=1)
        assert time.monotonic() - t0 < 120
        with proc.client() as c:
            st = c.generator_status()
            assert st["cost_profile_source"] == "stored" and st["cost_profile"][1] == 1.0
            assert c.health("suffixd.v1.Generator") == "SERVING"
        assert "verifier costs measured" not in proc.log()
    finally:
        proc.stop()
    assert path.stat().st_mtime_ns == before  # reused, not measured and written again


def test_a_profile_of_other_settings_is_not_reused(measured: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    shutil.copy(measured / "cost_profile.json", data / "cost_profile.json")
    threads = json.loads((data / "cost_profile.json").read_text())["key"]["n_threads"]
    other = 1 if threads != 1 else 2
    proc = start(data, "--model-load", "startup", "--threads", str(other))
    try:
        poll_health(proc)
        assert ready_line(proc)["cost_profile"] == "measuring"
        assert f"measured under other settings (n_threads {threads} -> {other})" in proc.log()
        with proc.client() as c:
            assert c.generator_status()["cost_profile_source"] in ("measuring", "measured")
    finally:
        proc.stop()


def test_a_corrupt_profile_is_ignored_and_measured_again(measured: Path,
                                                         tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    (data / "cost_profile.json").write_text('{"key": {"format": 1}, "costs": ')
    proc = start(data, "--model-load", "startup")
    try:
        poll_health(proc)
        assert ready_line(proc)["cost_profile"] == "measuring"
        assert re.search(r"none usable in the data dir \(corrupt", proc.log())
        complete(proc)
        with proc.client() as c:
            assert wait_costs_measured(c)["cost_profile_source"] == "measured"
    finally:
        proc.stop()
    fresh = json.loads((data / "cost_profile.json").read_text())
    assert fresh["key"] == json.loads((measured / "cost_profile.json").read_text())["key"]
    assert "Traceback" not in proc.log()


def test_first_use_daemon_is_not_ready_until_a_generation_loads_it(tmp_path: Path) -> None:
    """--model-load first-use: nothing loads until a generation asks, so /health is 503
    and the Generator NOT_SERVING until then (the draft-cache services serve at once)."""
    proc = start(tmp_path / "data", "--model-load", "first-use")
    try:
        assert proc.http
        r = httpx.get(proc.http.removesuffix("/v1") + "/health", timeout=30)
        assert r.status_code == 503 and "first-use" in r.json()["error"]["message"]
        with proc.client() as c:
            assert c.health() == "SERVING" and c.health("suffixd.v1.Suffixd") == "SERVING"
            assert c.health("suffixd.v1.Corpus") == "SERVING"
            assert c.health("suffixd.v1.Generator") == "NOT_SERVING"
            assert complete(proc, max_tokens=1)
            assert c.health("suffixd.v1.Generator") == "SERVING"
        assert poll_health(proc, timeout=30)[-1] == (200, {"status": "ok"})
    finally:
        proc.stop()
