"""The concurrency benchmark's certification, on the embedded model: what a lossless run
writes passes, answers that leave plain decoding where it is sure fail at that token."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from suffixd.benchkit.certify import TokenCertifier
from suffixd.benchkit.concurrency import PlannedTurn
from suffixd.daemon.generation.certify import noisy_drafts
from suffixd.daemon.generation.verifier import GenerateParams, Verifier
from suffixd.daemon.model import embedded_model_path

from tests.conftest import THREADS

MAX_TOKENS = 24


@pytest.fixture(scope="module")
def verifier() -> Iterator[Verifier]:
    v = Verifier(embedded_model_path(), n_ctx=2048, n_threads=THREADS, n_slots=2)
    yield v
    v.close()


def _turns(v: Verifier) -> list[PlannedTurn]:
    texts = ["<start_of_turn>user\nList the tables of a school database.<end_of_turn>\n"
             "<start_of_turn>model\n",
             "<start_of_turn>user\nWrite SQL: count the singers.<end_of_turn>\n"
             "<start_of_turn>model\n"]
    return [PlannedTurn(i, [], v.tokenize(t, add_bos=True, special=True))
            for i, t in enumerate(texts)]


def test_drafted_answers_pass_and_answers_leaving_plain_decoding_fail(verifier: Verifier) -> None:
    turns = _turns(verifier)
    plain = []
    for t in turns:
        toks: list[int] = []
        for c in verifier.generate("ref", t.prompt, GenerateParams(max_tokens=MAX_TOKENS)):
            toks += c.tokens
        verifier.forget("ref")
        plain.append(toks)
    # a speculative run with drafts that are often wrong: lossless, so never diverged
    drafted = []
    for t, ref in zip(turns, plain, strict=True):
        propose = noisy_drafts(ref, len(t.prompt), len(ref))
        toks = []
        for c in verifier.generate("drafted", t.prompt, GenerateParams(max_tokens=MAX_TOKENS),
                                   propose):
            toks += c.tokens
        verifier.forget("drafted")
        drafted.append(toks)
    k = 5
    far = [verifier.tokenize("\u2603\u2603\u2603")[0]]  # plain rates it far below its best
    answers = {
        1: {("s", t.index): d for t, d in zip(turns, drafted, strict=True)},
        2: {("s", t.index): p[:k] + far for t, p in zip(turns, plain, strict=True)},
        # it stopped where plain decoding is sure to go on
        3: {("s", turns[0].index): plain[0][:k]},
    }
    c = TokenCertifier(embedded_model_path(), 2048, MAX_TOKENS, 2)
    got = c.verdicts([("s", turns)], answers)
    assert got["1"]["diverged"] == 0 and got["1"]["identical"] + got["1"]["near_tie"] == 2
    assert got["2"]["diverged"] == 2
    assert [d[:3] for d in got["2"]["diverged_at"]] == [["s", 0, k], ["s", 1, k]]
    assert [d[:3] for d in got["3"]["diverged_at"]] == [["s", 0, k]]
    # the references are made once: a second call decodes nothing again
    made = {key: id(v) for key, v in c.references.items()}
    assert c.verdicts([("s", turns)], {1: answers[1]})["1"] == got["1"]
    assert {key: id(v) for key, v in c.references.items()} == made
