"""Replay a target model's own greedy outputs through drafting policies (no model needed
after recording), under the verifier's measured cost profile.

    python bench/trace_replay.py record WORKLOAD.jsonl TRACES.jsonl [--turns N] [--max-tokens 64]
                                        [--model smollm2|PATH]
    python bench/trace_replay.py replay TRACES.jsonl [--cost-profile JSON]

`record` runs plain greedy decoding of the embedded model over a workload's turns (chat
template, sessions in file order, the bench generate skip rule for long prompts) and
stores prompt and output token ids per turn, with the verifier's measured cost profile.
`replay` then drafts for every step of those outputs, exactly as `bench generate` would
see them, and reports per policy (suffixd; suffixd_candidates, the same trees drafting all
they have; prompt lookup): tokens per step, accept rate, drafted tokens per step, the
cost-model speed-up, and the oracle ceiling (every draft truncated at its accepted
length: what a perfect length choice over the same candidates would reach). This is
how the end-to-end figures in BENCHMARKS.md are explained without re-running the model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def record(args: argparse.Namespace) -> None:
    from suffixd.cli.bench_generate import _load_turns, fits_side_by_side
    from suffixd.daemon.chat import ChatRenderer
    from suffixd.daemon.model import resolve_model_path
    from suffixd.daemon.verifier import GenerateParams, Verifier

    n_ctx = 12288
    v = Verifier(resolve_model_path(args.model), n_ctx=n_ctx, n_slots=2)
    profile = v.measure_cost_profile()
    renderer = ChatRenderer(v)
    current = None
    with open(args.traces, "w") as out:
        out.write(json.dumps({"cost_profile": {str(k): c for k, c in profile.items()}}) + "\n")
        for session, msgs in _load_turns(Path(args.workload), args.turns):
            prompt = renderer.tokens(msgs)
            if not fits_side_by_side(len(prompt), args.max_tokens, n_ctx):
                continue  # the turns bench generate measures
            if session != current:
                if current is not None:
                    v.forget(current)
                current = session
            toks: list[int] = []
            for chunk in v.generate(session, prompt, GenerateParams(max_tokens=args.max_tokens)):
                toks += chunk.tokens
            out.write(json.dumps({"session": session, "prompt": prompt, "output": toks}) + "\n")
    v.close()


def _replay(turns: list[dict[str, Any]], profile: Any, policy: str) -> dict[str, float]:
    import numpy as np
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    from suffixd.cli.bench_generate import feed_prompt

    from suffixcache import CostProfile, Drafter, SuffixCache

    cache = SuffixCache()
    # "suffixd_candidates": the same trees drafting everything they have (a flat profile),
    # so that its oracle figure is the ceiling of the suffix-tree candidates themselves.
    plan = CostProfile.flat() if policy == "suffixd_candidates" else profile
    drafter = Drafter(cache, cost_profile=plan)
    pld = LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=10)
    ns, current, seq = "trace", None, 0
    last: dict[str, list[int]] = {}
    steps = tokens = drafted = accepted = 0
    cost = oracle = 0.0
    for t in turns:
        session, prompt, out = t["session"], t["prompt"], t["output"]
        if session != current:
            if current is not None and cache.has_session(ns, current):
                cache.close_session(ns, current)
            current = session
        feed_prompt(cache, ns, session, prompt, last)
        n = 0
        while n < len(out):
            k = min(32, len(out) - n - 1)
            ctx = prompt + out[:n]
            draft = None
            if k <= 0:
                path: list[int] = []
            elif policy.startswith("suffixd"):
                draft = drafter.propose(ns, session, ctx, max_tokens=k)
                path = list(draft.path())
            else:
                path = [int(x) for x in pld(np.asarray(ctx, dtype=np.intc))[:k]]
            a = 0
            while a < len(path) and n + a < len(out) and path[a] == out[n + a]:
                a += 1
            if draft is not None:  # empty drafts too, as the verifier's on_step does
                drafter.observe(draft, a, out[n : n + a + 1])
            steps += 1
            drafted += len(path)
            accepted += a
            cost += profile.cost(len(path) + 1)
            oracle += profile.cost(a + 1)
            if policy.startswith("suffixd"):
                cache.append_session(ns, session, out[n : n + a + 1])
            n += a + 1
        tokens += len(out)
        if policy.startswith("suffixd") and out:
            cache.add_response(ns, seq, out)
            seq += 1
    return {
        "tokens_per_step": round(tokens / max(steps, 1), 3),
        "accept_rate": round(accepted / max(drafted, 1), 3),
        "drafted_per_step": round(drafted / max(steps, 1), 3),
        "cost_model_speedup": round(tokens / max(cost, 1e-9), 3),
        "oracle_truncation_speedup": round(tokens / max(oracle, 1e-9), 3),
    }


def replay(args: argparse.Namespace) -> None:
    from suffixcache import CostProfile

    lines = [json.loads(x) for x in Path(args.traces).read_text().splitlines() if x.strip()]
    header, turns = lines[0], lines[1:]
    profile = CostProfile.from_json(args.cost_profile or header["cost_profile"])
    out = {"turns": len(turns), "tokens": sum(len(t["output"]) for t in turns)}
    for policy in ("suffixd", "suffixd_candidates", "pld"):
        out[policy] = _replay(turns, profile, policy)
    print(json.dumps(out))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("workload")
    r.add_argument("traces")
    r.add_argument("--turns", type=int, default=500)
    r.add_argument("--max-tokens", type=int, default=64)
    r.add_argument("--model", default=None,
                   help="GGUF path or packaged name (smollm2); default the embedded gemma-3-270m")
    p = sub.add_parser("replay")
    p.add_argument("traces")
    p.add_argument("--cost-profile", default=None)
    args = ap.parse_args(argv)
    source = Path(args.workload if args.cmd == "record" else args.traces)
    if not source.is_file():
        ap.error(f"no such file: {source} (the benchmark workloads live in "
                 "../shared/data/workloads)")
    {"record": record, "replay": replay}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
