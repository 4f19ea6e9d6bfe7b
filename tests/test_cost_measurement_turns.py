"""The cost measurement never holds up a request, whatever the number of KV slots.

A request counts as waiting from before it takes its KV slot, and the measurement times
each batch only once no request is waiting. A measurement that held the scratch slot
while it waited for that turn deadlocked a daemon with one slot on its first request
(issue 44): the request waited for the slot, the measurement for the request. Real model,
real measurement, every slot count from 1 up; and the daemon itself with ``--kv-slots 1``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from suffixd.daemon.generation.cost_measure import MeasurementStopped
from suffixd.daemon.generation.verifier import GenerateParams, Verifier
from suffixd.daemon.model import embedded_model_path

from tests.conftest import THREADS, DaemonProcess

# tests/conftest.py: every daemon here measures its costs (the tests are about that)
DAEMONS_MEASURE = True

ANSWER_S = 60.0  # a 16-token answer takes well under a second here; a deadlock is forever


@pytest.fixture(params=[1, 2, 3], ids=lambda n: f"{n}-slots")
def verifier(request: pytest.FixtureRequest) -> Iterator[Verifier]:
    v = Verifier(embedded_model_path(), n_ctx=1024, n_threads=THREADS, n_slots=request.param)
    yield v
    v.close()


def _measuring(v: Verifier) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            v.measure_cost_profile(reps=50, max_rounds=50)  # far longer than the test
        except MeasurementStopped:
            pass
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while v.measured_batches < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert v.measured_batches >= 3, "the measurement did not start"
    return t, errors


def test_requests_during_the_measurement_are_answered(verifier: Verifier) -> None:
    measurement, errors = _measuring(verifier)
    try:
        prompt = [verifier.bos_token] + list(range(300, 340))
        for i in range(3):  # each request arrives while the measurement is mid-round
            done: list[int] = []

            def generate(key: str = f"s{i}", done: list[int] = done) -> None:
                for c in verifier.generate(key, prompt, GenerateParams(max_tokens=16,
                                                                       ignore_eos=True)):
                    done.extend(c.tokens)

            t = threading.Thread(target=generate, daemon=True)
            t.start()
            t.join(ANSWER_S)
            assert not t.is_alive(), (
                f"request {i} unanswered in {ANSWER_S:.0f} s with {verifier.n_slots} slot(s) "
                f"during the cost measurement")
            assert len(done) == 16
            batches = verifier.measured_batches
            deadline = time.monotonic() + 30
            while verifier.measured_batches == batches and time.monotonic() < deadline:
                time.sleep(0.01)
            assert verifier.measured_batches > batches, "the measurement did not go on"
    finally:
        verifier.stop_measuring()
        measurement.join(30)
    assert not measurement.is_alive() and not errors, errors


def test_a_single_slot_daemon_answers_during_its_first_measurement(tmp_path: Path) -> None:
    """`suffixd serve --kv-slots 1 --http` on a fresh data dir (no stored profile): the
    first chat request is answered while the costs are measured."""
    d = DaemonProcess(tmp_path / "data", ["--kv-slots", "1", "--http", "127.0.0.1:0",
                                          "--model-load", "startup"],
                      env={"SUFFIXD_COST_ROUNDS": "20"}).start()
    try:
        assert d.http is not None
        with httpx.Client(base_url=d.http, timeout=ANSWER_S) as http:
            for i in range(2):
                r = http.post("/chat/completions", json={
                    "model": "default", "max_tokens": 8, "temperature": 0,
                    "messages": [{"role": "user", "content": f"Count to {i + 3}."}]})
                assert r.status_code == 200, r.text
        assert "verifier costs measured" not in d.log(), "measured before the request came"
    finally:
        d.stop()
