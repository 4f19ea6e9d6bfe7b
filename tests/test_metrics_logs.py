"""Structured logs (daemon/common/logs.py): one line per event, key=value or JSON."""

from __future__ import annotations

import io
import json
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from suffixd.daemon.common.logs import _STD as RECORD_ATTRS
from suffixd.daemon.common.logs import configure, event


@pytest.fixture
def restore_logging() -> object:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level, logging.getLogger("suffixd").level)
    yield None
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    logging.getLogger("suffixd").setLevel(saved[2])


def test_key_value_lines(restore_logging: object) -> None:
    buf = io.StringIO()
    configure("INFO", json_lines=False, stream=buf)
    log = logging.getLogger("suffixd.test")
    event(log, "corpus.warm", ns="sql", files=3, path="/a b/c.sql", note="two\nlines")
    log.debug("hidden")
    line = buf.getvalue()
    assert line.count("\n") == 1
    assert " INFO suffixd.test corpus.warm ns=sql files=3 " in line
    assert 'path="/a b/c.sql"' in line and 'note="two\\nlines"' in line


def test_json_lines_and_exceptions(restore_logging: object) -> None:
    buf = io.StringIO()
    configure("debug", json_lines=True, stream=buf)
    log = logging.getLogger("suffixd.test")
    event(log, "x", level=logging.WARNING, n=1, event="clash")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed", extra={"rpc": "WarmFiles"})
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2
    a, b = (json.loads(x) for x in lines)
    assert a["event"] == "x" and a["level"] == "warning" and a["n"] == 1
    assert a["field_event"] == "clash"  # a field never overwrites the record's own keys
    assert b["event"] == "failed" and b["rpc"] == "WarmFiles" and "ValueError: boom" in b["exc"]


def test_configure_is_idempotent_and_rejects_bad_level(restore_logging: object) -> None:
    configure("INFO")
    configure("INFO")
    names = [h.get_name() for h in logging.getLogger().handlers]
    assert names.count("suffixd-structured") == 1
    with pytest.raises(ValueError):
        configure("LOUD")


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.from_regex(r"[a-z][a-z_]{0,8}", fullmatch=True),
                       st.one_of(st.text(), st.integers(), st.floats(allow_nan=False),
                                 st.lists(st.integers(), max_size=3)), max_size=5),
       st.text(min_size=1))
def test_any_fields_stay_one_parseable_line(fields: dict[str, object], name: str) -> None:
    for json_lines in (False, True):
        buf = io.StringIO()
        handler = logging.StreamHandler(buf)
        from suffixd.daemon.common.logs import JsonFormatter, KeyValueFormatter

        handler.setFormatter(JsonFormatter() if json_lines else KeyValueFormatter())
        log = logging.getLogger(f"suffixd.prop{int(json_lines)}")
        log.handlers[:] = [handler]
        log.propagate = False
        log.setLevel(logging.INFO)
        event(log, name, **fields)
        out = buf.getvalue()
        assert out.endswith("\n") and out.count("\n") == 1
        if json_lines:
            obj = json.loads(out)
            assert obj["event"] == name
            for k, v in fields.items():
                clash = k in RECORD_ATTRS or k in ("ts", "level", "logger", "event")
                key = f"field_{k}" if clash else k
                assert obj[key] == v
