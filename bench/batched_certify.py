"""Do generations that share steps part from the same generations alone only at certified
near-ties? The check behind ``greedy_same`` in ``suffixd bench agent --concurrency``
(which compares texts and does not certify).

    python bench/batched_certify.py ../shared/data/workloads/spider_dev.jsonl \
        [--prompts 8] [--turns 1] [--at-once 4] [--max-tokens 64] [--drafts]

The first ``--turns`` prompts of each of ``--prompts`` workload conversations (the
messages before each assistant message, the embedded model's chat template; a
conversation's turns in order under one session key, so each turn starts from what its KV
slot holds) are generated greedily alone with no drafts (plain decoding, the reference),
then ``--at-once`` conversations at a time in shared steps (with
``--drafts``: drafts from the reference's own continuation, of random lengths, one token
in five wrong, so that steps mix drafts, padding and rollbacks). Every pair is judged by
``certify_greedy``: identical, parted at a near-tie (each run's logits put the other's
token within NEAR_TIE_GAP of its best), or diverged. A diverged pair is a bug.
"""

from __future__ import annotations

import argparse
import json
import threading
from pathlib import Path

from suffixd.daemon.generation.certify import TokenGap, certify_greedy, noisy_drafts
from suffixd.daemon.generation.chat import ChatRenderer
from suffixd.daemon.generation.verifier import GenerateParams, Verifier
from suffixd.daemon.model import embedded_model_path

Run = tuple[list[int], list[TokenGap]]


def turn_prompts(v: Verifier, path: Path, n: int, turns: int) -> list[list[list[int]]]:
    """Per conversation, the prompts before its first ``turns`` assistant messages."""
    renderer = ChatRenderer(v)
    out: list[list[list[int]]] = []
    with path.open() as f:
        for line in f:
            msgs = json.loads(line)["messages"]
            ends = [i for i, m in enumerate(msgs) if m["role"] == "assistant" and i][:turns]
            if not ends:
                continue
            out.append([renderer.tokens(msgs[:i]) for i in ends])
            if len(out) == n:
                break
    return out


def generate(v: Verifier, key: str, prompts: list[list[int]], params: GenerateParams,
             drafts: list[list[int]] | None = None, seed: int = 0) -> list[Run]:
    """A conversation's turns in order under one session key; its KV freed after."""
    out: list[Run] = []
    for k, prompt in enumerate(prompts):
        propose = noisy_drafts(drafts[k], len(prompt), seed + k) if drafts is not None else None
        toks: list[int] = []
        gaps: list[TokenGap] = []
        for c in v.generate(key, prompt, params, propose):
            toks += c.tokens
            gaps += c.gaps
        out.append((toks, gaps))
    v.forget(key)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload", type=Path)
    ap.add_argument("--prompts", type=int, default=8, help="conversations")
    ap.add_argument("--turns", type=int, default=1, help="turns per conversation")
    ap.add_argument("--at-once", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--drafts", action="store_true")
    args = ap.parse_args()
    v = Verifier(embedded_model_path(), n_ctx=8192, n_slots=args.at_once)
    try:
        prompts = turn_prompts(v, args.workload, args.prompts, args.turns)
        params = GenerateParams(max_tokens=args.max_tokens, ignore_eos=True, record_gaps=True)
        alone = [generate(v, f"alone-{i}", p, params) for i, p in enumerate(prompts)]
        together: list[list[Run] | None] = [None] * len(prompts)

        def worker(i: int) -> None:
            drafts = [t for t, _ in alone[i]] if args.drafts else None
            together[i] = generate(v, f"together-{i}", prompts[i], params, drafts, 100 * i)

        for start in range(0, len(prompts), args.at_once):
            threads = [threading.Thread(target=worker, args=(i,))
                       for i in range(start, min(start + args.at_once, len(prompts)))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        counts = {"identical": 0, "near_tie": 0, "diverged": 0}
        for i, (refs, gots) in enumerate(zip(alone, together, strict=True)):
            assert gots is not None
            for k, (ref, got) in enumerate(zip(refs, gots, strict=True)):
                verdict, where = certify_greedy(ref[1], got[1])
                counts[verdict] += 1
                if where is not None:
                    r, c = ref[1][where], got[1][where]
                    print(f"conversation {i} turn {k}: {verdict} at token {where}: alone "
                          f"{r.token} (gap {r.gap:.2f}), shared {c.token} (gap {c.gap:.2f})")
        print(json.dumps({"conversations": len(prompts), "turns": args.turns,
                          "at_once": args.at_once,
                          "drafts": args.drafts, "max_tokens": args.max_tokens,
                          "stats": v.batch_stats()["by_sequences"], **counts}))
    finally:
        v.close()


if __name__ == "__main__":
    main()
