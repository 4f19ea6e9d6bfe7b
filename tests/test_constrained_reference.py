"""Constrained output through the endpoint against llama.cpp's own constrained decoding.

For each (prompt, schema): the daemon's greedy answer to ``response_format`` through
``/v1/completions`` (its converter, its verifier, drafts or not) must equal what
llama-cpp-python's ``Llama`` decodes greedily from the same prompt tokens under the grammar
llama.cpp's converter writes for that schema (``tests/fixtures/grammars/reference.json``,
made by llama.cpp itself): the test is against the reference, not against ourselves.

Greedy decoding is deterministic, but the two sides decode in different batch shapes (the
daemon verifies drafts in batches, ``Llama`` one token at a time), and llama.cpp's CPU
kernels round differently per shape: where the two texts part, the token that parts them
must be a near-tie in the reference's own logits (``NEAR_TIE``), which is then reported.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.conftest import THREADS

FIXTURES = Path(__file__).parent / "fixtures" / "grammars"
SCHEMAS: dict[str, Any] = json.loads((FIXTURES / "schemas.json").read_text())
REFERENCE: dict[str, dict[str, str]] = json.loads((FIXTURES / "reference.json").read_text())

# prompts of our own, in the gemma-3 chat layout the embedded model was tuned on
CASES = [
    ("object_any", "Describe the singer table of a music database as a JSON object."),
    ("sql_answer", "Write the SQL that counts the singers, and the tables it reads."),
    ("nested", "Give a user named Ada, aged 36, with two tags."),
    ("optional_props", "Return a small JSON record about the number 7."),
    ("enum_const", "Pick the kind of database object a singer list is."),
    ("root_array", "List three questions about concerts."),
]
MAX_TOKENS = 40


def _prompt(text: str) -> str:
    return f"<start_of_turn>user\n{text}<end_of_turn>\n<start_of_turn>model\n"


@pytest.fixture(scope="module")
def reference() -> Iterator[Any]:
    from llama_cpp import Llama
    from suffixd.daemon.model import embedded_model_path

    llm = Llama(model_path=str(embedded_model_path()), n_ctx=512, n_batch=512,
                n_threads=THREADS, logits_all=True, verbose=False, seed=0)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tests.conftest import DaemonProcess

    proc = DaemonProcess(tmp_path_factory.mktemp("constrained") / "data",
                         ["--http", "127.0.0.1:0"]).start()
    yield proc
    proc.stop()


def _reference_tokens(llm: Any, prompt: list[int], gbnf: str) -> tuple[list[int], list[Any]]:
    """Greedy constrained decoding by llama.cpp (llama-cpp-python), with each step's
    raw logits for the near-tie check."""
    from llama_cpp import LlamaGrammar

    grammar = LlamaGrammar.from_string(gbnf, verbose=False)
    llm.reset()
    out: list[int] = []
    rows: list[Any] = []
    for tok in llm.generate(prompt, temp=0.0, top_k=1, grammar=grammar, reset=True):
        rows.append(np.array(llm.scores[llm.n_tokens - 1], copy=True))
        if llm.token_eos() == tok or tok in _eog(llm):
            break
        out.append(tok)
        if len(out) >= MAX_TOKENS:
            break
    return out, rows


def _eog(llm: Any) -> set[int]:
    from llama_cpp import llama_cpp as ll

    vocab = ll.llama_model_get_vocab(llm.model)
    return {t for t in range(llm.n_vocab()) if ll.llama_vocab_is_eog(vocab, t)} \
        if not hasattr(_eog, "cache") else _eog.cache  # type: ignore[attr-defined]


def _daemon_answer(daemon: Any, prompt: list[int], schema: Any, ns: str) -> dict[str, Any]:
    fmt = {"type": "json_object"} if schema == {"type": "object"} else \
        {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    r = httpx.post(f"{daemon.http}/completions", timeout=300, headers={
        "X-Suffixd-Namespace": ns}, json={
        "model": "default", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
        "response_format": fmt})
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def _parting(pieces: list[bytes], want: list[int], rows: list[Any],
             got: bytes) -> tuple[int, float] | None:
    """Where the daemon's text ``got`` leaves the reference's tokens ``want``: the step,
    and the gap in the reference's logits there between its token and the best-scored
    token that starts the daemon's remaining text. None if ``got`` is ``want``'s text."""
    done = b""
    for k, tok in enumerate(want):
        piece = pieces[tok]
        if got.startswith(done + piece):
            done += piece
            continue
        rest = got[len(done):]
        row = rows[k]
        rivals = [t for t, p in enumerate(pieces) if p and rest.startswith(p)]
        if not rivals:
            return k, float("inf")
        rival = max(rivals, key=lambda t: float(row[t]))
        return k, float(row[tok] - row[rival])
    return None if got == done else (len(want), float("inf"))


@pytest.mark.slow
def test_constrained_greedy_equals_llama_cpp(reference: Any, daemon: Any) -> None:
    from suffixd.daemon.generation.certify import NEAR_TIE_GAP

    _eog.cache = _eog(reference)  # type: ignore[attr-defined]
    pieces = [reference.detokenize([t], special=False) for t in range(reference.n_vocab())]
    report: list[str] = []
    equal = 0
    for name, question in CASES:
        prompt = reference.tokenize(_prompt(question).encode(), add_bos=True, special=True)
        want, rows = _reference_tokens(reference, prompt, REFERENCE[name]["grammar"])
        for attempt in ("plain", "drafted"):
            # the second request is drafted from the first (its answer is in the tree)
            body = _daemon_answer(daemon, prompt, SCHEMAS[name], f"ref-{name}")
            if attempt == "drafted":
                assert body["suffixd"]["accepted"] > 0, f"{name}: the repeat was not drafted"
            got = body["choices"][0]["text"].encode()
            parted = _parting(pieces, want, rows, got)
            if parted is None:
                equal += attempt == "plain"
                report.append(f"{name} {attempt}: equal")
                continue
            step, gap = parted
            assert gap < NEAR_TIE_GAP, (
                f"{name} {attempt}: the daemon wrote {got!r}, llama.cpp "
                f"{reference.detokenize(want)!r}: parted at step {step}, not a near-tie "
                f"(gap {gap:.3f})")
            report.append(f"{name} {attempt}: parted at step {step}, a near-tie (gap {gap:.3f})")
    print("\n".join(report))
    # near-ties are rare: most answers are llama.cpp's exactly
    assert equal >= len(CASES) - 2, report
