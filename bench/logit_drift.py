"""How far llama.cpp's logits move with the batch shape, on real prompts.

    python bench/logit_drift.py [SESSIONS] [TURNS_PER_SESSION]

For the first turns of the first spider_dev sessions: decode 48 tokens plainly, then
evaluate the same tokens again one at a time and 9 or 17 at a time on a fresh slot, and
report over all positions the largest per-logit change and the change of the top-1/top-2
gap (percentiles), and how often the best token flips. BENCHMARKS.md quotes it to justify
the near-tie threshold of the greedy-equivalence check.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from suffixd.daemon.generation.chat import ChatRenderer
from suffixd.daemon.generation.verifier import GenerateParams, Verifier
from suffixd.daemon.model import resolve_model_path

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "workloads"


def main() -> None:
    sessions = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    per_session = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    if not (DATA / "spider_dev.jsonl").is_file():
        sys.exit(f"logit_drift needs the recorded traces: no {DATA / 'spider_dev.jsonl'} "
                 "(../shared/data beside the repository)")
    v = Verifier(resolve_model_path(None), n_ctx=8192, n_slots=4)
    renderer = ChatRenderer(v)
    turns = []
    with (DATA / "spider_dev.jsonl").open() as f:
        for line, _ in zip(f, range(sessions), strict=False):
            msgs = json.loads(line)["messages"]
            idx = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
            turns += [msgs[:i] for i in idx[:per_session]]
    change, gap_change, flips = [], [], 0
    for msgs in turns:
        prompt = renderer.tokens(msgs)
        chunks = v.generate("drift", prompt, GenerateParams(max_tokens=48))
        out = [t for c in chunks for t in c.tokens]
        v.forget("drift")
        full, n = prompt + out, len(prompt) - 1
        single = v.logit_rows(full, n, 1)
        for bs in (9, 17):
            for a, b in zip(single, v.logit_rows(full, n, bs), strict=True):
                t1 = int(np.argmax(a))
                t2 = int(np.argsort(a)[-2])
                change.append(float(np.max(np.abs(a - b))))
                gap_change.append(abs(float((a[t1] - a[t2]) - (b[t1] - b[t2]))))
                flips += int(np.argmax(b)) != t1
    pct = (50, 90, 99, 100)
    print(json.dumps({
        "positions": len(change),
        "max_logit_change_p50_p90_p99_max": np.percentile(change, pct).round(3).tolist(),
        "gap_change_p50_p90_p99_max": np.percentile(gap_change, pct).round(3).tolist(),
        "best_token_flips": flips,
    }))
    v.close()


if __name__ == "__main__":
    main()
