"""The stored cost profile is judged as a whole, and the data dir follows no link (issue 33,
item 3).

Before: finite but absurd costs in ``cost_profile.json`` (1e308, 5e-324, 1e-12 for a
batch) passed the file's checks and then failed the profile, so /health stayed 503 and
every completion was answered 400 ("cost profile values must be > 0") until someone
deleted the file; the start-up chmod followed symbolic links (a ``cost_profile.json``
linked outside the data dir changed its target's mode) and a link to a FIFO blocked the
model load with nothing logged.

Now: such a file is ignored, logged and measured again; a generation the server cannot
serve is a 503 with the reason; files in the data dir are opened with ``O_NOFOLLOW``
(a link or a FIFO is refused with one log line) and the chmod pass leaves links alone.

Unit tests on the store and the data dir's guards; then real daemons on the embedded
model and real data dirs.
"""

from __future__ import annotations

import json
import os
import re
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from suffixd.client.errors import UnavailableError
from suffixd.daemon.generation.cost_measure import CostMeasurement
from suffixd.daemon.generation.cost_store import ProfileStore, StoredCosts, profile_key
from suffixd.daemon.server.datadir import DataDirLock, owner_only, write_private
from suffixd.daemon.server.serve_config import ServeError

from suffixcache import CostProfile
from tests.conftest import THREADS, DaemonProcess, wait_costs_measured

# tests/conftest.py: every daemon here measures its costs (the tests are about that)
DAEMONS_MEASURE = True
# the profile's sizes 1-8 are all these tests read (a third of the measurement's time)
DAEMONS_MEASURE_SIZES = 8

COSTS = StoredCosts(raw={1: 0.020, 2: 0.024, 4: 0.027, 8: 0.036},
                    padded={(3, 4): 0.026, (5, 8): 0.035}, draft_seconds_per_token=0.004)


@pytest.fixture
def store(tmp_path: Path) -> ProfileStore:
    m = tmp_path / "m.gguf"
    m.write_bytes(b"GGUF" + bytes(100))
    key = profile_key(m, n_threads=THREADS, n_batch=512, n_ctx=8192, n_slots=4, n_gpu_layers=0,
                      extra_buffers=False, rounds=1)
    (tmp_path / "data").mkdir()
    return ProfileStore(tmp_path / "data" / "cost_profile.json", key)


def _with_costs(store: ProfileStore, **costs: Any) -> None:
    store.save(COSTS)
    data = json.loads(store.path.read_text())
    data["costs"].update(costs)
    store.path.write_text(json.dumps(data))


def _profile_of(costs: StoredCosts) -> CostProfile:
    """What the daemon plans with once it takes stored costs (Runtime._use)."""
    host = CostMeasurement()
    host._init_costs()
    return CostProfile.from_json({str(k): v for k, v in
                                  host.restore_costs(costs.raw, costs.padded).items()})


@pytest.mark.parametrize("costs", [
    {"raw": {"1": 0.02, "2": 0.024, "8": 1e-12}},  # the probe's batch of 1e-12 s
    {"raw": {"1": 0.02, "8": 1e308}},
    {"raw": {"1": 5e-324, "8": 0.03}},
    {"raw": {"1": 1e308}},
    {"raw": {"1": 0.02, "8": 0.03}, "padded": [[3, 8, 1e-300]]},
    {"raw": {"1": 0.02, "100000": 0.5}},
    {"draft_seconds_per_token": 1e308},
])
def test_absurd_costs_are_ignored_as_implausible(store: ProfileStore,
                                                 costs: dict[str, Any]) -> None:
    _with_costs(store, **costs)
    got, why = store.load()
    assert got is None and why.startswith("implausible ("), why


def test_a_huge_integer_is_corrupt_not_a_crash(store: ProfileStore) -> None:
    store.save(COSTS)
    text = store.path.read_text().replace('"1": 0.02', '"1": 1' + "0" * 400)
    store.path.write_text(text)
    got, why = store.load()
    assert got is None and why.startswith("corrupt"), why


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.dictionaries(st.integers(1, 40), st.floats(min_value=0.0, exclude_min=True,
                                                          allow_infinity=False), min_size=1),
       padded=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 40),
                                 st.floats(min_value=0.0, exclude_min=True,
                                           allow_infinity=False)), max_size=4))
def test_a_profile_that_loads_never_fails_the_drafter(store: ProfileStore,
                                                      raw: dict[int, float],
                                                      padded: list[Any]) -> None:
    """Whatever a file holds: either the store refuses it, or the profile it gives is
    one the daemon can plan with (the failure the probe found came after the load)."""
    raw = {1: raw.pop(1, 0.02), **raw}
    store.save(COSTS)
    data = json.loads(store.path.read_text())
    data["costs"].update(raw={str(k): v for k, v in raw.items()},
                         padded=[[k, j, v] for k, j, v in padded if k < j])
    store.path.write_text(json.dumps(data))
    got, why = store.load()
    if got is not None:
        profile = _profile_of(got)
        assert all(c > 0 for c in profile.table(64)[1:])


def test_a_link_or_a_fifo_is_refused_without_blocking(store: ProfileStore,
                                                      tmp_path: Path) -> None:
    outside = tmp_path / "outside.json"
    store.save(COSTS)
    store.path.rename(outside)
    store.path.symlink_to(outside)
    got, why = store.load()
    assert got is None and why.startswith("refused (") and "symbolic link" in why, why

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    store.path.unlink()
    store.path.symlink_to(fifo)
    got, why = store.load()  # before: blocked in open() until a writer came
    assert got is None and "symbolic link" in why, why
    store.path.unlink()
    os.mkfifo(store.path)
    result: list[Any] = []
    t = threading.Thread(target=lambda: result.append(store.load()), daemon=True)
    t.start()
    t.join(10)
    assert result and result[0][0] is None and "not a regular file" in result[0][1], result
    # Saving replaces what is there (the FIFO, a link) with a regular file of its own.
    store.save(COSTS)
    assert stat.S_ISREG(os.lstat(store.path).st_mode) and store.load()[0] == COSTS


def test_saving_never_writes_through_a_leftover_link(store: ProfileStore,
                                                     tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    victim.chmod(0o644)
    tmp = store.path.with_name(f".{store.path.name}.{os.getpid()}.tmp")
    tmp.symlink_to(victim)
    store.save(COSTS)
    assert victim.read_text() == "keep" and stat.S_IMODE(victim.stat().st_mode) == 0o644
    announce = store.path.parent / "daemon.json"
    Path(f"{announce}.tmp").symlink_to(victim)
    write_private(announce, "{}")
    assert victim.read_text() == "keep" and stat.S_IMODE(victim.stat().st_mode) == 0o644
    assert stat.S_IMODE(announce.stat().st_mode) == 0o600


def test_a_file_that_cannot_be_replaced_is_named_itself(tmp_path: Path) -> None:
    """Issue 44, item 8: daemon.json as a directory was reported as 'daemon.json.tmp', a
    file the user never made; the error names daemon.json and leaves no temporary file."""
    from suffixd.daemon.server.startup import disk_error_line

    announce = tmp_path / "daemon.json"
    announce.mkdir()
    with pytest.raises(OSError) as err:
        write_private(announce, "{}")
    assert err.value.filename == str(announce)
    line = disk_error_line(tmp_path, err.value)
    assert f"({announce})" in line and ".tmp" not in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["daemon.json"]


def test_owner_only_leaves_links_and_their_targets_alone(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = tmp_path / "data"
    (data / "store").mkdir(parents=True)
    (data / "store" / "data.mdb").write_text("x")
    (data / "store" / "data.mdb").chmod(0o644)
    target = tmp_path / "target.json"
    target.write_text("{}")
    target.chmod(0o644)
    outside_dir = tmp_path / "shared"
    outside_dir.mkdir(mode=0o755)
    outside_dir.chmod(0o755)
    (data / "cost_profile.json").symlink_to(target)
    (data / "linked_dir").symlink_to(outside_dir, target_is_directory=True)
    os.mkfifo(data / "fifo", 0o644)
    with caplog.at_level("WARNING", logger="suffixd.server"):
        owner_only(data)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644  # before: 0600
    assert stat.S_IMODE(outside_dir.stat().st_mode) == 0o755  # before: 0700
    assert stat.S_IMODE((data / "store" / "data.mdb").stat().st_mode) == 0o600
    assert stat.S_IMODE((data / "store").stat().st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(data / "fifo").st_mode) == 0o600
    links = [r for r in caplog.records if "symbolic link" in r.getMessage()]
    assert len(links) == 2, [r.getMessage() for r in caplog.records]


def test_a_lock_file_that_is_a_link_or_no_file_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (data / "suffixd.lock").symlink_to(victim)
    with pytest.raises(ServeError, match="symbolic link"):
        DataDirLock(data).acquire()
    assert victim.read_text() == "keep"
    (data / "suffixd.lock").unlink()
    os.mkfifo(data / "suffixd.lock")
    with pytest.raises(ServeError, match="not a regular file"):
        DataDirLock(data).acquire()


# ---------------------------------------------------------------- real daemons

ENV = {"SUFFIXD_COST_ROUNDS": "1"}


def _start(data_dir: Path, *args: str, env: dict[str, str] | None = None) -> DaemonProcess:
    n = len(list(data_dir.parent.glob(f"{data_dir.name}-*.log")))
    return DaemonProcess(data_dir, ["--http", "127.0.0.1:0", "--model-load", "startup", *args],
                         env={**ENV, **(env or {})},
                         log_path=data_dir.parent / f"{data_dir.name}-{n}.log").start()


def _health(proc: DaemonProcess, timeout: float = 300.0) -> tuple[int, Any]:
    """/health once it is 200 or says the load failed (or after ``timeout``)."""
    assert proc.http
    url = proc.http.removesuffix("/v1") + "/health"
    deadline = time.monotonic() + timeout
    while True:
        r = httpx.get(url, timeout=30)
        if r.status_code == 200 or "failed" in r.text or time.monotonic() > deadline:
            return r.status_code, r.json()
        time.sleep(0.05)


def _complete(proc: DaemonProcess) -> httpx.Response:
    return httpx.post(f"{proc.http}/completions", timeout=600, json={
        "model": "default", "prompt": "SELECT name FROM singer", "max_tokens": 1})


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A data dir whose daemon measured and stored its costs (the key the others need)."""
    data = tmp_path_factory.mktemp("costs") / "data"
    proc = _start(data)
    try:
        assert _health(proc)[0] == 200, proc.log()
        with proc.client() as c:
            assert wait_costs_measured(c)["cost_profile_source"] == "measured", proc.log()
    finally:
        proc.stop()
    yield data


def test_an_absurd_stored_profile_is_ignored_logged_and_measured_again(
        measured: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    stored = json.loads((measured / "cost_profile.json").read_text())
    stored["costs"]["raw"]["8"] = 1e-12  # the probe's: finite, positive, absurd
    stored["costs"]["distorted"] = False
    (data / "cost_profile.json").write_text(json.dumps(stored))
    proc = _start(data)
    try:
        status, body = _health(proc)
        assert status == 200, (body, proc.log())  # before: 503 "Model load failed" for good
        r = _complete(proc)
        assert r.status_code == 200, r.text  # before: 400 "cost profile values must be > 0"
        assert re.search(r"none usable in the data dir \(implausible \(batch 8: 1e-12 s",
                         proc.log()), proc.log()
        with proc.client() as c:
            assert wait_costs_measured(c)["cost_profile_source"] == "measured"
    finally:
        proc.stop()
    fresh = json.loads((data / "cost_profile.json").read_text())
    assert fresh["key"] == stored["key"] and fresh["costs"]["raw"]["8"] > 1e-6
    assert "Traceback" not in proc.log()


def test_links_in_the_data_dir_are_not_followed(measured: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o644)
    fifo.chmod(0o644)
    shared = tmp_path / "shared.json"
    shared.write_text((measured / "cost_profile.json").read_text())
    shared.chmod(0o644)
    (data / "cost_profile.json").symlink_to(fifo)
    (data / "notes.json").symlink_to(shared)
    proc = _start(data)
    try:
        status, body = _health(proc, timeout=240)
        assert status == 200, (body, proc.log())  # before: "Loading model" for good
        log = proc.log()
        assert "none usable in the data dir (refused (" in log and "symbolic link" in log
        assert stat.S_IMODE(fifo.stat().st_mode) == 0o644  # before: 0600
        assert stat.S_IMODE(shared.stat().st_mode) == 0o644
        with proc.client() as c:
            assert wait_costs_measured(c)["cost_profile_source"] == "measured"
    finally:
        proc.stop()
    # The measurement replaced the link with a file of the daemon's own; the FIFO and
    # the other link's target are as they were.
    assert stat.S_ISREG(os.lstat(data / "cost_profile.json").st_mode)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and (data / "notes.json").is_symlink()
    assert "Traceback" not in proc.log()


def test_a_model_that_does_not_load_is_a_503_with_the_reason(tmp_path: Path) -> None:
    garbage = tmp_path / "draft.gguf"
    garbage.write_bytes(b"GGUF" + bytes(4096))
    proc = _start(tmp_path / "data", env={"SUFFIXD_DRAFT_MODEL": str(garbage)})
    try:
        status, body = _health(proc)
        assert status == 503 and "failed" in body["error"]["message"], body
        r = _complete(proc)  # before: 400, as if the client had sent a bad argument
        assert r.status_code == 503, r.text
        err = r.json()["error"]
        assert err["type"] == "unavailable_error" and "did not load" in err["message"]
        assert str(garbage) in err["message"], err
        # gRPC: UNAVAILABLE, not INVALID_ARGUMENT
        with proc.client() as c, pytest.raises(UnavailableError, match="did not load"):
            list(c.generate(prompt="SELECT", max_tokens=1))
    finally:
        proc.stop()
