"""The daemon benchmarks' shared harness: a real ``suffixd serve`` and the recorded traces.

    d = start_daemon(data_dir, *serve_args)  # a LocalDaemon, serving: answers Info
    d.target, d.pid, d.started_s             # gRPC target, pid, seconds to serve
    d.stop(60); d.kill9()                    # SIGTERM (SIGKILL past 60 s); a crash
    load_turns(workload, limit)      # [(prompt tokens, response tokens)] per assistant turn
    load_responses(workloads)        # every assistant message, tokenized
    require_data(workloads)          # exit with a message when the traces are missing
    cpu_s(pid)                       # a process's user + system CPU seconds so far
    pct(xs, q)                       # the q-quantile of seconds, in milliseconds
    DATA                             # the shared data folder (SUFFIXD_DATA, ../shared/data)

The daemon (``suffixd.client.launch.LocalDaemon``) runs on ``data_dir`` (Unix socket, real
LMDB with fsync, embedded gemma tokenizer), its log beside it as ``<data_dir>.log``; tokens
follow the replay protocol (the daemon's vocabulary). Used by daemon_rpc, daemon_loop,
daemon_durability and fleet_bench.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from suffixd.client.launch import LocalDaemon

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("SUFFIXD_DATA", ROOT.parent / "shared" / "data"))
if not DATA.exists():
    DATA = Path("/work/shared/data")


def start_daemon(data_dir: Path, *args: str, timeout: float = 120.0) -> LocalDaemon:
    """``suffixd serve --data-dir DATA_DIR ARGS`` once it answers an RPC; ``started_s``:
    seconds from the spawn to that answer (what a restart costs a client)."""
    t0 = time.perf_counter()
    d = LocalDaemon(data_dir, args).start(timeout)
    with d.client(wait_ready=False, retries=0) as c:
        c.info()  # announced means bound; an answer means served
    d.started_s = time.perf_counter() - t0
    return d


def require_data(workloads: list[str]) -> None:
    """Exit with a message (not a traceback) when the benchmark traces are missing."""
    missing = [w for w in workloads if not (DATA / "workloads" / f"{w}.jsonl").is_file()]
    if missing:
        sys.exit(f"daemon_bench needs the recorded traces {', '.join(missing)} in "
                 f"{DATA / 'workloads'} (../shared/data beside the repository, or set "
                 "SUFFIXD_DATA)")


def load_turns(workload: str, limit: int) -> list[tuple[list[int], list[int]]]:
    """(prompt tokens, response tokens) per assistant turn, replay-protocol tokenization."""
    require_data([workload])
    from suffixd.daemon.model import Tokenizer, embedded_model_path

    tok = Tokenizer(embedded_model_path())
    turns: list[tuple[list[int], list[int]]] = []
    with open(DATA / "workloads" / f"{workload}.jsonl") as f:
        for line in f:
            sess = json.loads(line)
            prompt: list[int] = []
            for m in sess["messages"]:
                toks = tok.tokenize(f"<{m['role']}>\n") + tok.tokenize(m["content"])
                if m["role"] == "assistant":
                    head = tok.tokenize("<assistant>\n")
                    body = toks[len(head):]
                    turns.append((prompt[-2048:] + head, body))
                prompt = prompt + toks
                if len(turns) >= limit:
                    return turns
    return turns


def load_responses(workloads: list[str]) -> list[list[int]]:
    """Every assistant message of the workloads, tokenized (replay protocol)."""
    require_data(workloads)
    from suffixd.daemon.model import Tokenizer, embedded_model_path

    tok = Tokenizer(embedded_model_path())
    out: list[list[int]] = []
    for w in workloads:
        with open(DATA / "workloads" / f"{w}.jsonl") as f:
            for line in f:
                for m in json.loads(line)["messages"]:
                    if m["role"] == "assistant":
                        out.append(tok.tokenize(m["content"]))
    return out


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000

