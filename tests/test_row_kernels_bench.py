"""bench/row_kernels.py: what a verification step of k rows costs with the patched build's
few-row matrix products on and off. Its report's arithmetic, and one real run of both
settings on the embedded model. (Which logits the products change, bit for bit:
tests/test_row_kernels.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import THREADS

TIER = "model"  # the last test runs the embedded model (the others are arithmetic)
BENCH = Path(__file__).resolve().parents[1] / "bench"


def _bench() -> object:
    sys.path.insert(0, str(BENCH))
    try:
        import row_kernels
    finally:
        sys.path.remove(str(BENCH))
    return row_kernels


def test_report_takes_each_shapes_median_over_passes_and_prices_it_in_one_row_decodes(
) -> None:
    rk = _bench()
    passes = [
        {"on": {"1": 10.0, "4": 20.0}, "off": {"1": 10.0, "4": 30.0}},
        {"on": {"1": 12.0, "4": 22.0}, "off": {"1": 12.0, "4": 34.0}},
        {"on": {"1": 11.0, "4": 40.0}, "off": {"1": 11.0, "4": 32.0}},
    ]
    out = rk.report(passes)  # type: ignore[attr-defined]
    four = out["shapes"][1]
    assert out["passes"] == 3
    assert (four["shape"], four["rows"]) == ("4", 4)
    assert (four["on_ms"], four["off_ms"]) == (22.0, 32.0)
    assert four["on_over_off"] == pytest.approx(22 / 32, abs=1e-3)
    assert four["on_decodes"] == 2.0 and four["off_decodes"] == pytest.approx(2.91, abs=0.01)


def test_shapes_are_rows_per_sequence_and_bad_ones_are_refused() -> None:
    rk = _bench()
    assert rk.parse_shapes("1;4;1,1,1") == [[1], [4], [1, 1, 1]]  # type: ignore[attr-defined]
    for bad in ("", "0", "2,,1", "x"):
        with pytest.raises((SystemExit, ValueError)):
            rk.parse_shapes(bad)  # type: ignore[attr-defined]


def test_both_settings_run_and_report_every_shape(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    done = subprocess.run(
        [sys.executable, str(BENCH / "row_kernels.py"), "--shapes", "1;3;1,1", "--context",
         "64", "--rounds", "1", "--passes", "2", "--threads", str(THREADS), "--json",
         str(out)], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    rep = json.loads(out.read_text())
    assert rep["passes"] == 2
    assert [s["shape"] for s in rep["shapes"]] == ["1", "3", "1,1"]
    assert all(s["on_ms"] > 0 and s["off_ms"] > 0 for s in rep["shapes"])
    assert rep["shapes"][0]["on_decodes"] == 1.0
