"""The example workloads and corpus in examples/: what the generator writes, well formed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from suffixd.cli.corpus.units import split_sql

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_example_files_are_what_the_generator_writes() -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "make_examples.py"), "--check"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr


def test_example_workloads_are_agent_sessions() -> None:
    for path in sorted((EXAMPLES / "workloads").glob("*.jsonl")):
        sessions = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        assert len(sessions) >= 2, path
        names = [s["session"] for s in sessions]
        assert len(set(names)) == len(names), path
        for s in sessions:
            roles = [m["role"] for m in s["messages"]]
            assert roles[0] == "system" and roles[-1] == "assistant", (path, s["session"])
            # user and assistant alternate after the system prompt: each assistant
            # message is one LLM call whose prompt is everything before it
            assert all(a != b for a, b in zip(roles[1:], roles[2:], strict=False))
            assert roles.count("assistant") >= 6
            assert all(m["content"].strip() for m in s["messages"])


def test_example_corpus_splits_into_distinct_statements() -> None:
    statements = [st for p in sorted((EXAMPLES / "corpus" / "sql").glob("*.sql"))
                  for st in split_sql(p.read_text(encoding="utf-8"))]
    assert len(statements) == 57  # the README quotes this count
    assert len(set(statements)) == len(statements)
    assert all(st.rstrip().endswith(";") for st in statements)
