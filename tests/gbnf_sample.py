"""Random texts from a GBNF grammar (the subset ``schema_grammar.py`` writes: literals,
character classes, rule names, groups, alternatives, ``* + ?`` and ``{m,n}``), to test
that every text a grammar admits is valid against the schema it came from.

Derivations are random; past a depth they take the shortest way out (each alternative's
and rule's minimal length is computed first), so every sample ends.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Union

# characters a negated class may be sampled from: ASCII, escapes' letters, and a few
# beyond (2- to 4-byte UTF-8, a non-breaking space)
_POOL = [chr(c) for c in range(0x20, 0x7F)] + ["\t", "\n", "\x7f", "é", "日", "\u00a0",
                                                 "😀", "\u2028"]


@dataclass
class Lit:
    text: str


@dataclass
class Cls:
    ranges: list[tuple[str, str]]
    negated: bool


@dataclass
class Ref:
    name: str


@dataclass
class Rep:
    item: Expr
    lo: int
    hi: int | None  # None: unbounded


@dataclass
class Alt:
    options: list[list[Expr]] = field(default_factory=list)


Expr = Union[Lit, Cls, Ref, Rep, Alt]  # noqa: UP007 - a recursive alias


class _Parser:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0

    def ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i] in " \t":
            self.i += 1

    def char(self, end: str) -> str:
        c = self.s[self.i]
        if c != "\\":
            self.i += 1
            return c
        kind = self.s[self.i + 1]
        self.i += 2
        if kind in "xuU":
            n = {"x": 2, "u": 4, "U": 8}[kind]
            code = int(self.s[self.i:self.i + n], 16)
            self.i += n
            return chr(code)
        return {"n": "\n", "r": "\r", "t": "\t"}.get(kind, kind)

    def alternatives(self) -> Alt:
        alt = Alt([self.sequence()])
        while self.i < len(self.s) and self.s[self.i] == "|":
            self.i += 1
            alt.options.append(self.sequence())
        return alt

    def sequence(self) -> list[Expr]:
        seq: list[Expr] = []
        while True:
            self.ws()
            if self.i >= len(self.s) or self.s[self.i] in "|)\n":
                return seq
            seq.append(self.postfix(self.atom()))

    def atom(self) -> Expr:
        c = self.s[self.i]
        if c == '"':
            self.i += 1
            text = ""
            while self.s[self.i] != '"':
                text += self.char('"')
            self.i += 1
            return Lit(text)
        if c == "[":
            self.i += 1
            negated = self.s[self.i] == "^"
            self.i += negated
            ranges = []
            while self.s[self.i] != "]":
                a = self.char("]")
                b = a
                if self.s[self.i] == "-" and self.s[self.i + 1] != "]":
                    self.i += 1
                    b = self.char("]")
                ranges.append((a, b))
            self.i += 1
            return Cls(ranges, negated)
        if c == "(":
            self.i += 1
            inner = self.alternatives()
            assert self.s[self.i] == ")", self.s[self.i:self.i + 20]
            self.i += 1
            return inner
        m = re.compile(r"[a-zA-Z0-9-]+").match(self.s, self.i)
        assert m, self.s[self.i:self.i + 20]
        self.i = m.end()
        return Ref(m.group())

    def postfix(self, item: Expr) -> Expr:
        while self.i < len(self.s):
            c = self.s[self.i]
            if c in "*+?":
                self.i += 1
                item = Rep(item, 1 if c == "+" else 0, 1 if c == "?" else None)
            elif c == "{":
                j = self.s.index("}", self.i)
                lo, _, hi = self.s[self.i + 1:j].partition(",")
                both = "," in self.s[self.i + 1:j]
                item = Rep(item, int(lo), (int(hi) if hi else None) if both else int(lo))
                self.i = j + 1
            else:
                return item
        return item


def parse(gbnf: str) -> dict[str, Alt]:
    rules: dict[str, Alt] = {}
    for line in gbnf.split("\n"):
        if not line.strip():
            continue
        name, _, body = line.partition(" ::= ")
        p = _Parser(body)
        rules[name] = p.alternatives()
        assert p.i == len(body), (name, body[p.i:])
    return rules


class Sampler:
    def __init__(self, gbnf: str, seed: int = 0, depth: int = 12) -> None:
        self.rules = parse(gbnf)
        self.rng = random.Random(seed)
        self.depth = depth
        self.size = self._minimal_sizes()

    def _minimal_sizes(self) -> dict[str, float]:
        size = {name: float("inf") for name in self.rules}
        changed = True
        while changed:
            changed = False
            for name, alt in self.rules.items():
                n = self._min(alt, size)
                if n < size[name]:
                    size[name], changed = n, True
        return size

    def _min(self, e: Expr, size: dict[str, float]) -> float:
        if isinstance(e, Lit):
            return len(e.text)
        if isinstance(e, Cls):
            return 1
        if isinstance(e, Ref):
            return size[e.name]
        if isinstance(e, Rep):
            return e.lo * self._min(e.item, size) if e.lo else 0
        return min(sum(self._min(x, size) for x in seq) for seq in e.options)

    def sample(self, root: str = "root") -> str:
        assert self.size[root] < float("inf"), "the grammar has no finite text"
        out: list[str] = []
        self._gen(Ref(root), 0, out)
        return "".join(out)

    def _gen(self, e: Expr, depth: int, out: list[str]) -> None:
        rng = self.rng
        if isinstance(e, Lit):
            out.append(e.text)
        elif isinstance(e, Cls):
            out.append(self._char(e))
        elif isinstance(e, Ref):
            self._gen(self.rules[e.name], depth + 1, out)
        elif isinstance(e, Rep):
            deep = depth > self.depth
            hi = e.hi if e.hi is not None else e.lo + (0 if deep else 3)
            n = e.lo if deep else rng.randint(e.lo, min(hi, e.lo + 6))
            for _ in range(n):
                self._gen(e.item, depth + 1, out)
        else:
            options = e.options
            if depth > self.depth:
                best = min(sum(self._min(x, self.size) for x in seq) for seq in options)
                options = [seq for seq in options
                           if sum(self._min(x, self.size) for x in seq) == best]
            for x in rng.choice(options):
                self._gen(x, depth + 1, out)

    def _char(self, c: Cls) -> str:
        def inside(ch: str) -> bool:
            return any(a <= ch <= b for a, b in c.ranges)

        if not c.negated:
            a, b = self.rng.choice(c.ranges)
            return chr(self.rng.randint(ord(a), ord(b)))
        pool = [ch for ch in _POOL if not inside(ch)]
        assert pool, c
        return self.rng.choice(pool)
