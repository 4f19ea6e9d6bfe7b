"""Joint versus per-sequence draft lengths for N agents at once: a cost model, no model runs.

    python bench/joint_plan_model.py [WORKLOAD.jsonl ...] [--n 1,2,4,8] [--sessions S[,S]]
        [--turns T[,T]] [--profile NAME[=JSON] ...] [--no-padding] [--json]

The replay protocol of `suffixd bench replay` (../shared/data/README.md), with N sessions
in lockstep: N lanes take the workload's sessions from one queue in file order (a lane
whose session ends takes the next one), all drafting from one suffixcache Drafter (one
cache: session trees and the global tree of every finished response), as N agents on one
daemon. Every step, each lane in an assistant turn proposes its draft (the real Drafter,
its calibrated per-token acceptance estimates, its length rule at the profile's cost of a
step of its own); the step is planned by the daemon's own planner
(`daemon/generation/step_planner.py: plan_step`, which calls `joint_lengths` and pads each
run of consecutive sequence ids to its longest, as llama.cpp's split_equal needs); then
each lane's recorded response decides how many of its kept draft tokens are accepted
(the longest equal prefix, plus the verifier's own next token), and the drafter observes
the draft as the step cut it, exactly as the daemon's verifier reports it. Prompts
(the non-assistant messages) cost nothing here: only decoding steps are modelled.

Three policies, each its own replay (the drafter learns from what its policy verified):

* ``per-seq``: every draft as its drafter cut it for a step of its own
  (the daemon with SUFFIXD_JOINT_DRAFTS=0; padded all the same);
* ``joint``: in a shared step every drafter offers all its candidates
  (``Draft.extended()``) and ``joint_lengths`` chooses the lengths together, at the
  batcher's achieved rate (tokens per unit of step cost, tracked as StepBatcher does);
* ``plain``: no drafts, one row per sequence.

A step's cost is ``step_cost`` (verified rows at the profile's cost, padding rows at
PAD_ROW_WEIGHT of what they add), in units of a one-row step: plain decoding of one
session costs 1.0 per token. Acceptance is decided by the trace only: the estimates
choose lengths, never outcomes. Deterministic (no randomness; sessions in file order).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from suffixd.daemon.generation.step_batch import RATE_DECAY, RATE_PRIOR
from suffixd.daemon.generation.step_planner import StepRows, padded_rows, plan_step, step_cost

from suffixcache.cost import CostProfile
from suffixcache.drafter import DraftConfig, common_prefix_length
from suffixcache.replay import DraftSource, Session, SuffixSource

POLICIES = ("per-seq", "joint", "plain")
N_BATCH = 512  # the verifier's default n_batch: 8 sequences x 33 rows fit in one step
MAX_SPEC = 32  # drafts capped at 32, as in `suffixd bench replay`

# Cost of a step of k rows relative to one row (piecewise linear, extended with the last
# segment's slope). cpu2: the shared-step measurement of BENCHMARKS.md ("What a shared
# step costs": ~18 ms per decode + ~7 ms per row, gemma-3-270m, Intel Xeon 2-core VM),
# i.e. 1 + 0.28 (k - 1). mid: a row costs 1/32 of a lone step (a many-core CPU, or a GPU
# past its flat region). flat64: the same cost up to 64 rows (a GPU reads the weights
# once), then linear (128 rows cost 2); flat128 the same up to 128 rows (256 cost 2).
PROFILES: dict[str, dict[str, float]] = {
    "cpu2": {"1": 1.0, "2": 1.28},
    "mid": {"1": 1.0, "33": 2.0},
    "flat64": {"1": 1.0, "64": 1.0, "128": 2.0},
    "flat128": {"1": 1.0, "128": 1.0, "256": 2.0},
}


@dataclass
class Totals:
    """One (workload, N, profile, policy) replay."""

    steps: int = 0
    sequences: int = 0  # sequence-steps (summed over steps)
    tokens: int = 0  # emitted (accepted draft tokens + the verifier's own)
    accepted: int = 0
    rows: int = 0  # evaluated, padding included
    padding: int = 0
    drafted: int = 0  # draft tokens verified
    cost: float = 0.0
    turns: int = 0
    observed: list[tuple[int, list[int]]] = field(default_factory=list, repr=False)

    def figures(self) -> dict[str, float | int]:
        steps = max(self.steps, 1)
        return {
            "steps": self.steps,
            "turns": self.turns,
            "tokens": self.tokens,
            "seqs_per_step": round(self.sequences / steps, 3),
            "tokens_per_step": round(self.tokens / steps, 3),
            "rows_per_step": round(self.rows / steps, 3),
            "padding_per_step": round(self.padding / steps, 3),
            "accept_rate": round(self.accepted / max(self.drafted, 1), 3),
            "cost_per_token": round(self.cost / max(self.tokens, 1), 4),
        }


def expected_step(reqs: Sequence[StepRows], kept: Sequence[int],
                  cost: Callable[[int], float]) -> tuple[float, float]:
    """A planned step's expected emitted tokens (1 per sequence plus each kept draft
    token's estimated cumulative acceptance) and its modelled cost (padding included)."""
    expected = 0.0
    for r, k in zip(reqs, kept, strict=True):
        expected += 1.0 + (sum(float(p) for p in r.probs[: k - 1]) if r.probs is not None else 0.0)
    return expected, step_cost(cost, padded_rows(reqs, kept), kept)


@dataclass
class _Lane:
    index: int  # its sequence id: lanes are consecutive KV slots, as a daemon's
    key: str = ""
    session: Session | None = None
    msg: int = 0
    context: list[int] = field(default_factory=list)
    response: list[int] | None = None  # the recorded assistant turn being generated
    pos: int = 0


class _Sessions:
    """The queue the lanes take sessions from, with their turns capped."""

    def __init__(self, sessions: Sequence[Session], turns: int | None) -> None:
        self._it: Iterator[Session] = iter(sessions)
        self._turns = turns
        self.taken = 0

    def next(self) -> Session | None:
        s = next(self._it, None)
        if s is None:
            return None
        self.taken += 1
        if self._turns is None:
            return s
        out, n = [], 0
        for m in s.messages:
            if m.role == "assistant":
                if n == self._turns:
                    break
                n += 1
            out.append(m)
        return Session(s.name, out)


def _advance(lane: _Lane, queue: _Sessions, source: DraftSource) -> None:
    """Feeds the lane's prompts until its next assistant turn (taking the next session
    when one ends); leaves ``response`` None when the queue is empty."""
    lane.response = None
    while True:
        s = lane.session
        if s is None or lane.msg >= len(s.messages):
            if s is not None:
                source.end_session(lane.key)
            nxt = queue.next()
            if nxt is None:
                lane.session = None
                return
            lane.session, lane.msg, lane.context = nxt, 0, []
            lane.key = f"{queue.taken}:{nxt.name}"
            source.begin_session(lane.key)
            continue
        m = s.messages[lane.msg]
        lane.msg += 1
        if m.role != "assistant":
            toks = m.header + m.content
            source.append(lane.key, toks, generated=False)
            lane.context.extend(toks)
            continue
        source.append(lane.key, m.header, generated=False)
        lane.context.extend(m.header)
        if not m.content:
            continue
        lane.response, lane.pos = list(m.content), 0
        return


def simulate(
    sessions: Sequence[Session],
    n: int,
    source: DraftSource | None,
    cost: Callable[[int], float],
    policy: str,
    *,
    turns: int | None = None,
    max_spec: int = MAX_SPEC,
    record: bool = False,
    padding: bool = True,
) -> Totals:
    """N lanes in lockstep over ``sessions``; ``source`` drafts (None: plain decoding).
    ``padding``: lanes on consecutive sequence ids, padded as llama.cpp's split_equal
    needs with a KV stream per sequence; False: ids two apart, so the plan pads nothing
    (a unified KV cache, where any mix of rows is one ubatch)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}")
    if policy != "plain" and source is None:
        raise ValueError("a drafting policy needs a draft source")
    plain = policy == "plain"
    src: DraftSource = source if source is not None else _NoSource()
    queue = _Sessions(sessions, turns)
    lanes = [_Lane(i if padding else 2 * i) for i in range(n)]
    for lane in lanes:
        _advance(lane, queue, src)
    tot = Totals()
    rate_tokens = rate_cost = RATE_PRIOR
    while True:
        active = [lane for lane in lanes if lane.response is not None]
        if not active:
            break
        shared = len(active) > 1
        reqs: list[StepRows] = []
        drafts: list[Any] = []
        paths: list[list[int]] = []
        for lane in active:
            last = lane.context[-1] if lane.context else 0
            if plain:
                drafts.append(None)
                paths.append([])
                reqs.append(StepRows(lane.index, [last], len(lane.context), room=N_BATCH))
                continue
            draft: Any = src.propose(lane.key, lane.context, max_spec)
            path = draft.path()[:max_spec]
            probs = draft.probs
            # as the verifier: a path draft with estimates may be cut (or extended) by
            # the joint plan; the per-sequence policy keeps every draft as drafted
            trimmable = (policy == "joint" and probs is not None
                         and len(probs) >= len(path) and draft.is_path())
            want = len(path) + 1
            if trimmable and shared:
                draft = draft.extended()
                path = draft.path()[:max_spec]
                probs = draft.probs
            drafts.append(draft)
            paths.append(path)
            reqs.append(StepRows(lane.index, [last, *path], len(lane.context), room=N_BATCH,
                                 probs=list(probs[: len(path)]) if trimmable else None,
                                 want=want))
        chosen = plan_step(reqs, N_BATCH, cost, rate_tokens / rate_cost)
        if len(chosen) != len(reqs):  # N_BATCH holds 8 x 33 rows: never in this model
            raise RuntimeError("a step left a sequence out")
        c = step_cost(cost, [r.rows for r in reqs], [r.kept for r in reqs])
        emitted = 0
        for lane, req, draft, path in zip(active, reqs, drafts, paths, strict=True):
            assert lane.response is not None
            verified = path[: req.kept - 1]
            truth = lane.response[lane.pos:]
            # the trace decides: the longest prefix of the verified draft equal to the
            # recorded response, plus the verifier's own next token
            accepted = common_prefix_length(verified, truth)
            new = truth[: accepted + 1]
            if draft is not None:
                if len(verified) < len(path):
                    draft = draft.head(len(verified))
                src.observe(draft, accepted, new)
            if record:
                tot.observed.append((accepted, list(new)))
            src.append(lane.key, new, generated=True)
            lane.context.extend(new)
            lane.pos += len(new)
            emitted += len(new)
            tot.accepted += accepted
            tot.drafted += len(verified)
            if lane.pos >= len(lane.response):
                src.end_turn(lane.key, lane.response)
                tot.turns += 1
                _advance(lane, queue, src)
        tot.steps += 1
        tot.sequences += len(reqs)
        tot.tokens += emitted
        tot.rows += sum(r.rows for r in reqs)
        tot.padding += sum(r.rows - r.kept for r in reqs)
        tot.cost += c
        # the batcher's achieved rate (StepBatcher: decayed once per step)
        rate_tokens = rate_tokens * RATE_DECAY + emitted
        rate_cost = rate_cost * RATE_DECAY + c
    return tot


class _NoSource:
    """Plain decoding: nothing drafts; the lanes' bookkeeping still goes through it."""

    name = "plain"

    def begin_session(self, key: str) -> None: ...
    def append(self, key: str, tokens: Sequence[int], *, generated: bool) -> None: ...
    def propose(self, key: str, context: list[int], max_tokens: int) -> Any:
        raise AssertionError("plain decoding proposes nothing")
    def observe(self, draft: Any, accepted: int, accepted_tokens: Sequence[int]) -> None: ...
    def end_turn(self, key: str, response: Sequence[int]) -> None: ...
    def end_session(self, key: str) -> None: ...
    def memory(self) -> dict[str, int]:
        return {}


def run_grid(
    workloads: dict[str, tuple[list[Session], int | None]],
    ns: Sequence[int],
    profiles: dict[str, CostProfile],
    *,
    padding: bool = True,
    log: Callable[[str], None] = lambda s: None,
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for wname, (sessions, turns) in workloads.items():
        for n in ns:
            for pname, profile in profiles.items():
                label = pname if padding else f"{pname}, no padding"
                row: dict[str, Any] = {"workload": wname, "n": n, "profile": label}
                table = profile.table(N_BATCH)  # a step never holds more rows
                for policy in POLICIES:
                    source = None if policy == "plain" else SuffixSource(
                        profile, DraftConfig(max_tokens=MAX_SPEC))
                    tot = simulate(sessions, n, source, table.__getitem__, policy,
                                   turns=turns, padding=padding)
                    row[policy] = tot.figures()
                    log(f"{wname} N={n} {label} {policy}: {row[policy]}")
                per, joint, plain = (row[p]["cost_per_token"] for p in POLICIES)
                row["joint_vs_per_seq"] = round(per / joint, 4)
                row["joint_vs_plain"] = round(plain / joint, 4)
                row["per_seq_vs_plain"] = round(plain / per, 4)
                rows.append(row)
    return rows


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    def three(row: dict[str, Any], key: str, fmt: str) -> str:
        return " / ".join(format(row[p][key], fmt) for p in POLICIES)

    out = [
        "| workload | N | profile | sequences/step (per-seq / joint / plain) "
        "| tokens/step (per-seq / joint / plain) | rows/step (padding) per-seq / joint "
        "| cost/token per-seq / joint / plain "
        "| **joint vs per-seq** | joint vs plain | per-seq vs plain |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        pr = " / ".join(f"{r[p]['rows_per_step']:.2f} ({r[p]['padding_per_step']:.2f})"
                        for p in ("per-seq", "joint"))
        out.append(
            f"| {r['workload']} | {r['n']} | {r['profile']} | {three(r, 'seqs_per_step', '.2f')}"
            f" | {three(r, 'tokens_per_step', '.2f')} | {pr} | {three(r, 'cost_per_token', '.3f')}"
            f" | **{r['joint_vs_per_seq']:.3f}x** | {r['joint_vs_plain']:.3f}x"
            f" | {r['per_seq_vs_plain']:.3f}x |"
        )
    return "\n".join(out)


def plan_timing(ns: Sequence[int], draft: int = MAX_SPEC, repeat: int = 21) -> dict[int, float]:
    """Median µs of one ``plan_step`` of N decoding sequences (consecutive ids), each
    offering ``draft`` candidates (cumulative estimates 0.97^j, a different ratio per
    sequence), on the flat64 profile: the planner's own cost on bigger batches."""
    import time

    most = max(ns) * (draft + 1)
    table = CostProfile.from_mapping(PROFILES["flat64"]).table(most)
    out: dict[int, float] = {}
    for n in ns:
        times = []
        for _ in range(repeat):
            reqs = [StepRows(i, [1] * (draft + 1), 0, room=most,
                             probs=[(0.97 - 0.002 * i) ** (j + 1) for j in range(draft)],
                             want=draft // 2)
                    for i in range(n)]
            t0 = time.perf_counter()
            plan_step(reqs, most, table.__getitem__, 5.0)
            times.append(time.perf_counter() - t0)
        out[n] = round(sorted(times)[len(times) // 2] * 1e6, 1)
    return out


def _per_workload(ap: argparse.ArgumentParser, text: str, n: int,
                  option: str) -> list[int | None]:
    """A cap per workload from "V" or "V1,V2,..." (0 or nothing: no cap)."""
    try:
        vals = [int(x) for x in text.split(",")] if text else [0]
    except ValueError:
        ap.error(f"{option}: integers separated by commas")
    if len(vals) == 1:
        vals *= n
    if len(vals) != n:
        ap.error(f"{option}: one value, or one per workload")
    return [v or None for v in vals]


def main(argv: list[str] | None = None) -> None:
    from suffixd.benchkit.workloads import tokenized_workload

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workloads", type=Path, nargs="*", default=[
        Path("../shared/data/workloads/spider_dev.jsonl"),
        Path("../shared/data/workloads/swe_django.jsonl")],
        help="session-shaped JSONL (default: spider_dev and swe_django)")
    ap.add_argument("--n", default="1,2,4,8", help="sessions at once (comma-separated)")
    ap.add_argument("--sessions", default="", metavar="S[,S...]",
                    help="only the first S sessions (one value per workload, or one for all;"
                         " 0: all)")
    ap.add_argument("--turns", default="", metavar="T[,T...]",
                    help="only the first T assistant turns of each session (as --sessions)")
    ap.add_argument("--profile", action="append", default=None, metavar="NAME[=JSON]",
                    help="a cost profile: a built-in name or NAME={\"1\": 1, \"64\": 1.5}"
                         " (default: every built-in one: " + ", ".join(PROFILES) + ")")
    ap.add_argument("--no-padding", action="store_true",
                    help="sequences never padded (a unified KV cache; default: padded to the"
                         " longest of consecutive ids, as with a KV stream per sequence)")
    ap.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    ap.add_argument("--plan-timing", action="store_true",
                    help="only time plan_step for 1-64 sequences of 32 candidates")
    args = ap.parse_args(argv)
    if args.plan_timing:
        print(json.dumps({"plan_step_us": plan_timing([1, 2, 4, 8, 16, 32, 64])}))
        return
    profiles: dict[str, CostProfile] = {}
    for spec in args.profile or [f"{k}={json.dumps(v)}" for k, v in PROFILES.items()]:
        name, _, text = spec.partition("=")
        if not text and name not in PROFILES:
            ap.error(f"--profile {name}: not a built-in profile; give NAME=JSON")
        try:
            profiles[name] = CostProfile.from_json(text) if text else \
                CostProfile.from_mapping(PROFILES[name])
        except ValueError as exc:
            ap.error(f"--profile {name}: {exc}")
    sessions_cap = _per_workload(ap, args.sessions, len(args.workloads), "--sessions")
    turns_cap = _per_workload(ap, args.turns, len(args.workloads), "--turns")
    workloads: dict[str, tuple[list[Session], int | None]] = {}
    for path, s_cap, t_cap in zip(args.workloads, sessions_cap, turns_cap, strict=True):
        if not path.is_file():
            ap.error(f"no workload file {path} (the benchmark traces live in "
                     "../shared/data/workloads)")
        workloads[path.stem] = (tokenized_workload(path, None, s_cap), t_cap)
    ns = [int(x) for x in args.n.split(",") if x]
    rows = run_grid(workloads, ns, profiles, padding=not args.no_padding,
                    log=lambda s: print(s, file=sys.stderr, flush=True))
    if args.json:
        for r in rows:
            print(json.dumps(r))
    else:
        print(markdown(rows))


if __name__ == "__main__":
    main()
