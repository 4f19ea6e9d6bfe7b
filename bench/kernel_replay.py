"""A run's own steps replayed under other attention kernels: what the same schedule would
have cost on llama-server's flash-attention rows, step for step, on this machine.

    SUFFIXD_STEP_LOG=steps.jsonl suffixd bench agent ... --concurrency 8
    python bench/kernel_replay.py steps.jsonl --run 1 [--variants off,f16,bf16] [--against 53.6]

Each step of the chosen daemon (see ``step_log_summary.split``) is decoded again with the
same rows per sequence at the same positions (random tokens: a row's price does not
depend on which token it is) in one context per variant, the variants one after another
within each step and their order turned every step, so a machine whose speed drifts
prices them alike. Variants: ``off`` (no flash attention: the verifier on a stock
llama-cpp-python), ``f16`` (flash attention on an F16 cache: llama-server's default, whose
stock kernel sums under 64 rows in F16, see docs/research-log.md; on the build of
scripts/install_llama_cpp.sh it sums in F32 and is the verifier's), ``bf16`` (flash
attention with V in BF16: stock llama.cpp sums it in F32). Only ``llama_decode`` is timed; the
cache is filled to each step's positions untimed. ``--against``: a wall time from the
same run (llama-server's), to which the run's wall less each variant's saving compares.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import llama_cpp
from shared_step_cost import open_streams  # scripts beside this one
from step_log_summary import split

VARIANTS = {"off": (False, "f16"), "f16": (True, "f16"), "bf16": (True, "f16/bf16")}


class Replayer:
    """One context under one kernel variant, its sequences kept at the positions the log
    asks for."""

    def __init__(self, variant: str, n_seqs: int, ctx_size: int, threads: int) -> None:
        flash, kv = VARIANTS[variant]
        self.decode, self.memory = open_streams(n_seqs, ctx_size, threads, False, flash, kv)
        self.rng = random.Random(0)

    def _tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(1000, 20000) for _ in range(n)]

    def held(self, seq: int) -> int:
        """How many tokens sequence ``seq`` has cached."""
        return int(llama_cpp.llama_memory_seq_pos_max(self.memory, seq)) + 1

    def seek(self, seq: int, pos: int) -> None:
        """Sequence ``seq`` holding exactly ``pos`` cached tokens (untimed)."""
        if self.held(seq) > pos and not llama_cpp.llama_memory_seq_rm(self.memory, seq, pos, -1):
            # the sliding-window ring cannot roll back that far: start the sequence again
            llama_cpp.llama_memory_seq_rm(self.memory, seq, 0, -1)
        held = self.held(seq)
        while held < pos:
            n = min(512, pos - held)
            self.decode([(seq, self._tokens(n), held, 0)])
            held += n

    def step(self, seqs: list[list[int]]) -> float:
        """One logged step (rows of ``[seq_id, prompt, tokens, want, kept, rows, emitted,
        pos0]``), timed."""
        for s in seqs:
            self.seek(s[0], s[7])
        rows = [(s[0], self._tokens(s[5]), s[7], 1 if s[1] else s[5]) for s in seqs]
        t0 = time.perf_counter()
        self.decode(rows)
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("steps", type=Path)
    ap.add_argument("--run", type=int, default=0, help="which daemon of the log (from 0)")
    ap.add_argument("--gap", type=float, default=2.5)
    ap.add_argument("--variants", default="off,f16,bf16")
    ap.add_argument("--ctx-size", type=int, default=8192, help="cells per sequence")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--against", type=float, help="a wall time from the same run")
    args = ap.parse_args()
    recs = [json.loads(line) for line in args.steps.read_text().splitlines() if line.strip()]
    run = split(recs, args.gap)[args.run]
    n_seqs = 1 + max(s[0] for r in run for s in r["seqs"])
    names = args.variants.split(",")
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        sys.exit(f"kernel_replay: unknown variant(s) {unknown}; choose from {list(VARIANTS)}")
    replayers = {v: Replayer(v, n_seqs, args.ctx_size, args.threads) for v in names}
    totals: dict[str, dict[str, float]] = {v: {"prompt": 0.0, "decode": 0.0, "mixed": 0.0}
                                           for v in names}
    logged = {"prompt": 0.0, "decode": 0.0, "mixed": 0.0}
    for i, r in enumerate(run):
        kinds = {bool(s[1]) for s in r["seqs"]}
        kind = "mixed" if len(kinds) == 2 else ("prompt" if True in kinds else "decode")
        logged[kind] += r["s"]
        order = names if i % 2 == 0 else names[::-1]
        for v in order:
            totals[v][kind] += replayers[v].step(r["seqs"])
    wall = run[-1]["t"] - run[0]["t"] + run[0]["s"]
    print(f"{args.steps} daemon {args.run}: {len(run)} steps, {n_seqs} sequences, "
          f"wall {wall:.1f} s, logged step time {sum(logged.values()):.1f} s "
          f"(prompt {logged['prompt']:.1f}, decode {logged['decode']:.1f}, "
          f"mixed {logged['mixed']:.1f})")
    base = names[0]
    print(f"{'variant':<8} {'prompt s':>9} {'decode s':>9} {'mixed s':>8} {'total s':>8} "
          f"{'vs ' + base:>8} {'wall less saving':>17}")
    base_total = sum(totals[base].values())
    for v in names:
        t = totals[v]
        total = sum(t.values())
        est = wall - (base_total - total)
        against = f" ({args.against / est:.2f}x)" if args.against else ""
        print(f"{v:<8} {t['prompt']:>9.1f} {t['decode']:>9.1f} {t['mixed']:>8.1f} "
              f"{total:>8.1f} {total / base_total:>8.3f} {est:>11.1f} s{against}")


if __name__ == "__main__":
    main()
