"""`suffixd bench tools`: its options over benchkit/tools.py (a tool-calling agent through
the OpenAI endpoint, side by side with llama-server: the same grammar, and natively)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..benchkit.tools import run_tools, tools_lines
from .llama_server import llama_server_options


@click.command("tools")
@click.argument("workload", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--sessions", default=2, show_default=True, help="Sessions to replay.")
@click.option("--turns-per-session", "turns_per_session", default=0, show_default=True,
              help="Only each session's first N assistant turns (0: all; on a busy machine).")
@click.option("--max-tokens", default=64, show_default=True, help="Tokens generated per turn.")
@click.option("--model", default=None, help="GGUF path or packaged name (default: embedded).")
@click.option("--threads", default=2, show_default=True, envvar="SUFFIXD_THREADS",
              show_envvar=True)
@click.option("--ctx-size", default=32768, show_default=True,
              help="Context per session (capped at the model's trained length).")
@llama_server_options
@click.option("--ls-same-grammar/--no-ls-same-grammar", "ls_same_grammar", default=True,
              show_default=True,
              help="llama-server fed suffixd's own prompt tokens and grammar (/completion).")
@click.option("--ls-native/--no-ls-native", "ls_native", default=False, show_default=True,
              help="llama-server on its own /v1/chat/completions with the same request: its "
                   "own template, grammar and parsed calls.")
@click.option("--ls-chat-template", "ls_chat_template", default=None,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Jinja chat template for --ls-native [default: the model's own, else "
                   "bench/fixtures/gemma3_chat_template.jinja].")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def tools_bench(workload: Path, sessions: int, turns_per_session: int, max_tokens: int,
                model: str | None,
                threads: int, ctx_size: int, llama_server: str | None, spec_types: str | None,
                ls_flash_attn: str, ls_plain: bool, ls_same_grammar: bool, ls_native: bool,
                ls_chat_template: Path | None, as_json: bool) -> None:
    """Replay WORKLOAD's sessions as a tool-calling agent, through the endpoint."""
    if llama_server and not (ls_same_grammar or ls_native):
        raise click.ClickException("--no-ls-same-grammar without --ls-native leaves "
                                   "llama-server nothing to run")
    out = run_tools(workload, sessions, turns_per_session, max_tokens, model, threads,
                    ctx_size, llama_server=llama_server, spec_types=spec_types,
                    ls_flash_attn=ls_flash_attn, ls_plain=ls_plain,
                    ls_same_grammar=ls_same_grammar, ls_native=ls_native,
                    ls_chat_template=ls_chat_template)
    if as_json:
        click.echo(json.dumps(out))
        return
    for line in tools_lines(out, workload):
        click.echo(line)
