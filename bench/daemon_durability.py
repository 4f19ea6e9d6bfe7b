"""The durability benchmarks: durable ingest and restart times, and the kill -9 crash test.

    bench_restart(tokens, batch_tokens)   # ingest, then restart (plain, blocking rebuild,
                                          # after kill -9): one JSON line
    bench_crash(rounds, writers)          # kill -9 mid-write, ``rounds`` times, then count
                                          # the acknowledged sequences not in LMDB
    ingest(target, seqs, batch_tokens, per_session=40) -> (tokens, seconds)
        durable AppendBatch ingest as agents do it (fleet_bench's catch-up uses it too)

What they measure is told in daemon_bench's docstring.
"""

from __future__ import annotations

import json
import random
import tempfile
import threading
import time
from pathlib import Path

from daemon_harness import load_responses, start_daemon


def ingest(target: str, seqs: list[list[int]], batch_tokens: int,
            per_session: int = 40) -> tuple[int, float]:
    """Ingest responses as agents do: sessions of ``per_session`` responses each, closed
    (responses kept in the global tree) when done; one durable AppendBatch per batch."""
    from suffixd.client import Client

    c = Client(target, timeout=600)
    t0 = time.perf_counter()
    n = 0
    for first in range(0, len(seqs), per_session):
        sid = c.open_session("restart").session_id
        batch: list[tuple[str, str, str, list[int]]] = []
        size = 0
        for s in seqs[first: first + per_session]:
            batch.append(("restart", sid, "response", s))
            size += len(s)
            if size >= batch_tokens:
                n += c.append_batch(batch)["tokens"]
                batch, size = [], 0
        if batch:
            n += c.append_batch(batch)["tokens"]
        c.close_session("restart", sid)
    dt = time.perf_counter() - t0
    c.close()
    return n, dt


def bench_restart(tokens: int, batch_tokens: int) -> None:
    responses = load_responses(["swe_django", "spider_dev"])
    seqs: list[list[int]] = []
    total = 0
    while total < tokens:  # the agents' own responses, repeated if the workloads are short
        for r in responses:
            r = r[: tokens - total]
            seqs.append(r)
            total += len(r)
            if total >= tokens:
                break
    budget = str(int(total * 1.2))
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data"
        d = start_daemon(data_dir, "--global-budget-tokens", budget)
        first_start = d.started_s
        n, dt = ingest(d.target, seqs, batch_tokens)
        d.stop(60)
        t0 = time.perf_counter()
        d = start_daemon(data_dir, "--global-budget-tokens", budget)
        restart = d.started_s
        from suffixd.client import Client

        c = Client(d.target)
        while c.info()["rebuilding"]:
            time.sleep(0.05)
        rebuilt = time.perf_counter() - t0
        st = c.stats("restart")["namespaces"][0]
        c.close()
        d.stop(60)
        d = start_daemon(data_dir, "--global-budget-tokens", budget, "--rebuild", "blocking")
        restart_blocking = d.started_s
        d.stop(60)
        start_daemon(data_dir, "--global-budget-tokens", budget).kill9()
        d = start_daemon(data_dir, "--global-budget-tokens", budget)
        restart_after_kill9 = d.started_s
        d.stop(60)
        store_bytes = sum(f.stat().st_size for f in (data_dir / "store").iterdir())
    print(json.dumps({
        "bench": "restart", "tokens": n, "sequences": len(seqs),
        "durable_ingest_tok_s": round(n / dt), "ingest_s": round(dt, 2),
        "batch_tokens": batch_tokens,
        "empty_start_s": round(first_start, 2), "restart_serving_s": round(restart, 2),
        "restart_trees_rebuilt_s": round(rebuilt, 2),
        "restart_blocking_rebuild_s": round(restart_blocking, 2),
        "restart_after_kill9_s": round(restart_after_kill9, 2),
        "global_tree_tokens": st["global"]["tokens"], "global_tree_bytes": st["global"]["bytes"],
        "lmdb_bytes": store_bytes,
    }))


# ----------------------------------------------------------------------------- crash
def bench_crash(rounds: int, writers: int) -> None:
    from suffixd.client import Client

    from suffixcache.store import Store

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data"
        acked: list[list[int]] = []
        lock = threading.Lock()
        for rnd in range(rounds):
            daemon = start_daemon(data_dir)
            target = daemon.target
            stop = threading.Event()

            def write(i: int, rnd: int = rnd, target: str = target,
                      stop: threading.Event = stop) -> None:
                rng = random.Random(rnd * 1000 + i)
                c = Client(target, retries=0, timeout=5)
                try:
                    sid = c.open_session("crash", f"r{rnd}w{i}").session_id
                    while not stop.is_set():
                        s = [rng.randrange(1000, 260_000) for _ in range(32)]
                        c.append("crash", sid, s, kind="response")
                        with lock:
                            acked.append(s)
                except Exception:
                    pass

            ts = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
            for t in ts:
                t.start()
            time.sleep(random.uniform(1.0, 3.0))
            daemon.kill9()  # mid-write
            stop.set()
            for t in ts:
                t.join()
            results.append(len(acked))
        with Store(data_dir / "store") as store:
            stored = {tuple(r["tokens"]) for r in store.iter_sequences()}
        lost = sum(1 for s in acked if tuple(s) not in stored)
    print(json.dumps({"bench": "crash", "rounds": rounds, "writers": writers,
                      "acknowledged": len(acked), "lost": lost}))
