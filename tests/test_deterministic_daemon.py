"""``suffixd serve --deterministic`` end to end: the generator's status (and ``suffixd
stats``) says the mode is on, and a greedy answer is the same token for token however
much of it was drafted and whether another generation shares the verifier's steps
(tests/test_deterministic.py compares against plain decoding, logits included, on a
verifier of its own)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DaemonProcess

PROMPT = ("<start_of_turn>user\nWrite the SQL that lists every singer older than 30."
          "<end_of_turn>\n<start_of_turn>model\n")
OTHER = ("<start_of_turn>user\nName three tables a concert database needs."
         "<end_of_turn>\n<start_of_turn>model\n")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    data: Path = tmp_path_factory.mktemp("deterministic") / "data"
    proc = DaemonProcess(data, ["--deterministic", "--threads", "1"]).start()
    yield proc
    proc.stop()


def _answer(client: Any, prompt: str = PROMPT) -> tuple[list[int], int]:
    """The greedy answer's tokens, and how many of them were accepted draft tokens."""
    toks: list[int] = []
    accepted = 0
    for c in client.generate(None, prompt=prompt, max_tokens=24, ignore_eos=True,
                             namespace="det", timeout=600):
        toks += c.token_ids
        accepted += c.accepted
    return toks, accepted


def test_the_status_says_deterministic_and_answers_do_not_depend_on_drafts_or_load(
        daemon: DaemonProcess) -> None:
    from suffixd.cli.stats import _generator_lines

    with daemon.client() as client:
        first, drafted_first = _answer(client)  # drafted from the prompt, if at all
        again, drafted_again = _answer(client)  # drafted from the first answer too
        assert drafted_again > drafted_first
        assert again == first
        # and while another generation shares the verifier's steps
        other: list[Any] = []
        t = threading.Thread(target=lambda: other.append(_answer(client, OTHER)))
        t.start()
        loaded, _ = _answer(client)
        t.join(600)
        assert other and loaded == first
        status = client.generator_status()
    assert status["determinism"]["on"] is True, status["determinism"]
    assert status["batching"]["deterministic"] is True
    assert status["batching"]["max_sequences"] >= 2
    lines = "\n".join(_generator_lines(status))
    assert "deterministic: on" in lines, lines
