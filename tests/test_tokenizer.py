"""The daemon's tokenizer (the embedded model's vocabulary)."""

from __future__ import annotations

import random
import time

import pytest
from suffixd.daemon.model import Tokenizer, embedded_model_path


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer(embedded_model_path())


def test_detokenize_round_trips_and_keeps_long_pieces(tok: Tokenizer) -> None:
    text = "SELECT name FROM singer WHERE age > 30 -- ünïcödé, 日本語"
    assert tok.detokenize(tok.tokenize(text)) == text
    assert tok.detokenize([tok._bos, *tok.tokenize(text)]) == text  # BOS adds no space
    # pieces longer than 32 bytes (llama-cpp-python's own detokenize drops them)
    long_piece = max(range(tok.vocab_size), key=lambda t: len(tok._piece(t)))
    assert len(tok._piece(long_piece)) > 32
    assert tok.detokenize([long_piece]).encode() == tok._piece(long_piece)


def test_detokenize_is_linear(tok: Tokenizer) -> None:
    rng = random.Random(7)
    ids = [rng.randrange(tok.vocab_size) for _ in range(1_000_000)]
    tok.detokenize(ids)  # every piece looked up once

    def seconds(n: int) -> float:
        t0 = time.process_time()
        tok.detokenize(ids[:n])
        return time.process_time() - t0

    small, big = min(seconds(100_000) for _ in range(3)), min(seconds(1_000_000) for _ in range(2))
    assert big < 1.0  # ~0.3 s of CPU here; the quadratic version took 38 s
    assert big < 25 * max(small, 1e-3)  # 10x the ids, ~10x the time (quadratic: ~100x)


def test_extra_weight_buffers_follow_the_build_and_the_override(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """llama.cpp's AMX matmul crashed the verifier on AMX machines: its extra weight buffers
    are off exactly when the installed build has AMX, unless the operator says otherwise."""
    import llama_cpp
    from suffixd.daemon.model import extra_weight_buffers

    has_amx = "AMX_INT8 = 1" in llama_cpp.llama_print_system_info().decode()
    monkeypatch.delenv("SUFFIXD_LLAMA_EXTRA_BUFFERS", raising=False)
    assert extra_weight_buffers() is (not has_amx)
    monkeypatch.setenv("SUFFIXD_LLAMA_EXTRA_BUFFERS", "on")
    assert extra_weight_buffers() is True
    monkeypatch.setenv("SUFFIXD_LLAMA_EXTRA_BUFFERS", "off")
    assert extra_weight_buffers() is False


def test_flash_attention_only_when_asked_and_only_on_the_build_that_sums_in_f32(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """Stock llama.cpp's CPU flash attention sums in F16 and parts drafted output from plain
    decoding: the verifier runs it only when the operator asks and only on
    scripts/install_llama_cpp.sh's build; asked on a stock build, it says why not."""
    import llama_cpp
    from suffixd.daemon.model import flash_attention_sums_f32, flash_attention_wanted

    monkeypatch.delenv("SUFFIXD_FLASH_ATTN", raising=False)
    for build in ("0.3.36+suffixd.fa32", "0.3.36+suffixd.2", "0.3.36+suffixd.3"):
        monkeypatch.setattr(llama_cpp, "__version__", build)
        assert flash_attention_sums_f32() is True
    assert flash_attention_wanted() is False  # off unless asked
    monkeypatch.setenv("SUFFIXD_FLASH_ATTN", "on")
    assert flash_attention_wanted() is True
    monkeypatch.setattr(llama_cpp, "__version__", "0.3.36")
    assert flash_attention_sums_f32() is False
    with caplog.at_level("WARNING"):
        assert flash_attention_wanted() is False
    assert "install_llama_cpp.sh" in caplog.text


def test_llama_defaults_reach_llama_cpp_llama(monkeypatch: pytest.MonkeyPatch) -> None:
    """llama_cpp.Llama has no use_extra_bufts argument (unknown keywords are ignored):
    llama_defaults sets it through the defaults Llama reads, and restores them."""
    import llama_cpp.llama_cpp as low
    from suffixd.daemon.model import llama_defaults

    original = low.llama_model_default_params
    for choice, want in (("off", False), ("on", True)):
        monkeypatch.setenv("SUFFIXD_LLAMA_EXTRA_BUFFERS", choice)
        with llama_defaults():
            assert low.llama_model_default_params().use_extra_bufts is want
        assert low.llama_model_default_params is original
