"""What a prompt-cache checkpoint save costs: the whole call, and how long it holds the
model (every other sequence's step waits that long).

    python bench/checkpoint_save_cost.py [--tokens 1500] [--saves 30]

The first ``--tokens`` of a swe_django prompt (``../shared/data``) are evaluated on one
slot, whose state is then saved ``--saves`` times (``Verifier._save_checkpoint``);
medians printed. Run it at two commits to compare implementations.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

from suffixd.daemon.generation.chat import ChatRenderer
from suffixd.daemon.generation.verifier import GenerateParams, Verifier
from suffixd.daemon.model import embedded_model_path

WORKLOAD = Path(__file__).resolve().parents[2] / "shared/data/workloads/swe_django.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1500)
    ap.add_argument("--saves", type=int, default=30)
    args = ap.parse_args()
    v = Verifier(embedded_model_path(), n_ctx=8192, n_slots=2)
    try:
        with WORKLOAD.open() as f:
            msgs = json.loads(f.readline())["messages"]
        prompt = ChatRenderer(v).tokens(msgs[:2])[: args.tokens]
        list(v.generate("a", prompt, GenerateParams(max_tokens=1)))
        slot = v._slots["a"]
        held: list[float] = []
        guard = v._memory_guard

        @contextlib.contextmanager
        def timed() -> Iterator[None]:
            with guard():
                t = time.perf_counter()
                yield
                held.append(time.perf_counter() - t)

        v._memory_guard = timed  # type: ignore[method-assign]
        calls = []
        for _ in range(args.saves):
            t = time.perf_counter()
            v._save_checkpoint(slot, "bench")
            calls.append(time.perf_counter() - t)
        state = int(v._llama_cpp.llama_state_seq_get_size(v._ctx.ctx, slot.seq_id))
        print(json.dumps({"tokens": len(slot.tokens), "state_mb": round(state / 1e6, 1),
                          "save_ms": round(statistics.median(calls) * 1e3, 2),
                          "model_held_ms": round(statistics.median(held) * 1e3, 2)}))
    finally:
        v.close()


if __name__ == "__main__":
    main()
