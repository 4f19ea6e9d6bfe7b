"""What each model of a verifier/draft pair costs per token and per k rows on this machine,
and so which regime the pair is in (whether a draft model can pay for itself).

    python bench/make_quant_pair.py --types F16,Q8_0        # the pair (build/quant-pair/)
    python bench/pair_regime.py [VERIFIER.gguf ...] [--draft GGUF] [--ks 1,2,4,8,16]
                                [--reps 5] [--threads 2] [--no-llama-bench] [--json]

VERIFIERs default to every GGUF in build/quant-pair/, the draft to the embedded Q4_K_M.
Every model (the draft too) is measured two ways:

* llama-bench (built from the vendored llama.cpp by ``bench/build_llama_server.sh
  --targets llama-bench`` unless ``--llama-bench PATH``): ``tg`` (one-token decodes)
  and ``pp k`` for each k, after ``--depth`` cached tokens, flash attention off and
  weight repacking as suffixd's verifier has them. Its ``pp k`` asks logits for the
  batch's LAST row only, where verification needs every row's: it leaves out k - 1
  rows of the output layer (262k x 640 for gemma-3), so it understates a verify batch;
* suffixd's own measurement (``Verifier.measure_cost_profile``, what ``suffixd serve``
  times at start-up): a batch of k rows with logits for every row after 512 cached
  tokens, the fastest of ``--reps`` rounds; and, per pair, the draft model's seconds
  per drafted token as the daemon times it (``draft_model.draft_seconds_per_token``,
  its Python loop included).

Printed as markdown: per model, decode ms and k rows in ms and in decodes, with the fit
k rows ~ 1 + a*k decodes (least squares over k >= 2); per pair, the draft/verifier cost
ratio and, from the daemon's own drafting policy (``AdaptiveDrafter``) fed these costs,
the per-token acceptance from which the draft model pays and the expected speed-up at
a few acceptances. The machine's load average is printed with the figures: on a
machine shared with other work they are not the models' own.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ACCEPTANCES = (0.5, 0.7, 0.9)


def llama_bench_binary() -> Path:
    """The ``llama-bench`` that bench/build_llama_server.sh builds (or reuses)."""
    out = subprocess.run(
        ["bash", str(ROOT / "bench" / "build_llama_server.sh"), "--targets", "llama-bench"],
        env={**os.environ, "PYTHON": os.environ.get("PYTHON", sys.executable)},
        check=True, stdout=subprocess.PIPE, text=True).stdout
    return Path(out.strip().splitlines()[-1])


def llama_bench(binary: Path, model: Path, ks: Sequence[int], *, threads: int, reps: int,
                n_gen: int, depth: int) -> dict[str, Any]:
    """llama-bench's ``tg n_gen`` and ``pp k`` for each k: seconds per decoded token and
    per k-row batch (fastest repetition), and the CPU it reports."""
    from suffixd.daemon.model import extra_weight_buffers

    cmd = [str(binary), "-m", str(model), "-t", str(threads), "-p", ",".join(map(str, ks)),
           "-n", str(n_gen), "-d", str(depth), "-r", str(reps), "-fa", "off",
           "--repack", "1" if extra_weight_buffers() else "0", "-o", "json"]
    print("pair_regime: " + " ".join(cmd), file=sys.stderr)
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         text=True).stdout
    rows = json.loads(out)
    decode_s = None
    k_rows: dict[int, float] = {}
    for r in rows:
        best = min(r.get("samples_ns") or [r["avg_ns"]]) / 1e9
        if r["n_gen"] > 0 and r["n_prompt"] == 0:
            decode_s = best / r["n_gen"]
        elif r["n_prompt"] > 0 and r["n_gen"] == 0:
            k_rows[int(r["n_prompt"])] = best
    return {"decode_s": decode_s, "k_rows_s": k_rows, "cpu": rows[0].get("cpu_info", "")
            if rows else "", "command": cmd}


def suffixd_costs(model: Path, ks: Sequence[int], *, threads: int, reps: int,
                  max_rounds: int) -> dict[str, Any]:
    """suffixd's own measurement of ``model`` as a verifier: seconds per k-row batch with
    every row's logits (raw, and after the padding plan), and the load it was taken under."""
    from suffixd.daemon.generation.verifier import Verifier

    v = Verifier(model, n_ctx=512 + max(ks) + 64, n_threads=threads, n_slots=1,
                 prompt_cache_mb=0)
    try:
        v.measure_cost_profile(ks=ks, reps=reps, max_rounds=max(reps, max_rounds))
        return {"decode_s": v.raw_cost_seconds[1], "k_rows_s": dict(v.raw_cost_seconds),
                "padded_s": dict(v.cost_seconds), "pad_to": v.batch_padding,
                "load": dict(v.cost_load)}
    finally:
        v.close()


def draft_token_seconds(verifier: Path, draft: Path, threads: int) -> float:
    """The draft model's seconds per drafted token, as the daemon times it for its policy."""
    from suffixd.daemon.generation.draft_model import DraftModel, draft_seconds_per_token
    from suffixd.daemon.generation.verifier import Verifier

    v = Verifier(verifier, n_ctx=1024, n_threads=threads, n_slots=1, prompt_cache_mb=0)
    try:
        dm = DraftModel(draft, v)
        try:
            return draft_seconds_per_token(v, dm)
        finally:
            dm.close()
    finally:
        v.close()


def fit_slope(k_rows_s: dict[int, float], one_s: float) -> float | None:
    """a in k rows ~ 1 + a*k decodes of ``one_s``, least squares over k >= 2."""
    pts = [(k, s / one_s - 1.0) for k, s in k_rows_s.items() if k >= 2]
    if not pts:
        return None
    return sum(k * y for k, y in pts) / sum(k * k for k, _ in pts)


def break_even(verify_s: dict[int, float], draft_s: float, max_tokens: int = 8
               ) -> tuple[float | None, dict[float, tuple[int, float]]]:
    """With the daemon's own policy (``AdaptiveDrafter.plan``) fed these costs: the lowest
    per-token acceptance (in steps of 0.01) at which it drafts at all, and its planned
    (k, expected speed-up over plain decoding) at each of ACCEPTANCES."""
    from suffixd.daemon.generation.draft_model import AdaptiveDrafter

    policy = AdaptiveDrafter(lambda ctx, k, key: [], verify_s, draft_s, max_tokens)
    lowest = next((a / 100 for a in range(101) if policy.plan(max_tokens, a / 100)[0] > 0),
                  None)
    return lowest, {a: policy.plan(max_tokens, a) for a in ACCEPTANCES}


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.2f}"


def model_table(models: dict[str, dict[str, Any]], ks: Sequence[int]) -> list[str]:
    """The per-model markdown table: one row per (model, measurement)."""
    head = ("| model | size MB | measured by | decode ms | "
            + " | ".join(f"{k} rows ms (decodes)" for k in ks) + " | fit 1 + a*k: a |")
    lines = [head, "|" + " --- |" * (5 + len(ks))]
    for name, m in models.items():
        for by, key in (("llama-bench pp (last row's logits)", "llama_bench"),
                        ("suffixd (every row's logits)", "suffixd")):
            r = m.get(key)
            if not r or not r.get("decode_s"):
                continue
            one = r["decode_s"]
            cells = [f"{_ms(r['k_rows_s'].get(k))} ({r['k_rows_s'][k] / one:.2f})"
                     if k in r["k_rows_s"] else "-" for k in ks]
            a = fit_slope(r["k_rows_s"], one)
            lines.append(f"| {name} | {m['bytes'] / 1e6:.0f} | {by} | {_ms(one)} | "
                         + " | ".join(cells) + f" | {'-' if a is None else f'{a:.3f}'} |")
    return lines


def pair_table(pairs: list[dict[str, Any]]) -> list[str]:
    head = ("| verifier | draft | draft/verifier decode (llama-bench) | (suffixd) | "
            "drafted token ms (daemon's timing) | / verifier decode | drafts pay from "
            "acceptance | " + " | ".join(f"plan at {a}: k, speed-up" for a in ACCEPTANCES)
            + " |")
    lines = [head, "|" + " --- |" * (7 + len(ACCEPTANCES))]
    for p in pairs:
        def ratio(x: float | None) -> str:
            return "-" if x is None else f"{x:.3f}"
        plans = [f"{k}, {g:.2f}x" for k, g in (p["plans"][a] for a in ACCEPTANCES)]
        lines.append(f"| {p['verifier']} | {p['draft']} | {ratio(p['ratio_llama_bench'])} | "
                     f"{ratio(p['ratio_suffixd'])} | {_ms(p['draft_token_s'])} | "
                     f"{ratio(p['draft_token_ratio'])} | "
                     f"{'never' if p['break_even'] is None else p['break_even']} | "
                     + " | ".join(plans) + " |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("verifiers", nargs="*", type=Path,
                    help="verifier GGUFs [every *.gguf in build/quant-pair/]")
    ap.add_argument("--draft", type=Path, default=None, help="[the embedded Q4_K_M]")
    ap.add_argument("--ks", default="1,2,4,8,16", help="batch rows to time [1,2,4,8,16]")
    ap.add_argument("--reps", type=int, default=5, help="repetitions / rounds [5]")
    ap.add_argument("--max-rounds", type=int, default=8,
                    help="suffixd's rounds while its measurement looks load-distorted [8]")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-gen", type=int, default=32, help="llama-bench tg tokens [32]")
    ap.add_argument("--depth", type=int, default=512,
                    help="llama-bench cached tokens before each test (suffixd's: 512) [512]")
    ap.add_argument("--llama-bench", type=Path, default=None,
                    help="llama-bench binary [built by bench/build_llama_server.sh]")
    ap.add_argument("--no-llama-bench", action="store_true", help="suffixd's measurement only")
    ap.add_argument("--max-draft", type=int, default=8,
                    help="the draft model policy's longest draft (the daemon's: 8) [8]")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead")
    args = ap.parse_args()
    ks = sorted({int(k) for k in args.ks.split(",") if k.strip()} | {1})
    if args.draft is None:
        from suffixd.daemon.model import embedded_model_path

        args.draft = embedded_model_path()
    verifiers = args.verifiers or sorted((ROOT / "build" / "quant-pair").glob("*.gguf"))
    if not verifiers:
        ap.error("no verifier GGUF (run bench/make_quant_pair.py first)")
    bench_bin = None if args.no_llama_bench else (args.llama_bench or llama_bench_binary())
    models: dict[str, dict[str, Any]] = {}
    for path in [args.draft, *verifiers]:
        print(f"pair_regime: measuring {path.name}", file=sys.stderr)
        m: dict[str, Any] = {"path": str(path), "bytes": path.stat().st_size}
        if bench_bin is not None:
            m["llama_bench"] = llama_bench(bench_bin, path, ks, threads=args.threads,
                                           reps=args.reps, n_gen=args.n_gen, depth=args.depth)
        m["suffixd"] = suffixd_costs(path, ks, threads=args.threads, reps=args.reps,
                                     max_rounds=args.max_rounds)
        models[path.name] = m
    draft = models[args.draft.name]
    pairs = []
    for path in verifiers:
        v = models[path.name]
        token_s = draft_token_seconds(path, args.draft, args.threads)
        lowest, plans = break_even(v["suffixd"]["padded_s"], token_s, args.max_draft)
        lb_v, lb_d = v.get("llama_bench", {}), draft.get("llama_bench", {})
        pairs.append({
            "verifier": path.name, "draft": args.draft.name,
            "ratio_llama_bench": lb_d["decode_s"] / lb_v["decode_s"]
            if lb_v.get("decode_s") and lb_d.get("decode_s") else None,
            "ratio_suffixd": draft["suffixd"]["decode_s"] / v["suffixd"]["decode_s"],
            "draft_token_s": token_s, "draft_token_ratio": token_s / v["suffixd"]["decode_s"],
            "break_even": lowest, "plans": plans})
    load = os.getloadavg()
    out = {"threads": args.threads, "ks": ks, "reps": args.reps, "depth": args.depth,
           "loadavg": [round(x, 2) for x in load], "cpus": os.cpu_count(),
           "models": models,
           "pairs": [{**p, "plans": {str(a): list(v) for a, v in p["plans"].items()}}
                     for p in pairs]}
    if args.json:
        print(json.dumps(out, default=str))
        return
    cpu = next((m["llama_bench"]["cpu"] for m in models.values() if "llama_bench" in m), "")
    print(f"{cpu or 'CPU'}: {os.cpu_count()} CPUs, {args.threads} threads, load average "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; fastest of {args.reps} repetitions")
    for name, m in models.items():
        lo = m["suffixd"]["load"]
        if lo.get("distorted"):
            print(f"WARNING: {name}: suffixd's measurement looks load-distorted ({lo})")
    print()
    print("\n".join(model_table(models, ks)))
    print()
    print("\n".join(pair_table(pairs)))


if __name__ == "__main__":
    main()
