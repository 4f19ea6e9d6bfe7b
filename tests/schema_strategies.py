"""Hypothesis strategies for JSON schemas, shrinking toward the pathological: leaves mix
ordinary types with the shapes that crashed or stalled the daemon (huge counted
repetitions, huge enums, absurd numeric bounds, invalid regexes, dangling refs)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

ORDINARY = [
    {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"},
    {"type": "null"}, {}, {"type": "string", "maxLength": 12}, {"enum": ["a", "b", 3]},
    {"type": "string", "format": "date"}, {"type": "integer", "minimum": 0, "maximum": 99},
    {"type": "number", "minimum": 0, "maximum": 1}, {"type": ["string", "null"]},
    {"type": "string", "pattern": "^[a-z]{2,5}$"}, {"const": {"a": [1, 2]}},
]
PATHOLOGICAL = [
    {"type": "string", "maxLength": 10**6}, {"type": "string", "minLength": 5000},
    {"type": "string", "pattern": "^[a-z]{0,99999}$"}, {"type": "string", "pattern": "^((a$"},
    {"type": "string", "pattern": "^" + "(" * 150 + "a" + ")" * 150 + "$"},
    {"type": "integer", "maximum": 10**1000}, {"type": "integer", "minimum": 3, "maximum": 2},
    {"type": "integer", "minimum": -(10**40), "maximum": 10**40},
    {"type": "number", "minimum": 10**300}, {"enum": list(range(5000))},
    {"$ref": "#/$defs/missing"}, {"type": "array", "maxItems": 10**9},
    {"type": "array", "items": {"type": "integer"}, "minItems": 1001}, {"type": "banana"},
    {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(300)}},
]
leaves = st.sampled_from(ORDINARY + PATHOLOGICAL)


def _extend(children: Any) -> Any:
    return st.one_of(
        st.dictionaries(st.text(max_size=8), children, max_size=6).map(
            lambda props: {"type": "object", "properties": props, "required": list(props)[:2]}),
        st.builds(lambda item, lo: {"type": "array", "items": item, "minItems": lo},
                  children, st.integers(0, 3)),
        st.lists(children, min_size=1, max_size=4).map(lambda alts: {"anyOf": alts}),
        st.lists(children, min_size=1, max_size=3).map(lambda alts: {"allOf": alts}),
    )


schemas = st.recursive(leaves, _extend, max_leaves=60)
