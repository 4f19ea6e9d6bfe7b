"""JSON schema -> GBNF's limits pass: GrammarLimits, and the meter refusing schemas past them.

``schema_grammar`` reads a schema and writes its grammar in one go; ``LimitsMeter`` is
handed to both halves and counts as they work: the schemas read, their nesting, each
repetition count, enum, const, object and pattern, the alternatives an allOf makes, the
grammar's rules, bytes and counted repetitions, and the clock. The first figure past its
limit raises ``SchemaLimitError`` (the endpoint's 400, naming the limit), so nothing a
client sends reaches llama.cpp's grammar parser in a shape that can exhaust its stack or
its time, and no conversion runs on past ``max_seconds``. ``GrammarError``, the base of
every refusal, lives here because ``SchemaLimitError`` is one of them.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass

UNBOUNDED = -1  # a count without a maximum (maxItems / maxLength absent)
# allOf of anyOf/oneOf: the alternatives its distribution makes (each is read as a schema
# of its own, so the cap is reported as max_nodes)
MAX_ALTERNATIVES = 256

# a counted repetition x{m}, x{m,n} or x{m,} after a rule name, a class or a group (a
# brace in a literal or a class follows a quote or an opening bracket)
_COUNTED = re.compile(r"(?<=[\w\])])\{(\d+)(?:,(\d*))?\}")


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


def over(path: str, what: str, limit: str, value: int) -> SchemaLimitError:
    """The refusal of ``what`` at ``path``, over ``limit`` (whose figure is ``value``)."""
    return SchemaLimitError(f"{what} at {path} is over the limit of {value} ({limit})", limit)


class LimitsMeter:
    """One conversion measured against ``limits``: the reader calls the reading checks
    for each schema it reads, the writer the writing ones for each rule it adds. The clock
    starts when the meter is made (one per conversion, before reading starts)."""

    def __init__(self, limits: GrammarLimits) -> None:
        self.limits = limits
        self.deadline = time.monotonic() + limits.max_seconds
        self.nodes = 0  # schemas read so far

    # ------------------------------------------------------------------ reading
    def schema(self, path: str, depth: int) -> None:
        """One more schema read, at ``depth``."""
        self.nodes += 1
        if self.nodes > self.limits.max_nodes:
            raise over(path, "the number of schemas", "max_nodes", self.limits.max_nodes)
        self.nesting(path, depth)

    def nesting(self, path: str, depth: int) -> None:
        """A schema read (or merged) at ``depth``, and the clock."""
        if depth > self.limits.max_depth:
            raise over(path, "the nesting of schemas", "max_depth", self.limits.max_depth)
        if time.monotonic() > self.deadline:
            raise SchemaLimitError(
                f"reading the schema took longer than {self.limits.max_seconds} s (max_seconds)",
                "max_seconds")

    def repetition(self, path: str, key: str, value: int) -> None:
        """A count (minLength, maxItems, ...: already a non-negative integer) of ``key``."""
        if value > self.limits.max_repetition:
            raise over(path, f"{key} {value}", "max_repetition", self.limits.max_repetition)

    def enum(self, path: str, values: int) -> None:
        """An enum of ``values`` values."""
        if values > self.limits.max_enum:
            raise over(path, f"an enum of {values} values", "max_enum", self.limits.max_enum)

    def literal(self, path: str, text: str) -> None:
        """One const or enum value, ``text`` its JSON as the grammar writes it."""
        if len(text.encode()) > self.limits.max_literal_bytes:
            raise over(path, "a const or enum value", "max_literal_bytes",
                       self.limits.max_literal_bytes)

    def properties(self, path: str, count: int) -> None:
        """An object of ``count`` named properties."""
        if count > self.limits.max_properties:
            raise over(path, f"an object of {count} properties", "max_properties",
                       self.limits.max_properties)

    def pattern(self, path: str, pattern: str) -> None:
        """A string's ``pattern``, by its length (its repetitions: ``pattern_repetition``)."""
        if len(pattern) > self.limits.max_pattern_chars:
            raise over(path, f"a pattern of {len(pattern)} characters", "max_pattern_chars",
                       self.limits.max_pattern_chars)

    def alternatives(self, path: str, count: int) -> None:
        """The alternatives an allOf of anyOf/oneOf has made so far."""
        if count > MAX_ALTERNATIVES:
            raise over(path, "the alternatives allOf makes of anyOf/oneOf", "max_nodes",
                       MAX_ALTERNATIVES)

    # ------------------------------------------------------------------ writing
    def rule(self, rules: int, size: int) -> None:
        """A new rule about to be added to ``rules`` others, the grammar ``size`` bytes
        with it, and the clock."""
        if rules >= self.limits.max_rules:
            raise SchemaLimitError(
                f"the grammar has more than {self.limits.max_rules} rules (max_rules)",
                "max_rules")
        if size > self.limits.max_grammar_bytes:
            raise SchemaLimitError(
                f"the grammar is larger than {self.limits.max_grammar_bytes} bytes "
                "(max_grammar_bytes)", "max_grammar_bytes")
        if time.monotonic() > self.deadline:
            raise SchemaLimitError(
                f"building the grammar took longer than {self.limits.max_seconds} s "
                "(max_seconds)", "max_seconds")

    def pattern_repetition(self, braces: str, lo: int, hi: int) -> None:
        """A pattern's ``{braces}``, read as ``lo`` to ``hi`` (``UNBOUNDED``: no maximum)."""
        for count in (lo, hi):
            if count != UNBOUNDED and count > self.limits.max_repetition:
                raise SchemaLimitError(
                    f"the repetition {{{braces}}} in a pattern is over the limit of "
                    f"{self.limits.max_repetition} (max_repetition)", "max_repetition")

    def expanded(self, bodies: Iterable[str]) -> None:
        """The written rules' counted repetitions, as llama.cpp will expand them."""
        expanded = sum(int(hi or lo) for body in bodies for lo, hi in _COUNTED.findall(body))
        if expanded > self.limits.max_expanded_repetitions:
            raise SchemaLimitError(
                f"the grammar's counted repetitions add up to {expanded}, over the limit of "
                f"{self.limits.max_expanded_repetitions} (max_expanded_repetitions)",
                "max_expanded_repetitions")

    @staticmethod
    def too_deep() -> SchemaLimitError:
        """Python's recursion limit met before ``max_depth`` (not expected: the depth
        limit keeps far from it), reported as that limit."""
        return SchemaLimitError("the schema nests too deeply (max_depth)", "max_depth")
