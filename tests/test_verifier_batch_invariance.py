"""A drafted step's logits must not depend on how the verifier batched the positions
before it: the KV cache a 32-token verification leaves must serve later steps exactly as
the one a prompt chunk leaves. With llama.cpp's CPU flash attention (0.3.36) it did not:
on this fixture, a conversation as the verifier held it when a drafted spider_dev turn
parted from plain decoding, the last of 32 batched rows left a K/V row that later turned
a logit of 12.4 into 20.7 (the verifier now runs without flash attention)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from suffixd.daemon.model import embedded_model_path
from suffixd.daemon.verifier import Verifier

FIXTURE = Path(__file__).parent / "fixtures" / "batching_history.json"


@pytest.fixture(scope="module")
def case() -> dict:
    return json.loads(FIXTURE.read_text())


@pytest.fixture(scope="module")
def verifier(case: dict) -> Verifier:
    v = Verifier(embedded_model_path(), n_ctx=len(case["history"]) + 64, n_slots=1)
    yield v
    v.close()


def _step_rows(v: Verifier, history: list[int], split: list[int], batch: list[int],
               outputs: int) -> np.ndarray:
    """The logits of a drafted step after ``history`` was evaluated in ``split`` batches."""
    assert sum(split) == len(history)
    v._llama_cpp.llama_memory_seq_rm(v._mem, 0, -1, -1)
    pos = 0
    for n in split:
        v._decode(0, history[pos : pos + n], pos, all_logits=False)
        pos += n
    v._decode(0, batch, pos, all_logits=True, outputs=outputs)
    return np.stack([v._logits(i) for i in range(outputs)])


def test_a_steps_logits_do_not_depend_on_how_earlier_positions_were_batched(
    verifier: Verifier, case: dict
) -> None:
    history, batch, outputs = case["history"], case["batch"], case["outputs"]
    chunks = [512] * (len(history) // 512)
    rest = len(history) % 512
    # the prompt's chunking, then what a drafting run did: a 32-token verification
    # last, or 40 (both under 64 rows: the kernel path that went wrong)
    ref = _step_rows(verifier, history, [*chunks, rest], batch, outputs)
    for last in (32, 40):
        got = _step_rows(verifier, history, [*chunks, rest - last, last], batch, outputs)
        for row in range(outputs):
            assert int(np.argmax(got[row])) == int(np.argmax(ref[row])), (last, row)
            top = int(np.argmax(ref[row]))
            # batch numerics move logits by hundredths; the fault moved one by 8
            assert abs(float(got[row][top]) - float(ref[row][top])) < 0.5, (last, row)
