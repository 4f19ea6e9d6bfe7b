"""The length rule's trade between tokens per step and speed-up, under the replay protocol.

    python bench/rate_frontier.py WORKLOAD.jsonl [--factor F ...] [--sessions N]

The Drafter keeps the draft prefix that maximises expected tokens - rate * cost, where
rate is the speed-up it already achieves (Dinkelbach). This replays the protocol of
`suffixd bench replay` (default cost profile, drafts capped at 32) with that rate scaled
by each factor F: F < 1 drafts longer (more tokens per step, eventually a lower
speed-up), F > 1 shorter. One JSON line per factor.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from suffixcache import CostProfile
from suffixcache.drafter import DraftConfig, Drafter
from suffixcache.replay import SuffixSource, replay


class _ScaledRateDrafter(Drafter):
    factor = 1.0

    @property
    def achieved_rate(self) -> float:
        return self.factor * super().achieved_rate


def main(argv: list[str] | None = None) -> None:
    from suffixd.benchkit.workloads import tokenized_workload

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload", type=Path)
    ap.add_argument("--factor", type=float, action="append", default=None)
    ap.add_argument("--sessions", type=int, default=None, help="only the first N sessions")
    args = ap.parse_args(argv)
    if not args.workload.is_file():
        ap.error(f"no workload file {args.workload} (the benchmark traces live in "
                 "../shared/data/workloads; examples/workloads has small ones)")
    sessions = tokenized_workload(args.workload, None, args.sessions)
    profile = CostProfile.cpu_default()
    for factor in args.factor or [1.0, 0.95, 0.9, 0.8]:
        source = SuffixSource(profile, DraftConfig(max_tokens=32))
        drafter = _ScaledRateDrafter(source.cache, source.drafter.config, profile)
        drafter.factor = factor
        source.drafter = drafter
        fig = replay(sessions, source, profile, max_spec=32).figures()
        print(
            json.dumps(
                {
                    "workload": args.workload.name,
                    "factor": factor,
                    "tokens_per_step": round(float(fig["tokens_per_step"]), 4),
                    "cpu_model_speedup": round(float(fig["cpu_model_speedup"]), 4),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
