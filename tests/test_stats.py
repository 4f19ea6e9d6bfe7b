"""`suffixd stats` against a real daemon: figures must match what the test's own requests did."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from suffixd.cli.stats import render_table, stats, summarize_counters
from suffixd.cli.warm import warm

SQL_A = "SELECT zorblax_quux_total , wibble_name FROM frobnicator_table WHERE wibble_id = 4242 ;"
SQL_B = "SELECT gloop FROM snarfle_items AS T2 WHERE T2.zid IN ( SELECT zid FROM quorx ) ;"


def accepted_along(draft: Any, appended: list[int]) -> int:
    """The verifier's rule: the longest prefix of ``appended`` on one root-to-leaf draft path."""
    children: dict[int, list[int]] = {}
    for i, p in enumerate(draft.parents):
        children.setdefault(p, []).append(i)
    node, n = -1, 0
    for tok in appended:
        nxt = next((c for c in children.get(node, ()) if draft.tokens[c] == tok), None)
        if nxt is None:
            break
        node, n = nxt, n + 1
    return n


def run_stats(sock: str, *args: str) -> dict[str, Any]:
    res = CliRunner().invoke(stats, [*args, "--socket", sock, "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def generate(daemon: Any, sess: Any, target: list[int], expect: dict[str, Any]) -> None:
    """Play a verifier: speculate, accept the matching prefix plus one bonus token, append."""
    pos = 0
    while pos < len(target):
        draft = sess.speculate(max_tokens=16)
        acc = accepted_along(draft, target[pos:])
        chunk = target[pos : pos + acc + 1]
        pos += len(chunk)
        kind = "response" if pos >= len(target) else "generated"
        res = sess.append(tokens=chunk, kind=kind)
        assert res.accepted == acc
        src = draft.source if len(draft) else "none"
        expect["steps"] += 1
        expect["proposed"] += len(draft)
        expect["accepted"] += acc
        s = expect["by_source"].setdefault(src, [0, 0, 0])
        s[0] += 1
        s[1] += len(draft)
        s[2] += acc
    expect["requests"] += 1


def check(entry: dict[str, Any], expect: dict[str, Any]) -> None:
    steps = expect["steps"]
    assert entry["steps"] == steps
    assert entry["requests"] == expect["requests"]
    assert entry["draft_tokens_proposed"] == expect["proposed"]
    assert entry["draft_tokens_accepted"] == expect["accepted"]
    assert entry["acceptance_rate"] == pytest.approx(expect["accepted"] / expect["proposed"])
    assert entry["mean_accepted_per_step"] == pytest.approx(expect["accepted"] / steps)
    assert entry["forward_passes_saved"] == expect["accepted"]
    for src in ("session", "global", "corpus", "draft_model", "none"):
        want = expect["by_source"].get(src, [0, 0, 0])
        assert entry["hit_rate"][src] == pytest.approx(want[0] / steps), src
        if want[0]:
            assert entry["by_source"][src] == dict(zip(("steps", "proposed", "accepted"), want,
                                                       strict=True))
    drafted = sum(v[0] for k, v in expect["by_source"].items() if k != "none")
    assert entry["hit_rate"]["any"] == pytest.approx(drafted / steps)
    assert entry["tokens_per_step"] == pytest.approx((expect["accepted"] + steps) / steps)


def test_stats_json_matches_own_requests_and_survives_restart(
    daemon: Any, tmp_path: Path
) -> None:
    sock = daemon.proc.socket.removeprefix("unix:")
    ns = "statsns"
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "q.sql").write_text(f"{SQL_A}\n{SQL_B}\n")
    res = CliRunner().invoke(warm, ["--corpus", str(corpus), "-n", ns, "--socket", sock,
                                    "--no-progress"], catch_exceptions=False)
    assert res.exit_code == 0, res.output

    expect: dict[str, Any] = {"steps": 0, "proposed": 0, "accepted": 0, "requests": 0,
                              "by_source": {}}
    with daemon.session(namespace=ns) as sess:
        sid = sess.id
        sess.append(text="<user>\nHow many wibbles?\n<assistant>\n", kind="prompt")
        answer = daemon.tokenize(SQL_A + " -- checked by hand, brandnewtrailer")
        generate(daemon, sess, answer, expect)          # corpus drafts, then nothing
        sess.append(text="\n<user>\nAgain please.\n<assistant>\n", kind="prompt")
        generate(daemon, sess, answer, expect)          # now the session has it
        sess_expect = json.loads(json.dumps(expect))
        # At least two different draft sources took part, or the test proves little.
        assert len([s for s, v in expect["by_source"].items() if v[0]]) >= 2, expect

        report = run_stats(sock, "-n", ns, "--session", sid)
        (entry,) = report["namespaces"]
        assert entry["namespace"] == ns
        check(entry, expect)
        (s_entry,) = entry["sessions"]
        assert s_entry["session_id"] == sid
        check(s_entry, sess_expect)
        assert entry["corpus_files"] == 1
        assert entry["cache"]["corpus"]["sequences"] == 2
        assert entry["cache"]["sessions"]["tokens"] > len(answer) * 2
        assert entry["estimated_speedup"]["cpu_default"] > 0
        sess.close(keep_responses=True)

    # The table renders the same figures for people.
    res = CliRunner().invoke(stats, ["-n", ns, "--socket", sock], catch_exceptions=False)
    assert res.exit_code == 0
    assert f"namespace {ns}" in res.output and f"steps {expect['steps']:,}" in res.output

    # Counters survive a restart of the daemon.
    daemon.proc.stop()
    daemon.proc.start()
    after = run_stats(daemon.proc.socket.removeprefix("unix:"), "-n", ns)
    check(after["namespaces"][0], expect)


def test_stats_unreachable_and_usage_errors(tmp_path: Path) -> None:
    res = CliRunner().invoke(stats, ["--socket", str(tmp_path / "none.sock"), "--json"])
    assert res.exit_code != 0 and "the daemon is not running at" in res.output
    res = CliRunner().invoke(stats, ["--session", "x"])
    assert res.exit_code == 2 and "--session needs --namespace" in res.output


def test_summary_of_empty_and_known_counters() -> None:
    empty = summarize_counters({})
    assert empty["steps"] == 0 and empty["hit_rate"]["any"] == 0.0
    c = {"steps": 4, "draft_tokens_proposed": 10, "draft_tokens_accepted": 6, "requests": 1,
         "by_source": [{"source": "corpus", "steps": 3, "proposed": 10, "accepted": 6},
                       {"source": "none", "steps": 1, "proposed": 0, "accepted": 0}]}
    s = summarize_counters(c)
    assert s["hit_rate"]["corpus"] == 0.75 and s["hit_rate"]["none"] == 0.25
    assert s["hit_rate"]["any"] == 0.75 and s["tokens_per_step"] == 2.5
    report = {"namespaces": [{"namespace": "n", "open_sessions": 0, "top_documents": [],
                              "cache": {k: {"sequences": 0, "tokens": 0, "nodes": 0,
                                            "bytes": 0, "evictions": 0}
                                        for k in ("global", "corpus", "sessions")},
                              **s}]}
    assert "hit rate  75.0%" not in render_table(report)  # formatting is compact
    assert "hit rate 75.0%" in render_table(report)


def test_a_draft_model_not_drafting_yet_is_named_with_the_reason() -> None:
    """Issue 44, item 8: a --draft-model waiting for the cost measurement read as
    'draft model: none (--draft-model)', as if none had been given."""
    from types import SimpleNamespace

    from suffixd.cli.stats import _generator_lines
    from suffixd.daemon.grpc_api.generate_service import draft_model_status

    draft = SimpleNamespace(path=Path("/models/tiny-draft.gguf"))
    rt = SimpleNamespace(draft_model=draft, fallback=None, profile_source="measuring")
    status = json.loads(draft_model_status(rt))  # type: ignore[arg-type]
    assert status["path"] == "/models/tiny-draft.gguf"
    g = {"model": "target.gguf", "loaded": True, "cost_profile": {}, "batch_padding": {},
         "cost_profile_source": "measuring", "draft_model": status}
    text = "\n".join(_generator_lines(g))
    assert "none (--draft-model)" not in text
    assert "draft model: /models/tiny-draft.gguf, not drafting yet: waiting for the cost " \
        "measurement" in text, text
    rt.profile_source = "failed"
    assert "measurement failed" in json.loads(draft_model_status(rt))["not_drafting"]  # type: ignore[arg-type]
    # drafting: the policy's figures, with the path; no draft model: nothing
    rt.fallback = SimpleNamespace(stats=lambda: {"used": 3, "planned_k": 2})
    assert json.loads(draft_model_status(rt)) == {  # type: ignore[arg-type]
        "path": "/models/tiny-draft.gguf", "used": 3, "planned_k": 2}
    assert draft_model_status(SimpleNamespace(draft_model=None)) == ""  # type: ignore[arg-type]
    g["draft_model"] = None
    assert "draft model: none (--draft-model)" in "\n".join(_generator_lines(g))


def test_stats_watch_refreshes_until_interrupted(shared_daemon: Any) -> None:
    import signal
    import subprocess
    import sys
    import time

    sock = shared_daemon.proc.socket.removeprefix("unix:")
    proc = subprocess.Popen(
        [sys.executable, "-m", "suffixd.cli.main", "stats", "--watch", "--json",
         "--interval", "0.2", "--socket", sock],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # Ctrl-C as in a terminal: a suite started in the background (`cmd &` without job
        # control) ignores SIGINT, and Python keeps an ignored SIGINT ignored.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    lines = []
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while len(lines) < 3 and time.monotonic() < deadline:
        lines.append(json.loads(proc.stdout.readline()))
    proc.send_signal(signal.SIGINT)
    # keep reading while it exits: a pipe nobody drains could block its last flush
    proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert len(lines) == 3 and all("namespaces" in x for x in lines)
    assert lines[0]["time"] < lines[1]["time"] < lines[2]["time"]
