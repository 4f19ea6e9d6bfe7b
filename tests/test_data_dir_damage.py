"""A data dir left damaged: the daemon refuses it in one line, or reads past the damage
(issue 44, items 1-5).

Before: LMDB followed a link at ``store/lock.mdb`` and wrote its lock table into the
target (while the daemon logged that it follows no link); an emptied ``data.mdb`` was
taken for a new store and the daemon served nothing, silently; a FIFO there hung the
start for good; a store of random bytes, a directory, garbage in the real file or a
truncated one (SIGBUS) ended the start in a traceback; one bad sample in
``history.json`` (a time "abc") ended a start with ``--http`` (exit 1), and NaN,
infinite or absurd values failed every /dashboard load (500).

Now: LMDB's files are checked before the open (``lstat``: no link, a regular file,
``data.mdb`` not empty) and after it (the names lead to the files LMDB holds, the file
reaches its last page); damage LMDB reports is a ``StoreFileError``; the daemon's start
turns that into one line naming the file and the way out (move it aside, restore a copy).
Stored samples are checked one by one on load, and bad ones dropped, counted in one
warning.

Unit tests on the store, the data dir's probe and the history; then real daemons on real
data dirs (``--model none``: the store is what is under test).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import lmdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from suffixd.daemon.engine import Engine
from suffixd.daemon.http_api.dashboard import RANGES, build_view, render_page
from suffixd.daemon.http_api.dashboard_data import clean_sample, empty_ns, take_sample
from suffixd.daemon.server.datadir import check_store_dir
from suffixd.daemon.server.history import History
from suffixd.daemon.server.serve_config import ServeError
from suffixd.daemon.server.startup import check_data_dir_writable

import suffixcache.store as store_module
from suffixcache.store import Store, StoreError, StoreFileError
from tests.conftest import DaemonProcess

# A token no test text makes: the pages that hold it are the sequences' (in one write).
MARK = 0x5A5A5A5A
PAGE = 4096
LEAF_FLAGS_AT = 10  # the page header: pgno (8 bytes), pad (2), flags (2)


def _populated_store(path: Path, n: int = 200) -> None:
    with Store(path) as s:
        s.write(lambda t: [t.add_sequence("ns", "response", [MARK] * 8 + [i])
                           for i in range(n)])


def _break_sequence_pages(data_mdb: Path) -> int:
    """Mark every page holding a stored sequence as neither leaf nor branch (LMDB:
    MDB_CORRUPTED once a read reaches one); returns how many."""
    raw = data_mdb.read_bytes()
    pages = [n for n in range(len(raw) // PAGE)
             if struct.pack("<I", MARK) * 8 in raw[n * PAGE:(n + 1) * PAGE]]
    with data_mdb.open("r+b") as f:
        for n in pages:
            f.seek(n * PAGE + LEAF_FLAGS_AT)
            f.write(struct.pack("<H", 0))
    return len(pages)


def _garbage(path: Path, offset: int, n: int) -> None:
    with path.open("r+b") as f:
        f.seek(offset)
        f.write(os.urandom(n))


def _damage(kind: str, data_mdb: Path) -> None:
    """The store's ``data.mdb`` made into what the issue found."""
    if kind == "empty":
        data_mdb.write_bytes(b"")
    elif kind == "random":
        data_mdb.write_bytes(os.urandom(100_000))
    elif kind == "directory":
        data_mdb.unlink()
        data_mdb.mkdir()
    elif kind == "garbage":  # 16 KB from the second meta page on
        _garbage(data_mdb, PAGE, 16 << 10)
    elif kind == "truncated":  # before: SIGBUS at the first read past the end
        os.truncate(data_mdb, 5000)
    elif kind == "fifo":
        data_mdb.unlink()
        os.mkfifo(data_mdb)
    else:
        raise AssertionError(kind)


# ---------------------------------------------------------------- the store


def test_links_to_the_store_files_are_refused_and_their_targets_untouched(
        tmp_path: Path) -> None:
    store = tmp_path / "store"
    _populated_store(store)
    victim = tmp_path / "victim.txt"
    victim.write_text("127.0.0.1 localhost\n")
    (store / "lock.mdb").unlink()
    (store / "lock.mdb").symlink_to(victim)
    with pytest.raises(StoreFileError, match=r"lock\.mdb is a symbolic link") as err:
        Store(store)
    assert err.value.path == store / "lock.mdb" and "remove the link" in str(err.value)
    assert victim.read_text() == "127.0.0.1 localhost\n"  # before: LMDB's lock table
    (store / "lock.mdb").unlink()
    elsewhere = tmp_path / "elsewhere.mdb"
    (store / "data.mdb").rename(elsewhere)
    before = elsewhere.read_bytes()
    (store / "data.mdb").symlink_to(elsewhere)
    with pytest.raises(StoreFileError, match=r"data\.mdb is a symbolic link"):
        Store(store)
    assert elsewhere.read_bytes() == before
    # the file itself back in place: the store opens, the data is there
    (store / "data.mdb").unlink()
    elsewhere.rename(store / "data.mdb")
    with Store(store) as s:
        assert len(list(s.iter_sequences())) == 200


def test_a_link_swapped_in_while_the_store_opens_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After LMDB's open, the names must still lead to the files it holds: a link left
    there, or a file swapped in after LMDB opened another, is refused."""
    store = tmp_path / "store"
    _populated_store(store)
    real_check = store_module.check_before_open
    real_open = lmdb.open
    victim = tmp_path / "victim"
    victim.write_bytes(b"")

    def check_then_link(path: Path) -> None:
        real_check(path)
        (path / "lock.mdb").unlink()
        (path / "lock.mdb").symlink_to(victim)

    monkeypatch.setattr(store_module, "check_before_open", check_then_link)
    with pytest.raises(StoreFileError, match=r"lock\.mdb is a symbolic link"):
        Store(store)
    monkeypatch.setattr(store_module, "check_before_open", real_check)
    (store / "lock.mdb").unlink()

    def open_then_swap(path: str, **kw: Any) -> Any:
        env = real_open(path, **kw)
        data = Path(path) / "data.mdb"
        shutil.copyfile(data, data.with_name("copy"))
        data.with_name("copy").replace(data)  # same bytes, another file
        return env

    monkeypatch.setattr(store_module.lmdb, "open", open_then_swap)
    with pytest.raises(StoreFileError, match=r"data\.mdb was replaced while the store "
                                             r"opened"):
        Store(store)


# In a child: before, a FIFO blocked LMDB's open for good (holding the GIL: no thread or
# timeout in this process would get to run), and a truncated file killed the process
# with SIGBUS.
_OPEN_IN_A_CHILD = """
import json, sys
from suffixcache.store import Store, StoreFileError
try:
    Store(sys.argv[1]).close()
    print(json.dumps(None))
except StoreFileError as exc:
    print(json.dumps({"path": str(exc.path), "error": str(exc)}))
"""


@pytest.mark.parametrize("kind", ["empty", "random", "directory", "garbage", "truncated",
                                  "fifo"])
def test_a_damaged_store_is_refused_naming_the_file_and_the_way_out(
        tmp_path: Path, kind: str) -> None:
    store = tmp_path / "store"
    _populated_store(store)
    _damage(kind, store / "data.mdb")
    r = subprocess.run([sys.executable, "-c", _OPEN_IN_A_CHILD, str(store)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    got = json.loads(r.stdout)
    assert got is not None and got["path"] == str(store / "data.mdb"), got
    assert "restore a copy" in got["error"] and "aside" in got["error"], got
    if kind == "empty":
        assert "is empty (0 bytes)" in got["error"]
        assert (store / "data.mdb").stat().st_size == 0  # not made a new store
    if kind == "truncated":
        assert "is truncated (5000 bytes; its pages end at " in got["error"]


def test_damaged_pages_found_by_a_read_are_the_same_error(tmp_path: Path) -> None:
    store = tmp_path / "store"
    _populated_store(store)
    assert _break_sequence_pages(store / "data.mdb")
    with Store(store) as s:  # the pages the open reads are whole
        with pytest.raises(StoreFileError, match=r"data\.mdb is not a readable LMDB store "
                                                 r"\(.*MDB_CORRUPTED"):
            list(s.iter_sequences())
        assert s.iter_sessions() == []  # the store stays usable where it can be read


def test_damaged_pages_found_by_a_write_are_the_same_error(tmp_path: Path) -> None:
    """A write that reaches a damaged page (here: adding to the sequences' damaged leaf)
    fails with the reads' error naming the file and the way out, not LMDB's own."""
    store = tmp_path / "store"
    _populated_store(store)
    assert _break_sequence_pages(store / "data.mdb")
    with Store(store) as s:
        with pytest.raises(StoreFileError, match=r"data\.mdb is not a readable LMDB store "
                                                 r"\(.*MDB_CORRUPTED"):
            s.write(lambda t: t.add_sequence("ns", "response", [1, 2, 3]))
        assert s.iter_sessions() == []  # reads of what the damage spares still answer


def test_a_background_rebuild_that_meets_damaged_pages_says_it_failed(
        tmp_path: Path) -> None:
    """Before: the rebuild thread died in a traceback and ``rebuilding`` stayed true."""
    _populated_store(tmp_path / "store")
    assert _break_sequence_pages(tmp_path / "store" / "data.mdb")
    failed: list[StoreError] = []
    done = threading.Event()

    def on_failure(exc: StoreError) -> None:
        failed.append(exc)
        done.set()

    with Engine(tmp_path, background_rebuild=True,  # no vocabulary: nothing written first
                on_rebuild_failure=on_failure) as e:
        assert done.wait(30)
        assert isinstance(failed[0], StoreFileError)
        assert failed[0].path == tmp_path / "store" / "data.mdb"
        info = e.info()
        assert not info["rebuilding"] and info["rebuild_error"] == str(failed[0])
        assert e.rebuild_error is failed[0]


def test_a_new_store_still_opens_and_reopens(tmp_path: Path) -> None:
    with Store(tmp_path / "s") as s:
        s.write(lambda t: t.add_sequence("ns", "response", [1, 2, 3]))
    with Store(tmp_path / "s") as s:
        assert [r["tokens"] for r in s.iter_sequences()] == [[1, 2, 3]]


# ---------------------------------------------------------------- the data dir


def test_the_write_probe_never_writes_through_a_link(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep")
    # the name the probe had before (then opened with O_TRUNC, following links) and the
    # one it has now
    old, now = data / ".suffixd-write-probe", data / f".suffixd-write-probe.{os.getpid()}"
    old.symlink_to(victim)
    now.symlink_to(victim)
    check_data_dir_writable(data)
    assert victim.read_text() == "keep"  # before: 64 KiB of zeros
    assert list(data.iterdir()) == [old]  # the link at its own name: removed


def test_a_store_directory_that_is_a_link_or_no_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "store").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(ServeError, match="is a symbolic link"):
        check_store_dir(tmp_path / "store")
    (tmp_path / "store").unlink()
    (tmp_path / "store").write_text("")
    with pytest.raises(ServeError, match="is not a directory"):
        check_store_dir(tmp_path / "store")
    check_store_dir(tmp_path / "absent")


# ---------------------------------------------------------------- the history


class _Engine:
    """What ``take_sample`` reads of an engine."""

    def stats(self, top_documents: int = 10) -> dict[str, Any]:
        c = {"requests": 3, "steps": 10, "draft_tokens_proposed": 20,
             "draft_tokens_accepted": 8, "generated_tokens": 30, "speculate_calls": 12,
             "by_source": {"session": {"steps": 6, "proposed": 12, "accepted": 5}}}
        return {"sql": {"counters": c, "open_sessions": 1,
                        "cache": {"global": {"tokens": 50, "bytes": 900, "evictions": 1}}}}

    def memory(self) -> list[dict[str, Any]]:
        return [{"kind": k, "trees": 1, "tokens": 10, "bytes": 100, "budget_tokens": 1000,
                 "budget_bytes": 0, "budget_tokens_per_tree": 500, "budget_bytes_per_tree": 0}
                for k in ("session", "global", "corpus")]


BAD_SAMPLES = [
    '{"t": "abc"}',
    '{"t": NaN}',
    '{"t": Infinity}',
    '{"t": -1e308}',
    '{"t": 1700000000, "all": "x"}',
    '{"t": 1700000000, "ns": "x"}',
    '{"t": 1700000000, "ns": {"a": {"steps": NaN}}}',
    '{"t": 1700000000, "all": {"requests": 1e400}}',
    '{"t": 1700000000, "all": {"src": {"session": [1, 2]}}}',
    '{"t": 1700000000, "memory": [{"kind": "global", "tokens": "many"}]}',
    '{"t": 1700000000, "fleet": {"n1": {"lag_s": -Infinity}}}',
    '"not a sample"',
]


def _history_file(path: Path, good: list[dict[str, Any]], bad: list[str]) -> None:
    samples = [json.dumps(s) for s in good] + bad
    path.write_text('{"interval_s": 60, "samples": [' + ",".join(samples) + "]}")


def test_bad_samples_are_dropped_and_counted_in_one_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    eng = _Engine()
    good = [take_sample(eng, now=1_700_000_000.0 + 60 * i) for i in range(3)]
    path = tmp_path / "history.json"
    _history_file(path, good[::-1], BAD_SAMPLES)
    h = History(eng, path, interval_s=60)
    with caplog.at_level(logging.WARNING, logger="suffixd.history"):
        h.load()  # before: ValueError (float("abc")), the daemon's start ended with it
    assert h.samples() == good  # the good ones, in time order, as written
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and f"dropped {len(BAD_SAMPLES)} of {len(BAD_SAMPLES) + 3}" \
        in warned[0], warned
    assert path.exists()  # the file is kept (the next save rewrites it)
    for ns in (None, "sql"):
        for rng in RANGES:
            render_page(build_view(h.samples(), h.now(), 60.0, ns, rng))


def test_a_sample_the_daemon_wrote_is_kept_as_it_is() -> None:
    s = json.loads(json.dumps(take_sample(_Engine(), now=1_700_000_000.0)))
    assert clean_sample(s) == s
    assert clean_sample({"t": 5}) == {"t": 5.0, "ns": {}, "all": empty_ns(), "memory": [],
                                      "prompt_cache": None, "fleet": None}


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                      st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5))
json_any = st.recursive(json_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=5), inner, max_size=4)),
    max_leaves=12)
counters = st.dictionaries(
    st.sampled_from(["requests", "steps", "proposed", "accepted", "generated", "evictions",
                     "prompt_tokens", "reused_prompt_tokens", "open_sessions", "src",
                     "tree_tokens", "tree_bytes", "other"]),
    st.one_of(json_leaf, st.lists(json_leaf, min_size=3, max_size=3),
              st.dictionaries(st.sampled_from(["session", "global", "sessions", "corpus"]),
                              st.one_of(json_leaf, st.lists(json_leaf, min_size=3,
                                                            max_size=3)))))
samples_st = st.fixed_dictionaries({}, optional={
    "t": st.one_of(json_leaf, st.floats(1e9, 2e9)),
    "ns": st.one_of(json_any, st.dictionaries(st.sampled_from(["sql", "x"]), counters)),
    "all": st.one_of(json_any, counters),
    "memory": st.one_of(json_any, st.lists(st.dictionaries(
        st.sampled_from(["kind", "trees", "tokens", "bytes", "budget_tokens",
                         "budget_tokens_per_tree", "budget_bytes"]),
        st.one_of(json_leaf, st.sampled_from(["session", "global", "corpus"]))))),
    "prompt_cache": json_any,
    "fleet": st.one_of(json_any, st.dictionaries(st.text(max_size=3), st.dictionaries(
        st.sampled_from(["lag_s", "lag_entries", "backlog"]), json_leaf))),
})


@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(stored=st.lists(st.one_of(samples_st, json_any), max_size=4))
def test_the_dashboard_draws_whatever_a_stored_sample_held(
        tmp_path: Path, stored: list[Any]) -> None:
    """Whatever the file holds (read back as the daemon reads it), every view of the
    samples that are kept renders: before, one NaN or one string among the counters
    failed every load of /dashboard with a 500."""
    path = tmp_path / "history.json"
    path.write_text(json.dumps({"interval_s": 60, "samples": stored}))
    eng = _Engine()
    h = History(eng, path, interval_s=60)
    h.load()
    for ns in (None, "sql", "x"):
        for rng in ("all", "1h"):
            render_page(build_view(h.samples(), h.now(), 60.0, ns, rng))


# ---------------------------------------------------------------- real daemons


@pytest.fixture(scope="module")
def populated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A data dir a daemon wrote and stopped: a session, its response."""
    data = tmp_path_factory.mktemp("populated") / "data"
    proc = DaemonProcess(data, ["--model", "none"]).start()
    try:
        c = proc.client()
        with c.session(namespace="sql", session_id="kept", keep_responses=True) as s:
            s.append(tokens=[5, 6, 7], kind="prompt")
            s.append(tokens=[8, 9], kind="response")
        c.close()
    finally:
        assert proc.stop() == 0, proc.log()
    yield data


def _copy(populated: Path, tmp_path: Path) -> Path:
    data = tmp_path / "data"
    shutil.copytree(populated, data, symlinks=True)
    return data


def _refused(data: Path, *args: str) -> str:
    """Start a daemon on ``data``: it must exit 2 with one error line and no traceback;
    returns that line."""
    n = len(list(data.parent.glob(f"{data.name}-*.log")))
    proc = DaemonProcess(data, ["--model", "none", *args],
                         log_path=data.parent / f"{data.name}-{n}.log")
    proc.start(expect_ready=False)
    try:
        code = proc.wait(60)  # before, for a FIFO: blocked for good
    finally:
        proc.stop()
    log = proc.log()
    assert code == 2, log
    assert "Traceback" not in log, log
    lines = [ln for ln in log.splitlines() if ln.startswith("suffixd serve: error: ")]
    assert len(lines) == 1, log
    return lines[0]


def test_the_daemon_writes_through_no_link_to_its_store_files(
        populated: Path, tmp_path: Path) -> None:
    data = _copy(populated, tmp_path)
    victim = tmp_path / "hosts"
    victim.write_text("127.0.0.1 localhost\n")
    (data / "store" / "lock.mdb").unlink()
    (data / "store" / "lock.mdb").symlink_to(victim)
    line = _refused(data)  # before: served, and the victim became a lock table
    assert f"{data / 'store' / 'lock.mdb'} is a symbolic link" in line, line
    assert victim.read_text() == "127.0.0.1 localhost\n"
    (data / "store" / "lock.mdb").unlink()
    outside = tmp_path / "outside.mdb"
    (data / "store" / "data.mdb").rename(outside)
    (data / "store" / "data.mdb").symlink_to(outside)
    line = _refused(data)
    assert f"{data / 'store' / 'data.mdb'} is a symbolic link" in line, line
    (data / "store").rename(tmp_path / "store")
    (data / "store").symlink_to(tmp_path / "store", target_is_directory=True)
    line = _refused(data)
    assert f"{data / 'store'} is a symbolic link" in line, line


@pytest.mark.parametrize("kind", ["empty", "fifo", "random", "directory", "garbage",
                                  "truncated"])
def test_the_daemon_refuses_a_damaged_store_in_one_line(populated: Path, tmp_path: Path,
                                                         kind: str) -> None:
    """Item 2 (empty: before, served empty without a word), item 3 (a FIFO: before, the
    start hung), item 4 (before: a traceback; truncated: SIGBUS)."""
    data = _copy(populated, tmp_path)
    data_mdb = data / "store" / "data.mdb"
    _damage(kind, data_mdb)
    line = _refused(data)
    assert f"the store file {data_mdb} " in line, line
    assert "restore a copy" in line and "aside" in line, line
    if kind == "empty":
        assert "is empty (0 bytes)" in line and data_mdb.stat().st_size == 0
    if kind == "fifo":
        assert "is a FIFO" in line and stat.S_ISFIFO(os.lstat(data_mdb).st_mode)


def test_damage_found_while_the_trees_rebuild_is_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _populated_store(data / "store")
    assert _break_sequence_pages(data / "store" / "data.mdb")
    line = _refused(data, "--rebuild", "blocking")
    assert "is not a readable LMDB store" in line and "MDB_CORRUPTED" in line, line


def test_damage_found_by_the_background_rebuild_stops_the_daemon_in_one_line(
        tmp_path: Path) -> None:
    """The default --rebuild background: the daemon serves before the rebuild reads the
    damaged pages. Before: the rebuild thread ended in a traceback and the daemon served
    on, "rebuilding" for good, without the data it had acknowledged."""
    data = tmp_path / "data"
    _populated_store(data / "store")
    assert _break_sequence_pages(data / "store" / "data.mdb")
    proc = DaemonProcess(data, ["--model", "none"])
    proc.start(expect_ready=False)
    try:
        code: int | None = proc.wait(30)
    except subprocess.TimeoutExpired:
        code = None  # before: served on, "rebuilding" for good
    finally:
        proc.stop()
    log = proc.log()
    assert code == 2, log
    assert "Traceback" not in log, log
    lines = [ln for ln in log.splitlines() if "data.mdb" in ln]
    assert len(lines) == 1, log
    # the blocking case's text: the file, what is wrong, the way out
    assert f"the store file {data / 'store' / 'data.mdb'} is not a readable LMDB store (" \
        in lines[0] and "MDB_CORRUPTED" in lines[0], log
    assert "restore a copy" in lines[0] and "aside" in lines[0], log


def test_bad_history_samples_neither_stop_the_daemon_nor_fail_the_dashboard(
        populated: Path, tmp_path: Path) -> None:
    data = _copy(populated, tmp_path)
    good = take_sample(_Engine(), now=1_700_000_000.0)
    _history_file(data / "history.json", [good], BAD_SAMPLES)
    # before: exit 1 (float("abc") outside the try)
    proc = DaemonProcess(data, ["--model", "none", "--http", "127.0.0.1:0"]).start()
    try:
        assert proc.http
        base = proc.http.removesuffix("/v1")
        for ns in ("", "sql", "a"):
            r = httpx.get(f"{base}/dashboard", params={"ns": ns} if ns else {}, timeout=60)
            assert r.status_code == 200, r.text  # before: 500 on every load
        h = httpx.get(f"{base}/dashboard/history.json", timeout=60).json()
        assert h["samples"][0] == good
        log = proc.log()
        assert f"dropped {len(BAD_SAMPLES)} of {len(BAD_SAMPLES) + 1} stored samples" in log
    finally:
        assert proc.stop() == 0
    assert "Traceback" not in proc.log()
