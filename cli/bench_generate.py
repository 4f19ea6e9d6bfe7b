"""`suffixd bench generate`: end-to-end generation through the real model.

Replays a workload's assistant turns (prompt = every earlier message of the
session, rendered with the model's chat template) three ways in one run, turn
by turn so that machine noise hits all of them alike:

* plain: one token per llama.cpp evaluation;
* suffixd: drafts from suffixcache (session tree + global tree of earlier
  responses; state carries across sessions), cost-aware with the verifier's
  measured cost profile;
* pld: llama-cpp-python's LlamaPromptLookupDecoding (n-gram 2, 10 tokens) as
  the drafter of the same verifier loop.

Greedy outputs are compared with plain decoding: identical; parting at a
near-tie (see ``verifier.certify_greedy``); parting at a "shape flip" (beyond
the near-tie threshold, but fresh evaluations of the same tokens with each
run's batch shape and the prefix chunked in several ways pick each run's token
under some schedule, so the difference is llama.cpp's batch arithmetic, see
``Verifier.schedule_flip``); anything else is a divergence and makes
``identical_outputs`` false.

With ``--llama-server PATH`` (bench/build_llama_server.sh builds it from the same
llama.cpp version) the same turns also go, in the same per-turn rotation, to
llama-server plain and with each of its n-gram speculative types (one process each,
one slot, prompt cache on, greedy, the same prompt tokens and threads): decode tok/s,
prompt tok/s and whole-turn latency side by side, suffixd's ratio to the best of them,
and how often llama-server's modes agree with its own plain output. ``--load N`` runs N
busy processes beside the whole run.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from .llama_server import llama_server_options, plain_of

MODES = ("plain", "suffixd", "pld")


def load_session_turns(path: Path, sessions: int) -> list[tuple[str, list[dict[str, str]]]]:
    """Every assistant turn of the first ``sessions`` sessions, in order: (session, the
    messages before the turn), as an agent sends them (recorded history)."""
    turns: list[tuple[str, list[dict[str, str]]]] = []
    with path.open() as f:
        for n, line in enumerate(f):
            if n >= sessions:
                break
            if not line.strip():
                continue
            rec = json.loads(line)
            msgs = rec["messages"]
            turns += [(str(rec["session"]), msgs[:i]) for i, m in enumerate(msgs)
                      if m["role"] == "assistant"]
    return turns


def _load_turns(path: Path, limit: int) -> list[tuple[str, list[dict[str, str]]]]:
    turns: list[tuple[str, list[dict[str, str]]]] = []
    with path.open() as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            msgs = rec["messages"]
            for i, m in enumerate(msgs):
                if m["role"] == "assistant":
                    turns.append((str(rec["session"]), msgs[:i]))
                    if len(turns) >= limit:
                        return turns
    return turns


def p95(xs: Sequence[float]) -> float:
    """The 95th percentile as every bench reports it (nearest rank below); 0 for none."""
    lat = sorted(xs)
    return lat[int(0.95 * (len(lat) - 1))] if lat else 0.0


def fits_side_by_side(prompt_len: int, max_tokens: int, n_ctx: int) -> bool:
    """Whether a turn fits a session's context (each mode keeps its own KV slot)."""
    return prompt_len + max_tokens + 64 <= n_ctx


def feed_prompt(
    cache: Any, ns: str, session: str, prompt: list[int], last_prompt: dict[str, list[int]]
) -> None:
    """The session tree sees a turn's prompt before generating: a later prompt repeats the
    earlier one, so only its new part is appended."""
    prev = last_prompt.get(session)
    if not cache.has_session(ns, session):
        cache.open_session(ns, session, prompt)
    elif prev is not None and prompt[: len(prev)] == prev:
        cache.append_session(ns, session, prompt[len(prev) :])
    else:
        cache.append_session(ns, session, prompt)
    last_prompt[session] = prompt


def replays_both(
    verifier: Any, context: list[int], ref: list[Any], cand: list[Any], where: int
) -> bool:
    """Whether rebuilding the KV cache the way each run built it during this turn (its own
    sequence of batches, rolled back as it was) makes llama.cpp pick that run's token at
    the parting: then each run did exactly what the model computes for its schedule."""
    for chunk in (512, 256):  # the prompt before the turn's first batch: n_batch chunks
        if verifier.replayed_choice(context, ref, ref[where], chunk) == ref[where].token and (
            verifier.replayed_choice(context, cand, cand[where], chunk) == cand[where].token
        ):
            return True
    return False


@click.command("generate")
@click.argument("workload", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--turns", default=200, show_default=True, help="Assistant turns to replay.")
@click.option("--max-tokens", default=64, show_default=True, help="Tokens generated per turn.")
@click.option("--model", default=None, help="GGUF path (default: the embedded model).")
@click.option("--n-ctx", default=12288, show_default=True)
@click.option("--threads", default=2, show_default=True)
@click.option("--modes", default=",".join(MODES), show_default=True)
@click.option("--load", "load", default=0, show_default=True,
              help="Busy processes to run beside the benchmark (a loaded machine).")
@llama_server_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def generate_bench(
    workload: Path,
    turns: int,
    max_tokens: int,
    model: str | None,
    n_ctx: int,
    threads: int,
    modes: str,
    llama_server: str | None,
    spec_types: str | None,
    load: int,
    ls_flash_attn: str,
    ls_plain: bool,
    as_json: bool,
) -> None:
    """Replay WORKLOAD's prompts through the real model: plain, suffixd and prompt lookup."""
    from ..daemon.model import resolve_model_path

    wanted = [m.strip() for m in modes.split(",") if m.strip()]
    if not wanted or any(m not in MODES for m in wanted) or "plain" not in wanted:
        raise click.BadParameter(
            f"--modes: a subset of {MODES} including plain", param_hint="--modes"
        )
    from .llama_server import BusyLoad, LlamaServer, start_servers

    model_path = resolve_model_path(model)
    servers: dict[str, LlamaServer] = {}
    if llama_server:
        servers = start_servers(llama_server, model_path, threads=threads, n_ctx=n_ctx,
                                spec_types_wanted=spec_types, flash_attn=ls_flash_attn,
                                plain=ls_plain)
    busy = BusyLoad(load) if load else None
    try:
        todo = _load_turns(workload, turns)
        if not todo:
            raise click.ClickException(f"{workload}: no assistant turns")
        out = _run(workload, todo, max_tokens, model_path, n_ctx, threads, wanted, servers,
                   as_json)
    finally:
        for srv in servers.values():
            srv.close()
        if busy is not None:
            busy.close()
    out["load_processes"] = load
    if as_json:
        click.echo(json.dumps(out))
        return
    _print(out, wanted, list(servers))


def _run(
    workload: Path, todo: list[tuple[str, list[dict[str, str]]]], max_tokens: int,
    model_path: Path, n_ctx: int, threads: int, wanted: list[str], servers: dict[str, Any],
    as_json: bool,
) -> dict[str, Any]:
    """Replays ``todo``'s turns through every mode, turn by turn; the figures as a dict."""
    import numpy as np
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    from tqdm import tqdm

    from suffixcache import CostProfile, Drafter, SuffixCache

    from ..daemon.generation.certify import NEAR_TIE_GAP, certify_greedy
    from ..daemon.generation.chat import ChatRenderer
    from ..daemon.generation.pipeline import cost_rounds
    from ..daemon.generation.verifier import GenerateParams, Verifier

    # n_ctx 0: the model's trained context (the verifier caps what it is given there)
    verifier = Verifier(model_path, n_ctx=n_ctx or 1 << 30, n_threads=threads, n_slots=4)
    n_ctx = verifier.n_ctx
    renderer = ChatRenderer(verifier)
    rounds, max_rounds = cost_rounds()
    profile = verifier.measure_cost_profile(reps=rounds, max_rounds=max_rounds)
    cache = SuffixCache()
    drafter = Drafter(
        cache, cost_profile=CostProfile.from_json({str(k): v for k, v in profile.items()})
    )
    pld = LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=10)
    ns = "bench"

    agg: dict[str, dict[str, float]] = {
        m: {
            "tokens": 0,
            "rate_tokens": 0,
            "decode_s": 0.0,
            "prompt_s": 0.0,
            "total_s": 0.0,
            "prompt_tokens": 0,
            "cached_prompt_tokens": 0,
            "steps": 0,
            "drafted": 0,
            "accepted": 0,
        }
        for m in wanted
    }
    for m in servers:
        agg[m] = {k: 0.0 for k in next(iter(agg.values()))}
    latencies: dict[str, list[float]] = {m: [] for m in [*wanted, *servers]}
    session_wall: dict[str, dict[str, float]] = {m: {} for m in [*wanted, *servers]}
    unfit: list[dict[str, Any]] = []

    def ls_reference(m: str) -> str:
        # a mode against the plain decoding of its own flash-attention setting (and
        # plain without flash attention against its default)
        return "ls-plain" if m == "ls-plain-fa-off" else plain_of(m)

    ls_agree = {m: 0 for m in servers if m != "ls-plain" and ls_reference(m) in servers}
    ls_tokens: dict[str, list[int]] = {}
    verdicts = {
        m: {"identical": 0, "near_tie": 0, "shape_flip": 0, "diverged": 0}
        for m in wanted
        if m != "plain"
    }
    diverged: list[dict[str, Any]] = []
    last_prompt: dict[str, list[int]] = {}
    current: str | None = None
    next_seq = 0
    skipped = 0
    for session, msgs in tqdm(todo, desc="turns", disable=as_json, file=sys.stderr):
        prompt = renderer.tokens(msgs)
        if not fits_side_by_side(len(prompt), max_tokens, n_ctx):
            skipped += 1
            unfit.append({"session": session, "prompt_tokens": len(prompt)})
            continue
        if session != current:
            if current is not None and cache.has_session(ns, current):
                cache.close_session(ns, current)
                for m in wanted:
                    verifier.forget(f"{m}/{current}")
            current = session
        feed_prompt(cache, ns, session, prompt, last_prompt)
        params = GenerateParams(max_tokens=max_tokens, record_gaps=True)
        fed = [len(prompt)]  # context tokens the session tree holds

        def suffixd_propose(
            ctx: list[int], k: int, _s: str = session, _fed: list[int] = fed
        ) -> Any:
            # The session tree follows the response step by step, as the replay protocol
            # has it: a response that repeats itself is drafted from its own beginning.
            if len(ctx) > _fed[0]:
                cache.append_session(ns, _s, ctx[_fed[0] :])
                _fed[0] = len(ctx)
            return drafter.propose(ns, _s, ctx, max_tokens=k)

        proposers = {
            "plain": None,
            "suffixd": suffixd_propose,
            "pld": lambda ctx, k: [int(t) for t in pld(np.asarray(ctx, dtype=np.intc))[:k]],
        }
        results: dict[str, tuple[list[int], list[Any]]] = {}
        for m in wanted:
            toks: list[int] = []
            gaps: list[Any] = []
            last = None
            on_step = drafter.observe if m == "suffixd" else None
            for chunk in verifier.generate(f"{m}/{session}", prompt, params, proposers[m], on_step):
                toks += chunk.tokens
                gaps += chunk.gaps
                last = chunk
            assert last is not None and last.stats is not None
            st = last.stats
            a = agg[m]
            a["tokens"] += st.completion_tokens
            a["rate_tokens"] += max(0, st.completion_tokens - 1)
            a["decode_s"] += st.decode_s
            a["prompt_s"] += st.prompt_s
            a["total_s"] += st.total_s
            a["prompt_tokens"] += st.prompt_tokens
            a["cached_prompt_tokens"] += st.cached_prompt_tokens
            a["steps"] += st.steps
            a["drafted"] += st.drafted_tokens
            a["accepted"] += st.accepted_tokens
            latencies[m].append(st.total_s)
            session_wall[m][session] = session_wall[m].get(session, 0.0) + st.total_s
            results[m] = (toks, gaps)
            if m == "suffixd":
                cache.append_session(ns, session, toks[fed[0] - len(prompt) :])
                if toks:
                    cache.add_response(ns, next_seq, toks)
                    next_seq += 1
        for m, srv in servers.items():
            t = srv.complete(prompt, max_tokens)
            a = agg[m]
            a["tokens"] += t.predicted_n
            a["rate_tokens"] += max(0, t.predicted_n - 1)
            a["decode_s"] += t.decode_s
            a["prompt_s"] += t.prompt_s
            a["total_s"] += t.wall_s
            a["prompt_tokens"] += len(prompt)
            a["cached_prompt_tokens"] += len(prompt) - t.prompt_n
            a["drafted"] += t.drafted
            a["accepted"] += t.accepted
            latencies[m].append(t.wall_s)
            session_wall[m][session] = session_wall[m].get(session, 0.0) + t.wall_s
            ls_tokens[m] = t.tokens
        for m in ls_agree:
            ls_agree[m] += int(ls_tokens[m] == ls_tokens[ls_reference(m)])
        for m in verdicts:
            verdict, where = certify_greedy(results["plain"][1], results[m][1])
            ref_g, cand_g = results["plain"][1], results[m][1]
            if verdict == "diverged" and where is not None and where < min(len(ref_g), len(cand_g)):
                # Beyond the near-tie threshold: re-evaluate the common prefix fresh with
                # each run's batch shape, the prefix chunked in several ways; if the
                # schedules pick each run's token, the parting is llama.cpp's batch
                # arithmetic on these exact tokens, not the decoding loop.
                context = prompt + [g.token for g in ref_g[:where]]
                try:
                    if verifier.schedule_flip(
                        context, ref_g[where], cand_g[where]
                    ) or replays_both(verifier, context, ref_g, cand_g, where):
                        verdict = "shape_flip"
                except ValueError:  # no batch record to re-evaluate: stays diverged
                    pass
            verdicts[m][verdict] += 1
            # (both verdicts come with the position where the runs part)
            if verdict in ("diverged", "shape_flip") and where is not None and len(diverged) < 10:
                parting: dict[str, Any] = {
                    "mode": m,
                    "verdict": verdict,
                    "session": session,
                    "turn": len(latencies["plain"]) - 1,
                    "prompt_tokens": len(prompt),
                    "position": where,
                    "plain": ref_g[where].top[:3] if where < len(ref_g) else None,
                    m: cand_g[where].top[:3] if where < len(cand_g) else None,
                }
                if verdict == "diverged" and where is not None:
                    # Which run a from-scratch evaluation of the same context agrees with.
                    ctx = prompt + [g.token for g in ref_g[:where]]
                    row = verifier.next_logits(ctx)
                    top3 = np.argsort(-row)[:3]
                    parting["fresh"] = [[int(t), float(row[t])] for t in top3]
                diverged.append(parting)

    n_turns = len(todo) - skipped

    def rate(m: str) -> float:
        a = agg[m]
        return a["rate_tokens"] / a["decode_s"] if a["decode_s"] > 0 else 0.0

    out: dict[str, Any] = {
        "workload": str(workload),
        "turns": n_turns,
        "skipped_turns": skipped,
        "unfit_turns": unfit[:20],
        "sessions": len({s for s, _ in todo}),
        "max_tokens": max_tokens,
        "threads": threads,
        "n_ctx": n_ctx,
        "cost_profile": {str(k): v for k, v in profile.items()},
        "raw_cost_profile": {
            str(k): round(v / verifier.raw_cost_seconds[1], 3)
            for k, v in verifier.raw_cost_seconds.items()
        },
        "batch_padding": {str(k): v for k, v in verifier.batch_padding.items()},
        "near_tie_gap": NEAR_TIE_GAP,
    }
    for m in [*wanted, *servers]:
        a = agg[m]
        evaluated = a["prompt_tokens"] - a["cached_prompt_tokens"]
        out[f"{m}_prompt_tok_s"] = round(evaluated / a["prompt_s"], 1) if a["prompt_s"] else 0.0
        out[f"{m}_prompt_tokens_evaluated"] = int(evaluated)
        out[f"{m}_prompt_tokens_total"] = int(a["prompt_tokens"])
        walls = session_wall[m]
        out[f"{m}_session_wall_s"] = round(sum(walls.values()) / max(len(walls), 1), 3)
        out[f"{m}_turn_p95_s"] = round(p95(latencies[m]), 4)
        if m in servers:
            out[f"{m}_tok_s"] = round(rate(m), 2)
            out[f"{m}_turn_latency_s"] = round(a["total_s"] / max(n_turns, 1), 4)
            out[f"{m}_tokens"] = int(a["tokens"])
            if m in ls_agree:
                out[f"{m}_same_output_as_ls_plain"] = ls_agree[m]
            if m != plain_of(m):
                out[f"{m}_accept_rate"] = round(a["accepted"] / max(a["drafted"], 1), 3)
            continue
        out[f"{m}_tok_s"] = round(rate(m), 2)
        out[f"{m}_prompt_s"] = round(a["prompt_s"], 3)
        out[f"{m}_turn_latency_s"] = round(a["total_s"] / max(n_turns, 1), 4)
        out[f"{m}_tokens"] = int(a["tokens"])
        out[f"{m}_tokens_per_step"] = round(a["tokens"] / max(a["steps"], 1), 3)
        if m != "plain":
            out[f"{m}_accept_rate"] = round(a["accepted"] / max(a["drafted"], 1), 3)
            out[f"{m}_drafted_per_step"] = round(a["drafted"] / max(a["steps"], 1), 3)
    out["cached_prompt_fraction"] = round(
        agg["plain"]["cached_prompt_tokens"] / max(agg["plain"]["prompt_tokens"], 1), 3
    )
    if "suffixd" in wanted:
        out["speedup_vs_plain"] = round(rate("suffixd") / max(rate("plain"), 1e-9), 3)
        if "pld" in wanted:
            out["speedup_vs_pld"] = round(rate("suffixd") / max(rate("pld"), 1e-9), 3)
    if "pld" in wanted:
        out["pld_speedup_vs_plain"] = round(rate("pld") / max(rate("plain"), 1e-9), 3)
    if servers:
        best = max(servers, key=rate)
        out["llama_server_best"] = best
        if "ls-plain" in servers:
            out["suffixd_plain_vs_ls_plain"] = round(
                rate("plain") / max(rate("ls-plain"), 1e-9), 3)
        if "ls-plain-fa-off" in servers:
            out["suffixd_plain_vs_ls_plain_fa_off"] = round(
                rate("plain") / max(rate("ls-plain-fa-off"), 1e-9), 3)
        if "suffixd" in wanted:
            out["suffixd_vs_ls_best"] = round(rate("suffixd") / max(rate(best), 1e-9), 3)
            out["suffixd_turn_latency_vs_ls_best"] = round(
                agg["suffixd"]["total_s"] / max(agg[best]["total_s"], 1e-9), 3)
            fastest = min(servers, key=lambda m: agg[m]["total_s"])
            out["llama_server_fastest_sessions"] = fastest
            out["suffixd_session_wall_vs_ls_fastest"] = round(
                agg["suffixd"]["total_s"] / max(agg[fastest]["total_s"], 1e-9), 3)
    main = "suffixd" if "suffixd" in verdicts else next(iter(verdicts), None)
    out["identical_turns"] = verdicts[main]["identical"] if main else n_turns
    out["near_tie_turns"] = verdicts[main]["near_tie"] if main else 0
    out["shape_flip_turns"] = verdicts[main]["shape_flip"] if main else 0
    out["verdicts"] = verdicts
    out["identical_outputs"] = all(v["diverged"] == 0 for v in verdicts.values())
    out["partings"] = diverged
    verifier.close()
    return out


def _print(out: dict[str, Any], wanted: list[str], servers: list[str]) -> None:
    click.echo(f"{out['workload']}: {out['turns']} turns, {out['max_tokens']} tokens max, "
               f"{out['threads']} threads, {out['load_processes']} busy processes beside")
    click.echo(f"cost profile (k: cost relative to 1): {out['cost_profile']}")
    click.echo(
        f"{'mode':<16} {'tok/s':>8} {'accept':>7} {'prompt tok/s':>13} {'turn s':>8} "
        f"{'p95 s':>7}"
    )
    for m in [*wanted, *servers]:
        click.echo(
            f"{m:<16} {out[f'{m}_tok_s']:>8.2f} {out.get(f'{m}_accept_rate', 0.0):>7.3f} "
            f"{out[f'{m}_prompt_tok_s']:>13.1f} {out[f'{m}_turn_latency_s']:>8.3f} "
            f"{out[f'{m}_turn_p95_s']:>7.3f}"
        )
    for k in ("speedup_vs_plain", "speedup_vs_pld", "pld_speedup_vs_plain",
              "suffixd_plain_vs_ls_plain", "suffixd_plain_vs_ls_plain_fa_off", "suffixd_vs_ls_best",
              "suffixd_turn_latency_vs_ls_best"):
        if k in out:
            click.echo(f"{k}: {out[k]:.3f}")
    if servers:
        click.echo(f"llama-server's best: {out['llama_server_best']}; its modes' outputs equal "
                   "to its plain output: " + ", ".join(
                       f"{m} {out[f'{m}_same_output_as_ls_plain']}/{out['turns']}"
                       for m in servers if f"{m}_same_output_as_ls_plain" in out))
    click.echo(f"greedy equivalence (suffixd vs its plain): {out['verdicts']}  "
               f"identical_outputs={out['identical_outputs']}")
