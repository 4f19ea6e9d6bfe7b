"""A suffixd daemon for a benchmark: ``start_daemon`` (``serve --http`` on a free loopback
port, the model loaded at start-up) and ``wait_measured`` (until its costs are measured),
used by the endpoint benches and by bench/soak."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..client.launch import LaunchError, LocalDaemon
from .errors import BenchError


def start_daemon(data_dir: Path, model: str | None, threads: int,
                 ctx_size: int, kv_slots: int | None = None,
                 extra_args: list[str] | None = None,
                 draft_model: str | Path | None = None) -> LocalDaemon:
    """``serve --http`` on a free loopback port (``kv_slots``: its ``--kv-slots``, or its
    default; ``draft_model``: its ``--draft-model``), the model loaded at start-up, once
    announced (``.target``: gRPC, ``.http``: the OpenAI base URL); its log is
    ``daemon.log`` beside ``data_dir``."""
    args = ["--http", "127.0.0.1:0", "--model-load", "startup", "--threads", str(threads),
            "--ctx-size", str(ctx_size)]
    if kv_slots is not None:
        args += ["--kv-slots", str(kv_slots)]
    if model:
        args += ["--model", model]
    if draft_model is not None:
        args += ["--draft-model", str(draft_model)]
    args += extra_args or []
    daemon = LocalDaemon(data_dir, args, log_path=data_dir.parent / "daemon.log")
    try:
        return daemon.start(timeout=120)
    except LaunchError as exc:
        raise BenchError(str(exc)) from None


def wait_measured(proc: Any, target: str) -> None:
    """Until the daemon's model is loaded and its costs measured (or stored): a
    measurement running beside a benchmark would slow both."""
    from ..client import Client

    client = Client(target)
    try:
        client.wait_ready()
        while client.generator_status()["cost_profile_source"] in ("", "measuring"):
            if proc.poll() is not None:
                raise BenchError(f"the daemon exited ({proc.returncode})")
            time.sleep(0.5)
    finally:
        client.close()
