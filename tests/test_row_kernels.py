"""The patched build's few-row matrix products (scripts/install_llama_cpp.sh) change no
logit where they claim not to, bit for bit, on the embedded model.

Each setting runs in a process of its own: ggml reads ``SUFFIXD_GGML_ROWS`` (and
``GGML_CPU_TILED_MM``) once per process. Positions 40-55 of a made-up sequence are
evaluated as one-row decodes and as batches of 2, 3, 4, 8 and 16 rows, every row with
logits; the test compares each row's logits (hashed) across settings and shapes.

* With flash attention (no F16 matrix product in attention), the only product they take
  is the Q8_0 output head, whose stock tinyBLAS tiles already give ``vec_dot``'s floats:
  on and off must agree at every shape.
* Without it, attention's KQ and KQV on the F16 cache take them too. With the other
  row-count-dependent kernels off (repacked weights, the tiled K-quant product), a batch
  of 2-4 rows (theirs) must give a one-row decode's logits; off, tinyBLAS's F16 tiles do
  not.
* Attention's heads that share a K matrix (gemma-3: 4 per K) are one product of 4 rows
  when each sequence brings one row: a step of 4 sequences (a KV stream each) must give
  each sequence's logits alone, and the same as multiplying the heads one by one
  (``SUFFIXD_GGML_ROWS=nogroup``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import llama_cpp
import pytest

from tests.conftest import THREADS

TIER = "model"

SHAPES = {"1": [1] * 16, "2": [2] * 8, "3": [3, 3, 3, 3, 4], "4": [4] * 4, "8": [8, 8],
          "16": [16]}

# Both children: the embedded model without repacked weights (a row-count-dependent kernel)
LOAD_MODEL = textwrap.dedent("""
    import hashlib, json, sys
    import numpy as np
    import llama_cpp
    from llama_cpp import _internals
    from suffixd.daemon.model import embedded_model_path

    llama_cpp.llama_backend_init()
    mp = llama_cpp.llama_model_default_params()
    mp.use_extra_bufts = False
    model = _internals.LlamaModel(path_model=str(embedded_model_path()), params=mp,
                                  verbose=False)
""")

CHILD = LOAD_MODEL + textwrap.dedent("""
    flash, threads = sys.argv[1] == "on", int(sys.argv[2])
    shapes = json.loads(sys.argv[3])
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 1024, 512, 512
    cp.n_threads = cp.n_threads_batch = threads
    cp.flash_attn_type = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash
                          else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
    ctx = _internals.LlamaContext(model=model, params=cp, verbose=False)
    batch = _internals.LlamaBatch(n_tokens=512, embd=0, n_seq_max=1, verbose=False)
    mem = llama_cpp.llama_get_memory(ctx.ctx)
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model.model))
    toks = [2] + [100 + (977 + 131 * i) % 20000 for i in range(60)]
    prefix = 40
    batch.set_batch(toks[:prefix], 0, False)
    ctx.decode(batch)
    out = {}
    for name, chunks in shapes.items():
        llama_cpp.llama_memory_seq_rm(mem, 0, prefix, -1)
        pos, rows = prefix, []
        for n in chunks:
            batch.set_batch(toks[pos:pos + n], pos, True)
            ctx.decode(batch)
            for i in range(n):
                ptr = llama_cpp.llama_get_logits_ith(ctx.ctx, i)
                row = np.ctypeslib.as_array(ptr, shape=(n_vocab,))
                rows.append(hashlib.sha1(row.tobytes()).hexdigest())
            pos += n
        out[name] = rows
    print(json.dumps(out))
""")

# 4 sequences of 40 made-up tokens each, then 6 positions each: one row per sequence in
# steps of all 4, and each sequence alone
STREAMS_CHILD = LOAD_MODEL + textwrap.dedent("""
    threads, n_seq, prefix, steps = int(sys.argv[1]), 4, 40, 6
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 256 * n_seq, 256, 256
    cp.n_threads = cp.n_threads_batch = threads
    cp.n_seq_max, cp.kv_unified = n_seq, False
    cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = _internals.LlamaContext(model=model, params=cp, verbose=False)
    batch = _internals.LlamaBatch(n_tokens=256, embd=0, n_seq_max=n_seq, verbose=False)
    mem = llama_cpp.llama_get_memory(ctx.ctx)
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model.model))
    toks = [[2] + [100 + (977 * (s + 1) + 131 * i) % 20000 for i in range(prefix + steps)]
            for s in range(n_seq)]

    def decode(rows):  # rows: (sequence, position); one token each, every one with logits
        b = batch.batch
        b.n_tokens = len(rows)
        for i, (s, pos) in enumerate(rows):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = toks[s][pos], pos, 1, True
            b.seq_id[i][0] = s
        ctx.decode(batch)
        return [hashlib.sha1(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx.ctx, i),
                shape=(n_vocab,)).tobytes()).hexdigest() for i in range(len(rows))]

    for s in range(n_seq):
        decode([(s, p) for p in range(prefix)])
    together = {s: [] for s in range(n_seq)}
    for p in range(prefix, prefix + steps):
        for s, h in zip(range(n_seq), decode([(s, p) for s in range(n_seq)])):
            together[s].append(h)
    alone = {s: [] for s in range(n_seq)}
    for s in range(n_seq):
        llama_cpp.llama_memory_seq_rm(mem, s, prefix, -1)
        for p in range(prefix, prefix + steps):
            alone[s] += decode([(s, p)])
    print(json.dumps({"together": together, "alone": alone}))
""")

pytestmark = pytest.mark.skipif(
    not str(llama_cpp.__version__).endswith("+suffixd.3"),
    reason="the few-row products are in scripts/install_llama_cpp.sh's build only")


def _child(rows: str, *args: str) -> dict[str, Any]:
    env = {**os.environ, "SUFFIXD_GGML_ROWS": rows, "GGML_CPU_TILED_MM": "0"}
    done = subprocess.run([sys.executable, "-c", *args], env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _logits(rows: str, flash: bool) -> dict[str, Any]:
    return _child(rows, CHILD, "on" if flash else "off", str(THREADS), json.dumps(SHAPES))


def test_with_flash_attention_on_and_off_give_the_same_logits_at_every_batch_size() -> None:
    on, off = _logits("on", flash=True), _logits("off", flash=True)
    for shape in SHAPES:
        assert on[shape] == off[shape], f"{shape}-row batches: the products changed a logit"


def test_without_flash_attention_batches_of_2_to_4_rows_give_one_row_decodes_logits() -> None:
    on, off = _logits("on", flash=False), _logits("off", flash=False)
    for shape in ("2", "3", "4"):
        assert on[shape] == on["1"], f"{shape}-row batches part from one-row decodes"
    # the claim has teeth: stock's F16 tiles sum otherwise
    assert any(off[shape] != off["1"] for shape in ("2", "3", "4"))


def test_grouped_heads_of_several_sequences_give_each_sequences_logits_alone() -> None:
    grouped, one_by_one = _child("on", STREAMS_CHILD, str(THREADS)), _child(
        "nogroup", STREAMS_CHILD, str(THREADS))
    assert grouped["together"] == grouped["alone"], "a sequence's logits depend on its step"
    assert grouped == one_by_one, "multiplying the heads as one changed a logit"
