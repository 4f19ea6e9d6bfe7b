"""The soak's command line: its options (``parser``) and ``main`` (the work dir, the
redis-server and the nodes started with suffixd.client.launch, the run, the report
printed and written, the exit status).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from rss_watch import markdown
from suffixd.client.launch import LaunchError, RedisServer

import soak
from soak.nodes import Node, NodeError
from soak.run import soak as run_soak


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="soak", description=(soak.__doc__ or "").split("\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=12, help="gRPC clients, split between nodes.")
    ap.add_argument("--http-clients", type=int, default=4,
                    help="OpenAI-front clients (alternating nodes).")
    ap.add_argument("--fleet", action=argparse.BooleanOptionalAction, default=True,
                    help="Two nodes replicating through a redis-server (--no-fleet: one).")
    ap.add_argument("--probe-interval", type=float, default=5.0,
                    help="Seconds between replication probes (with the fleet).")
    ap.add_argument("--threads", type=int, default=None,
                    help="Each node's --threads [default: 1 with the fleet, else 2].")
    ap.add_argument("--namespaces", type=int, default=4, help="Shared by the clients.")
    ap.add_argument("--session-tokens", type=int, default=20_000,
                    help="A session is closed (and another opened) past this length.")
    ap.add_argument("--global-budget", type=int, default=300_000,
                    help="The daemons' --global-budget-tokens (per namespace).")
    ap.add_argument("--auto-sessions", type=int, default=50,
                    help="Automatic sessions (chat without a session header) a namespace "
                    "keeps open (the daemons' SUFFIXD_AUTO_SESSIONS_PER_NAMESPACE; small, so "
                    "the oldest are closed within minutes instead of after their idle hour).")
    ap.add_argument("--no-generate", dest="generate", action="store_false",
                    help="No gRPC Generate (the HTTP clients still generate).")
    ap.add_argument("--schema-share", type=float, default=0.15,
                    help="Share of the OpenAI-front requests that carry a schema from the "
                    "property test's generator (0: none).")
    ap.add_argument("--schema-in", choices=["both", "response_format", "tools"],
                    default="both", help="Where those schemas go: a response_format "
                    "json_schema, a required tool's parameters, or either.")
    ap.add_argument("--refusal-bound", type=float, default=5.0,
                    help="Seconds a 400 for a generated schema may take (refusals are "
                    "milliseconds; this leaves room for a loaded machine).")
    ap.add_argument("--events-every", type=float, default=120.0,
                    help="Mean seconds between stops/kills of a node during the run, at "
                    "random moments after the warm-up (0: none, only the final kill -9).")
    ap.add_argument("--sigterm-share", type=float, default=0.5,
                    help="Share of those events that are SIGTERM (the rest: kill -9).")
    ap.add_argument("--early-share", type=float, default=0.3,
                    help="Share of the restarts stopped again (SIGTERM or kill -9, by "
                    "--sigterm-share) at a random moment of their start-up.")
    ap.add_argument("--early-window", type=float, default=4.0,
                    help="Seconds after a restart's \"starting\" line within which such a "
                    "second stop comes (start-up takes 1-3 s, then the model loads).")
    ap.add_argument("--rss-budget-mib", type=float, default=1536.0,
                    help="Each node's RSS budget: the peak (VmHWM) of every process of it.")
    ap.add_argument("--prompt-cache-mb", type=int, default=64,
                    help="The daemons' --prompt-cache-mb (its budget; small, so it is "
                    "reached within minutes: ~5 MiB a minute of checkpoints come).")
    ap.add_argument("--memory-interval", type=float, default=30.0,
                    help="Seconds between samples of each node's RSS and its parts "
                    "(Stats' process memory).")
    ap.add_argument("--flat-window", type=float, default=20.0,
                    help="Minutes at the end of the run over which RSS must be flat (at "
                    "most a third of the run).")
    ap.add_argument("--flat-mib", type=float, default=16.0,
                    help="RSS is flat when its trend over the window is at most this many "
                    "MiB, or --flat-pct of it, whichever is larger.")
    ap.add_argument("--flat-pct", type=float, default=2.0,
                    help="... or this percentage of the window's mean RSS.")
    ap.add_argument("--require-flat", action="store_true",
                    help="Fail the run when a node's RSS is not flat over the window.")
    ap.add_argument("--memory-report", type=Path, default=None,
                    help="Also write the memory samples and verdicts here, as markdown.")
    ap.add_argument("--seed", type=int, default=0,
                    help="Seeds the schedule, the schemas and the clients' choices.")
    ap.add_argument("--data-dir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="Also write the report here.")
    return ap


def write_outputs(args: argparse.Namespace, report: dict[str, Any]) -> None:
    """The report printed, and written to --json and (its memory part) --memory-report."""
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    if args.memory_report:
        args.memory_report.write_text(markdown({**report["memory"],
                                                "command": report["command"],
                                                "date": report["date"],
                                                "seconds": report["seconds"]}))


def main() -> None:
    args = parser().parse_args()
    work = args.data_dir or Path(tempfile.mkdtemp(prefix="suffixd-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    threads = args.threads or (1 if args.fleet else 2)
    daemon_args = ["--global-budget-tokens", str(args.global_budget), "--threads", str(threads),
                   "--prompt-cache-mb", str(args.prompt_cache_mb)]
    try:
        redis = RedisServer(work).start() if args.fleet else None
    except (FileNotFoundError, LaunchError) as exc:  # not installed, or it did not start
        sys.exit(str(exc))
    names = "ab" if args.fleet else "a"
    nodes = [Node(n, work / n / "data", work / n / "daemon.log",
                  daemon_args + (["--fleet", redis.url, "--node-id", n] if redis else []),
                  {"SUFFIXD_AUTO_SESSIONS_PER_NAMESPACE": str(args.auto_sessions)})
             for n in names]
    load_start = os.getloadavg()
    try:
        report = run_soak(args, nodes, threads)
    except NodeError as exc:
        sys.exit(str(exc))
    finally:
        for n in nodes:
            n.daemon.kill9()  # those still running (an error, an interrupt); the logs closed
        if redis is not None:
            redis.stop()
    report["load_average_start"] = [round(x, 2) for x in load_start]
    report["work_dir"] = str(work)
    write_outputs(args, report)
    sys.exit(0 if report["passed"] else 1)
