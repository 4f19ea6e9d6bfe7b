"""The device kit's measurements as the regime table and as cost profiles for the
projection (issue 48).

    python bench/device/kit_profiles.py OUT_DIR [-o build/device-profiles] [--json]

OUT_DIR holds run_kit.sh's row_cost JSONs ({cpu,gpu}-{27b,270m,1b}.json; those missing are
skipped). For each device it writes
``{device}-27b.cost.json``, what k verified rows of the verifier cost in decodes of it
(``{"1": 1.0, "2": ...}``, the format ``bench/project_regime.py --profile`` and the
daemon's cost profiles take), and prints a table: one decode, k rows (every row's logits,
a verifier's step; and the last row's only, llama-bench's pp-k), and each draft model's
decode against the verifier's (*c*, the projection's draft token cost).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

SHOWN_KS = (2, 4, 8, 16, 32)
DRAFTS = ("270m", "1b")


def load(out_dir: Path, name: str) -> dict[str, Any] | None:
    path = out_dir / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def by_k(run: dict[str, Any], field: str = "all_ms") -> dict[int, float]:
    return {int(row["k"]): float(row[field]) for row in run["rows"]}


def regime(out_dir: Path, device: str) -> dict[str, Any] | None:
    verifier = load(out_dir, f"{device}-27b")
    if verifier is None:
        return None
    rows, last = by_k(verifier), by_k(verifier, "last_ms")
    decode = rows[1]
    result: dict[str, Any] = {
        "device": device,
        "threads": verifier["threads"],
        "verifier": verifier["desc"],
        "verifier_bytes": verifier["size_bytes"],
        "decode_ms": decode,
        "rows_in_decodes": {k: round(ms / decode, 3) for k, ms in sorted(rows.items())},
        "last_row_in_decodes": {k: round(ms / last[1], 3) for k, ms in sorted(last.items())},
        "system_info": verifier.get("system_info", ""),
    }
    for seqs in (4, 8):
        many = load(out_dir, f"{device}-27b-x{seqs}")
        if many is not None:
            result[f"x{seqs}_in_decodes"] = {k: round(ms / decode, 3)
                                             for k, ms in sorted(by_k(many).items())}
    for size in DRAFTS:
        draft = load(out_dir, f"{device}-{size}")
        if draft is not None:
            draft_ms = by_k(draft)[1]
            result[f"draft_{size}"] = {"desc": draft["desc"], "decode_ms": draft_ms,
                                       "cost": round(draft_ms / decode, 4)}
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("-o", "--profiles", type=Path, default=Path("build/device-profiles"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    regimes = [r for r in (regime(args.out_dir, d) for d in ("cpu", "gpu")) if r]
    if not regimes:
        raise SystemExit(f"kit_profiles: no cpu-27b.json or gpu-27b.json in {args.out_dir}")
    args.profiles.mkdir(parents=True, exist_ok=True)
    for r in regimes:
        path = args.profiles / f"{r['device']}-27b.cost.json"
        path.write_text(json.dumps({str(k): v for k, v in r["rows_in_decodes"].items()}) + "\n")
        r["profile"] = str(path)
    if args.json:
        print(json.dumps(regimes, indent=1))
        return
    head = " | ".join(f"{k} rows" for k in SHOWN_KS)
    drafts = " | ".join(f"{size} draft ms (*c*)" for size in DRAFTS)
    print(f"| device | decode ms | {head} | {drafts} |")
    print("| --- | --- | " + " | ".join("---" for _ in SHOWN_KS + DRAFTS) + " |")
    for r in regimes:
        every, last = r["rows_in_decodes"], r["last_row_in_decodes"]
        cells = " | ".join(f"{every.get(k, float('nan')):.2f} ({last.get(k, float('nan')):.2f})"
                           for k in SHOWN_KS)
        draft = " | ".join(
            f"{r[f'draft_{size}']['decode_ms']:.2f} ({r[f'draft_{size}']['cost']:.3f})"
            if f"draft_{size}" in r else "-" for size in DRAFTS)
        device = f"{r['device']} ({r['threads']} threads)"
        print(f"| {device} | {r['decode_ms']:.1f} | {cells} | {draft} |")
    print("\nk rows: decodes with every row's logits (a verifier's step); in brackets, the last "
          "row's only (llama-bench's pp-k).")
    for r in regimes:
        for seqs in (4, 8):
            if f"x{seqs}_in_decodes" in r:
                costs = ", ".join(f"{k} rows each {v:.2f}"
                                  for k, v in r[f"x{seqs}_in_decodes"].items())
                print(f"{r['device']}: {seqs} sequences at once, in decodes of one: {costs}")
        print(f"{r['device']}: profile {r['profile']}")


if __name__ == "__main__":
    main()
