"""Hardening, second round (issue 27): a refused request changes nothing, a durable
stream step that fails to commit leaves its session as it was, bad JSON is a 400, a
client that hangs up stops its generation, files written at start are owner-only, a
second daemon refuses before it opens the store. Through the real daemon."""

from __future__ import annotations

import json
from typing import Any

import httpx


def _post(base: str, path: str, body: Any, raw: bytes | None = None,
          headers: dict[str, str] | None = None, timeout: float = 120) -> httpx.Response:
    content = raw if raw is not None else json.dumps(body).encode()
    return httpx.post(base + path, content=content, timeout=timeout,
                      headers={"Content-Type": "application/json", **(headers or {})})


# --------------------------------------------------------------------------- JSON


def test_deep_or_broken_json_is_a_400_not_a_500(daemon_factory: Any) -> None:
    proc = daemon_factory(args=["--http", "127.0.0.1:0"])
    base = proc.http.removesuffix("/v1")
    deep = b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    cases = [
        (deep, "json_too_deep"),  # the decoder's recursion limit
        (json.dumps({"messages": [{"role": "user", "content": "x"}],
                     "metadata": json.loads("[" * 200 + "]" * 200)}).encode(),
         "json_too_deep"),  # parses, but deeper than the front reads
        (b'{"messages": [', "invalid_json"),
        (b"\xff\xfe{}", "invalid_json"),
    ]
    for raw, code in cases:
        for path in ("/v1/chat/completions", "/v1/completions"):
            r = _post(base, path, None, raw=raw)
            assert r.status_code == 400, (raw[:40], r.text)
            err = r.json()["error"]
            assert err["code"] == code and err["type"] == "invalid_request_error", err
            assert "JSON" in err["message"], err
    assert "Traceback" not in proc.log() and "RecursionError" not in proc.log()
