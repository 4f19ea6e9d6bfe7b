"""Is the drafting policy's length cut right? Calibration at the cut, under the replay protocol.

    python bench/policy_cut.py WORKLOAD.jsonl [--sessions N]

Runs `suffixd bench replay`'s protocol (default cost profile, drafts capped at 32) with
the shipped Drafter, and checks its calibrated acceptance estimates in two places:

* inside the drafts: every drafted token whose parent was accepted, estimated
  P(accepted | parent accepted) against what happened;
* at the cut: where a draft was accepted whole and the trees had a next token the
  policy declined, the estimate for that declined token against whether the recorded
  response really continued with it.

If the declined tokens were accepted more often than estimated, the policy cuts too
early and a better length rule would pay; if the estimates at the cut are right or
optimistic, the drafts it declines would not have paid, and the remaining gap to the
oracle (which peeks at the response) is what these features cannot predict.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from suffixcache import CostProfile
from suffixcache.drafter import Draft
from suffixcache.replay import SuffixSource, replay

BUCKETS = 10


class _Recorder:
    """Stands in for the Drafter's native calibrator, keeping the last choice's estimates
    for every candidate token (the Drafter keeps only the prefix it chose)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.last: tuple[list[float], list[int]] = ([], [])

    def choose(self, *args: Any) -> tuple[list[float], int]:
        probs, keep = self.inner.choose(*args)
        self.last = (list(probs), list(args[9]))  # args[9]: the candidate tokens
        return probs, keep

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@dataclass
class _Tally:
    n: list[int] = field(default_factory=lambda: [0] * BUCKETS)
    hits: list[int] = field(default_factory=lambda: [0] * BUCKETS)
    est: list[float] = field(default_factory=lambda: [0.0] * BUCKETS)

    def add(self, p: float, hit: bool) -> None:
        b = min(int(p * BUCKETS), BUCKETS - 1)
        self.n[b] += 1
        self.hits[b] += hit
        self.est[b] += p

    def rows(self) -> list[dict[str, float]]:
        return [
            {
                "estimate": round(self.est[b] / self.n[b], 3),
                "actual": round(self.hits[b] / self.n[b], 3),
                "tokens": self.n[b],
            }
            for b in range(BUCKETS)
            if self.n[b]
        ]

    def totals(self) -> dict[str, float]:
        n = max(sum(self.n), 1)
        return {
            "tokens": sum(self.n),
            "expected_hits": round(sum(self.est), 1),
            "actual_hits": sum(self.hits),
            "mean_estimate": round(sum(self.est) / n, 3),
            "mean_actual": round(sum(self.hits) / n, 3),
        }


def _conditional(cum: Sequence[float], i: int) -> float:
    return cum[i] / cum[i - 1] if i and cum[i - 1] > 0 else cum[i]


@dataclass
class _Probe:
    """What the replay sees of a draft; its accepted_length also scores the estimates."""

    draft: Draft
    candidate: list[int]
    cum: list[float]
    probe: CutProbe

    @property
    def tokens(self) -> list[int]:
        return self.draft.tokens

    def accepted_length(self, truth: Sequence[int]) -> int:
        a = self.draft.accepted_length(truth)
        keep = len(self.draft.tokens)
        for i in range(min(keep, a + 1)):
            self.probe.inside.add(_conditional(self.cum, i), i < a)
        if a == keep and keep < len(self.candidate) and keep < len(truth):
            self.probe.cut.add(_conditional(self.cum, keep), truth[keep] == self.candidate[keep])
        return a


class CutProbe(SuffixSource):
    name = "suffixd"

    def __init__(self, cost_profile: CostProfile) -> None:
        super().__init__(cost_profile)
        self.recorder = _Recorder(self.drafter.calibrator)
        self.drafter.calibrator = self.recorder
        self.inside, self.cut = _Tally(), _Tally()

    def propose(self, key: str, context: list[int], max_tokens: int) -> Any:
        # A propose that finds no candidate never calls choose: no stale estimates then.
        self.recorder.last = ([], [])
        draft = super().propose(key, context, max_tokens)
        cum, candidate = self.recorder.last
        return _Probe(draft, candidate, cum, self)

    def observe(self, draft: Any, accepted: int, accepted_tokens: Sequence[int]) -> None:
        super().observe(draft.draft, accepted, accepted_tokens)


def main(argv: list[str] | None = None) -> None:
    from suffixd.benchkit.workloads import tokenized_workload

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload", type=Path)
    ap.add_argument("--sessions", type=int, default=None, help="replay only the first N")
    args = ap.parse_args(argv)
    if not args.workload.is_file():
        ap.error(f"no workload file {args.workload} (the benchmark traces live in "
                 "../shared/data/workloads; examples/workloads has small ones)")
    profile = CostProfile.cpu_default()
    sessions = tokenized_workload(args.workload, None, args.sessions)
    probe = CutProbe(profile)
    figures = replay(sessions, probe, profile, max_spec=32).figures()
    out = {
        "workload": args.workload.name,
        "tokens_per_step": round(float(figures["tokens_per_step"]), 3),
        "cpu_model_speedup": round(float(figures["cpu_model_speedup"]), 3),
        "inside": probe.inside.totals(),
        "cut": probe.cut.totals(),
        "cut_by_estimate": probe.cut.rows(),
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
