"""A prompt-heavy agent workload from swe_django (issue 45): the sessions whose first
turns add the longest tool outputs, the regime of coding agents where each turn appends
hundreds to thousands of tokens of a command's output to the history.

    python bench/make_prompt_heavy_workload.py --turns 4 --sessions 8 \\
        -o build/workloads/swe_prompt_heavy.jsonl

Each session's score is the mean length (characters) of the tool outputs (``user``
messages after the first assistant turn) within its first ``--turns`` assistant turns;
sessions scoring under ``--min-chars`` are left out, the rest written best first, whole
and unchanged, so that ``suffixd bench agent --turns K`` replays them as recorded.
Prints one line per session kept (its score and the tokens its turns add, roughly
4 characters a token).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

SWE = Path(__file__).resolve().parents[1].parent / "shared/data/workloads/swe_django.jsonl"


def tool_output_chars(messages: list[dict[str, str]], turns: int) -> list[int]:
    """The lengths of the tool outputs that come before each of the first ``turns``
    assistant turns (after the first one: the task itself is not a tool output)."""
    out: list[int] = []
    seen = 0
    pending = 0
    for m in messages:
        if m["role"] == "assistant":
            if seen:
                out.append(pending)
            seen += 1
            pending = 0
            if seen >= turns:
                break
        elif seen and m["role"] in ("user", "tool"):
            pending += len(m["content"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", type=Path, default=SWE)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--min-chars", type=int, default=2000)
    ap.add_argument("-o", "--output", type=Path, required=True)
    args = ap.parse_args()
    if not args.source.exists():
        sys.exit(f"{args.source}: not found (the shared data folder)")
    scored = []
    with args.source.open() as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            lens = tool_output_chars(rec["messages"], args.turns)
            if len(lens) >= args.turns - 1 and lens:
                scored.append((statistics.mean(lens), lens, line))
    scored.sort(key=lambda s: -s[0])
    kept = [s for s in scored if s[0] >= args.min_chars][: args.sessions]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with args.output.open("w") as f:
        for score, lens, line in kept:
            f.write(line if line.endswith("\n") else line + "\n")
            rec = json.loads(line)
            print(f"{rec['session']}: mean tool output {score:,.0f} chars "
                  f"(~{score / 4:,.0f} tokens); per turn {lens}")
    print(f"{len(kept)} sessions -> {args.output}")
    return 0 if kept else 1


if __name__ == "__main__":
    sys.exit(main())
