"""N agent sessions at once through the OpenAI endpoint, side by side with llama-server
``-np N`` (`suffixd bench agent --concurrency N1,N2,...`): the run, its figures and table.

For every concurrency level N and every system a fresh server is started: suffixd
(``serve --http``, ``--kv-slots N`` when N > 4, else its default 4) and, with
``--llama-server``, llama-server plain and its n-gram types (``-np N``, each slot with
suffixd's per-session context). N worker threads then take whole sessions from a queue
and replay their turns in order (N = sessions: all at once; N = 1: one after another).
Every turn sends the conversation so far (the recorded history, as the replay protocol
has it), greedy, up to ``--max-tokens``:

* suffixd: ``/v1/chat/completions`` with the official ``openai`` client, the session
  named (``X-Suffixd-Session``);
* llama-server: the very prompt tokens the daemon renders (its chat renderer, in this
  process) on ``/completion``, the slot left to llama-server (longest common prefix).

Turns that do not fit the context (prompt + max tokens + 64) are skipped for every
system and counted. Reported per (system, N): aggregate completion tok/s (all completion
tokens over the wall time from the first request to the last reply), that wall time,
mean session wall, turn mean and p95, decode tok/s as the servers report it (per
request), turns; per N, suffixd's aggregate rate against the best llama-server system's
and, rate and wall time, against suffixd's own one session after another (N = 1, run for
suffixd even when not a level asked for); ``greedy_same``: the turns whose suffixd text at
N equals suffixd's text at the first level; and with a ``TokenCertifier``
(certify.py), ``certified``: per N, suffixd's turns (their ``token_ids``) judged
against plain decoding (identical, near-tie, diverged), after the timed runs.

``deterministic`` True / False gives every suffixd daemon ``serve --deterministic`` /
``--no-deterministic`` (None: neither, the daemon's default); the report says which, and
each level's daemon says whether the mode is on (``batching.deterministic``). In
deterministic mode ``greedy_same`` should be every turn and the certification (whose plain
decoding then runs in that mode too) every turn identical.
"""

from __future__ import annotations

import itertools
import json
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from suffixcache import common_prefix_length

from ..daemon.generation.cost_store import FILE_NAME
from .certify import TokenCertifier
from .errors import BenchError
from .generate import p95
from .workloads import fits_side_by_side

# the namespace every suffixd request of the bench goes to (and a warmed corpus)
NAMESPACE = "bench-concurrency"

S = TypeVar("S")
R = TypeVar("R")
Messages = list[dict[str, str]]


@dataclass(frozen=True)
class PlannedTurn:
    index: int  # the turn's place among its session's assistant turns
    messages: Messages
    prompt: list[int]  # as the daemon renders it


class Sent(NamedTuple):
    """What a system said of one turn it answered."""
    tokens: int  # completion tokens
    decode_s: float  # its own decoding time
    text: str
    prompt_n: int = 0  # prompt tokens it evaluated (not from a cache)
    prompt_s: float = 0.0  # its own time on them, as it reports it


@dataclass(frozen=True)
class TurnResult:
    session: str
    index: int
    start: float
    end: float
    tokens: int
    decode_s: float
    text: str
    prompt_n: int = 0
    prompt_s: float = 0.0


def plan_sessions(todo: list[tuple[str, Messages]], render: Callable[[Messages], list[int]],
                  max_tokens: int, n_ctx: int
                  ) -> tuple[list[tuple[str, list[PlannedTurn]]], int]:
    """The sessions in file order with the turns that fit ``n_ctx``; and how many did not."""
    plan: list[tuple[str, list[PlannedTurn]]] = []
    skipped = 0
    for session, group in itertools.groupby(todo, key=lambda t: t[0]):
        turns = []
        for i, (_, msgs) in enumerate(group):
            prompt = render(msgs)
            if fits_side_by_side(len(prompt), max_tokens, n_ctx):
                turns.append(PlannedTurn(i, msgs, prompt))
            else:
                skipped += 1
        if turns:
            plan.append((session, turns))
    return plan, skipped


def run_sessions(sessions: Sequence[S], workers: int, run_one: Callable[[S], R]) -> list[R]:
    """``run_one`` on every session, on ``workers`` threads that each take the next whole
    session from a queue; the results in the sessions' order. The first error stops the
    workers (after their current session) and is raised."""
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    for i in range(len(sessions)):
        todo.put(i)
    results: dict[int, R] = {}
    errors: list[BaseException] = []

    def work() -> None:
        while not errors:
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            try:
                results[i] = run_one(sessions[i])
            except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
                errors.append(exc)

    threads = [threading.Thread(target=work, daemon=True)
               for _ in range(max(1, min(workers, len(sessions))))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [results[i] for i in range(len(sessions))]


def replay(session: str, turns: Sequence[PlannedTurn],
           send: Callable[[str, PlannedTurn], Sent]) -> list[TurnResult]:
    """A session's turns in order."""
    out = []
    for t in turns:
        t0 = time.perf_counter()
        r = send(session, t)
        out.append(TurnResult(session, t.index, t0, time.perf_counter(), r.tokens, r.decode_s,
                              r.text, r.prompt_n, r.prompt_s))
    return out


def aggregate(results: Sequence[TurnResult]) -> dict[str, Any]:
    """One (system, N)'s figures (see the module docstring)."""
    if not results:
        return {"agg_tok_s": 0.0, "wall_s": 0.0, "session_wall_s": 0.0, "turn_s": 0.0,
                "turn_p95_s": 0.0, "decode_tok_s": 0.0, "tokens": 0, "turns": 0,
                "prompt_rows": 0, "prompt_ms_row": 0.0}
    wall = max(r.end for r in results) - min(r.start for r in results)
    tokens = sum(r.tokens for r in results)
    decode_s = sum(r.decode_s for r in results)
    spans: dict[str, tuple[float, float]] = {}
    for r in results:
        a, b = spans.get(r.session, (r.start, r.end))
        spans[r.session] = (min(a, r.start), max(b, r.end))
    turn_s = [r.end - r.start for r in results]
    prompt_rows = sum(r.prompt_n for r in results)
    prompt_s = sum(r.prompt_s for r in results)
    return {
        "agg_tok_s": round(tokens / wall, 2) if wall > 0 else 0.0,
        "wall_s": round(wall, 3),
        "session_wall_s": round(sum(b - a for a, b in spans.values()) / len(spans), 3),
        "turn_s": round(sum(turn_s) / len(turn_s), 4),
        "turn_p95_s": round(p95(turn_s), 4),
        "decode_tok_s": round(tokens / decode_s, 2) if decode_s > 0 else 0.0,
        "tokens": tokens,
        "turns": len(results),
        # the servers' own prompt evaluation: rows and time per row as each reports it
        # (with several at once, a turn's prompt time includes the steps it shared)
        "prompt_rows": prompt_rows,
        "prompt_ms_row": round(1e3 * prompt_s / prompt_rows, 3) if prompt_rows else 0.0,
    }


def ratios(results: dict[str, dict[int, dict[str, Any]]], levels: Sequence[int]
           ) -> dict[str, dict[str, Any]]:
    """Per N: the best llama-server system by aggregate tok/s, suffixd's rate against it,
    and, where suffixd ran N = 1 (``run_concurrency`` always does), its rate against its own
    one session after another and its wall time against that one's (``suffixd_wall_vs_n1``
    above 1: N at once took longer than one after another)."""
    out: dict[str, dict[str, Any]] = {"ls_best": {}, "suffixd_vs_ls_best": {},
                                      "suffixd_vs_n1": {}, "suffixd_wall_vs_n1": {}}
    ours = results.get("suffixd", {})
    ls = [s for s in results if s != "suffixd"]
    for n in levels:
        rate = ours[n]["agg_tok_s"] if n in ours else 0.0
        if ls:
            best = max(ls, key=lambda s: results[s][n]["agg_tok_s"])
            out["ls_best"][str(n)] = best
            out["suffixd_vs_ls_best"][str(n)] = round(
                rate / max(results[best][n]["agg_tok_s"], 1e-9), 4)
        if 1 in ours and n in ours:
            out["suffixd_vs_n1"][str(n)] = round(rate / max(ours[1]["agg_tok_s"], 1e-9), 4)
            out["suffixd_wall_vs_n1"][str(n)] = round(
                ours[n]["wall_s"] / max(ours[1]["wall_s"], 1e-9), 4)
    return out


def repeat_summary(outs: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per N over repeated runs of ``run_concurrency``: suffixd's ratio to llama-server's
    best of each run, and their mean, lowest and highest (one run on 2 cores varies by
    4-7%, as much as the margins the ratios are judged by)."""
    out: dict[str, dict[str, Any]] = {}
    for n in (str(n) for n in outs[0]["concurrency"]) if outs else ():
        got = [o["suffixd_vs_ls_best"][n] for o in outs if n in o.get("suffixd_vs_ls_best", {})]
        if got:
            out[n] = {"suffixd_vs_ls_best": got, "mean": round(sum(got) / len(got), 4),
                      "min": min(got), "max": max(got)}
            verdicts = [o["certified"][n] for o in outs if n in o.get("certified", {})]
            if verdicts:
                out[n]["certified"] = {k: sum(v[k] for v in verdicts)
                                       for k in ("identical", "near_tie", "diverged")}
    return out


def greedy_same(texts: dict[int, dict[tuple[str, int], str]], levels: Sequence[int]
                ) -> dict[str, str]:
    """Per level after the first: "equal/total" turns whose text equals the first level's."""
    ref = texts.get(levels[0], {})
    out = {}
    for n in levels[1:]:
        got = texts.get(n, {})
        keys = [k for k in ref if k in got]
        out[str(n)] = f"{sum(got[k] == ref[k] for k in keys)}/{len(keys)}"
    return out


def partings(answers: dict[int, dict[tuple[str, int], list[int]]], levels: Sequence[int]
             ) -> dict[str, list[list[Any]]]:
    """Per level after the first: the turns whose token ids differ from the first level's,
    each as [session, turn, the first token that differs, the first level's token there,
    this level's] (a token None: that answer ended there)."""
    ref = answers.get(levels[0], {})
    out: dict[str, list[list[Any]]] = {}
    for n in levels[1:]:
        got = answers.get(n, {})
        parted = []
        for key in (k for k in ref if k in got):
            a, b = ref[key], got[key]
            if a == b:
                continue
            at = common_prefix_length(a, b)
            parted.append([key[0], key[1], at, a[at] if at < len(a) else None,
                           b[at] if at < len(b) else None])
        out[str(n)] = parted
    return out


def _profile_copy(profiles: Path, slots: int | None) -> Path:
    return profiles / f"cost_profile-slots{slots or 'default'}.json"


def reuse_profile(profiles: Path, data: Path, slots: int | None) -> Path:
    """Put the cost profile a daemon of the same slots measured before (this run or an
    earlier one) into ``data``: each fresh daemon would otherwise spend minutes of the
    benchmark measuring what the last one measured. The daemon checks the profile's key
    (model, CPU, threads, context, slots...) and measures again where it differs."""
    kept = _profile_copy(profiles, slots)
    if kept.is_file():
        data.mkdir(parents=True, exist_ok=True, mode=0o700)
        shutil.copyfile(kept, data / FILE_NAME)
    return kept


def keep_profile(data: Path, kept: Path) -> None:
    if (data / FILE_NAME).is_file():
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(data / FILE_NAME, kept)


def batching(target: str) -> dict[str, Any] | None:
    """The daemon's step counters (steps, rows, padding, decode / between / reading
    seconds): where a level's time went."""
    from ..client import Client

    client = Client(target)
    try:
        return client.generator_status().get("batching")
    finally:
        client.close()


def warm(target: str, corpus: Path, namespace: str = NAMESPACE) -> dict[str, Any]:
    """``suffixd warm --corpus`` into the bench's namespace of a daemon (a process of its
    own: benchkit stays below the CLI), its JSON summary."""
    r = subprocess.run([sys.executable, "-c", "from suffixd.cli.main import main; main()",
                        "warm", "--corpus", str(corpus), "--namespace", namespace,
                        "--address", target, "--json", "--no-progress"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise BenchError(f"suffixd warm --corpus {corpus}: {r.stderr.strip()[-500:]}")
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def run_concurrency(workload: Path, todo: list[tuple[str, Messages]], levels: list[int],
                    max_tokens: int, model: str | None, model_path: Path, n_ctx: int,
                    threads: int, llama_server: str | None, spec_types: str | None,
                    ls_flash_attn: str, ls_plain: bool,
                    profiles: Path | None = None,
                    certifier: TokenCertifier | None = None,
                    deterministic: bool | None = None, *,
                    draft_model: Path | None = None, ls_draft_model: Path | None = None,
                    ls_draft_max: int | None = None,
                    warm_corpus: Path | None = None,
                    llama_server_first: bool = False) -> dict[str, Any]:
    """Every level, every system, a fresh server each; the figures as one JSON object
    (with ``certifier``, suffixd's answers certified once the servers are stopped;
    ``deterministic``: the daemons' mode, see the module docstring; ``draft_model``: the
    daemons' ``--draft-model``, its policy's decisions reported per level;
    ``ls_draft_model``: llama-server drafting with it too, "ls-draft", ``ls_draft_max``
    its longest draft; ``warm_corpus``: every suffixd daemon warmed with ``suffixd warm
    --corpus`` before its timed run, as a long-running one would have been;
    ``llama_server_first``: at each level llama-server's servers run before suffixd's
    daemon, so that repeats in alternating order cancel a machine's drift between the two
    parts of a level)."""
    import openai

    from ..daemon.generation.chat import ChatRenderer
    from ..daemon.generation.verifier import Verifier
    from .daemons import start_daemon, wait_measured
    from .llama_server import start_servers

    # this process renders what the daemon renders, for llama-server (no decoding here)
    renderer_v = Verifier(model_path, n_ctx=256, n_slots=1, n_threads=1)
    try:
        n_ctx = min(n_ctx or renderer_v.n_ctx_train, renderer_v.n_ctx_train)
        renderer = ChatRenderer(renderer_v)
        plan, skipped = plan_sessions(todo, renderer.tokens, max_tokens, n_ctx)
    finally:
        renderer_v.close()
    if not plan:
        raise BenchError(f"no turn fits {n_ctx} tokens")
    results: dict[str, dict[int, dict[str, Any]]] = {}
    texts: dict[int, dict[tuple[str, int], str]] = {}
    answers: dict[int, dict[tuple[str, int], list[int]]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="suffixd-bench-concurrency-"))
    profiles = profiles or tmp / "profiles"

    def measure(system: str, n: int, send: Callable[[str, PlannedTurn], Sent]
                ) -> list[TurnResult]:
        done = run_sessions(plan, n, lambda s: replay(s[0], s[1], send))
        flat = [r for rs in done for r in rs]
        results.setdefault(system, {})[n] = aggregate(flat)
        t0 = min((r.start for r in flat), default=0.0)
        # each turn (session, index, start and end s from the level's first request,
        # completion tokens, prompt rows evaluated): where a p95 comes from
        results[system][n]["turn_log"] = [
            [r.session, r.index, round(r.start - t0, 3), round(r.end - t0, 3), r.tokens,
             r.prompt_n] for r in flat]
        return flat

    # suffixd one session after another (N = 1) is run even when not asked for: every
    # level is judged against it, so that N at once slower than one at a time shows
    suffixd_levels = levels if 1 in levels else [1, *levels]
    mode_args = daemon_mode_args(deterministic)

    def run_suffixd(n: int) -> None:
        (tmp / f"n{n}").mkdir()
        slots = n if n > 4 else None
        data = tmp / f"n{n}" / "data"
        kept = reuse_profile(profiles, data, slots)
        daemon = start_daemon(data, model, threads, n_ctx, kv_slots=slots,
                              extra_args=mode_args, draft_model=draft_model)
        target = daemon.target
        try:
            wait_measured(daemon.proc, target)
            keep_profile(data, kept)
            warmed = warm(target, warm_corpus) if warm_corpus is not None else None
            oai = openai.OpenAI(base_url=daemon.http, api_key="none", max_retries=0,
                                timeout=1800)

            ids = answers.setdefault(n, {})

            def ask(session: str, t: PlannedTurn, oai: Any = oai,
                    ids: dict[tuple[str, int], list[int]] = ids) -> Sent:
                r = oai.chat.completions.create(
                    model="default", messages=t.messages,
                    temperature=0, max_tokens=max_tokens, extra_headers={
                        "X-Suffixd-Namespace": NAMESPACE,
                        "X-Suffixd-Session": session},
                    extra_body={"return_token_ids": True})
                ids[(session, t.index)] = (r.choices[0].model_extra or {})["token_ids"]
                extra = (r.model_extra or {}).get("suffixd", {})
                u = r.usage
                cached = (u.prompt_tokens_details.cached_tokens or 0
                          if u and u.prompt_tokens_details else 0)
                return Sent(u.completion_tokens if u else 0,
                            float(extra.get("decode_seconds", 0.0)),
                            r.choices[0].message.content or "",
                            (u.prompt_tokens - cached) if u else 0,
                            float(extra.get("prompt_seconds", 0.0)))

            flat = measure("suffixd", n, ask)
            texts[n] = {(r.session, r.index): r.text for r in flat}
            results["suffixd"][n]["batching"] = batching(target)
            if warmed is not None:
                results["suffixd"][n]["warm"] = warmed
            if draft_model is not None:
                results["suffixd"][n]["draft_model"] = draft_model_stats(target)
        finally:
            daemon.stop(30)

    def run_llama_server(n: int) -> None:
        if not llama_server or n not in levels:
            return
        servers = start_servers(llama_server, model_path, threads=threads, n_ctx=n_ctx,
                                spec_types_wanted=spec_types, flash_attn=ls_flash_attn,
                                plain=ls_plain, n_parallel=n,
                                draft_model=ls_draft_model, draft_max=ls_draft_max)
        try:
            for name, srv in servers.items():
                def complete(session: str, t: PlannedTurn, srv: Any = srv) -> Sent:
                    turn = srv.complete(t.prompt, max_tokens)
                    return Sent(turn.predicted_n, turn.decode_s, "", turn.prompt_n,
                                turn.prompt_s)

                measure(name, n, complete)
        finally:
            for srv in servers.values():
                srv.close()

    parts = [run_llama_server, run_suffixd] if llama_server_first else \
        [run_suffixd, run_llama_server]
    try:
        for n in suffixd_levels:
            for part in parts:
                part(n)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    certified = certifier.verdicts(plan, answers) if certifier is not None else None

    return {"workload": str(workload), "sessions": len(plan),
            "turns": sum(len(t) for _, t in plan), "skipped_turns": skipped, "n_ctx": n_ctx,
            "max_tokens": max_tokens, "threads": threads, "concurrency": levels,
            "deterministic": deterministic, "llama_server_first": llama_server_first,
            "draft_model": str(draft_model) if draft_model else None,
            "ls_draft_model": str(ls_draft_model) if ls_draft_model else None,
            # suffixd first, whichever side ran first
            "results": {s: {str(n): v for n, v in results[s].items()}
                        for s in sorted(results, key=lambda s: s != "suffixd")},
            **ratios(results, levels), "greedy_same": greedy_same(texts, levels),
            "parted": partings(answers, levels),
            **({"certified": certified,
                "certify_reference": "deterministic" if certifier and certifier.deterministic
                else "default"} if certified is not None else {})}


def draft_model_stats(target: str) -> dict[str, Any] | None:
    """The daemon's draft model policy: its decisions (used, skipped, probes), tokens
    drafted and accepted, acceptance, planned draft length (GeneratorStatus)."""
    from ..client import Client

    client = Client(target)
    try:
        text = client.generator_status().get("draft_model") or ""
    finally:
        client.close()
    return json.loads(text) if text else None


def daemon_mode_args(deterministic: bool | None) -> list[str]:
    """``serve``'s arguments for the daemons' mode (None: the daemon's default)."""
    if deterministic is None:
        return []
    return ["--deterministic" if deterministic else "--no-deterministic"]


def report_lines(out: dict[str, Any]) -> list[str]:
    """The table ``run_concurrency``'s figures make (each run's, and the ratios' spread
    when the levels were repeated), line by line."""
    lines: list[str] = []
    add = lines.append
    if "runs" in out:
        for k, run in enumerate(out["runs"], 1):
            add(f"--- run {k} of {len(out['runs'])}"
                + (", llama-server first at each level" if run.get("llama_server_first") else ""))
            lines += report_lines(run)
        for n, r in out["repeat_summary"].items():
            c = r.get("certified")
            verdicts = (f"; against plain decoding {c['identical']} identical, "
                        f"{c['near_tie']} near-tie, {c['diverged']} diverged") if c else ""
            add(f"N={n}: suffixd / llama-server's best over {len(r['suffixd_vs_ls_best'])}"
                f" runs: mean {r['mean']:.3f}, {r['min']:.3f}-{r['max']:.3f}{verdicts}")
        return lines
    add(f"{Path(out['workload']).name}: {out['sessions']} sessions, {out['turns']} "
        f"turns ({out['skipped_turns']} do not fit {out['n_ctx']} tokens), "
        f"{out['max_tokens']} tokens max, {out['threads']} threads")
    mode = out.get("deterministic")
    on = {n: r.get("batching", {}).get("deterministic")
          for n, r in out["results"].get("suffixd", {}).items() if r.get("batching")}
    add("suffixd daemons: " + {True: "serve --deterministic", False: "serve "
        "--no-deterministic", None: "the default mode"}[mode]
        + "".join(f"; N={n} deterministic {'on' if v else 'off'}"
                  for n, v in on.items() if v is not None))
    if out.get("draft_model") or out.get("ls_draft_model"):
        add(f"draft model: suffixd {out.get('draft_model') or 'none'}; llama-server "
            f"(ls-draft) {out.get('ls_draft_model') or 'none'}")
    for n, r in out["results"].get("suffixd", {}).items():
        d = r.get("draft_model")
        if d and "used" in d:
            add(f"N={n}: suffixd's draft model used {d['used']:,} times, skipped "
                f"{d['skipped']:,}, {d['accepted']:,}/{d['drafted']:,} tokens accepted "
                f"(acceptance {d['acceptance']}, planned k {d['planned_k']}, costs "
                f"{d['costs']})")
        elif d:
            add(f"N={n}: suffixd's draft model not drafting: {d.get('not_drafting')}")
    add(f"{'system':<16} {'N':>3} {'agg tok/s':>10} {'wall s':>8} {'session s':>10} "
        f"{'turn s':>8} {'p95 s':>7} {'decode tok/s':>13} {'turns':>6} "
        f"{'prompt rows':>12} {'ms/row':>7}")
    for n in sorted({1, *out["concurrency"]}):
        for s, r in out["results"].items():
            if str(n) not in r:
                continue
            v = r[str(n)]
            add(f"{s:<16} {n:>3} {v['agg_tok_s']:>10.2f} {v['wall_s']:>8.2f} "
                f"{v['session_wall_s']:>10.2f} {v['turn_s']:>8.3f} "
                f"{v['turn_p95_s']:>7.3f} {v['decode_tok_s']:>13.2f} {v['turns']:>6} "
                f"{v.get('prompt_rows', 0):>12,} {v.get('prompt_ms_row', 0.0):>7.2f}")
    for n in sorted({1, *out["concurrency"]}):
        b = out["results"].get("suffixd", {}).get(str(n), {}).get("batching")
        if b and b.get("steps"):
            add(f"N={n}: suffixd steps {b['steps']:,}, {b['sequences'] / b['steps']:.2f} "
                f"sequences and {b['rows'] / b['steps']:.1f} rows a step "
                f"({b['padding_rows']:,} padding, {b['prompt_rows']:,} prompt); "
                f"decode {b['decode_s']:.1f} s, between {b['between_s']:.1f} s, "
                f"reading {b['reading_s']:.1f} s")
    for n, best in out["ls_best"].items():
        add(f"N={n}: suffixd / {best} aggregate tok/s: "
            f"{out['suffixd_vs_ls_best'][n]:.3f}")
    walls = out.get("suffixd_wall_vs_n1", {})
    for n, x in out["suffixd_vs_n1"].items():
        if n == "1":
            continue
        w = walls.get(n)
        verdict = "" if w is None else (
            f"; wall {w:.3f}x" + ("  SLOWER than one after another" if w > 1.0 else ""))
        add(f"N={n}: suffixd {n} at once / one after another (same sessions): "
            f"aggregate tok/s {x:.3f}{verdict}")
    for n, same in out["greedy_same"].items():
        add(f"N={n}: suffixd text same as at N={out['concurrency'][0]}: {same}")
    for n, parted in out.get("parted", {}).items():
        add(f"N={n}: suffixd token ids parted from N={out['concurrency'][0]}'s in "
            f"{len(parted)} turns" + "".join(
                f"; {s} turn {i} at token {at} ({a} vs {b})"
                for s, i, at, a, b in parted[:8]) + ("; ..." if len(parted) > 8 else ""))
    if "certified" in out:
        add(f"certification: plain decoding in {out.get('certify_reference', 'default')}"
            " mode")
    for n, c in out.get("certified", {}).items():
        where = "".join(f"; diverged: {s} turn {i} at token {at} (plain decoding's gap {gap})"
                        for s, i, at, gap in c["diverged_at"])
        add(f"N={n}: suffixd against plain decoding: {c['identical']} identical, "
            f"{c['near_tie']} near-tie, {c['diverged']} diverged{where}")
    return lines
