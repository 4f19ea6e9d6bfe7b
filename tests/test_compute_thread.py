"""Every llama.cpp decode of the process runs on one thread (daemon/generation/
compute_thread.py): with a pool of OpenMP workers per calling thread, libgomp sleeps at
every barrier once its threads outnumber the CPUs. Unit tests of the executor, then the
real model called from several threads: no second pool of workers appears."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
from suffixd.daemon.generation.compute_thread import ComputeThread


def test_calls_run_on_one_thread_in_order_and_return_their_results() -> None:
    ct = ComputeThread("test-compute")
    seen: list[tuple[int, int, int]] = []  # (caller, its call's index, running thread)
    results: dict[int, int] = {}

    def caller(i: int) -> None:
        for j in range(20):
            results[i * 100 + j] = ct.call(
                lambda j=j: seen.append((i, j, threading.get_ident())) or i * 100 + j)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i * 100 + j: i * 100 + j for i in range(4) for j in range(20)}
    assert len({ident for *_, ident in seen}) == 1  # one thread ran them all
    assert all(ident != t.ident for *_, ident in seen for t in threads)
    for i in range(4):  # each caller's calls in its own order
        assert [j for c, j, _ in seen if c == i] == list(range(20))


def test_an_exception_reaches_the_caller_and_the_thread_lives_on() -> None:
    ct = ComputeThread("test-compute")

    def boom() -> int:
        raise ValueError("bad batch")

    with pytest.raises(ValueError, match="bad batch"):
        ct.call(boom)
    assert ct.call(lambda: 7) == 7


def test_a_call_from_the_compute_thread_runs_at_once() -> None:
    ct = ComputeThread("test-compute")
    assert ct.call(lambda: ct.call(lambda: threading.current_thread().name)) == "test-compute"


# In a fresh interpreter: in a test worker, gRPC's own native threads (started by other
# tests) come and go and would blur the count.
_AGENTS = """
import os, threading
from suffixd.daemon.generation.verifier import GenerateParams, Verifier
from suffixd.daemon.model import embedded_model_path

def native():  # OS threads Python did not start: OpenMP's workers
    return len(os.listdir("/proc/self/task")) - threading.active_count()

# two llama.cpp threads whatever the machine: with one there are no workers to count
v = Verifier(embedded_model_path(), n_ctx=2048, n_threads=2, n_slots=4)
params = GenerateParams(max_tokens=3, ignore_eos=True, max_draft=0)
prompt = v.tokenize("SELECT name FROM singer WHERE age > 30")
list(v.generate("warm", prompt, params))
before = native()
release, done = threading.Event(), threading.Barrier(5)

def agent(i):
    list(v.generate(f"agent-{i}", prompt, params))
    done.wait()
    release.wait()  # alive: a thread's OpenMP pool lasts as long as the thread

agents = [threading.Thread(target=agent, args=(i,)) for i in range(4)]
for t in agents:
    t.start()
done.wait(timeout=600)
print(before, native(), flush=True)
release.set()
for t in agents:
    t.join()
v.close()
"""


def test_decodes_from_many_threads_share_one_pool_of_openmp_workers() -> None:
    out = subprocess.run([sys.executable, "-c", _AGENTS], capture_output=True, text=True,
                         timeout=900, check=True).stdout.split()
    before, after = int(out[-2]), int(out[-1])
    # called from 4 threads of their own, each would have made a pool of one worker
    assert before >= 1 and after == before, (before, after)
