"""`suffixd serve`: run the daemon."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def _options(*options: Callable[[F], F]) -> Callable[[F], F]:
    """Several click options as one decorator, applied in the order listed."""

    def apply(f: F) -> F:
        for option in reversed(options):
            f = option(f)
        return f

    return apply


# where the daemon keeps its data and whom it answers
_LISTENING = _options(
    click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                 help="Where LMDB, the socket and the lock live [default: ~/.local/share/suffixd, "
                      "or $XDG_DATA_HOME/suffixd]."),
    click.option("--listen", "listen", multiple=True, metavar="unix:PATH|HOST:PORT",
                 help="Listener (repeatable). Default: unix:<data dir>/suffixd.sock (mode 0600)."),
    click.option("--auth-token", envvar="SUFFIXD_AUTH_TOKEN", default=None, show_envvar=True,
                 help="Bearer token required on TCP listeners."),
    click.option("--insecure", is_flag=True,
                 help="Allow a TCP listener without a token (anyone who reaches the port)."),
    click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False, path_type=Path)),
    click.option("--tls-key", type=click.Path(exists=True, dir_okay=False, path_type=Path)),
)

# the verifier, its draft model and its KV cache
_GENERATION = _options(
    click.option("--model", default="default", show_default=True,
                 help="GGUF model (its tokenizer; the verifier uses it too). 'default' is the "
                      "embedded gemma-3-270m; 'none' serves token ids only."),
    click.option("--draft-model", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                 default=None,
                 help="A small GGUF with the target's vocabulary, drafting when the trees have "
                      "nothing (used only while measured to beat plain decoding)."),
    click.option("--model-load", type=click.Choice(["startup", "first-use"]), default="startup",
                 show_default=True, envvar="SUFFIXD_MODEL_LOAD", show_envvar=True,
                 help="Load the verifier in the background once serving, or on the first "
                      "generate; generation is ready when it is loaded (its costs come from "
                      "<data dir>/cost_profile.json, or are measured while serving)."),
    click.option("--ctx-size", type=click.IntRange(min=64), default=8192, show_default=True,
                 envvar="SUFFIXD_N_CTX", show_envvar=True,
                 help="Context of each generating session, in tokens (capped at the model's "
                      "trained length)."),
    click.option("--kv-slots", type=click.IntRange(1, 64), default=4, show_default=True,
                 help="Sessions that keep their KV cache at once (least recently used evicted)."),
    click.option("--prompt-cache-mb", type=click.IntRange(min=0), default=1024, show_default=True,
                 help="Host memory for KV checkpoints of prompt prefixes, shared by every "
                      "session: a new conversation starts from the longest one its prompt "
                      "begins with (0: off)."),
    click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True,
                 envvar="SUFFIXD_THREADS", show_envvar=True, help="CPU threads of the verifier."),
    click.option("--deterministic/--no-deterministic", default=None,
                 help="Evaluate every row with the same kernels whatever its batch (no "
                      "repacked weights, no tiled matrix product, no one-row ubatch), so "
                      "greedy output is the same token for token with or without drafts, "
                      "alone or sharing steps [default: off; "
                      "or $SUFFIXD_DETERMINISTIC=1/0]. On, a failed start-up check fails the "
                      "load."),
    click.option("--n-gpu-layers", type=click.IntRange(min=0), default=0, show_default=True,
                 help="Layers offloaded to the GPU (needs a GPU build of llama-cpp-python)."),
)

# what one namespace, session or call may hold
_LIMITS = _options(
    click.option("--workers", type=int, default=32, show_default=True, help="RPC worker threads."),
    click.option("--global-budget-tokens", type=int, default=4_000_000, show_default=True,
                 help="Tokens kept in each namespace's global tree (oldest responses evicted)."),
    click.option("--max-sessions", type=int, default=10_000, show_default=True,
                 help="Open sessions per namespace."),
    click.option("--max-namespaces", type=int, default=1_000, show_default=True,
                 help="Namespaces holding any state (sessions, trees, counters, corpus files)."),
    click.option("--max-session-tokens", type=int, default=2_000_000, show_default=True,
                 help="Tokens of one session's tree (appends past it are refused)."),
    click.option("--max-session-bytes", type=int, default=256 << 20, show_default=True,
                 help="Memory of one session's tree, in bytes."),
    click.option("--max-total-session-tokens", type=int, default=16_000_000, show_default=True,
                 help="Tokens of all session trees together."),
    click.option("--max-total-session-bytes", type=int, default=2 << 30, show_default=True,
                 help="Memory of all session trees together, in bytes."),
    click.option("--session-idle-timeout", type=float, default=24 * 3600.0, show_default=True,
                 help="Seconds after which an untouched session is closed (0: never)."),
    click.option("--max-tokens-per-call", type=int, default=1 << 20, show_default=True),
    click.option("--max-message-bytes", type=int, default=16 << 20, show_default=True),
)

# metrics, the OpenAI front, stopping, rebuilding and logs
_FRONTS = _options(
    click.option("--metrics-addr", default=None, metavar="HOST:PORT",
                 help="Serve Prometheus metrics at http://HOST:PORT/metrics (e.g. 127.0.0.1:9464; "
                      "a bare :PORT binds loopback). Figures are summed over namespaces unless "
                      "--metrics-namespaces."),
    click.option("--metrics-namespaces", is_flag=True,
                 help="Label the metrics by namespace name (anyone who reaches the endpoint "
                      "then reads the namespaces' names)."),
    click.option("--http", "http", default=None, metavar="HOST:PORT",
                 help="Also serve the OpenAI-compatible API at http://HOST:PORT/v1 (chat and "
                      "text completions; loopback is open, another address needs the token "
                      "or --insecure)."),
    click.option("--allowed-hosts", "allowed_hosts", multiple=True, metavar="NAME[,NAME]",
                 help="Host names the --http front also answers to, besides its own address "
                      "(and localhost on loopback); '*' allows any. A web page under another "
                      "name is refused (DNS rebinding)."),
    click.option("--stop-timeout", type=click.FloatRange(min=0.0), default=10.0, show_default=True,
                 metavar="SECONDS",
                 help="From SIGTERM/SIGINT to exit at most: in-flight generations end at once "
                      "(clients are told the daemon is stopping), the rest may finish within "
                      "it; what still runs after it is abandoned (acknowledged writes stay "
                      "durable)."),
    click.option("--rebuild", type=click.Choice(["background", "blocking"]), default="background",
                 show_default=True,
                 help="After a restart, rebuild the trees from LMDB while serving, or before."),
    click.option("--log-json", is_flag=True, help="One JSON object per log line."),
    click.option("--log-level", default="info", show_default=True,
                 type=click.Choice(["debug", "info", "warning", "error"])),
)

# several nodes sharing their trees through Redis
_FLEET = _options(
    click.option("--fleet", "fleet", envvar="SUFFIXD_FLEET", default=None, metavar="REDIS_URL",
                 help="Join a fleet: the global and corpus trees of every namespace follow the "
                      "other nodes' through Redis Streams (redis://[:PASSWORD@]HOST:PORT/DB, "
                      "rediss:// for TLS; or the password in $SUFFIXD_REDIS_PASSWORD)."),
    click.option("--node-id", envvar="SUFFIXD_NODE_ID", default=None,
                 help="This node's name in the fleet [default: the host name]."),
    click.option("--fleet-prefix", default="suffixd", show_default=True,
                 help="Prefix of the fleet's Redis keys (several fleets in one database)."),
    click.option("--fleet-max-backlog", type=int, default=100_000, show_default=True,
                 help="Entries kept (in LMDB) for Redis while it is unreachable."),
    click.option("--fleet-max-entries", type=int, default=100_000, show_default=True,
                 help="Stream length per namespace above which a caught-up node snapshots "
                      "the namespace and trims the stream."),
    click.option("--no-sync", is_flag=True, hidden=True,
                 help="Do not fsync commits (benchmarks only: acknowledged writes may be lost)."),
)


@click.command()
@_LISTENING
@_GENERATION
@_LIMITS
@_FRONTS
@_FLEET
def serve(
    data_dir: Path | None,
    listen: tuple[str, ...],
    auth_token: str | None,
    insecure: bool,
    tls_cert: Path | None,
    tls_key: Path | None,
    model: str,
    draft_model: Path | None,
    model_load: str,
    ctx_size: int,
    kv_slots: int,
    prompt_cache_mb: int,
    threads: int,
    deterministic: bool | None,
    n_gpu_layers: int,
    workers: int,
    global_budget_tokens: int,
    max_sessions: int,
    max_namespaces: int,
    max_session_tokens: int,
    max_session_bytes: int,
    max_total_session_tokens: int,
    max_total_session_bytes: int,
    session_idle_timeout: float,
    max_tokens_per_call: int,
    max_message_bytes: int,
    metrics_addr: str | None,
    metrics_namespaces: bool,
    http: str | None,
    allowed_hosts: tuple[str, ...],
    stop_timeout: float,
    rebuild: str,
    log_json: bool,
    log_level: str,
    fleet: str | None,
    node_id: str | None,
    fleet_prefix: str,
    fleet_max_backlog: int,
    fleet_max_entries: int,
    no_sync: bool,
) -> None:
    """Run the suffixd daemon (gRPC, and with --http the OpenAI API) until SIGTERM or
    Ctrl-C."""
    from suffixd.daemon.common.config import CacheConfig, Limits, default_data_dir
    from suffixd.daemon.common.logs import configure
    from suffixd.daemon.http_api.guard import parse_allowed_hosts
    from suffixd.daemon.server.serve import run
    from suffixd.daemon.server.serve_config import ServeConfig, ServeError

    configure(log_level, json_lines=log_json)
    if bool(tls_cert) != bool(tls_key):
        raise click.UsageError("--tls-cert and --tls-key go together")
    hosts = parse_allowed_hosts(allowed_hosts)
    if hosts and not http:
        raise click.UsageError("--allowed-hosts names hosts of the --http front: give --http")
    cfg = ServeConfig(
        data_dir=data_dir or default_data_dir(),
        listen=list(listen),
        auth_token=auth_token or None,
        insecure=insecure,
        model=None if model.lower() == "none" else model,
        tls_cert=tls_cert,
        tls_key=tls_key,
        max_workers=workers,
        limits=Limits(
            max_message_bytes=max_message_bytes,
            max_tokens_per_call=max_tokens_per_call,
            max_sessions_per_namespace=max_sessions,
            max_namespaces=max_namespaces,
            max_session_tokens=max_session_tokens,
            max_session_bytes=max_session_bytes,
            max_total_session_tokens=max_total_session_tokens,
            max_total_session_bytes=max_total_session_bytes,
            session_idle_timeout_s=session_idle_timeout,
        ),
        cache=CacheConfig(global_budget_tokens=global_budget_tokens),
        sync=not no_sync,
        background_rebuild=rebuild == "background",
        stop_timeout_s=stop_timeout,
        extra={
            key: value
            for key, value in (("metrics_addr", metrics_addr),
                               ("metrics_namespaces", metrics_namespaces),
                               ("draft_model", draft_model),
                               ("model_load", model_load), ("http", http),
                               ("allowed_hosts", hosts),
                               ("ctx_size", ctx_size), ("kv_slots", kv_slots),
                               ("threads", threads), ("n_gpu_layers", n_gpu_layers),
                               ("fleet", fleet), ("node_id", node_id))
            if value
        },
    )
    cfg.extra["prompt_cache_mb"] = prompt_cache_mb  # 0 (off) must reach the verifier
    if deterministic is not None:  # False (off) must reach it too
        cfg.extra["deterministic"] = deterministic
    if fleet:
        cfg.extra["fleet_options"] = {"prefix": fleet_prefix, "max_backlog": fleet_max_backlog,
                                      "max_entries": fleet_max_entries}
    try:
        code = run(cfg)
    except ServeError as exc:
        click.echo(f"suffixd serve: error: {exc}", err=True)
        sys.exit(2)
    except OSError as exc:
        # A disk that fills or turns read-only under the start-up (after the preflight's
        # probe): one line, not a traceback.
        from suffixd.daemon.server.startup import disk_error_line

        click.echo(f"suffixd serve: error: {disk_error_line(cfg.data_dir, exc)}", err=True)
        sys.exit(2)
    sys.stderr.flush()
    os._exit(code) if code else None
