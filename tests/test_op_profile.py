"""bench/op_profile.py: one decode's time by llama.cpp graph node, on the embedded model,
and the same logits whether or not the nodes are observed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import THREADS

TIER = "model"
SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "op_profile.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--threads", str(THREADS), *args],
                          capture_output=True, text=True, timeout=600, check=False)


def test_names_the_output_head_and_attentions_products_of_a_two_sequence_step() -> None:
    done = _run("--sequences", "2", "--rows", "1", "--context", "80", "--rounds", "1",
                "--top", "40")
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "2 sequences x 1 rows after 80 cached tokens" in out
    ms = {m.group(1): float(m.group(2))
          for m in re.finditer(r"^  (\w+) \(op \d+\)\s+([\d.]+) ms$", out, re.M)}
    assert {"result_output", "kq", "kqv"} <= set(ms), out
    assert all(v >= 0 for v in ms.values())
    # the head (262k x 640) outweighs attention over 81 cached tokens
    assert ms["result_output"] > ms["kq"]


def test_bad_sizes_are_refused_without_a_traceback() -> None:
    done = _run("--sequences", "0")
    assert done.returncode != 0
    assert "op_profile: --sequences" in done.stderr and "Traceback" not in done.stderr
