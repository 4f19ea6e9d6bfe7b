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
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from suffixd.client.launch import LaunchError, LocalDaemon


def find_shared(arg: str | None) -> Path:
    here = Path(__file__).resolve().parents[1]
    for cand in ([Path(arg)] if arg else []) + [here.parent / "shared", Path("/work/shared")]:
        if (cand / "data").is_dir():
            return cand
    sys.exit("cannot find shared/data (pass --shared)")


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


def components(corpus: Path, roles: str) -> dict[str, object]:
    """The same units through each stage alone, in this process, one thread each."""
    from suffixd.cli.corpus.units import load_file, walk
    from suffixd.daemon.common.config import CacheConfig
    from suffixd.daemon.model import Tokenizer, embedded_model_path

    from suffixcache.cache import SuffixCache
    from suffixcache.store import Store

    t0 = time.perf_counter()
    units = []
    for rel, path in walk(corpus):
        units.extend(load_file(rel, path, roles=tuple(roles.split(","))).units)
    split_s = time.perf_counter() - t0
    tok = Tokenizer(embedded_model_path())
    t0 = time.perf_counter()
    seqs = [[t for seg in u.segments for t in tok.tokenize(seg)] for u in units]
    tok_s = time.perf_counter() - t0
    n = sum(map(len, seqs))
    cfg = CacheConfig()
    cache = SuffixCache(max_depth=cfg.max_depth, global_budget_tokens=cfg.global_budget_tokens)
    t0 = time.perf_counter()
    for i, s in enumerate(seqs):
        cache.add_corpus("bench", i + 1, s)
    tree_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as d, Store(d) as store:
        t0 = time.perf_counter()
        for i in range(0, len(seqs), 500):
            store.write(lambda t, part=seqs[i : i + 500]: [  # type: ignore[misc]
                t.add_sequence("bench", "corpus", x, doc="d") for x in part])
        store_s = time.perf_counter() - t0
    return {
        "tokens": n,
        "read_split_tokens_per_s": round(n / split_s),
        "tokenize_tokens_per_s": round(n / tok_s),
        "tree_insert_tokens_per_s": round(n / tree_s),
        "lmdb_commit_tokens_per_s": round(n / store_s),
        "serial_sum_tokens_per_s": round(n / (split_s + tok_s + tree_s + store_s)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", default=None)
    ap.add_argument("--swe-sessions", type=int, default=0,
                    help="only the first N sessions of swe_django.jsonl (0: all)")
    ap.add_argument("--roles", default="system,user,assistant")
    ap.add_argument("--components", action="store_true",
                    help="also time each stage alone (split, tokenize, tree insert, LMDB)")
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
        daemon = LocalDaemon(data_dir, log_path=tmp / "daemon.log")
        try:
            daemon.start(120)
        except LaunchError as exc:
            sys.exit(str(exc))
        try:
            first, wall1 = run_warm(corpus, data_dir, args.roles)
            rss = rss_mib(daemon.pid)
            second, wall2 = run_warm(corpus, data_dir, args.roles)
        finally:
            daemon.stop(60)
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
        result["daemon_log"] = [ln for ln in (tmp / "daemon.log").read_text().splitlines()
                                if "corpus.warm" in ln]
        if args.components:
            result["components"] = components(corpus, args.roles)
        print(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
