"""Verification cost profiles: what verifying a batch of k tokens costs, relative to k = 1."""

from __future__ import annotations

import bisect
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass

# gemma-3-270m Q4_K_M through llama-cpp-python on a 2-core x86 machine
# (the default profile of the replay protocol that the benchmark traces come with).
CPU_DEFAULT_POINTS: dict[int, float] = {1: 1.0, 4: 1.96, 8: 2.53, 16: 5.13, 32: 7.71}


@dataclass(frozen=True)
class CostProfile:
    """Piecewise-linear cost of one verifier evaluation of k tokens (cost(1) == 1).

    Beyond the last measured point the cost grows with the slope fitted (least squares)
    to the upper half of the measured sizes, or stays flat where that slope falls. Not
    the last segment's: one noisy or padded pair of sizes (32 and 33 rows measured alike
    on a 2-core Zen 3) priced every row past 33 at 0.03 of a step, and a shared step of 8
    sequences planned 216 rows as if they cost 322 ms; they took 1.1-1.3 s.
    """

    points: tuple[tuple[int, float], ...]

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError("a cost profile needs at least one point")
        ks = [k for k, _ in self.points]
        if ks != sorted(set(ks)) or ks[0] < 1:
            raise ValueError("cost profile sizes must be distinct integers >= 1")
        for _, c in self.points:
            if not (c > 0.0) or c != c or c == float("inf"):
                raise ValueError("cost profile values must be finite and > 0")

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, float] | Mapping[int, float]) -> CostProfile:
        try:
            pts = sorted((int(k), float(v)) for k, v in mapping.items())
        except (TypeError, ValueError) as exc:
            raise ValueError(f"cost profile must map batch sizes to numbers: {exc}") from None
        if any(not (v > 0.0) for _, v in pts):
            raise ValueError("cost profile values must be > 0")
        if pts and pts[0][0] != 1:
            pts.insert(0, (1, 1.0))
        base = pts[0][1] if pts else 1.0
        return cls(tuple((k, v / base) for k, v in pts))

    @classmethod
    def from_json(
        cls, text_or_mapping: str | Mapping[str, float] | Mapping[int, float]
    ) -> CostProfile:
        if isinstance(text_or_mapping, str):
            try:
                data = json.loads(text_or_mapping)
            except json.JSONDecodeError as exc:
                raise ValueError(f"cost profile is not valid JSON: {exc}") from None
            if not isinstance(data, dict):
                raise ValueError('cost profile must be a JSON object like {"1": 1.0, "8": 2.5}')
            return cls.from_mapping(data)
        return cls.from_mapping(text_or_mapping)

    @classmethod
    def cpu_default(cls) -> CostProfile:
        return cls.from_mapping(CPU_DEFAULT_POINTS)

    @classmethod
    def flat(cls) -> CostProfile:
        """A verifier (a GPU) whose cost barely grows with the batch."""
        return cls(((1, 1.0), (64, 1.0)))

    @functools.cached_property
    def _sizes(self) -> list[int]:
        return [p[0] for p in self.points]

    def cost(self, k: int) -> float:
        if k <= 0:
            return 0.0
        ks = self._sizes
        i = bisect.bisect_left(ks, k)
        if i < len(ks) and ks[i] == k:
            return self.points[i][1]
        if i == 0:
            return self.points[0][1] * k / ks[0]
        if i == len(ks):
            if len(ks) == 1:
                return self.points[0][1] * k / ks[0]
            return self.points[-1][1] + self._tail_slope * (k - ks[-1])
        (k0, c0), (k1, c1) = self.points[i - 1], self.points[i]
        return c0 + (c1 - c0) * (k - k0) / (k1 - k0)

    @functools.cached_property
    def _tail_slope(self) -> float:
        return self.tail_slope()

    def tail_slope(self) -> float:
        """Cost per row beyond the last measured size: the least-squares slope of the
        points in the upper half of the measured range (at least the last two), >= 0."""
        top = self.points[-1][0]
        pts = [p for p in self.points if 2 * p[0] >= top]
        if len(pts) < 2:
            pts = list(self.points[-2:])
        mk = sum(k for k, _ in pts) / len(pts)
        mc = sum(c for _, c in pts) / len(pts)
        den = sum((k - mk) ** 2 for k, _ in pts)
        return max(0.0, sum((k - mk) * (c - mc) for k, c in pts) / den)

    def table(self, max_k: int) -> list[float]:
        """cost(k) for k in 0..max_k, for hot loops."""
        return [self.cost(k) for k in range(max_k + 1)]

    def to_mapping(self) -> dict[str, float]:
        return {str(k): c for k, c in self.points}
