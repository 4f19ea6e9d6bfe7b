"""What a decode costs by its rows and by how many of them ask for logits: the grid behind
asking logits on padding rows (``cost_measure.padding_logits``).

    python bench/output_rows_cost.py [--max-rows 12] [--sequences 1] [--context 1500]

For T rows (each sequence's, at its own KV stream after ``--context`` cached tokens) and
O <= T of them with logits, the median of 7 decodes after a warm-up (the rows rolled back
after each). On llama.cpp's CPU backend the output layer (262k x 640 for gemma-3) takes
rows with logits in blocks of 4 and each left-over row in a pass of its own, so 8 rows
with 8 logits cost less than 8 rows with 5-7 (2-core EPYC, 2026-11-27: 48.7 against
57.8-67.9 ms).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import llama_cpp
from shared_step_cost import Rows, open_streams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-rows", type=int, default=12, help="rows per sequence, 1..this")
    ap.add_argument("--sequences", type=int, default=1)
    ap.add_argument("--context", type=int, default=1500, help="cached tokens per sequence")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    n = args.sequences
    decode, memory = open_streams(n, 32768, args.threads)
    rng = random.Random(0)

    for s in range(n):
        toks = [rng.randrange(1000, 20000) for _ in range(args.context)]
        for i in range(0, len(toks), 512):
            decode([(s, toks[i : i + 512], i, 0)])

    def timed(rows: Rows) -> float:
        def once() -> float:
            t0 = time.perf_counter()
            decode(rows)
            dt = time.perf_counter() - t0
            for seq, _, pos0, _ in rows:
                llama_cpp.llama_memory_seq_rm(memory, seq, pos0, -1)
            return dt
        once()
        return statistics.median(once() for _ in range(7)) * 1e3

    print(f"{n} sequence(s) of {args.context} cached tokens, {args.threads} threads; "
          "ms for T rows per sequence with logits on O of them")
    for t in range(1, args.max_rows + 1):
        cells = []
        for o in range(1, t + 1):
            rows = [(s, [rng.randrange(1000, 20000) for _ in range(t)], args.context, o)
                    for s in range(n)]
            cells.append(f"O{o}:{timed(rows):6.1f}")
        print(f"T{t:<3}", " ".join(cells))


if __name__ == "__main__":
    main()
