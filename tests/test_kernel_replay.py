"""bench/kernel_replay.py (issue 45): a run's own steps decoded again under each attention
kernel, on the embedded model. What it must get right is the cache: each step's rows at
the positions the log gives, its sequences filled or rolled back to them first, so a
replayed step attends over as many cells as the logged one did."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import llama_cpp

from tests.conftest import THREADS

TIER = "model"
BENCH = Path(__file__).resolve().parents[1] / "bench"


def _seq(seq: int, prompt: bool, rows: int, pos0: int) -> list[int]:
    # a row of "seqs": [seq_id, prompt, tokens, want, kept, rows, emitted, pos0]
    return [seq, int(prompt), rows, 0, rows, rows, 0 if prompt else rows, pos0]


def test_each_step_runs_at_the_logged_positions() -> None:
    sys.path.insert(0, str(BENCH))
    try:
        from kernel_replay import Replayer
    finally:
        sys.path.remove(str(BENCH))
    r = Replayer("off", 2, 2048, THREADS)

    def held(seq: int) -> int:  # asked of llama.cpp, not of the replayer's own count
        return int(llama_cpp.llama_memory_seq_pos_max(r.memory, seq)) + 1

    assert r.step([_seq(0, True, 100, 0)]) > 0
    assert held(0) == 100
    # sequence 1 filled to 700 cached tokens, untimed, before a step that decodes both
    r.step([_seq(0, False, 4, 100), _seq(1, False, 2, 700)])
    assert (held(0), held(1)) == (104, 702)
    # a draft rolled back: the next step starts at 101, as the log says
    r.step([_seq(0, False, 1, 101)])
    assert held(0) == 102 and r.held(0) == 102
    # a slot reused from its start (a new conversation)
    r.step([_seq(1, True, 30, 0)])
    assert held(1) == 30


def test_the_report_prices_every_variant_on_the_same_steps(tmp_path: Path) -> None:
    steps = [{"t": 0.0, "s": 0.2, "seqs": [_seq(0, True, 64, 0)]},
             {"t": 0.3, "s": 0.05, "seqs": [_seq(0, False, 3, 64), _seq(1, True, 20, 0)]},
             {"t": 0.4, "s": 0.03, "seqs": [_seq(0, False, 2, 67), _seq(1, False, 1, 20)]}]
    log = tmp_path / "steps.jsonl"
    log.write_text("".join(json.dumps(s) + "\n" for s in steps))
    out = subprocess.run([sys.executable, str(BENCH / "kernel_replay.py"), str(log),
                          "--variants", "off,bf16", "--ctx-size", "512",
                          "--threads", str(THREADS), "--against", "0.5"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    # wall: the first step's start to the last one's end (t is when a step ended)
    assert "daemon 0: 3 steps, 2 sequences, wall 0.6 s" in out
    lines = {line.split()[0]: line.split() for line in out.splitlines()
             if line.split()[:1] in (["off"], ["bf16"])}
    assert set(lines) == {"off", "bf16"}
    assert lines["off"][5] == "1.000"  # the first variant is the baseline
    assert float(lines["bf16"][4]) > 0
