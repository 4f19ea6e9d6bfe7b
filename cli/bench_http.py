"""`suffixd bench http`: its options over benchkit/fronts.py (the OpenAI-compatible endpoint
against gRPC Generate, one daemon, turn by turn)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..benchkit.fronts import http_lines, run_http


@click.command("http")
@click.argument("workload", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--sessions", default=3, show_default=True, help="Sessions to replay, whole.")
@click.option("--max-tokens", default=64, show_default=True)
@click.option("--model", default=None, help="GGUF path or packaged name (default: embedded).")
@click.option("--threads", default=2, show_default=True, envvar="SUFFIXD_THREADS",
              show_envvar=True)
@click.option("--ctx-size", default=32768, show_default=True,
              help="Context per session (capped at the model's trained length).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def http_bench(workload: Path, sessions: int, max_tokens: int, model: str | None,
               threads: int, ctx_size: int, as_json: bool) -> None:
    """Replay WORKLOAD's sessions through gRPC Generate and the OpenAI endpoint, alternating."""
    out = run_http(workload, sessions, max_tokens, model, threads, ctx_size)
    if as_json:
        click.echo(json.dumps(out))
        return
    for line in http_lines(out, workload):
        click.echo(line)
