"""A continuing conversation's prompt goes in as one chunk while another generation
steps, even where a checkpoint hint falls just past what its KV slot held (real model):
the split cost every agent an extra step (BENCHMARKS.md, many agents at once)."""

from __future__ import annotations

import threading

import pytest
from suffixd.daemon.generation.verifier import CHECKPOINT_SPLIT_MIN, GenerateParams, Verifier
from suffixd.daemon.model import embedded_model_path

from tests.conftest import THREADS


@pytest.fixture(scope="module")
def verifier() -> Verifier:
    v = Verifier(embedded_model_path(), n_threads=THREADS, n_ctx=2048, n_slots=2)
    yield v
    v.close()


def _prompt_chunks(v: Verifier) -> list[tuple[int, int]]:
    """Start recording the prompt chunks handed to the batcher: (sequence, rows)."""
    seen: list[tuple[int, int]] = []
    step = v._steps.step

    def recording(req, request=None):  # type: ignore[no-untyped-def]
        if req.prompt:
            seen.append((req.seq_id, len(req.tokens)))
        return step(req, request)

    v._steps.step = recording  # type: ignore[method-assign]
    return seen


def test_a_continuing_prompt_is_not_split_at_a_near_checkpoint_while_others_step(
        verifier: Verifier) -> None:
    v = verifier
    first = v.tokenize("You write SQL for a sales database. " * 12, add_bos=True)
    assert len(first) > v.prompt_cache.min_tokens
    said = [t for c in v.generate("b", first, GenerateParams(max_tokens=8)) for t in c.tokens]
    other_started, other_done = threading.Event(), threading.Event()

    def other() -> None:
        for _ in v.generate("a", v.tokenize("Count the orders.", add_bos=True),
                            GenerateParams(max_tokens=300, ignore_eos=True)):
            other_started.set()
        other_done.set()

    t = threading.Thread(target=other)
    t.start()
    try:
        assert other_started.wait(120)
        chunks = _prompt_chunks(v)
        held = len(first) + len(said)
        second = first + said + v.tokenize(" Now the total per region, please.")
        hint = held + 2  # a checkpoint hint just past what the slot held
        assert hint - held < CHECKPOINT_SPLIT_MIN
        out = list(v.generate("b", second, GenerateParams(max_tokens=4), cache_points=[hint]))
        assert out and out[-1].finish_reason is not None
        shared = not other_done.is_set()
    finally:
        t.join(300)
    assert shared, "the other generation ended before this prompt went in"
    assert len(chunks) == 1, chunks  # before: up to the hint, then the rest
    assert chunks[0][1] >= len(second) - held - 1  # the whole new part at once
