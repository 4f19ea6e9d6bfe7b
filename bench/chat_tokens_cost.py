"""What turning a conversation into the verifier's tokens costs the daemon per request
(``ChatRenderer.tokens`` and ``cache_points``: the chat template, the control-token
check, the tokenizer), turn after turn as an agent sends them.

    python bench/chat_tokens_cost.py [WORKLOAD] [--sessions 4]

The workload's first ``--sessions`` sessions are replayed turn by turn through one
renderer, as the daemon sees them (interleaved by session). For the first, the middle
and the last turn by size: what the renderer took (tokens + cache_points), against the
whole rendered text tokenized once (what a renderer without reuse pays at least, and
cache_points paid again). The first call builds the vocabulary's indexes (0.26 s).

Zen 3 VM (AVX2), 2026-11-30, build/workloads/swe_prompt_heavy.jsonl, 132 turns: at
1,360, 17,079 and 28,649 tokens the renderer took 8.4, 6.7 and 11.8 ms (tokens +
cache_points; the first is a conversation's first turn) against 5.0, 63.2 and 138 ms
for one whole tokenization (24c0ca5). Before it tokens alone took 10.3, 39.2 and 177 ms
at 1,439, 10,435 and 28,649 tokens, and cache_points about as much again.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from suffixd.benchkit.workloads import load_session_turns
from suffixd.daemon.generation.chat import ChatRenderer
from suffixd.daemon.generation.verifier import Verifier
from suffixd.daemon.model import embedded_model_path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload", nargs="?", type=Path,
                    default=Path(__file__).parent.parent / "build/workloads/swe_prompt_heavy.jsonl")
    ap.add_argument("--sessions", type=int, default=4)
    args = ap.parse_args()
    if not args.workload.exists():
        ap.error(f"{args.workload}: no such workload (bench/make_prompt_heavy_workload.py "
                 "writes the default one)")
    verifier = Verifier(embedded_model_path(), n_ctx=256, n_slots=1, n_threads=1)
    try:
        renderer = ChatRenderer(verifier)
        turns = load_session_turns(args.workload, args.sessions)
        if not turns:
            ap.error(f"{args.workload}: no assistant turns")
        t0 = time.perf_counter()
        renderer.tokens(turns[0][1])
        print(f"first call: {(time.perf_counter() - t0) * 1e3:.1f} ms")
        renderer = ChatRenderer(verifier)  # a fresh one for the replay
        renderer.tokens([{"role": "user", "content": "<"}])  # its indexes
        by_size = []
        for _, messages in turns:
            t0 = time.perf_counter()
            tokens = renderer.tokens(messages)
            renderer.cache_points(messages, None, tokens)
            took = time.perf_counter() - t0
            by_size.append((len(tokens), took, messages))
        by_size.sort(key=lambda x: x[0])
        for n, took, messages in (by_size[0], by_size[len(by_size) // 2], by_size[-1]):
            text = renderer.render(messages)
            whole = []
            for _ in range(5):
                t0 = time.perf_counter()
                verifier.tokenize(text, special=True)
                whole.append(time.perf_counter() - t0)
            print(f"{n:6} tokens: renderer {took * 1e3:6.1f} ms, "
                  f"one whole tokenization {statistics.median(whole) * 1e3:6.1f} ms")
    finally:
        verifier.close()


if __name__ == "__main__":
    main()
