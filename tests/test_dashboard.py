"""The dashboard's parts without a browser or a model (issue 37): its figures are
``suffixd stats``'s, the buckets add up to the counters, the history survives a restart
and refuses what it did not write, the page is well-formed, escaped and behind the token.
The page in a real browser against a real daemon: tests/test_dashboard_browser.py."""

from __future__ import annotations

import base64
import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.testclient import TestClient
from suffixd.daemon.http_api.dashboard import Dashboard, build_view, render_panel
from suffixd.daemon.http_api.dashboard_data import (
    SOURCES,
    bucketize,
    diff_ns,
    empty_ns,
    figures,
)
from suffixd.daemon.http_api.dashboard_svg import Ref, Series, chart, pct, y_ticks
from suffixd.daemon.server.history import History

counts = st.integers(min_value=0, max_value=10**9)


@st.composite
def raw_counters(draw: Any) -> dict[str, Any]:
    src = {s: [draw(counts), draw(counts), draw(counts)]
           for s in draw(st.sets(st.sampled_from(SOURCES)))}
    steps = sum(v[0] for v in src.values()) + draw(st.integers(0, 5))
    return {**empty_ns(), "steps": steps, "proposed": sum(v[1] for v in src.values()),
            "accepted": sum(v[2] for v in src.values()), "src": src,
            "requests": draw(counts), "generated": draw(counts)}


@settings(max_examples=300, deadline=None)
@given(raw_counters())
def test_figures_are_what_suffixd_stats_derives(c: dict[str, Any]) -> None:
    from suffixd.cli.stats import summarize_counters

    from suffixcache.cost import CostProfile

    rpc = {"steps": c["steps"], "draft_tokens_proposed": c["proposed"],
           "draft_tokens_accepted": c["accepted"],
           "by_source": [{"source": s, "steps": v[0], "proposed": v[1], "accepted": v[2]}
                         for s, v in c["src"].items()]}
    want = summarize_counters(rpc, CostProfile.cpu_default())
    got = figures(c)
    assert got["hit_rate"] == want["hit_rate"]
    assert got["acceptance_rate"] == want["acceptance_rate"]
    assert got["tokens_per_step"] == want["tokens_per_step"]
    assert got["mean_accepted_per_step"] == want["mean_accepted_per_step"]
    assert got["estimated_speedup"] == want["estimated_speedup"]


def _sample(t: float, ns: dict[str, dict[str, Any]]) -> dict[str, Any]:
    total = empty_ns()
    from suffixd.daemon.http_api.dashboard_data import add_ns

    for e in ns.values():
        add_ns(total, e)
    return {"t": t, "ns": ns, "all": total, "memory": [], "prompt_cache": None, "fleet": None}


def _ns(requests: int, steps: int, session_steps: int) -> dict[str, Any]:
    return {**empty_ns(), "requests": requests, "steps": steps,
            "src": {"session": [session_steps, 2 * session_steps, session_steps]}}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=2, max_size=60), st.integers(1, 7))
def test_buckets_add_up_to_the_counters(grow: list[int], width: int) -> None:
    """Whatever the bucket width, the differences summed are the counters' growth since
    the history's first sample (which only sets where counting starts)."""
    samples, total = [], 0
    for i, g in enumerate(grow):
        total += g
        samples.append(_sample(100.0 + i, {"a": _ns(total, 2 * total, total)}))
    for ns in (None, "a"):
        b = bucketize(samples, ns, 99.0, 100.0 + len(grow), float(width))
        assert b.total()["requests"] == total - grow[0], ns
        assert b.total()["src"]["session"][0] == total - grow[0]


def test_a_counter_that_went_down_counts_from_zero() -> None:
    # a restart that lost its last unflushed counts, or a namespace dropped and made again
    d = diff_ns(_ns(3, 10, 4), _ns(7, 20, 8))
    assert d["requests"] == 3 and d["steps"] == 10 and d["src"]["session"] == [4, 8, 4]
    assert diff_ns(_ns(9, 25, 9), _ns(7, 20, 8))["src"]["session"] == [1, 2, 1]


def test_y_ticks_are_round_and_whole_where_counted() -> None:
    assert y_ticks(0.7, 1.0) == (1.0, [0.0, 0.25, 0.5, 0.75, 1.0])
    top, ticks = y_ticks(3.0, integer=True)
    assert top >= 3 and all(t == int(t) for t in ticks)
    top, ticks = y_ticks(0.0)
    assert top > 0 and len(ticks) >= 2


def test_charts_are_well_formed_svg_with_their_values() -> None:
    times = [0.0, 10.0, 20.0, 30.0]
    for kind in ("line", "bars", "stacked"):
        svg = chart(kind, times, 10.0, [Series("a <b>", "a", [0.5, None, 0.25, 1.0]),
                                        Series("c", "b", [0.1, 0.2, None, 0.0])],
                    t0=0.0, t1=40.0, fmt=pct, label="x & y", y_max=1.0 if kind != "stacked"
                    else None, refs=[Ref("all time", "ref", 0.4)], key="k")
        root = ET.fromstring(svg)
        vals = [float(e.get("data-v")) for e in root.iter() if e.get("data-v") is not None
                and e.get("data-ref") is None]
        assert 0.5 in vals and 0.25 in vals, kind
        refs = [e for e in root.iter() if e.get("data-ref")]
        assert [float(r.get("data-v")) for r in refs] == [0.4]
    empty = chart("line", times, 10.0, [Series("a", "a", [None] * 4)], t0=0.0, t1=40.0,
                  fmt=pct, label="nothing")
    assert "no data yet" in empty
    ET.fromstring(empty)


class _Engine:
    """What the dashboard reads of an engine: stats, memory, the generator, a fleet."""

    def __init__(self) -> None:
        self.counters = {"requests": 4, "steps": 10, "draft_tokens_proposed": 30,
                         "draft_tokens_accepted": 12, "generated_tokens": 40,
                         "speculate_calls": 0,
                         "by_source": {"session": {"steps": 6, "proposed": 20, "accepted": 9},
                                       "corpus": {"steps": 2, "proposed": 10, "accepted": 3},
                                       "none": {"steps": 2, "proposed": 0, "accepted": 0}}}
        self.generator = SimpleNamespace(loaded=None)
        self.model_path = None

    def stats(self, top_documents: int = 10) -> dict[str, Any]:
        e = {"counters": self.counters, "open_sessions": 2,
             "cache": {"global": {"tokens": 50, "bytes": 900, "evictions": 3},
                       "corpus": {"tokens": 7, "bytes": 100},
                       "sessions": {"tokens": 20, "bytes": 400}}}
        return {"sql": e, "<b>ops</b>": dict(e)}

    def memory(self) -> list[dict[str, Any]]:
        return [{"kind": k, "trees": 2, "tokens": 10, "bytes": 100, "budget_tokens": 1000,
                 "budget_bytes": 0, "budget_tokens_per_tree": 500, "budget_bytes_per_tree": 0}
                for k in ("session", "global", "corpus")]


def test_the_page_is_escaped_and_shows_stats_figures() -> None:
    eng = _Engine()
    client = TestClient(Starlette(routes=Dashboard(eng, token=None).routes()))
    r = client.get("/dashboard", params={"ns": "<script>alert(1)</script>"})
    assert r.status_code == 200
    assert "<script>alert" not in r.text and "&lt;script&gt;" in r.text
    assert "no namespace" in r.text
    page = client.get("/dashboard", params={"ns": "sql"}).text
    assert "<b>ops</b>" not in page and "&lt;b&gt;ops&lt;/b&gt;" in page  # the picker
    assert 'data-key="acceptance_rate" data-value="0.4"' in page
    assert ">40.0%<" in page and ">80.0%<" in page  # acceptance, hit rate
    assert "script-src 'self'" in client.get("/dashboard").headers["content-security-policy"]
    assert client.get("/dashboard/").status_code == 200  # redirected
    for name in ("dashboard.css", "dashboard.js", "favicon.svg"):
        assert client.get(f"/dashboard/static/{name}").status_code == 200, name
    assert client.get("/dashboard/static/..%2Fdashboard.py").status_code == 404
    h = client.get("/dashboard/history.json", params={"ns": "sql"}).json()
    assert not h["kept"] and h["samples"][-1]["namespace"]["requests"] == 4


def test_the_dashboard_wants_the_token_as_bearer_or_basic_password() -> None:
    client = TestClient(Starlette(routes=Dashboard(_Engine(), token="s3cret").routes()))
    for path in ("/dashboard", "/dashboard/panel", "/dashboard/history.json",
                 "/dashboard/static/dashboard.js"):
        r = client.get(path)
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Basic")
    assert client.get("/dashboard", auth=("anyone", "s3cret")).status_code == 200
    assert client.get("/dashboard", auth=("anyone", "wrong")).status_code == 401
    assert client.get("/dashboard", headers={"Authorization": "Bearer s3cret"}).status_code \
        == 200
    assert client.get("/dashboard", headers={"Authorization": "Bearer s3cre"}).status_code \
        == 401
    junk = base64.b64encode(b"no colon").decode()
    assert client.get("/dashboard", headers={"Authorization": f"Basic {junk}"}).status_code \
        == 401
    assert client.get("/dashboard", headers={"Authorization": "Basic %%%"}).status_code == 401


def test_the_history_survives_a_restart_and_refuses_what_it_did_not_write(
        tmp_path: Path) -> None:
    eng = _Engine()
    path = tmp_path / "history.json"
    h = History(eng, path, interval_s=60, max_samples=3)
    h.count_generation("sql", SimpleNamespace(prompt_tokens=30, cached_prompt_tokens=20))
    for _ in range(5):
        h.sample()
    h.save()
    assert len(h.samples()) == 3  # bounded
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    again = History(eng, path, interval_s=60, max_samples=3)
    again.load()
    assert again.samples() == json.loads(json.dumps(h.samples()))
    assert again.samples()[-1]["ns"]["sql"]["reused_prompt_tokens"] == 20
    # a file that does not parse is set aside, not fatal
    path.write_text("{not json")
    fresh = History(eng, path, interval_s=60)
    fresh.load()
    assert fresh.samples() == [] and (tmp_path / "history.json.bad").exists()
    # a link is not followed
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps({"samples": [{"t": 1.0}]}))
    os.symlink(target, path)
    linked = History(eng, path, interval_s=60)
    linked.load()
    assert linked.samples() == []


def test_on_generate_is_chained_after_an_earlier_hook() -> None:
    eng = _Engine()
    seen: list[str] = []
    eng.on_generate = lambda ns, stats: seen.append(ns)  # type: ignore[attr-defined]
    h = History(eng, None)
    h.attach()
    eng.on_generate("sql", SimpleNamespace(prompt_tokens=5, cached_prompt_tokens=1))  # type: ignore[attr-defined]
    assert seen == ["sql"] and h.now()["ns"]["sql"]["prompt_tokens"] == 5


def test_a_view_of_a_young_history_still_has_an_axis() -> None:
    eng = _Engine()
    h = History(eng, None, interval_s=60)
    live = h.now()
    view = build_view([], live, 60.0, "sql", "all")
    assert view.t1 - view.t0 >= 600
    html = render_panel(view)
    ET.fromstring(f"<div>{html}</div>")  # well-formed


@pytest.mark.parametrize("rng", ["all", "1h", "6h", "24h", "bogus"])
def test_every_range_renders(rng: str) -> None:
    client = TestClient(Starlette(routes=Dashboard(_Engine(), token=None).routes()))
    r = client.get("/dashboard/panel", params={"range": rng})
    assert r.status_code == 200 and "svg" in r.text


def test_the_http_front_serves_the_dashboard_behind_its_token() -> None:
    from suffixd.daemon.http_api.app import OpenAIFront

    front = OpenAIFront(_Engine(), SimpleNamespace(), token="s3cret",  # type: ignore[arg-type]
                        require_token=True, max_body_bytes=1 << 20)
    client = TestClient(front.app)
    assert client.get("/dashboard").status_code == 401
    assert client.get("/dashboard", auth=("", "s3cret")).status_code == 200
    assert client.get("/dashboard/history.json",
                      headers={"Authorization": "Bearer s3cret"}).status_code == 200
    open_front = OpenAIFront(_Engine(), SimpleNamespace(), token=None,  # type: ignore[arg-type]
                             require_token=False, max_body_bytes=1 << 20)
    assert TestClient(open_front.app).get("/dashboard").status_code == 200


def test_fleet_lag_is_drawn_per_node() -> None:
    """Every node's last heartbeat (and this node's own figures, the freshest) is a line
    of the fleet chart, its lag now in the legend."""
    eng = _Engine()
    lag = {"a": 0.5, "b": 2.0}

    def status() -> dict[str, Any]:
        return {"node": {"node": "a", "lag_s": lag["a"], "lag_entries": 1, "backlog": 0},
                "nodes": {"a": {"lag_s": 9.0}, "b": {"lag_s": lag["b"], "lag_entries": 4}}}

    eng.fleet = SimpleNamespace(status=status)  # type: ignore[attr-defined]
    h = History(eng, None, interval_s=1)
    for _ in range(3):
        h.sample()
    lag["b"] = 3.0
    live = h.now()
    samples = h.samples()
    for i, sample in enumerate(samples):  # seconds apart: buckets of their own
        sample["t"] = live["t"] - 2 * (len(samples) - i)
    view = build_view(samples, live, 1.0, None, "all")
    html = render_panel(view)
    ET.fromstring(f"<div>{html}</div>")
    assert 'data-key="fleet.a" data-value="0.5"' in html
    assert 'data-key="fleet.b" data-value="3.0"' in html
    assert 'data-key="fleet_lag_s" data-value="3.0"' in html
    assert html.count('data-series="b"') == 1 and 'data-v="2.0"' in html
