"""The dashboard in a real browser (issue 37): a real daemon with the HTTP front on the
embedded model, generations (HTTP and gRPC) and appends in two namespaces, then the page
opened in headless Chromium (Debian's ``chromium`` and ``chromium-driver``, driven by
selenium) and its figures and charts compared with what ``suffixd stats --json`` reports.

Screenshots go to ``$SUFFIXD_DASHBOARD_SHOTS`` when set (that is how docs/dashboard.png
and docs/dashboard-phone.png were made), else into the test's temporary folder.

Without Chromium and its driver (installed by .ci/run) the browser test skips and says
why. The same daemon's /metrics is compared with the Grafana dashboard's queries.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import DaemonProcess, missing_tool

pytestmark = pytest.mark.slow

SYSTEM = "You translate questions into SQL. Schema: singer(id, name, age, country)."
QUESTIONS = ["How many singers are there?", "List the names of singers from France.",
             "What is the average age of all singers?"]


def _browser() -> tuple[str, str]:
    chrome = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser"))
                   if p), None)
    driver = shutil.which("chromedriver")
    if chrome is None or driver is None:
        missing_tool("Chromium and its driver are not installed (Debian: apt-get install "
                     "chromium chromium-driver; .ci/run installs them)")
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing_tool("selenium is not installed (pip install -e '.[test]')")
    return chrome, driver


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chrome, driver = _browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--hide-scrollbars", "--no-first-run", "--disable-extensions",
                "--disable-background-networking", "--lang=en-US"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        # the driver's path given: selenium's own driver manager (which downloads) never runs
        drv = webdriver.Chrome(service=Service(driver), options=opts)
    except Exception as exc:  # a broken install is a skip with its reason, not a failure
        pytest.skip(f"Chromium did not start: {exc}")
    yield drv
    drv.quit()


@pytest.fixture(scope="module")
def dash_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    # a sample every second: the test's minute of traffic spans many buckets
    proc = DaemonProcess(tmp_path_factory.mktemp("dash") / "data",
                         ["--http", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0"],
                         env={"SUFFIXD_HISTORY_INTERVAL_S": "1"}).start()
    client = proc.client()
    client.proc = proc
    assert proc.http is not None
    client.base = proc.http.removesuffix("/v1")
    yield client
    client.close()
    proc.stop()


def _traffic(c: Any) -> dict[str, list[int]]:
    """Generations over HTTP and gRPC and an external verifier's appends, in "sql" and
    "ops"; per namespace, the prompt tokens the generations reported and how many of them
    were reused (usage.prompt_tokens_details.cached_tokens, totals.cached_prompt_tokens)."""
    prompts: dict[str, list[int]] = {"sql": [0, 0], "ops": [0, 0]}

    def count(ns: str, usage: dict[str, Any]) -> None:
        prompts[ns][0] += usage["prompt_tokens"]
        prompts[ns][1] += usage["prompt_tokens_details"]["cached_tokens"]

    http = httpx.Client(base_url=c.base, timeout=300)
    msgs: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    for q in QUESTIONS:  # one conversation: each turn reuses the last one's prompt
        msgs.append({"role": "user", "content": q})
        r = http.post("/v1/chat/completions", headers={"X-Suffixd-Namespace": "sql"},
                      json={"messages": msgs, "max_tokens": 20, "temperature": 0})
        assert r.status_code == 200, r.text
        count("sql", r.json()["usage"])
        msgs.append({"role": "assistant", "content": r.json()["choices"][0]["message"]
                     ["content"]})
        time.sleep(1.2)  # a sample between turns: several buckets on the charts
    prompt = "SELECT name, age FROM singer WHERE country = 'France' ORDER BY"
    for _ in range(2):  # the same completion twice: the second drafts from the first
        r = http.post("/v1/completions", headers={"X-Suffixd-Namespace": "ops"},
                      json={"prompt": prompt, "max_tokens": 24, "temperature": 0})
        assert r.status_code == 200, r.text
        count("ops", r.json()["usage"])
        time.sleep(1.2)
    chunks = list(c.generate("g-ops", namespace="ops",
                             messages=[{"role": "user", "content": "Write SQL."}],
                             max_tokens=12))
    assert "".join(ch.text for ch in chunks)
    totals = chunks[-1].totals
    prompts["ops"][0] += int(totals.get("prompt_tokens", 0))
    prompts["ops"][1] += int(totals.get("cached_prompt_tokens", 0))
    # an external verifier: appends, drafts and judged steps, no model
    for ns in ("sql", "ops"):
        sid = f"ext-{ns}"
        c.open_session(ns, sid)
        reply = c.tokenize(" SELECT count(*) FROM singer WHERE age > 30;")
        for turn in range(3):
            c.append(ns, sid, text=f"turn {turn}: how many singers are older than 30?")
            c.speculate(ns, sid, max_tokens=8)
            c.step(ns, sid, reply, final=True)
    http.close()
    return prompts


def _stats(c: Any) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "suffixd.cli.main", "stats", "--json",
                          "--data-dir", str(c.proc.data_dir)],
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout)


READ = """
const q = (s) => Array.from(document.querySelectorAll(s));
const tiles = {}, texts = {};
for (const t of q('.tile')) { tiles[t.dataset.key] = Number(t.dataset.value);
  texts[t.dataset.key] = t.querySelector('.value').textContent; }
const legend = {};
for (const li of q('.legend li[data-value]')) legend[li.dataset.key] = Number(li.dataset.value);
const charts = {};
for (const svg of q('svg.chart')) {
  const c = {refs: {}, series: {}};
  for (const r of svg.querySelectorAll('line.ref')) c.refs[r.dataset.ref] = Number(r.dataset.v);
  for (const g of svg.querySelectorAll('[data-series]'))
    c.series[g.dataset.series] = Array.from(g.querySelectorAll('[data-v]'))
      .map((e) => Number(e.dataset.v));
  charts[svg.dataset.chart] = c;
}
const small = q('svg.chart text').map((t) => t.getBoundingClientRect().height)
  .filter((h) => h > 0);
return {tiles, texts, legend, charts, scope: document.querySelector('.scope').textContent,
        minText: Math.min(...small), viewport: [window.innerWidth, window.innerHeight],
        overflow: document.documentElement.scrollWidth
        - window.innerWidth, origins: performance.getEntriesByType('resource')
        .map((e) => new URL(e.name).origin)};
"""


def _viewport(drv: Any, width: int, height: int) -> None:
    """The page's viewport exactly (a window's size would include the browser's own
    bars); a phone's is a mobile one."""
    drv.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 600})


def _open(drv: Any, url: str, width: int, height: int) -> dict[str, Any]:
    _viewport(drv, width, height)
    drv.get(url)
    page: dict[str, Any] = drv.execute_script(READ)
    assert page["viewport"] == [width, height], page["viewport"]
    return page


def _close(a: float, b: float, tol: float = 1e-9) -> bool:
    return abs(a - b) <= tol * max(1.0, abs(b))


def _check_against(page: dict[str, Any], e: dict[str, Any]) -> None:
    """The page's figures (tiles, legends, reference lines, bars) are ``suffixd stats``'s."""
    tiles, texts, legend, charts = page["tiles"], page["texts"], page["legend"], page["charts"]
    assert tiles["requests"] == e["requests"] and texts["requests"] == f"{e['requests']:,}"
    assert tiles["steps"] == e["steps"]
    assert _close(tiles["hit_rate"], e["hit_rate"]["any"])
    assert texts["hit_rate"] == f"{100 * e['hit_rate']['any']:.1f}%"
    assert _close(tiles["acceptance_rate"], e["acceptance_rate"])
    assert texts["acceptance_rate"] == f"{100 * e['acceptance_rate']:.1f}%"
    assert _close(tiles["tokens_per_step"], e["tokens_per_step"])
    assert texts["tokens_per_step"] == f"{e['tokens_per_step']:.2f}"
    assert _close(tiles["speedup"], e["estimated_speedup"]["cpu_default"])
    assert texts["speedup"] == f"{e['estimated_speedup']['cpu_default']:.2f}x"
    assert tiles["open_sessions"] == e["open_sessions"]
    assert tiles["evictions"] == e["evictions"]
    # the charts: hit rate by source (legend), the all-time reference lines, the bars
    for src in ("session", "global", "corpus", "draft_model"):
        assert _close(legend[f"hit_rate.{src}"], e["hit_rate"][src]), src
    assert _close(charts["acceptance"]["refs"]["all time"], e["acceptance_rate"])
    assert _close(charts["tokens_per_step"]["refs"]["all time"], e["tokens_per_step"])
    assert _close(legend["speedup.flat"], e["estimated_speedup"]["flat"])
    # every finished response is a bar's worth of the generations chart (the history
    # began with the daemon, before any)
    assert sum(charts["generations"]["series"]["generations"]) == e["requests"]
    assert charts["acceptance"]["series"]["acceptance"], "no acceptance plotted"
    shares = charts["hit_rate"]["series"]
    assert any(v > 0 for s in shares.values() for v in s), shares


def _sum_namespaces(st: dict[str, Any]) -> dict[str, Any]:
    """The whole daemon's figures from the namespaces' (as the page sums them)."""
    from suffixd.cli.stats import summarize_counters

    keys = ("requests", "steps", "draft_tokens_proposed", "draft_tokens_accepted",
            "generated_tokens", "speculate_calls")
    total: dict[str, Any] = {k: 0 for k in keys}
    by: dict[str, dict[str, int]] = {}
    for e in st["namespaces"]:
        for k in keys:
            total[k] += e[k]
        for src, v in e["by_source"].items():
            acc = by.setdefault(src, {"steps": 0, "proposed": 0, "accepted": 0})
            for f in acc:
                acc[f] += v[f]
    total["by_source"] = [{"source": s, **v} for s, v in by.items()]
    from suffixcache.cost import CostProfile

    out = summarize_counters(total, CostProfile.cpu_default())
    out["open_sessions"] = sum(e["open_sessions"] for e in st["namespaces"])
    out["evictions"] = sum(e["evictions"] for e in st["namespaces"])
    return out


def _shot(drv: Any, out: Path, name: str, width: int, height: int, full: bool = False,
          scroll_to: str = "") -> Path:
    _viewport(drv, width, height)
    if scroll_to:
        drv.execute_script(f"document.querySelector({scroll_to!r}).scrollIntoView()")
    if full:  # the whole page in one picture (for the README)
        h = drv.execute_script("return document.documentElement.scrollHeight")
        _viewport(drv, width, int(h))
    time.sleep(0.3)
    path = out / name
    assert drv.save_screenshot(str(path)), path
    _viewport(drv, width, height)
    return path


def test_the_dashboard_shows_what_suffixd_stats_reports(dash_daemon: Any, browser: Any,
                                                         tmp_path: Path) -> None:
    c = dash_daemon
    prompts = _traffic(c)
    time.sleep(2.5)  # two samples past the last request
    st = _stats(c)
    by_ns = {e["namespace"]: e for e in st["namespaces"]}
    assert {"sql", "ops"} <= set(by_ns)
    assert by_ns["sql"]["requests"] >= 3 and by_ns["ops"]["requests"] >= 3
    assert by_ns["sql"]["steps"] > 0 and by_ns["ops"]["draft_tokens_accepted"] > 0

    # per namespace, at a desktop's size
    for ns in ("sql", "ops"):
        page = _open(browser, f"{c.base}/dashboard?ns={ns}", 1280, 800)
        assert page["scope"].startswith(f"namespace {ns}")
        _check_against(page, by_ns[ns])
        for tree in ("global", "corpus", "sessions"):
            assert page["legend"][f"memory.{tree}"] == by_ns[ns]["cache"][tree]["tokens"]
        assert page["overflow"] <= 0, "wider than the window"
        # the prompt tokens the generations reported (stats has no such figure)
        assert page["tiles"]["reused_prompt_tokens"] == prompts[ns][1]
        assert page["legend"]["evaluated_prompt_tokens"] == prompts[ns][0] - prompts[ns][1]
        assert sum(page["charts"]["prompt"]["series"]["reused"]) == prompts[ns][1]

    # the whole daemon: the namespaces summed, and the verifier's prompt cache
    page = _open(browser, f"{c.base}/dashboard", 1280, 800)
    assert page["scope"].startswith("the whole daemon")
    _check_against(page, _sum_namespaces(st))
    pc = (st.get("generator") or {}).get("prompt_cache") or {}
    assert page["tiles"]["prompt_cache_reused_tokens"] == pc.get("reused_tokens", 0)
    for m in st["memory"]:
        tree = "sessions" if m["kind"] == "session" else m["kind"]
        assert page["legend"][f"memory.{tree}"] == m["tokens"]
    # the chat's later turns each started from the conversation before them
    assert prompts["sql"][1] > 0
    sql = _open(browser, f"{c.base}/dashboard?ns=sql", 1280, 800)
    # nothing from anywhere but the daemon: no CDN, no font, no network
    assert set(page["origins"]) <= {c.base}, page["origins"]
    assert page["minText"] >= 9, f"chart text {page['minText']:.1f} px high"
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors

    shots = Path(os.environ.get("SUFFIXD_DASHBOARD_SHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    _viewport(browser, 1280, 800)
    browser.get(f"{c.base}/dashboard")
    wide = _shot(browser, shots, "dashboard.png", 1280, 800, full=True)
    browser.get(f"{c.base}/dashboard?ns=sql")
    wide_view = _shot(browser, shots, "dashboard-1280x800.png", 1280, 800)

    # a phone: one column, nothing wider than the screen, text still readable
    phone = _open(browser, f"{c.base}/dashboard?ns=sql", 390, 844)
    assert phone["overflow"] <= 0, "wider than a phone's screen"
    assert phone["minText"] >= 9, f"chart text {phone['minText']:.1f} px high on a phone"
    _check_against(phone, by_ns["sql"])
    cols = browser.execute_script(
        "return getComputedStyle(document.querySelector('.grid'))"
        ".gridTemplateColumns.split(' ').length")
    assert cols == 1, cols
    phone_shot = _shot(browser, shots, "dashboard-phone.png", 390, 844)
    phone_charts = _shot(browser, shots, "dashboard-phone-charts.png", 390, 844,
                         scroll_to="section.card")
    for p in (wide, wide_view, phone_shot, phone_charts):
        assert p.stat().st_size > 10_000, p

    # it refreshes itself: a new generation shows up without a reload
    before = sql["tiles"]["requests"]
    _viewport(browser, 1280, 800)
    browser.get(f"{c.base}/dashboard?ns=sql")
    r = httpx.post(f"{c.base}/v1/completions", headers={"X-Suffixd-Namespace": "sql"},
                   json={"prompt": "SELECT", "max_tokens": 4}, timeout=300)
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 30
    now = before
    while time.monotonic() < deadline and now == before:
        time.sleep(0.5)
        now = browser.execute_script(
            "return Number(document.querySelector('.tile[data-key=requests]').dataset.value)")
    assert now == before + 1, (before, now)

    # the history as JSON: the samples, oldest first, the last one taken now
    h = httpx.get(f"{c.base}/dashboard/history.json?ns=ops", timeout=30).json()
    assert h["interval_s"] == 1 and h["kept"]
    ts = [s["t"] for s in h["samples"]]
    assert ts == sorted(ts) and len(ts) >= 5
    assert h["samples"][-1]["live"] and h["samples"][-1]["namespace"]["requests"] \
        == by_ns["ops"]["requests"]


def test_the_grafana_dashboard_queries_what_the_real_daemon_exports(dash_daemon: Any) -> None:
    """Every metric docs/grafana/suffixd.json queries is in the real daemon's /metrics
    once it has generated (the verifier's figures appear with the model), but the fleet's,
    which only a daemon in a fleet exports (tests/test_grafana_dashboard.py checks those
    against the fleet's collector)."""
    from tests.test_grafana_dashboard import JSON, queried

    c = dash_daemon
    r = httpx.post(f"{c.base}/v1/completions", headers={"X-Suffixd-Namespace": "metrics"},
                   json={"prompt": "SELECT", "max_tokens": 2}, timeout=300)
    assert r.status_code == 200, r.text
    addr = (c.proc.data_dir / "metrics.addr").read_text().strip()
    text = httpx.get(f"http://{addr}/metrics", timeout=30).text
    exported = {line.split("{")[0].split(" ")[0] for line in text.splitlines()
                if line and not line.startswith("#")}
    wanted = {n for n in queried(json.loads(JSON.read_text()))
              if not n.startswith("suffixd_fleet_")}
    assert not sorted(wanted - exported), sorted(wanted - exported)
