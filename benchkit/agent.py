"""Whole agent sessions at their real length, in this process (`suffixd bench agent`
without ``--concurrency``): the run beside llama-server and its text table.

Each session is replayed as an agent runs it: every turn sends the whole conversation
so far (the recorded messages, as the replay protocol has it: the next turn's history
holds the recorded assistant message, not the model's output), generates up to
``max_tokens``, and every turn of the chosen sessions is replayed, none skipped. The
verifier's context is the model's trained length unless ``n_ctx`` says otherwise; a
turn that cannot fit is counted and reported, never silently dropped.

The same rotation as ``bench generate`` (suffixd plain, suffixd, and with a llama-server
binary llama-server plain and its n-gram types, prompt cache on; ``generate.run_turns``),
turn by turn; reported per system: session wall time, mean and p95 whole-turn latency,
prompt tokens actually evaluated (what KV reuse left to compute), decode tok/s. N
sessions at once through the OpenAI endpoint are concurrency.py's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .generate import run_turns


def run_agent(workload: Path, todo: list[tuple[str, list[dict[str, str]]]], max_tokens: int,
              model_path: Path, n_ctx: int, threads: int, wanted: list[str], *,
              llama_server: str | None = None, spec_types: str | None = None,
              ls_flash_attn: str = "auto", ls_plain: bool = True,
              ls_draft_model: Path | None = None, ls_draft_max: int | None = None,
              progress: bool = True) -> tuple[dict[str, Any], list[str]]:
    """``todo``'s turns through the modes ``wanted`` and, with ``llama_server``, its
    systems (``ls_draft_model``: also drafting with it, "ls-draft"): the figures, and the
    llama-server systems' names in the order they ran."""
    from .llama_server import start_servers

    servers: dict[str, Any] = {}
    try:
        if llama_server:
            servers = start_servers(llama_server, model_path, threads=threads, n_ctx=n_ctx,
                                    spec_types_wanted=spec_types, flash_attn=ls_flash_attn,
                                    plain=ls_plain, draft_model=ls_draft_model,
                                    draft_max=ls_draft_max)
        out = run_turns(workload, todo, max_tokens, model_path, n_ctx, threads, wanted,
                        servers, progress)
    finally:
        for srv in servers.values():
            srv.close()
    return out, list(servers)


def agent_lines(out: dict[str, Any], workload: Path, max_tokens: int, threads: int,
                systems: list[str]) -> list[str]:
    """``run_agent``'s figures as the text table (``systems``: the modes, then
    llama-server's)."""
    lines = [f"{workload.name}: {out['sessions']} sessions, {out['turns']} turns "
             f"({out['skipped_turns']} do not fit {out['n_ctx']} tokens), "
             f"{max_tokens} tokens max, {threads} threads",
             f"{'system':<16} {'session s':>10} {'turn s':>8} {'p95 s':>7} "
             f"{'prompt evaluated':>17} {'decode tok/s':>13}"]
    for m in systems:
        lines.append(f"{m:<16} {out[f'{m}_session_wall_s']:>10.2f} "
                     f"{out[f'{m}_turn_latency_s']:>8.3f} {out[f'{m}_turn_p95_s']:>7.3f} "
                     f"{out[f'{m}_prompt_tokens_evaluated']:>17,} {out[f'{m}_tok_s']:>13.2f}")
    for k in ("speedup_vs_plain", "suffixd_vs_ls_best", "suffixd_session_wall_vs_ls_fastest"):
        if k in out:
            lines.append(f"{k}: {out[k]:.3f}")
    lines.append(f"greedy equivalence (suffixd vs its plain): {out['verdicts']}")
    return lines
