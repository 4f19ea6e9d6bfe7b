"""Hardening found by a probe: owner-only files, a warning for --insecure."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any


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
