"""End-to-end generation through the real model (`suffixd bench generate`, and the
in-process modes of `suffixd bench agent`): the runner, its figures and its text table.

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

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import BenchError
from .llama_server import plain_of
from .workloads import fits_side_by_side, load_turns

MODES = ("plain", "suffixd", "pld")


def p95(xs: Sequence[float]) -> float:
    """The 95th percentile as every bench reports it (nearest rank below); 0 for none."""
    lat = sorted(xs)
    return lat[int(0.95 * (len(lat) - 1))] if lat else 0.0


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


def run_generate(
    workload: Path, turns: int, max_tokens: int, model_path: Path, n_ctx: int, threads: int,
    wanted: list[str], *, llama_server: str | None = None, spec_types: str | None = None,
    ls_flash_attn: str = "auto", ls_plain: bool = True, load: int = 0, progress: bool = True,
) -> tuple[dict[str, Any], list[str]]:
    """WORKLOAD's first ``turns`` assistant turns through the modes ``wanted`` (and with
    ``llama_server`` its systems, ``start_servers``; ``load`` busy processes beside):
    the figures, and the llama-server systems' names in the order they ran."""
    from .llama_server import BusyLoad, LlamaServer, start_servers

    servers: dict[str, LlamaServer] = {}
    if llama_server:
        servers = start_servers(llama_server, model_path, threads=threads, n_ctx=n_ctx,
                                spec_types_wanted=spec_types, flash_attn=ls_flash_attn,
                                plain=ls_plain)
    busy = BusyLoad(load) if load else None
    try:
        todo = load_turns(workload, turns)
        if not todo:
            raise BenchError(f"{workload}: no assistant turns")
        out = run_turns(workload, todo, max_tokens, model_path, n_ctx, threads, wanted,
                        servers, progress)
    finally:
        for srv in servers.values():
            srv.close()
        if busy is not None:
            busy.close()
    out["load_processes"] = load
    return out, list(servers)


def run_turns(
    workload: Path, todo: list[tuple[str, list[dict[str, str]]]], max_tokens: int,
    model_path: Path, n_ctx: int, threads: int, wanted: list[str], servers: dict[str, Any],
    progress: bool = True,
) -> dict[str, Any]:
    """Replays ``todo``'s turns through every mode, turn by turn; the figures as a dict
    (``progress``: a bar of the turns on stderr)."""
    from tqdm import tqdm

    replay = _Replay(model_path, n_ctx, threads, max_tokens, wanted, servers)
    for session, msgs in tqdm(todo, desc="turns", disable=not progress, file=sys.stderr):
        replay.turn(session, msgs)
    out = replay.figures(workload, todo)
    replay.verifier.close()
    return out


def _tallies() -> dict[str, float]:
    """What one mode adds up over the turns (llama-server's systems: all but steps)."""
    return {
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


def _ls_reference(m: str) -> str:
    """The llama-server system a mode's output is compared with: the plain decoding of its
    own flash-attention setting (and plain without flash attention against its default)."""
    return "ls-plain" if m == "ls-plain-fa-off" else plain_of(m)


class _Replay:
    """One ``run_turns``: the verifier, the cache and drafter it feeds and the tallies, which
    live across turns (a session's trees and KV slots carry from one turn to the next).
    ``turn`` replays one turn in every mode; ``figures`` reports them all."""

    NS = "bench"

    def __init__(self, model_path: Path, n_ctx: int, threads: int, max_tokens: int,
                 wanted: list[str], servers: dict[str, Any]) -> None:
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        from suffixcache import CostProfile, Drafter, SuffixCache

        from ..daemon.generation.chat import ChatRenderer
        from ..daemon.generation.pipeline import cost_rounds
        from ..daemon.generation.verifier import Verifier

        # n_ctx 0: the model's trained context (the verifier caps what it is given there)
        self.verifier = Verifier(model_path, n_ctx=n_ctx or 1 << 30, n_threads=threads,
                                 n_slots=4)
        self.n_ctx = self.verifier.n_ctx
        self.renderer = ChatRenderer(self.verifier)
        rounds, max_rounds = cost_rounds()
        self.profile = self.verifier.measure_cost_profile(reps=rounds, max_rounds=max_rounds)
        self.cache = SuffixCache()
        self.drafter = Drafter(
            self.cache,
            cost_profile=CostProfile.from_json({str(k): v for k, v in self.profile.items()}),
        )
        self.pld = LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=10)
        self.max_tokens = max_tokens
        self.wanted = wanted
        self.servers = servers
        self.threads = threads
        self.agg: dict[str, dict[str, float]] = {m: _tallies() for m in wanted}
        for m in servers:
            self.agg[m] = {k: 0.0 for k in _tallies()}
        self.latencies: dict[str, list[float]] = {m: [] for m in [*wanted, *servers]}
        self.session_wall: dict[str, dict[str, float]] = {m: {} for m in [*wanted, *servers]}
        self.unfit: list[dict[str, Any]] = []
        self.ls_agree = {m: 0 for m in servers if m != "ls-plain" and _ls_reference(m) in servers}
        self.ls_tokens: dict[str, list[int]] = {}
        self.verdicts = {m: {"identical": 0, "near_tie": 0, "shape_flip": 0, "diverged": 0}
                         for m in wanted if m != "plain"}
        self.partings: list[dict[str, Any]] = []
        self.last_prompt: dict[str, list[int]] = {}
        self.current: str | None = None
        self.next_seq = 0
        self.skipped = 0

    # ------------------------------------------------------------------ one turn
    def turn(self, session: str, msgs: list[dict[str, str]]) -> None:
        """One assistant turn: every mode, then every llama-server system, then the modes'
        outputs judged against plain decoding."""
        prompt = self.renderer.tokens(msgs)
        if not fits_side_by_side(len(prompt), self.max_tokens, self.n_ctx):
            self.skipped += 1
            self.unfit.append({"session": session, "prompt_tokens": len(prompt)})
            return
        self.enter(session)
        feed_prompt(self.cache, self.NS, session, prompt, self.last_prompt)
        results = self.decode(session, prompt)
        self.ask_servers(session, prompt)
        self.judge(session, prompt, results)

    def enter(self, session: str) -> None:
        """A new session closes the previous one's tree and KV slots (sessions come whole,
        one after another)."""
        if session == self.current:
            return
        if self.current is not None and self.cache.has_session(self.NS, self.current):
            self.cache.close_session(self.NS, self.current)
            for m in self.wanted:
                self.verifier.forget(f"{m}/{self.current}")
        self.current = session

    def decode(self, session: str, prompt: list[int]) -> dict[str, tuple[list[int], list[Any]]]:
        """Each mode's generation of the turn: (tokens, gaps) by mode."""
        import numpy as np

        from ..daemon.generation.verifier import GenerateParams

        params = GenerateParams(max_tokens=self.max_tokens, record_gaps=True)
        fed = [len(prompt)]  # context tokens the session tree holds
        cache, ns, drafter, pld = self.cache, self.NS, self.drafter, self.pld

        def suffixd_propose(ctx: list[int], k: int) -> Any:
            # The session tree follows the response step by step, as the replay protocol
            # has it: a response that repeats itself is drafted from its own beginning.
            if len(ctx) > fed[0]:
                cache.append_session(ns, session, ctx[fed[0] :])
                fed[0] = len(ctx)
            return drafter.propose(ns, session, ctx, max_tokens=k)

        proposers = {
            "plain": None,
            "suffixd": suffixd_propose,
            "pld": lambda ctx, k: [int(t) for t in pld(np.asarray(ctx, dtype=np.intc))[:k]],
        }
        results: dict[str, tuple[list[int], list[Any]]] = {}
        for m in self.wanted:
            toks: list[int] = []
            gaps: list[Any] = []
            last = None
            on_step = drafter.observe if m == "suffixd" else None
            for chunk in self.verifier.generate(f"{m}/{session}", prompt, params, proposers[m],
                                                on_step):
                toks += chunk.tokens
                gaps += chunk.gaps
                last = chunk
            assert last is not None and last.stats is not None
            st = last.stats
            self.add(m, session, st.total_s, {
                "tokens": st.completion_tokens,
                "rate_tokens": max(0, st.completion_tokens - 1),
                "decode_s": st.decode_s,
                "prompt_s": st.prompt_s,
                "prompt_tokens": st.prompt_tokens,
                "cached_prompt_tokens": st.cached_prompt_tokens,
                "steps": st.steps,
                "drafted": st.drafted_tokens,
                "accepted": st.accepted_tokens,
            })
            results[m] = (toks, gaps)
            if m == "suffixd":
                cache.append_session(ns, session, toks[fed[0] - len(prompt) :])
                if toks:
                    cache.add_response(ns, self.next_seq, toks)
                    self.next_seq += 1
        return results

    def ask_servers(self, session: str, prompt: list[int]) -> None:
        """The same prompt to each llama-server system; which agree with their plain one."""
        for m, srv in self.servers.items():
            t = srv.complete(prompt, self.max_tokens)
            self.add(m, session, t.wall_s, {
                "tokens": t.predicted_n,
                "rate_tokens": max(0, t.predicted_n - 1),
                "decode_s": t.decode_s,
                "prompt_s": t.prompt_s,
                "prompt_tokens": len(prompt),
                "cached_prompt_tokens": len(prompt) - t.prompt_n,
                "drafted": t.drafted,
                "accepted": t.accepted,
            })
            self.ls_tokens[m] = t.tokens
        for m in self.ls_agree:
            self.ls_agree[m] += int(self.ls_tokens[m] == self.ls_tokens[_ls_reference(m)])

    def add(self, m: str, session: str, total_s: float, figures: dict[str, float]) -> None:
        """One turn of system ``m`` into its tallies, its latencies and its session's wall."""
        a = self.agg[m]
        for key, value in figures.items():
            a[key] += value
        a["total_s"] += total_s
        self.latencies[m].append(total_s)
        self.session_wall[m][session] = self.session_wall[m].get(session, 0.0) + total_s

    def judge(self, session: str, prompt: list[int],
              results: dict[str, tuple[list[int], list[Any]]]) -> None:
        """Each mode's output against plain decoding's: identical, near-tie, shape flip or
        diverged (the first partings kept, with what the model says there)."""
        from ..daemon.generation.certify import certify_greedy

        ref_g = results["plain"][1]
        for m in self.verdicts:
            cand_g = results[m][1]
            verdict, where = certify_greedy(ref_g, cand_g)
            if verdict == "diverged" and where is not None and where < min(len(ref_g), len(cand_g)):
                # Beyond the near-tie threshold: re-evaluate the common prefix fresh with
                # each run's batch shape, the prefix chunked in several ways; if the
                # schedules pick each run's token, the parting is llama.cpp's batch
                # arithmetic on these exact tokens, not the decoding loop.
                context = prompt + [g.token for g in ref_g[:where]]
                try:
                    if self.verifier.schedule_flip(
                        context, ref_g[where], cand_g[where]
                    ) or replays_both(self.verifier, context, ref_g, cand_g, where):
                        verdict = "shape_flip"
                except ValueError:  # no batch record to re-evaluate: stays diverged
                    pass
            self.verdicts[m][verdict] += 1
            # (both verdicts come with the position where the runs part)
            if verdict in ("diverged", "shape_flip") and where is not None and \
                    len(self.partings) < 10:
                self.partings.append(
                    self.parting(m, verdict, where, session, prompt, ref_g, cand_g))

    def parting(self, m: str, verdict: str, where: int, session: str, prompt: list[int],
                ref_g: list[Any], cand_g: list[Any]) -> dict[str, Any]:
        """Where mode ``m`` parted from plain decoding: each side's top tokens there, and
        for a divergence the top tokens of a from-scratch evaluation of the context."""
        import numpy as np

        parting: dict[str, Any] = {
            "mode": m,
            "verdict": verdict,
            "session": session,
            "turn": len(self.latencies["plain"]) - 1,
            "prompt_tokens": len(prompt),
            "position": where,
            "plain": ref_g[where].top[:3] if where < len(ref_g) else None,
            m: cand_g[where].top[:3] if where < len(cand_g) else None,
        }
        if verdict == "diverged":
            # Which run a from-scratch evaluation of the same context agrees with.
            ctx = prompt + [g.token for g in ref_g[:where]]
            row = self.verifier.next_logits(ctx)
            top3 = np.argsort(-row)[:3]
            parting["fresh"] = [[int(t), float(row[t])] for t in top3]
        return parting

    # ------------------------------------------------------------------ the figures
    def rate(self, m: str) -> float:
        """Decode tokens per second of ``m`` (a turn's first token is the prompt's)."""
        a = self.agg[m]
        return a["rate_tokens"] / a["decode_s"] if a["decode_s"] > 0 else 0.0

    def figures(self, workload: Path, todo: list[tuple[str, list[dict[str, str]]]],
                ) -> dict[str, Any]:
        """The run's JSON object: the setup, each system's figures, the comparisons
        between them and the verdicts."""
        from ..daemon.generation.certify import NEAR_TIE_GAP

        n_turns = len(todo) - self.skipped
        verifier = self.verifier
        out: dict[str, Any] = {
            "workload": str(workload),
            "turns": n_turns,
            "skipped_turns": self.skipped,
            "unfit_turns": self.unfit[:20],
            "sessions": len({s for s, _ in todo}),
            "max_tokens": self.max_tokens,
            "threads": self.threads,
            "n_ctx": self.n_ctx,
            "cost_profile": {str(k): v for k, v in self.profile.items()},
            "raw_cost_profile": {
                str(k): round(v / verifier.raw_cost_seconds[1], 3)
                for k, v in verifier.raw_cost_seconds.items()
            },
            "batch_padding": {str(k): v for k, v in verifier.batch_padding.items()},
            "near_tie_gap": NEAR_TIE_GAP,
        }
        for m in [*self.wanted, *self.servers]:
            out.update(self.system_figures(m, n_turns))
        out["cached_prompt_fraction"] = round(
            self.agg["plain"]["cached_prompt_tokens"]
            / max(self.agg["plain"]["prompt_tokens"], 1), 3
        )
        out.update(self.ratios())
        out.update(self.verdict_figures(n_turns))
        return out

    def system_figures(self, m: str, n_turns: int) -> dict[str, Any]:
        """``{m}_*``: one mode's or llama-server system's rates, latencies and counts."""
        a = self.agg[m]
        out: dict[str, Any] = {}
        evaluated = a["prompt_tokens"] - a["cached_prompt_tokens"]
        out[f"{m}_prompt_tok_s"] = round(evaluated / a["prompt_s"], 1) if a["prompt_s"] else 0.0
        out[f"{m}_prompt_tokens_evaluated"] = int(evaluated)
        out[f"{m}_prompt_tokens_total"] = int(a["prompt_tokens"])
        walls = self.session_wall[m]
        out[f"{m}_session_wall_s"] = round(sum(walls.values()) / max(len(walls), 1), 3)
        out[f"{m}_turn_p95_s"] = round(p95(self.latencies[m]), 4)
        if m in self.servers:
            out[f"{m}_tok_s"] = round(self.rate(m), 2)
            out[f"{m}_turn_latency_s"] = round(a["total_s"] / max(n_turns, 1), 4)
            out[f"{m}_tokens"] = int(a["tokens"])
            if m in self.ls_agree:
                out[f"{m}_same_output_as_ls_plain"] = self.ls_agree[m]
            if m != plain_of(m):
                out[f"{m}_accept_rate"] = round(a["accepted"] / max(a["drafted"], 1), 3)
            return out
        out[f"{m}_tok_s"] = round(self.rate(m), 2)
        out[f"{m}_prompt_s"] = round(a["prompt_s"], 3)
        out[f"{m}_turn_latency_s"] = round(a["total_s"] / max(n_turns, 1), 4)
        out[f"{m}_tokens"] = int(a["tokens"])
        out[f"{m}_tokens_per_step"] = round(a["tokens"] / max(a["steps"], 1), 3)
        if m != "plain":
            out[f"{m}_accept_rate"] = round(a["accepted"] / max(a["drafted"], 1), 3)
            out[f"{m}_drafted_per_step"] = round(a["drafted"] / max(a["steps"], 1), 3)
        return out

    def ratios(self) -> dict[str, Any]:
        """suffixd's rates and latencies against plain, pld and llama-server's systems."""
        rate, agg, wanted, servers = self.rate, self.agg, self.wanted, self.servers
        out: dict[str, Any] = {}
        if "suffixd" in wanted:
            out["speedup_vs_plain"] = round(rate("suffixd") / max(rate("plain"), 1e-9), 3)
            if "pld" in wanted:
                out["speedup_vs_pld"] = round(rate("suffixd") / max(rate("pld"), 1e-9), 3)
        if "pld" in wanted:
            out["pld_speedup_vs_plain"] = round(rate("pld") / max(rate("plain"), 1e-9), 3)
        if not servers:
            return out
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
        return out

    def verdict_figures(self, n_turns: int) -> dict[str, Any]:
        """The greedy-equivalence verdicts (suffixd's, or the first mode's, in front)."""
        verdicts = self.verdicts
        main = "suffixd" if "suffixd" in verdicts else next(iter(verdicts), None)
        return {
            "identical_turns": verdicts[main]["identical"] if main else n_turns,
            "near_tie_turns": verdicts[main]["near_tie"] if main else 0,
            "shape_flip_turns": verdicts[main]["shape_flip"] if main else 0,
            "verdicts": verdicts,
            "identical_outputs": all(v["diverged"] == 0 for v in verdicts.values()),
            "partings": self.partings,
        }


def generate_lines(out: dict[str, Any], wanted: list[str], servers: list[str]) -> list[str]:
    """``run_generate``'s figures as the text table (``servers``: its systems' names)."""
    lines = [f"{out['workload']}: {out['turns']} turns, {out['max_tokens']} tokens max, "
             f"{out['threads']} threads, {out['load_processes']} busy processes beside",
             f"cost profile (k: cost relative to 1): {out['cost_profile']}",
             f"{'mode':<16} {'tok/s':>8} {'accept':>7} {'prompt tok/s':>13} {'turn s':>8} "
             f"{'p95 s':>7}"]
    for m in [*wanted, *servers]:
        lines.append(
            f"{m:<16} {out[f'{m}_tok_s']:>8.2f} {out.get(f'{m}_accept_rate', 0.0):>7.3f} "
            f"{out[f'{m}_prompt_tok_s']:>13.1f} {out[f'{m}_turn_latency_s']:>8.3f} "
            f"{out[f'{m}_turn_p95_s']:>7.3f}"
        )
    for k in ("speedup_vs_plain", "speedup_vs_pld", "pld_speedup_vs_plain",
              "suffixd_plain_vs_ls_plain", "suffixd_plain_vs_ls_plain_fa_off", "suffixd_vs_ls_best",
              "suffixd_turn_latency_vs_ls_best"):
        if k in out:
            lines.append(f"{k}: {out[k]:.3f}")
    if servers:
        lines.append(f"llama-server's best: {out['llama_server_best']}; its modes' outputs "
                     "equal to its plain output: " + ", ".join(
                         f"{m} {out[f'{m}_same_output_as_ls_plain']}/{out['turns']}"
                         for m in servers if f"{m}_same_output_as_ls_plain" in out))
    lines.append(f"greedy equivalence (suffixd vs its plain): {out['verdicts']}  "
                 f"identical_outputs={out['identical_outputs']}")
    return lines
