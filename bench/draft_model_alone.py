"""The draft model alone against plain decoding, in the daemon's own generation loop:
where the trees have nothing, does the fallback pay (issue 48)?

    python bench/draft_model_alone.py build/quant-pair/gemma-3-270m-f32.gguf \\
        [--draft GGUF] [--workload build/workloads/prose.jsonl] [--turns 12] \\
        [--max-tokens 64] [--threads 2] [--repeat 2] [--json]

Each turn's first user message, in gemma-3's chat format, is generated greedily twice per
repeat, plain and with the draft model as the only proposer (the daemon's policy,
``draft_model.measure``: both models timed here first, as ``suffixd serve`` does), the
order alternating turn by turn so that the machine's drift falls on both. Prints the two
wall times, their ratio and the policy's record (drafts used and declined, acceptance, a
drafted token's cost in use, catch-up). Greedy outputs are compared too: a draft model
changes no token (up to near-ties, which are counted).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from suffixd.daemon.generation.draft_model import DraftModel, measure
from suffixd.daemon.generation.verifier import GenerateParams, Verifier
from suffixd.daemon.model import embedded_model_path


def prompts(workload: Path, turns: int) -> list[str]:
    out: list[str] = []
    for line in workload.read_text().splitlines():
        if line.strip() and len(out) < turns:
            user = next(m for m in json.loads(line)["messages"] if m["role"] == "user")
            out.append(f"<start_of_turn>user\n{user['content']}<end_of_turn>\n"
                       "<start_of_turn>model\n")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("verifier", type=Path)
    ap.add_argument("--draft", type=Path, default=None, help="default: the embedded model")
    ap.add_argument("--workload", type=Path, default=Path("build/workloads/prose.jsonl"))
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    target = Verifier(args.verifier, n_threads=args.threads, n_ctx=2048, n_slots=2)
    draft = DraftModel(args.draft or embedded_model_path(), target)
    try:
        policy = measure(target, draft, max_tokens=8)
        at_start = policy.stats()
        wall = {"plain": 0.0, "draft model": 0.0}
        texts: dict[str, list[list[int]]] = {"plain": [], "draft model": []}
        turns = [target.tokenize(text, add_bos=True, special=True)
                 for text in prompts(args.workload, args.turns)]
        for rep in range(args.repeat):
            for i, tokens in enumerate(turns):
                order = ["plain", "draft model"] if (rep + i) % 2 == 0 else \
                    ["draft model", "plain"]
                for mode in order:
                    params = GenerateParams(max_tokens=args.max_tokens, ignore_eos=True)
                    t0 = time.perf_counter()
                    if mode == "plain":
                        chunks = list(target.generate(f"p{rep}-{i}", tokens, params))
                    else:
                        chunks = list(target.generate(f"d{rep}-{i}", tokens, params,
                                                      policy, policy.observe))
                    wall[mode] += time.perf_counter() - t0
                    texts[mode].append([t for c in chunks for t in c.tokens])
                # each turn a new session: what the slots held is not reused by the next
                target.forget(f"p{rep}-{i}")
                target.forget(f"d{rep}-{i}")
        same = sum(a == b for a, b in zip(texts["plain"], texts["draft model"], strict=True))
        out: dict[str, Any] = {
            "verifier": str(args.verifier), "turns": args.turns * args.repeat,
            "wall_s": {k: round(v, 2) for k, v in wall.items()},
            "speedup": round(wall["plain"] / wall["draft model"], 3),
            "identical_outputs": same, "policy_at_start": at_start, "policy": policy.stats(),
        }
    finally:
        draft.close()
        target.close()
    if args.json:
        print(json.dumps(out))
        return
    print(f"{out['turns']} turns: plain {out['wall_s']['plain']} s, draft model alone "
          f"{out['wall_s']['draft model']} s: {out['speedup']}x; "
          f"identical outputs {same}/{out['turns']}")
    print(json.dumps(out["policy"]))


if __name__ == "__main__":
    main()
