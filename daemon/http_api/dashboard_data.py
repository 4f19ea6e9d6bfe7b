"""The dashboard's figures: what one sample of the daemon holds, and the series drawn from
a history of samples (daemon/http_api/dashboard.py draws them; daemon/server/history.py
keeps the history).

A **sample** is a plain JSON-able dict of the daemon's cumulative counters and its
gauges at one moment (``take_sample``)::

    {"t": unix time,
     "ns":  {name: NS, ...},          # the namespaces tracked (at most MAX_TRACKED)
     "all": NS,                        # every namespace summed, tracked or not
     "memory": [engine.memory() rows], # the trees by kind against their budgets
     "prompt_cache": {...} | None,     # the verifier's prompt cache (once loaded)
     "fleet": {node: {"lag_s", "lag_entries", "backlog"}} | None}

    NS = {"requests", "steps", "proposed", "accepted", "generated", "speculate_calls",
          "src": {source: [steps, proposed, accepted]},      # counters (only grow)
          "prompt_tokens", "reused_prompt_tokens",          # counters, since start-up
          "open_sessions", "tree_tokens": {tree: n}, "tree_bytes": {tree: n},
          "evictions"}                                       # gauges, and a counter

Counters are stored cumulative, as the engine keeps them (persisted in LMDB, so they
survive a restart); a series is the difference between consecutive samples, summed per
display bucket, and a counter that went down (a restart lost its last unflushed
interval, or a namespace was dropped) counts from zero again, as Prometheus' ``rate``
does. Rates (hit rate, acceptance, tokens per step, speed-up) are taken from the summed
differences of a bucket, never averaged from per-sample rates, so a quiet minute weighs
nothing.

``figures`` derives the rates from one set of counters with the same formulas as
``suffixd stats`` (cli/stats.py ``summarize_counters``; tests/test_dashboard.py holds them
equal), so the page and the command show the same numbers.

``clean_sample`` takes a sample read back from a file (daemon/server/history.py) and
returns it in the shape above, every number finite and within ``MAX_VALUE``, absent
parts filled in, or None where anything is of another shape: the page is drawn from
stored samples on every load, and one bad value there would fail each one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SOURCES = ("session", "global", "corpus", "draft_model", "none")
DRAFT_SOURCES = SOURCES[:-1]
TREES = ("sessions", "global", "corpus")
# Counters of an NS entry (cumulative); the rest are gauges.
COUNTERS = ("requests", "steps", "proposed", "accepted", "generated", "speculate_calls",
            "prompt_tokens", "reused_prompt_tokens", "evictions")
# Namespaces with a series of their own; past this many, the busiest are kept and the
# others are in "all" only (a tenant count in the thousands would make the history, and
# every page that reads it, grow with it).
MAX_TRACKED = 32
# No counter, gauge or time this daemon writes comes near this; sums of a day of them
# stay far from float's range (the charts draw floats).
MAX_VALUE = float(1 << 62)


def empty_ns() -> dict[str, Any]:
    return {**{k: 0 for k in COUNTERS}, "src": {}, "open_sessions": 0,
            "tree_tokens": {t: 0 for t in TREES}, "tree_bytes": {t: 0 for t in TREES}}


def ns_entry(e: Mapping[str, Any], prompt: Sequence[int] = (0, 0)) -> dict[str, Any]:
    """One namespace of ``engine.stats()`` as an NS entry; ``prompt``: its (prompt
    tokens, reused prompt tokens) since start-up."""
    c = e.get("counters") or {}
    cache = e.get("cache") or {}
    return {
        "requests": int(c.get("requests", 0)),
        "steps": int(c.get("steps", 0)),
        "proposed": int(c.get("draft_tokens_proposed", 0)),
        "accepted": int(c.get("draft_tokens_accepted", 0)),
        "generated": int(c.get("generated_tokens", 0)),
        "speculate_calls": int(c.get("speculate_calls", 0)),
        "prompt_tokens": int(prompt[0]),
        "reused_prompt_tokens": int(prompt[1]),
        "evictions": int((cache.get("global") or {}).get("evictions", 0)),
        "src": {s: [int(v.get("steps", 0)), int(v.get("proposed", 0)),
                    int(v.get("accepted", 0))]
                for s, v in (c.get("by_source") or {}).items()},
        "open_sessions": int(e.get("open_sessions", 0)),
        "tree_tokens": {t: int((cache.get(t) or {}).get("tokens", 0)) for t in TREES},
        "tree_bytes": {t: int((cache.get(t) or {}).get("bytes", 0)) for t in TREES},
    }


def add_ns(into: dict[str, Any], e: Mapping[str, Any]) -> None:
    for k in (*COUNTERS, "open_sessions"):
        into[k] += int(e.get(k, 0))
    for s, v in (e.get("src") or {}).items():
        acc = into["src"].setdefault(s, [0, 0, 0])
        for i in range(3):
            acc[i] += int(v[i])
    for key in ("tree_tokens", "tree_bytes"):
        for t in TREES:
            into[key][t] += int((e.get(key) or {}).get(t, 0))


def take_sample(engine: Any, prompt_counts: Mapping[str, Sequence[int]] | None = None,
                now: float | None = None) -> dict[str, Any]:
    """The daemon's counters and gauges now (see the module docstring). ``prompt_counts``:
    per namespace, (prompt tokens, reused prompt tokens) since start-up."""
    import time

    prompt_counts = prompt_counts or {}
    st = engine.stats(top_documents=1)
    every = {ns: ns_entry(e, prompt_counts.get(ns, (0, 0))) for ns, e in st.items()}
    total = empty_ns()
    for e in every.values():
        add_ns(total, e)
    if len(every) > MAX_TRACKED:
        busiest = sorted(every, key=lambda n: -(every[n]["steps"] + every[n]["requests"]
                                                + every[n]["generated"]))[:MAX_TRACKED]
        every = {n: every[n] for n in sorted(busiest)}
    out: dict[str, Any] = {"t": time.time() if now is None else now, "ns": every, "all": total,
                           "memory": _memory(engine), "prompt_cache": _prompt_cache(engine),
                           "fleet": _fleet(engine)}
    return out


def _memory(engine: Any) -> list[dict[str, Any]]:
    try:
        return [dict(m) for m in engine.memory()]
    except AttributeError:
        return []


def _prompt_cache(engine: Any) -> dict[str, int] | None:
    gen = getattr(engine, "generator", None)
    rt = getattr(gen, "loaded", None) if gen is not None else None
    verifier = getattr(rt, "verifier", None)
    if verifier is None:
        return None
    return {k: int(v) for k, v in verifier.prompt_cache.as_dict().items()}


def _fleet(engine: Any) -> dict[str, dict[str, float]] | None:
    fleet = getattr(engine, "fleet", None)
    if fleet is None:
        return None
    st = fleet.status()
    nodes = dict(st.get("nodes") or {})
    me = st.get("node") or {}
    if me.get("node"):
        nodes[str(me["node"])] = me  # this node's own figures are the freshest
    return {str(name): {"lag_s": float(n.get("lag_s", 0.0)),
                        "lag_entries": int(n.get("lag_entries", 0)),
                        "backlog": int(n.get("backlog", 0))}
            for name, n in sorted(nodes.items())}


# ------------------------------------------------------------------------ figures
CPU_DEFAULT = None  # the CostProfile, built on first use


def _cpu_profile() -> Any:
    global CPU_DEFAULT
    if CPU_DEFAULT is None:
        from suffixcache.cost import CostProfile

        CPU_DEFAULT = CostProfile.cpu_default()
    return CPU_DEFAULT


def _cost(profile: Any, k: float) -> float:
    # Linear between the integer points: mean draft lengths are fractional (as
    # cli/stats.py prices them).
    lo = int(k)
    frac = k - lo
    c_lo = profile.cost(lo) if lo > 0 else 0.0
    return float(c_lo + (profile.cost(lo + 1) - c_lo) * frac if frac else c_lo)


def figures(c: Mapping[str, Any]) -> dict[str, Any]:
    """Rates from an NS entry's counters (or their differences), as ``suffixd stats``
    derives them: hit rate (the share of verified steps drafted by each source),
    acceptance, tokens per step and the estimated speed-up against plain decoding (one
    token per step): on the default CPU cost profile, and on a flat one."""
    steps = int(c.get("steps", 0))
    proposed = int(c.get("proposed", 0))
    accepted = int(c.get("accepted", 0))
    src = c.get("src") or {}
    hit = {s: (int(src.get(s, (0, 0, 0))[0]) / steps if steps else 0.0) for s in SOURCES}
    hit["any"] = (sum(int(v[0]) for k, v in src.items() if k != "none") / steps
                  if steps else 0.0)
    tps = (accepted + steps) / steps if steps else 1.0
    speedup = {"flat": tps}
    if steps:
        speedup["cpu_default"] = tps / _cost(_cpu_profile(), proposed / steps + 1)
    prompt = int(c.get("prompt_tokens", 0))
    return {
        "hit_rate": hit,
        "acceptance_rate": accepted / proposed if proposed else 0.0,
        "mean_accepted_per_step": accepted / steps if steps else 0.0,
        "tokens_per_step": tps,
        "estimated_speedup": speedup,
        "prompt_reuse": int(c.get("reused_prompt_tokens", 0)) / prompt if prompt else 0.0,
    }


# ------------------------------------------------------------------------ series
@dataclass
class Buckets:
    """Samples grouped into display buckets of ``width`` seconds from ``start``: per
    bucket, the counters' differences summed (``delta``) and the last gauges seen
    (``last``, None where no sample fell)."""

    start: float
    width: float
    delta: list[dict[str, Any]] = field(default_factory=list)
    last: list[dict[str, Any] | None] = field(default_factory=list)

    @property
    def times(self) -> list[float]:
        return [self.start + i * self.width for i in range(len(self.delta))]

    def total(self) -> dict[str, Any]:
        out = empty_ns()
        for d in self.delta:
            add_ns(out, d)
        return out


def _diff(cur: int, prev: int) -> int:
    # A counter that went down started again from zero (a restart, a dropped namespace).
    return cur - prev if cur >= prev else cur


def diff_ns(cur: Mapping[str, Any], prev: Mapping[str, Any] | None) -> dict[str, Any]:
    """The counters' growth from ``prev`` to ``cur`` (``prev`` None: none before)."""
    prev = prev or empty_ns()
    out = empty_ns()
    for k in COUNTERS:
        out[k] = _diff(int(cur.get(k, 0)), int(prev.get(k, 0)))
    psrc = prev.get("src") or {}
    for s, v in (cur.get("src") or {}).items():
        p = psrc.get(s) or (0, 0, 0)
        # a source's steps went down only with the whole set of counters: all from zero
        reset = int(v[0]) < int(p[0])
        out["src"][s] = [int(v[i]) if reset else _diff(int(v[i]), int(p[i])) for i in range(3)]
    return out


def pick(sample: Mapping[str, Any], ns: str | None) -> dict[str, Any] | None:
    """The NS entry of ``ns`` in ``sample`` (None: the whole daemon)."""
    if ns is None:
        return dict(sample.get("all") or empty_ns())
    e = (sample.get("ns") or {}).get(ns)
    return dict(e) if e is not None else None


def bucketize(samples: Sequence[Mapping[str, Any]], ns: str | None, t0: float, t1: float,
              width: float) -> Buckets:
    """The samples from ``t0`` to ``t1`` (each compared with the one before it, which may
    be older than ``t0``) in buckets of ``width`` seconds."""
    n = max(1, math.ceil((t1 - t0) / width))
    b = Buckets(start=t0, width=width, delta=[empty_ns() for _ in range(n)],
                last=[None] * n)
    prev: Mapping[str, Any] | None = None
    for idx, s in enumerate(samples):
        cur = pick(s, ns)
        t = float(s["t"])
        if t > t0 and cur is not None:
            i = min(n - 1, int((t - t0) // width))
            # The first sample of a history only sets where counting starts (what the
            # counters held before the history began is no event of its time); later, a
            # namespace without a sample before counts from zero (it is new).
            if idx > 0:
                add_ns(b.delta[i], diff_ns(cur, prev))
            b.last[i] = {**cur, "memory": s.get("memory") or [],
                         "prompt_cache": s.get("prompt_cache"), "fleet": s.get("fleet")}
        if cur is not None:
            prev = cur
        elif ns is not None and t > t0:
            prev = None  # the namespace is gone (dropped, or untracked): from zero again
    return b


def nice_width(span: float, interval: float, max_buckets: int = 120) -> float:
    """A bucket width: whole sampling intervals, at most ``max_buckets`` over ``span``."""
    k = max(1, math.ceil(span / max_buckets / interval))
    return k * interval


def rates(deltas: Iterable[Mapping[str, Any]]) -> list[dict[str, Any] | None]:
    """``figures`` of each bucket's differences; None where a bucket had no step."""
    return [figures(d) if int(d.get("steps", 0)) else None for d in deltas]


# ------------------------------------------------------------------------ stored samples
class _Bad(ValueError):
    pass


def _number(v: Any) -> float:
    # bool is an int to Python, never a count here
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise _Bad(f"not a number: {v!r}")
    if not 0 <= v <= MAX_VALUE:  # NaN fails this too
        raise _Bad(f"out of range: {v!r}")
    return float(v)


def _count(v: Any) -> int:
    return int(_number(v))


def _mapping(v: Any, default: Any = None) -> dict[str, Any]:
    if v is None and default is not None:
        return dict(default)
    if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
        raise _Bad(f"not an object with names: {v!r}"[:80])
    return v


def _clean_ns(e: Any) -> dict[str, Any]:
    e = _mapping(e)
    out = empty_ns()
    for k in (*COUNTERS, "open_sessions"):
        out[k] = _count(e.get(k, 0))
    for s, v in _mapping(e.get("src"), {}).items():
        if not isinstance(v, list) or len(v) != 3:
            raise _Bad(f"source {s!r}: not three counts")
        out["src"][s] = [_count(x) for x in v]
    for key in ("tree_tokens", "tree_bytes"):
        for t, v in _mapping(e.get(key), {}).items():
            out[key][t] = _count(v)
    return out


def _clean_memory(rows: Any) -> list[dict[str, Any]]:
    if rows is None:
        return []
    if not isinstance(rows, list):
        raise _Bad("memory: not a list")
    out = []
    for row in rows:
        row = _mapping(row)
        if not isinstance(row.get("kind"), str):
            raise _Bad("memory: a row without a kind")
        out.append({k: v if k == "kind" else _count(v) for k, v in row.items()})
    return out


def _clean_fleet(nodes: Any) -> dict[str, dict[str, float]] | None:
    if nodes is None:
        return None
    out = {}
    for name, n in _mapping(nodes).items():
        n = _mapping(n)
        out[name] = {"lag_s": _number(n.get("lag_s", 0.0)),
                     "lag_entries": _count(n.get("lag_entries", 0)),
                     "backlog": _count(n.get("backlog", 0))}
    return out


def clean_sample(raw: Any) -> dict[str, Any] | None:
    """A stored sample in the shape ``take_sample`` gives (see the module docstring), or
    None when it is not one: a time or any number not finite, negative or past
    ``MAX_VALUE``, a part of another type."""
    try:
        s = _mapping(raw)
        pc = s.get("prompt_cache")
        return {"t": _number(s.get("t")),
                "ns": {name: _clean_ns(e) for name, e in _mapping(s.get("ns"), {}).items()},
                "all": _clean_ns(_mapping(s.get("all"), {})),
                "memory": _clean_memory(s.get("memory")),
                "prompt_cache": None if pc is None
                else {k: _count(v) for k, v in _mapping(pc).items()},
                "fleet": _clean_fleet(s.get("fleet"))}
    except _Bad:
        return None
