"""What a decode costs when llama.cpp is called from one thread or from several.

    python bench/omp_masters.py [--reps 5] [--threads 2]

The embedded model in a context of 4 sequences (a KV stream each, as the daemon's
verifier) of 2.3-5.7k cached tokens. Each shape is timed (median of ``--reps``) with the
decodes called from the main thread only ("one thread") and from a second thread after
the main thread has decoded once ("two threads": libgomp then keeps two pools of OpenMP
workers, and with more managed threads than CPUs it sleeps at every barrier instead of
spinning; daemon/generation/compute_thread.py). "idle" is the machine's idle CPU time
during the decode, from /proc/stat (10 ms resolution).

Each mode runs in a fresh process: a pool, once made, lasts as long as its thread.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

SHAPES: dict[str, list[tuple[int, int, int]]] = {
    # (sequence, rows, rows with logits)
    "1 sequence x 5 rows": [(1, 5, 5)],
    "3 sequences x 3 rows": [(1, 3, 3), (2, 3, 3), (3, 3, 3)],
    "prompt chunk, 503 rows": [(0, 503, 1)],
    "prompt chunk + 3 x 3 rows": [(0, 503, 1), (1, 3, 3), (2, 3, 3), (3, 3, 3)],
}
CONTEXTS = [2317, 5719, 5693, 5738]


def measure(mode: str, reps: int, threads: int) -> dict[str, Any]:
    import llama_cpp
    from shared_step_cost import open_streams  # a script beside this one
    from suffixd.daemon.generation.step_batch import machine_cpu_seconds

    def idle_s() -> float:
        return machine_cpu_seconds()[1]

    decode, memory = open_streams(4, 32768, threads)
    rng = random.Random(0)
    for s, n in enumerate(CONTEXTS):
        toks = [rng.randrange(1000, 20000) for _ in range(n)]
        for i in range(0, n, 512):
            decode([(s, toks[i:i + 512], i, 0)])

    def once(shape: list[tuple[int, int, int]]) -> tuple[float, float]:
        rows = [(s, [rng.randrange(1000, 20000) for _ in range(k)], CONTEXTS[s], outs)
                for s, k, outs in shape]
        i0, t0 = idle_s(), time.perf_counter()
        decode(rows)
        dt, idle = time.perf_counter() - t0, idle_s() - i0
        for s, _, p0, _ in rows:
            llama_cpp.llama_memory_seq_rm(memory, s, p0, -1)
        return dt, idle

    out: dict[str, Any] = {}

    def run() -> None:
        for name, shape in SHAPES.items():
            once(shape)
            got = [once(shape) for _ in range(reps)]
            out[name] = {"ms": round(statistics.median(g[0] for g in got) * 1e3, 1),
                         "idle_ms": round(statistics.median(g[1] for g in got) * 1e3, 1)}

    if mode == "one":
        run()
    else:  # the contexts were filled from the main thread: a second thread is a 2nd pool
        t = threading.Thread(target=run)
        t.start()
        t.join()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mode", choices=["one", "two"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mode:
        print(json.dumps(measure(args.mode, args.reps, args.threads)))
        return
    res: dict[str, dict[str, list[dict[str, float]]]] = {}
    for mode in ("one", "two", "one", "two"):  # alternating: the VM drifts
        p = subprocess.run([sys.executable, __file__, "--mode", mode, "--reps", str(args.reps),
                            "--threads", str(args.threads)], capture_output=True, text=True,
                           check=True)
        for name, v in json.loads(p.stdout.strip().splitlines()[-1]).items():
            res.setdefault(name, {}).setdefault(mode, []).append(v)
    print(f"{'shape':<28} {'one thread':>16} {'two threads':>16} {'ratio':>6}")
    for name, by in res.items():
        one = statistics.mean(v["ms"] for v in by["one"])
        two = statistics.mean(v["ms"] for v in by["two"])
        idle1 = statistics.mean(v["idle_ms"] for v in by["one"])
        idle2 = statistics.mean(v["idle_ms"] for v in by["two"])
        print(f"{name:<28} {one:>7.0f} ms ({idle1:>3.0f}) {two:>7.0f} ms ({idle2:>3.0f}) "
              f"{two / one:>6.2f}")
    print("(idle CPU ms during the decode in brackets; means of 2 runs of medians)")


if __name__ == "__main__":
    main()
