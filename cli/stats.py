"""``suffixd stats``: is the cache working? Hit rates, acceptance, savings, sizes.

Reads the daemon's Stats RPC (counters persisted in LMDB, so they survive a
restart) and derives what an operator asks first: how often a step had a draft
and from which source (the *hit rate*), how much of it was accepted, how many
target forward passes that saved, and what speed-up that means for a verifier
with a given cost profile.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from typing import Any

import click
import grpc
from suffixd.cli.common import connect, connection_options, fail
from suffixd.client.errors import SuffixdError

SOURCES = ("session", "global", "corpus", "draft_model", "none")


def _cost(profile: Any, k: float) -> float:
    # Linear between the integer points: mean draft lengths are fractional.
    lo = int(k)
    frac = k - lo
    c_lo = profile.cost(lo) if lo > 0 else 0.0
    return c_lo + (profile.cost(lo + 1) - c_lo) * frac if frac else c_lo


def summarize_counters(c: Mapping[str, Any], profile: Any = None) -> dict[str, Any]:
    """Figures derived from a Counters message (as a dict)."""
    steps = int(c.get("steps", 0))
    proposed = int(c.get("draft_tokens_proposed", 0))
    accepted = int(c.get("draft_tokens_accepted", 0))
    by_source = {
        s["source"]: {"steps": int(s["steps"]), "proposed": int(s["proposed"]),
                      "accepted": int(s["accepted"])}
        for s in c.get("by_source", [])
    }
    hit_rate = {src: (by_source.get(src, {}).get("steps", 0) / steps if steps else 0.0)
                for src in SOURCES}
    hit_rate["any"] = (
        sum(v["steps"] for k, v in by_source.items() if k != "none") / steps if steps else 0.0
    )
    out: dict[str, Any] = {
        "requests": int(c.get("requests", 0)),
        "steps": steps,
        "draft_tokens_proposed": proposed,
        "draft_tokens_accepted": accepted,
        "acceptance_rate": accepted / proposed if proposed else 0.0,
        "mean_accepted_per_step": accepted / steps if steps else 0.0,
        "mean_proposed_per_step": proposed / steps if steps else 0.0,
        "hit_rate": hit_rate,
        "by_source": by_source,
        "forward_passes_saved": int(c.get("forward_passes_saved", accepted)),
        "generated_tokens": int(c.get("generated_tokens", 0)),
        "speculate_calls": int(c.get("speculate_calls", 0)),
    }
    # Each verified step yields its accepted tokens plus the verifier's own (bonus) token.
    tps = (accepted + steps) / steps if steps else 1.0
    out["tokens_per_step"] = tps
    speedup: dict[str, float] = {"flat": tps}
    if profile is not None and steps:
        # Estimate: one verification of (mean draft + 1) tokens per step; exact per-step
        # costs are not recorded, and cost(k) is close to linear between its points.
        speedup["cpu_default"] = tps / _cost(profile, proposed / steps + 1)
    out["estimated_speedup"] = speedup
    return out


def summarize(
    resp: Mapping[str, Any], corpus_files: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """The whole report, from ``Client.stats()`` output."""
    try:
        from suffixcache.cost import CostProfile

        profile: Any = CostProfile.cpu_default()
    except Exception:  # the figures without a cost model are still useful
        profile = None
    namespaces = []
    for ns in resp.get("namespaces", []):
        cache = {k: ns.get(k) or {} for k in ("global", "corpus", "sessions")}
        entry = {"namespace": ns["namespace"], **summarize_counters(ns.get("counters") or {},
                                                                    profile)}
        entry["cache"] = {k: {f: int(v.get(f, 0)) for f in
                              ("sequences", "tokens", "nodes", "bytes", "evictions")}
                          for k, v in cache.items()}
        entry["evictions"] = int(cache["global"].get("evictions", 0))
        entry["open_sessions"] = int(ns.get("open_sessions", 0))
        if corpus_files is not None:
            entry["corpus_files"] = int(corpus_files.get(ns["namespace"], 0))
        entry["top_documents"] = [
            {"path": d["doc_key"], "accepted": int(d["accepted"])}
            for d in ns.get("top_documents", [])
        ]
        sessions = ns.get("session_stats") or []
        if sessions:
            entry["sessions"] = [
                {"session_id": s["session_id"], "tokens": int(s.get("tokens", 0)),
                 **summarize_counters(s.get("counters") or {}, profile)}
                for s in sessions
            ]
        namespaces.append(entry)
    out: dict[str, Any] = {"time": time.time(), "namespaces": namespaces,
                           "memory": [dict(m) for m in resp.get("memory") or []]}
    if resp.get("process_memory_json"):
        out["process_memory"] = json.loads(resp["process_memory_json"])
    if resp.get("fleet_json"):
        out["fleet"] = json.loads(resp["fleet_json"])
    return out


# --------------------------------------------------------------------------- rendering


def _human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _pct(x: float) -> str:
    return f"{100 * x:5.1f}%"


def _counter_lines(e: Mapping[str, Any], indent: str = "  ") -> list[str]:
    hr = e["hit_rate"]
    su = e["estimated_speedup"]
    lines = [
        f"{indent}requests {e['requests']:,}   speculate calls {e['speculate_calls']:,}   "
        f"steps {e['steps']:,}   generated tokens {e['generated_tokens']:,}",
        f"{indent}draft tokens proposed {e['draft_tokens_proposed']:,}   accepted "
        f"{e['draft_tokens_accepted']:,}   acceptance {_pct(e['acceptance_rate']).strip()}   "
        f"mean accepted/step {e['mean_accepted_per_step']:.2f}",
        f"{indent}hit rate {_pct(hr['any']).strip()}:  "
        + "  ".join(f"{src.replace('_', ' ')} {_pct(hr[src]).strip()}" for src in SOURCES),
        f"{indent}forward passes saved {e['forward_passes_saved']:,}   tokens/step "
        f"{e['tokens_per_step']:.2f}   est. speed-up "
        + (f"{su['cpu_default']:.2f}x (CPU cost profile), " if "cpu_default" in su else "")
        + f"{su['flat']:.2f}x (flat cost)",
    ]
    return lines


def _generator_lines(g: Mapping[str, Any]) -> list[str]:
    if g["model"] == "none":
        return ["verifier: none (the daemon runs without a model)", ""]
    if not g["loaded"]:
        return [f"verifier {g['model']}  (not loaded yet: it loads on the first generate)", ""]
    costs = "  ".join(f"{k}:{c:.2f}" for k, c in sorted(g["cost_profile"].items())
                      if k in (1, 2, 4, 8, 16, 32))
    source = g.get("cost_profile_source") or ""
    if source == "measuring" or not costs:
        costs = "being measured (conservative costs until then)"
    elif source:
        costs += f"  ({source})"
    out = [f"verifier {g['model']}", f"  cost of verifying k tokens (x one token): {costs}"]
    det = g.get("determinism")
    if det:
        out.append("  deterministic: " + (
            "on (greedy output does not depend on drafts, batching or load)" if det.get("on")
            else f"off ({det['why']})" if det.get("why")
            else "off (greedy output equals plain decoding up to near-ties)"))
    if g["batch_padding"]:
        out.append("  padded batches: " + "  ".join(
            f"{k}->{v}" for k, v in sorted(g["batch_padding"].items())))
    d = g.get("draft_model")
    if d and "not_drafting" in d:
        out.append(f"  draft model: {d.get('path', '(given)')}, not drafting yet: "
                   f"{d['not_drafting']}")
    elif d:
        out.append(
            f"  draft model {d.get('path', '(given)')}: drafted at {d['used']:,} steps, "
            f"declined {d['skipped']:,} "
            f"(probes {d['probes']:,}, {d.get('explored', 0):,} while its acceptance was "
            f"uncertain); acceptance {d['acceptance']:.2f}; now plans "
            f"{d['planned_k']} tokens, expected {d['expected_speedup']:.2f}x plain decoding"
            + (" (provisional costs until the verifier's are measured)"
               if d.get("costs") == "provisional" else "")
        )
    else:
        out.append("  draft model: none (--draft-model)")
    b = g.get("batching")
    if b and b.get("steps"):
        steps = int(b["steps"])
        out.append(
            f"  steps: {steps:,}, {b['sequences'] / steps:.2f} sequences and "
            f"{b['rows'] / steps:.1f} rows per step (at most {b['max_sequences']} at once); "
            f"padding {b['padding_rows']:,} rows; the joint plan cut drafts by "
            f"{b['trimmed_draft_tokens']:,} tokens, extended them by "
            f"{b.get('extended_draft_tokens', 0):,}")
    pc = g.get("prompt_cache")
    if pc:
        if pc.get("max_bytes"):
            out.append(
                f"  prompt cache: {pc['hits']:,} of {pc['lookups']:,} prompts started "
                f"from a checkpoint, {pc['reused_tokens']:,} tokens not evaluated again; "
                f"{pc['entries']:,} checkpoints, {pc['bytes'] / 2**20:,.0f} of "
                f"{pc['max_bytes'] / 2**20:,.0f} MiB ({pc['evicted']:,} evicted)")
        else:
            out.append("  prompt cache: off (--prompt-cache-mb 0)")
    return out + [""]


def _invalid_detail(n: Mapping[str, Any]) -> str:
    """The invalid peer entries this node skipped, by namespace and reason."""
    parts = [f"{ns} {reason} {c:,}" for ns, reasons in sorted(
        (n.get("invalid_entries") or {}).items()) for reason, c in sorted(reasons.items())]
    return f"\n  invalid entries skipped: {', '.join(parts)}" if parts else ""


def _fleet_line(n: Mapping[str, Any]) -> str:
    state = "up" if n.get("redis_up") else "REDIS UNREACHABLE"
    return (f"fleet {n.get('url', '')} as node {n.get('node', '?')}: redis {state}   "
            f"lag {n.get('lag_entries', 0):,} entries ({n.get('lag_s', 0.0):.1f} s)   "
            f"backlog {n.get('backlog', 0):,}   published {n.get('published', 0):,}   "
            f"applied {n.get('applied', 0):,}"
            + (f"   INVALID {n['invalid']:,} skipped" if n.get("invalid") else "")
            + _invalid_detail(n)
            + (f"\n  error: {n['error']}" if n.get("error") else ""))


def render_fleet(fleet: Mapping[str, Any] | None) -> str:
    """Every node's last heartbeat (``suffixd stats --fleet``)."""
    if not fleet:
        return "this daemon is not in a fleet (suffixd serve --fleet REDIS_URL)\n"
    now = time.time()
    out = [_fleet_line(fleet["node"]), "",
           f"{'node':<16}{'redis':>7}{'lag':>9}{'lag s':>8}{'backlog':>9}{'published':>11}"
           f"{'applied':>10}{'invalid':>9}{'apply p50/p99 ms':>18}{'seen':>8}"]
    for name, n in sorted((fleet.get("nodes") or {}).items()):
        age = now - float(n.get("t", 0.0))
        out.append(
            f"{name:<16}{'up' if n.get('redis_up') else 'down':>7}{n.get('lag_entries', 0):>9,}"
            f"{n.get('lag_s', 0.0):>8.1f}{n.get('backlog', 0):>9,}{n.get('published', 0):>11,}"
            f"{n.get('applied', 0):>10,}{n.get('invalid', 0):>9,}"
            f"{n.get('apply_lag_p50_ms', 0.0):>9.1f}/{n.get('apply_lag_p99_ms', 0.0):<8.1f}"
            f"{age:>7.0f}s")
    return "\n".join(out) + "\n"


def _budget(tokens: int, nbytes: int) -> str:
    parts = [f"{tokens:,} tokens" if tokens else "", _human_bytes(nbytes) if nbytes else ""]
    return " / ".join(p for p in parts if p) or "none"


def memory_lines(memory: list[Mapping[str, Any]]) -> list[str]:
    """The trees' memory by kind over the whole daemon, against the budgets."""
    if not memory:
        return []
    per = {"session": "per session", "global": "per namespace", "corpus": "per namespace"}
    out = [f"{'memory':<10}{'trees':>9}{'tokens':>14}{'memory':>12}   budget (all; per tree)"]
    for m in memory:
        kind = str(m["kind"])
        line = (f"  {kind:<8}{int(m['trees']):>9,}{int(m['tokens']):>14,}"
                f"{_human_bytes(int(m['bytes'])):>12}   "
                f"{_budget(int(m['budget_tokens']), int(m['budget_bytes']))}")
        if m.get("budget_tokens_per_tree") or m.get("budget_bytes_per_tree"):
            tree_budget = _budget(int(m["budget_tokens_per_tree"]),
                                  int(m["budget_bytes_per_tree"]))
            line += f"; {per.get(kind, 'per tree')} {tree_budget}"
        out.append(line)
    return [*out, ""]


# The process memory's parts as `suffixd stats` names them, and what each one is.
_PROCESS_PARTS = {
    "model_weights": ("model weights", "the GGUF files, mapped"),
    "store": ("store", "the LMDB file, mapped: pages used lately"),
    "libraries": ("libraries", "other mapped files: the interpreter, shared libraries"),
    "llama_context": ("llama.cpp context", ""),
    "prompt_cache": ("prompt cache", "KV checkpoints of prompt prefixes"),
    "trees": ("suffix trees", "as the trees count their bytes (capacity)"),
    "malloc_in_use": ("malloc in use", "everything else allocated: Python objects over "
                      "512 B, gRPC, numpy, LMDB"),
    "malloc_free": ("malloc free held", "free memory malloc's arenas keep resident"),
    "stacks": ("thread stacks", ""),
    "unattributed": ("unattributed", "mostly Python's small objects; estimate errors"),
}


def process_memory_lines(pm: Mapping[str, Any] | None) -> list[str]:
    """The daemon's RSS by part, in MiB (Stats.process_memory_json)."""
    if not pm or "parts" not in pm:
        return []
    mib = 2 ** 20
    out = [f"process memory: RSS {int(pm['rss']) / mib:,.0f} MiB"
           + ("" if pm.get("source") == "smaps" else
              f"  (from {pm.get('source', '?')}: only the known parts)")]
    buffers = pm.get("llama_buffers") or {}
    for part, nbytes in pm["parts"].items():
        name, what = _PROCESS_PARTS.get(part, (part.replace("_", " "), ""))
        if part == "llama_context" and buffers:
            what = (f"resident, of {int(pm.get('llama_context_allocated', 0)) / mib:,.0f} "
                    "allocated: " + ", ".join(f"{k} {int(v) / mib:,.0f}"
                                              for k, v in sorted(buffers.items())))
        trim = pm.get("malloc_trim")
        if part == "malloc_free" and trim:
            what += (f"; trimmed every {trim['interval_s']:g} s ({trim['trims']:,} times, "
                     f"{1e3 * trim['seconds']:,.0f} ms in all)")
        out.append(f"  {name:<20}{int(nbytes) / mib:>9,.0f} MiB" + (f"   {what}" if what else ""))
    return [*out, ""]


def render_table(report: Mapping[str, Any]) -> str:
    out: list[str] = []
    if report.get("generator"):
        out.extend(_generator_lines(report["generator"]))
    if report.get("fleet"):
        out.extend([_fleet_line(report["fleet"]["node"]), ""])
    out.extend(memory_lines(report.get("memory") or []))
    out.extend(process_memory_lines(report.get("process_memory")))
    if not report["namespaces"]:
        return "\n".join(out + ["no namespaces yet (nothing ingested, no requests)"]) + "\n"
    for e in report["namespaces"]:
        files = f", {e['corpus_files']} corpus files" if "corpus_files" in e else ""
        out.append(f"namespace {e['namespace']}  ({e['open_sessions']} open sessions{files})")
        out.extend(_counter_lines(e))
        out.append(f"  {'tree':<10}{'sequences':>11}{'tokens':>13}{'nodes':>13}"
                   f"{'memory':>12}{'evictions':>11}")
        for name, t in e["cache"].items():
            out.append(f"  {name:<10}{t['sequences']:>11,}{t['tokens']:>13,}{t['nodes']:>13,}"
                       f"{_human_bytes(t['bytes']):>12}{t['evictions']:>11,}")
        if e["top_documents"]:
            out.append("  top corpus files by accepted tokens:")
            for d in e["top_documents"]:
                out.append(f"    {d['accepted']:>10,}  {d['path']}")
        for s in e.get("sessions", []):
            out.append(f"  session {s['session_id']}  ({s['tokens']:,} tokens)")
            out.extend(_counter_lines(s, indent="    "))
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _optional_call(client: Any, method: Any, request: Any) -> Any:
    """``client.call(method, request)``, or None from a daemon without that service."""
    try:
        return client.call(method, request)
    except SuffixdError as exc:
        if exc.code == grpc.StatusCode.UNIMPLEMENTED:
            return None
        raise


def _corpus_file_counts(client: Any, names: list[str]) -> dict[str, int] | None:
    from suffixd.v1 import corpus_pb2, corpus_pb2_grpc

    stub = client.stub_for(corpus_pb2_grpc.CorpusStub)
    counts = {}
    for ns in names:
        resp = _optional_call(client, stub.ListFiles, corpus_pb2.ListFilesRequest(namespace=ns))
        if resp is None:
            return None
        counts[ns] = sum(1 for f in resp.files if f.complete)
    return counts


def _generator_status(client: Any) -> dict[str, Any] | None:
    from suffixd.v1 import generate_pb2, generate_pb2_grpc

    stub = client.stub_for(generate_pb2_grpc.GeneratorStub)
    r = _optional_call(client, stub.GeneratorStatus, generate_pb2.GeneratorStatusRequest())
    if r is None:
        return None
    return {
        "loaded": r.loaded,
        "model": r.model or "none",
        "cost_profile": {int(k): round(v, 3) for k, v in r.cost_profile.items()},
        "batch_padding": {int(k): int(v) for k, v in r.batch_padding.items()},
        "draft_model": json.loads(r.draft_model) if r.draft_model else None,
        "batching": json.loads(r.batching) if r.batching else None,
        "prompt_cache": json.loads(r.prompt_cache) if r.prompt_cache else None,
        "cost_profile_source": r.cost_profile_source,
        "determinism": json.loads(r.determinism) if r.determinism else None,
    }


class UnknownNamespace(click.ClickException):
    pass


def collect(client: Any, namespace: str | None, session_id: str | None, top: int,
            all_sessions: bool) -> dict[str, Any]:
    resp = client.stats(namespace, session_id, include_sessions=all_sessions,
                        top_documents=top)
    if namespace:
        # The daemon answers a namespace it never saw with zeros; a typo should not read
        # as "nothing happened yet".
        known = [ns["namespace"] for ns in client.stats(top_documents=1)["namespaces"]]
        if namespace not in known:
            raise UnknownNamespace(
                f"unknown namespace {namespace!r}: nothing was ingested or asked there "
                f"(known: {', '.join(sorted(known)) or 'none yet'})")
    names = [ns["namespace"] for ns in resp.get("namespaces", [])]
    report = summarize(resp, _corpus_file_counts(client, names))
    report["generator"] = _generator_status(client)
    return report


@click.command("stats")
@click.option("--namespace", "-n", default=None, help="Only this namespace (default: all).")
@click.option("--session", "session_id", default=None, help="Also this session's counters.")
@click.option("--sessions", "all_sessions", is_flag=True, help="Also every open session's.")
@click.option("--top", default=10, show_default=True, type=click.IntRange(1, 1000),
              help="Corpus files listed by accepted tokens.")
@click.option("--watch", is_flag=True, help="Refresh until interrupted.")
@click.option("--interval", default=2.0, show_default=True, type=click.FloatRange(0.1, 3600),
              help="Seconds between refreshes (--watch).")
@click.option("--json", "as_json", is_flag=True,
              help="JSON for machines (one object per refresh with --watch).")
@click.option("--fleet", "fleet", is_flag=True,
              help="Every fleet node's lag, backlog and counts (from their heartbeats).")
@connection_options
def stats(
    namespace: str | None,
    session_id: str | None,
    all_sessions: bool,
    top: int,
    watch: bool,
    interval: float,
    as_json: bool,
    fleet: bool,
    address: str | None,
    socket_path: str | None,
    data_dir: str | None,
    auth_token: str | None,
) -> None:
    """Cache hit rates, acceptance, forward passes saved and cache sizes.

    \b
    hit rate: the share of verified steps that had a draft, per source
    (session, global, corpus, draft model; "none": no draft).
    est. speed-up: tokens per step divided by the cost of verifying the mean
    draft (+1) on the default CPU cost profile; "flat" assumes a verifier whose
    cost does not grow with the batch (a GPU).
    """
    if session_id and not namespace:
        raise click.UsageError("--session needs --namespace")
    client = connect(address, socket_path, data_dir, auth_token, max_message_bytes=64 << 20)
    tty = sys.stdout.isatty()
    try:
        while True:
            report = collect(client, namespace, session_id, top, all_sessions)
            if fleet:
                report = {"time": report["time"], "fleet": report.get("fleet")}
            if as_json:
                click.echo(json.dumps(report))
            else:
                text = render_fleet(report["fleet"]) if fleet else render_table(report)
                if watch and tty:
                    # Home + clear: redraw in place instead of scrolling.
                    click.echo("\x1b[H\x1b[2J" + time.strftime("%H:%M:%S  ") +
                               f"every {interval:g}s, Ctrl-C to stop\n\n" + text, nl=False)
                else:
                    click.echo(text, nl=False)
            if not watch:
                return
            sys.stdout.flush()
            time.sleep(interval)
    except KeyboardInterrupt:
        return
    except (grpc.RpcError, SuffixdError) as exc:
        fail(exc, client.target)
    finally:
        client.close()
