"""The Grafana dashboard (docs/grafana/suffixd.json, issue 37) queries only metrics the
daemon exports, is what its generator writes, and prices a step as ``suffixd stats`` does.

The names are read from every PromQL expression of the JSON (panels and variables) and
compared with the families a real Engine's registry exports (daemon/server/metrics.py
``build_registry``), with a loaded verifier and a fleet node stood in by objects that
answer as theirs do. tests/test_dashboard_browser.py compares them with a real daemon's
/metrics too.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
JSON = ROOT / "docs" / "grafana" / "suffixd.json"

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
            "or", "unless", "offset", "inf", "nan"}


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "make_dashboard", ROOT / "docs" / "grafana" / "make_dashboard.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: its identifiers once strings, label
    matchers, range and grouping clauses are gone, less functions (an identifier followed
    by a parenthesis) and keywords."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for m in re.finditer(r"(?<![\w.$])[A-Za-z_:][A-Za-z0-9_:]*", s):
        if s[m.end():].lstrip().startswith("(") or m.group() in KEYWORDS:
            continue
        names.add(m.group())
    return names


def test_metric_names_parser() -> None:
    assert metric_names('sum by (source)(rate(a_total{x="y", z!="w"}[$__rate_interval])) '
                        '/ ignoring(source) group_left sum(rate(b_total[5m]))') \
        == {"a_total", "b_total"}
    assert metric_names("max by (instance) (c) / (d > 0) * 0.32 * clamp(e - 1, 0, 3)") \
        == {"c", "d", "e"}
    assert metric_names('sum(g{a="b{c}"}) offset 5m') == {"g"}


def queried(dash: dict[str, Any]) -> set[str]:
    names: set[str] = set()
    for p in dash["panels"]:
        for t in p["targets"]:
            names |= metric_names(t["expr"])
    for v in dash["templating"]["list"]:
        q = v.get("query")
        if isinstance(q, dict):
            # label_values(METRIC, LABEL): the metric only
            m = re.fullmatch(r"\s*label_values\(\s*([A-Za-z_:][\w:]*)\s*,\s*\w+\s*\)\s*",
                             q["query"])
            assert m, q
            names.add(m.group(1))
    return names


def exported_names(tmp_path: Path) -> set[str]:
    from suffixd.daemon.engine import Engine
    from suffixd.daemon.fleet.status import FleetStatusView
    from suffixd.daemon.server.metrics import build_registry

    engine = Engine(tmp_path / "data", model_path=None)
    try:
        engine.open_session("ns", "s")
        engine.append("ns", "s", "prompt", [5, 6, 7, 8])
        engine.record_step("ns", "s", "session", 3, 2)
        verifier = SimpleNamespace(
            batch_stats=lambda: {"by_sequences": {"1": 3}, "rows": 9, "padding_rows": 1,
                                 "prompt_rows": 2, "trimmed_draft_tokens": 0,
                                 "extended_draft_tokens": 0, "queue_s": 0.1},
            prompt_cache=SimpleNamespace(as_dict=lambda: {
                "lookups": 2, "hits": 1, "saved": 1, "evicted": 0, "refused": 0, "awaited": 0,
                "reused_tokens": 40, "bytes": 100, "entries": 1, "max_bytes": 1000}))
        engine.generator = SimpleNamespace(  # type: ignore[attr-defined]
            _runtime=SimpleNamespace(cost_profile={1: 1.0, 2: 1.2}, verifier=verifier))
        status = SimpleNamespace(local_status=lambda: {
            "backlog": 0, "redis_up": True, "published": 1, "applied": 1, "skipped": 0,
            "namespaces": {"ns": {"lag_entries": 0, "lag_s": 0.0}},
            "invalid_entries": {"ns": {"bad": 1}}})
        engine.fleet = SimpleNamespace(  # type: ignore[attr-defined]
            collector=lambda: FleetStatusView.collector(status))  # type: ignore[arg-type]
        registry = build_registry(engine)
        # every generation's totals (the Prometheus hook the pipeline calls)
        engine.on_generate("ns", SimpleNamespace(  # type: ignore[attr-defined]
            completion_tokens=4, total_s=0.5, first_token_s=0.1, queue_s=0.0,
            prompt_tokens=10, cached_prompt_tokens=6))
        return {s.name for fam in registry.collect() for s in fam.samples}
    finally:
        engine.close()


def test_the_grafana_json_is_its_generators_output() -> None:
    gen = _generator()
    assert JSON.read_text() == gen.render(), \
        "docs/grafana/suffixd.json is stale: run python docs/grafana/make_dashboard.py"


def test_every_metric_the_grafana_dashboard_queries_is_exported(tmp_path: Path) -> None:
    dash = json.loads(JSON.read_text())
    names = queried(dash)
    assert len(names) >= 15, names
    exported = exported_names(tmp_path)
    missing = sorted(names - exported)
    assert not missing, f"queried but not exported: {missing}"
    # the questions of issue 37, each a panel
    titles = " | ".join(p["title"].lower() for p in dash["panels"])
    for q in ("hit rate by source", "acceptance", "tokens per step", "speed-up",
              "prompt tokens reused", "generations", "open sessions", "memory against budgets",
              "evictions", "fleet lag per node"):
        assert q in titles, q


@pytest.mark.parametrize("k", [1.0, 1.5, 2.0, 3.99, 4.0, 5.25, 8.0, 11.3, 16.0, 24.0, 32.0,
                               40.5])
def test_the_speedup_prices_a_step_as_suffixd_stats_does(k: float) -> None:
    from suffixd.cli.stats import _cost

    from suffixcache.cost import CPU_DEFAULT_POINTS, CostProfile

    expr = _generator().cost_expr("K", CPU_DEFAULT_POINTS)
    got = eval(expr, {"__builtins__": {}}, {  # noqa: S307 - our own generated arithmetic
        "K": k, "clamp": lambda v, lo, hi: min(max(v, lo), hi),
        "clamp_min": lambda v, lo: max(v, lo)})
    assert got == pytest.approx(_cost(CostProfile.cpu_default(), k), rel=1e-9)
