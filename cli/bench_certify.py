"""Certifying the concurrency benchmark's texts against plain decoding.

``suffixd bench agent --concurrency`` sees suffixd's outputs as the endpoint returns them:
text. After every level's servers are stopped (nothing here is timed), ``TextCertifier``
decodes each planned turn plainly (one token a step, no drafts, gaps recorded; once per
benchmark, however many runs and levels) and judges every level's text of that turn with
``certify_text``: identical, parted at a near-tie, or diverged. A diverged turn is a
losslessness bug of the served path (shared steps, drafts, padding), which comparing texts
between levels (``greedy_same``) cannot tell from batch-shape rounding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from ..daemon.generation.certify import TokenGap, certify_text

Key = tuple[str, int]  # (session, turn index)


class Turn(Protocol):
    @property
    def index(self) -> int: ...
    @property
    def prompt(self) -> list[int]: ...


class TextCertifier:
    """Plain decoding's gap records of a benchmark's turns, and the verdicts they give."""

    def __init__(self, model_path: Path, n_ctx: int, max_tokens: int, threads: int) -> None:
        self.model_path = model_path
        self.n_ctx = n_ctx
        self.max_tokens = max_tokens
        self.threads = threads
        self.references: dict[Key, list[TokenGap]] = {}
        self._pieces: dict[int, bytes] = {}
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
        v = Verifier(self.model_path, n_ctx=self.n_ctx or 1 << 30, n_slots=1,
                     n_threads=self.threads)
        try:
            params = GenerateParams(max_tokens=self.max_tokens, record_gaps=True)
            for session, turns in todo:
                for t in turns:
                    gaps: list[TokenGap] = []
                    for chunk in v.generate(session, t.prompt, params, None):
                        gaps += chunk.gaps
                    self.references[(session, t.index)] = gaps
                v.forget(session)
            # the bytes of every token a verdict can ask about
            for gaps in self.references.values():
                for g in gaps:
                    for tok in [g.token, *(t for t, _ in g.top)]:
                        if tok not in self._pieces:
                            self._pieces[tok] = v.token_bytes(tok)
                            if v.is_eog(tok):
                                self._eog.add(tok)
        finally:
            v.close()

    def _parting(self, reference: list[TokenGap], text: str, at: int) -> dict[str, Any]:
        """Where a diverged text left plain decoding: what both wrote from there, and how
        sure plain decoding was (for finding the bug)."""
        def spell(gaps: Sequence[TokenGap]) -> bytes:
            return b"".join(self._pieces[g.token] for g in gaps if g.token not in self._eog)

        before = spell(reference[:at])
        g = reference[at] if at < len(reference) else None
        return {"before": before[-80:].decode("utf-8", errors="replace"),
                "plain": spell(reference[at:at + 8]).decode("utf-8", errors="replace"),
                "served": text.encode("utf-8")[len(before):len(before) + 40]
                .decode("utf-8", errors="replace"),
                "plain_gap": round(g.gap, 3) if g is not None else None}

    def verdicts(self, plan: Sequence[tuple[str, Sequence[Turn]]],
                 texts: Mapping[int, Mapping[Key, str]]) -> dict[str, dict[str, Any]]:
        """Per level: how many of its turns are identical to plain decoding, parted from
        it at a near-tie, or diverged; and where the diverged ones parted."""
        self._reference(plan)
        out: dict[str, dict[str, Any]] = {}
        for n, by_turn in texts.items():
            counts: dict[str, Any] = {"identical": 0, "near_tie": 0, "diverged": 0,
                                      "diverged_at": []}
            for key, text in by_turn.items():
                verdict, where = certify_text(self.references[key], text,
                                              self._pieces.__getitem__, self._eog.__contains__)
                counts[verdict] += 1
                if verdict == "diverged":
                    counts["diverged_at"].append([key[0], key[1], where])
                    counts.setdefault("diverged_texts", []).append(
                        self._parting(self.references[key], text, where or 0))
            out[str(n)] = counts
        return out
