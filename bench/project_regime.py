"""A projection, not a measurement: what the trees, a draft model and both would give a
verifier whose k verified rows cost about one decode (a 30B-class model on a many-core
CPU, or a GPU), on the recorded agent traces (issue 48).

The replay protocol (suffixcache/replay.py, ``suffixd bench replay``) runs the traces
with three draft sources under one cost profile, ``cost(k) = 1 + slope * (k - 1)``
decodes for k verified rows:

* trees: suffixd's own drafting (session and global trees), as ``bench replay`` does;
* draft model: a simulated small model of the same family that drafts every step, each
  token right with probability ``--accept`` (a run of hits ending at the first miss),
  ``k`` tokens as the daemon's own policy (``AdaptiveDrafter.plan``) would choose them at
  that acceptance, each drafted token costing ``--draft-cost`` decodes of the verifier;
* both: the trees first, the draft model where they have nothing (the daemon's
  ``FallbackProposer``).

The draft model is simulated because no 0.5-1.5B draft of a 30B verifier runs here:
its acceptance and cost are the projection's assumptions, printed beside every figure
(published figures for Qwen2.5-0.5B drafting for Qwen2.5-32B on code are ~0.6-0.8 per
token; a Q4 0.5B model reads ~1/40 of a Q4 32B model's bytes per token, so 0.03-0.05 of
a memory-bound decode). The trees' part is not simulated: it is the replay itself.

    python bench/project_regime.py ../shared/data/workloads/spider_dev.jsonl --sessions 4
    python bench/project_regime.py WORKLOAD --slope 0.05 --accept 0.6,0.7,0.8 \\
        --draft-cost 0.03,0.05 [--json]
    python bench/project_regime.py WORKLOAD --profile build/device-profiles/gpu-27b.cost.json \\
        --draft-cost 0.31       # a device's measured curve and draft (bench/device/)

Prints, per (acceptance, draft cost): speed-up over plain decoding (tokens per unit of
one decode's time) of trees alone, the draft model alone and both.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from suffixd.benchkit.workloads import tokenized_workload
from suffixd.daemon.generation.draft_model import AdaptiveDrafter

from suffixcache import CostProfile
from suffixcache.replay import SuffixSource, replay


def linear_profile(slope: float, up_to: int = 64) -> CostProfile:
    """k verified rows cost 1 + slope * (k - 1) decodes."""
    return CostProfile.from_json(json.dumps({str(k): 1 + slope * (k - 1)
                                             for k in (1, 2, 4, 8, 16, 32, up_to)}))


@dataclass
class SimulatedDraft:
    """A draft model's k tokens, right one by one with probability ``accept``: the replay
    asks how much of it the recorded text accepts (``accepted_length``)."""

    k: int
    accept: float
    rng: random.Random
    tokens: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = [0] * self.k

    def accepted_length(self, truth: Sequence[int]) -> int:
        n = 0
        while n < min(self.k, len(truth)) and self.rng.random() < self.accept:
            n += 1
        return n


class ProjectedSource:
    """The trees (``use_trees``), then a simulated draft model (``use_model``) where the
    trees offer nothing; counts the draft model's tokens (their cost is added after)."""

    def __init__(self, profile: CostProfile, use_trees: bool, use_model: bool,
                 accept: float, draft_cost: float, max_tokens: int, seed: int) -> None:
        self.trees = SuffixSource(profile)
        self.use_trees, self.use_model = use_trees, use_model
        self.accept = accept
        self.name = "+".join(n for n, on in (("trees", use_trees), ("model", use_model)) if on)
        verify = {k: profile.cost(k) for k in range(1, max_tokens + 2)}
        k, _ = AdaptiveDrafter(lambda c, n, key: [], verify, draft_cost, max_tokens) \
            .plan(max_tokens, accept)
        self.k = k
        self.rng = random.Random(seed)
        self.model_tokens = 0
        self.model_steps = 0

    def begin_session(self, key: str) -> None:
        self.trees.begin_session(key)

    def append(self, key: str, tokens: Sequence[int], *, generated: bool) -> None:
        self.trees.append(key, tokens, generated=generated)

    def propose(self, key: str, context: list[int], max_tokens: int) -> Any:
        if self.use_trees:
            draft = self.trees.propose(key, context, max_tokens)
            if len(draft.tokens) or not self.use_model:
                return draft
        if self.use_model and self.k > 0:
            self.model_tokens += self.k
            self.model_steps += 1
            return SimulatedDraft(min(self.k, max_tokens), self.accept, self.rng)
        return self.trees.propose(key, context, 0)

    def observe(self, draft: Any, accepted: int, accepted_tokens: Sequence[int]) -> None:
        if not isinstance(draft, SimulatedDraft):
            self.trees.observe(draft, accepted, accepted_tokens)

    def end_turn(self, key: str, response: Sequence[int]) -> None:
        self.trees.end_turn(key, response)

    def end_session(self, key: str) -> None:
        self.trees.end_session(key)

    def memory(self) -> dict[str, int]:
        return self.trees.memory()


def project(sessions: list[Any], profile: CostProfile, accept: float, draft_cost: float,
            max_tokens: int, seed: int) -> dict[str, Any]:
    """Speed-ups over plain decoding of trees, the draft model and both, for one
    (acceptance, draft cost)."""
    out: dict[str, Any] = {"accept": accept, "draft_cost": draft_cost}
    for trees, model in ((True, False), (False, True), (True, True)):
        src = ProjectedSource(profile, trees, model, accept, draft_cost, max_tokens, seed)
        res = replay(sessions, src, profile, max_spec=32)
        cost = res.cost + draft_cost * src.model_tokens
        out[src.name] = {"speedup": round(res.out_tokens / cost, 3),
                         "tokens_per_step": round(res.out_tokens / max(res.steps, 1), 3),
                         "model_k": src.k if model else 0,
                         "model_steps": src.model_steps, "steps": res.steps}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workload", type=Path)
    ap.add_argument("--sessions", type=int, default=None)
    ap.add_argument("--slope", type=float, default=0.05,
                    help="Each verified row past the first costs this many decodes.")
    ap.add_argument("--profile", type=Path, default=None,
                    help="A measured cost profile ({\"k\": decodes}, e.g. the device kit's "
                         "bench/device/kit_profiles.py output) instead of --slope.")
    ap.add_argument("--accept", default="0.6,0.7,0.8",
                    help="Per-token acceptance of the simulated draft model(s).")
    ap.add_argument("--draft-cost", default="0.03,0.05",
                    help="One drafted token's cost, in decodes of the verifier.")
    ap.add_argument("--max-tokens", type=int, default=8,
                    help="The draft model's longest draft (the daemon's policy: 8).")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sessions = tokenized_workload(args.workload, None, args.sessions)
    if args.profile is not None:
        profile = CostProfile.from_json(args.profile.read_text())
        regime = f"k verified rows cost what {args.profile} measured"
    else:
        profile = linear_profile(args.slope)
        regime = f"k verified rows cost 1 + {args.slope:g}(k-1) decodes"
    rows = [project(sessions, profile, float(a), float(c), args.max_tokens, args.seed)
            for a in args.accept.split(",") for c in args.draft_cost.split(",")]
    if args.json:
        print(json.dumps({"workload": args.workload.name, "projection": True, "regime": regime,
                          "rows": rows}))
        return
    print(f"PROJECTION on {args.workload.name} ({len(sessions)} sessions): {regime}; "
          f"the draft model is simulated")
    print("| draft acceptance | draft token cost | trees | draft model (k) | both |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['accept']:g} | {r['draft_cost']:g} | {r['trees']['speedup']:.2f}x | "
              f"{r['model']['speedup']:.2f}x ({r['model']['model_k']}) | "
              f"{r['trees+model']['speedup']:.2f}x |")


if __name__ == "__main__":
    main()
