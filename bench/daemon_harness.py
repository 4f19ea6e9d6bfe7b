"""The daemon benchmarks' shared harness: a real ``suffixd serve`` and the recorded traces.

    proc, target, started_s = start_daemon(data_dir, *serve_args)  # serving: answers Info
    stop_daemon(proc)                               # SIGTERM, wait
    load_turns(workload, limit)      # [(prompt tokens, response tokens)] per assistant turn
    load_responses(workloads)        # every assistant message, tokenized
    require_data(workloads)          # exit with a message when the traces are missing
    cpu_s(pid)                       # a process's user + system CPU seconds so far
    pct(xs, q)                       # the q-quantile of seconds, in milliseconds
    DATA                             # the shared data folder (SUFFIXD_DATA, ../shared/data)

The daemon runs on ``data_dir`` (Unix socket, real LMDB with fsync, embedded gemma
tokenizer), its log beside it as ``<data_dir>.log``; tokens follow the replay protocol
(the daemon's vocabulary). Used by daemon_rpc, daemon_loop, daemon_durability and
fleet_bench.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("SUFFIXD_DATA", ROOT.parent / "shared" / "data"))
if not DATA.exists():
    DATA = Path("/work/shared/data")


def start_daemon(data_dir: Path, *args: str, timeout: float = 120.0) -> tuple[Any, str, float]:
    announce = data_dir / "daemon.json"
    if announce.exists():
        announce.unlink()
    t0 = time.perf_counter()
    log = open(data_dir.parent / f"{data_dir.name}.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "suffixd.cli.main", "serve", "--data-dir",
                             str(data_dir), *args], stdout=log, stderr=subprocess.STDOUT)
    from suffixd.client import Client

    while time.perf_counter() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"daemon exited {proc.returncode}")
        if announce.exists():
            try:
                info = json.loads(announce.read_text())
            except json.JSONDecodeError:
                continue
            if info.get("pid") == proc.pid:
                target = info["listen"][0]
                c = Client(target, retries=0)
                c.info()  # serving: answers an RPC
                c.close()
                return proc, target, time.perf_counter() - t0
        time.sleep(0.01)
    proc.kill()
    raise TimeoutError("daemon did not start")


def stop_daemon(proc: Any) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


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

