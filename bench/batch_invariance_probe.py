"""Which of llama.cpp's CPU choices make a row's logits depend on the rest of its batch.

    python bench/batch_invariance_probe.py [--long] [--rounds N] [--passes N] [--threads N]
                                           [--cost-only] [--generate] [--cpu-time] [--json FILE]
    PYTHONPATH=build/llama-cpp-avx2 python bench/batch_invariance_probe.py   # AVX2 kernels

A speculative verifier evaluates the same position as a 1-token decode in one step and as
row j of a k-row verification batch (maybe shared with other sequences, maybe rolled
back) in another: greedy output is independent of drafts, batching and load only if
those give the same logits, bit for bit. For each configuration this loads the embedded
model on llama-cpp-python's low-level API with the verifier's other context parameters
(a KV stream per sequence, n_batch = n_ubatch = 512, ``--threads``: two by default) and
compares against a reference, every position of a fixed text decoded one token at a time
after its prefix was evaluated in one batch:

* ``rows k``: positions P..P+k-1 as one k-row batch (all logits), k = 2..33;
* ``next``: the 1-token decode after such a batch (what its K/V rows do to later steps);
* ``shared 8 + m``: an 8-row batch sharing the decode with m rows of another sequence
  (m = 8: one ubatch; m = 3: llama.cpp splits it in two);
* ``drafted``: a drafted run's pattern, verification batches of 1-9 rows, each rolled
  back to a prefix of itself, over 38 positions;
* ``threads``: 1-token decodes with the other thread count (one if ``--threads`` is two
  or more, else two);
* ``prefix in 2 chunks``: the prefix evaluated as two chunks instead of one;
* ``--long``: the drafted pattern past position 1100 (the sliding-window layers' ring of
  n_swa + n_ubatch cells has wrapped), and the 1100-token prompt cut four ways (chunks of
  64 to 1036 rows) before a 1-token decode.

The configurations (``CONFIGS``): the weights repacked or not (llama-cpp-python's
``use_extra_bufts``), ggml-cpu's tiled K-quant matrix multiply on or off (environment
``GGML_CPU_TILED_MM``, read once per process, so each setting runs in a process of its
own), flash attention or not, and "padded": no sequence with a single row in a decode (a
second row, the same token at the next position without logits, rolled back after).

Per line: the largest |logit difference| over the rows compared, how many rows were
bitwise equal, and in how many the argmax or the top-8 set differed. Then the decode cost
of the configurations the verifier could run (no flash attention): a 1-token decode, 4-,
8- and 16-row verification batches (logits on every row) and a 128-row prompt chunk
(none), medians over ``--rounds`` per pass, configurations interleaved within a round and
the processes alternated over ``--passes``, so a shared machine's load falls on all alike.
``--generate`` adds the verifier's own cost, deterministic mode against the default: ms
per generated token, plain and drafted, and a 600-token prompt (``generate_cost``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

WORDS = ("the", "a", "river", "stone", "light", "under", "quiet", "market", "north", "paper",
         "seven", "window", "because", "table", "select", "from", "where", "count", "name",
         "city", "green", "slowly", "between", "garden", "number", "order", "by", "and",
         "clock", "winter", "bridge", "said", "was", "not", "into", "over", "music", "old")
PREFIX = 48  # P: the positions compared start here
ROW_COUNTS = (2, 3, 4, 5, 7, 8, 9, 16, 17, 33)
# (rows evaluated, rows kept) per step of the drafted pattern: rejections, full accepts
DRAFTED = ((5, 2), (1, 1), (9, 4), (3, 3), (2, 1), (8, 8), (4, 1), (7, 5), (1, 1), (6, 3),
           (9, 9), (2, 2))
LONG_PREFIX = 1100  # past n_swa + n_ubatch = 1024: the sliding-window ring has wrapped
PROMPT_CUTS = ((1000, 100), (64, 1036), (700, 300, 100), (1099, 1))
TOP = 8
COST_SHAPES = (1, 4, 8, 16)
PROMPT_ROWS = 128


@dataclass(frozen=True)
class Config:
    name: str
    extra_bufts: bool  # repacked weights (llama.cpp's CPU "extra buffer types")
    tiled: bool  # ggml-cpu's tiled K-quant mul_mat (GGML_CPU_TILED_MM)
    flash: bool = False
    min_rows: int = 1  # a sequence's rows in a decode padded to this many (no logits)
    timed: bool = False  # one the verifier could run: its decode cost is measured


CONFIGS = (
    Config("default: repack on, tiled on", True, True, timed=True),  # the verifier's today
    Config("repack off", False, True, timed=True),
    Config("flash attn", True, True, flash=True),
    Config("repack off, tiled off", False, False, timed=True),
    Config("repack off, tiled off, flash attn", False, False, flash=True),
    Config("repack off, tiled off, padded", False, False, min_rows=2, timed=True),
    Config("repack off, tiled off, padded, flash", False, False, flash=True, min_rows=2),
)


class Model:
    """One model and context on llama-cpp-python's low-level API, as the verifier makes
    them (two sequences, a KV stream each, n_batch = n_ubatch = 512)."""

    def __init__(self, path: str, cfg: Config, n_ctx: int, threads: int = 2) -> None:
        import llama_cpp
        from llama_cpp import _internals

        self.ll = llama_cpp
        self.threads = threads
        self.min_rows = cfg.min_rows
        mp = llama_cpp.llama_model_default_params()
        mp.use_extra_bufts = cfg.extra_bufts
        self.model = _internals.LlamaModel(path_model=path, params=mp, verbose=False)
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx = n_ctx * 2
        cp.n_batch = cp.n_ubatch = 512
        cp.n_threads = cp.n_threads_batch = threads
        cp.n_seq_max = 2
        cp.kv_unified = False
        cp.swa_full = False
        cp.flash_attn_type = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if cfg.flash
                              else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        self.ctx = _internals.LlamaContext(model=self.model, params=cp, verbose=False)
        self.mem = llama_cpp.llama_get_memory(self.ctx.ctx)
        self.batch = _internals.LlamaBatch(n_tokens=512, embd=0, n_seq_max=1, verbose=False)
        self.n_vocab = int(self.model.n_vocab())

    def tokenize(self, text: str) -> list[int]:
        return list(self.model.tokenize(text.encode(), True, False))

    def rm(self, seq: int, from_pos: int) -> None:
        self.ll.llama_memory_seq_rm(self.mem, seq, from_pos, -1)

    def set_threads(self, n: int) -> None:
        self.ll.llama_set_n_threads(self.ctx.ctx, n, n)

    def decode(self, rows: Sequence[tuple[int, Sequence[int], int, bool]]) -> list[np.ndarray]:
        """One llama_decode of (sequence, tokens, first position, logits on every row);
        returns the logit rows asked for, copied, in batch order."""
        b = self.batch.batch
        n = 0
        padded = []
        for seq, toks, pos0, logits in rows:
            pad = max(0, self.min_rows - len(toks))
            for i, t in enumerate([*toks, *[toks[-1]] * pad]):
                b.token[n], b.pos[n], b.n_seq_id[n] = t, pos0 + i, 1
                b.seq_id[n][0] = seq
                b.logits[n] = logits and i < len(toks)
                n += 1
            if pad:
                padded.append((seq, pos0 + len(toks)))
        b.n_tokens = n
        if not any(b.logits[i] for i in range(n)):
            b.logits[n - 1] = True  # llama.cpp wants one at least
        if self.ll.llama_decode(self.ctx.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")
        out = []
        for i in range(n):
            if b.logits[i]:
                ptr = self.ll.llama_get_logits_ith(self.ctx.ctx, i)
                out.append(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy())
        for seq, end in padded:  # the padding's K/V rows go, as a rejected draft's do
            self.rm(seq, end)
        return out if any(logits for *_, logits in rows) else []

    def prefill(self, seq: int, toks: Sequence[int], cuts: Sequence[int]) -> None:
        """The slot holding ``toks`` alone, evaluated in chunks of ``cuts`` rows (each cut
        further in chunks of 512, n_batch)."""
        self.rm(seq, 0)
        pos = 0
        for cut in cuts:
            for p in range(pos, pos + cut, 512):
                self.decode([(seq, toks[p:min(pos + cut, p + 512)], p, False)])
            pos += cut

    def close(self) -> None:
        self.batch.close()
        self.ctx.close()
        self.model.close()


def text_tokens(m: Model, n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    toks: list[int] = []
    while len(toks) < n:
        toks = m.tokenize(" ".join(rng.choice(WORDS) for _ in range(n + 16)))
    return toks[:n]


@dataclass
class Diff:
    rows: int = 0
    equal: int = 0
    max_abs: float = 0.0
    argmax: int = 0
    topk: int = 0

    def add(self, got: np.ndarray, ref: np.ndarray) -> None:
        self.rows += 1
        self.equal += int(np.array_equal(got, ref))
        self.max_abs = max(self.max_abs, float(np.max(np.abs(got - ref))))
        self.argmax += int(np.argmax(got) != np.argmax(ref))
        top_g = set(np.argpartition(-got, TOP)[:TOP].tolist())
        top_r = set(np.argpartition(-ref, TOP)[:TOP].tolist())
        self.topk += int(top_g != top_r)

    @staticmethod
    def line(d: dict[str, Any]) -> str:
        return (f"max|d| {d['max_abs']:7.4f}  bitwise {d['equal']:3d}/{d['rows']:<3d}  "
                f"argmax {d['argmax']}  top{TOP} {d['topk']}")


def singles(m: Model, seq: int, toks: list[int], start: int, end: int) -> list[np.ndarray]:
    """Logits after each of toks[start:end] decoded one at a time (the prefix toks[:start]
    in chunks of 512 first)."""
    m.prefill(seq, toks[:start], [start])
    return [m.decode([(seq, [toks[p]], p, True)])[0] for p in range(start, end)]


def drafted(m: Model, toks: list[int], start: int, ref: list[np.ndarray]) -> Diff:
    """Verification steps of ``DRAFTED`` shapes from ``start``: each evaluates its rows
    (the text's tokens, so each row has its reference), keeps a prefix, rolls back the
    rest; every kept row is compared with the 1-token decode of its position."""
    d = Diff()
    m.prefill(0, toks[:start], [start])
    pos, i = start, 0
    while pos - start < len(ref) - 9:
        rows, keep = DRAFTED[i % len(DRAFTED)]
        got = m.decode([(0, toks[pos:pos + rows], pos, True)])
        for j in range(keep):
            d.add(got[j], ref[pos - start + j])
        m.rm(0, pos + keep)
        pos += keep
        i += 1
    return d


def probe(m: Model, long: bool) -> dict[str, Diff]:
    toks = text_tokens(m, PREFIX + 48, seed=1)
    other = text_tokens(m, PREFIX + 48, seed=2)
    ref = singles(m, 0, toks, PREFIX, PREFIX + 41)
    out: dict[str, Diff] = {}
    nxt = Diff()
    for k in ROW_COUNTS:
        m.prefill(0, toks[:PREFIX], [PREFIX])
        d = Diff()
        for j, row in enumerate(m.decode([(0, toks[PREFIX:PREFIX + k], PREFIX, True)])):
            d.add(row, ref[j])
        out[f"rows {k}"] = d
        nxt.add(m.decode([(0, [toks[PREFIX + k]], PREFIX + k, True)])[0], ref[k])
    out["next (after k rows)"] = nxt
    for other_rows in (8, 3):
        m.prefill(0, toks[:PREFIX], [PREFIX])
        m.prefill(1, other[:PREFIX], [PREFIX])
        got = m.decode([(0, toks[PREFIX:PREFIX + 8], PREFIX, True),
                        (1, other[PREFIX:PREFIX + other_rows], PREFIX, True)])
        d = Diff()
        for j in range(8):
            d.add(got[j], ref[j])
        out[f"shared 8 + {other_rows} rows"] = d
    out["drafted"] = drafted(m, toks, PREFIX, ref)
    other_threads = 1 if m.threads > 1 else 2
    m.set_threads(other_threads)
    d = Diff()
    for j, row in enumerate(singles(m, 0, toks, PREFIX, PREFIX + 8)):
        d.add(row, ref[j])
    m.set_threads(m.threads)
    out[f"threads {other_threads}"] = d
    m.prefill(0, toks[:PREFIX], [PREFIX - 8, 8])
    d = Diff()
    d.add(m.decode([(0, [toks[PREFIX]], PREFIX, True)])[0], ref[0])
    out["prefix in 2 chunks"] = d
    if long:
        lt = text_tokens(m, LONG_PREFIX + 48, seed=3)
        lref = singles(m, 0, lt, LONG_PREFIX, LONG_PREFIX + 41)
        out[f"drafted past {LONG_PREFIX}"] = drafted(m, lt, LONG_PREFIX, lref)
        d = Diff()
        for cuts in PROMPT_CUTS:
            m.prefill(0, lt[:LONG_PREFIX], cuts)
            d.add(m.decode([(0, [lt[LONG_PREFIX]], LONG_PREFIX, True)])[0], lref[0])
        out[f"prompt cut {len(PROMPT_CUTS)} ways"] = d
    return out


_CLOCK = [time.perf_counter]


def clock() -> float:
    """The timings' clock: wall time, or with ``--cpu-time`` this thread's CPU time (with
    one llama.cpp thread the decode runs on the calling thread, and the time the machine's
    other work takes the core from it is not counted)."""
    return _CLOCK[0]()


def cost(models: list[Model], rounds: int) -> list[dict[str, float]]:
    """Median seconds of a 1-token decode, k-row verification batches and a prompt chunk
    per model, the models taking turns within every round."""
    times: list[dict[str, list[float]]] = [{} for _ in models]
    toks = text_tokens(models[0], PREFIX + PROMPT_ROWS, seed=4)
    for m in models:
        m.prefill(0, toks[:PREFIX], [PREFIX])
        m.rm(1, 0)
    for _ in range(rounds):
        for m, t in zip(models, times, strict=True):
            for k in COST_SHAPES:
                t0 = clock()
                m.decode([(0, toks[PREFIX:PREFIX + k], PREFIX, True)])
                t.setdefault(f"{k} rows", []).append(clock() - t0)
                m.rm(0, PREFIX)
            t0 = clock()
            m.decode([(0, toks[PREFIX:PREFIX + PROMPT_ROWS], PREFIX, False)])
            t.setdefault(f"prompt {PROMPT_ROWS}", []).append(clock() - t0)
            m.rm(0, PREFIX)
    return [{k: statistics.median(v) for k, v in t.items()} for t in times]


def child(tiled: bool, check: bool, long: bool, rounds: int, threads: int) -> dict[str, Any]:
    """This process's share: the configurations of its GGML_CPU_TILED_MM setting."""
    import llama_cpp
    from suffixd.daemon.model import embedded_model_path
    from suffixd.daemon.model.llama_log import route_llama_logs

    route_llama_logs()
    llama_cpp.llama_backend_init()
    path = str(embedded_model_path())
    configs = [c for c in CONFIGS if c.tiled == tiled and (check or c.timed)]
    out: dict[str, Any] = {}
    models = []
    for c in configs:
        m = Model(path, c, n_ctx=LONG_PREFIX + 64 if long else 256, threads=threads)
        if check:
            out[c.name] = {"diffs": {k: asdict(v) for k, v in probe(m, long).items()}}
        models.append(m)
    timed = [(c, m) for c, m in zip(configs, models, strict=True) if c.timed]
    if rounds:
        for (c, _), res in zip(timed, cost([m for _, m in timed], rounds), strict=True):
            out.setdefault(c.name, {})["cost_s"] = res
    for m in models:
        m.close()
    return out


def generate_cost(deterministic: bool, rounds: int, threads: int) -> dict[str, float]:
    """Seconds per generated token through the verifier (``Verifier.generate``, greedy,
    48 tokens of 3 prompts): plain decoding, and drafted from the plain output with one
    draft token in five wrong (``aligned_drafts``); and seconds of a 600-token prompt's
    evaluation. Medians over ``rounds``."""
    from suffixd.daemon.generation.verifier import GenerateParams, Verifier
    from suffixd.daemon.model import embedded_model_path

    v = Verifier(embedded_model_path(), n_ctx=1024, n_threads=threads, n_slots=2,
                 prompt_cache_mb=0, deterministic=deterministic)
    assert v.deterministic == deterministic, v.determinism
    questions = ("Write the SQL that lists every singer older than 30.",
                 "Explain in one sentence what a primary key is.",
                 "Name three tables a concert database needs.")
    prompts = [v.tokenize(f"<start_of_turn>user\n{q}<end_of_turn>\n<start_of_turn>model\n",
                          add_bos=True, special=True) for q in questions]
    params = GenerateParams(max_tokens=48, ignore_eos=True)
    long_prompt = text_tokens_v(v, 600)
    times: dict[str, list[float]] = {"plain": [], "drafted": [], "prompt 600": []}
    refs: list[list[int]] = []
    for r in range(rounds + 1):  # the first round warms up (and makes the drafts)
        for what in ("plain", "drafted"):
            t0, n = clock(), 0
            for i, p in enumerate(prompts):
                propose = aligned_drafts(refs[i], len(p), seed=i) if what == "drafted" \
                    else None
                toks = [t for c in v.generate("cost", p, params, propose) for t in c.tokens]
                v.forget("cost")
                n += len(toks)
                if r == 0 and what == "plain":
                    refs.append(toks)
            if r:
                times[what].append((clock() - t0) / n)
        t0 = clock()
        for _ in v.generate("cost", long_prompt, GenerateParams(max_tokens=1)):
            pass
        v.forget("cost")
        if r:
            times["prompt 600"].append(clock() - t0)
    v.close()
    return {k: statistics.median(x) for k, x in times.items()}


def aligned_drafts(reference: Sequence[int], prompt_len: int,
                   seed: int) -> Callable[[list[int], int], list[int]]:
    """``certify.noisy_drafts`` (lengths 0-7, one token in five wrong), but nothing once
    the output has left ``reference``: by default a drafted run can part from plain
    decoding at a near-tie, and drafts of the plain text after that would all be
    rejected, which times the parting rather than the kernels."""
    rnd = random.Random(seed)

    def propose(ctx: list[int], k: int) -> list[int]:
        at = len(ctx) - prompt_len
        if list(ctx[prompt_len:]) != list(reference[:at]):
            return []
        d = reference[at: at + rnd.randint(0, min(k, 7))]
        return [t if rnd.random() < 0.8 else (t + 11) % 1000 for t in d]

    return propose


def text_tokens_v(v: Any, n: int) -> list[int]:
    rng = random.Random(5)
    toks: list[int] = v.tokenize(" ".join(rng.choice(WORDS) for _ in range(n + 64)),
                                 add_bos=True)
    return toks[:n]


def run_child(tiled: bool, check: bool, long: bool, rounds: int,
              threads: int) -> dict[str, Any]:
    env = dict(os.environ, GGML_CPU_TILED_MM="1" if tiled else "0")
    args = [sys.executable, __file__, "--child", "on" if tiled else "off",
            "--rounds", str(rounds), "--threads", str(threads)]
    args += ["--cpu-time"] if _CLOCK[0] is time.thread_time else []
    args += ["--long"] if long else []
    args += [] if check else ["--no-check"]
    done = subprocess.run(args, env=env, check=True, capture_output=True, text=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--long", action="store_true", help="also past the sliding window")
    ap.add_argument("--rounds", type=int, default=10, help="timing rounds a pass (0: none)")
    ap.add_argument("--passes", type=int, default=2, help="timing passes per process")
    ap.add_argument("--cost-only", action="store_true", help="only the decode costs")
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp threads (the verifier's "
                    "default: 2)")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time by the thread's CPU time (with --threads 1), not wall time")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--child", choices=("on", "off"), help=argparse.SUPPRESS)
    ap.add_argument("--no-check", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-generate", choices=("det", "default"), help=argparse.SUPPRESS)
    ap.add_argument("--generate", action="store_true",
                    help="also the verifier's generation cost, deterministic or not")
    ap.add_argument("--generate-rounds", type=int, default=3,
                    help="rounds of --generate per pass")
    args = ap.parse_args()
    if args.cpu_time:
        if args.threads != 1:
            ap.error("--cpu-time counts the calling thread only: give --threads 1")
        _CLOCK[0] = time.thread_time
    if args.child_generate:
        print(json.dumps(generate_cost(args.child_generate == "det", args.rounds,
                                       args.threads)))
        return
    if args.child:
        print(json.dumps(child(args.child == "on", not args.no_check, args.long,
                               args.rounds, args.threads)))
        return
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode().strip()
    kernels = "AVX-512" if "AVX512 = 1" in info else "AVX2" if "AVX2 = 1" in info else "?"
    results: dict[str, dict[str, Any]] = {c.name: {} for c in CONFIGS}
    print(f"llama-cpp-python {llama_cpp.__version__}, {kernels} kernels ({info}), "
          f"{os.cpu_count()} CPUs, {args.threads} threads", flush=True)
    for tiled in (True, False) if not args.cost_only else ():
        for name, r in run_child(tiled, True, args.long, 0, args.threads).items():
            results[name].update(r)
            print(f"\n{name}")
            for k, d in r["diffs"].items():
                print(f"  {k:<26} {Diff.line(d)}")
            sys.stdout.flush()
    costs: dict[str, list[dict[str, float]]] = {}
    for _ in range(args.passes if args.rounds else 0):
        for tiled in (True, False):
            for name, r in run_child(tiled, False, False, args.rounds, args.threads).items():
                costs.setdefault(name, []).append(r["cost_s"])
    if costs:
        shapes = list(next(iter(costs.values()))[0])
        print(f"\ndecode cost, ms (median of {args.rounds} rounds x {args.passes} passes): "
              + " / ".join(shapes))
        for name, runs in costs.items():
            med = {s: statistics.median(r[s] for r in runs) for s in shapes}
            results[name]["cost_s"] = med
            print(f"  {name:<34} " + "  ".join(f"{med[s] * 1e3:7.1f}" for s in shapes))
    gen: dict[str, list[dict[str, float]]] = {}
    for _ in range(args.passes if args.generate else 0):
        for mode in ("default", "det"):
            env = dict(os.environ, GGML_CPU_TILED_MM="0" if mode == "det" else "1")
            done = subprocess.run(
                [sys.executable, __file__, "--child-generate", mode, "--rounds",
                 str(args.generate_rounds), "--threads", str(args.threads),
                 *(["--cpu-time"] if args.cpu_time else [])],
                env=env, check=True, capture_output=True, text=True)
            gen.setdefault(mode, []).append(json.loads(done.stdout.strip().splitlines()[-1]))
    if gen:
        print(f"\nverifier generation (median of {args.generate_rounds} rounds x "
              f"{args.passes} passes): ms per token plain / drafted, ms per 600-token prompt")
        for mode, runs in gen.items():
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            results.setdefault(f"generate: {mode}", {})["cost_s"] = med
            print(f"  {mode:<10} " + "  ".join(f"{v * 1e3:8.1f}" for v in med.values()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"llama_cpp": llama_cpp.__version__, "kernels": kernels,
                       "system_info": info, "configs": results}, f, indent=1)


if __name__ == "__main__":
    main()
