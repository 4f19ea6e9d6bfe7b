"""What a prompt row costs by the size of its chunk, with another sequence's decode riding
in the same step: is a smaller chunk beside decoding rows dearer per row?

    python bench/prompt_chunk_cost.py [--context 3000] [--chunks 96,128,192,256,384,511]

One sequence's prompt is evaluated past ``--context`` cached tokens, ``--prompt-rows``
rows at a time in chunks of each size, each step beside a ``--decode-rows``-row decode of
a second sequence (its own KV stream, at ``--decode-context``), as the daemon's shared
steps are. The sizes take turns within each repetition so that a machine's drift falls
on all of them; each figure is the median of ``--repeat``. The daemon cuts prompts at
n_batch (512) rows, llama-server at its n_batch (2048) into n_ubatch (512) ubatches.

Zen 3 VM (AVX2, 2 cores), 2026-11-30, defaults: 3.85-3.98 ms a prompt row from 128 to
511 rows a chunk, 4.19 at 96 (a 1-row decode alone costs ~21 ms). So cutting a prompt
into chunks of 128 rows and more costs it nothing measurable on this CPU.
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
    ap.add_argument("--context", type=int, default=3000, help="the prompt's cached tokens")
    ap.add_argument("--decode-context", type=int, default=1500)
    ap.add_argument("--decode-rows", type=int, default=1, help="the riding decode's rows")
    ap.add_argument("--chunks", default="96,128,192,256,384,511")
    ap.add_argument("--prompt-rows", type=int, default=1536, help="rows timed per size")
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    chunks = [int(c) for c in args.chunks.split(",") if c.strip()]
    if not chunks or min(chunks) < 1 or max(chunks) + args.decode_rows > 512:
        ap.error("--chunks: sizes of 1 to 512 - --decode-rows")
    decode, memory = open_streams(2, 16384, args.threads)
    rng = random.Random(0)
    toks = [rng.randrange(1000, 20000) for _ in range(args.context + args.prompt_rows + 512)]
    ride = [rng.randrange(1000, 20000) for _ in range(args.decode_context + args.decode_rows)]
    for seq, cached in ((0, toks[: args.context]), (1, ride[: args.decode_context])):
        for i in range(0, len(cached), 512):
            decode([(seq, cached[i : i + 512], i, 0)])

    def timed(chunk: int) -> float:
        """ms a prompt row: the prompt's next rows in chunks, each beside the decode."""
        done, t0 = 0, time.perf_counter()
        while done < args.prompt_rows:
            pos = args.context + done
            rows: Rows = [(1, ride[args.decode_context:], args.decode_context, 1),
                          (0, toks[pos : pos + chunk], pos, 0)]
            decode(rows)
            llama_cpp.llama_memory_seq_rm(memory, 1, args.decode_context, -1)
            done += chunk
        ms = (time.perf_counter() - t0) * 1e3 / done
        llama_cpp.llama_memory_seq_rm(memory, 0, args.context, -1)
        return ms

    timed(chunks[-1])  # warm-up
    per_row: dict[int, list[float]] = {c: [] for c in chunks}
    for _ in range(args.repeat):
        for c in chunks:
            per_row[c].append(timed(c))
    print(f"prompt past {args.context} cached tokens, a {args.decode_rows}-row decode "
          f"riding each step, {args.threads} threads; ms a prompt row (median of "
          f"{args.repeat}) and a step")
    for c in chunks:
        m = statistics.median(per_row[c])
        print(f"chunk {c:4}: {m:5.2f} ms a row, {m * c:7.1f} ms a step   "
              f"({' '.join(f'{x:.2f}' for x in per_row[c])})")


if __name__ == "__main__":
    main()
