"""Hardening, second round (issue 27): a refused request changes nothing, a durable
stream step that fails to commit leaves its session as it was, bad JSON is a 400, a
client that hangs up stops its generation, files written at start are owner-only, a
second daemon refuses before it opens the store. Through the real daemon."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest


def _post(base: str, path: str, body: Any, raw: bytes | None = None,
          headers: dict[str, str] | None = None, timeout: float = 120) -> httpx.Response:
    content = raw if raw is not None else json.dumps(body).encode()
    return httpx.post(base + path, content=content, timeout=timeout,
                      headers={"Content-Type": "application/json", **(headers or {})})


# --------------------------------------------------------------------------- JSON


def test_deep_or_broken_json_is_a_400_not_a_500(daemon_factory: Any) -> None:
    proc = daemon_factory(args=["--http", "127.0.0.1:0"])
    base = proc.http.removesuffix("/v1")
    deep = b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    cases = [
        (deep, "json_too_deep"),  # the decoder's recursion limit
        (json.dumps({"messages": [{"role": "user", "content": "x"}],
                     "metadata": json.loads("[" * 200 + "]" * 200)}).encode(),
         "json_too_deep"),  # parses, but deeper than the front reads
        (b'{"messages": [', "invalid_json"),
        (b"\xff\xfe{}", "invalid_json"),
    ]
    for raw, code in cases:
        for path in ("/v1/chat/completions", "/v1/completions"):
            r = _post(base, path, None, raw=raw)
            assert r.status_code == 400, (raw[:40], r.text)
            err = r.json()["error"]
            assert err["code"] == code and err["type"] == "invalid_request_error", err
            assert "JSON" in err["message"], err
    assert "Traceback" not in proc.log() and "RecursionError" not in proc.log()


# --------------------------------------------------------------------------- start-up


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_files_written_at_start_are_owner_only(daemon_factory: Any, tmp_path: Path) -> None:
    """daemon.json and metrics.addr are written after the owner-only pass: 0600 too, even
    under a permissive umask and over files an earlier run left world-readable."""
    data = tmp_path / "data"
    data.mkdir()
    for name in ("daemon.json", "metrics.addr", "daemon.json.tmp"):
        (data / name).write_text("{}")
        (data / name).chmod(0o644)
    old = os.umask(0o022)
    try:
        proc = daemon_factory(data_dir=data, args=["--metrics-addr", "127.0.0.1:0"])
    finally:
        os.umask(old)
    deadline = time.monotonic() + 30
    while (data / "metrics.addr").read_text() == "{}" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (data / "metrics.addr").read_text().startswith("127.0.0.1:")
    assert _mode(data / "daemon.json") == 0o600
    assert _mode(data / "metrics.addr") == 0o600
    assert {_mode(f) for f in data.rglob("*") if f.is_file()} == {0o600}, \
        {f.name: oct(_mode(f)) for f in data.rglob("*") if f.is_file()}
    proc.stop()


def test_a_second_daemon_on_a_live_socket_refuses_before_opening_its_store(
        daemon_factory: Any, tmp_path: Path) -> None:
    sock = tmp_path / "shared.sock"
    first = daemon_factory(data_dir=tmp_path / "a", args=["--listen", f"unix:{sock}"])
    second_dir = tmp_path / "b"
    t0 = time.monotonic()
    second = daemon_factory(data_dir=second_dir, args=["--listen", f"unix:{sock}"],
                            expect_ready=False)
    assert second.wait(60) != 0
    log = second.log()
    assert "running daemon" in log or "listening on" in log, log
    assert "Traceback" not in log
    # refused before the Engine: no store was created, nothing was loaded or rebuilt
    assert not (second_dir / "store").exists(), sorted(p.name for p in second_dir.iterdir())
    assert time.monotonic() - t0 < 30
    c = first.client()
    assert c.info()["version"]
    c.close()


# --------------------------------------------------------------------------- bench script

_STUB_PYTHON = r"""#!/usr/bin/env bash
echo "python $*" >> "$STUB_LOG"
case "$*" in
  *"import llama_cpp"*) echo 0.0.1 ;;
  *"import scikit_build_core"*) exit "$STUB_NO_SKBUILD" ;;
  "-m pip download"*)
    dir="${@: -1}"
    mkdir -p "$dir/src/llama_cpp_python-0.0.1/vendor/llama.cpp"
    tar -czf "$dir/llama_cpp_python-0.0.1.tar.gz" -C "$dir/src" llama_cpp_python-0.0.1 ;;
esac
"""
_STUB_CMAKE = r"""#!/usr/bin/env bash
echo "cmake $*" >> "$STUB_LOG"
if [ "$1" = --build ]; then mkdir -p "$2/bin" && touch "$2/bin/llama-server" \
  && chmod +x "$2/bin/llama-server"; fi
"""


@pytest.mark.parametrize("has_backend", [True, False])
def test_build_llama_server_says_what_it_does_and_skips_the_isolated_build(
        tmp_path: Path, has_backend: bool) -> None:
    """The script's logic with pip and cmake stubbed (nothing is downloaded or built):
    the sdist is fetched without an isolated metadata build (scikit-build-core installed
    first when missing), and every stage is announced on stderr."""
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for name, text in (("python", _STUB_PYTHON), ("cmake", _STUB_CMAKE)):
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    log = tmp_path / "calls.log"
    script = Path(__file__).resolve().parents[1] / "bench" / "build_llama_server.sh"
    env = {**os.environ, "PYTHON": str(stubs / "python"), "STUB_LOG": str(log),
           "STUB_NO_SKBUILD": "0" if has_backend else "1",
           "PATH": f"{stubs}:{os.environ['PATH']}"}
    r = subprocess.run(["bash", str(script), str(tmp_path / "build")], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("build-0.0.1/bin/llama-server")
    calls = log.read_text().splitlines()
    download = [c for c in calls if c.startswith("python -m pip download")]
    assert len(download) == 1 and "--no-build-isolation" in download[0], calls
    assert " -q" not in download[0]
    installs = [c for c in calls if c.startswith("python -m pip install")]
    assert len(installs) == (0 if has_backend else 1), calls
    said = [ln for ln in r.stderr.splitlines() if ln.startswith("build_llama_server: ")]
    assert any("downloading" in ln for ln in said), r.stderr
    assert any("configuring" in ln for ln in said) and any("building" in ln for ln in said)
    # a second run reuses the build and says so
    r = subprocess.run(["bash", str(script), str(tmp_path / "build")], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "reusing" in r.stderr
