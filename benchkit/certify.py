"""Certifying the concurrency benchmark's answers against plain decoding.

``suffixd bench agent --concurrency`` sees suffixd's answers as the endpoint returns them
(its ``token_ids``, asked with ``return_token_ids``). After every level's servers are
stopped (nothing here is timed), ``TokenCertifier`` decodes each planned turn plainly (one
token a step, no drafts, gaps recorded; once per benchmark, however many runs and levels)
and judges every level's tokens of that turn with ``certify_tokens``: identical, parted at
a near-tie, or diverged. A diverged turn is a losslessness bug of the served path (shared
steps, drafts, padding), which comparing texts between levels (``greedy_same``) cannot
tell from batch-shape rounding.

With ``deterministic`` (``bench agent --deterministic``: the daemons serve in deterministic
mode), the plain decoding runs in deterministic mode too (no repacked weights,
``GGML_CPU_TILED_MM=0``, no one-row ubatch): every row then has the logits the daemons
computed, bit for bit, so every answer should be identical (a near-tie is a parting the
mode promises not to make). Its start-up check must hold in this process (ggml reads
``GGML_CPU_TILED_MM`` at the process's first matrix product), else the certification
stops with why.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from ..daemon.generation.certify import TokenGap, certify_tokens

Key = tuple[str, int]  # (session, turn index)


class Turn(Protocol):
    @property
    def index(self) -> int: ...
    @property
    def prompt(self) -> list[int]: ...


class TokenCertifier:
    """Plain decoding's gap records of a benchmark's turns, and the verdicts they give."""

    def __init__(self, model_path: Path, n_ctx: int, max_tokens: int, threads: int,
                 deterministic: bool = False) -> None:
        self.model_path = model_path
        self.n_ctx = n_ctx
        self.max_tokens = max_tokens
        self.threads = threads
        self.deterministic = deterministic
        self.references: dict[Key, list[TokenGap]] = {}
        self._eog: set[int] = set()

    def _reference(self, plan: Sequence[tuple[str, Sequence[Turn]]]) -> None:
        """Decode every turn not yet decoded plainly, a session's turns in order on one
        KV slot (as the benchmark sends them)."""
        todo = [(s, [t for t in turns if (s, t.index) not in self.references])
                for s, turns in plan]
        if not any(turns for _, turns in todo):
            return
        from ..daemon.generation.verifier import GenerateParams, Verifier

        # n_ctx 0: the model's trained length (the Verifier caps what it is given)
        tiled = os.environ.get("GGML_CPU_TILED_MM")
        try:
            v = Verifier(self.model_path, n_ctx=self.n_ctx or 1 << 30, n_slots=1,
                         n_threads=self.threads, deterministic=self.deterministic)
        finally:
            # deterministic mode sets it for this process's llama.cpp (read once, by now);
            # the servers a later run starts (llama-server) keep their own kernels
            if tiled is None:
                os.environ.pop("GGML_CPU_TILED_MM", None)
            else:
                os.environ["GGML_CPU_TILED_MM"] = tiled
        if self.deterministic and not v.deterministic:
            why = v.determinism.get("why", "")
            v.close()
            raise RuntimeError(f"certification in deterministic mode: {why}")
        try:
            params = GenerateParams(max_tokens=self.max_tokens, record_gaps=True)
            for session, turns in todo:
                for t in turns:
                    gaps: list[TokenGap] = []
                    for chunk in v.generate(session, t.prompt, params, None):
                        gaps += chunk.gaps
                    self.references[(session, t.index)] = gaps
                v.forget(session)
            self._eog |= {tok for gaps in self.references.values() for g in gaps
                          for tok, _ in g.top if v.is_eog(tok)}
        finally:
            v.close()

    def verdicts(self, plan: Sequence[tuple[str, Sequence[Turn]]],
                 answers: Mapping[int, Mapping[Key, Sequence[int]]]
                 ) -> dict[str, dict[str, Any]]:
        """Per level: how many of its turns are identical to plain decoding, parted from
        it at a near-tie, or diverged; and where the diverged ones parted (session, turn,
        token, plain decoding's top-1/top-2 gap there)."""
        self._reference(plan)
        out: dict[str, dict[str, Any]] = {}
        for n, by_turn in answers.items():
            counts: dict[str, Any] = {"identical": 0, "near_tie": 0, "diverged": 0,
                                      "diverged_at": []}
            for key, tokens in by_turn.items():
                ref = self.references[key]
                verdict, at = certify_tokens(ref, tokens, self._eog.__contains__)
                counts[verdict] += 1
                if verdict == "diverged" and at is not None:
                    gap = round(ref[at].gap, 3) if at < len(ref) else None
                    counts["diverged_at"].append([key[0], key[1], at, gap])
            out[str(n)] = counts
        return out
