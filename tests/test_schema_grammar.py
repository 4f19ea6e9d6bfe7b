"""The JSON schema -> GBNF converter against llama.cpp's own (no model needed).

``tests/fixtures/grammars/reference.json`` is what llama.cpp's ``json_schema_to_grammar``
(the converter llama-server runs) wrote for each schema of ``schemas.json``; it was made by
``bench/make_grammar_fixtures.py`` from the llama.cpp that llama-cpp-python vendors. The
converter must write the same text, rule for rule, or refuse where llama.cpp refuses.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from suffixd.daemon.generation.schema_grammar import (
    DEFAULT_LIMITS,
    GrammarError,
    SchemaLimitError,
    int_range_rule,
    schema_to_gbnf,
)

from tests.schema_strategies import schemas

FIXTURES = Path(__file__).parent / "fixtures" / "grammars"
SCHEMAS: dict[str, Any] = json.loads((FIXTURES / "schemas.json").read_text())
REFERENCE: dict[str, dict[str, str]] = json.loads((FIXTURES / "reference.json").read_text())


def test_every_schema_has_its_reference() -> None:
    assert set(SCHEMAS) == set(REFERENCE)


def _with_departures(grammar: str) -> str:
    """llama.cpp's text as this converter writes it where it departs on purpose (each
    departure in schema_grammar.py's docstring): an extra key leaves the names to avoid
    by a character written raw, never a control character or a backslash (llama.cpp's
    [^"i] wrote either, which is not JSON or spells a name through an escape)."""
    return re.sub(r'(?m)^(\S*additional-k ::= .*)$',
                  lambda m: m.group(1).replace('[^"', '[^"\\\\\\x00-\\x1F\\x7F'), grammar)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_grammar_equals_llama_cpp(name: str) -> None:
    ref = REFERENCE[name]
    if "error" in ref:
        with pytest.raises(GrammarError):
            schema_to_gbnf(SCHEMAS[name])
    else:
        assert schema_to_gbnf(SCHEMAS[name]) == _with_departures(ref["grammar"])


def test_whitespace_rule_lets_the_model_indent() -> None:
    # the rule the whole issue is about: newline and indentation between tokens
    grammar = schema_to_gbnf({"type": "object"})
    assert 'space ::= | " " | "\\n"{1,2} [ \\t]{0,20}' in grammar


# --------------------------------------------------------------------- the bounds
PATHOLOGICAL = [
    ({"type": "string", "maxLength": 100000}, "max_repetition"),
    ({"type": "array", "items": {"type": "integer"}, "maxItems": 50000}, "max_repetition"),
    ({"type": "string", "pattern": "^[a-z]{0,100000}$"}, "max_repetition"),
    ({"enum": list(range(100000))}, "max_enum"),
    ({"anyOf": [{"type": "object", "properties": {f"p{j}": {"type": "string"}
                                                  for j in range(100)}}] * 128}, "max_nodes"),
    ({"type": "object", "properties": {f"p{j}": {"type": "string"} for j in range(300)}},
     "max_properties"),
    ({"const": "x" * 20000}, "max_literal_bytes"),
    ({"type": "string", "pattern": "^" + "a" * 3000 + "$"}, "max_pattern_chars"),
    ({"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": 1000}
                                       for i in range(200)}}, "max_expanded_repetitions"),
    ({"enum": [f"value {i} " * 30 for i in range(1000)]}, "max_grammar_bytes"),
]


def _nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


@pytest.mark.parametrize(("schema", "limit"), PATHOLOGICAL + [(_nested(200), "max_depth")])
def test_pathological_schemas_are_refused_quickly(schema: Any, limit: str) -> None:
    start = time.perf_counter()
    with pytest.raises(SchemaLimitError) as err:
        schema_to_gbnf(schema)
    assert err.value.limit == limit
    assert limit in str(err.value)
    assert time.perf_counter() - start < 0.5


def test_huge_integer_bounds_are_vacuous_not_garbage() -> None:
    # the grammar writes at most 16 digits: a bound past that admits every such integer
    assert schema_to_gbnf({"type": "integer", "maximum": 10**1000}) == \
        schema_to_gbnf({"type": "integer"})
    assert schema_to_gbnf({"type": "integer", "minimum": -(10**1000)}) == \
        schema_to_gbnf({"type": "integer"})
    with pytest.raises(GrammarError):
        schema_to_gbnf({"type": "integer", "minimum": 10**1000})
    with pytest.raises(GrammarError):
        schema_to_gbnf({"type": "integer", "minimum": 5, "maximum": 4})
    with pytest.raises(GrammarError):
        schema_to_gbnf({"type": "integer", "maximum": float("inf")})


def test_invalid_regex_is_refused() -> None:
    for bad in ("^((((a$", "^a)$", "^*a$", "^[abc$", "^ab\\"):
        with pytest.raises(GrammarError):
            schema_to_gbnf({"type": "string", "pattern": bad})


def test_recursive_schema_is_served() -> None:
    grammar = schema_to_gbnf({"$defs": {"n": {"type": "object", "properties": {
        "c": {"type": "array", "items": {"$ref": "#/$defs/n"}}}}}, "$ref": "#/$defs/n"})
    assert "ref-defs-n-c-item ::= ref-defs-n" in grammar


# --------------------------------------------------------------------- integer ranges
def _int_language(rule: str) -> Any:
    """The GBNF of ``int_range_rule`` as a Python regex (it only uses literals, classes,
    groups, alternation and counted repetition)."""
    pattern = re.sub(r'"([^"]*)"', lambda m: re.escape(m.group(1)), rule)
    return re.compile(pattern.replace(" ", ""))


@settings(max_examples=int(os.environ.get("SUFFIXD_INT_EXAMPLES", "1500")), deadline=None)
@example(105, None, 15)  # llama.cpp's converter admits 15 for minimum 105
@example(None, -105, -15)
@example(1000000, None, 10)
@example(110, None, 10000000)  # llama.cpp's converter refuses 10000000 for minimum 110
@given(st.one_of(st.none(), st.integers(-10**6, 10**6)),
       st.one_of(st.none(), st.integers(-10**6, 10**6)),
       st.one_of(st.integers(-10**7, 10**7),
                 st.builds(lambda k, d, sign: sign * (10**k + d), st.integers(0, 12),
                           st.integers(-2, 2), st.sampled_from([1, -1]))))
def test_integer_ranges_match_exactly_the_integers_in_range(
        lo: int | None, hi: int | None, x: int) -> None:
    if lo is None and hi is None or lo is not None and hi is not None and lo > hi:
        return
    language = _int_language(int_range_rule(lo, hi))
    inside = (lo is None or x >= lo) and (hi is None or x <= hi)
    assert bool(language.fullmatch(str(x))) == inside


# --------------------------------------------------------------------- property: never worse
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schemas)
def test_any_schema_is_a_grammar_or_a_grammar_error_within_bounds(schema: Any) -> None:
    start = time.perf_counter()
    try:
        grammar = schema_to_gbnf(schema)
    except GrammarError:
        pass
    else:
        assert len(grammar) <= DEFAULT_LIMITS.max_grammar_bytes
        assert "root ::= " in grammar
    assert time.perf_counter() - start < DEFAULT_LIMITS.max_seconds + 0.2


# --------------------------------------------------------------------- patterns: departures
def _pattern_rules(pattern: str) -> str:
    return schema_to_gbnf({"type": "string", "pattern": pattern})


def test_pattern_shorthands_and_unanchored_patterns_are_kept() -> None:
    # llama.cpp accepts any string for these (the output can break the pattern)
    assert "[0-9]" in _pattern_rules("^\\d{4}$")
    assert "[a-zA-Z0-9_]+" in _pattern_rules("^\\w+$")
    # a pattern searches: an unanchored side matches anything
    assert 'root ::= "\\"" (dot* ("abc") dot*) "\\""' in _pattern_rules("abc")


def test_patterns_never_write_a_bare_quote_backslash_or_control_character() -> None:
    # the pattern's characters are written raw inside the JSON string
    for pattern in ('^a"b$', "^a\\\\b$", "^a\\nb$", '^["]$', "^\\x22$"):
        with pytest.raises(GrammarError):
            _pattern_rules(pattern)
    negated = _pattern_rules("^[^,]+$")
    assert '[^,"\\\\\\x00-\\x1F\\x7F]+' in negated
    assert 'dot ::= [^"\\\\\\x00-\\x1F\\x7F]' in _pattern_rules("^a.b$")


def test_unsupported_patterns_are_refused_not_widened() -> None:
    for pattern in ("^(?=a)a$", "^(?<n>a)$", "^\\p{L}$", "^a\\1$"):
        with pytest.raises(GrammarError, match="not supported"):
            _pattern_rules(pattern)
