"""`suffixd bench structured`: its options over benchkit/structured.py (response_format
answers through the endpoint against llama-server's own grammar for the same request)."""

from __future__ import annotations

import json

import click

from ..benchkit.structured import run_structured, structured_lines
from .llama_server import llama_server_options


@click.command("structured")
@click.option("--max-tokens", default=64, show_default=True)
@click.option("--model", default=None, help="GGUF path or packaged name (default: embedded).")
@click.option("--threads", default=2, show_default=True, envvar="SUFFIXD_THREADS",
              show_envvar=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@llama_server_options
def structured_bench(max_tokens: int, model: str | None, threads: int, as_json: bool,
                     llama_server: str | None, spec_types: str | None, ls_flash_attn: str,
                     ls_plain: bool) -> None:
    """Greedy response_format answers: suffixd's endpoint against llama-server's own grammar."""
    if not llama_server:
        raise click.UsageError("--llama-server PATH is required (bench/build_llama_server.sh)")
    out = run_structured(max_tokens, model, threads, llama_server)
    if as_json:
        click.echo(json.dumps(out, indent=1))
        return
    for line in structured_lines(out):
        click.echo(line)
