"""Hardening found by a probe: owner-only files, a warning for --insecure, one daemon per
socket, full and read-only disks, limits on every path that creates state."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_data_dir_and_its_files_are_owner_only_whatever_existed(daemon_factory: Any,
                                                                 tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    (data / "notes.txt").write_text("left by an operator")
    (data / "notes.txt").chmod(0o644)
    proc = daemon_factory(data_dir=data)
    c = proc.client()
    with c.session(namespace="perm") as s:
        s.append(tokens=[1, 2, 3], kind="prompt")
    c.close()
    assert _mode(data) == 0o700
    assert _mode(data / "notes.txt") == 0o600
    store = data / "store"
    assert _mode(store) == 0o700
    assert {_mode(f) for f in store.iterdir()} == {0o600}
    proc.stop()
    # a store an older version left world-readable is fixed at the next start
    (store / "data.mdb").chmod(0o644)
    proc = daemon_factory(data_dir=data)
    assert _mode(store / "data.mdb") == 0o600


def test_insecure_is_announced_at_start(daemon_factory: Any) -> None:
    proc = daemon_factory(args=["--listen", "127.0.0.1:0", "--insecure"])
    assert "--insecure" in proc.log() and "without a token" in proc.log()
    assert "has no token" not in proc.log()  # loopback only: nothing open to others


def test_a_tokenless_daemon_off_loopback_names_its_open_ports(daemon_factory: Any) -> None:
    """Issue 44, item 7: each listener that others can reach without a token is named in a
    warning at start, the HTTP front's and gRPC's."""
    proc = daemon_factory(args=["--listen", "0.0.0.0:0", "--http", "0.0.0.0:0", "--insecure"])
    warned = [line for line in proc.log().splitlines() if "has no token" in line]
    http_port = proc.http.rsplit(":", 1)[1].split("/")[0]
    grpc_port = proc.tcp.rsplit(":", 1)[1]
    assert any(f"HTTP front at http://0.0.0.0:{http_port}/v1" in line for line in warned), warned
    assert any(f"gRPC listener at 0.0.0.0:{grpc_port}" in line for line in warned), warned
    assert all("WARNING" in line or "warning" in line for line in warned), warned


def test_a_live_daemons_socket_is_never_taken_over(daemon_factory: Any, tmp_path: Path) -> None:
    """A second daemon (another data dir) asked to listen on a live daemon's socket
    outside both data dirs refuses in one line, and the first keeps serving."""
    sock = tmp_path / "shared.sock"
    first = daemon_factory(data_dir=tmp_path / "a", args=["--listen", f"unix:{sock}"])
    second = daemon_factory(data_dir=tmp_path / "b", args=["--listen", f"unix:{sock}"],
                            expect_ready=False)
    assert second.wait(60) != 0
    log = second.log()
    assert "listening on" in log or "running daemon" in log, log
    assert "Traceback" not in log
    c = first.client()
    assert c.info()["version"]
    c.close()


def test_a_stale_socket_is_replaced(daemon_factory: Any, tmp_path: Path) -> None:
    import socket

    sock = tmp_path / "stale.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(sock))  # a socket file nothing listens on (a crashed daemon's)
    s.close()
    proc = daemon_factory(data_dir=tmp_path / "c", args=["--listen", f"unix:{sock}"])
    c = proc.client()
    assert c.info()["version"]
    c.close()


# --------------------------------------------------------------------------- disks


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs of its own (a disk to fill, or to remount read-only); unmounted at
    teardown. Needs root and a kernel that lets this process mount (CI may not: skipped)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(mnt: Path) -> Path:
    """Write a file until the file system is full; returns it (delete it to free the disk)."""
    filler = mnt / "filler"
    block = bytes(1 << 16)
    # unbuffered: a buffered file keeps what the full disk refused and raises ENOSPC again
    # when it is closed
    with filler.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(block)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    # a short last write may leave a few bytes: take them too
    with contextlib.suppress(OSError), filler.open("ab", buffering=0) as f:
        for _ in range(64):
            f.write(bytes(512))
    return filler


def one_clear_line(log: str, needle: str) -> None:
    assert "Traceback" not in log, log
    lines = [ln for ln in log.splitlines() if needle in ln]
    assert len(lines) == 1, log
    assert lines[0].startswith("suffixd serve: error: "), log


def test_start_on_a_full_disk_says_so_in_one_line(daemon_factory: Any, small_tmpfs: Path
                                                  ) -> None:
    data = small_tmpfs / "data"
    log = small_tmpfs.parent / "daemon.log"  # not on the disk that fills
    proc = daemon_factory(data_dir=data, args=["--model", "none"], log_path=log)
    c = proc.client()
    with c.session(namespace="disk", session_id="kept", keep_responses=True) as s:
        s.append(tokens=[5, 6, 7], kind="prompt")
        s.append(tokens=[8, 9], kind="response")
    c.close()
    proc.stop()
    filler = fill(small_tmpfs)
    proc = daemon_factory(data_dir=data, args=["--model", "none"], expect_ready=False,
                          log_path=small_tmpfs.parent / "full.log")
    assert proc.wait(60) == 2
    one_clear_line(proc.log(), "disk full")
    filler.unlink()  # space returns: the daemon starts, the data is there
    proc = daemon_factory(data_dir=data, args=["--model", "none"], log_path=log)
    c = proc.client()
    st = c.stats("disk")["namespaces"][0]
    assert st["global"]["tokens"] == 2
    c.close()


def test_start_on_a_read_only_disk_says_so_in_one_line(daemon_factory: Any, small_tmpfs: Path
                                                       ) -> None:
    data = small_tmpfs / "data"
    proc = daemon_factory(data_dir=data, args=["--model", "none"],
                          log_path=small_tmpfs.parent / "daemon.log")
    proc.stop()
    r = subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], capture_output=True,
                       text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot remount the tmpfs read-only: {r.stderr.strip()}")
    # a data dir that does not exist yet on that disk, and the existing one
    for d in (data, small_tmpfs / "new"):
        proc = daemon_factory(data_dir=d, args=["--model", "none"], expect_ready=False,
                              log_path=small_tmpfs.parent / f"{d.name}-ro.log")
        assert proc.wait(60) == 2
        one_clear_line(proc.log(), "read-only file system")


# --------------------------------------------------------------------------- detokenize


def test_detokenize_has_a_per_call_limit(daemon_factory: Any) -> None:
    from suffixd.client import ResourceExhaustedError

    proc = daemon_factory(args=["--max-tokens-per-call", "1000"])
    c = proc.client()
    ids = c.tokenize("SELECT name FROM singer ;")
    assert c.detokenize((ids * 1000)[:1000]).startswith("SELECT name")
    with pytest.raises(ResourceExhaustedError, match="the limit is 1000"):
        c.detokenize((ids * 1001)[:1001])
    c.close()


def test_a_full_disk_refuses_writes_serves_reads_and_recovers(daemon_factory: Any,
                                                              small_tmpfs: Path) -> None:
    from suffixd.client import ResourceExhaustedError

    data = small_tmpfs / "data"
    proc = daemon_factory(data_dir=data, args=["--model", "none"],
                          log_path=small_tmpfs.parent / "daemon.log")
    c = proc.client()
    toks = [7, 8, 9, 10, 11, 12] * 50
    c.open_session("disk", "s")
    c.append("disk", "s", toks, kind="prompt")
    c.append("disk", "s", toks[:40], kind="response")
    filler = fill(small_tmpfs)
    # writes: refused, saying why, nothing of them applied. (A small write may still fit
    # in the free pages LMDB keeps inside its file: these do not.)
    big = list(range(1, 300_001))
    with pytest.raises(ResourceExhaustedError, match="disk full"):
        for _ in range(5):
            c.append("disk", "s", big, kind="tool")
    with pytest.raises(ResourceExhaustedError, match="disk full"):
        c.open_session("disk", "other", tokens=big)
    n = c.describe_session("disk", "s").tokens
    # reads and drafts: served
    assert c.speculate("disk", "s", toks[:12], 8).tokens
    assert c.stats("disk")["namespaces"][0]["global"]["tokens"] == 40
    assert [x.session_id for x in c.list_sessions("disk")] == ["s"]
    # space returns: writes work again, and everything acknowledged is there after a restart
    filler.unlink()
    assert c.append("disk", "s", [5, 6, 7], kind="tool").session_tokens == n + 3
    c.open_session("disk", "other")
    c.close()
    proc.stop()
    proc = daemon_factory(data_dir=data, args=["--model", "none"],
                          log_path=small_tmpfs.parent / "daemon.log")
    c = proc.client()
    assert {x.session_id: x.tokens for x in c.list_sessions("disk")} == {"s": n + 3, "other": 0}
    c.close()
    assert "Traceback" not in proc.log()
