"""`suffixd namespaces list|drop`: the daemon's namespaces, and deleting one."""

from __future__ import annotations

import json
from typing import Any

import click
from suffixd.cli.common import connection_options


def _run(fn: Any, address: str | None, socket_path: str | None, data_dir: str | None,
         token: str | None) -> Any:
    from suffixd.cli.common import connect, fail
    from suffixd.client import SuffixdError

    client = connect(address, socket_path, data_dir, token, retries=2, timeout=60)
    try:
        return fn(client)
    except SuffixdError as exc:
        fail(exc, client.target)
    finally:
        client.close()


@click.group()
def namespaces() -> None:
    """List the daemon's namespaces, or drop one with everything in it."""


@namespaces.command("list")
@click.option("--json", "as_json", is_flag=True, help="JSON for machines.")
@connection_options
def list_(as_json: bool, address: str | None, socket_path: str | None, data_dir: str | None,
          auth_token: str | None) -> None:
    """Namespaces holding any state, with their open sessions and tree sizes."""
    st = _run(lambda c: c.stats(top_documents=1), address, socket_path, data_dir, auth_token)
    rows = [{"namespace": ns["namespace"], "open_sessions": int(ns.get("open_sessions", 0)),
             "global_tokens": int((ns.get("global") or {}).get("tokens", 0)),
             "corpus_tokens": int((ns.get("corpus") or {}).get("tokens", 0))}
            for ns in st["namespaces"]]
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    if not rows:
        click.echo("no namespaces")
        return
    click.echo(f"{'NAMESPACE':<32} {'SESSIONS':>8} {'GLOBAL TOKENS':>14} {'CORPUS TOKENS':>14}")
    for r in rows:
        click.echo(f"{r['namespace']:<32} {r['open_sessions']:>8} {r['global_tokens']:>14,} "
                   f"{r['corpus_tokens']:>14,}")


@namespaces.command()
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@connection_options
def drop(name: str, yes: bool, address: str | None, socket_path: str | None,
         data_dir: str | None, auth_token: str | None) -> None:
    """Delete namespace NAME durably: its open sessions, global and corpus trees, corpus
    file records and counters. In a fleet, on every node."""
    if not yes:
        click.confirm(f"Drop namespace {name!r} and everything in it?", abort=True)
    def run(c: Any) -> tuple[dict[str, Any], bool]:
        dropped = c.drop_namespace(name)
        return dropped, bool(c.stats(namespace=name, top_documents=1).get("fleet_json"))

    r, fleet = _run(run, address, socket_path, data_dir, auth_token)
    # In a fleet the drop is published to every node (daemon/fleet/node.py, "Drops").
    also = (" The drop was published to the fleet: every node drops the namespace, and "
            "entries or snapshots written before the drop are ignored.") if fleet else ""
    if not r["found"]:
        click.echo(f"namespace {name!r} holds nothing on this node; nothing dropped here."
                   + also)
        return
    click.echo(f"dropped {name}: {r['sessions']} open sessions, {r['sequences']} sequences, "
               f"{r['documents']} corpus files." + also)
