"""Schemas a client sends, against the real daemon (`suffixd serve --http`, embedded model):
the shapes that crashed it (a grammar nested 100,000 levels deep), stalled it (huge enums
and tool lists) or broke their promise (a vast integer bound, an invalid regex accepted, a
recursive schema refused), and a property test over generated schemas: every answer is a
200 whose finished output validates against the schema, or a 4xx, within a fixed time,
and the daemon is alive afterwards.

``SUFFIXD_SCHEMA_EXAMPLES`` sets the property test's example count (CI: a modest one;
the bench run in BENCHMARKS.md: thousands) and ``SUFFIXD_SCHEMA_MAX_TOKENS`` each answer's
length.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.schema_strategies import schemas

EXAMPLES = int(os.environ.get("SUFFIXD_SCHEMA_EXAMPLES", "12"))
ANSWER_BOUND_S = 120.0  # a whole answer of MAX_TOKENS on a loaded 2-core CI machine
REFUSAL_BOUND_S = 5.0  # a refusal is milliseconds; this leaves room for a loaded machine
MAX_TOKENS = int(os.environ.get("SUFFIXD_SCHEMA_MAX_TOKENS", "24"))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tests.conftest import DaemonProcess

    proc = DaemonProcess(tmp_path_factory.mktemp("schemas") / "data",
                         ["--http", "127.0.0.1:0"]).start()
    yield proc
    proc.stop()


def _post(daemon: Any, body: dict[str, Any], timeout: float = ANSWER_BOUND_S,
          ) -> tuple[httpx.Response, float]:
    start = time.monotonic()
    r = httpx.post(f"{daemon.http}/chat/completions", timeout=timeout, json={
        "model": "default", "max_tokens": MAX_TOKENS, "temperature": 0,
        "messages": [{"role": "user", "content": "Answer in JSON."}], **body},
        headers={"X-Suffixd-Namespace": "schemas"})
    return r, time.monotonic() - start


def _as_format(schema: Any) -> dict[str, Any]:
    return {"response_format": {"type": "json_schema",
                                "json_schema": {"name": "x", "schema": schema}}}


def _wrapped(schema: Any) -> dict[str, Any]:
    """``schema`` as a tool's one argument (a function's parameters are an object)."""
    return {"type": "object", "properties": {"value": schema}, "required": ["value"]}


def _as_tool(schema: Any, wrap: bool = True) -> dict[str, Any]:
    params = _wrapped(schema) if wrap else schema
    return {"tools": [{"type": "function", "function": {"name": "f", "parameters": params}}],
            "tool_choice": "required"}


def _alive(daemon: Any) -> None:
    assert daemon.proc.poll() is None, "the daemon died"
    assert httpx.get(f"{daemon.http.rsplit('/v1', 1)[0]}/health", timeout=30).status_code \
        in (200, 503)


PATHOLOGICAL = [
    ({"type": "string", "maxLength": 100000}, "max_repetition"),
    ({"type": "array", "items": {"type": "integer"}, "maxItems": 50000}, "max_repetition"),
    ({"type": "string", "pattern": "^[a-z]{0,100000}$"}, "max_repetition"),
    ({"enum": list(range(100000))}, "max_enum"),
    ({"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(300)}},
     "max_properties"),
]


@pytest.mark.parametrize(("schema", "limit"), PATHOLOGICAL)
@pytest.mark.parametrize("where", ["response_format", "tools"])
def test_pathological_schemas_are_a_400_naming_the_limit(
        daemon: Any, schema: Any, limit: str, where: str) -> None:
    body = _as_format(schema) if where == "response_format" else _as_tool(schema)
    r, took = _post(daemon, body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == where and limit in err["message"], err
    assert took < REFUSAL_BOUND_S
    _alive(daemon)


def test_many_large_tools_are_refused_quickly(daemon: Any) -> None:
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "parameters": {
        "type": "object", "properties": {f"p{j}": {"type": "string"} for j in range(100)}}}}
        for i in range(128)]
    r, took = _post(daemon, {"tools": tools, "tool_choice": "required"}, timeout=60)
    assert r.status_code == 400 and "max_nodes" in r.json()["error"]["message"], r.text
    assert took < REFUSAL_BOUND_S
    _alive(daemon)


def test_a_vast_integer_bound_is_kept(daemon: Any) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 10**1000}},
              "required": ["n"]}
    r, _ = _post(daemon, {**_as_format(schema), "max_tokens": 48})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    if choice["finish_reason"] == "stop":
        jsonschema.validate(json.loads(choice["message"]["content"]), schema)


def test_a_recursive_schema_is_served_and_an_invalid_regex_refused(daemon: Any) -> None:
    tree = {"$defs": {"node": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 8},
        "children": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/node"}}},
        "required": ["name"]}}, "$ref": "#/$defs/node"}
    r, _ = _post(daemon, {**_as_format(tree), "max_tokens": 64})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    if choice["finish_reason"] == "stop":
        jsonschema.validate(json.loads(choice["message"]["content"]), tree)
    bad = {"type": "string", "pattern": "^((((a$"}
    r, _ = _post(daemon, _as_format(bad))
    assert r.status_code == 400 and "unbalanced" in r.json()["error"]["message"], r.text
    _alive(daemon)


@pytest.mark.parametrize("root", [{"type": "number"}, {"type": "null"}, {"enum": [1, 2]},
                                  {"type": "array"}, {"anyOf": [{"type": "object"}]}])
def test_tool_parameters_must_be_an_object(daemon: Any, root: Any) -> None:
    r, took = _post(daemon, _as_tool(root, wrap=False), timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "tools[0].function.parameters"


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(schema=schemas, as_tool=st.booleans())
def test_any_schema_is_a_valid_answer_or_a_4xx(daemon: Any, schema: Any, as_tool: bool,
                                               ) -> None:
    r, took = _post(daemon, _as_tool(schema) if as_tool else _as_format(schema))
    assert took < ANSWER_BOUND_S
    assert r.status_code in (200, 400), r.text
    if r.status_code == 400:
        assert took < REFUSAL_BOUND_S
    else:
        choice = r.json()["choices"][0]
        if as_tool and choice["finish_reason"] == "tool_calls":
            for call in choice["message"]["tool_calls"]:
                jsonschema.validate(json.loads(call["function"]["arguments"]),
                                    _wrapped(schema))
        elif not as_tool and choice["finish_reason"] == "stop":
            jsonschema.validate(json.loads(choice["message"]["content"]), schema)
    _alive(daemon)


# keywords llama.cpp's converter dropped (each answer could break the schema), and what
# no grammar writes (a 400 naming response_format and the keyword)
KEYWORD_CASES: list[tuple[Any, str | None]] = [
    ({"type": "object", "properties": {"a": {"type": "integer"}},
      "allOf": [{"properties": {"a": {"minimum": 5}, "b": {"type": "string", "maxLength": 4}},
                 "required": ["a", "b"]}]}, None),
    ({"type": "array", "prefixItems": [{"type": "string", "maxLength": 4}],
      "items": {"type": "integer"}, "minItems": 2, "maxItems": 3}, None),
    ({"type": "array", "contains": {"const": 3}, "minContains": 2, "maxItems": 4}, None),
    ({"type": "string", "enum": [1, "yes", None]}, None),
    ({"oneOf": [{"type": "object", "properties": {"k": {"const": "x"}, "n": {"type": "integer"}},
                 "required": ["k", "n"]},
                {"type": "object", "properties": {"k": {"const": "y"}}, "required": ["k"]}]},
     None),
    ({"type": "integer", "multipleOf": 5, "minimum": 0}, None),
    ({"type": "string", "not": {"const": "a"}}, "not"),
    ({"$dynamicRef": "#meta", "$defs": {"m": {"$dynamicAnchor": "meta"}}}, "$dynamicRef"),
    ({"oneOf": [{"type": "integer"}, {"minimum": 2}]}, "oneOf"),
]


def test_keywords_are_honoured_or_refused_by_name(daemon: Any) -> None:
    outcomes: list[str] = []
    for schema, refused in KEYWORD_CASES:
        r, took = _post(daemon, {**_as_format(schema), "max_tokens": 48})
        if refused is not None:
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert err["param"] == "response_format" and refused in err["message"], err
            assert took < REFUSAL_BOUND_S
            outcomes.append(f"400 {refused}")
            continue
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        if choice["finish_reason"] == "length":
            outcomes.append("200 cut by max_tokens")  # unfinished: nothing to validate
            continue
        assert choice["finish_reason"] == "stop", choice
        jsonschema.validate(json.loads(choice["message"]["content"]), schema)
        outcomes.append("200 valid")
    print("\n" + "\n".join(f"{json.dumps(s)[:70]}: {o}"
                           for (s, _), o in zip(KEYWORD_CASES, outcomes, strict=True)))
    _alive(daemon)
