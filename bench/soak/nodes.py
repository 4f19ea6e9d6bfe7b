"""The soak's daemons: ``Node`` (a ``suffixd serve`` started with suffixd.client.launch's
``LocalDaemon``, both fronts, where it stands), and when one is ready (``warm``, ``serving``).
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from suffixd.benchkit.daemons import wait_measured
from suffixd.client import Client
from suffixd.client.launch import LaunchError, LocalDaemon

ANNOUNCE_TIMEOUT = 180.0  # seconds for a (re)started daemon to announce itself


def proc_mib(pid: int, field_name: str) -> float:
    """A ``/proc/PID/status`` size (VmRSS, VmHWM) in MiB; 0 once the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class NodeError(Exception):
    """A node did not start: the soak cannot go on with it."""


@dataclass
class Node:
    """One ``suffixd serve`` and how to reach it (both fronts), and where it stands: ``up``
    once its restart has announced itself, ``ready`` once its generator is (the HTTP
    /health says 503 until then, rightly), ``epoch`` counting its stops: a call begun in
    another epoch than the one it ends in was in flight at a stop."""

    name: str
    data: Path
    log: Path
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    http: str = ""  # the OpenAI base URL, http://HOST:PORT/v1
    acked_probes: list[list[int]] = field(default_factory=list)  # it must draft these
    up: bool = False
    ready: bool = False
    epoch: int = 0
    starts: int = 0
    peak_mib: float = 0.0  # the highest VmHWM of its processes
    daemon: LocalDaemon = field(init=False)

    def __post_init__(self) -> None:
        self.daemon = LocalDaemon(self.data, ["--http", "127.0.0.1:0", *self.args],
                                  env={"SUFFIXD_MODEL_LOAD": "first-use", **self.env},
                                  log_path=self.log)

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        """The current process (``spawn()`` first)."""
        assert self.daemon.proc is not None, f"node {self.name} was never spawned"
        return self.daemon.proc

    @property
    def target(self) -> str:
        return f"unix:{self.data / 'suffixd.sock'}"

    def mark(self) -> tuple[int, bool]:
        return self.epoch, self.up

    def spawn(self) -> None:
        """Start the process; ``announced()`` says when it serves."""
        self.daemon.start(expect_ready=False)
        self.starts += 1

    def announced(self) -> bool:
        """Whether this process has written its daemon.json (it serves both fronts)."""
        if self.daemon.announced():
            self.http = self.daemon.http or ""
            return True
        return False

    def logged_since_spawn(self, needle: str) -> bool:
        return needle in self.daemon.log(since_start=True)

    def wait_announced(self) -> None:
        try:
            self.daemon.wait_announced(ANNOUNCE_TIMEOUT)
        except LaunchError as exc:
            raise NodeError(f"daemon {self.name}: {exc}") from None
        self.http = self.daemon.http or ""

    def start(self) -> None:
        self.spawn()
        self.wait_announced()

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the current process's log."""
        return self.daemon.log_tail(chars)

    def rss(self) -> float:
        return proc_mib(self.proc.pid, "VmRSS")

    def note_peak(self) -> None:
        self.peak_mib = max(self.peak_mib, proc_mib(self.proc.pid, "VmHWM"))


def serving(node: Node, timeout: float = 300.0) -> None:
    """A restarted node ready: its model loaded (a first generation) and its /health 200.
    Not its costs measured: a profile stored as measured under load is measured again in
    the gaps between requests, which a soak under full load may never leave."""
    c = Client(node.target, timeout=timeout)
    try:
        list(c.generate(None, prompt="Hello", max_tokens=2))
    finally:
        c.close()
    deadline = time.monotonic() + timeout
    while True:
        r = httpx.get(node.http.removesuffix("/v1") + "/health", timeout=30)
        if r.status_code == 200:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"/health of {node.name} still {r.status_code}: {r.text[:200]}")
        time.sleep(0.2)


def warm(node: Node) -> None:
    """The verifier loaded and its costs measured (or read back): a node is ready for the
    HTTP /health (and a measurement beside the soak's first minutes would distort it)."""
    c = Client(node.target, timeout=600)
    try:
        list(c.generate(None, prompt="Hello", max_tokens=2))
    finally:
        c.close()
    wait_measured(node.proc, node.target)
