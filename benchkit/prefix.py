"""New conversations that share a system prompt, one after another, through the OpenAI
endpoint, side by side with llama-server (`suffixd bench prefix WORKLOAD`): run and table.

Each session's first turn (its system prompt and first user message, as an agent starts
a task) is sent as a new conversation: to suffixd through ``/v1/chat/completions``
without a session header (the daemon opens an automatic session, on a slot that holds
nothing of it); to llama-server as the very prompt tokens the daemon renders on
``/completion`` (``cache_prompt``; its host-memory prompt cache ``--cache-ram`` and
context checkpoints at their defaults), with one slot and with ``-np 4``. ``max_tokens``
is 1, so a request's wall time is its time to first token. ``--system-file`` puts a
system prompt of one's own in front of every conversation (the recorded traces' system
prompts are short; agents with many tools carry a thousand tokens and more of them:
``bench/fixtures/coding_agent_system.md`` is one). Reported per system: prompt
tokens, the tokens it evaluated (suffixd: prompt - ``cached_tokens``; llama-server:
``timings.prompt_n``), time to first token mean and p95, and the total.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .errors import BenchError
from .generate import p95
from .workloads import first_turns, load_session_turns

# openai is a benchmark dependency, imported where it runs. Messages read from a workload
# file go to it cast to its message types: the daemon checks them, not this process.
if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam


def _row(prompts: list[int], evaluated: list[int], ttft: list[float]) -> dict[str, Any]:
    return {"requests": len(prompts), "prompt_tokens": sum(prompts),
            "evaluated_tokens": sum(evaluated),
            "evaluated_after_first": sum(evaluated[1:]),
            "ttft_mean_s": sum(ttft) / len(ttft), "ttft_p95_s": p95(ttft),
            "ttft_after_first_mean_s": sum(ttft[1:]) / max(1, len(ttft) - 1),
            "total_s": sum(ttft)}


def with_system(msgs: list[dict[str, str]], system: str | None) -> list[dict[str, str]]:
    """The conversation with ``system`` as its system message (replacing its own)."""
    if system is None:
        return msgs
    rest = [m for m in msgs if m.get("role") != "system"]
    return [{"role": "system", "content": system}, *rest]


def run_prefix(workload: Path, sessions: int, model: str | None, model_path: Path,
               n_ctx: int, threads: int, llama_server: str | None,
               prompt_cache_mb: int | None, system: str | None = None) -> dict[str, Any]:
    """Each of the first ``sessions`` sessions' first turn (``system``: its system prompt
    replaced) as a new conversation to suffixd's endpoint and, with ``llama_server``, to
    llama-server with one slot and with ``-np 4``; the figures as one JSON object."""
    import openai

    from ..daemon.generation.chat import ChatRenderer
    from ..daemon.generation.verifier import Verifier
    from .daemons import start_daemon, wait_measured
    from .llama_server import LlamaServer

    todo = [(s, with_system(m, system))
            for s, m in first_turns(load_session_turns(workload, sessions), 1)]
    if not todo:
        raise BenchError(f"{workload}: no assistant turns")
    renderer_v = Verifier(model_path, n_ctx=256, n_slots=1, n_threads=1)
    try:
        n_ctx = min(n_ctx or renderer_v.n_ctx_train, renderer_v.n_ctx_train)
        renderer = ChatRenderer(renderer_v)
        turns = [(s, m, renderer.tokens(m)) for s, m in todo]
    finally:
        renderer_v.close()
    turns = [t for t in turns if len(t[2]) + 64 <= n_ctx]
    results: dict[str, dict[str, Any]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="suffixd-bench-prefix-"))
    try:
        extra = [] if prompt_cache_mb is None else ["--prompt-cache-mb", str(prompt_cache_mb)]
        daemon = start_daemon(tmp / "data", model, threads, n_ctx, extra_args=extra)
        try:
            wait_measured(daemon.proc, daemon.target)
            oai = openai.OpenAI(base_url=daemon.http, api_key="none", max_retries=0, timeout=1800)
            prompts, evaluated, ttft = [], [], []
            for _, msgs, _ in turns:
                t0 = time.perf_counter()
                r = oai.chat.completions.create(
                    model="default", messages=cast("list[ChatCompletionMessageParam]", msgs),
                    temperature=0, max_tokens=1,
                    extra_headers={"X-Suffixd-Namespace": "bench-prefix"})
                ttft.append(time.perf_counter() - t0)
                assert r.usage is not None
                details = r.usage.prompt_tokens_details
                cached = details.cached_tokens if details and details.cached_tokens else 0
                prompts.append(r.usage.prompt_tokens)
                evaluated.append(r.usage.prompt_tokens - cached)
            results["suffixd"] = _row(prompts, evaluated, ttft)
        finally:
            daemon.stop(30)
        if llama_server:
            for n_parallel in (1, 4):
                name = f"llama-server -np {n_parallel}"
                srv = LlamaServer(llama_server, model_path, threads=threads, n_ctx=n_ctx,
                                  n_parallel=n_parallel, log_path=tmp / f"ls{n_parallel}.log")
                try:
                    srv.wait_ready()
                    prompts, evaluated, ttft = [], [], []
                    for _, _, toks in turns:
                        turn = srv.complete(toks, 1)
                        prompts.append(len(toks))
                        evaluated.append(turn.prompt_n)
                        ttft.append(turn.wall_s)
                    results[name] = _row(prompts, evaluated, ttft)
                finally:
                    srv.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"workload": str(workload), "conversations": len(turns), "n_ctx": n_ctx,
            "system_prompt": "recorded" if system is None else "replaced",
            "threads": threads, "results": results}


def prefix_lines(out: dict[str, Any]) -> list[str]:
    """``run_prefix``'s figures as the text table."""
    lines = [f"{Path(out['workload']).name}: {out['conversations']} new conversations, "
             f"{out['threads']} threads",
             f"{'system':<20} {'prompt tok':>10} {'evaluated':>10} {'eval 2..':>9} "
             f"{'ttft s':>8} {'p95 s':>7} {'ttft 2.. s':>10} {'total s':>8}"]
    for name, r in out["results"].items():
        lines.append(f"{name:<20} {r['prompt_tokens']:>10} {r['evaluated_tokens']:>10} "
                     f"{r['evaluated_after_first']:>9} {r['ttft_mean_s']:>8.2f} "
                     f"{r['ttft_p95_s']:>7.2f} {r['ttft_after_first_mean_s']:>10.2f} "
                     f"{r['total_s']:>8.2f}")
    return lines
