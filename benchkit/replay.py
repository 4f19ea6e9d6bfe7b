"""The model-free benches: a workload replayed through draft sources as the replay protocol
says (`suffixd bench replay`: suffixd's drafter, llama-cpp-python's prompt lookup) and the
native suffix tree alone (`suffixd bench tree`), their figures and text tables."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from suffixcache.cost import CostProfile
from suffixcache.drafter import Draft, DraftConfig
from suffixcache.replay import DraftSource, Session, SuffixSource, replay

from .errors import BenchError


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


def replay_sources(sessions: list[Session], names: Sequence[str], profile: CostProfile, *,
                   max_spec: int = 32, use_tree: bool = False, cost_aware: bool = True,
                   progress: bool = True) -> dict[str, dict[str, float | int | str]]:
    """``sessions`` replayed through each draft source of ``names`` ("suffixd", "pld"):
    its figures by source (``progress``: a bar of the responses' tokens on a terminal's
    stderr)."""
    from tqdm import tqdm

    total = sum(len(m.content) for s in sessions for m in s.messages if m.role == "assistant")
    results: dict[str, dict[str, float | int | str]] = {}
    for name in names:
        source: DraftSource
        if name == "pld":
            source = PromptLookupSource()
        else:
            config = DraftConfig(max_tokens=max_spec, use_tree=use_tree, cost_aware=cost_aware)
            source = SuffixSource(profile, config)
        with tqdm(
            total=total,
            unit="tok",
            desc=f"replay {name}",
            disable=not progress or not sys.stderr.isatty(),
            file=sys.stderr,
        ) as bar:
            res = replay(sessions, source, profile, max_spec=max_spec, on_turn=bar.update)
        results[name] = res.figures()
    return results


def replay_table(workload: str, results: dict[str, dict[str, float | int | str]]) -> list[str]:
    """``replay_sources``' figures as the text table, a column per source."""
    names = list(results)
    width = max(len(k) for k in FIGURE_ORDER) + 2
    lines = [f"workload: {workload}",
             "figure".ljust(width) + "".join(n.rjust(14) for n in names)]
    for key in FIGURE_ORDER:
        row = key.ljust(width)
        for n in names:
            v = results[n][key]
            row += f"{v:14.3f}" if isinstance(v, float) else f"{v:14d}"
        lines.append(row)
    return lines


def tree_figures(workload: str, sessions: list[Session], max_depth: int) -> dict[str, Any]:
    """The native tree alone over ``sessions``' responses: bulk insert, speculate (2,000
    probes, seeded) and remove (every other response), per token and per call."""
    import random
    import time

    from suffixcache import SuffixTree

    seqs = [m.content for s in sessions for m in s.messages if m.role == "assistant" and m.content]
    n_tokens = sum(len(q) for q in seqs)
    if not n_tokens:
        raise BenchError("the workload has no assistant turns")
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
    figures: dict[str, Any] = {
        "workload": workload,
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
    return figures


def tree_lines(figures: dict[str, Any]) -> list[str]:
    """``tree_figures`` as text, a figure a line."""
    return [f"{key:24s} {value:.3f}" if isinstance(value, float) else f"{key:24s} {value}"
            for key, value in figures.items()]
