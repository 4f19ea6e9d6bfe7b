"""Local processes to test and benchmark against: ``LocalDaemon`` (a ``suffixd serve``,
started and waited for until it announces itself) and ``RedisServer`` (a throw-away
``redis-server`` on a free loopback port); ``free_port``.

    d = LocalDaemon(data_dir, ["--http", "127.0.0.1:0"]).start()   # serving once returned
    d.target, d.listen, d.http, d.pid, d.log(), d.client()
    d.stop()                                # SIGTERM, then SIGKILL past the timeout

    r = RedisServer(workdir).start()        # answers PING once returned
    r.url; r.stop(); r.start()              # the same port again

One module for the tests (tests/conftest.py's ``DaemonProcess`` is a subclass), the
scripts in bench/ and the CLI's benchmarks (``suffixd bench http`` and its siblings), so it
lives in the installed package. It only starts processes: the daemon runs as
``python -m suffixd.cli.main serve``, so this module imports nothing of ``suffixd.cli`` or
``suffixd.daemon`` (tests/test_import_layers.py).

A daemon is ready when ``<data dir>/daemon.json`` names its pid: serve writes that file
after every listener (gRPC and ``--http``) is bound and serving, and removes it on a
clean exit. The file counts only if it names this process: a daemon killed with SIGKILL
leaves its file behind, and start() cannot always remove it (a test's read-only disk).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    from .client import Client

__all__ = ["ExitedBeforeReady", "LaunchError", "LocalDaemon", "NotReadyInTime", "RedisServer",
           "free_port"]

# How much of the log an error carries: enough for a traceback and the lines before it,
# not a long-running daemon's whole history.
LOG_TAIL_CHARS = 8000


class LaunchError(Exception):
    """A process did not come up; the message ends with its log's tail."""


class ExitedBeforeReady(LaunchError, RuntimeError):
    """It exited before it was ready (``returncode`` says how)."""

    def __init__(self, message: str, returncode: int | None) -> None:
        super().__init__(message)
        self.returncode = returncode


class NotReadyInTime(LaunchError, TimeoutError):
    """It was not ready in time (it has been killed)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 free right now (the kernel's pick; another process may
    take it before it is used, which the loopback-only tests and benchmarks accept)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalDaemon:
    """A ``suffixd serve`` subprocess on ``data_dir`` and how to reach it.

    ``args`` go after ``serve --data-dir DATA_DIR``; ``env`` is added to this process's
    environment; the log (stdout and stderr) is appended to ``log_path``, by default
    ``<data_dir>.log`` beside the data dir. ``start()`` may be called again after
    ``stop()`` or ``kill9()``: the same data dir, the same log (``log(since_start=True)``
    reads the current run's part).

    Subclasses change what runs by overriding ``command()`` (e.g. under ``taskset``) or
    ``launch_command()`` (a wrapper around the whole, as the tests' ``dies_with_parent``).
    """

    def __init__(self, data_dir: Path | str, args: Sequence[str] = (),
                 env: dict[str, str] | None = None, log_path: Path | str | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.args = list(args)
        self.env = {**os.environ, **(env or {})}
        self.log_path = (Path(log_path) if log_path is not None
                         else self.data_dir.parent / f"{self.data_dir.name}.log")
        self.proc: subprocess.Popen[bytes] | None = None
        self.listen: list[str] = []  # gRPC targets as announced: unix:PATH, HOST:PORT
        self.http: str | None = None  # the OpenAI endpoint's base URL, http://HOST:PORT/v1
        self.started_s = 0.0  # seconds from the spawn to the announcement, last start
        self._log: IO[bytes] | None = None
        self._log_offset = 0  # the log's size when this run was spawned
        self._spawned_at = 0.0
        self._announced = False  # this run's announcement seen (started_s is set)

    # -- what runs ----------------------------------------------------------------------
    def command(self) -> list[str]:
        """The serve command line."""
        return [sys.executable, "-m", "suffixd.cli.main", "serve", "--data-dir",
                str(self.data_dir), *self.args]

    def launch_command(self) -> list[str]:
        """What is spawned: ``command()`` as it is here; a subclass may wrap it."""
        return self.command()

    # -- start --------------------------------------------------------------------------
    def start(self, timeout: float = 120.0, expect_ready: bool = True) -> Self:
        """Spawn the daemon and, with ``expect_ready``, wait until it announces itself
        (``wait_announced``). Without, return at once: ``announced()`` polls, ``wait()``
        waits for an exit (a start that must fail)."""
        self._close_log()
        with contextlib.suppress(OSError):  # absent, or on a read-only disk (a test's)
            (self.data_dir / "daemon.json").unlink()
        with contextlib.suppress(OSError):  # there already, perhaps read-only
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.listen, self.http, self._announced = [], None, False
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - the daemon's, closed in stop()
        self._log_offset = self._log.tell()
        self._spawned_at = time.monotonic()
        self.proc = subprocess.Popen(self.launch_command(), stdout=self._log,
                                     stderr=subprocess.STDOUT, env=self.env)
        if expect_ready:
            self.wait_announced(timeout)
        return self

    def announced(self) -> bool:
        """Whether this run has written its daemon.json; if so, ``listen`` and ``http``
        are set from it."""
        if self.proc is None:
            return False
        try:
            info = json.loads((self.data_dir / "daemon.json").read_text())
        except (OSError, json.JSONDecodeError):  # not yet, or half written
            return False
        if not isinstance(info, dict) or info.get("pid") != self.proc.pid:
            return False  # a previous run's, left by a kill -9
        self.listen = [str(t) for t in info.get("listen", [])]
        self.http = info.get("http")
        if not self._announced:
            self._announced = True
            self.started_s = time.monotonic() - self._spawned_at
        return True

    def wait_announced(self, timeout: float = 120.0) -> Self:
        """Until the daemon serves; ``ExitedBeforeReady`` if it exits first, ``NotReadyInTime``
        (after a SIGKILL) past ``timeout``, each with the log's tail."""
        assert self.proc is not None, "start() first"
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise ExitedBeforeReady(f"suffixd serve exited with {self.proc.returncode}:\n"
                                   + self.log_tail(), self.proc.returncode)
            if self.announced():
                return self
            if time.monotonic() > deadline:
                self.kill9()
                raise NotReadyInTime(f"suffixd serve did not become ready in {timeout:g} s:\n"
                                    + self.log_tail())
            time.sleep(0.02)  # benchmarks time the start: a coarse poll would show in it

    # -- where it is --------------------------------------------------------------------
    @property
    def pid(self) -> int:
        assert self.proc is not None, "start() first"
        return self.proc.pid

    @property
    def target(self) -> str:
        """The first gRPC target announced (the Unix socket unless serve was told
        otherwise)."""
        if not self.listen:
            raise RuntimeError("the daemon has not announced itself")
        return self.listen[0]

    @property
    def socket(self) -> str:
        return next(t for t in self.listen if t.startswith("unix:"))

    @property
    def tcp(self) -> str:
        return next(t for t in self.listen if not t.startswith("unix:"))

    @property
    def health_url(self) -> str:
        """The HTTP front's ``/health`` (serve --http): 200 once generation is served."""
        if not self.http:
            raise RuntimeError("the daemon has no HTTP front (serve --http)")
        return self.http.removesuffix("/v1") + "/health"

    def client(self, target: str | None = None, *, wait_ready: bool = True,
               wait_rebuilt: bool = False, rebuilt_timeout: float = 120.0,
               **kwargs: Any) -> Client:
        """A ``Client`` on ``target`` (default: ``self.target``); ``kwargs`` go to it.
        ``wait_ready``: once it answers Info. ``wait_rebuilt``: also once the trees are
        rebuilt from LMDB (after a restart the daemon serves at once and rebuilds in the
        background), for at most ``rebuilt_timeout`` s."""
        from .client import Client

        c = Client(target or self.target, **kwargs)
        if wait_ready:
            c.wait_ready()
            deadline = time.monotonic() + rebuilt_timeout
            while wait_rebuilt and c.info().get("rebuilding") and time.monotonic() < deadline:
                time.sleep(0.05)
        return c

    # -- its log ------------------------------------------------------------------------
    def log(self, since_start: bool = False) -> str:
        """The log file, or only what the current run wrote to it."""
        try:
            with open(self.log_path, "rb") as f:
                if since_start:
                    f.seek(self._log_offset)
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        """The end of the current run's log."""
        return self.log(since_start=True)[-chars:]

    # -- stop ---------------------------------------------------------------------------
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait(self, timeout: float | None = 30.0) -> int:
        """Until it exits; its exit status (``subprocess.TimeoutExpired`` past timeout)."""
        assert self.proc is not None, "start() first"
        return self.proc.wait(timeout)

    def kill9(self) -> None:
        """SIGKILL, and reap it (a crash: no clean shutdown, daemon.json stays)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
        self._close_log()

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM and wait for the clean exit; past ``timeout``, SIGKILL. The exit status
        (None if never started)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill9()
        self._close_log()
        return self.proc.returncode

    def _close_log(self) -> None:
        if self._log is not None:
            with contextlib.suppress(OSError):
                self._log.close()
            self._log = None


class RedisServer:
    """A ``redis-server`` on a loopback port, without persistence (no RDB, no AOF: a
    fleet's state is in its stream, which the tests and benchmarks start empty). The port
    is chosen once, so ``stop()`` then ``start()`` brings the same server address back (a
    Redis outage, as the fleet sees it)."""

    def __init__(self, workdir: Path | str, port: int | None = None,
                 executable: str | None = None) -> None:
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port if port is not None else free_port()
        self.executable = executable or shutil.which("redis-server")
        self.log_path = self.dir / "redis-server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        if self.executable is None:
            raise FileNotFoundError("redis-server is not installed (apt-get install "
                                    "redis-server)")
        return [self.executable, "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(self.dir),
                "--logfile", str(self.log_path)]

    def launch_command(self) -> list[str]:
        """What is spawned: ``command()`` as it is here; a subclass may wrap it."""
        return self.command()

    def start(self, timeout: float = 10.0) -> Self:
        """Spawn it and wait until it answers PING (a raw RESP ping: the ``redis`` package
        is not needed to start one)."""
        self.proc = subprocess.Popen(self.launch_command(), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ExitedBeforeReady(f"redis-server exited with {self.proc.returncode}:\n"
                                   + self.log_tail(), self.proc.returncode)
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as c:
                    c.sendall(b"PING\r\n")
                    if c.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                pass
            time.sleep(0.02)
        self.stop()
        raise NotReadyInTime(f"redis-server did not answer in {timeout:g} s:\n" + self.log_tail())

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM and wait; past ``timeout``, SIGKILL."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def client(self) -> Any:
        """A ``redis.Redis`` on it (the ``redis`` package, a dependency of --fleet)."""
        import redis

        return redis.Redis.from_url(self.url)
