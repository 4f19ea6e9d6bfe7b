"""`suffixd sessions list|show|close`: inspect and close the daemon's sessions."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import click
from suffixd.cli.common import connection_options


def _client(address: str | None, socket_path: str | None, data_dir: str | None,
            token: str | None) -> Any:
    from suffixd.cli.common import connect

    return connect(address, socket_path, data_dir, token, retries=2, timeout=10)


def _run(fn: Callable[[Any], Any], address: str | None, socket_path: str | None,
         data_dir: str | None, token: str | None) -> Any:
    from suffixd.cli.common import fail
    from suffixd.client import SuffixdError

    client = _client(address, socket_path, data_dir, token)
    try:
        return fn(client)
    except SuffixdError as exc:
        fail(exc, client.target)
    finally:
        client.close()


def _ago(ts: float) -> str:
    s = max(0.0, time.time() - ts)
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.0f}m" if s < 7200 else f"{s / 3600:.1f}h"


@click.group()
def sessions() -> None:
    """List, show and close sessions of the running daemon."""


@sessions.command("list")
@click.option("--namespace", "-n", default=None, help="Only this namespace.")
@click.option("--json", "as_json", is_flag=True, help="JSON for machines.")
@connection_options
def list_(namespace: str | None, as_json: bool, address: str | None, socket_path: str | None,
          data_dir: str | None, auth_token: str | None) -> None:
    """List open sessions."""
    rows = _run(lambda c: c.list_sessions(namespace), address, socket_path, data_dir,
                auth_token)
    if as_json:
        click.echo(json.dumps([r.__dict__ for r in rows], indent=1))
        return
    if not rows:
        click.echo("no open sessions")
        return
    click.echo(f"{'NAMESPACE':<16} {'SESSION':<24} {'TOKENS':>9} {'RESPONSES':>9} {'IDLE':>6}")
    for r in rows:
        click.echo(f"{r.namespace:<16} {r.session_id:<24} {r.tokens:>9} {r.responses:>9} "
                   f"{_ago(r.last_active_at):>6}")


@sessions.command()
@click.argument("namespace")
@click.argument("session_id")
@click.option("--json", "as_json", is_flag=True)
@click.option("--tail", "tail", type=click.IntRange(min=0), default=0,
              help="Also the session's last N tokens (ids, and text with a tokenizer).")
@connection_options
def show(namespace: str, session_id: str, as_json: bool, tail: int, address: str | None,
         socket_path: str | None, data_dir: str | None, auth_token: str | None) -> None:
    """Show one session and its counters."""
    info = _run(lambda c: c.describe_session(namespace, session_id, True, tail), address,
                socket_path, data_dir, auth_token)
    if as_json:
        click.echo(json.dumps(info.__dict__, indent=1))
        return
    c = info.counters or {}
    click.echo(f"session    {info.namespace}/{info.session_id}")
    click.echo(f"metadata   {' '.join(f'{k}={v}' for k, v in sorted(info.metadata.items()))}")
    click.echo(f"tokens     {info.tokens}   responses {info.responses}")
    click.echo(f"created    {_ago(info.created_at)} ago   idle {_ago(info.last_active_at)}")
    click.echo(f"steps      {c.get('steps', 0)}   proposed {c.get('draft_tokens_proposed', 0)}"
               f"   accepted {c.get('draft_tokens_accepted', 0)}"
               f"   rate {c.get('acceptance_rate', 0.0):.1%}")
    if tail:
        click.echo(f"tail       {' '.join(map(str, info.tail))}")


@sessions.command()
@click.argument("namespace")
@click.argument("session_id")
@click.option("--drop-responses", is_flag=True,
              help="Remove the session's responses from the global tree too.")
@connection_options
def close(namespace: str, session_id: str, drop_responses: bool, address: str | None,
          socket_path: str | None, data_dir: str | None, auth_token: str | None) -> None:
    """Close a session (its responses stay in the global tree unless --drop-responses)."""
    r = _run(lambda c: c.close_session(namespace, session_id,
                                       keep_responses=not drop_responses),
             address, socket_path, data_dir, auth_token)
    click.echo(f"closed {namespace}/{session_id}: {r['tokens']} tokens, "
               f"{r['responses_kept']} responses kept")
