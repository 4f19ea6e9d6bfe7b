"""A stop under load (issue 44, items 6 and 12), through the real daemon on the embedded
model: SIGTERM with generations in flight ends them at their next step and exits within
the stop timeout (10 s by default, Kubernetes' grace period is 30), exit code 0, every
client told the daemon is stopping (a final SSE error event, a 503, gRPC UNAVAILABLE),
no ERROR or traceback in the log, and what was acknowledged still stored. Before, the
stop waited 10 s for the generations to finish on their own first (46 s in the report,
with 500s, four tracebacks and the generations left running until "a thread was still
inside llama.cpp")."""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import DaemonProcess, wait_health

STOP_BOUND_S = 10.0  # serve --stop-timeout's default


class Streamed:
    """One streamed chat completion on a thread of its own: its status, its data events
    (parsed; "[DONE]" as is) and the exception that ended it, if one did."""

    def __init__(self, proc: DaemonProcess, seed: int, started: threading.Barrier) -> None:
        self.status = 0
        self.events: list[Any] = []
        self.body = b""
        self.error: BaseException | None = None
        self._proc, self._seed, self._started = proc, seed, started
        self._reached = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            with httpx.stream("POST", f"{self._proc.http}/chat/completions", timeout=120,
                              json={"model": "default", "stream": True, "max_tokens": 4000,
                                    "ignore_eos": True, "temperature": 1.0,
                                    "seed": self._seed, "messages": [
                                        {"role": "user",
                                         "content": f"Tell story number {self._seed}."}]}
                              ) as r:
                self.status = r.status_code
                if r.status_code != 200:
                    self.body = r.read()
                    return
                for line in r.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line.removeprefix("data: ")
                    self.events.append(data if data == "[DONE]" else json.loads(data))
                    if len(self.events) == 3:  # a few steps in: the generation runs
                        self._reached = True
                        self._started.wait(120)
        except BaseException as exc:  # noqa: BLE001 - what ended it is the finding
            self.error = exc
        finally:
            if not self._reached:
                self._started.abort()  # never leave the test waiting for this one

    def clean_end(self) -> str:
        """How it ended, or AssertionError: a stream ends with a final error or finish
        event and [DONE], never a cut connection; a refused request with a 503."""
        assert self.error is None, f"the stream was cut: {self.error!r} after {self.events}"
        if self.status != 200:
            assert self.status == 503, (self.status, self.body)
            assert json.loads(self.body)["error"]["type"] == "unavailable_error", self.body
            return "503"
        assert self.events and self.events[-1] == "[DONE]", self.events[-3:]
        last = self.events[-2]
        if "error" in last:
            err = last["error"]
            assert err["message"] == "the daemon is stopping", last
            assert err["type"] == "unavailable_error" and err["code"] == "daemon_stopping", last
            return "error event"
        assert last["choices"][0]["finish_reason"] is not None, last
        return "finished"


def _sigterm(proc: DaemonProcess, limit: float = 60.0) -> tuple[int, float]:
    """SIGTERM; the exit code and how long the exit took."""
    assert proc.proc is not None
    t0 = time.monotonic()
    proc.proc.send_signal(signal.SIGTERM)
    rc = proc.proc.wait(limit)
    return rc, time.monotonic() - t0


def _settled(log: Path, threads: list[threading.Thread], rc: int, took: float,
             bound: float) -> str:
    """After a stop: the clients' threads joined, the exit checked (0, within ``bound``
    seconds); the daemon's log."""
    for t in threads:
        t.join(30)
    text = log.read_text(errors="replace")
    assert rc == 0, text[-3000:]
    assert took < bound, (took, text[-3000:])
    return text


def _assert_quiet_log(text: str) -> None:
    """An ordinary stop: "stopped", and no error, traceback or abandoned thread."""
    assert "stopped" in text, text[-3000:]
    assert "Traceback" not in text, text[-6000:]
    bad = [line for line in text.splitlines()
           if re.search(r"\bERROR\b", line) or "abandoned" in line]
    assert not bad, "\n".join(bad)


def test_sigterm_ends_streamed_generations_promptly(tmp_path: Path) -> None:
    """Four streamed chat completions, thousands of tokens each, in flight: SIGTERM ends
    the daemon within the 10 s bound, exit code 0, each stream ends with a final error
    event saying the daemon is stopping (then [DONE]), and the log holds no ERROR nor
    traceback. Before, the stop first waited 10 s for them to finish on their own."""
    log = tmp_path / "daemon.log"
    proc = DaemonProcess(tmp_path / "data", ["--http", "127.0.0.1:0", "--model-load", "startup"],
                         log_path=log).start()
    try:
        wait_health(proc)
        started = threading.Barrier(5)
        streams = [Streamed(proc, seed, started) for seed in range(4)]
        started.wait(180)  # every one a few steps into its generation
        time.sleep(0.5)
        rc, took = _sigterm(proc)
    finally:
        proc.kill9()
        proc.stop()
    text = _settled(log, [s.thread for s in streams], rc, took, STOP_BOUND_S)
    ends = [s.clean_end() for s in streams]
    assert ends == ["error event"] * 4, ends  # ignore_eos, 4,000 tokens: none finished
    _assert_quiet_log(text)


def test_sigterm_answers_every_front_and_keeps_acknowledged_data(tmp_path: Path) -> None:
    """With --stop-timeout 5 and a generation of each kind in flight (streamed and not
    over HTTP, gRPC Generate): the exit comes within 5 s; the answer that was not
    streamed is a 503 with an OpenAI error object, the gRPC stream ends UNAVAILABLE with
    the reason, the stream with its final error event; a session appended before is whole
    after a restart."""
    from suffixd.client.errors import UnavailableError

    data = tmp_path / "data"
    log = tmp_path / "daemon.log"
    proc = DaemonProcess(data, ["--http", "127.0.0.1:0", "--model-load", "startup",
                                "--stop-timeout", "5"], log_path=log).start()
    kept = [(i * 37) % 900 + 20 for i in range(300)]
    whole: dict[str, Any] = {}
    grpc_end: dict[str, Any] = {}
    grpc_going = threading.Event()
    try:
        wait_health(proc)
        with proc.client() as c:
            c.open_session("keep", "s", tokens=kept[:100])
            c.append("keep", "s", kept[100:])  # acknowledged: durable from here on

        def not_streamed() -> None:
            try:
                whole["r"] = httpx.post(f"{proc.http}/completions", timeout=120, json={
                    "model": "default", "prompt": "SELECT name FROM singer WHERE",
                    "max_tokens": 4000, "ignore_eos": True, "temperature": 1.0, "seed": 3})
            except BaseException as exc:  # noqa: BLE001
                whole["error"] = exc

        def over_grpc() -> None:
            try:
                with proc.client() as c:
                    for n, _ in enumerate(c.generate("g", prompt="The story of a cat:",
                                                     max_tokens=4000, ignore_eos=True,
                                                     temperature=1.0, seed=5)):
                        if n == 3:
                            grpc_going.set()
                grpc_end["finished"] = True
            except BaseException as exc:  # noqa: BLE001
                grpc_end["error"] = exc
            finally:
                grpc_going.set()

        threads = [threading.Thread(target=f, daemon=True) for f in (not_streamed, over_grpc)]
        for t in threads:
            t.start()
        started = threading.Barrier(2)
        stream = Streamed(proc, 1, started)
        started.wait(180)
        assert grpc_going.wait(180)
        time.sleep(0.5)
        rc, took = _sigterm(proc)
    finally:
        proc.kill9()
        proc.stop()
    text = _settled(log, [*threads, stream.thread], rc, took, 5.0)
    assert stream.clean_end() == "error event"
    assert "error" not in whole, whole
    r = whole["r"]
    assert r.status_code == 503, r.text
    assert r.json()["error"] == {"message": "the daemon is stopping", "type": "unavailable_error",
                                 "param": None, "code": "daemon_stopping"}, r.text
    err = grpc_end.get("error")
    assert isinstance(err, UnavailableError), grpc_end
    assert "the daemon is stopping" in str(err), err
    _assert_quiet_log(text)
    again = DaemonProcess(data, log_path=tmp_path / "again.log").start()
    try:
        with again.client() as c:
            info = c.describe_session("keep", "s", tail_tokens=len(kept))
            assert info.tokens == len(kept) and info.tail == kept
    finally:
        assert again.stop() == 0


@pytest.mark.parametrize("timeout", ["0"])
def test_past_the_stop_timeout_what_runs_is_abandoned(tmp_path: Path, timeout: str) -> None:
    """--stop-timeout 0: the process exits at once with generations in flight, exit code
    0, one WARNING naming what it abandoned; what was acknowledged is still stored."""
    data = tmp_path / "data"
    log = tmp_path / "daemon.log"
    proc = DaemonProcess(data, ["--http", "127.0.0.1:0", "--model-load", "startup",
                                "--stop-timeout", timeout], log_path=log).start()
    kept = [(i * 41) % 900 + 20 for i in range(200)]
    try:
        wait_health(proc)
        with proc.client() as c:
            c.open_session("keep", "s", tokens=kept[:50])
            c.append("keep", "s", kept[50:])
        started = threading.Barrier(3)
        streams = [Streamed(proc, seed, started) for seed in range(2)]
        started.wait(180)
        rc, took = _sigterm(proc)
    finally:
        proc.kill9()
        proc.stop()
    text = _settled(log, [s.thread for s in streams], rc, took, 3.0)
    warnings = [line for line in text.splitlines() if " WARNING " in line and "abandoned" in line]
    assert len(warnings) == 1, text[-3000:]
    w = warnings[0]
    assert "stop timeout (0 s) passed" in w, w
    # What it names depends on how far the stop got before the watchdog thread ran: the
    # generations still running, or (the main thread first on a loaded machine, seen on
    # AVX2 kernels beside a soak) the rest of a stop already past them.
    assert "generation" in w or ("abandoned the rest of the stop" in w
                                 and "while ending the generations" not in w), w
    again = DaemonProcess(data, log_path=tmp_path / "again.log").start()
    try:
        with again.client() as c:
            info = c.describe_session("keep", "s", tail_tokens=len(kept))
            assert info.tokens == len(kept) and info.tail == kept
    finally:
        assert again.stop() == 0
