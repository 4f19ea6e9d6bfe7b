"""Deterministic mode past the sliding-window KV ring (issue 47): one spider_dev session's
turns decoded plainly, then again with long, partly wrong drafts (rows rolled back), in
the verifier's deterministic mode; every generated token's top-3 logits compared bit for
bit. A difference is a broken promise of that mode (README, "What each mode promises").

gemma-3's sliding-window layers keep a ring of n_swa + n_ubatch KV cells per sequence
(1,024 on the embedded model; the verifier sets ``swa_full`` off). Until a sequence
reaches the ring's end every position sits in the cell of its own index; past it,
llama.cpp (0.3.36, ``llama_kv_cache::find_slot`` / ``seq_rm``) puts a position in the
first usable cell from a search head that a rollback sets to the lowest cell it freed,
so where rolled-back rows had wrapped to the ring's start, later positions land in other
cells than plain decoding's, and attention (no flash attention) sums over cells in cell
order: other rounding, logits up to ~0.4 apart on this model. ``--swa-full`` runs the
same with the ring as long as the context (llama.cpp's ``swa_full``), the experiment
that tells whether the ring is the cause.

    python bench/swa_ring_probe.py                      # spider-car_1, turns 0-7
    python bench/swa_ring_probe.py --swa-full
    PYTHONPATH=build/llama-cpp-avx2 python bench/swa_ring_probe.py

Prints one line per turn whose logits differ (the first token, its position, the top-3
of each run) and a summary line; exit status 1 when any differs.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

WORKLOAD = Path(__file__).resolve().parents[1].parent / "shared/data/workloads/spider_dev.jsonl"


def force_swa_full(on: bool = True) -> None:
    """Every llama.cpp context this process creates keeps its sliding-window layers'
    whole context (``on``) or their ring, whatever the verifier asks for."""
    from llama_cpp import _internals

    original = _internals.LlamaContext.__init__

    def init(self: Any, *args: Any, params: Any, **kw: Any) -> None:
        params.swa_full = on
        original(self, *args, params=params, **kw)

    _internals.LlamaContext.__init__ = init  # type: ignore[method-assign]


def long_drafts(reference: list[int], prompt_len: int, seed: int, longest: int
                ) -> Callable[[list[int], int], list[int]]:
    """Drafts from plain decoding's output, of random lengths up to ``longest``, one token
    in ten wrong: steps that reach past the ring's end and roll rows back."""
    rnd = random.Random(seed)

    def propose(ctx: list[int], k: int) -> list[int]:
        at = len(ctx) - prompt_len
        d = reference[at: at + rnd.randint(0, min(k, longest))]
        return [t if rnd.random() < 0.9 else (t + 11) % 1000 for t in d]

    return propose


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", type=Path, default=WORKLOAD)
    ap.add_argument("--session", default="spider-car_1")
    ap.add_argument("--turns", type=int, default=8, help="the session's first K turns")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--longest-draft", type=int, default=24)
    ap.add_argument("--seeds", type=int, default=3, help="drafted runs, one seed each")
    ap.add_argument("--swa-full", action="store_true",
                    help="sliding-window layers keep the whole context (the experiment)")
    args = ap.parse_args()
    if args.swa_full:
        force_swa_full()

    import llama_cpp
    from suffixd.benchkit.workloads import load_session_turns
    from suffixd.daemon.generation.chat import ChatRenderer
    from suffixd.daemon.generation.verifier import GenerateParams, Verifier
    from suffixd.daemon.model import embedded_model_path

    turns = [m for s, m in load_session_turns(args.workload, 10**9)
             if s == args.session][:args.turns]
    if not turns:
        sys.exit(f"{args.workload}: no turns of {args.session}")
    v = Verifier(embedded_model_path(), n_ctx=32768, n_slots=2, n_threads=2,
                 deterministic=True)
    if not v.deterministic:
        sys.exit(f"deterministic mode is off: {v.determinism.get('why')}")
    info = llama_cpp.llama_print_system_info().decode()
    print(f"llama.cpp from {Path(llama_cpp.__file__).parent}; AVX512: {'AVX512 = 1' in info}; "
          f"n_swa {v.n_swa}, n_ubatch {v.n_ubatch}, swa_full {args.swa_full}", flush=True)
    renderer = ChatRenderer(v)
    prompts = [renderer.tokens(m) for m in turns]
    print(f"{args.session}: prompts of {[len(p) for p in prompts]} tokens", flush=True)

    def run(key: str, propose_for: Callable[[int, list[int]], Any]
            ) -> list[tuple[list[int], list[list[tuple[int, float]]]]]:
        out = []
        for i, p in enumerate(prompts):
            toks: list[int] = []
            tops: list[list[tuple[int, float]]] = []
            for c in v.generate(key, p, GenerateParams(max_tokens=args.max_tokens,
                                                       record_gaps=True), propose_for(i, p)):
                toks += c.tokens
                tops += [g.top[:3] for g in c.gaps]
            out.append((toks, tops))
        v.forget(key)
        return out

    plain = run("plain", lambda i, p: None)
    differ = 0
    for seed in range(args.seeds):
        def drafts_for(i: int, p: list[int], seed: int = seed
                       ) -> Callable[[list[int], int], list[int]]:
            return long_drafts(plain[i][0], len(p), 100 * seed + i, args.longest_draft)

        drafted = run(f"drafted-{seed}", drafts_for)
        for i, ((pt, ptop), (dt, dtop)) in enumerate(zip(plain, drafted, strict=True)):
            at = next((j for j, (a, b) in enumerate(zip(ptop, dtop, strict=False)) if a != b),
                      None)
            if at is None and pt == dt:
                continue
            differ += 1
            where = (f"token {at} (position {len(prompts[i]) + at}): plain {ptop[at]}, "
                     f"drafted {dtop[at]}") if at is not None else "lengths"
            print(f"seed {seed} turn {i} (prompt {len(prompts[i])}): logits differ first at "
                  f"{where}; tokens equal: {pt == dt}", flush=True)
    print(f"{differ} of {args.seeds * len(prompts)} drafted turns differ from plain decoding "
          "in their logits")
    v.close()
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
