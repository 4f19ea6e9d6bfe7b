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


# --------------------------------------------------------------------------- refusals


def _state(c: Any) -> tuple[Any, ...]:
    """What a refused request must not change: the open sessions, the namespaces holding
    state with their trees and counters, the session trees' memory."""
    stats = c.stats()
    namespaces = sorted((n.get("namespace"), json.dumps(n, sort_keys=True, default=str))
                        for n in stats["namespaces"])
    sessions = [(s.namespace, s.session_id, s.tokens) for s in c.list_sessions()]
    memory = json.dumps(stats.get("memory"), sort_keys=True, default=str)
    return namespaces, sessions, memory


def test_a_refused_generation_leaves_nothing_behind(daemon_factory: Any) -> None:
    """Refused for its context (400 context_length_exceeded / INVALID_ARGUMENT) or for a
    session budget (429 / RESOURCE_EXHAUSTED), by either front, named session, automatic
    session or one-off: no session opened, no token in any tree, no record (still none
    after a restart)."""
    from suffixd.client import InvalidArgumentError, ResourceExhaustedError

    args = ["--http", "127.0.0.1:0", "--ctx-size", "256", "--max-session-tokens", "150",
            "--threads", "1", "--kv-slots", "2"]
    proc = daemon_factory(args=args)
    c = proc.client()
    base = proc.http.removesuffix("/v1")
    # the model loads on this first (refused) request; nothing else is there yet
    before = _state(c)
    assert before[1] == []
    too_long = list(range(1000, 1400))  # 400 tokens: over the 256-token context
    over_budget = list(range(1000, 1200))  # 200: fits the context, not the session budget
    h = {"X-Suffixd-Namespace": "refused"}
    chat_long = {"messages": [{"role": "user", "content": "hello " * 400}], "max_tokens": 4}
    chat_budget = {"messages": [{"role": "user", "content": "hi " * 170}], "max_tokens": 4}
    for path, body, headers, status, code in [
        ("/v1/chat/completions", chat_long, h, 400, "context_length_exceeded"),  # automatic
        ("/v1/chat/completions", {**chat_long, "stream": True}, h, 400,
         "context_length_exceeded"),
        ("/v1/chat/completions", chat_long, {**h, "X-Suffixd-Session": "named"}, 400,
         "context_length_exceeded"),
        ("/v1/completions", {"prompt": too_long, "max_tokens": 4}, h, 400,
         "context_length_exceeded"),  # one-off
        ("/v1/completions", {"prompt": too_long, "max_tokens": 4},
         {**h, "X-Suffixd-Session": "named"}, 400, "context_length_exceeded"),
        ("/v1/completions", {"prompt": over_budget, "max_tokens": 4},
         {**h, "X-Suffixd-Session": "budget"}, 429, None),
        ("/v1/chat/completions", chat_budget, h, 429, None),  # automatic, over the budget
    ]:
        r = _post(base, path, body, headers=headers)
        assert r.status_code == status, (path, body.get("stream"), r.text)
        err = r.json()["error"]
        assert code is None or err["code"] == code, err
    for session, tokens, error in [("g1", too_long, InvalidArgumentError),
                                   (None, too_long, InvalidArgumentError),
                                   ("g2", over_budget, ResourceExhaustedError)]:
        with pytest.raises(error):
            list(c.generate(session, tokens=tokens, namespace="refused", max_tokens=4,
                            timeout=120))
    assert _state(c) == before
    assert "Traceback" not in proc.log()
    c.close()
    proc.stop()
    # nothing was stored either
    again = daemon_factory(data_dir=proc.data_dir, args=args)
    c = again.client()
    assert c.list_sessions() == []
    assert "refused" not in [n.get("namespace") for n in c.stats()["namespaces"]]
    c.close()


# --------------------------------------------------------------------------- full disk

from tests.test_hardening import fill  # noqa: E402
from tests.test_hardening import small_tmpfs as small_tmpfs  # noqa: E402  (the fixture)


def test_a_durable_step_refused_for_a_full_disk_applies_nothing(daemon_factory: Any,
                                                                small_tmpfs: Path) -> None:
    """A durable SpeculateStream step whose commit fails (a full tmpfs under the data dir)
    is refused in the right words and leaves the session as it was: its tree drafts
    nothing of it, later appends are accepted on top of what was stored, and after a
    restart the record and the stored transcript are exactly what was acknowledged."""
    from suffixd.client import ResourceExhaustedError

    data = small_tmpfs / "data"
    args = ["--model", "none"]
    log = small_tmpfs.parent / "daemon.log"  # not on the disk that fills
    proc = daemon_factory(data_dir=data, args=args, log_path=log)
    c = proc.client()
    acked = [7, 8, 9, 10, 11, 12] * 50
    c.open_session("disk", "s", tokens=acked)
    st = c.stepper("disk", "s")
    st.step([20, 21, 22, 23])
    acked += [20, 21, 22, 23]
    filler = fill(small_tmpfs)
    # a step LMDB cannot fit into the free pages it keeps: refused, nothing of it applied
    big = [1000 + i % 5000 for i in range(300_000)]
    with pytest.raises(ResourceExhaustedError) as refused:
        st.step(big)
    msg = str(refused.value)
    assert "disk full" in msg and "deferred" not in msg, msg
    assert "not applied" in msg, msg
    info = c.describe_session("disk", "s", tail_tokens=len(acked) + 10)
    assert info.tokens == len(acked)
    assert list(info.tail) == acked
    # drafts come from what is stored only: the refused step's tokens draft nothing
    assert not c.speculate("disk", "s", big[:40], 8).tokens
    # space returns: the session takes appends on top of what was acknowledged
    filler.unlink()
    st = c.stepper("disk", "s")
    st.step([30, 31, 32])
    acked += [30, 31, 32]
    st.close()
    r = c.append("disk", "s", [40, 41], kind="tool")
    acked += [40, 41]
    assert r.session_tokens == len(acked)
    c.close()
    proc.stop()
    proc = daemon_factory(data_dir=data, args=args, log_path=log)
    c = proc.client()
    info = c.describe_session("disk", "s", tail_tokens=len(acked) + 10)
    assert info.tokens == len(acked)
    assert list(info.tail) == acked
    c.close()
    assert "Traceback" not in proc.log()


def test_a_lost_deferred_step_leaves_tree_and_record_as_stored(daemon_factory: Any,
                                                              small_tmpfs: Path) -> None:
    """A defer_commit step is acknowledged before its commit, which the full disk then
    refuses: the session goes back to what its store holds (record, tree, drafts) and
    refuses appends, the unary ones too (they used to store a record counting the lost
    tokens); a restart finds exactly what was stored."""
    from suffixd.client import ResourceExhaustedError

    data = small_tmpfs / "data"
    args = ["--model", "none"]
    log = small_tmpfs.parent / "daemon.log"
    proc = daemon_factory(data_dir=data, args=args, log_path=log)
    c = proc.client()
    acked = [7, 8, 9, 10, 11, 12] * 50
    c.open_session("disk", "s", tokens=acked)
    filler = fill(small_tmpfs)
    st = c.stepper("disk", "s", defer_commit=True)
    big = [1000 + i % 5000 for i in range(300_000)]
    st.step(big)  # acknowledged, not yet durable: its commit fails
    with pytest.raises(ResourceExhaustedError, match="failed"):
        st.close()  # the OK status would promise it was committed
    deadline = time.monotonic() + 10
    while c.describe_session("disk", "s").tokens != len(acked) and time.monotonic() < deadline:
        time.sleep(0.05)
    info = c.describe_session("disk", "s", tail_tokens=len(acked) + 10)
    assert info.tokens == len(acked) and list(info.tail) == acked
    assert not c.speculate("disk", "s", big[:40], 8).tokens
    filler.unlink()
    with pytest.raises(ResourceExhaustedError, match="close it"):
        c.append("disk", "s", [40, 41], kind="tool")
    c.close()
    proc.stop()
    proc = daemon_factory(data_dir=data, args=args, log_path=log)
    c = proc.client()
    info = c.describe_session("disk", "s", tail_tokens=len(acked) + 10)
    assert info.tokens == len(acked) and list(info.tail) == acked
    c.close()
    assert "Traceback" not in proc.log()
