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
