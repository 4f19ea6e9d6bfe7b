"""The verifier/draft pair's benchmark plumbing (issue 48), with stubs for llama.cpp's tools
and llama-server: nothing is built, downloaded or run on a model.

bench/build_llama_server.sh's --targets, bench/make_quant_pair.py's idempotence,
bench/pair_regime.py's arithmetic, llama-server drafting with a draft model (ls-draft) and
the daemons' --draft-model (benchkit/llama_server.py, benchkit/daemons.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- build script

_STUB_PYTHON = r"""#!/usr/bin/env bash
case "$*" in
  *"import llama_cpp"*) echo 0.0.1 ;;
  *"import scikit_build_core"*) exit 0 ;;
  "-m pip download"*)
    dir="${@: -1}"
    mkdir -p "$dir/src/llama_cpp_python-0.0.1/vendor/llama.cpp"
    tar -czf "$dir/llama_cpp_python-0.0.1.tar.gz" -C "$dir/src" llama_cpp_python-0.0.1 ;;
esac
"""
# builds every --target it is given (an empty executable each) and logs the call
_STUB_CMAKE = r"""#!/usr/bin/env bash
echo "cmake $*" >> "$STUB_LOG"
if [ "$1" = --build ]; then
  dir="$2"; shift 2
  while [ $# -gt 0 ]; do
    if [ "$1" = --target ]; then
      shift
      while [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; do
        mkdir -p "$dir/bin" && touch "$dir/bin/$1" && chmod +x "$dir/bin/$1"; shift
      done
    else shift; fi
  done
fi
"""


def _build(tmp_path: Path, *args: str, env: dict[str, str] | None = None
           ) -> subprocess.CompletedProcess[str]:
    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    for name, text in (("python", _STUB_PYTHON), ("cmake", _STUB_CMAKE)):
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    full = {k: v for k, v in os.environ.items()
            if k not in ("SUFFIXD_LLAMA_TARGETS", "CMAKE_BUILD_PARALLEL_LEVEL")}
    full.update({"PYTHON": str(stubs / "python"), "STUB_LOG": str(tmp_path / "log"),
                 "PATH": f"{stubs}:{os.environ['PATH']}", **(env or {})})
    return subprocess.run(["bash", str(ROOT / "bench" / "build_llama_server.sh"), *args,
                           str(tmp_path / "build")], env=full, capture_output=True, text=True,
                          timeout=60)


def test_build_script_builds_the_targets_asked_for_and_prints_each_path(tmp_path: Path) -> None:
    r = _build(tmp_path, "--targets", "llama-quantize llama-bench")
    assert r.returncode == 0, r.stderr
    paths = r.stdout.split()
    assert [Path(p).name for p in paths] == ["llama-quantize", "llama-bench"]
    assert all(os.access(p, os.X_OK) for p in paths)
    builds = [c for c in (tmp_path / "log").read_text().splitlines() if " --build " in c]
    assert len(builds) == 1 and "--target llama-quantize llama-bench" in builds[0]
    # llama-server still the default (its path alone on stdout); only it is built now
    r = _build(tmp_path)
    assert r.returncode == 0 and Path(r.stdout.strip()).name == "llama-server"
    builds = [c for c in (tmp_path / "log").read_text().splitlines() if " --build " in c]
    assert len(builds) == 2 and builds[1].endswith("--target llama-server -j 2")
    # everything built: reused, nothing compiled, the paths in the order asked
    r = _build(tmp_path, env={"SUFFIXD_LLAMA_TARGETS": "llama-bench llama-server"})
    assert r.returncode == 0 and "reusing" in r.stderr
    assert [Path(p).name for p in r.stdout.split()] == ["llama-bench", "llama-server"]
    assert len([c for c in (tmp_path / "log").read_text().splitlines()
                if " --build " in c]) == 2


# --------------------------------------------------------------------------- quant pair


def test_make_quant_pair_makes_each_verifier_once(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp")
    mq = _load("make_quant_pair")
    calls = tmp_path / "calls"
    quantize = tmp_path / "llama-quantize"
    # writes "<type> of <source>" to the output, as llama-quantize writes its GGUF
    quantize.write_text(f"#!{sys.executable}\nimport sys\n"
                        f"open({str(calls)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
                        "open(sys.argv[3], 'w').write(sys.argv[4] + ' of ' + sys.argv[2])\n")
    quantize.chmod(0o755)
    source = tmp_path / "gemma-3-270m-q4_k_m.gguf"
    source.write_bytes(b"q4")
    out = tmp_path / "pair"
    out.mkdir()
    f16 = mq.make(quantize, source, out, "F16", 2)
    assert f16 == out / "gemma-3-270m-f16.gguf"
    assert f16.read_text() == f"F16 of {source}"
    assert calls.read_text().split() == ["--allow-requantize", str(source),
                                         str(out / "gemma-3-270m-f16.gguf.part"), "F16", "2"]
    assert json.loads(f16.with_name(f16.name + ".json").read_text())["type"] == "F16"
    assert mq.make(quantize, source, out, "F16", 2) == f16  # kept: not made again
    assert len(calls.read_text().splitlines()) == 1
    source.write_bytes(b"another q4")  # another source: made again
    mq.make(quantize, source, out, "F16", 2)
    assert len(calls.read_text().splitlines()) == 2
    assert not list(out.glob("*.part"))


# --------------------------------------------------------------------------- regime


def test_the_fit_and_the_break_even_acceptance() -> None:
    pr = _load("pair_regime")
    one = 0.010
    exact = {1: one, **{k: one * (1 + 0.05 * k) for k in (2, 4, 8, 16)}}
    assert pr.fit_slope(exact, one) == pytest.approx(0.05)
    assert pr.fit_slope({1: one}, one) is None
    # a verifier whose extra rows are nearly free and a draft at a tenth of its cost:
    # the draft model pays at a modest acceptance; at a draft as dear as the verifier never
    cheap, _ = pr.break_even(exact, 0.1 * one)
    assert cheap is not None and 0 < cheap < 0.5
    dear, plans = pr.break_even(exact, 1.0 * one)
    assert dear is None and all(k == 0 for k, _ in plans.values())
    # rows that cost a whole decode each leave less room: a higher acceptance is needed
    steep = {k: one * k for k in (1, 2, 4, 8, 16)}
    assert pr.break_even(steep, 0.1 * one)[0] is None


def test_model_table_lists_both_measurements_in_decodes() -> None:
    pr = _load("pair_regime")
    m = {"f16.gguf": {"bytes": 542_000_000,
                      "llama_bench": {"decode_s": 0.02, "k_rows_s": {1: 0.02, 4: 0.03}},
                      "suffixd": {"decode_s": 0.02, "k_rows_s": {1: 0.02, 4: 0.04}}}}
    lines = pr.model_table(m, [1, 4])
    assert len(lines) == 4 and lines[2].startswith("| f16.gguf | 542 | llama-bench")
    assert "30.00 (1.50)" in lines[2] and "40.00 (2.00)" in lines[3]
    assert all(line.count("|") == lines[0].count("|") for line in lines)


# --------------------------------------------------------------------------- servers

_FAKE_SERVER = """
import http.server, json, sys
argv = sys.argv[1:]
with open(sys.argv[0] + ".calls", "a") as f:
    f.write(json.dumps(argv) + "\\n")
port = int(argv[argv.index("--port") + 1])

class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *a):
        pass

http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def test_llama_server_drafts_with_a_draft_model_as_ls_draft(tmp_path: Path) -> None:
    from suffixd.benchkit.llama_server import DRAFT_SPEC_TYPE, draft_server_args, start_servers

    binary = tmp_path / "llama-server"
    binary.write_text(f"#!{sys.executable}\n{_FAKE_SERVER}")
    binary.chmod(0o755)
    draft = tmp_path / "draft.gguf"
    assert draft_server_args(draft) == ["-md", str(draft)]
    assert draft_server_args(draft, 5) == ["-md", str(draft), "--spec-draft-n-max", "5"]
    servers = start_servers(binary, tmp_path / "f16.gguf", threads=1, n_ctx=256,
                            spec_types_wanted="ngram-mod", flash_attn="auto",
                            n_parallel=2, extra_args=["--x"], draft_model=draft,
                            draft_max=5)
    try:
        assert sorted(servers) == ["ls-draft", "ls-ngram-mod", "ls-plain"]
    finally:
        for srv in servers.values():
            srv.close()
    calls = {}
    for line in (tmp_path / "llama-server.calls").read_text().splitlines():
        argv = json.loads(line)
        spec = argv[argv.index("--spec-type") + 1] if "--spec-type" in argv else None
        calls[spec] = argv
    assert set(calls) == {None, "ngram-mod", DRAFT_SPEC_TYPE}
    drafting = calls[DRAFT_SPEC_TYPE]
    assert drafting[drafting.index("-md") + 1] == str(draft)
    assert drafting[drafting.index("--spec-draft-n-max") + 1] == "5"
    assert drafting[drafting.index("-np") + 1] == "2" and "--x" in drafting
    assert all("-md" not in calls[s] for s in (None, "ngram-mod"))


def test_llama_server_without_a_draft_model_is_as_before(tmp_path: Path) -> None:
    from suffixd.benchkit import llama_server

    started: list[dict[str, Any]] = []

    class Fake:
        def __init__(self, *a: Any, **kw: Any) -> None:
            started.append(kw)

        def wait_ready(self) -> None:
            pass

    orig = llama_server.LlamaServer
    llama_server.LlamaServer = Fake  # type: ignore[misc, assignment]
    try:
        servers = llama_server.start_servers("ls", "m.gguf", threads=1, n_ctx=0,
                                             spec_types_wanted="ngram-mod", flash_attn="both")
    finally:
        llama_server.LlamaServer = orig  # type: ignore[misc]
    assert list(servers) == ["ls-plain", "ls-ngram-mod", "ls-plain-fa-off",
                             "ls-ngram-mod-fa-off"]
    assert all(list(kw["extra_args"]) == [] for kw in started)


def test_the_daemons_get_the_draft_model(monkeypatch: pytest.MonkeyPatch,
                                         tmp_path: Path) -> None:
    from suffixd.benchkit import daemons as bench_http

    seen: list[list[str]] = []

    class Daemon:
        def __init__(self, data_dir: Path, args: list[str], log_path: Path) -> None:
            seen.append(args)

        def start(self, timeout: float) -> Daemon:
            return self

    monkeypatch.setattr(bench_http, "LocalDaemon", Daemon)
    bench_http.start_daemon(tmp_path / "d", "f16.gguf", 2, 4096, extra_args=["--y"],
                            draft_model=tmp_path / "q4.gguf")
    bench_http.start_daemon(tmp_path / "d", None, 2, 4096)
    assert seen[0][seen[0].index("--draft-model") + 1] == str(tmp_path / "q4.gguf")
    assert seen[0][seen[0].index("--model") + 1] == "f16.gguf" and "--y" in seen[0]
    assert "--draft-model" not in seen[1]
