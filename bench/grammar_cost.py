"""What large admitted (and refused) schemas cost: conversion (schema_grammar.py),
llama.cpp's grammar compile, and checking 2,048 candidate tokens against the compiled
grammar, on the embedded model's vocabulary. Limits are lifted to measure the refused
shapes too.

    python bench/grammar_cost.py
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from suffixd.daemon.generation.grammar import Grammar, GrammarLimits, grammar_for_schema
from suffixd.daemon.generation.verifier import Verifier
from suffixd.daemon.model import embedded_model_path

UNBOUNDED = GrammarLimits(max_repetition=10**6, max_nodes=10**6, max_grammar_bytes=10**8,
                          max_rules=10**7, max_seconds=60, max_expanded_repetitions=10**9)


def _strings(n: int, length: int) -> dict[str, Any]:
    names = [f"p{i}" for i in range(n)]
    return {"type": "object", "required": names,
            "properties": {k: {"type": "string", "maxLength": length} for k in names}}


CASES: dict[str, Any] = {
    "a string of maxLength 1,000": {"type": "string", "maxLength": 1000},
    "20 strings of maxLength 1,000": _strings(20, 1000),
    "50 strings of maxLength 1,000": _strings(50, 1000),
    "200 strings of maxLength 1,000": _strings(200, 1000),
    "256 optional properties": {"type": "object", "properties": {
        f"p{i}": {"type": "integer"} for i in range(256)}},
    "an enum of 1,000 values of 200 bytes": {"enum": [f"v{i}" * 40 for i in range(1000)]},
}


def main() -> None:
    verifier = Verifier(embedded_model_path(), n_ctx=256, n_slots=1)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, verifier.vocab_size, 2048).astype(np.int32)
    try:
        for name, schema in CASES.items():
            try:
                grammar_for_schema(schema)
                verdict = "admitted"
            except ValueError as exc:
                verdict = f"refused ({getattr(exc, 'limit', exc)})"
            t0 = time.perf_counter()
            gbnf = grammar_for_schema(schema, UNBOUNDED)
            t1 = time.perf_counter()
            state = Grammar(verifier, gbnf).start()
            t2 = time.perf_counter()
            state.allowed(ids)
            t3 = time.perf_counter()
            print(f"{name}: {verdict}; {len(gbnf):,} bytes, convert {(t1 - t0) * 1e3:.1f} ms, "
                  f"compile {(t2 - t1) * 1e3:.1f} ms, 2,048 tokens checked "
                  f"{(t3 - t2) * 1e3:.1f} ms")
    finally:
        verifier.close()


if __name__ == "__main__":
    main()
