"""What one decode of several sequences costs against the same rows one sequence at a
time, and with every sequence padded to the longest (the shapes the step batcher plans).

    python bench/shared_step_cost.py [--sequences 4] [--context 1600] [--ctx-size 32768]
                                     [--unified] [--shapes "1,1,1,1;4,4,4,4;2,8,12,10"]
                                     [--flash-attn] [--kv-type K[/V]]

Sequence s holds context * (s + 1) / 2 random cached tokens (a KV stream each, as the
daemon's verifier; --unified: one pool). Each shape is timed as one decode for all, as
one decode per sequence, and padded to equal rows (logits for the real rows only), the
median of 5 repetitions after a warm-up; the rows are rolled back after each.
``--flash-attn``: with llama.cpp's CPU flash attention, as llama-server runs by default
(the verifier runs it only on the build that sums it in F32: see
daemon/generation/verifier.py), to price what it buys.
``--kv-type``: the KV cache's types, e.g. ``f16/bf16`` (with V not F16 llama.cpp's flash
attention accumulates in F32).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import llama_cpp
from llama_cpp import _internals
from suffixd.daemon.model import embedded_model_path, extra_weight_buffers

Rows = list[tuple[int, list[int], int, int]]  # (sequence, tokens, first position, outputs)


KV_TYPES = {"f16": llama_cpp.GGML_TYPE_F16, "f32": llama_cpp.GGML_TYPE_F32,
            "bf16": 30, "q8_0": llama_cpp.GGML_TYPE_Q8_0}  # ggml.h: GGML_TYPE_BF16 = 30


def open_streams(n: int, ctx_size: int, threads: int, unified: bool = False,
                 flash_attn: bool = False, kv_type: str = "f16",
                 model_path: str | None = None) -> tuple[Callable[[Rows], None], Any]:
    """The embedded model (or ``model_path``) in a context of ``n`` sequences of
    ``ctx_size`` cells each (a KV stream each, as the daemon's verifier; ``unified``: one
    pool), without flash attention unless ``flash_attn``: a ``decode(rows)`` of it and its
    memory handle (kept alive by the closure)."""
    llama_cpp.llama_backend_init()
    mp = llama_cpp.llama_model_default_params()
    mp.use_extra_bufts = extra_weight_buffers()
    model = _internals.LlamaModel(path_model=model_path or str(embedded_model_path()), params=mp,
                                  verbose=False)
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = ctx_size * n
    cp.n_batch = cp.n_ubatch = 512
    cp.n_threads = cp.n_threads_batch = threads
    cp.n_seq_max = n
    cp.kv_unified = unified
    cp.swa_full = False
    cp.flash_attn_type = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn
                          else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
    k_type, _, v_type = kv_type.partition("/")
    cp.type_k, cp.type_v = KV_TYPES[k_type], KV_TYPES[v_type or k_type]
    ctx = _internals.LlamaContext(model=model, params=cp, verbose=False)
    batch = _internals.LlamaBatch(n_tokens=512, embd=0, n_seq_max=1, verbose=False)
    b = batch.batch

    def decode(rows: Rows) -> None:
        _ = model, batch  # kept alive with the context
        k = 0
        for seq, toks, pos0, outs in rows:
            for i, t in enumerate(toks):
                b.token[k], b.pos[k], b.n_seq_id[k] = t, pos0 + i, 1
                b.seq_id[k][0] = seq
                b.logits[k] = i < outs
                k += 1
        b.n_tokens = k
        if llama_cpp.llama_decode(ctx.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")

    return decode, ctx.memory


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sequences", type=int, default=4)
    ap.add_argument("--context", type=int, default=1600)
    ap.add_argument("--ctx-size", type=int, default=32768, help="cells per sequence")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--unified", action="store_true")
    ap.add_argument("--flash-attn", action="store_true")
    ap.add_argument("--kv-type", default="f16",
                    help="the KV cache's types, K[/V], of " + ", ".join(KV_TYPES)
                    + " (flash attention accumulates in F16 only with V f16)")
    ap.add_argument("--shapes", default="1;1,1;1,1,1,1;4,4,4,4;8,8,8,8;2,8,12,10;1,16,1,16")
    args = ap.parse_args()
    n = args.sequences
    decode, memory = open_streams(n, args.ctx_size, args.threads, args.unified,
                                  args.flash_attn, args.kv_type)
    rng = random.Random(0)

    lens = {}
    for s in range(n):
        toks = [rng.randrange(1000, 20000) for _ in range(args.context * (s + 1) // 2)]
        for i in range(0, len(toks), 512):
            decode([(s, toks[i : i + 512], i, 0)])
        lens[s] = len(toks)

    def timed(groups: list[Rows]) -> float:
        def once() -> float:
            t0 = time.perf_counter()
            for rows in groups:
                decode(rows)
            dt = time.perf_counter() - t0
            for rows in groups:
                for seq, _, pos0, _ in rows:
                    llama_cpp.llama_memory_seq_rm(memory, seq, pos0, -1)
            return dt
        once()
        return statistics.median(once() for _ in range(5)) * 1e3

    def rows(shape: list[int], pad_to: int = 0) -> Rows:
        return [(s, [rng.randrange(1000, 20000) for _ in range(max(k, pad_to))], lens[s], k)
                for s, k in enumerate(shape)]

    kind = ("unified" if args.unified else "streams") + (", flash attention" if args.flash_attn
                                                         else "") + f", KV {args.kv_type}"
    print(f"{kind}, {n} sequences of {[lens[s] for s in range(n)]} cached tokens, "
          f"{args.threads} threads")
    print(f"{'rows per sequence':<20} {'one decode':>11} {'per sequence':>13} {'padded':>9}")
    for spec in args.shapes.split(";"):
        shape = [int(x) for x in spec.split(",")][:n]
        joint = timed([rows(shape)])
        apart = timed([[r] for r in rows(shape)])
        padded = timed([rows(shape, max(shape))])
        print(f"{spec:<20} {joint:>9.1f}ms {apart:>11.1f}ms {padded:>7.1f}ms")


if __name__ == "__main__":
    main()
