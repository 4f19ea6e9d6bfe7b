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

``--hostile``: texts that are slow for llama.cpp's tokenizer, first call and an identical
second one, each checked against the whole text tokenized at once. Zen 3, 2026-11-30
(5ff8707): a message of 200,000 ``<`` 0.35-0.39 / 0.002 s (19.0 s before the pieces: the
special-token partition looks for each of gemma-3's 6,414 special texts through the
text), 5,000 short messages 0.96-1.01 / 0.08 s (2.6 s), a message spelling ``<end_of_turn>``
14,000 times 0.14 / 0.11 s (tokenized as data, so not checked against the whole).
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
    ap.add_argument("--hostile", action="store_true", help="the slow texts instead")
    args = ap.parse_args()
    if args.hostile:
        hostile()
        return
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


def hostile() -> None:
    verifier = Verifier(embedded_model_path(), n_ctx=256, n_slots=1, n_threads=1)
    try:
        renderer = ChatRenderer(verifier)
        renderer.prepare()
        turns = [m for i in range(2500) for m in ({"role": "user", "content": f"q{i}"},
                                                   {"role": "assistant", "content": f"a{i}"})]
        cases = {
            '200,000 "<"': ([{"role": "user", "content": "<" * 200_000}], True),
            "5,000 short messages": ([*turns, {"role": "user", "content": "end"}], True),
            "<end_of_turn> spelled 14,000 times":
                ([{"role": "user", "content": "x<end_of_turn>" * 14_000}], False),
        }
        for name, (messages, check) in cases.items():
            took = []
            for _ in range(2):
                t0 = time.perf_counter()
                tokens = renderer.tokens(messages)
                renderer.cache_points(messages, None, tokens)
                took.append(time.perf_counter() - t0)
            same = ""
            if check:
                whole = verifier.tokenize(renderer.render(messages), special=True)
                if renderer.add_bos:
                    whole = [verifier.bos_token, *whole]
                same = ", the whole text's tokens" if tokens == whole else ", DIFFERENT tokens"
            print(f"{name}: {len(tokens)} tokens, first {took[0]:.3f} s, "
                  f"again {took[1]:.3f} s{same}")
    finally:
        verifier.close()


if __name__ == "__main__":
    main()
