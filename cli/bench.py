"""`suffixd bench`: measurements that make figures comparable across implementations."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import click

from suffixcache.cost import CostProfile
from suffixcache.drafter import Draft, DraftConfig
from suffixcache.replay import DraftSource, SuffixSource, replay

from ..benchkit.errors import BenchError
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


class PromptLookupSource:
    """llama-cpp-python's own LlamaPromptLookupDecoding (n-gram 2, 10 tokens), as it ships."""

    name = "pld"

    def __init__(self, max_ngram_size: int = 2, num_pred_tokens: int = 10) -> None:
        import numpy as np
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self._np = np
        self._pld = LlamaPromptLookupDecoding(
            max_ngram_size=max_ngram_size, num_pred_tokens=num_pred_tokens
        )
        self._buf = np.zeros(1 << 16, dtype=np.intc)
        self._n = 0

    def begin_session(self, key: str) -> None:
        self._n = 0

    def append(self, key: str, tokens: Sequence[int], *, generated: bool) -> None:
        need = self._n + len(tokens)
        if need > len(self._buf):
            self._buf = self._np.resize(self._buf, max(need, 2 * len(self._buf)))
        self._buf[self._n : need] = tokens
        self._n = need

    def propose(self, key: str, context: list[int], max_tokens: int) -> Draft:
        out = self._pld(self._buf[: self._n])[:max_tokens]
        toks = [int(t) for t in out]
        return Draft(
            toks,
            list(range(-1, len(toks) - 1)),
            [1.0] * len(toks),
            ["pld"] * len(toks),
            0,
            float(len(toks)),
        )

    def observe(self, draft: Draft, accepted: int, accepted_tokens: Sequence[int]) -> None:
        pass

    def end_turn(self, key: str, response: Sequence[int]) -> None:
        pass

    def end_session(self, key: str) -> None:
        pass

    def memory(self) -> dict[str, int]:
        return {"tokens": self._n, "bytes": int(self._buf.nbytes)}


FIGURE_ORDER = [
    "out_tokens",
    "steps",
    "tokens_per_step",
    "accepted_per_step",
    "spec_per_step",
    "accept_rate",
    "draft_hit_rate",
    "cpu_model_speedup",
    "spec_us_per_call",
    "update_us_per_token",
    "index_us_per_prompt_token",
    "index_ms_per_request",
    "cached_tokens",
    "bytes_per_cached_token",
]


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
    from tqdm import tqdm

    profile = _load_profile(cost_profile)
    sessions = tokenized_workload(workload, tokenizer_path, limit_sessions)
    total = sum(len(m.content) for s in sessions for m in s.messages if m.role == "assistant")
    results: dict[str, dict[str, float | int | str]] = {}
    for name in sources or ("suffixd",):
        source: DraftSource
        if name == "pld":
            source = PromptLookupSource()
        else:
            config = DraftConfig(
                max_tokens=max_spec, use_tree=use_tree, cost_aware=not no_cost_aware
            )
            source = SuffixSource(profile, config)
        with tqdm(
            total=total,
            unit="tok",
            desc=f"replay {name}",
            disable=as_json or not sys.stderr.isatty(),
            file=sys.stderr,
        ) as bar:
            res = replay(sessions, source, profile, max_spec=max_spec, on_turn=bar.update)
        results[name] = res.figures()
    if as_json:
        if len(results) == 1:
            click.echo(json.dumps({"workload": workload.name, **next(iter(results.values()))}))
        else:
            click.echo(json.dumps({"workload": workload.name, "sources": results}))
        return
    _print_table(workload.name, results)


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


def _print_table(workload: str, results: dict[str, dict[str, float | int | str]]) -> None:
    names = list(results)
    width = max(len(k) for k in FIGURE_ORDER) + 2
    click.echo(f"workload: {workload}")
    click.echo("figure".ljust(width) + "".join(n.rjust(14) for n in names))
    for key in FIGURE_ORDER:
        row = key.ljust(width)
        for n in names:
            v = results[n][key]
            row += f"{v:14.3f}" if isinstance(v, float) else f"{v:14d}"
        click.echo(row)


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
    import random
    import time

    from suffixcache import SuffixTree

    sessions = tokenized_workload(workload, tokenizer_path, limit_sessions)
    seqs = [m.content for s in sessions for m in s.messages if m.role == "assistant" and m.content]
    n_tokens = sum(len(q) for q in seqs)
    if not n_tokens:
        raise click.ClickException("the workload has no assistant turns")
    tree = SuffixTree(max_depth)
    t0 = time.perf_counter()
    for i, q in enumerate(seqs):
        tree.extend(i, q)
    insert_s = time.perf_counter() - t0
    rng = random.Random(0)
    probes = []
    for _ in range(2000):
        q = seqs[rng.randrange(len(seqs))]
        cut = rng.randrange(1, len(q) + 1)
        probes.append(q[max(0, cut - 32) : cut])
    t0 = time.perf_counter()
    for ctx in probes:
        tree.speculate(ctx, max_tokens=32, max_match=32)
    spec_s = time.perf_counter() - t0
    figures = {
        "workload": workload.name,
        "sequences": len(seqs),
        "tokens": n_tokens,
        "nodes_per_token": tree.num_nodes / n_tokens,
        "bytes_per_token": tree.memory_bytes / n_tokens,
        "insert_us_per_token": insert_s / n_tokens * 1e6,
        "speculate_us_per_call": spec_s / len(probes) * 1e6,
    }
    half = seqs[::2]
    t0 = time.perf_counter()
    for i in range(0, len(seqs), 2):
        tree.remove(i)
    figures["remove_us_per_token"] = (time.perf_counter() - t0) / sum(map(len, half)) * 1e6
    if as_json:
        click.echo(json.dumps(figures))
        return
    for key, value in figures.items():
        click.echo(f"{key:24s} {value:.3f}" if isinstance(value, float) else f"{key:24s} {value}")


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
