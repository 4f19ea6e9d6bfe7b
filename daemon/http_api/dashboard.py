"""The dashboard: ``GET /dashboard`` on the HTTP front (``suffixd serve --http``).

Is the cache working, for which namespaces, from which source, how much time does it
save, is it still warming up, are budgets evicting, is the fleet keeping up: per
namespace and for the whole daemon, over the daemon's recent past (the history that
daemon/server/history.py keeps, a sample a minute for a day by default) up to now.

* ``/dashboard?ns=NAME&range=all|1h|6h|24h``: the page. Figures since the counters began
  (the same as ``suffixd stats``: daemon/http_api/dashboard_data.py ``figures``) and charts
  over time: draft hit rate by source, acceptance, tokens per step, estimated speed-up
  against plain decoding, prompt tokens reused, generations, open sessions, memory
  against the budgets, evictions, fleet lag per node. It refreshes itself every
  ``REFRESH_S`` seconds (the script fetches ``/dashboard/panel`` with the same query and
  swaps the panel in; without scripts a ``<noscript>`` refresh reloads the page).
* ``/dashboard/history.json?ns=NAME``: the history as JSON (the samples, oldest first,
  the last one taken now), for scripts and for whoever wants other charts.
* ``/dashboard/static/dashboard.{css,js}``, ``favicon.svg``: the page's files, shipped in
  the package (``dashboard_static/``, pyproject package-data).

What draws the charts, and why: the server, as SVG text (daemon/http_api/dashboard_svg.py).
No network at run time rules out a CDN; a charting library vendored into the package
would be a few hundred KB of someone else's JavaScript to keep up to date for ten plain
line and bar charts. Server-drawn SVG needs no dependency, is testable in Python, shows
with scripts off, costs the browser a few KB per chart however long the history (the
samples are bucketed to at most 120 per chart before drawing), and renders the same in
every browser. The one script of our own (40 lines) only refreshes the panel and
switches namespace on a choice.

Auth: the API's. Off loopback (or with a token configured) every route needs the bearer
token, as ``Authorization: Bearer TOKEN`` or, so that a browser can open the page, HTTP
Basic with the token as the password (any user name): the 401 asks the browser for it.
Every page is sent with a Content-Security-Policy that allows only this origin's script
and style (no inline code), no framing and no other connection.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import importlib.resources
import json
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import PurePath
from typing import Any
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from .dashboard_data import (
    DRAFT_SOURCES,
    MAX_TRACKED,
    Buckets,
    bucketize,
    figures,
    nice_width,
    pick,
    rates,
    take_sample,
)
from .dashboard_svg import Ref, Series, chart, count, nbytes, pct, seconds, times_x
from .guard import bearer_matches

REFRESH_S = 5
RANGES = {"all": math.inf, "1h": 3600.0, "6h": 6 * 3600.0, "24h": 86400.0}
MIN_SPAN_INTERVALS = 10  # a young history still gets an axis of some length
STATIC = {"dashboard.css": "text/css; charset=utf-8",
          "dashboard.js": "text/javascript; charset=utf-8",
          "favicon.svg": "image/svg+xml"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
SOURCE_NAMES = {"session": "session", "global": "global", "corpus": "corpus",
                "draft_model": "draft model"}


class Unauthorized(Exception):
    pass


class Dashboard:
    """The dashboard's routes over an engine (and its ``history``, when kept)."""

    def __init__(self, engine: Any, *, token: str | None) -> None:
        self.engine = engine
        self._token = token.encode() if token else None

    def routes(self) -> list[Route]:
        return [
            Route("/dashboard", self._guarded(self.page), methods=["GET"]),
            Route("/dashboard/", self._redirect, methods=["GET"]),
            Route("/dashboard/panel", self._guarded(self.panel), methods=["GET"]),
            Route("/dashboard/history.json", self._guarded(self.history_json),
                  methods=["GET"]),
            Route("/dashboard/static/{name}", self._guarded(self.static), methods=["GET"]),
        ]

    # ------------------------------------------------------------------ auth
    def _authorized(self, request: Request) -> bool:
        if self._token is None:
            return True  # open: loopback without a token, or --insecure
        got = request.headers.get("authorization", "")
        if bearer_matches(got, self._token):
            return True
        scheme, _, value = got.partition(" ")
        if scheme.lower() == "basic":
            try:
                decoded = base64.b64decode(value.strip(), validate=True)
            except (binascii.Error, ValueError):
                return False
            _, _, password = decoded.partition(b":")
            return hmac.compare_digest(password, self._token)
        return False

    def _guarded(self, handler: Callable[[Request], Awaitable[Response]]
                 ) -> Callable[[Request], Awaitable[Response]]:
        async def guarded(request: Request) -> Response:
            if not self._authorized(request):
                return Response(
                    "the dashboard needs the daemon's token (as the password, any user "
                    "name; or Authorization: Bearer TOKEN)\n", status_code=401,
                    media_type="text/plain",
                    headers={"WWW-Authenticate": 'Basic realm="suffixd", charset="UTF-8"'})
            response = await handler(request)
            response.headers["Content-Security-Policy"] = CSP
            response.headers["X-Content-Type-Options"] = "nosniff"
            response.headers["Referrer-Policy"] = "no-referrer"
            response.headers.setdefault("Cache-Control", "no-store")
            return response
        return guarded

    async def _redirect(self, request: Request) -> Response:
        q = f"?{request.url.query}" if request.url.query else ""
        return RedirectResponse("/dashboard" + q, status_code=308)

    # ------------------------------------------------------------------ routes
    # The figures are read (engine.stats, under the engine's locks) and drawn on a worker
    # thread: the event loop also streams generations.
    async def page(self, request: Request) -> Response:
        view = await run_in_threadpool(self._view, request)
        html = await run_in_threadpool(render_page, view)
        return Response(html, media_type="text/html; charset=utf-8")

    async def panel(self, request: Request) -> Response:
        view = await run_in_threadpool(self._view, request)
        html = await run_in_threadpool(render_panel, view)
        return Response(html, media_type="text/html; charset=utf-8")

    async def history_json(self, request: Request) -> Response:
        ns = request.query_params.get("ns") or None
        # a day of samples is megabytes of JSON: encoded off the event loop too
        body = await run_in_threadpool(self._history_body, ns)
        return Response(body, media_type="application/json")

    def _history_body(self, ns: str | None) -> bytes:
        samples, live, interval = self._samples()
        every = [*samples, {**live, "live": True}]
        if ns is not None:
            every = [{"t": s["t"], "namespace": pick(s, ns), "memory": s.get("memory"),
                      "prompt_cache": s.get("prompt_cache"), "fleet": s.get("fleet"),
                      **({"live": True} if s.get("live") else {})} for s in every]
        history = getattr(self.engine, "history", None)
        return json.dumps({
            "interval_s": interval,
            "max_samples": getattr(history, "max_samples", 0),
            "kept": history is not None,
            "max_tracked_namespaces": MAX_TRACKED,
            "namespace": ns,
            "samples": every,
        }, separators=(",", ":")).encode()

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC:
            return Response("not found\n", status_code=404, media_type="text/plain")
        data = importlib.resources.files(__package__).joinpath(
            "dashboard_static", name).read_bytes()
        return Response(data, media_type=STATIC[name],
                        headers={"Cache-Control": "max-age=300"})

    # ------------------------------------------------------------------ data
    def _samples(self) -> tuple[list[dict[str, Any]], dict[str, Any], float]:
        history = getattr(self.engine, "history", None)
        if history is None:
            return [], take_sample(self.engine), 60.0
        return history.samples(), history.now(), float(history.interval_s)

    def _view(self, request: Request) -> View:
        ns = request.query_params.get("ns") or None
        rng = request.query_params.get("range", "all")
        if rng not in RANGES:
            rng = "all"
        samples, live, interval = self._samples()
        gen = getattr(self.engine, "generator", None)
        model = getattr(self.engine, "model_path", None)
        return build_view(samples, live, interval, ns, rng,
                          model=PurePath(str(model)).name if model else None,
                          loaded=getattr(gen, "loaded", None) is not None,
                          kept=getattr(self.engine, "history", None) is not None)


# ------------------------------------------------------------------------ the view
@dataclass
class View:
    """What one page shows: the figures now (``live``; ``cur``: the namespace's, or the
    daemon's), and the buckets to draw from ``t0`` to ``t1``."""

    ns: str | None
    rng: str
    live: dict[str, Any]
    cur: dict[str, Any] | None
    buckets: Buckets
    t0: float
    t1: float
    interval: float
    namespaces: list[str]
    model: str | None
    loaded: bool
    kept: bool
    samples: int


def build_view(samples: Sequence[dict[str, Any]], live: dict[str, Any], interval: float,
               ns: str | None, rng: str, *, model: str | None = None, loaded: bool = False,
               kept: bool = True) -> View:
    every = [*samples, live]
    t1 = float(live["t"])
    first = float(every[0]["t"])
    span = min(RANGES[rng], t1 - first) if rng == "all" else RANGES[rng]
    span = max(span, MIN_SPAN_INTERVALS * interval)
    width = nice_width(span, interval)
    t0 = (t1 - span) // width * width
    end = t0 + width * max(1, -(-(t1 - t0) // width))
    if end <= t1:
        end += width
    buckets = bucketize(every, ns, t0, end, width)
    names = sorted(set(live.get("ns") or {}).union(*((s.get("ns") or {}) for s in samples)))
    return View(ns=ns, rng=rng, live=live, cur=pick(live, ns), buckets=buckets, t0=t0,
                t1=end, interval=interval, namespaces=names, model=model, loaded=loaded,
                kept=kept, samples=len(samples))


# ------------------------------------------------------------------------ rendering
def _q(view: View, **kw: str | None) -> str:
    q = {"ns": view.ns, "range": view.rng if view.rng != "all" else None, **kw}
    pairs = {k: v for k, v in q.items() if v}
    return "/dashboard" + (f"?{urlencode(pairs)}" if pairs else "")


def render_page(view: View) -> str:
    title = f"suffixd · {view.ns}" if view.ns else "suffixd · whole daemon"
    opts = ['<option value="">whole daemon</option>'] + [
        f'<option value="{escape(n)}"{" selected" if n == view.ns else ""}>{escape(n)}'
        "</option>" for n in view.namespaces]
    if view.ns and view.ns not in view.namespaces:
        opts.append(f'<option value="{escape(view.ns)}" selected>{escape(view.ns)}</option>')
    ranges = "".join(
        f'<option value="{r}"{" selected" if r == view.rng else ""}>'
        f'{"all kept" if r == "all" else "last " + r}</option>' for r in RANGES)
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title>"
        '<link rel="icon" href="/dashboard/static/favicon.svg" type="image/svg+xml">'
        '<link rel="stylesheet" href="/dashboard/static/dashboard.css">'
        '<script src="/dashboard/static/dashboard.js" defer></script>'
        f'<noscript><meta http-equiv="refresh" content="{max(REFRESH_S, 30)}"></noscript>'
        f'</head><body data-refresh="{REFRESH_S}">'
        '<header><h1>suffixd <span>dashboard</span></h1>'
        '<form id="pick" method="get" action="/dashboard">'
        f'<label>namespace <select name="ns" id="ns">{"".join(opts)}</select></label>'
        f'<label>range <select name="range" id="range">{ranges}</select></label>'
        '<noscript><button type="submit">show</button></noscript></form>'
        '<p id="status" role="status"></p></header>'
        f'<main id="panel">{render_panel(view)}</main></body></html>')


def _tile(key: str, label: str, value: float, shown: str, sub: str = "") -> str:
    return (f'<div class="tile" data-key="{key}" data-value="{value!r}">'
            f'<div class="label">{escape(label)}</div><div class="value">{escape(shown)}</div>'
            + (f'<div class="sub">{escape(sub)}</div>' if sub else "") + "</div>")


def _legend(items: Sequence[tuple[str, str, str, str, float | None]]) -> str:
    """(key, colour class, name, shown value, raw value) -> the chart's legend."""
    out = ['<ul class="legend">']
    for key, cls, name, shown, raw in items:
        data = (f' data-key="{escape(key)}" data-value="{raw!r}"' if raw is not None
                else f' data-key="{escape(key)}"')
        out.append(f'<li{data}><i class="sw c-{cls}"></i>{escape(name)}'
                   + (f" <b>{escape(shown)}</b>" if shown else "") + "</li>")
    return "".join(out) + "</ul>"


def _card(key: str, title: str, note: str, svg: str, legend: str) -> str:
    return (f'<section class="card" data-card="{key}"><h2>{escape(title)}</h2>'
            f'<p class="note">{escape(note)}</p>{svg}{legend}</section>')


def render_panel(view: View) -> str:
    live, cur, b = view.live, view.cur, view.buckets
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(live["t"])))
    scope = f"namespace {view.ns}" if view.ns else "the whole daemon"
    head = (f'<p class="scope" data-updated="{float(live["t"])!r}">{escape(scope)} · '
            f'as of {when} · {_history_note(view)}</p>')
    if cur is None:
        return head + (f'<p class="empty">no namespace {escape(view.ns or "")} in this daemon '
                       f'(now or in its history). <a href="{escape(_q(view, ns=None))}">'
                       "the whole daemon</a></p>")
    f = figures(cur)
    out = [head, '<div class="tiles">', *_tiles(view, cur, f), "</div>", '<div class="grid">']
    out.extend(_charts(view, cur, f, b))
    out.append("</div>")
    return "".join(out)


def _history_note(view: View) -> str:
    if not view.kept:
        return "no history kept (now only)"
    every = "a minute" if view.interval == 60 else f"every {view.interval:g} s"
    model = f" · model {view.model}" + ("" if view.loaded else " (not loaded yet)") \
        if view.model else ""
    return f"{view.samples:,} samples kept, {every}{model}"


def _tiles(view: View, cur: Mapping[str, Any], f: Mapping[str, Any]) -> list[str]:
    su = f["estimated_speedup"]
    hr = f["hit_rate"]
    by = ", ".join(f"{SOURCE_NAMES[s]} {pct(hr[s])}" for s in DRAFT_SOURCES if hr[s])
    tiles = [
        _tile("requests", "generations", cur["requests"], f"{cur['requests']:,}",
              f"{cur['generated']:,} tokens generated"),
        _tile("steps", "verified steps", cur["steps"], f"{cur['steps']:,}",
              f"{cur['speculate_calls']:,} speculate calls"),
        _tile("hit_rate", "draft hit rate", hr["any"], f"{100 * hr['any']:.1f}%",
              by or "no drafts yet"),
        _tile("acceptance_rate", "acceptance", f["acceptance_rate"],
              f"{100 * f['acceptance_rate']:.1f}%",
              f"{cur['accepted']:,} of {cur['proposed']:,} drafted tokens"),
        _tile("tokens_per_step", "tokens per step", f["tokens_per_step"],
              f"{f['tokens_per_step']:.2f}", f"{f['mean_accepted_per_step']:.2f} accepted + 1"),
        _tile("speedup", "est. speed-up", su.get("cpu_default", su["flat"]),
              f"{su.get('cpu_default', su['flat']):.2f}x",
              f"vs plain decoding, CPU cost profile; {su['flat']:.2f}x flat cost"),
        _tile("reused_prompt_tokens", "prompt tokens reused", cur["reused_prompt_tokens"],
              f"{cur['reused_prompt_tokens']:,}",
              f"{pct(f['prompt_reuse'])} of {cur['prompt_tokens']:,} since start-up"),
        _tile("open_sessions", "open sessions", cur["open_sessions"],
              f"{cur['open_sessions']:,}"),
        _tile("evictions", "evictions", cur["evictions"], f"{cur['evictions']:,}",
              "global tree sequences evicted since start-up"),
    ]
    pc = view.live.get("prompt_cache")
    if view.ns is None and pc:
        tiles.append(_tile(
            "prompt_cache_reused_tokens", "prompt cache", pc.get("reused_tokens", 0),
            f"{pc.get('reused_tokens', 0):,} tokens",
            f"{pc.get('hits', 0):,} of {pc.get('lookups', 0):,} prompts from a checkpoint; "
            f"{nbytes(pc.get('bytes', 0))} of {nbytes(pc.get('max_bytes', 0))}"))
    fleet = view.live.get("fleet")
    if fleet:
        worst = max((n["lag_s"] for n in fleet.values()), default=0.0)
        tiles.append(_tile("fleet_lag_s", "fleet lag", worst, seconds(worst),
                           f"worst of {len(fleet)} nodes"))
    return tiles


def _charts(view: View, cur: Mapping[str, Any], f: Mapping[str, Any], b: Buckets
            ) -> list[str]:
    times, w = b.times, b.width
    kw: dict[str, Any] = {"t0": view.t0, "t1": view.t1}
    r = rates(b.delta)
    out = []

    def share(s: str) -> list[float | None]:
        return [x["hit_rate"][s] if x else None for x in r]

    hit_series = [Series(SOURCE_NAMES[s], s, share(s)) for s in DRAFT_SOURCES]
    out.append(_card(
        "hit_rate", "Draft hit rate by source",
        "share of verified steps that had a draft, by where it came from",
        chart("stacked", times, w, hit_series, fmt=pct, y_max=1.0, key="hit_rate",
              label="draft hit rate by source", **kw),
        _legend([(f"hit_rate.{s}", s, SOURCE_NAMES[s], pct(f["hit_rate"][s]),
                  f["hit_rate"][s]) for s in DRAFT_SOURCES]
                + [("hit_rate.any", "none", "all time, any source",
                    f"{100 * f['hit_rate']['any']:.1f}%", f["hit_rate"]["any"])])))

    def metric(key: str) -> list[float | None]:
        return [x[key] if x else None for x in r]

    out.append(_card(
        "acceptance", "Acceptance", "drafted tokens the verifier accepted",
        chart("line", times, w, [Series("acceptance", "a", metric("acceptance_rate"))],
              fmt=pct, y_max=1.0, key="acceptance", label="acceptance",
              refs=[Ref("all time", "ref", f["acceptance_rate"])], **kw),
        _legend([("acceptance.bucket", "a", "per interval", "", None),
                 ("acceptance_rate", "ref", "all time", f"{100 * f['acceptance_rate']:.1f}%",
                  f["acceptance_rate"])])))
    out.append(_card(
        "tokens_per_step", "Tokens per step", "accepted draft tokens + the verifier's own",
        chart("line", times, w, [Series("tokens per step", "a", metric("tokens_per_step"))],
              fmt=lambda v: f"{v:.1f}", key="tokens_per_step", label="tokens per step",
              refs=[Ref("all time", "ref", f["tokens_per_step"])], **kw),
        _legend([("tokens_per_step.bucket", "a", "per interval", "", None),
                 ("tokens_per_step", "ref", "all time", f"{f['tokens_per_step']:.2f}",
                  f["tokens_per_step"])])))
    su = f["estimated_speedup"]
    out.append(_card(
        "speedup", "Estimated speed-up", "against plain decoding (1x: one token per step)",
        chart("line", times, w, [
            Series("CPU cost profile", "a",
                   [x["estimated_speedup"].get("cpu_default") if x else None for x in r]),
            Series("flat cost", "b", [x["estimated_speedup"]["flat"] if x else None
                                      for x in r])],
            fmt=lambda v: f"{v:g}x", key="speedup", label="estimated speed-up",
            refs=[Ref("plain decoding", "ref", 1.0)], **kw),
        _legend([("speedup.cpu_default", "a", "CPU cost profile",
                  times_x(su.get("cpu_default", su["flat"])), su.get("cpu_default")),
                 ("speedup.flat", "b", "flat cost (a GPU)", times_x(su["flat"]), su["flat"]),
                 ("speedup.plain", "ref", "plain decoding", "1x", None)])))
    reused = [float(d["reused_prompt_tokens"]) for d in b.delta]
    fresh = [float(max(0, d["prompt_tokens"] - d["reused_prompt_tokens"])) for d in b.delta]
    out.append(_card(
        "prompt", "Prompt tokens reused",
        "prompt tokens not evaluated again (session KV and prompt cache) vs evaluated",
        chart("stacked", times, w, [Series("reused", "reused", reused),
                                    Series("evaluated", "fresh", fresh)],
              fmt=count, key="prompt", integer=True, label="prompt tokens reused", **kw),
        _legend([("reused_prompt_tokens", "reused", "reused since start-up",
                  f"{cur['reused_prompt_tokens']:,}", cur["reused_prompt_tokens"]),
                 ("evaluated_prompt_tokens", "fresh", "evaluated",
                  f"{cur['prompt_tokens'] - cur['reused_prompt_tokens']:,}",
                  cur["prompt_tokens"] - cur["reused_prompt_tokens"])])))
    gens = [float(d["requests"]) for d in b.delta]
    out.append(_card(
        "generations", "Generations", "finished responses per interval",
        chart("bars", times, w, [Series("generations", "a", gens)], fmt=count,
              key="generations", integer=True, label="generations", **kw),
        _legend([("requests", "a", "all time", f"{cur['requests']:,}", cur["requests"]),
                 ("requests.shown", "a", "in this range", f"{int(sum(gens)):,}", sum(gens))])))
    sessions = [float(x["open_sessions"]) if x else None for x in b.last]
    out.append(_card(
        "sessions", "Open sessions", "at the end of each interval",
        chart("line", times, w, [Series("open sessions", "a", sessions)], fmt=count,
              key="sessions", integer=True, label="open sessions", **kw),
        _legend([("open_sessions", "a", "now", f"{cur['open_sessions']:,}",
                  cur["open_sessions"])])))
    out.append(_memory_card(view, cur, b, kw))
    ev = [float(d["evictions"]) for d in b.delta]
    out.append(_card(
        "evictions", "Evictions", "global tree sequences evicted per interval (its budget)",
        chart("bars", times, w, [Series("evictions", "b", ev)], fmt=count, key="evictions",
              integer=True, label="evictions", **kw),
        _legend([("evictions", "b", "since start-up", f"{cur['evictions']:,}",
                  cur["evictions"])])))
    out.append(_fleet_card(view, b, kw))
    return out


def _budget_share(mem: Sequence[Mapping[str, Any]], kind: str, tokens: int, nbytes_: int,
                  whole: bool) -> float | None:
    """The share of its budget a kind of tree holds (the binding one of tokens and bytes);
    None without a budget. ``whole``: the daemon's trees of that kind (else one
    namespace's)."""
    m = next((r for r in mem if r.get("kind") == kind), None)
    if m is None:
        return None
    trees = max(1, int(m.get("trees", 1))) if whole else 1
    shares = []
    if kind == "session":
        # the sessions' budget is over the whole daemon
        if m.get("budget_tokens"):
            shares.append(tokens / int(m["budget_tokens"]))
        if m.get("budget_bytes"):
            shares.append(nbytes_ / int(m["budget_bytes"]))
    else:
        if m.get("budget_tokens_per_tree"):
            shares.append(tokens / (int(m["budget_tokens_per_tree"]) * trees))
        if m.get("budget_bytes_per_tree"):
            shares.append(nbytes_ / (int(m["budget_bytes_per_tree"]) * trees))
    return max(shares) if shares else None


def _held(x: Mapping[str, Any], tree: str, whole: bool) -> tuple[int, int]:
    """(tokens, bytes) of a kind of tree in a bucket's last sample."""
    if whole:
        kind = "session" if tree == "sessions" else tree
        m: Mapping[str, Any] = next(
            (r for r in x.get("memory") or [] if r.get("kind") == kind), {})
        return int(m.get("tokens", 0)), int(m.get("bytes", 0))
    return int(x["tree_tokens"][tree]), int(x["tree_bytes"][tree])


def _memory_card(view: View, cur: Mapping[str, Any], b: Buckets, kw: dict[str, Any]) -> str:
    whole = view.ns is None
    kinds = (("sessions", "session", "session trees"), ("global", "global", "global tree"),
             ("corpus", "corpus", "corpus tree"))
    series = []
    legend: list[tuple[str, str, str, str, float | None]] = []
    now = view.live.get("memory") or []
    now_x = {**cur, "memory": now}
    for tree, cls, name in kinds:
        kind = "session" if tree == "sessions" else tree
        tokens, nb = _held(now_x, tree, whole)
        share = _budget_share(now, kind, tokens, nb, whole)
        vals: list[float | None] = []
        for x in b.last:
            if x is None:
                vals.append(None)
                continue
            t_, b_ = _held(x, tree, whole)
            vals.append(_budget_share(x.get("memory") or now, kind, t_, b_, whole))
        if share is not None:
            series.append(Series(name, cls, vals))
        shown = f"{tokens:,} tokens, {nbytes(nb)}" + (
            f", {pct(share)} of budget" if share is not None else ", no budget")
        legend.append((f"memory.{tree}", cls, name, shown, float(tokens)))
    top = max([v for s in series for v in s.values if v is not None] + [0.0])
    return _card("memory", "Memory against budgets",
                 "share of each budget held (sessions: over the daemon; global: per namespace)",
                 chart("line", b.times, b.width, series, fmt=pct, key="memory",
                       y_max=1.0 if top <= 1.0 else None, label="memory against budgets",
                       refs=[Ref("budget", "ref", 1.0)], **kw),
                 _legend(legend))


def _fleet_card(view: View, b: Buckets, kw: dict[str, Any]) -> str:
    nodes = sorted({n for x in b.last if x and x.get("fleet") for n in x["fleet"]}
                   | set(view.live.get("fleet") or {}))
    if not nodes:
        return _card("fleet", "Fleet lag per node", "not in a fleet (suffixd serve --fleet)",
                     "", "")
    series = []
    now = view.live.get("fleet") or {}
    legend: list[tuple[str, str, str, str, float | None]] = []
    for i, node in enumerate(nodes):
        cls = f"n{i % 6}"
        series.append(Series(node, cls, [
            float(x["fleet"][node]["lag_s"]) if x and x.get("fleet") and node in x["fleet"]
            else None for x in b.last]))
        lag = (now.get(node) or {}).get("lag_s")
        legend.append((f"fleet.{node}", cls, node, seconds(lag) if lag is not None else "gone",
                       lag))
    return _card("fleet", "Fleet lag per node", "age of the oldest peer entry not applied yet",
                 chart("line", b.times, b.width, series, fmt=seconds, key="fleet",
                       label="fleet lag per node", **kw), _legend(legend))
