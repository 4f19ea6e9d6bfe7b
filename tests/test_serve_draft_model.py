"""`suffixd serve --draft-model`: the draft model's vocabulary is checked when the daemon starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from suffixd.daemon.model import embedded_model_path


def test_draft_model_with_the_targets_vocabulary_is_accepted(daemon_factory: Any) -> None:
    proc = daemon_factory(args=["--draft-model", str(embedded_model_path())])
    client = proc.client()
    assert client.info()["vocab_size"] > 0
    client.close()


def test_unloadable_draft_model_is_refused_clearly(daemon_factory: Any, tmp_path: Path) -> None:
    bogus = tmp_path / "not-a-model.gguf"
    bogus.write_bytes(b"this is not a GGUF file")
    proc = daemon_factory(args=["--draft-model", str(bogus)], expect_ready=False)
    assert proc.wait(120) == 2
    log = proc.log()
    assert "cannot load the draft model" in log
    assert "Traceback" not in log
