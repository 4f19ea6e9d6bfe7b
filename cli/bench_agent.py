"""`suffixd bench agent`: its options over benchkit/agent.py (whole agent sessions at their
real length, in this process) and, with ``--concurrency N1,N2``, over
benchkit/concurrency.py (N sessions at a time through the OpenAI endpoint, side by side
with llama-server ``-np N``; ``--certify`` judges the answers with benchkit/certify.py).

``--deterministic`` runs every daemon in deterministic mode and certifies against plain
decoding in that mode (the same request must then get the same tokens at every N).
``--draft-model PATH`` gives the daemons a fallback draft model (``serve --draft-model``;
with ``--concurrency`` only: the in-process modes have none), ``--ls-draft-model PATH``
adds llama-server drafting with one (system ls-draft, benchkit/llama_server.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from ..benchkit.agent import agent_lines, run_agent
from ..benchkit.certify import TokenCertifier
from ..benchkit.concurrency import repeat_summary, report_lines, run_concurrency
from ..benchkit.generate import MODES
from ..benchkit.workloads import first_turns, load_session_turns
from .llama_server import draft_model_options, llama_server_options


def parse_levels(text: str) -> list[int]:
    """``"1,4"`` -> [1, 4] (positive, first occurrence kept, in the order given)."""
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        raise click.BadParameter("a comma-separated list of positive integers, e.g. 1,4",
                                 param_hint="--concurrency")
    return list(dict.fromkeys(levels))


def report(out: dict[str, Any]) -> None:
    """``run_concurrency``'s figures (or a repeated run's) as the text table."""
    for line in report_lines(out):
        click.echo(line)


@click.command("agent")
@click.argument("workload", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--sessions", default=10**9, help="Sessions to replay (from the top) [all].")
@click.option("--max-tokens", default=64, show_default=True, help="Tokens generated per turn.")
@click.option("--model", default=None, help="GGUF path or packaged name (default: embedded).")
@click.option("--n-ctx", default=0, help="Context per session [the model's trained length].")
@click.option("--threads", default=2, show_default=True)
@click.option("--modes", default="plain,suffixd", show_default=True,
              help="In-process modes (not with --concurrency: suffixd's endpoint only).")
@click.option("--turns", "turns_limit", default=0, help="The first K turns of each session [all].")
@click.option("--concurrency", default=None, metavar="N1,N2",
              help="Run N sessions at once through the OpenAI endpoint (and llama-server "
                   "-np N), for each N; a fresh server each.")
@click.option("--profiles", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="With --concurrency: keep the daemons' measured cost profiles here and "
                   "reuse them across levels and runs [a folder of this run].")
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(1, 20),
              help="With --concurrency: run every level this many times and report the "
                   "ratios' mean and spread; every second run times llama-server before "
                   "suffixd, so that the machine's drift within a level cancels.")
@click.option("--certify/--no-certify", default=True, show_default=True,
              help="With --concurrency: after the timed runs, judge suffixd's answers against "
                   "plain decoding of the same prompts (identical, near-tie, diverged).")
@click.option("--deterministic/--no-deterministic", default=None,
              help="With --concurrency: every suffixd daemon runs serve --deterministic (or "
                   "--no-deterministic), and the certification's plain decoding runs in the "
                   "same mode [default: as serve's: $SUFFIXD_DETERMINISTIC, else off].")
@click.option("--warm-corpus", type=click.Path(exists=True, file_okay=False, path_type=Path),
              default=None,
              help="With --concurrency: warm every suffixd daemon with `suffixd warm --corpus "
                   "DIR` before its timed run, as a long-running daemon would be (llama-server "
                   "has no such thing).")
@llama_server_options
@draft_model_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def agent_bench(workload: Path, sessions: int, max_tokens: int, model: str | None, n_ctx: int,
                threads: int, modes: str, turns_limit: int, concurrency: str | None,
                profiles: Path | None, repeat: int, certify: bool,
                deterministic: bool | None, warm_corpus: Path | None,
                llama_server: str | None,
                spec_types: str | None, ls_flash_attn: str, ls_plain: bool,
                draft_model: Path | None, ls_draft_model: Path | None,
                ls_draft_max: int | None, as_json: bool) -> None:
    """Replay WORKLOAD's sessions whole, turn by turn, as an agent sends them."""
    from ..daemon.generation.pipeline import deterministic_choice
    from ..daemon.model import resolve_model_path

    levels = parse_levels(concurrency) if concurrency is not None else None
    if deterministic is not None and levels is None:
        raise click.BadParameter("only with --concurrency", param_hint="--deterministic")
    if warm_corpus is not None and levels is None:
        raise click.BadParameter("only with --concurrency", param_hint="--warm-corpus")
    if draft_model is not None and levels is None:
        raise click.BadParameter("only with --concurrency (the in-process modes have no "
                                 "draft model)", param_hint="--draft-model")
    # the daemons' mode, resolved here as serve resolves it, so that the certification's
    # plain decoding runs in the same mode (None: DETERMINISTIC_DEFAULT's fallback)
    mode = deterministic_choice(deterministic)
    wanted = [m.strip() for m in modes.split(",") if m.strip()]
    if not wanted or any(m not in MODES for m in wanted) or "plain" not in wanted:
        raise click.BadParameter(f"--modes: a subset of {MODES} including plain",
                                 param_hint="--modes")
    try:
        model_path = resolve_model_path(model)
    except FileNotFoundError as exc:
        raise click.ClickException(str(exc)) from None
    todo = first_turns(load_session_turns(workload, sessions), turns_limit)
    if not todo:
        raise click.ClickException(f"{workload}: no assistant turns")
    if levels is not None:
        # one plain decoding of every turn serves every run's certification
        certifier = TokenCertifier(model_path, n_ctx, max_tokens, threads,
                                   deterministic=mode is not False) if certify else None
        try:
            runs = [run_concurrency(workload, todo, levels, max_tokens, model, model_path,
                                    n_ctx, threads, llama_server, spec_types, ls_flash_attn,
                                    ls_plain, profiles, certifier, mode,
                                    draft_model=draft_model, ls_draft_model=ls_draft_model,
                                    ls_draft_max=ls_draft_max, warm_corpus=warm_corpus,
                                    llama_server_first=bool(i % 2))
                    for i in range(repeat)]
        except RuntimeError as exc:  # the certification's deterministic mode did not hold
            raise click.ClickException(str(exc)) from None
        c_out = runs[0] if repeat == 1 else {"runs": runs,
                                              "repeat_summary": repeat_summary(runs)}
        if as_json:
            click.echo(json.dumps(c_out))
        else:
            report(c_out)
        return
    out, servers = run_agent(workload, todo, max_tokens, model_path, n_ctx, threads, wanted,
                             llama_server=llama_server, spec_types=spec_types,
                             ls_flash_attn=ls_flash_attn, ls_plain=ls_plain,
                             ls_draft_model=ls_draft_model, ls_draft_max=ls_draft_max,
                             progress=not as_json)
    if as_json:
        click.echo(json.dumps(out))
        return
    for line in agent_lines(out, workload, max_tokens, threads, [*wanted, *servers]):
        click.echo(line)
