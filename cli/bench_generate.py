"""`suffixd bench generate`: its options over benchkit/generate.py (end-to-end generation
through the real model: plain, suffixd and prompt lookup, and llama-server beside)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..benchkit.generate import MODES, generate_lines, run_generate
from .llama_server import llama_server_options


@click.command("generate")
@click.argument("workload", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--turns", default=200, show_default=True, help="Assistant turns to replay.")
@click.option("--max-tokens", default=64, show_default=True, help="Tokens generated per turn.")
@click.option("--model", default=None, help="GGUF path (default: the embedded model).")
@click.option("--n-ctx", default=12288, show_default=True)
@click.option("--threads", default=2, show_default=True, envvar="SUFFIXD_THREADS",
              show_envvar=True)
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
    model_path = resolve_model_path(model)
    out, servers = run_generate(
        workload, turns, max_tokens, model_path, n_ctx, threads, wanted,
        llama_server=llama_server, spec_types=spec_types, ls_flash_attn=ls_flash_attn,
        ls_plain=ls_plain, load=load, progress=not as_json)
    if as_json:
        click.echo(json.dumps(out))
        return
    for line in generate_lines(out, wanted, servers):
        click.echo(line)
