"""Constrained decoding: a GBNF grammar (llama.cpp's) over one model's vocabulary.

``Grammar(verifier, gbnf)`` compiles the grammar with llama.cpp's own grammar sampler
(``llama_sampler_init_grammar``), so the language it accepts is exactly llama-server's
for the same grammar; a JSON schema becomes GBNF as llama-server builds it
(``schema_grammar.py``: llama.cpp's converter's semantics, within ``GrammarLimits``).

A ``GrammarState`` is the grammar after some generated tokens: ``allows(token)`` (one
candidate checked, microseconds), ``best_allowed(scores)`` (the best-scored allowed token,
checking the best candidates first), ``mask(logits)`` (every token checked: about 0.1 s
on a 262k vocabulary), ``accept(token)`` and ``copy()``. The verifier keeps one state per drafted
position, so a draft token the grammar forbids ends the draft before it is verified, and
each row is judged against the constrained target (see ``constrained_argmax`` and
``generation_run.verdict``).

llama.cpp aborts the process when a token its grammar rejects is accepted, so ``accept``
refuses such a token itself (``GrammarError``) instead of handing it over.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from typing import Any

import numpy as np

from .schema_grammar import (
    DEFAULT_LIMITS,
    GrammarError,
    GrammarLimits,
    SchemaLimitError,
    schema_to_gbnf,
)

# llama_token_data {id: int32, logit: float, p: float}, as numpy sees an array of them.
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


__all__ = ["GrammarError", "SchemaLimitError", "GrammarLimits", "grammar_for_schema",
           "json_grammar", "Grammar", "GrammarState", "constrained_argmax"]


def grammar_for_schema(schema: Mapping[str, Any],
                       limits: GrammarLimits = DEFAULT_LIMITS) -> str:
    """GBNF for the JSON texts that validate against ``schema`` (a JSON-schema object),
    as llama-server builds it; ``SchemaLimitError`` past ``limits``."""
    return schema_to_gbnf(schema, limits)


def json_grammar() -> str:
    """Any JSON object (``response_format: json_object``)."""
    return grammar_for_schema({"type": "object"})


class Grammar:
    """A compiled grammar; ``start()`` gives its initial state. Compiling is cheap (the
    GBNF is parsed once per state chain), so one per request is fine."""

    def __init__(self, verifier: Any, gbnf: str, root: str = "root") -> None:
        import llama_cpp

        self._ll = llama_cpp
        self.gbnf = gbnf
        self.root = root
        self._is_eog = verifier.is_eog
        self.vocab_size = int(verifier.vocab_size)
        # Parsed once: llama.cpp logs a parse error and returns NULL rather than raising.
        smpl = llama_cpp.llama_sampler_init_grammar(
            verifier._vocab, gbnf.encode("utf-8"), root.encode("utf-8"))
        if not smpl:
            raise GrammarError("the grammar does not parse (llama.cpp's GBNF)")
        self._initial = GrammarState(self, smpl)

    def start(self) -> GrammarState:
        return self._initial.copy()


class GrammarState:
    """The grammar after the tokens accepted so far. Not thread-safe: one per generation."""

    __slots__ = ("grammar", "_smpl", "_one", "_one_arr", "_done")

    def __init__(self, grammar: Grammar, smpl: Any) -> None:
        ll = grammar._ll
        self.grammar = grammar
        self._smpl = smpl
        self._one = (ll.llama_token_data * 1)()
        self._one_arr = ll.llama_token_data_array(
            data=self._one, size=1, selected=-1, sorted=False)
        self._done = False  # an end-of-generation token was allowed and taken

    def __del__(self) -> None:
        smpl, self._smpl = getattr(self, "_smpl", None), None
        if smpl:
            self.grammar._ll.llama_sampler_free(smpl)

    def copy(self) -> GrammarState:
        other = GrammarState(self.grammar, self.grammar._ll.llama_sampler_clone(self._smpl))
        other._done = self._done
        return other

    def allows(self, token: int) -> bool:
        if self._done:
            return False
        self._one[0].id = token
        self._one[0].logit = 0.0
        self._one[0].p = 0.0
        self._one_arr.size = 1
        self._one_arr.selected = -1
        self.grammar._ll.llama_sampler_apply(self._smpl, ctypes.byref(self._one_arr))
        return bool(self._one[0].logit != -np.inf)

    def allowed(self, ids: np.ndarray) -> np.ndarray:
        """Which of the tokens ``ids`` the grammar allows here (one pass over them)."""
        n = len(ids)
        data = np.zeros(n, dtype=_TOKEN_DATA)
        data["id"] = ids
        if self._done or not n:
            return np.zeros(n, dtype=bool)
        ll = self.grammar._ll
        arr = ll.llama_token_data_array(
            data=data.ctypes.data_as(ctypes.POINTER(ll.llama_token_data)),
            size=n, selected=-1, sorted=False)
        ll.llama_sampler_apply(self._smpl, ctypes.byref(arr))
        # the sampler only writes -inf over the rejected ones, in place
        return np.asarray(data["logit"][:n] != -np.inf)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """``logits`` with every token the grammar forbids here set to -inf (a copy). Every
        token is checked: about 0.1 s on a 262k vocabulary, so only where nothing less
        will do (top-k/top-p sampling, benchmarks' gap records)."""
        n = self.grammar.vocab_size
        ok = self.allowed(np.arange(n, dtype=np.int32))
        return np.where(ok, logits[:n], np.float32(-np.inf)).astype(np.float32)

    def best_allowed(self, scores: np.ndarray) -> int:
        """The allowed token with the highest score (argmax of the masked scores), found by
        checking the best-scored tokens first (64, then 2,048 of them) and the whole
        vocabulary only when none of those is allowed. Exact: every token left unchecked
        scores below the allowed one found. -1 when nothing is allowed."""
        n = len(scores)
        for k in (64, 2048):
            if k >= n:
                break
            idx = np.argpartition(-scores, k)[:k]
            # descending score; ties by token id, as np.argmax over the masked row
            idx = idx[np.lexsort((idx, -scores[idx]))]
            ok = self.allowed(idx.astype(np.int32))
            if ok.any():
                return int(idx[int(np.argmax(ok))])
        ok = self.allowed(np.arange(n, dtype=np.int32))
        if not ok.any():
            return -1
        return int(np.argmax(np.where(ok, scores, -np.inf)))

    def accept(self, token: int) -> None:
        if not self.allows(token):
            raise GrammarError(f"token {token} is not allowed by the grammar here")
        if self.grammar._is_eog(token):
            # llama.cpp takes an end-of-generation token only where the grammar is
            # complete; nothing may follow it.
            self._done = True
            return
        self.grammar._ll.llama_sampler_accept(self._smpl, token)


def constrained_argmax(row: np.ndarray, state: GrammarState) -> int:
    """The greedy choice of the constrained target: the raw argmax when the grammar
    allows it (the usual case: one candidate checked), else the best allowed token."""
    best = int(np.argmax(row))
    if state.allows(best):
        return best
    return state.best_allowed(row)
