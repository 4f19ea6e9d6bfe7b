"""The least wall time a run could have taken with perfect drafts, from its step log.

    SUFFIXD_STEP_LOG=steps.jsonl suffixd bench agent ... --concurrency 1 --profiles DIR
    python bench/perfect_draft_oracle.py steps.jsonl --profile DIR/cost_profile-slotsdefault.json \
        [--run 0] [--against 42.1]

A ceiling, not a projection: the prompt rows are priced at what the run's prompt-only
steps cost per row (batching prompts of several sessions does not make a row cheaper:
one row is one row of arithmetic on a CPU), and every emitted token at the cheapest
tokens-per-second shape of the measured cost profile, as if each step's whole draft had
been accepted at the best draft length. Steps' Python, waits and mixed steps cost
nothing. The profile is measured at short contexts, so at long ones the true price of a
token is higher and the bound lower than reachable. ``--against``: a wall time to
compare (llama-server's best in the same run), reported as the best ratio any drafting
could reach.

Beside it, ``hindsight``: the same run with each draft cut to its accepted part (see
``hindsight``), the bound for any policy choosing how much of the trees' drafts to verify.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from step_log_summary import _decode_x, decode_fit, split  # scripts beside this one


def best_seconds_per_token(costs: dict[str, Any]) -> tuple[float, int]:
    """The cheapest seconds per verified row over the profile's measured batch sizes, and
    the size that gives it (a step of k rows all accepted emits k tokens)."""
    raw = {int(k): float(v) for k, v in costs["raw"].items()}
    k = min(raw, key=lambda n: raw[n] / n)
    return raw[k] / k, k


def ceiling(run: list[dict[str, Any]], costs: dict[str, Any]) -> dict[str, float]:
    """A run's measured parts and its perfect-draft bound (see the module's text)."""
    prompt_rows = prompt_s = mixed_prompt_rows = emitted = decode_s = 0.0
    for r in run:
        # a row of "seqs": [seq_id, prompt, tokens, want, kept, rows, emitted, pos0]
        p = [s for s in r["seqs"] if s[1]]
        d = [s for s in r["seqs"] if not s[1]]
        emitted += sum(s[6] for s in d)
        if p and not d:
            prompt_rows += sum(s[5] for s in p)
            prompt_s += r["s"]
        elif p:
            mixed_prompt_rows += sum(s[5] for s in p)
        else:
            decode_s += r["s"]
    per_row = prompt_s / prompt_rows if prompt_rows else 0.0
    per_token, k = best_seconds_per_token(costs)
    prompts = per_row * (prompt_rows + mixed_prompt_rows)
    return {
        "wall_s": run[-1]["t"] - run[0]["t"] + run[0]["s"],
        "steps_s": sum(r["s"] for r in run),
        "prompt_rows": prompt_rows + mixed_prompt_rows,
        "prompt_s_per_row": per_row,
        "prompts_s": prompts,
        "emitted": emitted,
        "best_s_per_token": per_token,
        "best_rows": k,
        "decoding_floor_s": emitted * per_token,
        "wall_floor_s": prompts + emitted * per_token,
    }


def hindsight(run: list[dict[str, Any]]) -> dict[str, float] | None:
    """The run with every draft cut, in hindsight, to the part that was accepted: each
    decoding sequence of each step verifies the rows it emitted and no more (a draft
    wholly rejected: one row). The steps stay as they were (the same tokens are accepted
    at the same steps), each priced less its rejected rows under a least-squares fit of
    the run's own decode-only steps (rows, sequences, rows x context, a constant). The
    best any draft-length policy could do with the drafts these trees offered; None with
    under five decode-only steps to fit."""
    coef, fitted = decode_fit(run)
    if fitted < 5:
        return None
    rejected = saved = 0.0
    for r in run:
        d = [s for s in r["seqs"] if not s[1]]
        if not d:
            continue
        cut = [[*s[:5], min(s[5], max(1, s[6])), *s[6:]] for s in d]
        rejected += sum(s[5] - c[5] for s, c in zip(d, cut, strict=True))
        saved += float(np.dot(coef, _decode_x(d)) - np.dot(coef, _decode_x(cut)))
    wall = run[-1]["t"] - run[0]["t"] + run[0]["s"]
    return {"rejected_rows": rejected, "fit_s_per_row": float(coef[0]),
            "fit_s_per_sequence": float(coef[1]), "fit_s_per_step": float(coef[3]),
            "rejected_rows_s": saved, "hindsight_wall_s": wall - saved}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log", type=Path)
    ap.add_argument("--profile", type=Path, required=True, help="a daemon's cost_profile JSON")
    ap.add_argument("--run", type=int, default=0, help="which daemon of the log (0: first)")
    ap.add_argument("--gap", type=float, default=2.5)
    ap.add_argument("--against", type=float, default=None, help="a wall time to compare, s")
    args = ap.parse_args()
    recs = [json.loads(line) for line in args.log.read_text().splitlines() if line.strip()]
    if recs and not all("seqs" in r and "t" in r for r in recs):
        sys.exit(f"{args.log}: not a step log (SUFFIXD_STEP_LOG writes one)")
    found = split(recs, args.gap)
    if not recs or args.run >= len(found):
        sys.exit(f"{args.log}: no run {args.run} ({len(found)} found)")
    out: dict[str, Any] = ceiling(found[args.run],
                                  json.loads(args.profile.read_text())["costs"])
    out["hindsight"] = hindsight(found[args.run])
    if args.against:
        out["against_s"] = args.against
        out["best_ratio"] = args.against / out["wall_floor_s"]
        if out["hindsight"]:
            out["hindsight"]["ratio"] = args.against / out["hindsight"]["hindsight_wall_s"]
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
