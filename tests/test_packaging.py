"""`pip install .` (a real wheel, not the editable install the tests run from) ships every layer."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_contains_extension_and_namespaced_packages(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(ROOT),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
        ],
        check=True,
        timeout=600,
    )
    (wheel,) = tmp_path.glob("suffixd-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert any(n.startswith("suffixcache/_native") and n.endswith(".so") for n in names)
    for module in (
        "suffixcache/drafter.py",
        "suffixd/daemon/server/serve.py",
        "suffixd/client/__init__.py",
        "suffixd/cli/main.py",
        "suffixd/benchkit/workloads.py",
        "suffixd/v1/suffixd_pb2.py",
        # the dashboard's files (package-data: the page must work offline)
        "suffixd/daemon/http_api/dashboard_static/dashboard.css",
        "suffixd/daemon/http_api/dashboard_static/dashboard.js",
        "suffixd/daemon/http_api/dashboard_static/favicon.svg",
    ):
        assert module in names, module
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "suffixd = suffixd.cli.main:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
