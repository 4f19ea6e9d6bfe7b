"""Where a daemon's decode time went, from its step log (``SUFFIXD_STEP_LOG=PATH``: one
JSON line per shared step, written by daemon/generation/step_batch.py).

    SUFFIXD_STEP_LOG=steps.jsonl suffixd bench agent ... --concurrency 1,4
    python bench/step_log_summary.py steps.jsonl

Daemons that wrote to the same file one after another (a bench's levels) are told apart
by a pause of more than ``--gap`` seconds between steps. Per daemon, the steps grouped by
what they carried: ``promptP`` (P prompt chunks), ``decodeD`` (D decoding sequences), or
both; for each group its steps, seconds, prompt and decode rows (padding included) and
the tokens its decodes emitted.

``--mixed``: whether steps that carry prompt chunks beside decodes cost more than the same
rows would in separate steps. Least squares on the daemon's own steps: prompt-only steps
as rows, rows x context (attention grows with it) and chunks; decode-only steps as rows,
sequences, rows x context and a constant (the prompt fit pools every daemon of the log:
one after another, they ran the same model on the same machine). Each mixed step is
priced as its prompt part plus its decode part under those fits, against what it took.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np


def split(recs: list[dict[str, Any]], gap: float) -> list[list[dict[str, Any]]]:
    """The log cut into daemons: a pause of more than ``gap`` seconds between steps."""
    cuts = [0] + [i for i in range(1, len(recs)) if recs[i]["t"] - recs[i - 1]["t"] > gap]
    return [recs[a:b] for a, b in zip(cuts, [*cuts[1:], len(recs)], strict=True)]


def summarize(recs: list[dict[str, Any]], gap: float) -> list[dict[str, list[float]]]:
    runs = []
    for daemon in split(recs, gap):
        groups: dict[str, list[float]] = {}
        for r in daemon:
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


def _prompt_x(seqs: list[list[int]]) -> list[float]:
    return [sum(x[5] for x in seqs), sum(x[5] * (x[7] + x[5] / 2) for x in seqs) / 1000,
            len(seqs)]


def _decode_x(seqs: list[list[int]]) -> list[float]:
    return [sum(x[5] for x in seqs), len(seqs), sum(x[5] * x[7] for x in seqs) / 1000, 1]


def decode_fit(run: list[dict[str, Any]]) -> tuple[np.ndarray, int]:
    """Least squares of the run's decode-only steps' seconds on ``_decode_x`` (rows,
    sequences, rows x context, a constant), and how many steps it fitted (the
    coefficients are zeros with none)."""
    steps = [r for r in run if r["seqs"] and not any(s[1] for s in r["seqs"])]
    if not steps:
        return np.zeros(4), 0
    x = np.array([_decode_x(r["seqs"]) for r in steps])
    return np.linalg.lstsq(x, np.array([r["s"] for r in steps]), rcond=None)[0], len(steps)


def price_mixed(run: list[dict[str, Any]], pooled: list[dict[str, Any]]
                ) -> dict[str, float] | None:
    """The mixed steps' seconds of ``run`` against their parts priced by the fits
    (``--mixed``; prompt-only steps from ``pooled``), or None where there are too few
    steps of either kind to fit."""
    prompt_x, prompt_y, mixed = [], [], []
    for r in pooled:
        if all(x[1] for x in r["seqs"]):
            prompt_x.append(_prompt_x(r["seqs"]))
            prompt_y.append(r["s"])
    for r in run:
        p = [x for x in r["seqs"] if x[1]]
        d = [x for x in r["seqs"] if not x[1]]
        if p and d:
            mixed.append((p, d, r["s"]))
    cd, decode_steps = decode_fit(run)
    if len(prompt_y) < 4 or decode_steps < 5 or not mixed:
        return None
    cp = np.linalg.lstsq(np.array(prompt_x), np.array(prompt_y), rcond=None)[0]
    priced = sum(float(np.dot(cp, _prompt_x(p)) + np.dot(cd, _decode_x(d)))
                 for p, d, _ in mixed)
    took = sum(s for _, _, s in mixed)
    return {"mixed_steps": len(mixed), "took_s": took, "separately_s": priced,
            "fitted_prompt_steps": len(prompt_y), "fitted_decode_steps": decode_steps}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log", type=Path)
    ap.add_argument("--gap", type=float, default=2.5)
    ap.add_argument("--mixed", action="store_true",
                    help="price the prompt+decode steps as separate steps (see above)")
    args = ap.parse_args()
    recs = [json.loads(line) for line in args.log.read_text().splitlines() if line.strip()]
    if not recs:
        sys.exit(f"{args.log}: no steps")
    daemons = split(recs, args.gap)
    for i, groups in enumerate(summarize(recs, args.gap)):
        total = sum(g[1] for g in groups.values())
        print(f"daemon {i + 1}: {sum(int(g[0]) for g in groups.values())} steps, "
              f"{total:.1f} s in decodes")
        print(f"  {'steps of':<18} {'steps':>6} {'s':>7} {'prompt rows':>12} "
              f"{'decode rows':>12} {'emitted':>8} {'ms/step':>8}")
        for key, (n, s, pr, dr, em) in sorted(groups.items()):
            print(f"  {key:<18} {int(n):>6} {s:>7.2f} {int(pr):>12} {int(dr):>12} "
                  f"{int(em):>8} {1000 * s / n:>8.0f}")
        if args.mixed:
            m = price_mixed(daemons[i], recs)
            print("  mixed steps: too few steps to fit" if m is None else
                  f"  mixed steps: {m['mixed_steps']} took {m['took_s']:.2f} s; the same rows "
                  f"in separate steps, priced by fits of {m['fitted_prompt_steps']} prompt "
                  f"and {m['fitted_decode_steps']} decode steps: {m['separately_s']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
