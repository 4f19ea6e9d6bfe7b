"""`suffixd bench prefix WORKLOAD`: its options over benchkit/prefix.py (new conversations
that share a system prompt, through the endpoint, against llama-server)."""

from __future__ import annotations

from pathlib import Path

import click

from ..benchkit.prefix import prefix_lines, run_prefix


@click.command("prefix")
@click.argument("workload", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--sessions", default=8, show_default=True,
              help="Sessions whose first turn is sent, one after another.")
@click.option("--model", default=None, help="GGUF path or packaged name (default: embedded).")
@click.option("--ctx-size", "n_ctx", default=8192, show_default=True)
@click.option("--threads", default=2, show_default=True, envvar="SUFFIXD_THREADS",
              show_envvar=True)
@click.option("--llama-server", "llama_server", default=None, metavar="PATH",
              help="A llama-server binary to compare with (one slot and -np 4).")
@click.option("--prompt-cache-mb", type=int, default=None,
              help="suffixd's --prompt-cache-mb (0: the daemon without prompt reuse).")
@click.option("--system-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="A system prompt for every conversation, in place of the "
                                 "recorded one.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def prefix_bench(workload: Path, sessions: int, model: str | None, n_ctx: int, threads: int,
                 llama_server: str | None, prompt_cache_mb: int | None,
                 system_file: Path | None, as_json: bool) -> None:
    """New conversations sharing a system prompt: tokens evaluated, time to first token."""
    import json

    from ..daemon.model import resolve_model_path

    model_path = resolve_model_path(model)
    system = system_file.read_text() if system_file is not None else None
    out = run_prefix(workload, sessions, model, model_path, n_ctx, threads, llama_server,
                     prompt_cache_mb, system)
    if as_json:
        click.echo(json.dumps(out))
        return
    for line in prefix_lines(out):
        click.echo(line)
