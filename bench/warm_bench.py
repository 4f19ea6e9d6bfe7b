"""Corpus warming throughput, end to end, durable.

Starts a real ``suffixd serve`` (embedded gemma tokenizer, LMDB with fsync) on a
fresh data dir, then runs ``suffixd warm`` as a separate process on a folder
holding ``shared/data/corpus/sql/`` and ``shared/data/workloads/swe_django.jsonl``
(all message roles, i.e. the text of every message, ~6 M tokens), and reports
the command's own summary (tokens, seconds, tokens/s: walking, hashing,
splitting, transport, tokenization, LMDB commits and tree inserts included).
A second warm of the unchanged folder measures the idempotent skip.

    python bench/warm_bench.py [--shared ../shared] [--swe-sessions N] [--roles ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def find_shared(arg: str | None) -> Path:
    here = Path(__file__).resolve().parents[1]
    for cand in ([Path(arg)] if arg else []) + [here.parent / "shared", Path("/work/shared")]:
        if (cand / "data").is_dir():
            return cand
    sys.exit("cannot find shared/data (pass --shared)")


def start_daemon(data_dir: Path, log: Path) -> subprocess.Popen[bytes]:
    announce = data_dir / "daemon.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "suffixd.cli.main", "serve", "--data-dir", str(data_dir)],
        stdout=open(log, "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit("daemon exited:\n" + log.read_text())
        try:
            if json.loads(announce.read_text()).get("pid") == proc.pid:
                return proc
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        time.sleep(0.1)
    proc.kill()
    sys.exit("daemon did not start")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run_warm(corpus: Path, data_dir: Path, roles: str) -> tuple[dict[str, object], float]:
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "suffixd.cli.main", "warm", "--corpus", str(corpus),
         "--namespace", "bench", "--roles", roles, "--json",
         "--data-dir", str(data_dir)],
        check=True, capture_output=True, text=True,
    )
    wall = time.perf_counter() - t0
    return json.loads(out.stdout.strip().splitlines()[-1]), wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", default=None)
    ap.add_argument("--swe-sessions", type=int, default=0,
                    help="only the first N sessions of swe_django.jsonl (0: all)")
    ap.add_argument("--roles", default="system,user,assistant")
    args = ap.parse_args()
    shared = find_shared(args.shared)
    tmp = Path(tempfile.mkdtemp(prefix="suffixd-warm-bench-"))
    try:
        corpus = tmp / "corpus"
        corpus.mkdir()
        shutil.copytree(shared / "data/corpus/sql", corpus / "sql")
        swe = shared / "data/workloads/swe_django.jsonl"
        if args.swe_sessions:
            with open(swe) as src, open(corpus / "swe_django.jsonl", "w") as dst:
                for i, line in enumerate(src):
                    if i >= args.swe_sessions:
                        break
                    dst.write(line)
        else:
            shutil.copy(swe, corpus / "swe_django.jsonl")
        data_dir = tmp / "data"
        data_dir.mkdir()
        proc = start_daemon(data_dir, tmp / "daemon.log")
        try:
            first, wall1 = run_warm(corpus, data_dir, args.roles)
            rss = rss_mib(proc.pid)
            second, wall2 = run_warm(corpus, data_dir, args.roles)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        result = {
            "corpus_bytes": sum(p.stat().st_size for p in corpus.rglob("*") if p.is_file()),
            "first": first,
            "first_process_wall_s": round(wall1, 2),
            "tokens_per_s_process_wall": round(float(first["tokens"]) / wall1),  # type: ignore[arg-type]
            "second": second,
            "second_process_wall_s": round(wall2, 2),
            "daemon_rss_mib_after_warm": round(rss),
            "cpus": os.cpu_count(),
        }
        print(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
