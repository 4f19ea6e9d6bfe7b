"""`suffixd bench`: measurements that make figures comparable across implementations.

The group and its model-free commands (replay, tree) over benchkit/replay.py; the other
commands are the cli/bench_*.py modules, each its options over a benchkit module."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import click

from suffixcache.cost import CostProfile

from ..benchkit.errors import BenchError
from ..benchkit.replay import replay_sources, replay_table, tree_figures, tree_lines
from ..benchkit.workloads import tokenized_workload


class _BenchGroup(click.Group):
    """``suffixd bench``: a subcommand's ``BenchError`` (the benchmark library's) is the
    command's one ``Error:`` line, as a ``click.ClickException`` is."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except BenchError as exc:
            raise click.ClickException(str(exc)) from None


@click.group(cls=_BenchGroup)
def bench() -> None:
    """Benchmarks: replay recorded agent traces, measure generation."""


def workload_args(command: Callable[..., None]) -> Callable[..., None]:
    """WORKLOAD and --tokenizer, shared by the commands that replay a workload."""
    command = click.option(
        "--tokenizer",
        "tokenizer_path",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="GGUF whose vocabulary tokenizes the workload (default: embedded gemma-3-270m).",
    )(command)
    return click.argument(
        "workload", type=click.Path(exists=True, dir_okay=False, path_type=Path)
    )(command)


@bench.command("replay")
@workload_args
@click.option(
    "--cost-profile",
    default=None,
    help='Cost of verifying k tokens relative to 1: JSON or a JSON file, {"1": 1, "8": 2.53}.',
)
@click.option(
    "--max-spec",
    default=32,
    show_default=True,
    type=click.IntRange(1, 1024),
    help="Cap on draft tokens per step.",
)
@click.option(
    "--source",
    "sources",
    type=click.Choice(["suffixd", "pld"]),
    multiple=True,
    help="Draft source(s) to replay; repeat to compare side by side (default: suffixd).",
)
@click.option(
    "--sessions",
    "limit_sessions",
    type=click.IntRange(1),
    default=None,
    help="Replay only the first N sessions.",
)
@click.option(
    "--tree/--path",
    "use_tree",
    default=False,
    show_default=True,
    help="suffixd drafts a tree of branches instead of one path.",
)
@click.option(
    "--no-cost-aware", is_flag=True, help="suffixd drafts as long as its probabilities allow."
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON object (figure name -> value)."
)
def replay_cmd(
    workload: Path,
    tokenizer_path: Path | None,
    cost_profile: str | None,
    max_spec: int,
    sources: tuple[str, ...],
    limit_sessions: int | None,
    use_tree: bool,
    no_cost_aware: bool,
    as_json: bool,
) -> None:
    """Replay WORKLOAD.jsonl with the replay protocol of the shared data README."""
    profile = _load_profile(cost_profile)
    sessions = tokenized_workload(workload, tokenizer_path, limit_sessions)
    results = replay_sources(sessions, sources or ("suffixd",), profile, max_spec=max_spec,
                             use_tree=use_tree, cost_aware=not no_cost_aware,
                             progress=not as_json)
    if as_json:
        if len(results) == 1:
            click.echo(json.dumps({"workload": workload.name, **next(iter(results.values()))}))
        else:
            click.echo(json.dumps({"workload": workload.name, "sources": results}))
        return
    for line in replay_table(workload.name, results):
        click.echo(line)


def _load_profile(text: str | None) -> CostProfile:
    if text is None:
        return CostProfile.cpu_default()
    candidate = Path(text)
    try:
        if not text.lstrip().startswith("{") and candidate.is_file():
            text = candidate.read_text(encoding="utf-8")
        return CostProfile.from_json(text)
    except (OSError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint="--cost-profile") from None


@bench.command("tree")
@workload_args
@click.option("--max-depth", default=64, show_default=True, type=click.IntRange(1, 4096))
@click.option("--sessions", "limit_sessions", type=click.IntRange(1), default=None)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def tree_cmd(
    workload: Path,
    tokenizer_path: Path | None,
    max_depth: int,
    limit_sessions: int | None,
    as_json: bool,
) -> None:
    """Native tree alone: bulk insert, speculate and remove over a workload's responses."""
    sessions = tokenized_workload(workload, tokenizer_path, limit_sessions)
    figures = tree_figures(workload.name, sessions, max_depth)
    if as_json:
        click.echo(json.dumps(figures))
        return
    for line in tree_lines(figures):
        click.echo(line)


from .bench_generate import generate_bench  # noqa: E402  (suffixd bench generate)

bench.add_command(generate_bench)

from .bench_agent import agent_bench  # noqa: E402  (suffixd bench agent)

bench.add_command(agent_bench)

from .bench_http import http_bench  # noqa: E402  (suffixd bench http)

bench.add_command(http_bench)

from .bench_tools import tools_bench  # noqa: E402  (suffixd bench tools)

bench.add_command(tools_bench)

from .bench_prefix import prefix_bench  # noqa: E402  (suffixd bench prefix)

bench.add_command(prefix_bench)

from .bench_structured import structured_bench  # noqa: E402  (suffixd bench structured)

bench.add_command(structured_bench)
