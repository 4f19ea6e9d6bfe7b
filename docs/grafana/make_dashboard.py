"""Writes docs/grafana/suffixd.json, the Grafana dashboard over the daemon's Prometheus
metrics (``suffixd serve --metrics-addr``): the questions the daemon's own page
(``/dashboard``) answers, over whatever Prometheus keeps.

    python docs/grafana/make_dashboard.py        # rewrite the JSON
    python docs/grafana/make_dashboard.py --check  # exit 1 if the JSON is not current

Written by a script because one figure needs arithmetic nobody should type by hand: the
estimated speed-up prices a step with the default CPU cost profile (as ``suffixd stats``
does), a piecewise-linear function that PromQL spells as a sum of ``clamp``s, one per
segment, generated here from ``suffixcache.cost.CPU_DEFAULT_POINTS``.
tests/test_grafana_dashboard.py checks that the JSON is this script's output and that
every metric it queries is one the daemon exports.

Namespaces: the ``namespace`` variable lists the values of the label, which is "all"
unless the daemon runs with ``--metrics-namespaces``. Nodes: every daemon of a fleet is a
Prometheus target, so "per node" is per ``instance``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("suffixd.json")
NS = '{namespace=~"$namespace"}'
DRAFTED = '{namespace=~"$namespace", source!="none"}'  # the steps that had a draft
W = "[$__rate_interval]"


def cost_expr(k: str, points: dict[int, float]) -> str:
    """PromQL for the piecewise-linear cost of verifying ``k`` tokens (k >= 1): cost(1)
    plus, for each segment, its slope times the part of k inside it (the last segment's
    slope goes on past the last point, as CostProfile.cost does)."""
    pts = sorted(points.items())
    base = pts[0][1]
    terms = [f"{pts[0][1] / base:g}"]
    for i, ((k0, c0), (k1, c1)) in enumerate(zip(pts, pts[1:], strict=False)):
        slope = (c1 - c0) / base / (k1 - k0)
        last = i == len(pts) - 2
        part = (f"clamp_min({k} - {k0}, 0)" if last
                else f"clamp({k} - {k0}, 0, {k1 - k0})")
        terms.append(f"{slope:.6g} * {part}")
    return "(" + " + ".join(terms) + ")"


def rate(metric: str, sel: str = NS, by: str = "") -> str:
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping}(rate({metric}{sel}{W}))"


def panel(pid: int, title: str, desc: str, targets: list[tuple[str, str]], x: int, y: int, *,
          unit: str = "short", stack: bool = False, max_: float | None = None,
          w: int = 8, h: int = 8, bars: bool = False) -> dict[str, Any]:
    defaults: dict[str, Any] = {
        "unit": unit,
        "min": 0,
        "custom": {
            "drawStyle": "bars" if bars else "line",
            "lineWidth": 2,
            "fillOpacity": 60 if stack or bars else 10,
            "stacking": {"mode": "normal" if stack else "none", "group": "A"},
            "showPoints": "auto",
            "spanNulls": False,
        },
    }
    if max_ is not None:
        defaults["max"] = max_
    return {
        "id": pid,
        "type": "timeseries",
        "title": title,
        "description": desc,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"},
                    "tooltip": {"mode": "multi"}},
        "targets": [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend,
                     "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                    for i, (expr, legend) in enumerate(targets)],
    }


def build() -> dict[str, Any]:
    from suffixcache.cost import CPU_DEFAULT_POINTS

    steps = rate("suffixd_steps_total")
    prop = rate("suffixd_draft_tokens_proposed_total")
    acc = rate("suffixd_draft_tokens_accepted_total")
    tps = f"(({acc} + {steps}) / {steps})"
    mean_k = f"({prop} / {steps} + 1)"
    panels = [
        panel(1, "Draft hit rate by source",
              "Share of verified steps that had a draft, by the source it came from "
              "(session, global, corpus, draft model).",
              [(f"{rate('suffixd_steps_total', DRAFTED, 'source')}"
                f" / ignoring(source) group_left {steps}", "{{source}}")],
              0, 0, unit="percentunit", stack=True, max_=1),
        panel(2, "Acceptance", "Drafted tokens the verifier accepted.",
              [(f"{acc} / {prop}", "acceptance")], 8, 0, unit="percentunit", max_=1),
        panel(3, "Tokens per step", "Accepted draft tokens per verified step, plus the "
              "verifier's own token.", [(tps, "tokens per step")], 16, 0),
        panel(4, "Estimated speed-up against plain decoding",
              "Tokens per step over the cost of verifying the mean draft + 1 tokens: on the "
              "default CPU cost profile (as suffixd stats estimates it), and on a flat one "
              "(a GPU, where that cost barely grows). 1 is plain decoding.",
              [(f"{tps} / {cost_expr(mean_k, CPU_DEFAULT_POINTS)}", "CPU cost profile"),
               (tps, "flat cost")], 0, 8, unit="x"),
        panel(5, "Prompt tokens reused",
              "Prompt tokens per second of generations: not evaluated again (the session's "
              "KV cache or a prompt cache checkpoint) and evaluated; and those restored from "
              "the prompt cache's checkpoints alone. Over the whole daemon.",
              [("sum(rate(suffixd_generate_reused_prompt_tokens_total" + W + "))", "reused"),
               ("sum(rate(suffixd_generate_prompt_tokens_total" + W + ")) - "
                "sum(rate(suffixd_generate_reused_prompt_tokens_total" + W + "))", "evaluated"),
               ("sum(rate(suffixd_prompt_cache_reused_tokens_total" + W + "))",
                "from prompt cache checkpoints")], 8, 8, unit="short"),
        panel(6, "Generations", "Finished responses per minute.",
              [(f"60 * {rate('suffixd_requests_total')}", "per minute")], 16, 8, bars=True),
        panel(7, "Open sessions", "Sessions open now.",
              [(f"sum(suffixd_open_sessions{NS})", "open sessions")], 0, 16),
        panel(8, "Memory against budgets",
              "Share of each budget the trees hold: session trees against the budget over "
              "the whole daemon, global trees against their per-namespace budget times the "
              "namespaces (a budget of 0 is none: not drawn).",
              [('sum by (instance) (suffixd_memory_tokens{kind="session"}) / '
                'sum by (instance) (suffixd_memory_budget_tokens{kind="session", scope="all"} '
                "> 0)", "session tokens {{instance}}"),
               ('sum by (instance) (suffixd_memory_bytes{kind="session"}) / '
                'sum by (instance) (suffixd_memory_budget_bytes{kind="session", scope="all"} '
                "> 0)", "session bytes {{instance}}"),
               ('sum by (instance) (suffixd_memory_tokens{kind="global"}) / '
                'sum by (instance) (suffixd_memory_budget_tokens{kind="global", '
                'scope="per_tree"} > 0) / sum by (instance) '
                '(suffixd_memory_trees{kind="global"})', "global tokens {{instance}}")],
              8, 16, unit="percentunit"),
        panel(9, "Memory held", "Bytes held by the trees, by kind.",
              [("sum by (kind) (suffixd_memory_bytes)", "{{kind}}")], 16, 16, unit="bytes"),
        panel(10, "Evictions", "Sequences evicted from the global trees (their token "
              "budget) per minute.",
              [(f'60 * sum(rate(suffixd_cache_evictions_total{{namespace=~"$namespace"}}{W}))',
                "per minute")], 0, 24, bars=True),
        panel(11, "Fleet lag per node",
              "Age of the oldest peer entry each node has not applied yet (suffixd serve "
              "--fleet), and its entries waiting to be published.",
              [("max by (instance) (suffixd_fleet_lag_seconds)", "lag {{instance}}"),
               ("max by (instance) (suffixd_fleet_backlog)", "backlog {{instance}}")],
              8, 24, unit="s"),
        panel(12, "Fleet entries behind per node", "Peer entries not applied yet.",
              [("sum by (instance) (suffixd_fleet_lag_entries)", "{{instance}}")], 16, 24),
    ]
    return {
        "title": "suffixd: draft cache",
        "uid": "suffixd-draft-cache",
        "description": "Is the suffix cache working: hit rates by source, acceptance, "
                       "speed-up, prompt reuse, sessions, memory, fleet lag. Generated by "
                       "docs/grafana/make_dashboard.py.",
        "tags": ["suffixd", "speculative decoding"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus",
             "label": "Prometheus"},
            {"name": "namespace", "type": "query", "label": "namespace",
             "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "query": {"query": "label_values(suffixd_requests_total, namespace)",
                       "refId": "namespaces"},
             "definition": "label_values(suffixd_requests_total, namespace)",
             "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2,
             "current": {"text": "All", "value": "$__all"}},
        ]},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


def main() -> int:
    text = render()
    if "--check" in sys.argv[1:]:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is not current: run python {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
