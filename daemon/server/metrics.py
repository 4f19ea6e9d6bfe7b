"""Prometheus metrics for the daemon (``suffixd serve --metrics-addr 127.0.0.1:9464``).

Two kinds of figures:

* Counters and gauges are read from the engine at scrape time (a custom
  collector over ``Engine.stats()``), so they are exactly what ``suffixd stats``
  shows and, like the engine's counters, survive a restart (Prometheus handles
  counters that only ever grow across restarts fine).
* Histograms (speculate latency, accepted tokens per step) need every event;
  they are observed by wrapping the engine's ``propose`` and ``record_step`` on
  the engine instance, which keeps the engine free of metrics code.

Labels are the namespace, the draft source and the tree kind; never session ids or
paths. Namespace names are the tenants' names, and anyone who reaches the endpoint
reads them: by default every figure is summed over the namespaces under
``namespace="all"`` (the gauge of the oldest fleet entry takes the maximum), and only
``suffixd serve --metrics-namespaces`` labels them by name (at most
``Limits.max_namespaces`` values).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..common.logs import event
from ..generation.memory import process_memory
from .datadir import write_private

log = logging.getLogger("suffixd.metrics")

SOURCES = ("session", "global", "corpus", "draft_model", "none")
_LATENCY_BUCKETS = (5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.5)
_ACCEPT_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_TPS_BUCKETS = (1, 2, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000)


class EngineCollector(Collector):
    """Counters and gauges from ``engine.stats()``, computed when Prometheus scrapes."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Any]:
        try:
            st = self.engine.stats(top_documents=1)
        except Exception:  # a scrape must never take the daemon down
            log.exception("metrics: engine.stats failed")
            return
        req = CounterMetricFamily("suffixd_requests", "Finished responses (requests).",
                                  labels=["namespace"])
        gen = CounterMetricFamily("suffixd_generated_tokens", "Tokens generated (appended as "
                                  "model output).", labels=["namespace"])
        spec = CounterMetricFamily("suffixd_speculate_calls", "Speculate calls.",
                                   labels=["namespace"])
        steps = CounterMetricFamily("suffixd_steps", "Verified steps by draft source.",
                                    labels=["namespace", "source"])
        prop = CounterMetricFamily("suffixd_draft_tokens_proposed",
                                   "Draft tokens proposed, by source.",
                                   labels=["namespace", "source"])
        acc = CounterMetricFamily("suffixd_draft_tokens_accepted",
                                  "Draft tokens accepted (target forward passes saved), by source.",
                                  labels=["namespace", "source"])
        evict = CounterMetricFamily("suffixd_cache_evictions", "Sequences evicted from a tree.",
                                    labels=["namespace", "tree"])
        gauges = {
            f: GaugeMetricFamily(f"suffixd_cache_{f}", f"Cache size: {f} per tree.",
                                 labels=["namespace", "tree"])
            for f in ("sequences", "tokens", "nodes", "bytes")
        }
        open_sessions = GaugeMetricFamily("suffixd_open_sessions", "Open sessions.",
                                          labels=["namespace"])
        for ns, e in st.items():
            c = e.get("counters", {})
            req.add_metric([ns], c.get("requests", 0))
            gen.add_metric([ns], c.get("generated_tokens", 0))
            spec.add_metric([ns], c.get("speculate_calls", 0))
            by_source = c.get("by_source", {})
            for src in SOURCES:
                v = by_source.get(src, {})
                steps.add_metric([ns, src], v.get("steps", 0))
                prop.add_metric([ns, src], v.get("proposed", 0))
                acc.add_metric([ns, src], v.get("accepted", 0))
            for tree, t in (e.get("cache") or {}).items():
                for f, g in gauges.items():
                    g.add_metric([ns, tree], t.get(f, t.get("count", 0) if f == "sequences"
                                                     else 0))
                if "evictions" in t:
                    evict.add_metric([ns, tree], t["evictions"])
            open_sessions.add_metric([ns], e.get("open_sessions", 0))
        yield from (req, gen, spec, steps, prop, acc, evict, *gauges.values(), open_sessions)
        yield from self._memory()
        yield from self._process_memory()
        yield from self._verifier()

    def _memory(self) -> Iterator[Any]:
        """The trees by kind over the whole daemon against their budgets (``suffixd stats``'
        memory table; 0: no budget). Budgets over every tree of a kind are scope "all",
        those of each tree "per_tree"."""
        try:
            rows = self.engine.memory()
        except Exception:  # a scrape must never take the daemon down
            log.exception("metrics: engine.memory failed")
            return
        held = {f: GaugeMetricFamily(f"suffixd_memory_{f}", f"Trees' {f} by kind, over "
                                     "every namespace.", labels=["kind"])
                for f in ("trees", "tokens", "bytes")}
        budget = {f: GaugeMetricFamily(f"suffixd_memory_budget_{f}", f"Budget in {f} by "
                                       "kind (0: none); scope all: over every tree of the "
                                       "kind, per_tree: each one's.", labels=["kind", "scope"])
                  for f in ("tokens", "bytes")}
        for m in rows:
            kind = str(m["kind"])
            for f, g in held.items():
                g.add_metric([kind], m[f])
            for f, g in budget.items():
                g.add_metric([kind, "all"], m[f"budget_{f}"])
                g.add_metric([kind, "per_tree"], m[f"budget_{f}_per_tree"])
        yield from (*held.values(), *budget.values())

    def _process_memory(self) -> Iterator[Any]:
        """The process's RSS by part (``suffixd stats``' process memory: the parts add up
        to RSS), glibc's allocator and llama.cpp's buffers as allocated."""
        pm = process_memory(self.engine)
        if not pm:
            return
        parts = GaugeMetricFamily(
            "suffixd_process_memory_bytes", "Resident memory of the daemon by part (they "
            "add up to its RSS): model_weights, store, libraries, llama_context, prompt_cache, "
            "trees, malloc_in_use, malloc_free, stacks, unattributed.", labels=["part"])
        for part, nbytes in pm["parts"].items():
            parts.add_metric([part], nbytes)
        rss = GaugeMetricFamily("suffixd_process_resident_bytes",
                                "Resident set size of the daemon process.")
        rss.add_metric([], pm["rss"])
        yield from (parts, rss)
        malloc = pm.get("malloc")
        if malloc:
            m = GaugeMetricFamily(
                "suffixd_malloc_bytes", "glibc's allocator (mallinfo2): in_use and free in "
                "its arenas, mmapped (blocks mapped on their own), arenas (taken from the "
                "system).", labels=["kind"])
            for kind, field in (("in_use", "uordblks"), ("free", "fordblks"),
                                ("mmapped", "hblkhd"), ("arenas", "arena")):
                m.add_metric([kind], malloc[field])
            yield m
        llama = GaugeMetricFamily(
            "suffixd_llama_buffer_bytes", "llama.cpp's buffers as allocated (KV, compute, "
            "output; model: weights copied out of the mapped file).", labels=["kind"])
        for kind, nbytes in sorted((pm.get("llama_buffers") or {}).items()):
            llama.add_metric([kind], nbytes)
        yield llama

    def _verifier(self) -> Iterator[Any]:
        """The colocated verifier's measured cost profile (once it is loaded)."""
        rt = getattr(getattr(self.engine, "generator", None), "_runtime", None)
        cost = GaugeMetricFamily(
            "suffixd_verifier_cost",
            "Measured cost of verifying k tokens at once, relative to one token (the profile "
            "the daemon's own drafter plans with).", labels=["k"])
        for k, c in sorted((getattr(rt, "cost_profile", None) or {}).items(),
                           key=lambda kv: int(kv[0])):
            cost.add_metric([str(k)], float(c))
        yield cost
        verifier = getattr(rt, "verifier", None)
        if verifier is None:
            return
        b = verifier.batch_stats()
        steps = CounterMetricFamily(
            "suffixd_verifier_steps", "Verifier steps (one decode each), by how many "
            "generations shared it.", labels=["sequences"])
        for n, count in b["by_sequences"].items():
            steps.add_metric([n], count)
        rows = CounterMetricFamily(
            "suffixd_verifier_rows", "Rows the verifier evaluated, by kind: verified "
            "(a token and its draft), padding (equal rows per sequence), prompt.",
            labels=["kind"])
        rows.add_metric(["verified"], b["rows"] - b["padding_rows"] - b["prompt_rows"])
        rows.add_metric(["padding"], b["padding_rows"])
        rows.add_metric(["prompt"], b["prompt_rows"])
        cut = CounterMetricFamily(
            "suffixd_verifier_joint_plan_tokens", "Draft tokens the joint plan of a shared "
            "step cut from its drafter's choice, or added past it.", labels=["change"])
        cut.add_metric(["cut"], b["trimmed_draft_tokens"])
        cut.add_metric(["extended"], b["extended_draft_tokens"])
        pc = verifier.prompt_cache.as_dict()
        cache = CounterMetricFamily(
            "suffixd_prompt_cache_events", "Prompt cache (KV checkpoints of prompt prefixes "
            "shared by every session): lookups, hits, checkpoints saved, evicted, refused, "
            "and prompts that awaited another prefill's checkpoint.", labels=["event"])
        for kind in ("lookups", "hits", "saved", "evicted", "refused", "awaited"):
            cache.add_metric([kind], pc[kind])
        reused = CounterMetricFamily(
            "suffixd_prompt_cache_reused_tokens", "Prompt tokens restored from a checkpoint "
            "instead of evaluated.")
        reused.add_metric([], pc["reused_tokens"])
        held = GaugeMetricFamily("suffixd_prompt_cache_bytes",
                                 "Host memory held by prompt checkpoints.")
        held.add_metric([], pc["bytes"])
        queued = CounterMetricFamily(
            "suffixd_verifier_queue_seconds", "Seconds generations queued before their "
            "first step (for a KV slot, behind other steps and exclusive work), summed.")
        queued.add_metric([], b["queue_s"])
        yield from (steps, rows, cut, cache, reused, held, queued)


# The label value of every namespace's figures summed (without --metrics-namespaces).
ALL_NAMESPACES = "all"
# Gauges whose namespaces are combined with max, not sum (an age, not an amount).
_MAX_OVER_NAMESPACES = {"suffixd_fleet_lag_seconds"}


class NamespacesHidden(Collector):
    """Another collector's figures with their namespace label replaced by "all": samples
    that differ only in the namespace are summed (or, for an age, the maximum taken), so
    the endpoint shows the daemon's totals without naming its tenants."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def collect(self) -> Iterator[Any]:
        for fam in self.inner.collect():
            if not any("namespace" in s.labels for s in fam.samples):
                yield fam
                continue
            merged: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
            use_max = fam.name in _MAX_OVER_NAMESPACES
            for s in fam.samples:
                labels = dict(s.labels)
                if "namespace" in labels:
                    labels["namespace"] = ALL_NAMESPACES
                key = (s.name, tuple(sorted(labels.items())))
                if key in merged:
                    merged[key] = max(merged[key], s.value) if use_max else merged[key] + s.value
                else:
                    merged[key] = s.value
            out = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            for (name, labels_t), value in merged.items():
                out.add_sample(name, dict(labels_t), value)
            yield out


class Instruments:
    """Histograms observed on every speculate and verified step."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.speculate_seconds = Histogram(
            "suffixd_speculate_seconds",
            "Time to build a draft (engine side, without transport), by draft source.",
            ["source"], buckets=_LATENCY_BUCKETS, registry=registry,
        )
        self.accepted_tokens = Histogram(
            "suffixd_accepted_tokens",
            "Draft tokens accepted per verified step, by draft source.",
            ["source"], buckets=_ACCEPT_BUCKETS, registry=registry,
        )
        self.first_token_seconds = Histogram(
            "suffixd_generate_first_token_seconds",
            "Generate: time from the request to its first generated token.",
            buckets=_TTFT_BUCKETS, registry=registry,
        )
        self.tokens_per_second = Histogram(
            "suffixd_generate_tokens_per_second",
            "Generate: generated tokens per second of each request (request start to last "
            "token).", buckets=_TPS_BUCKETS, registry=registry,
        )
        self.queue_seconds = Histogram(
            "suffixd_generate_queue_seconds",
            "Generate: time from a request's arrival at the verifier to its first step "
            "(waiting for a KV slot, other generations' steps, the cost measurement).",
            buckets=_TTFT_BUCKETS, registry=registry,
        )
        self.generated = Counter(
            "suffixd_generate_completion_tokens", "Generate: tokens generated.",
            registry=registry,
        )
        # No namespace label: these are registered as they are, not behind the summing of
        # NamespacesHidden (the dashboard page has them per namespace).
        self.prompt_tokens = Counter(
            "suffixd_generate_prompt_tokens", "Generate: prompt tokens of finished requests.",
            registry=registry,
        )
        self.reused_prompt_tokens = Counter(
            "suffixd_generate_reused_prompt_tokens", "Generate: prompt tokens not evaluated "
            "again (the session's KV cache, or a prompt cache checkpoint).", registry=registry,
        )
        self.generate_seconds = Counter(
            "suffixd_generate_seconds",
            "Generate: seconds spent in requests (rate(tokens) / rate(seconds) is the "
            "mean speed).", registry=registry,
        )

    def observe_generate(self, ns: str, stats: Any) -> None:
        """One finished Generate request (``stats``: the verifier's GenerateStats)."""
        n = int(getattr(stats, "completion_tokens", 0))
        total = float(getattr(stats, "total_s", 0.0))
        if n:
            self.first_token_seconds.observe(float(getattr(stats, "first_token_s", 0.0)))
        if n and total > 0:
            self.tokens_per_second.observe(n / total)
        self.queue_seconds.observe(max(0.0, float(getattr(stats, "queue_s", 0.0))))
        self.generated.inc(n)
        self.generate_seconds.inc(max(total, 0.0))
        self.prompt_tokens.inc(max(0, int(getattr(stats, "prompt_tokens", 0))))
        self.reused_prompt_tokens.inc(max(0, int(getattr(stats, "cached_prompt_tokens", 0))))

    def attach(self, engine: Any) -> None:
        """Wrap ``engine.propose`` and ``engine.record_step`` (on this instance only)."""
        if getattr(engine, "_suffixd_metrics_attached", False):
            return
        propose = engine.propose
        record_step = engine.record_step
        spec_h = self.speculate_seconds
        acc_h = self.accepted_tokens

        @functools.wraps(propose)
        def timed_propose(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            draft = propose(*args, **kwargs)
            src = getattr(draft, "source", "none") if len(draft.tokens) else "none"
            spec_h.labels(src if src in SOURCES else "none").observe(time.perf_counter() - t0)
            return draft

        @functools.wraps(record_step)
        def counted_step(ns: str, session_id: str | None, source: str, proposed: int,
                         accepted: int, *args: Any, **kwargs: Any) -> Any:
            out = record_step(ns, session_id, source, proposed, accepted, *args, **kwargs)
            acc_h.labels(source if source in SOURCES else "none").observe(accepted)
            return out

        engine.propose = timed_propose
        engine.record_step = counted_step
        # Called by the Generator service with each request's totals (daemon/generate_service).
        engine.on_generate = self.observe_generate
        engine._suffixd_metrics_attached = True


def parse_addr(addr: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[v6]:PORT``, ``:PORT`` or ``PORT`` (host 127.0.0.1) -> (host, port)."""
    s = addr.strip()
    host, sep, port = s.rpartition(":")
    if not sep:
        host, port = "", s
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--metrics-addr {addr!r}: expected HOST:PORT")
    return host, int(port)


class MetricsServer:
    def __init__(self, httpd: Any, thread: Any, registry: CollectorRegistry) -> None:
        self.httpd = httpd
        self.thread = thread
        self.registry = registry

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.httpd.server_address[:2]
        return str(host), int(port)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def build_registry(engine: Any, namespaces: bool = False) -> CollectorRegistry:
    """``namespaces``: label figures by namespace name (else summed under "all")."""
    registry = CollectorRegistry(auto_describe=True)
    collectors: list[Any] = [EngineCollector(engine)]
    fleet = getattr(engine, "fleet", None)
    if fleet is not None:
        collectors.append(fleet.collector())
    for c in collectors:
        registry.register(c if namespaces else NamespacesHidden(c))
    Instruments(registry).attach(engine)
    return registry


def start_metrics(engine: Any, addr: str, namespaces: bool = False) -> MetricsServer:
    """Serve ``/metrics`` for ``engine`` on ``addr`` (HOST:PORT; port 0 picks a free one;
    no host: loopback). ``namespaces``: label figures by namespace name."""
    from prometheus_client import start_http_server

    host, port = parse_addr(addr)
    registry = build_registry(engine, namespaces)
    httpd, thread = start_http_server(port, addr=host, registry=registry)
    server = MetricsServer(httpd, thread, registry)
    h, p = server.address
    event(log, "metrics.listening", addr=f"{h}:{p}")
    return server


def register(server: Any, engine: Any) -> list[str]:
    """Daemon hook (server.EXTRA_SERVICES): start the endpoint when --metrics-addr was given.

    Registers no gRPC service. The bound address is written to
    ``<data dir>/metrics.addr`` so tools (and tests) can find a port chosen with ``:0``.
    """
    cfg = getattr(engine, "serve_config", None)
    addr = (getattr(cfg, "extra", None) or {}).get("metrics_addr")
    data_dir = getattr(engine, "data_dir", None)
    if not addr:
        # A previous run's address would send tools to a port nobody serves now.
        if data_dir is not None:
            with contextlib.suppress(OSError):
                (data_dir / "metrics.addr").unlink()
        return []
    try:
        ms = start_metrics(engine, addr, bool(getattr(cfg, "extra", {}).get("metrics_namespaces")))
    except (OSError, ValueError) as exc:
        from .serve_config import ServeError

        raise ServeError(f"cannot serve metrics on {addr}: {exc}") from None
    engine.metrics_server = ms
    if data_dir is not None:
        h, p = ms.address
        write_private(data_dir / "metrics.addr", f"{h}:{p}\n")
    return []
