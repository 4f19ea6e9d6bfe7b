"""Charts for the dashboard as SVG text, drawn by the server (daemon/http_api/dashboard.py).

One function, ``chart``: lines (with a marker per bucket) or bars (stacked or not) over a
time axis, with horizontal reference lines (an all-time figure, a budget). Colours come
from CSS classes (``c-<name>``, dashboard.css), never inline styles, so the page runs
under a Content-Security-Policy without 'unsafe-inline' and follows the reader's light or
dark scheme. The drawing scales with its box (``viewBox``, width 100%): one layout serves
a phone and a desktop.

Every marker and bar carries its value (``data-v``) and a tooltip (``<title>``), and every
reference line its own (``data-ref``, ``data-v``): what a reader hovers, and what
tests/test_dashboard_browser.py compares with ``suffixd stats``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

W, H = 480, 170
LEFT, RIGHT, TOP, BOTTOM = 46, 10, 10, 22
PW, PH = W - LEFT - RIGHT, H - TOP - BOTTOM

Fmt = Callable[[float], str]


@dataclass
class Series:
    name: str
    cls: str  # colour class suffix: c-<cls>
    values: Sequence[float | None]


@dataclass
class Ref:
    name: str
    cls: str
    value: float


def _nice(x: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k at or above ``x``."""
    if x <= 0:
        return 1.0
    e = 10.0 ** math.floor(math.log10(x))
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        if m * e >= x * (1 - 1e-9):
            return m * e
    return 10 * e


def y_ticks(top: float, fixed: float | None = None, integer: bool = False
            ) -> tuple[float, list[float]]:
    """The axis' top and its ticks (four steps of a round size, from zero; whole steps
    for what is counted in whole numbers)."""
    if fixed is not None:
        step = fixed / 4
        return fixed, [step * i for i in range(5)]
    if top <= 0:
        top = 4.0  # nothing yet: a plain 0..4 axis, not one of hair-thin steps
    step = _nice(top / 4)
    if integer:
        step = max(1.0, math.ceil(step))
    n = max(1, math.ceil(top / step - 1e-9))
    return step * n, [step * i for i in range(n + 1)]


_TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800,
               21600, 43200, 86400)


def x_ticks(t0: float, t1: float, most: int = 5) -> tuple[list[float], str]:
    span = max(t1 - t0, 1e-9)
    step = next((s for s in _TIME_STEPS if span / s <= most), _TIME_STEPS[-1])
    # local midnight-aligned ticks read naturally (12:00, 12:15, ...)
    offset = time.localtime(t0).tm_gmtoff
    first = float(math.ceil((t0 + offset) / step) * step - offset)
    ticks: list[float] = []
    t = first
    while t <= t1 + 1e-9:
        ticks.append(t)
        t += step
    return ticks, "%H:%M:%S" if step < 60 else "%H:%M"


def _hm(t: float, fmt: str = "%H:%M:%S") -> str:
    return time.strftime(fmt, time.localtime(t))


def chart(kind: str, times: Sequence[float], width_s: float, series: Sequence[Series], *,
          t0: float, t1: float, fmt: Fmt, label: str, y_max: float | None = None,
          refs: Sequence[Ref] = (), key: str = "", integer: bool = False) -> str:
    """``kind``: "line", "bars" (side by side in one bucket: one series, or a few) or
    "stacked". ``times``: each bucket's start (``width_s`` long); ``series`` values per
    bucket (None: nothing measured then). ``y_max``: a fixed axis top (1 for a share);
    ``integer``: whole numbers (ticks at whole steps).
    """
    vals = [v for s in series for v in s.values if v is not None]
    if kind == "stacked":
        sums = [sum((s.values[i] or 0.0) for s in series) for i in range(len(times))]
        vals = sums
    top = max([*vals, *(r.value for r in refs), 0.0])
    y_top, ticks = y_ticks(top, y_max, integer)
    span = max(t1 - t0, 1e-9)

    def x(t: float) -> float:
        return LEFT + (t - t0) / span * PW

    def y(v: float) -> float:
        return TOP + PH - (min(v, y_top) / y_top if y_top else 0.0) * PH

    out = [f'<svg class="chart" viewBox="0 0 {W} {H}" role="img" '
           f'aria-label="{escape(label)}" data-chart="{escape(key)}" '
           f'preserveAspectRatio="xMidYMid meet">']
    out.append('<g class="axis">')
    for v in ticks:
        yy = y(v)
        out.append(f'<line class="gl" x1="{LEFT}" x2="{W - RIGHT}" y1="{yy:.1f}" '
                   f'y2="{yy:.1f}"/><text x="{LEFT - 4}" y="{yy + 3.5:.1f}" '
                   f'text-anchor="end">{escape(fmt(v))}</text>')
    xt, tfmt = x_ticks(t0, t1)
    for t in xt:
        xx = x(t)
        text = _hm(t, tfmt)
        out.append(f'<line class="tick" x1="{xx:.1f}" x2="{xx:.1f}" y1="{TOP + PH}" '
                   f'y2="{TOP + PH + 3}"/>')
        # A label the edge would cut goes; shifted inwards it would run into its
        # neighbour. (Half a label's width, at the phone's larger type.)
        half = 4.2 * len(text)
        if xx - half >= 0 and xx + half <= W:
            out.append(f'<text x="{xx:.1f}" y="{H - 6}" text-anchor="middle">{text}</text>')
    out.append("</g>")
    if not vals or not any(vals) and not refs:
        out.append(f'<text class="empty" x="{LEFT + PW / 2}" y="{TOP + PH / 2}" '
                   'text-anchor="middle">no data yet</text>')
    for r in refs:
        yy = y(r.value)
        out.append(f'<line class="ref c-{r.cls}" x1="{LEFT}" x2="{W - RIGHT}" '
                   f'y1="{yy:.1f}" y2="{yy:.1f}" data-ref="{escape(r.name)}" '
                   f'data-v="{r.value!r}"><title>{escape(r.name)}: '
                   f'{escape(fmt(r.value))}</title></line>')
    bw = max(1.0, PW * width_s / span)
    if kind == "line":
        for s in series:
            out.append(_line(s, times, width_s, x, y, fmt))
    else:
        base = [0.0] * len(times)
        n = len(series)
        for j, s in enumerate(series):
            out.append(f'<g class="bars c-{s.cls}" data-series="{escape(s.name)}">')
            for i, (t, bv) in enumerate(zip(times, s.values, strict=True)):
                if bv is None or bv <= 0:
                    continue
                v = bv
                if kind == "stacked":
                    x0, w_ = x(t) + bw * 0.08, bw * 0.84
                    y0, y1 = y(base[i] + v), y(base[i])
                    base[i] += v
                else:
                    x0, w_ = x(t) + bw * (0.08 + 0.84 * j / n), bw * 0.84 / n
                    y0, y1 = y(v), y(0.0)
                out.append(f'<rect x="{x0:.2f}" y="{y0:.2f}" width="{max(w_, 0.6):.2f}" '
                           f'height="{max(y1 - y0, 0.6):.2f}" data-v="{v!r}"><title>'
                           f'{_hm(t)} {escape(s.name)}: {escape(fmt(v))}</title></rect>')
            out.append("</g>")
    out.append("</svg>")
    return "".join(out)


def _line(s: Series, times: Sequence[float], width_s: float, x: Callable[[float], float],
          y: Callable[[float], float], fmt: Fmt) -> str:
    """A solid line through consecutive buckets, a faint dashed one across buckets where
    nothing was measured (no step, so no rate: not a zero), a marker per measurement."""
    solid: list[str] = []
    gaps: list[str] = []
    marks: list[str] = []
    last: tuple[int, float, float] | None = None
    for i, (t, v) in enumerate(zip(times, s.values, strict=True)):
        if v is None:
            continue
        xx, yy = x(t + width_s / 2), y(v)
        if last is not None:
            seg = f"M{last[1]:.1f} {last[2]:.1f}L{xx:.1f} {yy:.1f}"
            (solid if last[0] == i - 1 else gaps).append(seg)
        last = (i, xx, yy)
        marks.append(f'<circle cx="{xx:.1f}" cy="{yy:.1f}" r="2.2" data-v="{v!r}"><title>'
                     f'{_hm(t)} {escape(s.name)}: {escape(fmt(v))}</title></circle>')
    paths = (f'<path class="gap" d="{"".join(gaps)}"/>' if gaps else "") + (
        f'<path d="{"".join(solid)}"/>' if solid else "")
    return (f'<g class="line c-{s.cls}" data-series="{escape(s.name)}">{paths}'
            f'{"".join(marks)}</g>')


# ------------------------------------------------------------------------ formats
def pct(v: float) -> str:
    return f"{100 * v:.0f}%" if abs(v) >= 0.1 or v == 0 else f"{100 * v:.1f}%"


def times_x(v: float) -> str:
    return f"{v:.2f}x" if v < 10 else f"{v:.1f}x"


def count(v: float) -> str:
    a = abs(v)
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            q = v / div
            return f"{q:.0f}{unit}" if abs(q) >= 100 else f"{q:.1f}{unit}".replace(".0" + unit,
                                                                                  unit)
    return f"{v:.0f}" if v == int(v) else f"{v:.1f}"


def nbytes(v: float) -> str:
    for div, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(v) >= div:
            return f"{v / div:.1f} {unit}".replace(".0 ", " ")
    return f"{v:.0f} B"


def seconds(v: float) -> str:
    return f"{v:.1f} s" if v < 100 else f"{v:.0f} s"
