"""Every llama.cpp decode of the process runs on one thread (daemon/generation/
compute_thread.py): with a pool of OpenMP workers per calling thread, libgomp sleeps at
every barrier once its threads outnumber the CPUs. Unit tests of the executor, then the
real model called from several threads: no second pool of workers appears."""

from __future__ import annotations

import os
import threading

import pytest
from suffixd.daemon.generation.compute_thread import ComputeThread
from suffixd.daemon.generation.verifier import GenerateParams, Verifier
from suffixd.daemon.model import embedded_model_path


def test_calls_run_on_one_thread_in_order_and_return_their_results() -> None:
    ct = ComputeThread("test-compute")
    seen: list[tuple[int, int]] = []
    results: dict[int, int] = {}

    def caller(i: int) -> None:
        for j in range(20):
            results[i * 100 + j] = ct.call(
                lambda j=j: seen.append((i, threading.get_ident())) or i * 100 + j)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {k: k for k in results} and len(results) == 80
    assert len({ident for _, ident in seen}) == 1  # one thread ran them all
    assert all(ident != t.ident for _, ident in seen for t in threads)
    for i in range(4):  # each caller's calls in its own order
        assert [j for j, _ in seen if j == i] == [i] * 20


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


def _native_threads() -> int:
    """OS threads of this process that Python did not start (OpenMP's workers, gRPC's)."""
    return len(os.listdir("/proc/self/task")) - threading.active_count()


def test_decodes_from_many_threads_share_one_pool_of_openmp_workers() -> None:
    # two llama.cpp threads whatever the test worker's share of the cores: with one there
    # are no OpenMP workers to count
    v = Verifier(embedded_model_path(), n_ctx=2048, n_threads=2, n_slots=4)
    try:
        params = GenerateParams(max_tokens=3, ignore_eos=True, max_draft=0)
        prompt = v.tokenize("SELECT name FROM singer WHERE age > 30")
        list(v.generate("warm", prompt, params))
        before = _native_threads()
        release = threading.Event()
        done = threading.Barrier(5)

        def agent(i: int) -> None:
            list(v.generate(f"agent-{i}", prompt, params))
            done.wait()
            release.wait()  # alive: a thread's OpenMP pool lasts as long as the thread

        agents = [threading.Thread(target=agent, args=(i,)) for i in range(4)]
        for t in agents:
            t.start()
        done.wait(timeout=600)
        # called from 4 threads of their own each would have made a pool of THREADS - 1
        # worker each: up to 4 more native threads
        assert _native_threads() == before
        release.set()
        for t in agents:
            t.join()
    finally:
        v.close()
