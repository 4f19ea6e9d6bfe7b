"""llama.cpp's log goes through the process's logger (``suffixd.llama``) at its own level,
never straight to stderr: no warning that means nothing at start (the vocabulary-only
model has no context), no ``state_read_meta`` lines between a command's own output."""

from __future__ import annotations

import logging

import pytest
from suffixd.daemon.generation.verifier import GenerateParams, Verifier
from suffixd.daemon.model import Tokenizer, embedded_model_path, llama_log

from tests.conftest import THREADS


def _records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "suffixd.llama"]


def test_lines_are_whole_and_at_llama_cpp_s_own_level(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="suffixd.llama")
    # ggml's levels: DEBUG 1, INFO 2, WARN 3, ERROR 4; CONT 5 goes on with the last one
    llama_log._receive(3, b"a warning in ")
    llama_log._receive(5, b"two pieces\n")
    llama_log._receive(2, b"loading")
    llama_log._receive(5, b"...")
    llama_log._receive(4, b"an error\nand its second line\n")  # ends the unfinished line
    llama_log._receive(1, b"state_read_meta: cell_count = 12, dest_seq_id = 0\n")
    got = [(r.levelno, r.getMessage()) for r in _records(caplog)]
    assert got == [
        (logging.WARNING, "a warning in two pieces"),
        (logging.DEBUG, "loading..."),
        (logging.ERROR, "an error"),
        (logging.ERROR, "and its second line"),
        (logging.DEBUG, "state_read_meta: cell_count = 12, dest_seq_id = 0"),
    ]


def test_the_tokenizer_loads_without_a_warning(capfd: pytest.CaptureFixture[str],
                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="suffixd.llama")
    tok = Tokenizer(embedded_model_path())
    assert tok.detokenize(tok.tokenize("SELECT name FROM singer")) == "SELECT name FROM singer"
    assert capfd.readouterr().err == ""
    assert not [r for r in _records(caplog) if r.levelno >= logging.WARNING]
    assert not any("n_ctx_train" in r.getMessage() for r in _records(caplog))


def test_a_prompt_cache_restore_logs_at_debug_not_on_stderr(
        capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="suffixd.llama")
    v = Verifier(embedded_model_path(), n_threads=THREADS, n_ctx=1024, n_slots=2)
    try:
        prompt = [v.bos_token, *v.tokenize("SELECT name, country FROM singer WHERE age > 30; "
                                           * 12)]
        params = GenerateParams(max_tokens=2, ignore_eos=True)
        for key in ("first", "second"):  # the second starts from the first's checkpoint
            stats = list(v.generate(key, prompt, params, cache_scope="logs"))[-1].stats
            v.forget(key)
        assert stats is not None and stats.cached_prompt_tokens > 0
    finally:
        v.close()
    err = capfd.readouterr().err
    assert "state_read_meta" not in err and "llama_context" not in err
    restores = [r for r in _records(caplog) if r.getMessage().startswith("state_read_meta")]
    assert restores and all(r.levelno == logging.DEBUG for r in restores)
    assert not [r for r in _records(caplog) if r.levelno >= logging.WARNING]
