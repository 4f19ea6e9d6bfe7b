"""Mistakes a newcomer makes, through the real CLI: one clear line each, no traceback."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from suffixd.cli.main import main


def suffixd(*args: str, timeout: float = 60, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "suffixd.cli.main", *args],
                          capture_output=True, text=True, timeout=timeout, **kw)


def one_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


@pytest.fixture
def busy_port() -> Any:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["--model", "{tmp}/notagguf.json"], "not a GGUF model file"),
        (["--model", "{tmp}/missing.gguf"], "No such file"),
        (["--draft-model", "{tmp}/notagguf.json"], "not a GGUF model file"),
        (["--listen", "nowhere"], "expected unix:PATH or HOST:PORT"),
        (["--listen", "127.0.0.1:0"], "needs a bearer token"),
        (["--metrics-addr", "localhost:http"], "expected HOST:PORT"),
        (["--listen", "127.0.0.1:{port}", "--insecure"], "the port is in use"),
        (["--metrics-addr", "127.0.0.1:{port}"], "the port is in use"),
    ],
    ids=["model-json", "model-missing", "draft-json", "listen", "tcp-token", "metrics-addr",
         "port-taken", "metrics-port-taken"],
)
def test_serve_mistakes_fail_in_one_line_before_loading(
    tmp_path: Path, busy_port: int, args: list[str], expect: str
) -> None:
    (tmp_path / "notagguf.json").write_text("{}")
    data = tmp_path / "data"
    argv = [a.format(tmp=tmp_path, port=busy_port) for a in args]
    out = suffixd("serve", "--data-dir", str(data), *argv)
    assert out.returncode == 2, out
    line = one_line(out.stderr)
    assert line.startswith("suffixd serve: error: ") and expect in line, line
    # Checked before the engine opened its store (before the model loads and the trees
    # rebuild), not after.
    assert not (data / "store").exists()


@pytest.mark.parametrize("command", [["stats"], ["sessions", "list"], ["generate", "hi"],
                                     ["sessions", "show", "ns", "s1"]])
def test_daemon_not_running_reads_the_same_everywhere(tmp_path: Path, command: list[str]) -> None:
    out = suffixd(*command, "--data-dir", str(tmp_path / "nobody"))
    assert out.returncode == 1
    line = one_line(out.stderr)
    assert line == (f"Error: the daemon is not running at {tmp_path / 'nobody' / 'suffixd.sock'}"
                    " (start it with `suffixd serve`, or point --address/--socket/--data-dir "
                    "at a running one)")
    assert out.stdout == ""


def test_stats_of_an_unknown_namespace_says_so(shared_daemon: Any) -> None:
    with shared_daemon.session("known-ns") as s:
        s.append([1, 2, 3], kind="prompt")
    runner = CliRunner()
    bad = runner.invoke(main, ["stats", "-n", "nosuchns", "--address", shared_daemon.target])
    assert bad.exit_code == 1
    line = one_line(bad.output)
    assert "unknown namespace 'nosuchns'" in line and "known-ns" in line
    good = runner.invoke(main, ["stats", "-n", "known-ns", "--address", shared_daemon.target])
    assert good.exit_code == 0 and "namespace known-ns" in good.output
    assert "speculate calls" in good.output


def test_warm_into_a_pipe_has_no_progress_frames(shared_daemon: Any, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "q.sql").write_text("SELECT name FROM singer WHERE age > 30;\n")
    out = suffixd("warm", "--corpus", str(corpus), "-n", "pipe",
                  "--address", shared_daemon.target)
    assert out.returncode == 0, out.stderr
    assert "\r" not in out.stderr and "warming" not in out.stderr  # tqdm stays off
    assert out.stdout.startswith("1 file scanned: 1 warmed,"), out.stdout


def test_a_restart_without_metrics_removes_the_old_address(daemon_factory: Any,
                                                           tmp_path: Path) -> None:
    data = tmp_path / "m"
    proc = daemon_factory(data_dir=data, args=["--metrics-addr", "127.0.0.1:0"])
    assert (data / "metrics.addr").read_text().startswith("127.0.0.1:")
    proc.stop()
    daemon_factory(data_dir=data)
    assert not (data / "metrics.addr").exists()
