"""The OpenAI-compatible endpoint against gRPC Generate, one run (`suffixd bench http`):
the run, its figures and its text table.

Starts a daemon (`suffixd serve --http 127.0.0.1:0`, the model loaded before the first
turn) and replays a workload's sessions as an agent does: each turn sends the whole
conversation so far (the recorded history), once through gRPC Generate (named
session) and once through ``/v1/chat/completions`` with the official ``openai`` client
and NO session header (the daemon must find the conversation itself), alternating turn
by turn, each front in a namespace of its own so both see the same drafts. Reported per
front: decode tok/s as the daemon measured it, the streamed token rate and the whole
turn as the client saw them; the HTTP front's cost against gRPC; and the share of the
turns continuing a conversation that the daemon found without a header.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .daemons import start_daemon, wait_measured
from .errors import BenchError
from .workloads import load_session_turns

# openai is a benchmark dependency, imported where it runs. Messages read from a workload
# file go to it cast to its message types: the daemon checks them, not this process.
if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam


def run_http(workload: Path, sessions: int, max_tokens: int, model: str | None,
             threads: int, ctx_size: int) -> dict[str, Any]:
    """WORKLOAD's first ``sessions`` sessions through both fronts of one daemon, turn by
    turn, alternating which goes first; the figures as one JSON object."""
    import openai

    from ..client import Client

    todo = load_session_turns(workload, sessions)
    if not todo:
        raise BenchError(f"{workload}: no assistant turns")
    tmp = Path(tempfile.mkdtemp(prefix="suffixd-bench-http-"))
    daemon = start_daemon(tmp / "data", model, threads, ctx_size)
    fronts = ("grpc", "http")
    agg: dict[str, dict[str, float]] = {
        f: {"tokens": 0, "decode_s": 0.0, "turn_s": 0.0, "stream_tokens": 0, "stream_s": 0.0}
        for f in fronts}
    continuing = found = 0
    try:
        wait_measured(daemon.proc, daemon.target)
        client = Client(daemon.target)
        oai = openai.OpenAI(base_url=daemon.http, api_key="none", max_retries=0, timeout=600)
        for n, (session, msgs) in enumerate(todo):
            order = fronts if n % 2 == 0 else fronts[::-1]
            for front in order:
                t0 = time.perf_counter()
                first = last = None
                pieces = 0
                if front == "grpc":
                    totals: dict[str, Any] = {}
                    for c in client.generate(session, messages=msgs, max_tokens=max_tokens,
                                             namespace="bench-grpc"):
                        now = time.perf_counter()
                        if c.token_ids:
                            first = first or now
                            last = now
                            pieces += len(c.token_ids)
                        totals = c.totals or totals
                    tokens = int(totals.get("completion_tokens", 0))
                    decode_s = float(totals.get("decode_seconds", 0.0))
                else:
                    stream = oai.chat.completions.create(
                        model="default", messages=cast("list[ChatCompletionMessageParam]", msgs),
                        max_tokens=max_tokens, temperature=0,
                        stream=True, stream_options={"include_usage": True},
                        extra_headers={"X-Suffixd-Namespace": "bench-http"})
                    extra: dict[str, Any] = {}
                    usage = None
                    for ev in stream:
                        now = time.perf_counter()
                        if ev.choices and ev.choices[0].delta.content:
                            first = first or now
                            last = now
                            pieces += 1
                        if ev.model_extra and "suffixd" in ev.model_extra:
                            extra = ev.model_extra["suffixd"]
                        usage = ev.usage or usage
                    tokens = usage.completion_tokens if usage else 0
                    decode_s = float(extra.get("decode_seconds", 0.0))
                    if any(m["role"] == "assistant" for m in msgs):
                        continuing += 1
                        found += int(bool(extra.get("session_found")))
                a = agg[front]
                a["turn_s"] += time.perf_counter() - t0
                a["tokens"] += tokens
                a["decode_s"] += decode_s
                if first is not None and last is not None and last > first:
                    a["stream_tokens"] += tokens - 1
                    a["stream_s"] += last - first
        client.close()
    finally:
        daemon.stop(30)
        shutil.rmtree(tmp, ignore_errors=True)

    def rate(f: str, tok: str, sec: str) -> float:
        return agg[f][tok] / agg[f][sec] if agg[f][sec] else 0.0

    out: dict[str, Any] = {"workload": str(workload), "turns": len(todo),
                           "sessions": len({s for s, _ in todo}), "max_tokens": max_tokens}
    for f in fronts:
        out[f"{f}_decode_tok_s"] = round(rate(f, "tokens", "decode_s"), 2)
        out[f"{f}_client_stream_tok_s"] = round(rate(f, "stream_tokens", "stream_s"), 2)
        out[f"{f}_turn_s"] = round(agg[f]["turn_s"] / len(todo), 4)
        out[f"{f}_tokens"] = int(agg[f]["tokens"])
    out["http_cost_decode"] = round(
        1 - out["http_client_stream_tok_s"] / max(out["grpc_client_stream_tok_s"], 1e-9), 4)
    out["http_cost_turn"] = round(out["http_turn_s"] / max(out["grpc_turn_s"], 1e-9) - 1, 4)
    out["continuing_turns"] = continuing
    out["sessions_found"] = found
    out["sessions_found_share"] = round(found / continuing, 4) if continuing else 1.0
    return out


def http_lines(out: dict[str, Any], workload: Path) -> list[str]:
    """``run_http``'s figures as the text table."""
    fronts = ("grpc", "http")
    lines = [f"{workload.name}: {out['sessions']} sessions, {out['turns']} turns, "
             f"{out['max_tokens']} tokens max",
             f"{'front':<6} {'decode tok/s':>13} {'client tok/s':>13} {'turn s':>8}"]
    for f in fronts:
        lines.append(f"{f:<6} {out[f'{f}_decode_tok_s']:>13.2f} "
                     f"{out[f'{f}_client_stream_tok_s']:>13.2f} {out[f'{f}_turn_s']:>8.3f}")
    lines.append(f"HTTP front's cost: {out['http_cost_decode']:+.1%} of the streamed token "
                 f"rate, {out['http_cost_turn']:+.1%} of the turn time")
    lines.append(f"sessions found without a header: {out['sessions_found']}/"
                 f"{out['continuing_turns']} continuing turns")
    return lines
