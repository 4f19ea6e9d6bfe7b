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

* **Bounds** (``GrammarLimits``): every schema is measured while it is read and refused
  (``SchemaLimitError``, a 400 naming the limit) before anything is built when it is
  too deep, too large, repeats too much or takes too long; see ``DEFAULT_LIMITS`` for the
  figures and why. Nothing a client sends reaches llama.cpp's grammar parser in a shape
  that can exhaust its stack or its time.
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
* **allOf** of one schema is that schema; of several, only objects and enums are merged
  (as llama.cpp does), anything else is refused (llama.cpp writes ``{}`` for it).
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
UNBOUNDED = -1  # a count without a maximum (maxItems / maxLength absent)

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


class GrammarError(ValueError):
    """A grammar that does not compile, a schema that cannot become one, or a token the
    grammar cannot take."""


class SchemaLimitError(GrammarError):
    """A schema over one of ``GrammarLimits``: ``limit`` names it."""

    def __init__(self, message: str, limit: str) -> None:
        super().__init__(message)
        self.limit = limit


@dataclass(frozen=True)
class GrammarLimits:
    """What one request's schemas may ask for. The defaults leave room for what real agents
    send (coding agents' tool lists: a few dozen tools of up to ~20 parameters, enums of a
    few dozen values, string lengths in the hundreds or low thousands) and keep the worst
    grammar they admit to milliseconds of conversion and compilation (BENCHMARKS.md, the
    grammar bounds section)."""

    max_depth: int = 32  # nested schemas (objects in arrays in objects ...), $ref hops included
    max_nodes: int = 4_000  # schemas read in all (each property, item, alternative)
    max_properties: int = 256  # properties of one object
    max_enum: int = 1_000  # values of one enum
    max_literal_bytes: int = 16_384  # one const / enum value, as JSON
    max_repetition: int = 1_000  # minLength/maxLength/minItems/maxItems and {m,n} in patterns
    max_pattern_chars: int = 2_000
    max_rules: int = 5_000
    max_grammar_bytes: int = 131_072
    # llama.cpp expands x{m,n} into n rules when it parses the grammar: the sum over the
    # grammar's counted repetitions is what its compile time follows (200 strings of
    # maxLength 1000: 240 ms; 20,000 in all: ~25 ms)
    max_expanded_repetitions: int = 20_000
    max_seconds: float = 0.5  # conversion time of one request


DEFAULT_LIMITS = GrammarLimits()


# ---------------------------------------------------------------------------- the schema
@dataclass
class Node:
    """One schema, read: ``kind`` is one of any, ref, anyOf, allOf, const, enum, null,
    boolean, number, integer, string, array, tuple, object."""

    kind: str
    children: list[Node] = field(default_factory=list)  # anyOf / allOf / tuple items
    value: Any = None  # const
    values: list[Any] = field(default_factory=list)  # enum
    ref: str = ""
    props: list[tuple[str, Node, bool]] = field(default_factory=list)  # name, schema, required
    additional: Node | None = None  # object: extra keys allowed with this schema
    items: Node | None = None  # array
    min_count: int = 0  # minItems / minLength
    max_count: int = UNBOUNDED
    pattern: str = ""
    fmt: str = ""  # date, time, date-time, uuid
    minimum: int = INT64_MIN  # integer (inclusive)
    maximum: int = INT64_MAX
    bounds: tuple[float | None, bool, float | None, bool] | None = None  # number: lo, excl, hi


class _Reader:
    """The schema (a JSON value) into ``Node``s, keyword by keyword as llama.cpp's
    ``common_chat_schema_from_json`` reads it, counting against the limits."""

    def __init__(self, root: Any, limits: GrammarLimits, deadline: float) -> None:
        self.root = root
        self.limits = limits
        self.deadline = deadline
        self.refs: dict[str, Node | None] = {}
        self.nodes = 0

    def fail(self, path: str, msg: str) -> GrammarError:
        return GrammarError(f"JSON schema error at {path}: {msg}")

    def over(self, path: str, what: str, limit: str, value: int) -> SchemaLimitError:
        return SchemaLimitError(
            f"{what} at {path} is over the limit of {value} ({limit})", limit)

    def count(self, schema: Mapping[str, Any], key: str, path: str, default: int) -> int:
        if key not in schema:
            return default
        value = schema[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.fail(path, f"{key} must be a non-negative integer")
        if value > self.limits.max_repetition:
            raise self.over(path, f"{key} {value}", "max_repetition",
                            self.limits.max_repetition)
        return value

    def node(self, schema: Any, path: str, depth: int) -> Node:
        self.nodes += 1
        if self.nodes > self.limits.max_nodes:
            raise self.over(path, "the number of schemas", "max_nodes", self.limits.max_nodes)
        if depth > self.limits.max_depth:
            raise self.over(path, "the nesting of schemas", "max_depth", self.limits.max_depth)
        if time.monotonic() > self.deadline:
            raise SchemaLimitError(
                f"reading the schema took longer than {self.limits.max_seconds} s (max_seconds)",
                "max_seconds")
        if not isinstance(schema, Mapping):
            raise self.fail(path, "schema must be an object")
        if "$ref" in schema:
            return self.reference(schema["$ref"], path, depth)
        for key in ("oneOf", "anyOf"):
            if key in schema:
                return self.alternatives("anyOf", schema[key], f"{path}/{key}", depth)
        kind = schema.get("type")
        if isinstance(kind, list):
            if not kind:
                raise self.fail(path, "type must not be empty")
            alts = Node("anyOf")
            for i, t in enumerate(kind):
                alts.children.append(
                    self.node({**schema, "type": t}, f"{path}/type/{i}", depth + 1))
            return alts
        if "const" in schema:
            return Node("const", value=self.literal(schema["const"], path))
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise self.fail(path, "enum must be a non-empty array")
            if len(values) > self.limits.max_enum:
                raise self.over(path, f"an enum of {len(values)} values", "max_enum",
                                self.limits.max_enum)
            return Node("enum", values=[self.literal(v, path) for v in values])
        if kind is not None and not isinstance(kind, str):
            raise self.fail(path, "type must be a string or an array of strings")
        has_props = "properties" in schema or (
            "additionalProperties" in schema and schema["additionalProperties"] is not True)
        if kind is None:
            if has_props:
                return self.object(schema, path, depth)
            if "allOf" in schema:
                return self.alternatives("allOf", schema["allOf"], f"{path}/allOf", depth)
            if "items" in schema or "prefixItems" in schema:
                return self.array(schema, path, depth)
            if any(k in schema for k in ("pattern", "minLength", "maxLength")) or \
                    self.format(schema, path):
                return self.string(schema, path)
            return Node("any")
        if kind == "object":
            if not has_props and "allOf" in schema:
                return self.alternatives("allOf", schema["allOf"], f"{path}/allOf", depth)
            return self.object(schema, path, depth)
        if kind == "string":
            if "allOf" in schema:
                return self.alternatives("allOf", schema["allOf"], f"{path}/allOf", depth)
            return self.string(schema, path)
        if kind == "array":
            return self.array(schema, path, depth)
        if kind == "integer":
            return self.integer(schema, path)
        if kind == "number":
            return self.number(schema, path)
        if kind in ("boolean", "null"):
            return Node(kind)
        raise self.fail(path, f"unrecognized type {kind}")

    def literal(self, value: Any, path: str) -> Any:
        if len(_dump(value).encode()) > self.limits.max_literal_bytes:
            raise self.over(path, "a const or enum value", "max_literal_bytes",
                            self.limits.max_literal_bytes)
        return value

    def reference(self, ref: Any, path: str, depth: int) -> Node:
        if not isinstance(ref, str):
            raise self.fail(path, "$ref must be a string")
        if not ref.startswith("#/"):
            raise self.fail(path, f"unsupported $ref {ref}, only references into the same "
                            "document are supported")
        if ref not in self.refs:
            self.refs[ref] = None  # a cycle back to this $ref stops here
            self.refs[ref] = self.node(self.resolve(ref, path), ref, depth + 1)
        return Node("ref", ref=ref)

    def resolve(self, ref: str, path: str) -> Any:
        target = self.root
        for sel in ref[1:].split("/")[1:]:
            if isinstance(target, Mapping) and sel in target:
                target = target[sel]
            elif isinstance(target, list):
                idx = int(sel) if sel.isdigit() else len(target)
                if idx >= len(target):
                    raise self.fail(path, f"cannot resolve $ref {ref}, {sel} is out of range")
                target = target[idx]
            else:
                raise self.fail(path, f"cannot resolve $ref {ref}, {sel} not found")
        return target

    def alternatives(self, kind: str, alts: Any, path: str, depth: int) -> Node:
        if not isinstance(alts, list):
            raise self.fail(path, "must be an array of schemas")
        if not alts:
            raise self.fail(path, "must not be empty")
        return Node(kind, children=[
            self.node(a, f"{path}/{i}", depth + 1) for i, a in enumerate(alts)])

    def object(self, schema: Mapping[str, Any], path: str, depth: int) -> Node:
        node = Node("object")
        required = schema.get("required")
        names = {r for r in required if isinstance(r, str)} if isinstance(required, list) \
            else set()
        if "properties" in schema:
            props = schema["properties"]
            if not isinstance(props, Mapping):
                raise self.fail(path, "properties must be an object")
            if len(props) > self.limits.max_properties:
                raise self.over(path, f"an object of {len(props)} properties",
                                "max_properties", self.limits.max_properties)
            for name, prop in props.items():
                node.props.append((name, self.node(prop, f"{path}/properties/{name}",
                                                   depth + 1), name in names))
        if "additionalProperties" in schema:
            extra = schema["additionalProperties"]
            if extra is True:
                node.additional = Node("any")
            elif isinstance(extra, Mapping):
                node.additional = self.node(extra, f"{path}/additionalProperties", depth + 1)
            elif extra is not False:
                raise self.fail(path, "additionalProperties must be a boolean or a schema")
        elif "properties" not in schema:
            node.additional = Node("any")  # {"type": "object"} alone: any object
        return node

    def array(self, schema: Mapping[str, Any], path: str, depth: int) -> Node:
        if "items" in schema or "prefixItems" in schema:
            key = "items" if "items" in schema else "prefixItems"
            items = schema[key]
            if isinstance(items, list):
                return Node("tuple", children=[
                    self.node(s, f"{path}/{key}/{i}", depth + 1) for i, s in enumerate(items)])
            item = self.node(items, f"{path}/{key}", depth + 1)
        else:
            item = Node("any")
        lo = self.count(schema, "minItems", path, 0)
        hi = self.count(schema, "maxItems", path, UNBOUNDED)
        if hi != UNBOUNDED and lo > hi:
            raise self.fail(path, f"minItems {lo} exceeds maxItems {hi}")
        return Node("array", items=item, min_count=lo, max_count=hi)

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
            if len(pattern) > self.limits.max_pattern_chars:
                raise self.over(path, f"a pattern of {len(pattern)} characters",
                                "max_pattern_chars", self.limits.max_pattern_chars)
            node.pattern = pattern
        node.fmt = self.format(schema, path)
        node.min_count = self.count(schema, "minLength", path, 0)
        node.max_count = self.count(schema, "maxLength", path, UNBOUNDED)
        if node.max_count != UNBOUNDED and node.min_count > node.max_count:
            raise self.fail(path, f"minLength {node.min_count} exceeds maxLength "
                            f"{node.max_count}")
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

    def integer(self, schema: Mapping[str, Any], path: str) -> Node:
        # an integer of more than 16 digits is beyond what the grammar writes anyway
        # (llama.cpp's integral-part): such a bound admits every integer it can write
        lo = hi = None
        if (v := self.bound(schema, "minimum", path)) is not None:
            lo = math.ceil(v)
        elif (v := self.bound(schema, "exclusiveMinimum", path)) is not None:
            lo = math.floor(v) + 1
        if (v := self.bound(schema, "maximum", path)) is not None:
            hi = math.floor(v)
        elif (v := self.bound(schema, "exclusiveMaximum", path)) is not None:
            hi = math.ceil(v) - 1
        if lo is not None and hi is not None and lo > hi:
            raise self.fail(path, "the integer bounds admit no value")
        node = Node("integer")
        if lo is not None and lo > INT64_MAX or hi is not None and hi < INT64_MIN:
            raise self.fail(path, "the integer bounds admit no value the grammar can write")
        if lo is not None and lo >= INT64_MIN:
            node.minimum = lo
        if hi is not None and hi <= INT64_MAX:
            node.maximum = hi
        return node

    def number(self, schema: Mapping[str, Any], path: str) -> Node:
        lo = self.bound(schema, "minimum", path)
        lo_excl = lo is None and "exclusiveMinimum" in schema
        if lo_excl:
            lo = self.bound(schema, "exclusiveMinimum", path)
        hi = self.bound(schema, "maximum", path)
        hi_excl = hi is None and "exclusiveMaximum" in schema
        if hi_excl:
            hi = self.bound(schema, "exclusiveMaximum", path)
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

    def __init__(self, reader: _Reader, limits: GrammarLimits) -> None:
        self.refs = reader.refs
        self.limits = limits
        self.deadline = reader.deadline
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
            if len(self.rules) >= self.limits.max_rules:
                raise SchemaLimitError(
                    f"the grammar has more than {self.limits.max_rules} rules (max_rules)",
                    "max_rules")
            if self.size > self.limits.max_grammar_bytes:
                raise SchemaLimitError(
                    f"the grammar is larger than {self.limits.max_grammar_bytes} bytes "
                    "(max_grammar_bytes)", "max_grammar_bytes")
            if time.monotonic() > self.deadline:
                raise SchemaLimitError(
                    f"building the grammar took longer than {self.limits.max_seconds} s "
                    "(max_seconds)", "max_seconds")
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
                    node.additional.kind == "any":
                return self.add(rule_name, self.primitive("object", PRIMITIVES["object"]))
            return self.add(rule_name, self.object_rule(node.props, node.additional, name))
        if kind == "tuple":
            parts = [self.visit(c, f"{sub}tuple-{i}") for i, c in enumerate(node.children)]
            return self.add(rule_name, '"[" space ' + ' "," space '.join(parts)
                            + ' space "]"')
        if kind == "array":
            assert node.items is not None
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

    def object_rule(self, props: list[tuple[str, Node, bool]], additional: Node | None,
                    name: str) -> str:
        sep = "-" if name else ""
        kv: dict[str, str] = {}
        required: list[str] = []
        optional: list[str] = []
        names: list[str] = []
        for prop_name, prop, is_required in props:
            value = self.visit(prop, f"{name}{sep}{prop_name}")
            kv[prop_name] = self.add(f"{name}{sep}{prop_name}-kv",
                                     f'{_literal(_dump(prop_name))} space ":" space {value}')
            (required if is_required else optional).append(prop_name)
            names.append(prop_name)
        if additional is not None:
            sub = f"{name}{sep}additional"
            value = self.visit(additional, f"{sub}-value") if additional.kind != "any" \
                else self.primitive("value", PRIMITIVES["value"])
            key = self.primitive("string", PRIMITIVES["string"]) if not names \
                else self.add(f"{sub}-k", self.not_strings(names))
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
                if first_optional:
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
        """A JSON string that is none of ``words``."""
        trie = _Trie(words)
        char = self.primitive("char", PRIMITIVES["char"])
        out = ['["] ( ']

        def walk(node: _Trie) -> None:
            rejects = ""
            for i, (c, child) in enumerate(sorted(node.children.items())):
                rejects += c
                if i:
                    out.append(" | ")
                out.append(f"[{c}]")
                if child.children:
                    out.append(" (")
                    walk(child)
                    out.append(")")
                else:
                    out.append(f" {char}+")
            if node.children:
                out.append(f' | [^"{rejects}] {char}*')

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
                    for count in (lo, hi):
                        if count != UNBOUNDED and count > self.limits.max_repetition:
                            raise SchemaLimitError(
                                f"the repetition {{{sub[i + 1:j]}}} in a pattern is over the "
                                f"limit of {self.limits.max_repetition} (max_repetition)",
                                "max_repetition")
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
        expanded = sum(int(hi or lo) for body in self.rules.values()
                       for lo, hi in _COUNTED.findall(body))
        if expanded > self.limits.max_expanded_repetitions:
            raise SchemaLimitError(
                f"the grammar's counted repetitions add up to {expanded}, over the limit of "
                f"{self.limits.max_expanded_repetitions} (max_expanded_repetitions)",
                "max_expanded_repetitions")
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


def _json_safe_escape(escape: str) -> str:
    """A GBNF escape from a pattern, refused where it names a character the JSON string
    cannot hold raw (a quote, a backslash, a control character)."""
    if escape in ('\\"', "\\\\", "\\n", "\\r", "\\t"):
        raise _Unsupported(f"the escape {escape} (JSON escapes are not written by the grammar)")
    if escape[1] in "xuU" and int(escape[2:], 16) in {*range(0x20), 0x22, 0x5C, 0x7F}:
        raise _Unsupported(f"the escape {escape} (a character JSON must escape)")
    return escape


# a counted repetition x{m}, x{m,n} or x{m,} after a rule name, a class or a group (a
# brace in a literal or a class follows a quote or an opening bracket)
_COUNTED = re.compile(r"(?<=[\w\])])\{(\d+)(?:,(\d*))?\}")


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


# ---------------------------------------------------------------------------- entry points
def schema_to_gbnf(schema: Any, limits: GrammarLimits = DEFAULT_LIMITS) -> str:
    """GBNF for the JSON texts that validate against ``schema``, as llama-server builds
    it. ``GrammarError`` for a schema that cannot become a grammar, ``SchemaLimitError``
    for one over ``limits``."""
    deadline = time.monotonic() + limits.max_seconds
    reader = _Reader(schema, limits, deadline)
    try:
        root = reader.node(schema, "#", 0)
        writer = _Writer(reader, limits)
        writer.visit(root, "")
    except RecursionError as exc:  # pragma: no cover - max_depth keeps far from it
        raise SchemaLimitError("the schema nests too deeply (max_depth)", "max_depth") \
            from exc
    if writer.errors:
        raise GrammarError("JSON schema conversion failed: " + "; ".join(writer.errors))
    return writer.text()


def int_range_rule(lo: int | None, hi: int | None) -> str:
    """The GBNF alternatives for the integers in [lo, hi] (a bench and test aid)."""
    return _int_range(lo, hi)
