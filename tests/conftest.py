"""Shared fixtures.

``daemon``          a real ``suffixd serve`` subprocess (embedded gemma tokenizer, real LMDB)
                    on a fresh data dir and Unix socket; yields a connected sync Client.
                    The process handle is ``daemon.proc`` (a DaemonProcess).
``daemon_factory``  start more daemons (other data dirs, TCP listeners, extra args);
                    all are stopped at teardown.
``shared_daemon``   one daemon for the whole test session (for tests that only read or use
                    their own namespace); do not kill it.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from suffixd.client.launch import LocalDaemon

# Runs argv[2:] in place of itself once the kernel will SIGTERM it when the test process
# dies (prctl PR_SET_PDEATHSIG = 1): a test process that crashes skips the fixtures'
# teardown, and a daemon left behind would hold its model, port and CPU for good.
_DIES_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGTERM)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(1)  # the parent died before prctl\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def dies_with_parent(cmd: Sequence[str]) -> list[str]:
    """``cmd``, started so that it ends when this process does (Linux; as is elsewhere).
    The process keeps its pid: the wrapper execs it."""
    if not sys.platform.startswith("linux"):
        return list(cmd)
    return [sys.executable, "-c", _DIES_WITH_PARENT, str(os.getpid()), *cmd]


IN_CI = os.environ.get("CI") == "true"
# One round of every cost measurement, in this process too (the benchmarks' CLI runs
# in-process: five rounds took a minute of each bench test): a tenth of the CPU, a noisier
# profile. Tests of the measurement itself say how many rounds they want.
os.environ.setdefault("SUFFIXD_COST_ROUNDS", "1")
# llama.cpp threads per model, in this process and the daemons and benchmarks it starts
# (serve's and bench's --threads read SUFFIXD_THREADS). pytest-xdist runs one test process
# per core (pyproject's addopts): two pools of two threads on two cores slow each other
# down many times over, so each worker takes its share of the cores (at most 2, what the
# tests were written for).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
THREADS = max(1, min(2, (os.cpu_count() or 2) // _WORKERS))
os.environ["SUFFIXD_THREADS"] = str(THREADS)


def missing_tool(message: str) -> None:
    """A tool the test needs is not installed: a skip that says so on a developer's
    machine, a failure in CI (``.ci/run`` installs every tool, so a skip there would hide a
    broken install step)."""
    if IN_CI:
        pytest.fail(f"{message} (CI=true: .ci/run should have installed it)", pytrace=False)
    pytest.skip(message)


# The tiers, cheapest first (`pytest -m unit` in seconds; CI runs them all, in this order,
# so a broken data structure fails before the daemons start): what a test needs decides
# its tier, read off the test rather than kept by hand.
TIERS = ("unit", "model", "daemon", "fleet", "browser")
_DAEMON_FIXTURES = {"daemon", "daemon_factory", "shared_daemon"}


def _tier(item: pytest.Item) -> str:
    module = getattr(item, "module", None)
    names = set(vars(module)) if module is not None else set()
    if "TIER" in names:  # what a module's imports do not show (a daemon the CLI starts)
        return str(module.TIER)
    if module is not None and module.__name__.endswith("test_dashboard_browser"):
        return "browser"
    if any("redis-server" in m.args for m in item.iter_markers("needs_binary")):
        return "fleet"
    fixtures = set(getattr(item, "fixturenames", ()))
    if fixtures & _DAEMON_FIXTURES or "DaemonProcess" in names:
        return "daemon"
    if names & {"Verifier", "embedded_model_path", "Engine", "Runtime", "Generation"}:
        return "model"
    return "unit"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tier_of = {}
    for item in items:
        tier_of[item.nodeid] = tier = _tier(item)
        item.add_marker(getattr(pytest.mark, tier))
    items.sort(key=lambda it: TIERS.index(tier_of[it.nodeid]))


def _kernels() -> str:
    """Which llama.cpp kernels the model tests run on (they differ by CPU and build)."""
    try:
        import llama_cpp
    except ImportError:
        return "llama.cpp: not installed"
    info = llama_cpp.llama_print_system_info().decode().strip()
    return f"llama.cpp {llama_cpp.__version__} from {Path(llama_cpp.__file__).parent}: {info}"


def pytest_report_header(config: pytest.Config) -> str:
    return _kernels()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    # the header is hidden under -q (CI's command): a result is for the kernels it ran on
    terminalreporter.write_line(_kernels())


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("needs_binary"):
        absent = [name for name in mark.args if shutil.which(name) is None]
        if absent:
            missing_tool(f"{', '.join(absent)} not installed ({mark.kwargs.get('install', '')})")


class DaemonProcess(LocalDaemon):
    """A `suffixd serve` subprocess and how to reach it (suffixd.client.launch), as the
    tests run it: ended with the test process (``dies_with_parent``), the model loaded on
    first use, and its costs not measured.

    A daemon that loads the model measures its costs in the background whenever it is
    idle (one round here), seconds of CPU beside whatever the test runs: at times the test
    process's own model, and two llama.cpp thread pools on two cores slow each other down
    many times over (one test took 190 s instead of 40). So test daemons never measure
    (``SUFFIXD_COST_ROUNDS=0``: conservative costs, or what the data dir stores), except
    in a module about the measurement, which sets ``DAEMONS_MEASURE = True`` (and
    ``DAEMONS_MEASURE_SIZES = n`` where batch sizes 1 to n are all its tests need of the
    profile: the measurement's time grows with the square of the largest size).
    """

    measure_costs = False  # set per test module by the autouse fixture below
    measure_sizes: int | None = None

    def __init__(self, data_dir: Path, args: Sequence[str] = (), env: dict[str, str] | None = None,
                 log_path: Path | None = None) -> None:
        # Test daemons load the verifier on first generate, not at start-up: most never
        # generate, and a background load would cost each ~20 s of CPU. Where they measure
        # their costs, one round, not five: a tenth of the CPU.
        sizes = {"SUFFIXD_COST_SIZES": str(self.measure_sizes)} if self.measure_sizes else {}
        super().__init__(data_dir, args, {"SUFFIXD_MODEL_LOAD": "first-use",
                                          "SUFFIXD_COST_ROUNDS": "1" if self.measure_costs
                                          else "0", **sizes, **(env or {})}, log_path)

    def launch_command(self) -> list[str]:
        return dies_with_parent(self.command())

    def start(self, timeout: float = 90.0, expect_ready: bool = True) -> DaemonProcess:
        return super().start(timeout, expect_ready)

    def client(self, target: str | None = None, wait_rebuilt: bool = True,
               **kwargs: Any) -> Any:
        """A connected Client on the Unix socket by default; by default once the trees
        are rebuilt from LMDB (after a restart the daemon serves at once and rebuilds in
        the background). A TCP target without a token is not waited for: it may refuse."""
        wait = "token" in kwargs or target is None or target.startswith("unix:")
        return super().client(target or self.socket, wait_ready=wait,
                              wait_rebuilt=wait_rebuilt, **kwargs)


def wait_health(proc: DaemonProcess, timeout: float = 300.0) -> None:
    """Until the daemon's HTTP front answers /health with 200 (its model loaded)."""
    import httpx

    url = proc.health_url
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if httpx.get(url, timeout=30).status_code == 200:
            return
        time.sleep(0.1)
    raise AssertionError("/health never answered 200:\n" + proc.log())


def wait_costs_measured(client: Any, timeout: float = 900.0) -> dict[str, Any]:
    """The generator's status once its verifier costs are measured (or were stored): after
    the model loads, generation is served at once and the costs are measured on a thread
    of their own (daemon/generation/pipeline.py, Runtime). The model must be loading or
    loaded (a generate, or --model-load startup)."""
    deadline = time.monotonic() + timeout
    while True:
        st: dict[str, Any] = client.generator_status()
        if st["cost_profile_source"] not in ("", "measuring") or time.monotonic() > deadline:
            return st
        time.sleep(0.2)


@pytest.fixture(autouse=True, scope="module")
def _daemons_measure(request: pytest.FixtureRequest) -> Iterator[None]:
    """Autouse, module-wide (so before the module's own daemon fixtures): whether this
    module's daemons measure their costs (DaemonProcess)."""
    DaemonProcess.measure_costs = getattr(request.module, "DAEMONS_MEASURE", False)
    DaemonProcess.measure_sizes = getattr(request.module, "DAEMONS_MEASURE_SIZES", None)
    yield
    DaemonProcess.measure_costs = False
    DaemonProcess.measure_sizes = None


@pytest.fixture
def daemon_factory(tmp_path: Path) -> Iterator[Any]:
    started: list[DaemonProcess] = []

    def start(data_dir: Path | None = None, args: Sequence[str] = (), expect_ready: bool = True,
              **kw: Any) -> DaemonProcess:
        d = DaemonProcess(data_dir or tmp_path / f"data{len(started)}", args, **kw)
        started.append(d)
        return d.start(expect_ready=expect_ready)

    yield start
    for d in started:
        d.stop()


@pytest.fixture
def daemon(daemon_factory: Any) -> Iterator[Any]:
    proc = daemon_factory()
    client = proc.client()
    client.proc = proc
    yield client
    client.close()


@pytest.fixture(scope="session")
def shared_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    proc = DaemonProcess(tmp_path_factory.mktemp("shared") / "data").start()
    client = proc.client()
    client.proc = proc
    yield client
    client.close()
    proc.stop()
