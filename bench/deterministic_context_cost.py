"""What deterministic mode's whole-context sliding-window cache costs at long contexts
(issue 47): decoding after prompts of 1k-8k tokens with the sliding-window layers' KV
kept whole (``swa_full``, the mode's setting since 0463d28) against the 1,024-cell ring
the default mode keeps, both in deterministic mode otherwise; and the KV memory each
allocates. Per generated token: the median wall time over ``--rounds`` runs, and the
process's CPU time per token (steadier on a shared machine; one thread by default).

    python bench/deterministic_context_cost.py --contexts 1024,4096,8192
    PYTHONPATH=build/llama-cpp-avx2 python bench/deterministic_context_cost.py

A configuration runs in a process of its own (``swa_full`` is set when the context is
made, and the mode's kernel settings are read once per process).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any


def measure(swa_full: bool, contexts: list[int], tokens: int, rounds: int,
            threads: int) -> dict[str, Any]:
    from suffixd.daemon.generation.verifier import GenerateParams, Verifier
    from suffixd.daemon.model import embedded_model_path
    from swa_ring_probe import force_swa_full

    force_swa_full(swa_full)
    v = Verifier(embedded_model_path(), n_ctx=max(contexts) + tokens + 64, n_slots=1,
                 n_threads=threads, deterministic=True)
    out: dict[str, Any] = {"swa_full": swa_full, "by_context": {}}
    text = " ".join(f"row {i} holds the value {i * 7 % 1000} of table t{i % 13};"
                    for i in range(max(contexts)))
    ids = v.tokenize(text, add_bos=True)
    params = GenerateParams(max_tokens=tokens, ignore_eos=True)
    for n in contexts:
        prompt = ids[:n]
        walls, cpus = [], []
        for r in range(rounds + 1):
            # the prompt stays cached in the slot: only the decodes are timed
            list(v.generate("c", prompt, GenerateParams(max_tokens=1, ignore_eos=True)))
            w0, c0 = time.perf_counter(), time.process_time()
            list(v.generate("c", prompt, params))
            if r:  # the first round warms up
                walls.append((time.perf_counter() - w0) * 1000 / tokens)
                cpus.append((time.process_time() - c0) * 1000 / tokens)
        out["by_context"][n] = {"wall_ms": round(statistics.median(walls), 2),
                                "cpu_ms": round(statistics.median(cpus), 2)}
        v.forget("c")
    v.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--contexts", default="1024,2048,4096,8192")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--one", choices=["ring", "full"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    contexts = [int(x) for x in args.contexts.split(",")]
    if args.one:
        print(json.dumps(measure(args.one == "full", contexts, args.tokens, args.rounds,
                                 args.threads)))
        return 0
    res = {}
    for one in ("ring", "full"):
        p = subprocess.run([sys.executable, __file__, "--one", one, "--contexts", args.contexts,
                            "--tokens", str(args.tokens), "--rounds", str(args.rounds),
                            "--threads", str(args.threads)],
                           capture_output=True, text=True, check=True)
        res[one] = json.loads(p.stdout.strip().splitlines()[-1])
    print(f"{'context':>8} {'ring ms/token':>14} {'whole ms/token':>15} {'ratio':>6}"
          f"   (CPU time; wall in brackets)")
    for n in contexts:
        a, b = res["ring"]["by_context"][str(n)], res["full"]["by_context"][str(n)]
        print(f"{n:>8} {a['cpu_ms']:>8.2f} [{a['wall_ms']:.1f}] {b['cpu_ms']:>8.2f} "
              f"[{b['wall_ms']:.1f}] {b['cpu_ms'] / a['cpu_ms']:>6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
