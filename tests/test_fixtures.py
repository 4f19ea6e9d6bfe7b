"""The fixtures' own guarantees."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"  # a zombie has ended; only its reaping is left


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_a_started_process_ends_with_a_test_process_that_crashes() -> None:
    script = ("import subprocess, sys, time\n"
              "from tests.conftest import dies_with_parent\n"
              "p = subprocess.Popen(dies_with_parent(['sleep', '120']))\n"
              "print(p.pid, flush=True)\n"
              "time.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE,
                              text=True)
    assert parent.stdout is not None
    pid = int(parent.stdout.readline())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{pid}/cmdline").read_bytes()[:5] != b"sleep":
        time.sleep(0.02)  # the wrapper has exec'd the command
    assert _alive(pid)
    parent.kill()  # as a crash would: no teardown runs
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    assert not _alive(pid)
