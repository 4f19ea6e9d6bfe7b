"""Where a daemon's decode time went, from its step log (``SUFFIXD_STEP_LOG=PATH``: one
JSON line per shared step, written by daemon/generation/step_batch.py).

    SUFFIXD_STEP_LOG=steps.jsonl suffixd bench agent ... --concurrency 1,4
    python bench/step_log_summary.py steps.jsonl

Daemons that wrote to the same file one after another (a bench's levels) are told apart
by a pause of more than ``--gap`` seconds between steps. Per daemon, the steps grouped by
what they carried: ``promptP`` (P prompt chunks), ``decodeD`` (D decoding sequences), or
both; for each group its steps, seconds, prompt and decode rows (padding included) and
the tokens its decodes emitted.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def summarize(recs: list[dict[str, Any]], gap: float) -> list[dict[str, list[float]]]:
    cuts = [0] + [i for i in range(1, len(recs)) if recs[i]["t"] - recs[i - 1]["t"] > gap]
    runs = []
    for a, b in zip(cuts, [*cuts[1:], len(recs)], strict=True):
        groups: dict[str, list[float]] = {}
        for r in recs[a:b]:
            # a row of "seqs": [seq_id, prompt, tokens, want, kept, rows, emitted, pos0]
            p = [s for s in r["seqs"] if s[1]]
            d = [s for s in r["seqs"] if not s[1]]
            key = "+".join(x for x in (f"prompt{len(p)}" if p else "",
                                       f"decode{len(d)}" if d else "") if x)
            g = groups.setdefault(key, [0, 0.0, 0, 0, 0])
            g[0] += 1
            g[1] += r["s"]
            g[2] += sum(s[5] for s in p)
            g[3] += sum(s[5] for s in d)
            g[4] += sum(s[6] for s in d)
        runs.append(groups)
    return runs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log", type=Path)
    ap.add_argument("--gap", type=float, default=2.5)
    args = ap.parse_args()
    recs = [json.loads(line) for line in args.log.read_text().splitlines() if line.strip()]
    if not recs:
        sys.exit(f"{args.log}: no steps")
    for i, groups in enumerate(summarize(recs, args.gap)):
        total = sum(g[1] for g in groups.values())
        print(f"daemon {i + 1}: {sum(int(g[0]) for g in groups.values())} steps, "
              f"{total:.1f} s in decodes")
        print(f"  {'steps of':<18} {'steps':>6} {'s':>7} {'prompt rows':>12} "
              f"{'decode rows':>12} {'emitted':>8} {'ms/step':>8}")
        for key, (n, s, pr, dr, em) in sorted(groups.items()):
            print(f"  {key:<18} {int(n):>6} {s:>7.2f} {int(pr):>12} {int(dr):>12} "
                  f"{int(em):>8} {1000 * s / n:>8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
