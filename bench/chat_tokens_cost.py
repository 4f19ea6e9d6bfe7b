"""What turning a conversation into the verifier's tokens costs the daemon per request
(``ChatRenderer.tokens``: the chat template, the control-token check, the tokenizer).

    python bench/chat_tokens_cost.py [WORKLOAD] [--sessions 4]

For the first, the middle and the last assistant turn of the workload's first
``--sessions`` sessions (default: the prompt-heavy coding-agent workload), the median of
7 calls. A renderer's first message with a "<" also builds its index of the
vocabulary's control-token texts (the first call, on these workloads).

Zen 3 VM (AVX2), 2026-11-30, build/workloads/swe_prompt_heavy.jsonl: 10.3, 39.2 and
177 ms at 1,439, 10,435 and 28,649 tokens; before the control-token prefilter (b40b7cd)
25.6, 119.8 and 387 ms. The first call builds the index: 0.26 s.
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
        for _, messages in {id(t): t for t in (turns[0], turns[len(turns) // 2],
                                               turns[-1])}.values():
            times = []
            for _ in range(7):
                t0 = time.perf_counter()
                tokens = renderer.tokens(messages)
                times.append(time.perf_counter() - t0)
            print(f"{len(tokens):6} tokens: {statistics.median(times) * 1e3:6.1f} ms")
    finally:
        verifier.close()


if __name__ == "__main__":
    main()
