"""Where one decode's time goes inside llama.cpp: every graph node timed apart through
llama.cpp's eval callback, summed by node name (``result_output`` the output head, ``kq``
and ``kqv`` attention's two products, ``ffn_*`` the feed-forward ones), for a step of
``--sequences`` sequences x ``--rows`` rows, each after ``--context`` cached tokens, every
row with logits, as the daemon's verifier sets llama.cpp up (a KV stream per sequence,
sliding-window layers keeping their window, no flash attention unless asked).

    python bench/op_profile.py [--sequences 8] [--rows 1] [--context 1200] [--rounds 5]
                               [--model PATH] [--flash-attn] [--top 12]
    PYTHONPATH=build/llama-cpp-avx2 python bench/op_profile.py       # AVX2 kernels

Asking for every node makes ggml stop after each one, so the sum runs a few percent above
an unobserved decode (both printed); compare nodes, not totals, across builds. The logits'
digest lets two builds' runs show they computed the same floats.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import hashlib
import random
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sequences", type=int, default=8)
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--context", type=int, default=1200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=None, help="a GGUF (default: the embedded model)")
    ap.add_argument("--flash-attn", action="store_true")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    if min(args.sequences, args.rows, args.context, args.rounds) < 1:
        raise SystemExit("op_profile: --sequences, --rows, --context and --rounds are >= 1")

    import llama_cpp
    from llama_cpp import _internals
    from suffixd.daemon.model import embedded_model_path

    # ggml_tensor's layout (ggml.h, 0.3.36): op at byte 80, name at 256
    op_at, name_at = 80, 256
    observing, last = [False], [0.0]
    nodes: list[tuple[str, float]] = []
    totals: collections.defaultdict[str, float] = collections.defaultdict(float)

    def on_node(t: int, ask: bool, _user: int) -> bool:
        if ask:
            return True  # observe every node
        now = time.perf_counter()
        if observing[0]:
            name = ctypes.string_at(t + name_at).decode(errors="replace").split("-")[0]
            op = ctypes.c_int32.from_address(t + op_at).value
            nodes.append((f"{name} (op {op})", now - last[0]))
        last[0] = time.perf_counter()
        return True

    callback = llama_cpp.ggml_backend_sched_eval_callback(on_node)
    llama_cpp.llama_backend_init()
    mp = llama_cpp.llama_model_default_params()
    model = _internals.LlamaModel(path_model=args.model or str(embedded_model_path()),
                                  params=mp, verbose=False)
    n = args.sequences
    contexts = []
    for observed in (False, True):
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx = n * (args.context + args.rows + 512)
        cp.n_batch = cp.n_ubatch = 512
        cp.n_threads = cp.n_threads_batch = args.threads
        cp.n_seq_max, cp.kv_unified, cp.swa_full = n, False, False
        cp.flash_attn_type = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if args.flash_attn
                              else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        if observed:
            cp.cb_eval = callback
        contexts.append(_internals.LlamaContext(model=model, params=cp, verbose=False))
    batch = _internals.LlamaBatch(n_tokens=512, embd=0, n_seq_max=n, verbose=False)
    b = batch.batch
    rng = random.Random(0)
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model.model))

    def decode(ctx: _internals.LlamaContext, rows: list[tuple[int, int, int, bool]]) -> float:
        for k, (seq, tok, pos, logits) in enumerate(rows):
            b.token[k], b.pos[k], b.n_seq_id[k], b.logits[k] = tok, pos, 1, logits
            b.seq_id[k][0] = seq
        b.n_tokens = len(rows)
        t0 = time.perf_counter()
        if llama_cpp.llama_decode(ctx.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")
        return time.perf_counter() - t0

    histories = [[rng.randrange(1000, 20000) for _ in range(args.context)] for _ in range(n)]
    plain: list[float] = []
    observed_s: list[float] = []
    digest = ""
    for which, ctx in enumerate(contexts):
        for s, hist in enumerate(histories):
            for i in range(0, len(hist), 512):
                decode(ctx, [(s, t, i + j, False) for j, t in enumerate(hist[i:i + 512])])
        memory = llama_cpp.llama_get_memory(ctx.ctx)
        for r in range(args.rounds + 1):
            rows = [(s, rng.randrange(1000, 20000), args.context + i, True)
                    for s in range(n) for i in range(args.rows)]
            nodes.clear()
            observing[0] = bool(which)
            last[0] = time.perf_counter()
            dt = decode(ctx, rows)
            observing[0] = False
            if r:  # the first is a warm-up
                (observed_s if which else plain).append(dt)
                if which:
                    for name, sec in nodes:
                        totals[name] += sec / args.rounds
            if not which and r == args.rounds:
                logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(ctx.ctx),
                                               shape=(len(rows), n_vocab))
                digest = hashlib.sha1(logits.tobytes()).hexdigest()[:16]
            for s in range(n):
                llama_cpp.llama_memory_seq_rm(memory, s, args.context, -1)
    version = llama_cpp.__version__
    print(f"llama-cpp-python {version}: {n} sequences x {args.rows} rows after "
          f"{args.context} cached tokens, {args.threads} threads, "
          f"flash attention {'on' if args.flash_attn else 'off'}; means of {args.rounds}")
    print(f"decode {np.mean(plain) * 1e3:.1f} ms unobserved, {np.mean(observed_s) * 1e3:.1f} "
          f"observed (nodes sum {sum(totals.values()) * 1e3:.1f}); logits {digest}")
    for name, sec in sorted(totals.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"  {name:<28} {sec * 1e3:8.2f} ms")


if __name__ == "__main__":
    main()
