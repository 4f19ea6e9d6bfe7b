"""JSON schemas shaped like the property test's (tests/schema_strategies.py), drawn with a
seed: ``SchemaGen`` and the leaves it draws from (``strategy_leaves``).
"""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path
from typing import Any


def strategy_leaves() -> list[Any]:
    """The property test's leaves (tests/schema_strategies.py), so that the soak sends the
    shapes that test shrinks toward, and follows it when it gains one. Loaded by path: the
    repository root need not be importable from bench/."""
    path = Path(__file__).resolve().parents[2] / "tests" / "schema_strategies.py"
    spec = importlib.util.spec_from_file_location("soak_schema_strategies", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [*module.ORDINARY, *module.PATHOLOGICAL]


# Property names as hypothesis's st.text(max_size=8) draws them: empty, quotes and
# backslashes, control characters, non-ASCII, astral characters.
KEY_CHARS = ("abcdefghijklmnopqrstuvwxyzABCXYZ0123456789_-.$#/ " + '"\\' + "\x00\x01\t\n\x7f"
             + "éßøЖ中文ʼ\u200b\u2028\ufeff" + "\U0001f600\U00010348")


class SchemaGen:
    """Seeded draws shaped like tests/schema_strategies.py's ``schemas``
    (``st.recursive(leaves, _extend, max_leaves=60)``), without hypothesis's ``.example()``
    (meant for the REPL, not for thousands of draws in a loop): a leaf, or an object of up
    to 6 properties (the first two required), an array with minItems 0-3, an anyOf of 1-4
    or an allOf of 1-3 alternatives, nested until the leaves run out."""

    def __init__(self, rng: random.Random, leaves: list[Any]) -> None:
        self.rng = rng
        self.leaves = leaves
        self.left = 0

    def draw(self) -> Any:
        self.left = self.rng.randint(1, 60)
        return self._node(0)

    def _leaf(self) -> Any:
        self.left -= 1
        return self.rng.choice(self.leaves)

    def _node(self, depth: int) -> Any:
        # Half the draws a bare leaf, as hypothesis's recursive draws often are; deeper
        # levels ever more likely to end.
        if self.left <= 1 or self.rng.random() < 0.5 + 0.1 * depth:
            return self._leaf()
        rng = self.rng
        kind = rng.randrange(4)
        if kind == 0:
            props: dict[str, Any] = {}
            for _ in range(rng.randint(0, 6)):
                key = "".join(rng.choice(KEY_CHARS) for _ in range(rng.randint(0, 8)))
                props[key] = self._node(depth + 1)
            return {"type": "object", "properties": props, "required": list(props)[:2]}
        if kind == 1:
            return {"type": "array", "items": self._node(depth + 1),
                    "minItems": rng.randint(0, 3)}
        alts = [self._node(depth + 1) for _ in range(rng.randint(1, 4 if kind == 2 else 3))]
        return {"anyOf": alts} if kind == 2 else {"allOf": alts}
