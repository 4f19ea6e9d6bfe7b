"""Replay a target model's own greedy outputs through drafting policies (no model needed
after recording), under the verifier's measured cost profile.

    python bench/trace_replay.py record WORKLOAD.jsonl TRACES.jsonl [--turns N] [--max-tokens 64]
                                        [--model smollm2|PATH]
    python bench/trace_replay.py replay TRACES.jsonl [--cost-profile JSON]

`record` runs plain greedy decoding of the embedded model over a workload's turns (chat
template, sessions in file order, the bench generate skip rule for long prompts) and
stores prompt and output token ids per turn, with the verifier's measured cost profile.
`replay` then drafts for every step of those outputs, exactly as `bench generate` would
see them, and reports per policy (suffixd; suffixd_candidates, the same trees drafting all
they have; prompt lookup): tokens per step, accept rate, drafted tokens per step, the
cost-model speed-up, and the oracle ceiling (every draft truncated at its accepted
length: what a perfect length choice over the same candidates would reach). This is
how the end-to-end figures in BENCHMARKS.md are explained without re-running the model.

Between the two, suffixd_hindsight says how much of the gap better calibration could
close: the live replay's calibrated estimates (every candidate's, uncut) are refitted in
hindsight to what the verifier then did (isotonic regression of acceptance on the
estimate, fitted and scored on the same turns, so optimistic), and the replay is run
again choosing each draft's length from the refitted estimates by the same rule. What
remains between it and the oracle needs features that tell accepted from rejected
tokens apart, not a better length rule. `replay --informed 0.1,0.3` says how much: the
same replay with estimates that know each candidate's fate outright with that
probability (and are the refitted ones otherwise).
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def record(args: argparse.Namespace) -> None:
    from suffixd.benchkit.workloads import fits_side_by_side, load_turns
    from suffixd.daemon.generation.chat import ChatRenderer
    from suffixd.daemon.generation.verifier import GenerateParams, Verifier
    from suffixd.daemon.model import resolve_model_path

    n_ctx = 12288
    v = Verifier(resolve_model_path(args.model), n_ctx=n_ctx, n_slots=2)
    profile = v.measure_cost_profile()
    renderer = ChatRenderer(v)
    current = None
    with open(args.traces, "w") as out:
        out.write(json.dumps({"cost_profile": {str(k): c for k, c in profile.items()}}) + "\n")
        for session, msgs in load_turns(Path(args.workload), args.turns):
            prompt = renderer.tokens(msgs)
            if not fits_side_by_side(len(prompt), args.max_tokens, n_ctx):
                continue  # the turns bench generate measures
            if session != current:
                if current is not None:
                    v.forget(current)
                current = session
            toks: list[int] = []
            for chunk in v.generate(session, prompt, GenerateParams(max_tokens=args.max_tokens)):
                toks += chunk.tokens
            out.write(json.dumps({"session": session, "prompt": prompt, "output": toks}) + "\n")
    v.close()


Estimates = list[tuple[float, bool]]  # (conditional acceptance estimate, accepted)


def _candidate_estimates(drafter: Any, draft: Any) -> list[float]:
    """The calibrator's estimate for every candidate the trees offered, each conditional on
    the one before it accepted (the live rule sees only the prefix it keeps)."""
    c = draft.candidates
    cum, _ = drafter.calibrator.choose_draft(
        c, draft.prev, drafter.cost_profile.table(len(c) + 2), 0.0, False, draft.last_token
    )
    return [cum[0], *(b / a if a > 0 else 0.0 for a, b in zip(cum, cum[1:], strict=False))]


def _isotonic(pairs: Estimates) -> Callable[[float], float]:
    """Non-decreasing least-squares fit of acceptance on the estimate (pool adjacent
    violators), as a step function."""
    import bisect

    groups: dict[float, list[float]] = {}  # estimate -> [hits, count]: ties pool first
    for est, hit in pairs:
        g = groups.setdefault(est, [0.0, 0.0])
        g[0] += hit
        g[1] += 1
    blocks: list[list[float]] = []  # [upper estimate, hits, count]
    for est in sorted(groups):
        blocks.append([est, *groups[est]])
        while len(blocks) > 1 and blocks[-2][1] / blocks[-2][2] >= blocks[-1][1] / blocks[-1][2]:
            top = blocks.pop()
            blocks[-1] = [top[0], blocks[-1][1] + top[1], blocks[-1][2] + top[2]]
    uppers = [b[0] for b in blocks]
    means = [b[1] / b[2] for b in blocks]

    def fit(est: float) -> float:
        return means[min(bisect.bisect_left(uppers, est), len(means) - 1)]

    return fit


def _auc(pairs: Estimates) -> float:
    """How well the estimate ranks accepted above rejected candidates (0.5: not at all)."""
    ranked = sorted(pairs)
    pos = sum(hit for _, hit in ranked)
    neg = len(ranked) - pos
    if not pos or not neg:
        return 0.5
    rank_sum, i = 0.0, 0
    while i < len(ranked):  # tied estimates share their mean rank
        j = i
        while j < len(ranked) and ranked[j][0] == ranked[i][0]:
            j += 1
        rank_sum += sum(hit for _, hit in ranked[i:j]) * (i + j + 1) / 2
        i = j
    return (rank_sum - pos * (pos + 1) / 2) / (pos * neg)


def _refit_choice(drafter: Any, draft: Any, refit: Callable[[float], float],
                  truth: Sequence[int], informed: float, rng: random.Random) -> Any:
    """The draft cut where the refitted estimates put the live length rule's optimum;
    with probability ``informed`` a candidate's estimate is its fate (``truth``: the text
    that follows) instead."""
    from suffixcache.drafter import Draft

    c = draft.candidates
    tokens = c.tokens(0)
    cum, probs = 1.0, []
    for k, r in enumerate(_candidate_estimates(drafter, draft), start=1):
        if informed and rng.random() < informed:
            cum *= float(k <= len(truth) and tokens[k - 1] == truth[k - 1])
        else:
            cum *= refit(r)
        probs.append(cum)
    best_k = drafter._best_prefix(probs)  # the live rule (Dinkelbach), on these estimates
    return Draft(tokens[:best_k], list(range(-1, best_k - 1)), probs[:best_k],
                 [draft.source] * best_k, draft.match_len, sum(probs[:best_k]), key=draft.key,
                 prev=draft.prev, seq_id=draft.seq_id, last_token=draft.last_token,
                 candidates=c, context_tail=draft.context_tail)


def _replay(turns: list[dict[str, Any]], profile: Any, policy: str,
            estimates: Estimates | None = None,
            refit: Callable[[float], float] | None = None,
            informed: float = 0.0) -> dict[str, float]:
    """One policy over the traces; ``estimates`` collects the live calibrator's estimates
    with their outcomes, ``refit`` (suffixd_hindsight) re-chooses lengths from them,
    ``informed`` of them replaced by the candidates' fates."""
    import numpy as np
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    from suffixd.benchkit.generate import feed_prompt

    from suffixcache import CostProfile, Drafter, SuffixCache, common_prefix_length
    from suffixcache.drafter import _judged

    rng = random.Random(0)

    cache = SuffixCache()
    # "suffixd_candidates": the same trees drafting everything they have (a flat profile),
    # so that its oracle figure is the ceiling of the suffix-tree candidates themselves.
    plan = CostProfile.flat() if policy == "suffixd_candidates" else profile
    drafter = Drafter(cache, cost_profile=plan)
    pld = LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=10)
    ns, current, seq = "trace", None, 0
    last: dict[str, list[int]] = {}
    steps = tokens = drafted = accepted = 0
    cost = oracle = 0.0
    for t in turns:
        session, prompt, out = t["session"], t["prompt"], t["output"]
        if session != current:
            if current is not None and cache.has_session(ns, current):
                cache.close_session(ns, current)
            current = session
        feed_prompt(cache, ns, session, prompt, last)
        n = 0
        while n < len(out):
            k = min(32, len(out) - n - 1)
            ctx = prompt + out[:n]
            draft = None
            if k <= 0:
                path: list[int] = []
            elif policy.startswith("suffixd"):
                draft = drafter.propose(ns, session, ctx, max_tokens=k)
                if draft.candidates is not None and estimates is not None:
                    est = _candidate_estimates(drafter, draft)
                    # judged up to and with the first miss, as the calibrator learns them
                    estimates += zip(est, _judged(draft.candidates.tokens(0), out[n:])[0],
                                     strict=False)
                if draft.candidates is not None and refit is not None:
                    draft = _refit_choice(drafter, draft, refit, out[n:], informed, rng)
                path = list(draft.path())
            else:
                path = [int(x) for x in pld(np.asarray(ctx, dtype=np.intc))[:k]]
            a = common_prefix_length(path, out[n : n + len(path)])
            if draft is not None:  # empty drafts too, as the verifier's on_step does
                drafter.observe(draft, a, out[n : n + a + 1])
            steps += 1
            drafted += len(path)
            accepted += a
            cost += profile.cost(len(path) + 1)
            oracle += profile.cost(a + 1)
            if policy.startswith("suffixd"):
                cache.append_session(ns, session, out[n : n + a + 1])
            n += a + 1
        tokens += len(out)
        if policy.startswith("suffixd") and out:
            cache.add_response(ns, seq, out)
            seq += 1
    return {
        "tokens_per_step": round(tokens / max(steps, 1), 3),
        "accept_rate": round(accepted / max(drafted, 1), 3),
        "drafted_per_step": round(drafted / max(steps, 1), 3),
        "cost_model_speedup": round(tokens / max(cost, 1e-9), 3),
        "oracle_truncation_speedup": round(tokens / max(oracle, 1e-9), 3),
    }


def replay(args: argparse.Namespace) -> None:
    from suffixcache import CostProfile

    lines = [json.loads(x) for x in Path(args.traces).read_text().splitlines() if x.strip()]
    header, turns = lines[0], lines[1:]
    profile = CostProfile.from_json(args.cost_profile or header["cost_profile"])
    out: dict[str, Any] = {"turns": len(turns), "tokens": sum(len(t["output"]) for t in turns)}
    estimates: Estimates = []
    out["suffixd"] = _replay(turns, profile, "suffixd", estimates=estimates)
    refit = _isotonic(estimates)
    out["suffixd_hindsight"] = _replay(turns, profile, "suffixd_hindsight", refit=refit)
    for w in args.informed:
        out[f"suffixd_informed_{w:g}"] = _replay(turns, profile, "suffixd_informed",
                                                 refit=refit, informed=w)
    for policy in ("suffixd_candidates", "pld"):
        out[policy] = _replay(turns, profile, policy)
    oracle = out["suffixd_candidates"]["oracle_truncation_speedup"]
    informed = [f"suffixd_informed_{w:g}" for w in args.informed]
    for policy in ("suffixd", "suffixd_hindsight", *informed):
        out[f"{policy}_of_oracle"] = round(out[policy]["cost_model_speedup"] / oracle, 3)
    out["estimate_auc"] = round(_auc(estimates), 3)
    print(json.dumps(out))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("workload")
    r.add_argument("traces")
    r.add_argument("--turns", type=int, default=500)
    r.add_argument("--max-tokens", type=int, default=64)
    r.add_argument("--model", default=None,
                   help="GGUF path or packaged name (smollm2); default the embedded gemma-3-270m")
    p = sub.add_parser("replay")
    p.add_argument("traces")
    p.add_argument("--cost-profile", default=None)
    p.add_argument("--informed", default=[], metavar="W1,W2",
                   type=lambda v: [float(x) for x in v.split(",") if x.strip()],
                   help="also replay with estimates that know each candidate's fate with "
                        "these probabilities")
    args = ap.parse_args(argv)
    source = Path(args.workload if args.cmd == "record" else args.traces)
    if not source.is_file():
        ap.error(f"no such file: {source} (the benchmark workloads live in "
                 "../shared/data/workloads)")
    {"record": record, "replay": replay}[args.cmd](args)


if __name__ == "__main__":
    main()
