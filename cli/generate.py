"""`suffixd generate`: stream a generation from the daemon's verifier."""

from __future__ import annotations

import json
import sys
from typing import Any

import click


@click.command("generate")
@click.argument("prompt", required=False)
@click.option("--session", "session", default=None, help="Session id (opened if new).")
@click.option("--namespace", default="default", show_default=True)
@click.option("--messages", "messages_file", type=click.File("r"), default=None,
              help="JSON file (or - for stdin) with a list of {role, content} chat messages.")
@click.option("--chat", is_flag=True, help="Send PROMPT as one user message (chat template).")
@click.option("--max-tokens", default=256, show_default=True, type=click.IntRange(1, 8192))
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(0))
@click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(0, 1))
@click.option("--top-k", default=0, show_default=True, type=click.IntRange(0))
@click.option("--seed", default=None, type=int)
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--stats", "show_stats", is_flag=True, help="Print the totals to stderr at the end.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per chunk.")
@click.option("--address", envvar="SUFFIXD_ADDRESS", default=None, show_envvar=True,
              help="unix:PATH or HOST:PORT [default: the default data dir's socket].")
@click.option("--auth-token", envvar="SUFFIXD_AUTH_TOKEN", default=None, show_envvar=True)
def generate(
    prompt: str | None, session: str | None, namespace: str, messages_file: Any, chat: bool,
    max_tokens: int, temperature: float, top_p: float, top_k: int, seed: int | None,
    stop: tuple[str, ...], show_stats: bool, as_json: bool, address: str | None,
    auth_token: str | None,
) -> None:
    """Generate a continuation of PROMPT (text) and stream it to stdout."""
    from suffixd.client import Client, SuffixdError

    kwargs: dict[str, Any] = {}
    if messages_file is not None:
        if prompt is not None:
            raise click.UsageError("give PROMPT or --messages, not both")
        try:
            kwargs["messages"] = json.load(messages_file)
        except json.JSONDecodeError as exc:
            raise click.UsageError(f"--messages: not JSON: {exc}") from None
        if not isinstance(kwargs["messages"], list):
            raise click.UsageError("--messages: expected a JSON list of {role, content}")
    elif prompt is None:
        raise click.UsageError("give PROMPT or --messages")
    elif chat:
        kwargs["messages"] = [{"role": "user", "content": prompt}]
    else:
        kwargs["prompt"] = prompt
    last = None
    try:
        with Client(address, token=auth_token or None, retries=2, timeout=None) as client:
            for chunk in client.generate(
                session, namespace=namespace, max_tokens=max_tokens, temperature=temperature,
                top_p=top_p, top_k=top_k, seed=seed, stop=stop, **kwargs,
            ):
                last = chunk
                if as_json:
                    click.echo(json.dumps(chunk.__dict__))
                else:
                    sys.stdout.write(chunk.text)
                    sys.stdout.flush()
    except (SuffixdError, ValueError, KeyError, TypeError) as exc:
        click.echo(f"\nsuffixd: error: {getattr(exc, 'details', exc)}", err=True)
        sys.exit(1)
    if not as_json:
        sys.stdout.write("\n")
    if show_stats and last is not None:
        click.echo(json.dumps({"finish_reason": last.finish_reason, **last.totals}), err=True)
