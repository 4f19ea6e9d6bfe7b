"""JSON schema -> GBNF, with llama.cpp's semantics and explicit bounds.

The grammar a schema becomes decides what the model may write, so it has to be the one
llama-server builds for the same request (``common/json-schema-to-grammar.cpp`` of the
llama.cpp that llama-cpp-python vendors): the same rules, the same rule names and order,
and above all the same whitespace rule, which lets the model lay JSON out over lines as
it was trained to (llama-cpp-python's own Python converter allows one optional space, and
a model forced into compact JSON leaves its distribution and degenerates).
``tests/fixtures/grammars/`` holds llama.cpp's own output for a set of schemas
(``bench/make_grammar_fixtures.py`` regenerates them) and the tests compare text for text.

Where this converter departs from llama.cpp, it does so to keep a promise llama.cpp does not:

* **Bounds** (``GrammarLimits``, ``schema_limits.py``): every schema is measured while it
  is read and refused (``SchemaLimitError``, a 400 naming the limit) before anything is
  built when it is too deep, too large, repeats too much or takes too long; see
  ``DEFAULT_LIMITS`` for the figures and why. Nothing a client sends reaches llama.cpp's
  grammar parser in a shape that can exhaust its stack or its time.
* **Numbers**: llama.cpp ignores ``minimum``/``maximum`` on ``number`` (the output can
  break the schema). Here a bounded number is written from a subset of the numbers the
  bounds admit (an integer in range, or a fraction strictly between two integers in
  range, no exponent), so the output always validates. Integer bounds past what the
  grammar can write (16 digits) are vacuous and dropped; bounds that admit nothing, or
  are not finite, are refused. A minimum whose digits after the first start with a zero
  (105, 1000000) is written exactly (llama.cpp's recursion drops the zero and admits 15).
* **Patterns**: a pattern's characters are written raw inside the JSON string, so the
  grammar never writes a quote, backslash or control character from one (llama.cpp's dot
  and negated classes do, which ends the string early); ``\\d``, ``\\w``, ``\\s`` are
  read, and an unanchored side matches anything (a pattern searches); a construct the
  grammar cannot express (lookaround, named groups, backreferences, ``\\p{..}``) is
  refused where llama.cpp accepts any string, and an invalid regex (unbalanced
  parentheses, nothing to repeat, trailing backslash, unterminated class) is refused too.
* **Every keyword** that constrains a value is honoured or refused by name (a
  ``GrammarError``: the endpoint's 400). llama.cpp reads a schema by its first keyword
  and drops the rest silently: ``allOf`` beside ``properties``, ``items`` beside
  ``prefixItems``, ``contains``, ``not``, ``if``, ``multipleOf``, ``patternProperties``,
  ``type`` beside ``enum``... Annotations (title, description, default, examples, $id,
  $schema, ...) and keywords JSON Schema does not know (OpenAPI's nullable) are ignored,
  as validators ignore them. Where only part of what a schema admits can be written, the
  grammar writes that part (a typeless schema as the type its keywords constrain,
  ``contains`` as every item matching it, ``maxProperties`` as fewer properties, a
  ``minProperties`` by making the first optional properties required).
* **allOf** (and what stands beside $ref, anyOf or oneOf, which 2020-12 applies too) is
  merged keyword by keyword, its anyOf/oneOf distributed into alternatives; llama.cpp's
  merge (every property of an object part required) is kept where it writes only valid
  values: one schema, enums in common, objects with distinct properties.
* **oneOf** is written as anyOf (as llama.cpp) only where no value can match two
  alternatives (different types, different consts, a discriminating required property);
  otherwise it is refused (llama.cpp's anyOf admitted values matching two).
* **const / enum** keep only the values valid against everything beside them (checked by
  a small validator, ``_valid``): llama.cpp wrote ``1`` for ``{"type": "string", "enum":
  [1, "a"]}``.
* **Extra keys** (``additionalProperties``) leave the names they must avoid by a
  character written raw: llama.cpp's ``[^"i]`` let one go on with a raw control character
  or a bare backslash (not JSON), or spell a named property through an escape.
* **Unsatisfiable** parts (``false``, empty intersections) are dropped where they are one
  alternative or an optional property, and refused where nothing else is left; so is a
  schema with no finite value (``{"$ref": "#"}``), whose grammar never lets the model end.
"""

from __future__ import annotations

import functools
import importlib
import json
import math
import re
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

# The limits pass lives in schema_limits; its names stay importable from here, where
# grammar.py and the tests have always imported them (``X as X``: an explicit re-export).
from .schema_limits import DEFAULT_LIMITS as DEFAULT_LIMITS
from .schema_limits import UNBOUNDED as UNBOUNDED
from .schema_limits import GrammarError as GrammarError
from .schema_limits import GrammarLimits as GrammarLimits
from .schema_limits import LimitsMeter
from .schema_limits import SchemaLimitError as SchemaLimitError

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

# the whitespace between JSON tokens, as llama.cpp's converter writes it
SPACE_RULE = '| " " | "\\n"{1,2} [ \\t]{0,20}'

# name -> (content, dependencies)
PRIMITIVES: dict[str, tuple[str, tuple[str, ...]]] = {
    "boolean": ('("true" | "false")', ()),
    "decimal-part": ("[0-9]{1,16}", ()),
    "integral-part": ("[0] | [1-9] [0-9]{0,15}", ()),
    "number": ('("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)?',
               ("integral-part", "decimal-part")),
    "integer": ('("-"? integral-part)', ("integral-part",)),
    "value": ("object | array | string | number | boolean | null",
              ("object", "array", "string", "number", "boolean", "null")),
    "object": ('"{" space ( string ":" space value ("," space string ":" space value)* )? '
               'space "}"', ("string", "value")),
    "array": ('"[" space ( value ("," space value)* )? space "]"', ("value",)),
    "uuid": ('"\\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" '
             '[0-9a-fA-F]{4} "-" [0-9a-fA-F]{12} "\\""', ()),
    "char": ('[^"\\\\\\x7F\\x00-\\x1F] | [\\\\] (["\\\\bfnrt] | "u" [0-9a-fA-F]{4})', ()),
    "string": ('"\\"" char* "\\""', ("char",)),
    "null": ('"null"', ()),
}
STRING_FORMATS: dict[str, tuple[str, tuple[str, ...]]] = {
    "date": ('[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )',
             ()),
    "time": ('([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? '
             '( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )', ()),
    "date-time": ('date "T" time', ("date", "time")),
    "date-string": ('"\\"" date "\\""', ("date",)),
    "time-string": ('"\\"" time "\\""', ("time",)),
    "date-time-string": ('"\\"" date-time "\\""', ("date-time",)),
}
_RESERVED = {"root", *PRIMITIVES, *STRING_FORMATS}
_INVALID_RULE_CHARS = re.compile(r"[^a-zA-Z0-9-]+")
_LITERAL_ESCAPES = {"\r": "\\r", "\n": "\\n", '"': '\\"', "\\": "\\\\"}
_NON_LITERAL = set("|.()[]{}*+?^$")
_ESCAPED_IN_REGEX_ONLY = set("^$.[]()|{}*+?")
MAX_PATTERN_DEPTH = 100  # llama.cpp's own limit on a pattern's parentheses


# ---------------------------------------------------------------------------- the schema
@dataclass
class Node:
    """One schema, read: ``kind`` is one of any, ref, anyOf, allOf, const, enum, null,
    boolean, number, integer, string, array, tuple, object."""

    kind: str
    children: list[Node] = field(default_factory=list)  # anyOf / allOf / tuple items
    value: Any = None  # const
    values: list[Any] = field(default_factory=list)  # enum; array: the distinct items
    ref: str = ""
    props: list[tuple[str, Node, bool]] = field(default_factory=list)  # name, schema, required
    additional: Node | None = None  # object: extra keys allowed with this schema
    key: Node | None = None  # object: what an extra key must be (None: any other name)
    forbidden: list[str] = field(default_factory=list)  # object: names no extra key may take
    additional_max: int = UNBOUNDED  # object: how many extra keys at most
    items: Node | None = None  # array; tuple: the items after the prefix (None: none)
    unique: bool = False  # array: each of ``values`` at most once, in order
    min_count: int = 0  # minItems / minLength
    max_count: int = UNBOUNDED
    pattern: str = ""
    fmt: str = ""  # date, time, date-time, uuid
    minimum: int = INT64_MIN  # integer (inclusive)
    maximum: int = INT64_MAX
    multiple: int = 1  # integer: multiples of this, of the signs in ``signs``
    signs: str = "+0-"
    bounds: tuple[float | None, bool, float | None, bool] | None = None  # number: lo, excl, hi


# Keywords that never constrain an instance (annotations, and the containers of schemas
# reached through $ref), ignored wherever they are. ``format`` is an annotation too
# (2020-12's default), written as llama.cpp writes it where a string's type is known.
_ANNOTATIONS = frozenset({
    "title", "description", "$comment", "examples", "default", "$schema", "$id",
    "deprecated", "readOnly", "writeOnly", "contentMediaType", "contentEncoding",
    "contentSchema", "$anchor", "$dynamicAnchor", "$vocabulary", "$recursiveAnchor",
    "$defs", "definitions", "format"})
_OBJECT_KEYS = frozenset({
    "properties", "required", "additionalProperties", "patternProperties", "propertyNames",
    "minProperties", "maxProperties", "dependentRequired", "dependentSchemas"})
_ARRAY_KEYS = frozenset({
    "items", "prefixItems", "contains", "minContains", "maxContains", "minItems", "maxItems",
    "uniqueItems"})
_STRING_KEYS = frozenset({"pattern", "minLength", "maxLength"})
_NUMBER_KEYS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                          "multipleOf"})
_GENERIC_KEYS = frozenset({
    "type", "enum", "const", "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "$ref",
    "$dynamicRef", "$recursiveRef"})
# Every keyword that constrains an instance (after ``_Reader.normalize``: draft 7's
# dependencies / additionalItems / items-as-array and the unevaluated* keywords are
# rewritten into these). Any other keyword is unknown to JSON Schema, and validators
# ignore it (OpenAPI's nullable, discriminator, ...).
_CONSTRAINING = _OBJECT_KEYS | _ARRAY_KEYS | _STRING_KEYS | _NUMBER_KEYS | _GENERIC_KEYS
_TYPES = ("null", "boolean", "object", "array", "string", "integer", "number")
_ALL_TYPES = frozenset(_TYPES)
# the lengths of what the grammar writes for a string format (date: 2024-01-31)
_FORMAT_LENGTHS = {"date": (10, 10), "time": (9, 18), "date-time": (20, 29), "uuid": (36, 36)}
# multipleOf k without both bounds: k divides 10^d, and a multiple ends in one of the
# 10^d / k suffixes of d digits (at most this many)
MAX_MULTIPLE_SUFFIXES = 200


class _Unsatisfiable(GrammarError):
    """A schema no value validates against (dropped where it is one alternative or an
    optional property among others, refused where nothing else is left)."""


class _Unvalidatable(Exception):
    """A keyword ``_valid`` cannot decide."""

    def __init__(self, keyword: str) -> None:
        super().__init__(keyword)
        self.keyword = keyword


def _kind(value: Any) -> str:
    """The JSON type of a value; a float with no fraction is an integer, as JSON Schema
    counts it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    raise _Unvalidatable("a value that is not JSON")


def _type_names(kind: Any) -> list[str]:
    names = [kind] if isinstance(kind, str) else kind if isinstance(kind, list) else None
    if names is None or not all(isinstance(t, str) for t in names):
        raise _Unvalidatable("type")
    return names


def _json_equal(a: Any, b: Any) -> bool:
    """Equality as JSON Schema has it: 1 is 1.0, true is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and bool(a == b)


@functools.lru_cache(maxsize=512)
def _regex(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        raise _Unvalidatable("pattern") from exc


def _multiple_of(value: int | float, step: int | float) -> bool:
    """Exactly, and in floating point as most validators compute it: both must agree."""
    try:
        exact = (Fraction(value) / Fraction(step)).denominator == 1
        quotient = value / step
    except (ValueError, ZeroDivisionError, OverflowError):
        return False
    return exact and (not isinstance(quotient, float) or quotient.is_integer())


def _valid(value: Any, schema: Any, resolve: Callable[[str], Any], depth: int = 0) -> bool:
    """Whether ``value`` validates against ``schema``: a small validator for the values
    the grammar writes whole (const, enum) and for the names it writes as keys. A keyword
    it cannot decide raises ``_Unvalidatable`` (the caller refuses the schema)."""
    if depth > 64:
        raise _Unvalidatable("$ref")  # a $ref cycle that never reaches a value
    if schema is True:
        return True
    if schema is False:
        return False
    if not isinstance(schema, Mapping):
        raise _Unvalidatable("a schema that is not an object")
    s = schema
    for key in ("$dynamicRef", "$recursiveRef", "unevaluatedProperties", "unevaluatedItems"):
        if key in s and s[key] is not True:
            raise _Unvalidatable(key)

    def ok(inner: Any, sub: Any) -> bool:
        return _valid(inner, sub, resolve, depth + 1)

    def lst(key: str) -> list[Any]:
        items = s.get(key, [])
        if not isinstance(items, list):
            raise _Unvalidatable(key)
        return items

    def num(key: str) -> float:
        bound = s[key]
        if isinstance(bound, bool) or not isinstance(bound, int | float):
            raise _Unvalidatable(key)
        return bound

    if "$ref" in s and not ok(value, resolve(s["$ref"])):
        return False
    kind = _kind(value)
    if "type" in s and not any(t == kind or t == "number" and kind == "integer"
                               for t in _type_names(s["type"])):
        return False
    if "const" in s and not _json_equal(value, s["const"]):
        return False
    if "enum" in s and not any(_json_equal(value, v) for v in lst("enum")):
        return False
    if not all(ok(value, sub) for sub in lst("allOf")):
        return False
    if "anyOf" in s and not any(ok(value, sub) for sub in lst("anyOf")):
        return False
    if "oneOf" in s and sum(ok(value, sub) for sub in lst("oneOf")) != 1:
        return False
    if "not" in s and ok(value, s["not"]):
        return False
    if "if" in s:
        branch = "then" if ok(value, s["if"]) else "else"
        if branch in s and not ok(value, s[branch]):
            return False
    if kind in ("integer", "number"):
        if "minimum" in s and value < num("minimum") or \
                "maximum" in s and value > num("maximum") or \
                "exclusiveMinimum" in s and value <= num("exclusiveMinimum") or \
                "exclusiveMaximum" in s and value >= num("exclusiveMaximum"):
            return False
        if "multipleOf" in s and not _multiple_of(value, num("multipleOf")):
            return False
    elif kind == "string":
        if "minLength" in s and len(value) < num("minLength") or \
                "maxLength" in s and len(value) > num("maxLength"):
            return False
        if "pattern" in s:
            if not isinstance(s["pattern"], str):
                raise _Unvalidatable("pattern")
            if not _regex(s["pattern"]).search(value):
                return False
    elif kind == "array":
        prefix, rest = lst("prefixItems"), s.get("items")
        if isinstance(rest, list):  # draft 7's tuple
            prefix, rest = rest, s.get("additionalItems")
        for i, item in enumerate(value):
            sub = prefix[i] if i < len(prefix) else rest
            if sub is not None and not ok(item, sub):
                return False
        if "minItems" in s and len(value) < num("minItems") or \
                "maxItems" in s and len(value) > num("maxItems"):
            return False
        if s.get("uniqueItems") is True and any(
                _json_equal(a, b) for i, a in enumerate(value) for b in value[i + 1:]):
            return False
        if "contains" in s:
            found = sum(ok(item, s["contains"]) for item in value)
            if found < (num("minContains") if "minContains" in s else 1) or \
                    "maxContains" in s and found > num("maxContains"):
                return False
    elif kind == "object":
        props = s.get("properties", {})
        patterns = s.get("patternProperties", {})
        if not isinstance(props, Mapping) or not isinstance(patterns, Mapping):
            raise _Unvalidatable("properties")
        for name, item in value.items():
            matched = name in props
            if matched and not ok(item, props[name]):
                return False
            for pattern, sub in patterns.items():
                if _regex(pattern).search(name):
                    matched = True
                    if not ok(item, sub):
                        return False
            if not matched and "additionalProperties" in s and \
                    not ok(item, s["additionalProperties"]):
                return False
            if "propertyNames" in s and not ok(name, s["propertyNames"]):
                return False
        if any(name not in value for name in lst("required")):
            return False
        if "minProperties" in s and len(value) < num("minProperties") or \
                "maxProperties" in s and len(value) > num("maxProperties"):
            return False
        for key in ("dependentRequired", "dependentSchemas", "dependencies"):
            deps = s.get(key, {})
            if not isinstance(deps, Mapping):
                raise _Unvalidatable(key)
            for name, dep in deps.items():
                if name in value and (
                        any(d not in value for d in dep) if isinstance(dep, list)
                        else not ok(value, dep)):
                    return False
    return True


def _types(schema: Any, resolve: Callable[[str], Any], seen: frozenset[str] = frozenset(),
           ) -> frozenset[str]:
    """The JSON types a schema may admit, or more (never fewer): ``integer`` for a number
    without a fraction, ``number`` for one with."""
    if schema is False:
        return frozenset()
    if not isinstance(schema, Mapping):
        return _ALL_TYPES
    s = schema
    ref = s.get("$ref")
    if isinstance(ref, str):
        # the target alone: draft 7 ignores what stands beside a $ref
        if ref in seen:
            return _ALL_TYPES
        try:
            return _types(resolve(ref), resolve, seen | {ref})
        except GrammarError:
            return _ALL_TYPES
    out = set(_ALL_TYPES)
    try:
        if "type" in s:
            names = _type_names(s["type"])
            out &= {t for n in names for t in (("integer", "number") if n == "number"
                                               else (n,))}
        if "const" in s:
            out &= {_kind(s["const"])}
        if isinstance(s.get("enum"), list):
            out &= {_kind(v) for v in s["enum"]}
    except _Unvalidatable:
        return _ALL_TYPES
    for sub in s.get("allOf", []) if isinstance(s.get("allOf"), list) else []:
        out &= _types(sub, resolve, seen)
    for key in ("anyOf", "oneOf"):
        if isinstance(s.get(key), list):
            out &= set().union(*(_types(sub, resolve, seen) for sub in s[key]))
    return frozenset(out)


def _vacuous(key: str, value: Any) -> bool:
    """Whether a keyword's value constrains nothing (minItems 0, required [], ...)."""
    if key.startswith("min") and key not in ("minimum",):
        return value == 0 and not isinstance(value, bool)
    if key in ("items", "propertyNames", "additionalProperties"):
        return value is True or value == {}
    return value is False and key == "uniqueItems" or value == [] and key == "required" or \
        value == {} and key in ("properties", "patternProperties", "dependentRequired",
                                "dependentSchemas")


def _pattern_width(pattern: str) -> tuple[int, float] | None:
    """The fewest and most characters a pattern's strings have (as the grammar writes
    it: an unanchored side matches anything), None where Python cannot read it."""
    try:
        parser: Any = importlib.import_module("re._parser")
        lo, hi = parser.parse(pattern).getwidth()
    except (ImportError, AttributeError, re.error, RecursionError, OverflowError):
        return None  # a pattern Python does not read (or a Python without re._parser)
    anchored = pattern.startswith("^") and pattern.endswith("$") and not pattern.endswith("\\$")
    return lo, hi if anchored and hi < parser.MAXREPEAT else math.inf


def _power_of_ten_over(k: int) -> int | None:
    """The d with k dividing 10^d, where 10^d / k is at most ``MAX_MULTIPLE_SUFFIXES``
    (None: no such d)."""
    for d in range(16):  # (a multiple of 10^16 has more digits than the grammar writes)
        if 10**d % k == 0:
            return d if 10**d // k <= MAX_MULTIPLE_SUFFIXES else None
    return None


class _Reader:
    """The schema (a JSON value) into ``Node``s, keyword by keyword as llama.cpp's
    ``common_chat_schema_from_json`` reads it, counting against the limits. Every keyword
    that constrains a value is honoured (the grammar writes only values that validate,
    a subset of them where the whole cannot be written) or refused by name."""

    def __init__(self, root: Any, meter: LimitsMeter) -> None:
        self.root = root
        self.meter = meter
        self.limits = meter.limits
        self.refs: dict[str, Node | None] = {}
        self.empty_refs: set[str] = set()

    # ------------------------------------------------------------------ errors
    def fail(self, path: str, msg: str) -> GrammarError:
        return GrammarError(f"JSON schema error at {path}: {msg}")

    def unsupported(self, path: str, keyword: str, why: str) -> GrammarError:
        return GrammarError(f"JSON schema error at {path}: {keyword} is not supported "
                            f"({why})")

    def empty(self, path: str, what: str) -> _Unsatisfiable:
        return _Unsatisfiable(f"JSON schema error at {path}: {what} admits no value")

    def count(self, schema: Mapping[str, Any], key: str, path: str, default: int) -> int:
        if key not in schema:
            return default
        value = schema[key]
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.fail(path, f"{key} must be a non-negative integer")
        self.meter.repetition(path, key, value)
        return value

    # ------------------------------------------------------------------ schema shapes
    def normalize(self, schema: Any, path: str) -> dict[str, Any]:
        """A schema as a dict in 2020-12's terms: ``true`` is ``{}``, draft 7's tuple
        ``items``, ``additionalItems`` and ``dependencies`` are their 2020-12 keywords,
        and an ``unevaluated*`` keyword that only the schema's own keywords evaluate is
        the ``additional*`` keyword it then equals."""
        if schema is True:
            return {}
        if schema is False:
            raise self.empty(path, "the schema false")
        if not isinstance(schema, Mapping):
            raise self.fail(path, "schema must be an object")
        s = dict(schema)
        if "type" in s:
            kind = s["type"]
            if isinstance(kind, list) and not kind:
                raise self.fail(path, "type must not be empty")
            if not isinstance(kind, str | list) or isinstance(kind, list) and not all(
                    isinstance(t, str) for t in kind):
                raise self.fail(path, "type must be a string or an array of strings")
            for t in [kind] if isinstance(kind, str) else kind:
                if t not in _TYPES:
                    raise self.fail(path, f"unrecognized type {t}")
        if "if" not in s:
            s.pop("then", None)
            s.pop("else", None)
        elif "then" not in s and "else" not in s:
            del s["if"]  # an if without then or else constrains nothing
        if "contains" not in s:
            s.pop("minContains", None)
            s.pop("maxContains", None)
        if isinstance(s.get("items"), list):
            if "prefixItems" in s:
                raise self.fail(path, "items as an array (draft 7) beside prefixItems")
            s["prefixItems"] = s.pop("items")
            if "additionalItems" in s:
                s["items"] = s["additionalItems"]
        s.pop("additionalItems", None)  # without a tuple it constrains nothing
        if "dependencies" in s:
            deps = s.pop("dependencies")
            if not isinstance(deps, Mapping):
                raise self.fail(path, "dependencies must be an object")
            for name, dep in deps.items():
                key = "dependentRequired" if isinstance(dep, list) else "dependentSchemas"
                s[key] = {**s.get(key, {}), name: dep}
        for key, plain, applies in (
                ("unevaluatedProperties", "additionalProperties", ("dependentSchemas",)),
                ("unevaluatedItems", "items", ())):
            if key not in s:
                continue
            value = s.pop(key)
            if value is True or plain in s:
                continue  # everything is evaluated already
            applied = [k for k in ("allOf", "anyOf", "oneOf", "$ref", "$dynamicRef", "if",
                                   *applies) if k in s]
            if applied:
                raise self.unsupported(path, key, f"beside {applied[0]}, which evaluates "
                                       "some of the value's members itself")
            s[plain] = value
        return s

    def constraining(self, s: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in s.items() if k in _CONSTRAINING}

    def audit(self, s: Mapping[str, Any], path: str) -> None:
        """Refuse the keywords no grammar here writes (outside an enum or const, whose
        values are checked against them)."""
        if "not" in s:
            raise self.unsupported(path, "not", "a grammar cannot exclude the values a "
                                   "schema matches")
        if "if" in s:
            raise self.unsupported(path, "if/then/else", "a grammar cannot choose the "
                                   "branch by whether the value matches if")
        for key in ("$dynamicRef", "$recursiveRef"):
            if key in s:
                raise self.unsupported(path, key, "only $ref into the same document is "
                                       "supported")

    def resolve(self, ref: Any, path: str) -> Any:
        if not isinstance(ref, str):
            raise self.fail(path, "$ref must be a string")
        if ref == "#":
            return self.root
        if not ref.startswith("#/"):
            raise self.fail(path, f"unsupported $ref {ref}, only references into the same "
                            "document are supported")
        target = self.root
        for raw in ref[2:].split("/"):
            sel = urllib.parse.unquote(raw).replace("~1", "/").replace("~0", "~")
            if isinstance(target, Mapping):
                if target is not self.root and isinstance(target.get("$id"), str):
                    raise self.unsupported(path, "$id", f"$ref {ref} passes through a "
                                           "schema with its own $id (a new base URI)")
                if sel not in target:
                    raise self.fail(path, f"cannot resolve $ref {ref}, {sel} not found")
                target = target[sel]
            elif isinstance(target, list):
                idx = int(sel) if sel.isdigit() else len(target)
                if idx >= len(target):
                    raise self.fail(path, f"cannot resolve $ref {ref}, {sel} is out of range")
                target = target[idx]
            else:
                raise self.fail(path, f"cannot resolve $ref {ref}, {sel} not found")
        return target

    def deref(self, schema: Any, path: str) -> dict[str, Any] | None:
        """The schema behind a chain of bare $refs (None: not resolvable or not a dict)."""
        seen: set[str] = set()
        while True:
            try:
                s = self.normalize(schema, path)
            except GrammarError:
                return None
            ref = s.get("$ref")
            if ref is None or set(self.constraining(s)) != {"$ref"}:
                return s
            if not isinstance(ref, str) or ref in seen:
                return None
            seen.add(ref)
            try:
                schema = self.resolve(ref, path)
            except GrammarError:
                return None

    def valid(self, value: Any, schema: Any, path: str, beside: str) -> bool:
        try:
            return _valid(value, schema, lambda ref: self.resolve(ref, path))
        except _Unvalidatable as exc:
            raise self.unsupported(path, exc.keyword, f"beside {beside}") from exc
        except RecursionError as exc:  # pragma: no cover - depth 64 keeps far from it
            raise self.unsupported(path, "$ref", f"beside {beside}") from exc

    def types(self, schema: Any, path: str) -> frozenset[str]:
        return _types(schema, lambda ref: self.resolve(ref, path))

    def finite(self, schema: Any, path: str, depth: int = 0) -> list[Any] | None:
        """Values that include every value of the schema, where it is a const or an enum,
        or an allOf with one among its parts (None: none known)."""
        s = self.deref(schema, path)
        if s is None or depth > self.limits.max_depth:
            return None
        if "const" in s:
            return [s["const"]]
        values = s.get("enum")
        if isinstance(values, list):
            return values
        for part in s.get("allOf", []) if isinstance(s.get("allOf"), list) else []:
            values = self.finite(part, path, depth + 1)
            if values is not None:
                try:  # those the other parts admit too
                    return [v for v in values if self.valid(v, s, path, "allOf")]
                except GrammarError:
                    return values
        return None

    def disjoint(self, a: Any, b: Any, path: str) -> bool:
        """Whether no value validates against both (False where it cannot tell)."""
        common = self.types(a, path) & self.types(b, path)
        if not common:
            return True
        try:
            for x, y in ((a, b), (b, a)):
                values = self.finite(x, path)
                if values is not None:
                    check = self.valid
                    return not any(check(v, x, path, "oneOf") and check(v, y, path, "oneOf")
                                   for v in values)
            if common <= {"object"}:
                # a discriminator: a required property whose values the other refuses
                for x, y in ((a, b), (b, a)):
                    dx, dy = self.deref(x, path), self.deref(y, path)
                    if dx is None or dy is None:
                        continue
                    px, py = dx.get("properties"), dy.get("properties")
                    required = dx.get("required")
                    if not isinstance(px, Mapping) or not isinstance(py, Mapping) or \
                            not isinstance(required, list):
                        continue
                    for name in required:
                        values = self.finite(px[name], path) if name in px else None
                        if values is not None and name in py and not any(
                                self.valid(v, py[name], path, "oneOf") for v in values):
                            return True
        except GrammarError:
            return False
        return False

    def subschemas(self, value: Any, path: str) -> list[Any]:
        if not isinstance(value, list):
            raise self.fail(path, "must be an array of schemas")
        if not value:
            raise self.fail(path, "must not be empty")
        return value

    # ------------------------------------------------------------------ reading
    def node(self, schema: Any, path: str, depth: int) -> Node:
        self.meter.schema(path, depth)
        s = self.normalize(schema, path)
        if depth and isinstance(s.get("$id"), str) and ('"$ref"' in _dump(s)
                                                         or '"$dynamicRef"' in _dump(s)):
            raise self.unsupported(path, "$id", "a $ref under a schema with its own $id "
                                   "(a new base URI)")
        if "const" in s or "enum" in s:
            return self.literals(s, path)
        self.audit(s, path)
        rest = self.constraining(s)
        if "$ref" in s:
            if len(rest) == 1:
                return self.reference(s["$ref"], path, depth)
            # 2020-12 applies what stands beside a $ref too (draft 7 ignores it: a subset)
            return self.intersection([s], path, depth)
        groups = [k for k in ("anyOf", "oneOf", "allOf") if k in rest]
        if groups:
            key = groups[0]
            others = {k: v for k, v in rest.items() if k != key}
            alts = self.subschemas(s[key], f"{path}/{key}")
            if len(groups) == 1 and key == "allOf" and self.llama_all_of(alts, others, path):
                return self.alternatives("allOf", alts, f"{path}/{key}", depth)
            if len(groups) == 1 and key != "allOf" and (not others or self.implied(
                    others, alts, path)):
                return self.union(key, alts, path, depth)
            return self.intersection([s], path, depth)
        kind = s.get("type")
        if isinstance(kind, list):
            if not kind:
                raise self.fail(path, "type must not be empty")
            branches = Node("anyOf")
            for i, t in enumerate(kind):
                try:
                    branches.children.append(
                        self.node({**s, "type": t}, f"{path}/type/{i}", depth + 1))
                except _Unsatisfiable:
                    continue
            if not branches.children:
                raise self.empty(path, "the schema")
            return branches
        if kind is not None and not isinstance(kind, str):
            raise self.fail(path, "type must be a string or an array of strings")
        if kind is None:
            kind = self.implied_type(s, path)
        if kind == "object":
            return self.object(s, path, depth)
        if kind == "array":
            return self.array(s, path, depth)
        if kind == "string":
            return self.string(s, path)
        if kind == "integer":
            return self.integer(s, path)
        if kind == "number":
            return self.number(s, path)
        if kind in ("boolean", "null", "any"):
            return Node(kind)
        raise self.fail(path, f"unrecognized type {kind}")

    def implied_type(self, s: Mapping[str, Any], path: str) -> str:
        """The type a schema without one is written as: llama.cpp's choice where it makes
        one (the first of object, array, string by their keywords), else the type the
        schema's keywords constrain; values of the other types would validate too, so the
        grammar writes a subset."""
        if "properties" in s or ("additionalProperties" in s
                                 and s["additionalProperties"] is not True):
            return "object"
        if "items" in s or "prefixItems" in s:
            return "array"
        if any(k in s for k in ("pattern", "minLength", "maxLength")) or \
                self.format(s, path):
            return "string"
        for kind, keys in (("object", _OBJECT_KEYS), ("array", _ARRAY_KEYS),
                           ("number", _NUMBER_KEYS)):
            if any(k in s and not _vacuous(k, s[k]) for k in keys):
                return kind
        return "any"

    def implied(self, others: Mapping[str, Any], alts: list[Any], path: str) -> bool:
        """Whether ``others`` is only a type every alternative keeps to already (llama.cpp
        ignores what stands beside anyOf; here that is so only where nothing is lost)."""
        if set(others) != {"type"}:
            return False
        allowed = self.types({"type": others["type"]}, path)
        return all(self.types(a, path) <= allowed for a in alts)

    def literals(self, s: Mapping[str, Any], path: str) -> Node:
        """A const or enum, keeping the values that validate against everything beside
        it (llama.cpp writes them all: {"type": "string", "enum": [1, "a"]} wrote 1)."""
        if "const" in s:
            values = [self.literal(s["const"], path)]
        if "enum" in s:
            enum = s["enum"]
            if not isinstance(enum, list) or not enum:
                raise self.fail(path, "enum must be a non-empty array")
            self.meter.enum(path, len(enum))
            enum = [self.literal(v, path) for v in enum]
            values = [v for v in values if any(_json_equal(v, e) for e in enum)] \
                if "const" in s else enum
        rest = {k: v for k, v in s.items() if k not in ("const", "enum")}
        beside = "const" if "const" in s else "enum"
        values = [v for v in values if self.valid(v, rest, path, beside)]
        if not values:
            raise self.empty(path, f"the {beside}")
        if "const" in s:
            return Node("const", value=values[0])
        return Node("enum", values=values)

    def literal(self, value: Any, path: str) -> Any:
        self.meter.literal(path, _dump(value))
        return value

    def reference(self, ref: Any, path: str, depth: int) -> Node:
        target = self.resolve(ref, path)
        if ref in self.empty_refs:
            raise self.empty(path, f"$ref {ref}")
        if ref not in self.refs:
            self.refs[ref] = None  # a cycle back to this $ref stops here
            try:
                self.refs[ref] = self.node(target, ref, depth + 1)
            except _Unsatisfiable:
                del self.refs[ref]
                self.empty_refs.add(ref)
                raise
        return Node("ref", ref=ref)

    def alternatives(self, kind: str, alts: list[Any], path: str, depth: int) -> Node:
        return Node(kind, children=[
            self.node(a, f"{path}/{i}", depth + 1) for i, a in enumerate(alts)])

    def union(self, key: str, alts: list[Any], path: str, depth: int) -> Node:
        """anyOf, and oneOf where no value can match two alternatives (llama.cpp writes
        oneOf as anyOf: a value matching two of them broke the schema)."""
        if key == "oneOf":
            for i, a in enumerate(alts):
                for j in range(i + 1, len(alts)):
                    if not self.disjoint(a, alts[j], path):
                        raise self.overlap(path, i, j)
        return self.satisfiable_any(alts, path, key, depth)

    def satisfiable_any(self, alts: list[Any], path: str, key: str, depth: int) -> Node:
        """anyOf the alternatives that some value satisfies (an unsatisfiable one is
        dropped; none left: the schema is refused naming ``key``)."""
        node = Node("anyOf")
        for i, a in enumerate(alts):
            try:
                node.children.append(self.node(a, f"{path}/{key}/{i}", depth + 1))
            except _Unsatisfiable:
                continue
        if not node.children:
            raise self.empty(path, key)
        return node

    def overlap(self, path: str, i: int, j: int) -> GrammarError:
        return self.unsupported(path, "oneOf", f"alternatives {i} and {j} may both match "
                                "a value, and a grammar cannot exclude the others where one "
                                "matches")

    def llama_all_of(self, alts: list[Any], others: Mapping[str, Any], path: str) -> bool:
        """Whether llama.cpp's allOf merge (``_Writer.all_of``) writes only valid values
        for these parts: one schema; enums with values in common; or objects naming
        distinct properties without additionalProperties (each part's properties all
        written, required), and anyOf parts of such objects that require nothing (their
        properties optional: every alternative then matches)."""
        if others and dict(others) != {"type": "object"}:
            return False
        if len(alts) == 1:
            return not others
        parts = [self.deref(a, path) for a in alts]
        if all(p is not None and set(self.constraining(p)) == {"enum"} and
               isinstance(p["enum"], list) for p in parts):
            common = {_literal(_dump(v)) for v in parts[0]["enum"]}  # type: ignore[index]
            for p in parts[1:]:
                common &= {_literal(_dump(v)) for v in p["enum"]}  # type: ignore[index]
            return not others and bool(common)

        def plain(s: dict[str, Any] | None, may_require: bool) -> list[str] | None:
            if s is None or not set(self.constraining(s)) <= {"type", "properties",
                                                                 "required"}:
                return None
            props, required = s.get("properties", {}), s.get("required", [])
            if s.get("type", "object") != "object" or not isinstance(props, Mapping) or \
                    not isinstance(required, list) or ("properties" not in s
                                                       and "type" not in s):
                return None
            if required and not may_require or not set(required) <= set(props):
                return None
            return list(props)

        names: list[str] = []
        for alt, part in zip(alts, parts, strict=True):
            found = plain(part, True)
            if found is None:
                s = self.normalize(alt, path) if isinstance(alt, Mapping) else None
                if s is None or set(self.constraining(s)) != {"anyOf"} or \
                        not isinstance(s["anyOf"], list):
                    return False
                found = []
                for sub in s["anyOf"]:
                    more = plain(self.deref(sub, path), False)
                    if more is None:
                        return False
                    found += more
            names += found
        return len(names) == len(set(names))

    # ------------------------------------------------------------------ allOf
    def intersection(self, parts: list[Any], path: str, depth: int) -> Node:
        """The values valid against every part: the parts merged keyword by keyword, and
        anyOf/oneOf among them distributed (allOf[A, anyOf[B, C]] is anyOf[A+B, A+C])."""
        alts = self.distribute(parts, path, depth, frozenset())
        if len(alts) == 1:
            return self.node(alts[0], path, depth + 1)
        return self.satisfiable_any(alts, path, "allOf", depth)

    def distribute(self, parts: list[Any], path: str, depth: int, seen: frozenset[str],
                   ) -> list[dict[str, Any]]:
        self.meter.nesting(path, depth)
        merged: dict[str, Any] = {}
        simple: list[dict[str, Any]] = []
        groups: list[tuple[str, list[Any]]] = []
        queue = list(parts)
        while queue:
            s = self.normalize(queue.pop(0), path)
            if "$ref" in s:
                ref = s.pop("$ref")
                if not isinstance(ref, str):
                    raise self.fail(path, "$ref must be a string")
                if ref not in seen:  # A and A is A (and a cycle ends here)
                    seen |= {ref}
                    queue.append(self.resolve(ref, path))
            if "allOf" in s:
                queue += self.subschemas(s.pop("allOf"), f"{path}/allOf")
            for key in ("anyOf", "oneOf"):
                if key in s:
                    groups.append((key, self.subschemas(s.pop(key), f"{path}/{key}")))
            simple.append(s)
        for s in simple:  # every part read (and refused if malformed) before merging
            merged = self.merge(merged, s, path)
        if not groups:
            return [merged]
        (key, alts), rest = groups[0], groups[1:]
        out: list[dict[str, Any]] = []
        for i, alt in enumerate(alts):
            try:
                found = self.distribute([merged, alt, *({k: a} for k, a in rest)], path,
                                        depth + 1, seen)
            except _Unsatisfiable:
                continue
            if key == "oneOf":
                for one in found:
                    for j, other in enumerate(alts):
                        if j != i and not self.disjoint(one, other, path):
                            raise self.overlap(path, min(i, j), max(i, j))
            out += found
            self.meter.alternatives(path, len(out))
        if not out:
            raise self.empty(path, key)
        return out

    def merge(self, a: dict[str, Any], b: dict[str, Any], path: str) -> dict[str, Any]:
        """One schema for both (a subset where merging cannot be exact: the stricter)."""
        out = dict(a)
        for key, vb in b.items():
            if key not in out:
                out[key] = vb
                continue
            va = out[key]
            if key in _ANNOTATIONS or key not in _CONSTRAINING or _json_equal(va, vb):
                continue
            out[key] = self.merge_key(key, va, vb, a, b, path)
        for x, y in ((a, b), (b, a)):
            # what y allows beyond its own properties holds for x's properties too
            extra = y.get("additionalProperties")
            if extra is None or extra is True:
                continue
            for key, named in (("properties", y.get("properties", {})),
                               ("patternProperties", y.get("patternProperties", {}))):
                mine = x.get(key, {})
                if isinstance(mine, Mapping) and isinstance(named, Mapping):
                    for name in mine:
                        if name not in named:
                            out[key] = {**out[key], name: {"allOf": [out[key][name], extra]}}
        prefixes = [s.get("prefixItems", []) for s in (a, b)]
        if any(prefixes) and all(isinstance(p, list) for p in prefixes):
            merged = []
            for i in range(max(len(p) for p in prefixes)):
                here = [p[i] if i < len(p) else s["items"] for p, s in zip(prefixes, (a, b),
                                                                            strict=True)
                        if i < len(p) or "items" in s]
                merged.append(here[0] if len(here) == 1 else {"allOf": here})
            out["prefixItems"] = merged
        if "contains" in a and "contains" in b and ("maxContains" in a or "maxContains" in b):
            raise self.unsupported(path, "maxContains", "in several allOf parts with contains")
        if "contains" in a and "contains" in b:
            out["minContains"] = max(a.get("minContains", 1), b.get("minContains", 1))
        return out

    def merge_key(self, key: str, va: Any, vb: Any, a: Mapping[str, Any],
                  b: Mapping[str, Any], path: str) -> Any:
        def number(v: Any) -> float:
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise self.fail(path, f"{key} must be a number")
            return v

        if key in ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties",
                   "minContains"):
            return max(number(va), number(vb))
        if key in ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties",
                   "maxContains"):
            return min(number(va), number(vb))
        if key == "type":
            try:
                left, right = _type_names(va), _type_names(vb)
            except _Unvalidatable as exc:
                raise self.fail(path, "type must be a string or an array of strings") from exc
            both: list[str] = []
            for x in left:
                for y in right:
                    t = x if x == y else "integer" if {x, y} == {"integer", "number"} else ""
                    if t and t not in both:
                        both.append(t)
            if not both:
                raise self.empty(path, f"allOf of types {left} and {right}")
            return both[0] if len(both) == 1 else both
        if key == "enum":
            if not isinstance(va, list) or not isinstance(vb, list):
                raise self.fail(path, "enum must be a non-empty array")
            values = [v for v in va if any(_json_equal(v, w) for w in vb)]
            if not values:
                raise self.empty(path, "allOf of enums")
            return values
        if key == "const":
            raise self.empty(path, "allOf of different consts")
        if key == "multipleOf":
            fa, fb = Fraction(number(va)), Fraction(number(vb))
            if fa <= 0 or fb <= 0:
                raise self.fail(path, "multipleOf must be greater than 0")
            if (fa / fb).denominator == 1 or (fb / fa).denominator == 1:
                return va if fa >= fb else vb
            if fa.denominator == 1 and fb.denominator == 1:
                return math.lcm(int(fa), int(fb))
            raise self.unsupported(path, "multipleOf", f"of both {va} and {vb}")
        if key == "required":
            if not isinstance(va, list) or not isinstance(vb, list):
                raise self.fail(path, "required must be an array of strings")
            return va + [n for n in vb if n not in va]
        if key == "uniqueItems":
            return va is True or vb is True
        if key in ("properties", "patternProperties", "dependentSchemas",
                   "dependentRequired"):
            if not isinstance(va, Mapping) or not isinstance(vb, Mapping):
                raise self.fail(path, f"{key} must be an object")
            out = dict(va)
            for name, sub in vb.items():
                if name not in out:
                    out[name] = sub
                elif key == "dependentRequired":
                    if not isinstance(out[name], list) or not isinstance(sub, list):
                        raise self.fail(path, "dependentRequired must map to arrays")
                    out[name] = out[name] + [n for n in sub if n not in out[name]]
                else:
                    out[name] = {"allOf": [out[name], sub]}
            return out
        if key in ("additionalProperties", "items", "propertyNames", "contains"):
            return {"allOf": [va, vb]}
        if key == "prefixItems":
            return va  # merged whole in merge()
        if key == "not":
            return {"anyOf": [va, vb]}
        raise self.unsupported(path, key, "with different values in several allOf parts")

    # ------------------------------------------------------------------ objects
    def object(self, s: Mapping[str, Any], path: str, depth: int) -> Node:
        required = s.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise self.fail(path, "required must be an array of strings")
        props = s.get("properties", {})
        if not isinstance(props, Mapping):
            raise self.fail(path, "properties must be an object")
        self.meter.properties(path, len(props))
        patterns = s.get("patternProperties", {})
        depend = s.get("dependentRequired", {})
        dep_schemas = s.get("dependentSchemas", {})
        for key, value in (("patternProperties", patterns), ("dependentRequired", depend),
                           ("dependentSchemas", dep_schemas)):
            if not isinstance(value, Mapping):
                raise self.fail(path, f"{key} must be an object")
        for name, sub in dep_schemas.items():
            if name in required:
                # the schema holds whenever the property is there: always
                rest = {**s, "dependentSchemas": {
                    k: v for k, v in dep_schemas.items() if k != name}}
                return self.intersection([rest, sub], path, depth)
        extra = s.get("additionalProperties")
        if extra is not None and not isinstance(extra, Mapping | bool):
            raise self.fail(path, "additionalProperties must be a boolean or a schema")
        names_schema = s.get("propertyNames")

        def matching(name: str) -> list[Any]:
            try:
                return [sub for p, sub in patterns.items() if _regex(p).search(name)]
            except _Unvalidatable as exc:
                raise self.unsupported(path, "patternProperties", "a pattern Python's re "
                                       "does not read") from exc

        def declare(name: str) -> Any:
            # a name the properties do not list: additionalProperties holds for it,
            # unless a pattern does
            return True if matching(name) or extra is None else extra

        declared: dict[str, Any] = dict(props)
        for name in required:
            if name not in declared:
                declared[name] = declare(name)
        if names_schema is not None:
            names = self.finite(names_schema, path)
            if names is not None and extra is not False and not patterns:
                for name in names:  # the only names allowed: each one an optional property
                    if isinstance(name, str) and name not in declared:
                        declared[name] = declare(name)
        needed = set(required)
        dropped: set[str] = {n for n in dep_schemas if n in declared}
        changed = True
        while changed:  # dependentRequired, closed: a property written brings its deps
            changed = False
            for name, deps in depend.items():
                if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
                    raise self.fail(path, "dependentRequired must map to arrays of strings")
                if name not in declared or name in dropped:
                    continue
                missing = [d for d in deps if d not in needed]
                if not missing:
                    continue
                if name in needed or all(d in declared and d not in dropped
                                         for d in missing):
                    for d in missing:
                        if d not in declared:
                            declared[d] = declare(d)
                        needed.add(d)
                        dropped.discard(d)
                else:
                    dropped.add(name)
                changed = True
        node = Node("object")
        for name, sub in declared.items():
            if name in dropped:
                continue
            if names_schema is not None and not self.valid(name, names_schema, path,
                                                           "propertyNames"):
                if name in needed:
                    raise self.empty(path, f"the required property {name}")
                continue
            more = matching(name)
            if more:
                sub = {"allOf": [sub, *more]}
            try:
                node.props.append((name, self.node(sub, f"{path}/properties/{name}",
                                                   depth + 1), name in needed))
            except _Unsatisfiable:
                if name in needed:
                    raise
        node.forbidden = [n for n in [*declared, *depend, *dep_schemas]
                          if n not in {p[0] for p in node.props}]
        node.additional, node.key = self.extra_keys(s, node, path, depth)
        self.property_counts(s, node, path)
        return node

    def extra_keys(self, s: Mapping[str, Any], node: Node, path: str, depth: int,
                   ) -> tuple[Node | None, Node | None]:
        """What the keys beyond the named properties may be, and their values (None: no
        such keys). With patternProperties or propertyNames, extra keys are written only
        where their names can be held to them (one pattern, or a string schema, and no
        named property to keep apart from); otherwise none."""
        extra = s.get("additionalProperties")
        patterns = s.get("patternProperties", {})
        names_schema = s.get("propertyNames")
        pure = not node.props and not node.forbidden
        if patterns:  # (a key a pattern matches is not additional)
            if not pure or len(patterns) != 1 or names_schema is not None:
                return None, None
            (pattern, value), = patterns.items()
            if not isinstance(pattern, str):
                raise self.fail(path, "patternProperties names must be patterns")
            try:
                return self.node(value, f"{path}/patternProperties/{pattern}", depth + 1), \
                    self.string({"pattern": pattern}, f"{path}/patternProperties")
            except _Unsatisfiable:
                return None, None
        if extra is False:
            return None, None
        key: Node | None = None
        if names_schema is not None:
            ns = self.deref(names_schema, path)
            if ns is None or not pure or not set(self.constraining(ns)) <= {
                    "type", *_STRING_KEYS} or ns.get("type", "string") != "string":
                return None, None
            key = self.string(ns, f"{path}/propertyNames")
        if extra is None:
            if "properties" in s:
                return None, None  # llama.cpp: only the named properties
            return Node("any"), key
        try:
            return self.node(extra, f"{path}/additionalProperties", depth + 1), key
        except _Unsatisfiable:
            return None, None

    def property_counts(self, s: Mapping[str, Any], node: Node, path: str) -> None:
        lo = self.count(s, "minProperties", path, 0)
        hi = self.count(s, "maxProperties", path, UNBOUNDED)
        required = sum(r for _, _, r in node.props)
        if lo > required:
            # the first optional properties become required (extra keys cannot count
            # toward it: a repeated key is one member once parsed)
            for i, (name, sub, req) in enumerate(node.props):
                if not req and required < lo:
                    node.props[i] = (name, sub, True)
                    required += 1
            if required < lo:
                raise self.unsupported(path, "minProperties", f"{lo} is more than the "
                                       "properties the schema names")
        if hi == UNBOUNDED:
            return
        if required > hi:
            raise self.empty(path, f"maxProperties {hi}")
        budget = hi - required
        kept = []
        for prop in node.props:
            if prop[2] or budget > 0:
                budget -= not prop[2]
                kept.append(prop)
            else:
                node.forbidden.append(prop[0])
        node.props = kept
        if node.additional is not None:
            if budget == 0:
                node.additional = None
                node.key = None
            else:
                node.additional_max = budget

    # ------------------------------------------------------------------ arrays
    def array(self, s: Mapping[str, Any], path: str, depth: int) -> Node:
        lo = self.count(s, "minItems", path, 0)
        hi = self.count(s, "maxItems", path, UNBOUNDED)
        if hi != UNBOUNDED and lo > hi:
            raise self.fail(path, f"minItems {lo} exceeds maxItems {hi}")
        prefix = s.get("prefixItems", [])
        if not isinstance(prefix, list):
            raise self.fail(path, "prefixItems must be an array of schemas")
        items = s.get("items")
        key = "prefixItems" if "prefixItems" in s else "items"
        if "contains" in s:
            lo_c = self.count(s, "minContains", path, 1)
            hi_c = self.count(s, "maxContains", path, UNBOUNDED)
            if lo_c or hi_c != UNBOUNDED:
                # every item written matches contains: the count of matches is the length
                wanted = s["contains"]
                items = wanted if items is None else {"allOf": [items, wanted]}
                prefix = [{"allOf": [p, wanted]} for p in prefix]
                lo = max(lo, lo_c)
                hi = hi_c if hi == UNBOUNDED else hi if hi_c == UNBOUNDED else min(hi, hi_c)
                if hi != UNBOUNDED and lo > hi:
                    raise self.empty(path, "contains")
        unique = s.get("uniqueItems", False)
        if not isinstance(unique, bool):
            raise self.fail(path, "uniqueItems must be a boolean")
        if prefix:
            return self.prefixed(prefix, items, lo, hi, unique, f"{path}/{key}", depth)
        if items is None:
            item = Node("any")
        else:
            try:
                item = self.node(items, f"{path}/items", depth + 1)
            except _Unsatisfiable:
                if lo:
                    raise
                item, hi = Node("any"), 0
        node = Node("array", items=item, min_count=lo, max_count=hi)
        if unique and (hi == UNBOUNDED or hi > 1):
            values = self.distinct(item)
            if values is None or lo > 1 or hi != UNBOUNDED and hi < len(values):
                raise self.unsupported(path, "uniqueItems", "a grammar cannot keep items "
                                       "apart, except a few fixed values each written at "
                                       "most once")
            node.unique, node.values = True, values
        return node

    def distinct(self, item: Node) -> list[Any] | None:
        """The values of a finite item schema, without repeats (None: not finite)."""
        target = self.refs.get(item.ref) if item.kind == "ref" else item
        if target is None:
            return None
        values = [target.value] if target.kind == "const" else target.values \
            if target.kind == "enum" else [True, False] if target.kind == "boolean" \
            else [None] if target.kind == "null" else None
        if values is None or len(values) > 64:
            return None
        out: list[Any] = []
        for v in values:
            if not any(_json_equal(v, w) for w in out):
                out.append(v)
        return out

    def prefixed(self, prefix: list[Any], items: Any, lo: int, hi: int, unique: bool,
              path: str, depth: int) -> Node:
        node = Node("tuple", min_count=lo, max_count=hi)
        for i, sub in enumerate(prefix):
            if hi != UNBOUNDED and i >= hi:
                break
            try:
                node.children.append(self.node(sub, f"{path}/{i}", depth + 1))
            except _Unsatisfiable:
                if i < lo:
                    raise
                hi = node.max_count = i  # no value here: the array ends before it
                break
        n = len(node.children)
        more = hi == UNBOUNDED or hi > n
        if n < lo or (items is not None and more):
            # llama.cpp writes the prefix alone; more items where they must be, or where
            # items says what they are
            try:
                node.items = Node("any") if items is None else \
                    self.node(items, f"{path}/items", depth + 1)
            except _Unsatisfiable:
                if n < lo:
                    raise
        if unique and n + (0 if node.items is None else (
                UNBOUNDED if hi == UNBOUNDED else hi - n)) > 1:
            raise self.unsupported(path, "uniqueItems", "beside prefixItems")
        if not node.children:
            return Node("array", items=node.items or Node("any"), min_count=lo,
                        max_count=hi if node.items is not None else 0)
        return node

    # ------------------------------------------------------------------ strings, numbers
    def format(self, schema: Mapping[str, Any], path: str) -> str:
        if "format" not in schema:
            return ""
        fmt = schema["format"]
        if not isinstance(fmt, str):
            raise self.fail(path, "format must be a string")
        if fmt in ("date", "time", "date-time"):
            return fmt
        if fmt == "uuid" or (len(fmt) == 5 and fmt.startswith("uuid") and fmt[4] in "12345"):
            return "uuid"
        return ""

    def string(self, schema: Mapping[str, Any], path: str) -> Node:
        node = Node("string")
        if "pattern" in schema:
            pattern = schema["pattern"]
            if not isinstance(pattern, str):
                raise self.fail(path, "pattern must be a string")
            self.meter.pattern(path, pattern)
            node.pattern = pattern
        node.fmt = self.format(schema, path)
        node.min_count = self.count(schema, "minLength", path, 0)
        node.max_count = self.count(schema, "maxLength", path, UNBOUNDED)
        if node.max_count != UNBOUNDED and node.min_count > node.max_count:
            raise self.fail(path, f"minLength {node.min_count} exceeds maxLength "
                            f"{node.max_count}")
        lengths = node.min_count > 0 or node.max_count != UNBOUNDED
        if node.pattern and lengths:
            width = _pattern_width(node.pattern)
            if width is None or width[0] < node.min_count or \
                    node.max_count != UNBOUNDED and width[1] > node.max_count:
                raise self.unsupported(path, "minLength/maxLength", "beside a pattern that "
                                       "does not keep to them itself (a grammar here cannot "
                                       "count a pattern's characters)")
        if node.fmt and not node.pattern and lengths:
            short, long = _FORMAT_LENGTHS[node.fmt]
            if node.min_count > short or node.max_count != UNBOUNDED and node.max_count < long:
                raise self.unsupported(path, "minLength/maxLength", f"beside format "
                                       f"{node.fmt}, whose values are {short} to {long} long")
        return node

    def bound(self, schema: Mapping[str, Any], key: str, path: str) -> float | None:
        if key not in schema:
            return None
        value = schema[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(path, f"{key} must be a number")
        if isinstance(value, float) and not math.isfinite(value):
            raise self.fail(path, f"{key} must be finite")
        return value

    def int_bounds(self, schema: Mapping[str, Any], path: str) -> tuple[int | None, int | None]:
        """The integers the bounds admit: [lo, hi] (None: unbounded), the tighter of the
        inclusive and exclusive bound on each side."""
        lows = [math.ceil(v) if not excl else math.floor(v) + 1
                for key, excl in (("minimum", False), ("exclusiveMinimum", True))
                if (v := self.bound(schema, key, path)) is not None]
        highs = [math.floor(v) if not excl else math.ceil(v) - 1
                 for key, excl in (("maximum", False), ("exclusiveMaximum", True))
                 if (v := self.bound(schema, key, path)) is not None]
        return (max(lows) if lows else None), (min(highs) if highs else None)

    def integer(self, schema: Mapping[str, Any], path: str) -> Node:
        # an integer of more than 16 digits is beyond what the grammar writes anyway
        # (llama.cpp's integral-part): such a bound admits every integer it can write
        lo, hi = self.int_bounds(schema, path)
        if lo is not None and hi is not None and lo > hi:
            raise self.fail(path, "the integer bounds admit no value")
        if lo is not None and lo > INT64_MAX or hi is not None and hi < INT64_MIN:
            raise self.fail(path, "the integer bounds admit no value the grammar can write")
        step = self.multiple(schema, path)
        if step > 1:
            return self.multiples(step, lo, hi, path)
        node = Node("integer")
        if lo is not None and lo >= INT64_MIN:
            node.minimum = lo
        if hi is not None and hi <= INT64_MAX:
            node.maximum = hi
        return node

    def multiple(self, schema: Mapping[str, Any], path: str) -> int:
        """The integer k of ``multipleOf`` for the integers written (1: every integer)."""
        value = self.bound(schema, "multipleOf", path)
        if value is None:
            return 1
        if value <= 0:
            raise self.fail(path, "multipleOf must be greater than 0")
        if float(value).is_integer():
            return int(value)
        inverse = 1 / value
        if inverse.is_integer() and int(inverse) & (int(inverse) - 1) == 0:
            return 1  # 1/2^n: every integer, exactly in floating point too
        raise self.unsupported(path, "multipleOf", f"{value} (only whole multiples, or "
                               "1/2^n of integers, are written)")

    def multiples(self, step: int, lo: int | None, hi: int | None, path: str) -> Node:
        if lo is not None and hi is not None:
            first, last = -(-lo // step), hi // step
            if first > last:
                raise self.empty(path, f"multipleOf {step} within the bounds")
            if last - first >= self.limits.max_enum:
                raise self.unsupported(path, "multipleOf", f"{step} with bounds that admit "
                                       f"more than {self.limits.max_enum} multiples")
            return Node("enum", values=[k * step for k in range(first, last + 1)])
        if _power_of_ten_over(step) is None:
            raise self.unsupported(path, "multipleOf", f"{step} without both bounds (only "
                                   "divisors of a power of ten, like 2, 5, 25 or 100, are "
                                   "written unbounded)")
        signs = ("+" if hi is None and (lo is None or lo <= step) else "") + \
            ("0" if (lo is None or lo <= 0) and (hi is None or hi >= 0) else "") + \
            ("-" if lo is None and (hi is None or hi >= -step) else "")
        if not signs:
            raise self.unsupported(path, "multipleOf", f"{step} with a bound beyond its "
                                   "first multiple and none on the other side")
        return Node("integer", multiple=step, signs=signs)

    def number(self, schema: Mapping[str, Any], path: str) -> Node:
        if "multipleOf" in schema:
            # the integers among the multiples (a subset where fractions were allowed)
            return self.integer(schema, path)
        lo = hi = None
        lo_excl = hi_excl = False
        for key, excl in (("minimum", False), ("exclusiveMinimum", True)):
            v = self.bound(schema, key, path)
            if v is not None and (lo is None or v > lo or v == lo and excl):
                lo, lo_excl = v, excl
        for key, excl in (("maximum", False), ("exclusiveMaximum", True)):
            v = self.bound(schema, key, path)
            if v is not None and (hi is None or v < hi or v == hi and excl):
                hi, hi_excl = v, excl
        if lo is None and hi is None:
            return Node("number")
        limit = 10**15
        if lo is not None and abs(lo) >= limit or hi is not None and abs(hi) >= limit:
            raise self.fail(path, f"number bounds must be within ±{limit}")
        return Node("number", bounds=(lo, lo_excl, hi, hi_excl))


def _dump(value: Any) -> str:
    """A JSON value as llama.cpp's JSON library writes it: compact, UTF-8 as is."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _literal(text: str) -> str:
    return '"' + "".join(_LITERAL_ESCAPES.get(c, c) for c in text) + '"'


# ---------------------------------------------------------------------------- the grammar
def _repetition(item: str, lo: int, hi: int, separator: str = "") -> str:
    """``item`` lo..hi times (hi UNBOUNDED: no maximum), separated by ``separator``."""
    if hi == 0:
        return ""
    if lo == 0 and hi == 1:
        return f"{item}?"
    if not separator:
        if hi == UNBOUNDED:
            if lo == 1:
                return f"{item}+"
            if lo == 0:
                return f"{item}*"
        return f"{item}{{{lo},{'' if hi == UNBOUNDED else hi}}}"
    rest = _repetition(f"({separator} {item})", max(lo - 1, 0),
                       hi - 1 if hi != UNBOUNDED else UNBOUNDED)
    result = f"{item} {rest}"
    return f"({result})?" if lo == 0 else result


def _min_max_int(lo: int | None, hi: int | None, out: list[str], decimals: int = 16,
                 top: bool = True) -> None:
    """The integers in [lo, hi] (None: unbounded on that side), digits as llama.cpp's
    ``build_min_max_int`` writes them."""

    def digit_range(a: str, b: str) -> None:
        out.append(f"[{a}]" if a == b else f"[{a}-{b}]")

    def more_digits(lo_d: int, hi_d: int | None) -> None:
        out.append("[0-9]")
        if lo_d == hi_d == 1:
            return
        out.append("{" + str(lo_d))
        if hi_d != lo_d:
            out.append("," + ("" if hi_d is None else str(hi_d)))
        out.append("}")

    def uniform(a: str, b: str) -> None:
        i = 0
        while i < len(a) and i < len(b) and a[i] == b[i]:
            i += 1
        if i > 0:
            out.append(f'"{a[:i]}"')
        if i < len(a) and i < len(b):
            if i > 0:
                out.append(" ")
            sub = len(a) - i - 1
            if sub > 0:
                a_rest, b_rest = a[i + 1:], b[i + 1:]
                zeros, nines = "0" * sub, "9" * sub
                reached = False
                out.append("(")
                if a_rest == zeros:
                    digit_range(a[i], chr(ord(b[i]) - 1))
                    out.append(" ")
                    more_digits(sub, sub)
                else:
                    out.append(f"[{a[i]}] (")
                    uniform(a_rest, nines)
                    out.append(")")
                    if ord(a[i]) < ord(b[i]) - 1:
                        out.append(" | ")
                        if b_rest == nines:
                            digit_range(chr(ord(a[i]) + 1), b[i])
                            reached = True
                        else:
                            digit_range(chr(ord(a[i]) + 1), chr(ord(b[i]) - 1))
                        out.append(" ")
                        more_digits(sub, sub)
                if not reached:
                    out.append(" | ")
                    digit_range(b[i], b[i])
                    out.append(" ")
                    uniform(zeros, b_rest)
                out.append(")")
            else:
                out.append(f"[{a[i]}-{b[i]}]")

    if lo is not None and hi is not None:
        if lo < 0 and hi < 0:
            out.append('"-" (')
            _min_max_int(-hi, -lo, out, decimals, True)
            out.append(")")
            return
        if lo < 0:
            out.append('"-" (')
            _min_max_int(0, -lo, out, decimals, True)
            out.append(") | ")
            lo = 0
        lo_s, hi_s = str(lo), str(hi)
        for digits in range(len(lo_s), len(hi_s)):
            uniform(lo_s, "9" * digits)
            lo_s = "1" + "0" * digits
            out.append(" | ")
        uniform(lo_s, hi_s)
        return
    less = max(decimals - 1, 1)
    if lo is not None:
        if lo < 0:
            out.append('"-" (')
            _min_max_int(None, -lo, out, decimals, False)
            out.append(") | [0] | [1-9] ")
            more_digits(0, decimals - 1)
        elif lo == 0:
            if top:
                out.append("[0] | [1-9] ")
                more_digits(0, less)
            else:
                more_digits(1, decimals)
        elif lo <= 9:
            c = str(lo)
            start = "1" if top else "0"
            if c > start:
                digit_range(start, chr(ord(c) - 1))
                out.append(" ")
                more_digits(1, less)
                out.append(" | ")
            digit_range(c, "9")
            out.append(" ")
            more_digits(0, less)
        else:
            s = str(lo)
            c = s[0]
            start = "1" if top else "0"
            # llama.cpp tests c > "1" here even below the top, where a leading 0 is a digit
            # like any other: minimum 110 lost 10000000 (its "10" had no shorter-start
            # branch)
            if c > start:
                digit_range(start, chr(ord(c) - 1))
                out.append(" ")
                more_digits(len(s), less)
                out.append(" | ")
            digit_range(c, c)
            out.append(" (")
            if s[1] == "0":
                # llama.cpp recurses on int(s[1:]) here, which drops the leading zeros
                # and admits too-short numbers (minimum 105 took 15): the remaining digits
                # are as many as s[1:] and at least it, or more of them
                uniform(s[1:], "9" * (len(s) - 1))
                out.append(" | ")
                more_digits(len(s), max(less, len(s)))
            else:
                _min_max_int(int(s[1:]), None, out, less, False)
            out.append(")")
            if c < "9":
                out.append(" | ")
                digit_range(chr(ord(c) + 1), "9")
                out.append(" ")
                more_digits(len(s) - 1, less)
        return
    if hi is not None:
        if hi >= 0:
            if top:
                out.append('"-" [1-9] ')
                more_digits(0, less)
                out.append(" | ")
            _min_max_int(0, hi, out, decimals, True)
        else:
            out.append('"-" (')
            _min_max_int(-hi, None, out, decimals, False)
            out.append(")")
        return
    raise ValueError("at least one of lo or hi must be set")


def _int_range(lo: int | None, hi: int | None) -> str:
    out: list[str] = []
    _min_max_int(lo, hi, out)
    return "".join(out)


class _Trie:
    def __init__(self, words: Sequence[str]) -> None:
        self.children: dict[str, _Trie] = {}
        self.end = False
        for w in words:
            node = self
            for ch in w:
                node = node.children.setdefault(ch, _Trie(()))
            node.end = True


class _Writer:
    """``Node``s into GBNF rules, named and ordered as llama.cpp names and orders them."""

    def __init__(self, reader: _Reader) -> None:
        self.refs = reader.refs
        self.meter = reader.meter
        self.rules: dict[str, str] = {"space": SPACE_RULE}
        self.resolving: set[str] = set()
        self.errors: list[str] = []
        self.size = len(SPACE_RULE)

    def add(self, name: str, rule: str) -> str:
        key = _INVALID_RULE_CHARS.sub("-", name)
        if key in self.rules and self.rules[key] != rule:
            i = 0
            while f"{key}{i}" in self.rules and self.rules[f"{key}{i}"] != rule:
                i += 1
            key = f"{key}{i}"
        if key not in self.rules:
            self.size += len(key) + len(rule) + 6
            self.meter.rule(len(self.rules), self.size)
        self.rules[key] = rule
        return key

    def primitive(self, name: str, rule: tuple[str, tuple[str, ...]]) -> str:
        key = self.add(name, rule[0])
        for dep in rule[1]:
            dep_rule = PRIMITIVES.get(dep) or STRING_FORMATS.get(dep)
            if dep_rule is None:
                self.errors.append(f"Rule {dep} not known")
            elif dep not in self.rules:
                self.primitive(dep, dep_rule)
        return key

    def visit(self, node: Node, name: str) -> str:
        rule_name = f"{name}-" if name in _RESERVED else (name or "root")
        sub = f"{name}-" if name else ""
        kind = node.kind
        if kind == "ref":
            return self.add(rule_name, self.resolve(node.ref))
        if kind == "anyOf":
            alts = [self.visit(c, f"{name}{'-' if name else 'alternative-'}{i}")
                    for i, c in enumerate(node.children)]
            return self.add(rule_name, " | ".join(alts))
        if kind == "allOf":
            return self.all_of(node, name, rule_name)
        if kind == "const":
            return self.add(rule_name, _literal(_dump(node.value)))
        if kind == "enum":
            return self.add(rule_name, "(" + " | ".join(
                _literal(_dump(v)) for v in node.values) + ")")
        if kind == "object":
            if not node.props and node.additional is not None and \
                    node.additional.kind == "any" and node.key is None and \
                    not node.forbidden and node.additional_max == UNBOUNDED:
                return self.add(rule_name, self.primitive("object", PRIMITIVES["object"]))
            return self.add(rule_name, self.object_rule(
                node.props, node.additional, name, node.key, node.forbidden,
                node.additional_max))
        if kind == "tuple":
            parts = [self.visit(c, f"{sub}tuple-{i}") for i, c in enumerate(node.children)]
            rule = '"[" space ' + ' "," space '.join(parts)
            if node.items is not None:
                n = len(parts)
                item = self.visit(node.items, f"{sub}tuple-items")
                more = _repetition(f'("," space {item})', max(node.min_count - n, 0),
                                   UNBOUNDED if node.max_count == UNBOUNDED
                                   else node.max_count - n)
                rule += f" {more}" if more else ""
            return self.add(rule_name, rule + ' space "]"')
        if kind == "array":
            assert node.items is not None
            if node.unique:
                return self.add(rule_name, self.unique_items(node, sub))
            if node.items.kind == "any" and node.min_count == 0 and \
                    node.max_count == UNBOUNDED:
                return self.primitive_named(rule_name, "array")
            item = self.visit(node.items, f"{sub}item")
            return self.add(rule_name, '"[" space ' + _repetition(
                item, node.min_count, node.max_count, '"," space') + ' space "]"')
        if kind == "string":
            if node.pattern:
                return self.pattern(node.pattern, rule_name)
            if node.fmt == "uuid":
                return self.primitive_named(rule_name, "uuid")
            if node.fmt:
                prim = f"{node.fmt}-string"
                return self.add(rule_name, self.primitive(prim, STRING_FORMATS[prim]))
            if node.min_count > 0 or node.max_count != UNBOUNDED:
                char = self.primitive("char", PRIMITIVES["char"])
                return self.add(rule_name, '"\\"" ' + _repetition(
                    char, node.min_count, node.max_count) + ' "\\""')
            return self.primitive_named(rule_name, "string")
        if kind == "integer":
            if node.multiple > 1:
                return self.add(rule_name, self.multiples(node))
            if node.minimum == INT64_MIN and node.maximum == INT64_MAX:
                return self.primitive_named(rule_name, "integer")
            lo = None if node.minimum == INT64_MIN else node.minimum
            hi = None if node.maximum == INT64_MAX else node.maximum
            return self.add(rule_name, f"({_int_range(lo, hi)})")
        if kind == "number":
            if node.bounds is None:
                return self.primitive_named(rule_name, "number")
            return self.add(rule_name, self.bounded_number(node.bounds))
        if kind in ("boolean", "null"):
            return self.primitive_named(rule_name, kind)
        # any
        return self.add(rule_name, self.primitive("value", PRIMITIVES["value"]))

    def primitive_named(self, rule_name: str, kind: str) -> str:
        return self.primitive("root" if rule_name == "root" else kind, PRIMITIVES[kind])

    def resolve(self, ref: str) -> str:
        fragment = ref.split("#", 1)[1] if "#" in ref else ref
        name = "ref" + _INVALID_RULE_CHARS.sub("-", fragment)
        if name not in self.rules and ref not in self.resolving:
            target = self.refs.get(ref)
            if target is None:
                self.errors.append(f"Unresolved $ref {ref}")
                return ""
            self.resolving.add(ref)
            name = self.visit(target, name)
            self.resolving.discard(ref)
        return name

    def all_of(self, node: Node, name: str, rule_name: str) -> str:
        if len(node.children) == 1:
            # allOf: [X] is X (pydantic's way to annotate a $ref); llama.cpp merges it as
            # an object, which writes {} for a lone string or integer
            return self.add(rule_name, self.visit(node.children[0], f"{name}{'-' if name else ''}"
                                                  "all-of-0"))
        for child in node.children:
            target = self.refs.get(child.ref) if child.kind == "ref" else child
            if target is None or target.kind not in ("object", "enum", "anyOf") or \
                    target.kind == "anyOf" and any(
                        (b := self.refs.get(a.ref) if a.kind == "ref" else a) is None
                        or b.kind != "object"
                        for a in target.children):
                # llama.cpp merges only objects and enums (and ignores the rest, which
                # breaks the schema): refuse what the merge cannot keep
                raise GrammarError("allOf of several schemas is supported for objects and "
                                   "enums only")
        required: set[str] = set()
        props: list[tuple[str, Node, bool]] = []
        enum_counts: dict[str, int] = {}

        def add_component(comp: Node, is_required: bool) -> None:
            if comp.kind == "ref":
                target = self.refs.get(comp.ref)
                if target is not None:
                    add_component(target, is_required)
            elif comp.kind == "object":
                for prop_name, prop, _ in comp.props:
                    props.append((prop_name, prop, False))
                    if is_required:
                        required.add(prop_name)
            elif comp.kind == "enum":
                for v in comp.values:
                    lit = _literal(_dump(v))
                    enum_counts[lit] = enum_counts.get(lit, 0) + 1

        for child in node.children:
            if child.kind == "anyOf":
                for alt in child.children:
                    add_component(alt, False)
            else:
                add_component(child, True)
        if enum_counts:
            common = [lit for lit, n in sorted(enum_counts.items()) if n == len(node.children)]
            if common:
                return self.add(rule_name, "(" + " | ".join(common) + ")")
        props = [(n, p, n in required) for n, p, _ in props]
        return self.add(rule_name, self.object_rule(props, None, name))

    def unique_items(self, node: Node, sub: str) -> str:
        """Distinct items from a few fixed values: each at most once, in the schema's
        order (``tail-i``: the values after the i-th, each optional)."""
        lits = [_literal(_dump(v)) for v in node.values]
        tails = [""] * (len(lits) + 1)
        for i in range(len(lits) - 1, 0, -1):
            tails[i] = self.add(f"{sub}unique-{i}", f'( "," space {lits[i]} )?'
                                + (f" {tails[i + 1]}" if tails[i + 1] else ""))
        first = " | ".join(f"{lit} {tails[i + 1]}".rstrip() for i, lit in enumerate(lits))
        return f'"[" space ( {first} ){"" if node.min_count else "?"} space "]"'

    def multiples(self, node: Node) -> str:
        """The integers of at most 16 digits (llama.cpp's integral-part) divisible by
        ``node.multiple`` = k, which divides 10^d: those below 10^d one by one, the
        others as any digits then a d-digit ending divisible by k."""
        k = node.multiple
        d = _power_of_ten_over(k)
        assert d is not None
        endings = " | ".join(f'"{e:0{d}d}"' for e in range(0, 10**d, k))
        small = [f'"{m}"' for m in range(k, 10**d, k)]
        positive = f"({' | '.join([*small, f'[1-9] [0-9]{{0,{15 - d}}} ({endings})'])})"
        alts = [{"+": positive, "0": '"0"', "-": f'"-" {positive}'}[s] for s in node.signs]
        return " | ".join(alts)

    def object_rule(self, props: list[tuple[str, Node, bool]], additional: Node | None,
                    name: str, key_node: Node | None = None, forbidden: Sequence[str] = (),
                    additional_max: int = UNBOUNDED) -> str:
        sep = "-" if name else ""
        kv: dict[str, str] = {}
        required: list[str] = []
        optional: list[str] = []
        names: list[str] = []
        for prop_name, prop, is_required in props:
            # (a property named "" of the root would name its value's rule root)
            value = self.visit(prop, f"{name}{sep}{prop_name or '-'}")
            kv[prop_name] = self.add(f"{name}{sep}{prop_name}-kv",
                                     f'{_literal(_dump(prop_name))} space ":" space {value}')
            (required if is_required else optional).append(prop_name)
            names.append(prop_name)
        if additional is not None:
            sub = f"{name}{sep}additional"
            value = self.visit(additional, f"{sub}-value") if additional.kind != "any" \
                else self.primitive("value", PRIMITIVES["value"])
            others = names + [n for n in dict.fromkeys(forbidden) if n not in names]
            key = self.visit(key_node, f"{sub}-k") if key_node is not None \
                else self.primitive("string", PRIMITIVES["string"]) if not others \
                else self.add(f"{sub}-k", self.not_strings(others))
            kv["*"] = self.add(f"{sub}-kv", f'{key} ":" space {value}')
            optional.append("*")
        if not required and not optional:
            return '"{" space "}"'
        rule = '"{" space ' + ' "," space '.join(kv[k] for k in required)
        if optional:
            rule += " ("
            if required:
                rule += ' "," space ( '

            def chain(keys: list[str], first_optional: bool) -> str:
                k = keys[0]
                comma = f'( "," space {kv[k]} )'
                if k == "*" and additional_max != UNBOUNDED:
                    res = _repetition(comma, 0, additional_max) if first_optional else \
                        f"{kv[k]} {_repetition(comma, 0, additional_max - 1)}".rstrip()
                elif first_optional:
                    res = comma + ("*" if k == "*" else "?")
                else:
                    res = kv[k] + (f" {comma}*" if k == "*" else "")
                if len(keys) > 1:
                    res += " " + self.add(f"{name}{sep}{k}-rest", chain(keys[1:], True))
                return res

            rule += " | ".join(chain(optional[i:], False) for i in range(len(optional)))
            if required:
                rule += " )"
            rule += " )?"
        return rule + ' space "}"'

    def not_strings(self, words: Sequence[str]) -> str:
        """A JSON string that is none of ``words``. The trie matches characters as they
        are written, so the string leaves it only by a character written raw (after that,
        escapes cannot spell a word). A word JSON must escape (a quote, a backslash, a
        control character) has no raw spelling: with such words the string is written
        without escapes at all."""
        plain = any(c in _JSON_UNSAFE for w in words for c in w)
        if plain:
            words = [w for w in words if not any(c in _JSON_UNSAFE for c in w)]
            char = self.add("plain-char", _DOT)
            if not words:
                return f'"\\"" {char}* "\\""'
        else:
            char = self.primitive("char", PRIMITIVES["char"])
        trie = _Trie(words)
        out = ['["] ( ']

        def walk(node: _Trie) -> None:
            rejects = ""
            for i, (c, child) in enumerate(sorted(node.children.items())):
                rejects += _class_char(c)
                if i:
                    out.append(" | ")
                out.append(f"[{_class_char(c)}]")
                if child.children:
                    out.append(" (")
                    walk(child)
                    out.append(")")
                else:
                    out.append(f" {char}+")
            if node.children:
                # llama.cpp's [^"{rejects}] let a key go on with a raw control character
                # or a bare backslash (not JSON), or with an escape spelling a name
                out.append(f' | [^{_JSON_UNSAFE_CLASS}{rejects}] {char}*')

        walk(trie)
        out.append(" )")
        if not trie.end:
            out.append("?")
        out.append(' ["]')
        return "".join(out)

    def bounded_number(self, bounds: tuple[float | None, bool, float | None, bool]) -> str:
        """A subset of the numbers within the bounds that the grammar can write exactly:
        an integer in range, or ``I.ddd`` (a nonzero fraction) strictly between two
        integers in range; no exponent."""
        lo, lo_excl, hi, hi_excl = bounds
        # integers in range
        int_lo = None if lo is None else (math.floor(lo) + 1 if lo_excl and lo == math.floor(lo)
                                          else math.ceil(lo))
        int_hi = None if hi is None else (math.ceil(hi) - 1 if hi_excl and hi == math.ceil(hi)
                                          else math.floor(hi))
        # whole parts I with (I, I + 1) inside the bounds, and with (-(I + 1), -I) inside
        whole_lo = None if lo is None else math.ceil(lo)
        whole_hi = None if hi is None else math.floor(hi)
        frac = self.add("nonzero-fraction", '"." [0-9]{0,15} [1-9]')
        alts: list[str] = []
        if int_lo is None or int_hi is None or int_lo <= int_hi:
            alts.append(f"({_int_range(int_lo, int_hi)})")
        pos_lo = 0 if whole_lo is None else max(whole_lo, 0)
        pos_hi = None if whole_hi is None else whole_hi - 1
        if pos_hi is None or pos_lo <= pos_hi:
            alts.append(f"({_int_range(pos_lo, pos_hi)}) {frac}")
        neg_lo = 0 if whole_hi is None else max(0, -whole_hi)
        neg_hi = None if whole_lo is None else -whole_lo - 1
        if neg_hi is None or neg_lo <= neg_hi:
            alts.append(f'"-" ({_int_range(neg_lo, neg_hi)}) {frac}')
        if not alts:
            raise GrammarError("the number bounds admit no value")
        return "(" + " | ".join(alts) + ")"

    # ------------------------------------------------------------------ patterns
    def pattern(self, pattern: str, name: str) -> str:
        saved = dict(self.rules)
        try:
            return self.pattern_rule(pattern, name)
        except _Unsupported as exc:
            # llama.cpp accepts any string here, which breaks the schema: refused instead
            self.rules = saved
            self.errors.append(f"pattern {pattern} is not supported ({exc})")
            return ""
        except _InvalidPattern as exc:
            self.rules = saved
            self.errors.append(f"Invalid pattern {pattern}: {exc}")
            return ""

    def pattern_rule(self, pattern: str, name: str) -> str:
        # JSON Schema patterns search: an unanchored side matches anything there
        head = pattern.startswith("^")
        tail = pattern.endswith("$") and not pattern.endswith("\\$") and len(pattern) > int(head)
        sub = pattern[int(head):len(pattern) - int(tail)]
        if not (head and tail):
            sub = (".*" if not head else "") + (f"(?:{sub})" if sub else "") + \
                (".*" if not tail else "")
        sub_ids: dict[str, str] = {}
        state = {"i": 0, "depth": 0}
        n = len(sub)

        def to_rule(item: tuple[str, bool]) -> str:
            return f'"{item[0]}"' if item[1] else item[0]

        def transform() -> tuple[str, bool]:
            seq: list[tuple[str, bool]] = []

            def join() -> tuple[str, bool]:
                merged: list[tuple[str, bool]] = []
                literal = ""
                for text, is_lit in seq:
                    if is_lit:
                        literal += text
                    else:
                        if literal:
                            merged.append((literal, True))
                            literal = ""
                        merged.append((text, False))
                if literal:
                    merged.append((literal, True))
                return " ".join(to_rule(m) for m in merged), False

            while state["i"] < n:
                i = state["i"]
                c = sub[i]
                if c == ".":
                    seq.append((self.add("dot", _DOT), False))
                    state["i"] = i + 1
                elif c == "(":
                    i += 1
                    if i < n and sub[i] == "?":
                        if i + 1 < n and sub[i + 1] == ":":
                            i += 2
                        else:
                            raise _Unsupported("unsupported group syntax")
                    state["i"] = i
                    state["depth"] += 1
                    if state["depth"] > MAX_PATTERN_DEPTH:
                        raise _Unsupported("pattern nesting too deep")
                    seq.append((f"({to_rule(transform())})", False))
                elif c == ")":
                    state["i"] = i + 1
                    if state["depth"] == 0:
                        raise _InvalidPattern("unbalanced parentheses")
                    state["depth"] -= 1
                    return join()
                elif c in "^$":
                    raise _Unsupported("anchor inside the pattern")
                elif c == "[":
                    chars = "["
                    i += 1
                    negated = i < n and sub[i] == "^"
                    while i < n and sub[i] != "]":
                        if sub[i] == "\\":
                            if sub[i:i + 2] in _CLASS_SHORTHANDS:
                                chars += _CLASS_SHORTHANDS[sub[i:i + 2]]
                                i += 2
                                continue
                            k = _escape_length(sub, i)
                            if k == 0:
                                raise _Unsupported(
                                    f"unsupported escape in character class: {sub[i:i + 2]}")
                            chars += _json_safe_escape(sub[i:i + k])
                            i += k
                        else:
                            if sub[i] in _JSON_UNSAFE:
                                raise _Unsupported("a quote or control character in a class")
                            chars += sub[i]
                            i += 1
                    if i >= n:
                        raise _InvalidPattern("unterminated character class")
                    # the class is written raw inside a JSON string: a negated one must
                    # not let the model write a bare quote, backslash or control character
                    seq.append((chars + (_JSON_UNSAFE_CLASS if negated else "") + "]", False))
                    state["i"] = i + 1
                elif c == "|":
                    seq.append(("|", False))
                    state["i"] = i + 1
                elif sub[i:i + 2] in _SHORTHANDS:
                    seq.append((_SHORTHANDS[sub[i:i + 2]], False))
                    state["i"] = i + 2
                elif c in "*+?":
                    if not seq:
                        raise _InvalidPattern("nothing to repeat")
                    seq[-1] = (to_rule(seq[-1]) + c, False)
                    state["i"] = i + 1
                elif c == "{":
                    j = sub.find("}", i + 1)
                    if j < 0:
                        raise _Unsupported("unterminated curly brackets")
                    nums = sub[i + 1:j].split(",")
                    state["i"] = j + 1
                    if len(nums) not in (1, 2):
                        raise _Unsupported("wrong number of values in curly brackets")
                    lo, hi = _brace_counts(nums)
                    self.meter.pattern_repetition(sub[i + 1:j], lo, hi)
                    if not seq:
                        raise _InvalidPattern("nothing to repeat")
                    text, is_lit = seq[-1]
                    if not is_lit:
                        if text not in sub_ids:
                            sub_ids[text] = self.add(f"{name}-{len(sub_ids) + 1}", text)
                        text = sub_ids[text]
                    seq[-1] = (_repetition(f'"{text}"' if is_lit else text, lo, hi), False)
                else:
                    literal = ""
                    while i < n:
                        ch = sub[i]
                        if ch == "\\":
                            if i == n - 1:
                                raise _InvalidPattern("trailing backslash")
                            nxt = sub[i + 1]
                            if sub[i:i + 2] in _SHORTHANDS:
                                break  # \d and friends are classes: the next round's
                            if nxt in _ESCAPED_IN_REGEX_ONLY:
                                literal += nxt
                                i += 2
                            else:
                                k = _escape_length(sub, i)
                                if k == 0:
                                    raise _Unsupported(f"unsupported escape: {sub[i:i + 2]}")
                                literal += _json_safe_escape(sub[i:i + k])
                                i += k
                        elif ch in _JSON_UNSAFE:
                            raise _Unsupported("a quote or control character (JSON escapes "
                                               "are not written by the grammar)")
                        elif ch not in _NON_LITERAL and (
                                i == n - 1 or not literal or sub[i + 1] == "."
                                or sub[i + 1] not in _NON_LITERAL):
                            literal += ch
                            i += 1
                        else:
                            break
                    state["i"] = i
                    if not literal:
                        raise _Unsupported(f"unsupported character: {c}")
                    seq.append((literal, True))
            return join()

        rule = to_rule(transform())
        if state["depth"] != 0:
            raise _InvalidPattern("unbalanced parentheses")
        return self.add(name, f'"\\"" ({rule}) "\\""')

    def text(self) -> str:
        self.meter.expanded(self.rules.values())
        return "".join(f"{k} ::= {v}\n" for k, v in sorted(self.rules.items()))


# A regex's characters are written raw inside the JSON string: a quote, a backslash or a
# control character there would end or break the string, so the grammar never writes one
# from a pattern (llama.cpp does).
_JSON_UNSAFE = frozenset('"\\') | frozenset(chr(c) for c in range(0x20)) | {"\x7f"}
_JSON_UNSAFE_CLASS = '"\\\\\\x00-\\x1F\\x7F'
_DOT = '[^"\\\\\\x00-\\x1F\\x7F]'
# regex shorthands llama.cpp does not read (it accepts any string instead)
_SHORTHANDS = {"\\d": "[0-9]", "\\w": "[a-zA-Z0-9_]", "\\s": "[ ]",
               "\\D": "[^0-9" + _JSON_UNSAFE_CLASS + "]",
               "\\W": "[^a-zA-Z0-9_" + _JSON_UNSAFE_CLASS + "]",
               "\\S": "[^ \\t\\n\\r" + _JSON_UNSAFE_CLASS + "]"}
_CLASS_SHORTHANDS = {"\\d": "0-9", "\\w": "a-zA-Z0-9_", "\\s": " "}


def _class_char(c: str) -> str:
    """A character inside a GBNF class, escaped where the class syntax would read it."""
    return f"\\x{ord(c):02X}" if c in '[]\\^-"' or ord(c) < 0x20 or c == "\x7f" else c


def _json_safe_escape(escape: str) -> str:
    """A GBNF escape from a pattern, refused where it names a character the JSON string
    cannot hold raw (a quote, a backslash, a control character)."""
    if escape in ('\\"', "\\\\", "\\n", "\\r", "\\t"):
        raise _Unsupported(f"the escape {escape} (JSON escapes are not written by the grammar)")
    if escape[1] in "xuU" and int(escape[2:], 16) in {*range(0x20), 0x22, 0x5C, 0x7F}:
        raise _Unsupported(f"the escape {escape} (a character JSON must escape)")
    return escape


class _Unsupported(Exception):
    """A valid regex with no grammar equivalent: any string instead, as llama.cpp."""


class _InvalidPattern(Exception):
    """Not a regex at all."""


def _escape_length(pattern: str, pos: int) -> int:
    """Length of the GBNF escape at ``pos`` (``\\x41``, ``\\n``, ...), 0 if it is none."""
    if pos + 1 >= len(pattern) or pattern[pos] != "\\":
        return 0
    kind = pattern[pos + 1]
    if kind in 'trn\\"[]-':
        return 2
    digits = {"x": 2, "u": 4, "U": 8}.get(kind, 0)
    if not digits or pos + 2 + digits > len(pattern):
        return 0
    hexdigits = pattern[pos + 2:pos + 2 + digits]
    return 2 + digits if all(h in "0123456789abcdefABCDEF" for h in hexdigits) else 0


def _brace_counts(nums: list[str]) -> tuple[int, int]:
    def num(text: str) -> int:
        text = text.strip()
        if not re.fullmatch(r"\+?\d+", text):
            raise _Unsupported("invalid number in curly brackets")
        return int(text)

    if len(nums) == 1:
        n = num(nums[0])
        return n, n
    lo = num(nums[0]) if nums[0] else 0
    hi = num(nums[1]) if nums[1] else UNBOUNDED
    return lo, hi


def _finite(root: Node, refs: Mapping[str, Node | None]) -> bool:
    """Whether some value is finite: a grammar without one never lets the model finish
    (and llama.cpp refuses the left-recursive ones). The $refs' finiteness is found by
    iterating to a fixed point."""
    known: dict[str, bool] = {}

    def finite(node: Node) -> bool:
        kind = node.kind
        if kind == "ref":
            return known.get(node.ref, False)
        if kind == "anyOf":
            return any(finite(c) for c in node.children)
        if kind in ("allOf", "tuple"):
            return all(finite(c) for c in node.children) and (
                node.items is None or node.min_count <= len(node.children)
                or finite(node.items))
        if kind == "object":
            return all(finite(p) for _, p, required in node.props if required)
        if kind == "array" and node.items is not None and not node.unique:
            return node.min_count == 0 or finite(node.items)
        return True

    changed = True
    while changed:
        changed = False
        for ref, target in refs.items():
            if not known.get(ref) and target is not None and finite(target):
                known[ref] = changed = True
    return finite(root)


# ---------------------------------------------------------------------------- entry points
def schema_to_gbnf(schema: Any, limits: GrammarLimits = DEFAULT_LIMITS) -> str:
    """GBNF for the JSON texts that validate against ``schema``, as llama-server builds
    it. ``GrammarError`` for a schema that cannot become a grammar, ``SchemaLimitError``
    for one over ``limits``."""
    reader = _Reader(schema, LimitsMeter(limits))
    try:
        root = reader.node(schema, "#", 0)
        if not _finite(root, reader.refs):
            raise GrammarError("JSON schema error at #: the schema has no finite value (a "
                               "$ref cycle every value must go round forever)")
        writer = _Writer(reader)
        writer.visit(root, "")
    except RecursionError as exc:  # pragma: no cover - max_depth keeps far from it
        raise LimitsMeter.too_deep() from exc
    if writer.errors:
        raise GrammarError("JSON schema conversion failed: " + "; ".join(writer.errors))
    return writer.text()


def int_range_rule(lo: int | None, hi: int | None) -> str:
    """The GBNF alternatives for the integers in [lo, hi] (a bench and test aid)."""
    return _int_range(lo, hi)
