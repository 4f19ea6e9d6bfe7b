"""What a verification step of k rows costs against a one-row decode, with the patched
build's few-row matrix products on and off (scripts/install_llama_cpp.sh,
``SUFFIXD_GGML_ROWS``).

    python bench/row_kernels.py [--model PATH] [--shapes "1;2;4;8;1,1,1,1,1,1,1,1"]
                                [--context 500] [--rounds 7] [--passes 2] [--threads 2]
                                [--json FILE] [--against off|nogroup]
    PYTHONPATH=build/llama-cpp-avx2 python bench/row_kernels.py      # AVX2 kernels
    python bench/row_kernels.py --against nogroup --shapes "1;1,1,1,1,1,1,1,1" --context 1200

A shape lists rows per sequence: ``4`` is one sequence verifying a 3-token draft,
``1,1,1,1,1,1,1,1`` eight agents decoding a token each. Every sequence holds
``--context`` random cached tokens; every new row has logits, as in a verification step.
Each shape is timed as one decode, the median of ``--rounds`` after a warm-up, the rows
rolled back after each.

ggml reads the switch once per process, so each setting runs in a process of its own,
the two alternating over ``--passes`` (on first, then off first), so that the machine's
drift prices both alike. The report gives each shape's median over passes, on / off, and
the cost in one-row decodes of its own setting (what the daemon's cost profile would
measure). ``--against nogroup`` compares with the products on but attention's heads
multiplied one by one (the build before ``+suffixd.3``) instead of with them off; the report
still calls the baseline "off".
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
from pathlib import Path
from typing import Any

DEFAULT_SHAPES = "1;2;3;4;6;8;12;16;24;32;1,1,1,1;1,1,1,1,1,1,1,1;2,2,2,2,2,2,2,2"
SETTINGS = ("on", "off")


def parse_shapes(spec: str) -> list[list[int]]:
    shapes = [[int(x) for x in part.split(",")] for part in spec.split(";") if part.strip()]
    if not shapes or any(not s or min(s) < 1 for s in shapes):
        raise SystemExit(f"--shapes: rows per sequence, at least one each: {spec!r}")
    return shapes


def time_shapes(shapes: list[list[int]], model: str | None, context: int, rounds: int,
                threads: int) -> dict[str, float]:
    """In this process (its ``SUFFIXD_GGML_ROWS`` as set): the median ms of each shape."""
    import llama_cpp
    from shared_step_cost import open_streams  # a script beside this one

    n = max(len(s) for s in shapes)
    decode, memory = open_streams(n, context + 64, threads, model_path=model)
    rng = random.Random(0)
    for s in range(n):
        toks = [rng.randrange(1000, 20000) for _ in range(context)]
        for i in range(0, len(toks), 512):
            decode([(s, toks[i: i + 512], i, 0)])
    out = {}
    for shape in shapes:
        times = []
        for r in range(rounds + 1):
            rows = [(s, [rng.randrange(1000, 20000) for _ in range(k)], context, k)
                    for s, k in enumerate(shape)]
            t0 = time.perf_counter()
            decode(rows)
            dt = time.perf_counter() - t0
            for s, _, pos0, _ in rows:
                llama_cpp.llama_memory_seq_rm(memory, s, pos0, -1)
            if r:  # the first is a warm-up
                times.append(dt)
        out[",".join(map(str, shape))] = statistics.median(times) * 1e3
    return out


def run_child(setting: str, args: argparse.Namespace) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--child", "--shapes", args.shapes, "--context",
           str(args.context), "--rounds", str(args.rounds), "--threads", str(args.threads)]
    if args.model:
        cmd += ["--model", args.model]
    env = {**os.environ, "SUFFIXD_GGML_ROWS": setting}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"row_kernels: the {setting!r} process failed:\n{done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def report(passes: list[dict[str, dict[str, float]]]) -> dict[str, Any]:
    """Per shape: each setting's median over passes, on / off, and in one-row decodes."""
    shapes = list(passes[0]["on"])
    med = {st: {sh: statistics.median(p[st][sh] for p in passes) for sh in shapes}
           for st in SETTINGS}
    one = {st: med[st].get("1") for st in SETTINGS}  # the one-row decode, where timed
    rows = []
    for sh in shapes:
        rows.append({
            "shape": sh, "rows": sum(int(x) for x in sh.split(",")),
            "on_ms": round(med["on"][sh], 2), "off_ms": round(med["off"][sh], 2),
            "on_over_off": round(med["on"][sh] / med["off"][sh], 3),
            "on_decodes": round(med["on"][sh] / one["on"], 2) if one["on"] else None,
            "off_decodes": round(med["off"][sh] / one["off"], 2) if one["off"] else None,
        })
    return {"passes": len(passes), "shapes": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a GGUF (default: the embedded model)")
    ap.add_argument("--shapes", default=DEFAULT_SHAPES)
    ap.add_argument("--context", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--against", choices=("off", "nogroup"), default="off",
                    help="the baseline's SUFFIXD_GGML_ROWS (default: off)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    shapes = parse_shapes(args.shapes)
    if args.child:
        print(json.dumps(time_shapes(shapes, args.model, args.context, args.rounds,
                                     args.threads)))
        return
    import llama_cpp

    version = llama_cpp.__version__
    if "+suffixd." not in version:
        print(f"row_kernels: llama-cpp-python {version} is not the patched build: both "
              "settings run tinyBLAS", file=sys.stderr)
    passes = []
    for p in range(args.passes):
        order = SETTINGS if p % 2 == 0 else SETTINGS[::-1]
        passes.append({st: run_child("on" if st == "on" else args.against, args)
                       for st in order})
    out = {"llama_cpp_python": version, "model": args.model or "embedded",
           "against": args.against,
           "context": args.context, "threads": args.threads, "rounds": args.rounds,
           **report(passes)}
    print(f"llama-cpp-python {version}, {out['model']}, {args.context} cached tokens a "
          f"sequence, {args.threads} threads, medians of {args.rounds} x {args.passes} passes; "
          f"off = SUFFIXD_GGML_ROWS={args.against}")
    print(f"{'rows per sequence':<18} {'rows':>4} {'on ms':>8} {'off ms':>8} {'on/off':>7} "
          f"{'on, decodes':>12} {'off, decodes':>13}")
    for r in out["shapes"]:
        print(f"{r['shape']:<18} {r['rows']:>4} {r['on_ms']:>8.1f} {r['off_ms']:>8.1f} "
              f"{r['on_over_off']:>7.3f} {r['on_decodes'] or 0:>12.2f} "
              f"{r['off_decodes'] or 0:>13.2f}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
