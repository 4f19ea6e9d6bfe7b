"""`suffixd bench agent --concurrency`: its pure logic (no model, no server)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from suffixd.benchkit.concurrency import (
    PlannedTurn,
    Sent,
    TurnResult,
    aggregate,
    daemon_mode_args,
    greedy_same,
    keep_profile,
    partings,
    plan_sessions,
    ratios,
    repeat_summary,
    replay,
    reuse_profile,
    run_sessions,
)
from suffixd.benchkit.workloads import first_turns
from suffixd.cli.bench_agent import parse_levels, report
from suffixd.cli.main import main


def _msgs(n: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": "x"}] * n


TODO = [("a", _msgs(1)), ("a", _msgs(3)), ("a", _msgs(5)), ("b", _msgs(1)), ("b", _msgs(3))]


def test_parse_levels() -> None:
    assert parse_levels("1,4") == [1, 4]
    assert parse_levels(" 2, 1 ,2") == [2, 1]
    for bad in ("", "0", "1,x", "-1"):
        with pytest.raises(Exception, match="positive"):
            parse_levels(bad)


def test_first_turns_keeps_the_first_k_of_each_session() -> None:
    assert first_turns(TODO, 0) == TODO
    assert [s for s, _ in first_turns(TODO, 2)] == ["a", "a", "b", "b"]
    assert first_turns(TODO, 1) == [TODO[0], TODO[3]]


def test_plan_skips_turns_that_do_not_fit_and_counts_them() -> None:
    # a prompt of 100 tokens per message; 8 generated + 64 must fit too
    plan, skipped = plan_sessions(TODO, lambda m: [0] * (100 * len(m)), 8, 400)
    assert skipped == 1  # a's third turn: 500 + 8 + 64 > 400
    assert [(s, [t.index for t in ts]) for s, ts in plan] == [("a", [0, 1]), ("b", [0, 1])]
    assert len(plan[0][1][1].prompt) == 300
    plan, skipped = plan_sessions(TODO, lambda m: [0] * (100 * len(m)), 8, 100)
    assert plan == [] and skipped == 5


def _tracked(workers: int, sessions: int, hold: float) -> tuple[int, list[str]]:
    lock = threading.Lock()
    active = peak = 0
    order: list[str] = []

    def run_one(s: str) -> str:
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
            order.append(s)
        time.sleep(hold)
        with lock:
            active -= 1
        return s.upper()

    names = [f"s{i}" for i in range(sessions)]
    assert run_sessions(names, workers, run_one) == [n.upper() for n in names]
    return peak, order


def test_one_worker_runs_sessions_one_after_another_in_order() -> None:
    peak, order = _tracked(1, 4, 0.0)
    assert peak == 1 and order == ["s0", "s1", "s2", "s3"]


def test_n_workers_run_n_sessions_at_once() -> None:
    barrier = threading.Barrier(3, timeout=5)  # broken unless three sessions run together
    assert run_sessions(["a", "b", "c"], 3, lambda s: (barrier.wait(), s)[1]) == ["a", "b", "c"]
    peak, order = _tracked(2, 5, 0.02)
    assert peak == 2 and sorted(order) == [f"s{i}" for i in range(5)]
    assert _tracked(8, 3, 0.0)[0] <= 3  # never more workers than sessions


def test_run_sessions_raises_the_first_error() -> None:
    def run_one(s: str) -> str:
        if s == "b":
            raise RuntimeError("boom")
        return s

    with pytest.raises(RuntimeError, match="boom"):
        run_sessions(["a", "b", "c"], 2, run_one)


def test_replay_sends_a_sessions_turns_in_order() -> None:
    turns = [PlannedTurn(i, _msgs(i + 1), [0] * i) for i in (0, 2, 3)]
    seen: list[int] = []

    def send(session: str, t: PlannedTurn) -> Sent:
        seen.append(t.index)
        return Sent(4, 0.5, f"{session}{t.index}", prompt_n=t.index, prompt_s=0.1)

    out = replay("x", turns, send)
    assert seen == [0, 2, 3] and [r.text for r in out] == ["x0", "x2", "x3"]
    assert all(r.end >= r.start for r in out) and out[1].start >= out[0].end
    assert [r.prompt_n for r in out] == [0, 2, 3] and out[2].prompt_s == 0.1


def test_aggregate() -> None:
    results = [  # session a: 0-1, 1-3; session b: 0.5-2.5 (at once)
        TurnResult("a", 0, 0.0, 1.0, 10, 0.5, "", 100, 0.2),
        TurnResult("a", 1, 1.0, 3.0, 20, 1.0, "", 0, 0.0),
        TurnResult("b", 0, 0.5, 2.5, 30, 1.5, "", 300, 0.6),
    ]
    out = aggregate(results)
    assert out["wall_s"] == 3.0 and out["tokens"] == 60 and out["agg_tok_s"] == 20.0
    assert out["session_wall_s"] == 2.5  # (3 + 2) / 2
    assert out["turn_s"] == round(5 / 3, 4) and out["turn_p95_s"] == 2.0
    assert out["decode_tok_s"] == 20.0 and out["turns"] == 3
    assert out["prompt_rows"] == 400 and out["prompt_ms_row"] == 2.0
    assert aggregate([])["turns"] == 0


def test_ratios() -> None:
    r = {"suffixd": {1: {"agg_tok_s": 10.0, "wall_s": 40.0},
                     4: {"agg_tok_s": 30.0, "wall_s": 44.0}},
         "ls-plain": {1: {"agg_tok_s": 8.0}, 4: {"agg_tok_s": 40.0}},
         "ls-ngram-mod": {1: {"agg_tok_s": 12.0}, 4: {"agg_tok_s": 20.0}}}
    out = ratios(r, [1, 4])
    assert out["ls_best"] == {"1": "ls-ngram-mod", "4": "ls-plain"}
    assert out["suffixd_vs_ls_best"] == {"1": round(10 / 12, 4), "4": 0.75}
    assert out["suffixd_vs_n1"] == {"1": 1.0, "4": 3.0}
    # 4 at once took longer than one after another: the ratio above 1 says so
    assert out["suffixd_wall_vs_n1"] == {"1": 1.0, "4": 1.1}
    only = ratios({"suffixd": {2: {"agg_tok_s": 5.0, "wall_s": 1.0}}}, [2])
    assert only == {"ls_best": {}, "suffixd_vs_ls_best": {}, "suffixd_vs_n1": {},
                    "suffixd_wall_vs_n1": {}}
    # N = 1 run beside a level that was not asked for
    beside = ratios({"suffixd": {1: {"agg_tok_s": 10.0, "wall_s": 40.0},
                                 8: {"agg_tok_s": 12.0, "wall_s": 36.0}}}, [8])
    assert beside["suffixd_wall_vs_n1"] == {"8": 0.9} and beside["suffixd_vs_n1"] == {"8": 1.2}


def test_repeat_summary_gives_each_runs_ratio_and_their_spread(capsys) -> None:
    def run(r1: float, r8: float) -> dict:
        results = {s: {str(n): {k: 1.0 for k in ("agg_tok_s", "wall_s", "session_wall_s",
                                                 "turn_s", "turn_p95_s", "decode_tok_s",
                                                 "turns")} for n in (1, 8)}
                   for s in ("suffixd", "ls-plain")}
        return {"workload": "w.jsonl", "sessions": 8, "turns": 48, "skipped_turns": 0,
                "n_ctx": 4096, "max_tokens": 64, "threads": 2, "concurrency": [1, 8],
                "results": results, "ls_best": {"1": "ls-plain", "8": "ls-plain"},
                "suffixd_vs_ls_best": {"1": r1, "8": r8}, "suffixd_vs_n1": {},
                "greedy_same": {}}

    runs = [run(1.2, 0.9), run(1.0, 0.8), run(1.1, 1.0)]
    got = repeat_summary(runs)
    assert got["1"] == {"suffixd_vs_ls_best": [1.2, 1.0, 1.1], "mean": 1.1, "min": 1.0,
                        "max": 1.2}
    assert got["8"]["mean"] == 0.9 and (got["8"]["min"], got["8"]["max"]) == (0.8, 1.0)
    assert repeat_summary([run(1.0, 1.0)])["8"]["suffixd_vs_ls_best"] == [1.0]
    report({"runs": runs, "repeat_summary": got})
    shown = capsys.readouterr().out
    assert "run 3 of 3" in shown and "N=8: suffixd / llama-server's best over 3 runs: " \
        "mean 0.900, 0.800-1.000" in shown


def test_repeat_summary_adds_up_the_runs_certification() -> None:
    def run(diverged: int) -> dict:
        return {"concurrency": [8], "suffixd_vs_ls_best": {"8": 1.0},
                "certified": {"8": {"identical": 40, "near_tie": 8 - diverged,
                                    "diverged": diverged, "diverged_at": []}}}

    got = repeat_summary([run(0), run(2)])
    assert got["8"]["certified"] == {"identical": 80, "near_tie": 14, "diverged": 2}
    assert "certified" not in repeat_summary([{"concurrency": [8],
                                               "suffixd_vs_ls_best": {"8": 1.0}}])["8"]


def test_report_names_where_a_diverged_answer_parted(capsys) -> None:
    fields = ("agg_tok_s", "wall_s", "session_wall_s", "turn_s", "turn_p95_s",
              "decode_tok_s", "turns")
    out = {"workload": "w.jsonl", "sessions": 1, "turns": 3, "skipped_turns": 0,
           "n_ctx": 4096, "max_tokens": 64, "threads": 2, "concurrency": [1, 4],
           "results": {"suffixd": {n: dict.fromkeys(fields, 1.0) for n in ("1", "4")}},
           "ls_best": {}, "suffixd_vs_ls_best": {}, "suffixd_vs_n1": {}, "greedy_same": {},
           "certified": {"1": {"identical": 3, "near_tie": 0, "diverged": 0, "diverged_at": []},
                         "4": {"identical": 1, "near_tie": 1, "diverged": 1,
                               "diverged_at": [["a", 2, 16, 7.25]]}}}
    report(out)
    shown = capsys.readouterr().out
    assert "N=1: suffixd against plain decoding: 3 identical, 0 near-tie, 0 diverged\n" in shown
    assert "N=4: suffixd against plain decoding: 1 identical, 1 near-tie, 1 diverged; " \
        "diverged: a turn 2 at token 16 (plain decoding's gap 7.25)" in shown


def test_greedy_same_counts_turns_equal_to_the_first_level() -> None:
    texts = {1: {("a", 0): "x", ("a", 1): "y"}, 4: {("a", 0): "x", ("a", 1): "z"},
             8: {("a", 0): "x", ("a", 1): "y"}}
    assert greedy_same(texts, [1, 4, 8]) == {"4": "1/2", "8": "2/2"}
    assert greedy_same(texts, [1]) == {}


def test_cli_rejects_a_bad_concurrency() -> None:
    result = CliRunner().invoke(
        main, ["bench", "agent", __file__, "--concurrency", "0,2"])
    assert result.exit_code != 0 and "positive" in result.output


def test_bench_prefix_puts_its_system_prompt_in_front() -> None:
    from suffixd.benchkit.prefix import with_system

    msgs = [{"role": "system", "content": "old"}, {"role": "user", "content": "task"}]
    assert with_system(msgs, None) == msgs
    assert with_system(msgs, "new") == [{"role": "system", "content": "new"},
                                        {"role": "user", "content": "task"}]
    assert with_system(msgs[1:], "new")[0] == {"role": "system", "content": "new"}


def test_a_measured_profile_is_reused_by_the_next_daemon_of_the_same_slots(tmp_path) -> None:
    from suffixd.daemon.generation.cost_store import FILE_NAME

    profiles = tmp_path / "profiles"
    first = tmp_path / "n1" / "data"
    kept = reuse_profile(profiles, first, None)
    assert not (first / FILE_NAME).exists()  # nothing measured yet: the daemon measures
    first.mkdir(parents=True)
    (first / FILE_NAME).write_text('{"measured": 1}')
    keep_profile(first, kept)
    second = tmp_path / "n4" / "data"
    reuse_profile(profiles, second, None)
    assert (second / FILE_NAME).read_text() == '{"measured": 1}'
    eight = tmp_path / "n8" / "data"
    reuse_profile(profiles, eight, 8)  # other slots, another key: measured again
    assert not (eight / FILE_NAME).exists()


def test_report_shows_each_level_against_one_after_another(capsys) -> None:
    fields = ("agg_tok_s", "wall_s", "session_wall_s", "turn_s", "turn_p95_s",
              "decode_tok_s", "turns")
    res = {n: dict.fromkeys(fields, 1.0) for n in ("1", "4", "8")}
    out = {"workload": "w.jsonl", "sessions": 8, "turns": 32, "skipped_turns": 0,
           "n_ctx": 4096, "max_tokens": 64, "threads": 2, "concurrency": [4, 8],
           "results": {"suffixd": res}, "ls_best": {}, "suffixd_vs_ls_best": {},
           "suffixd_vs_n1": {"4": 1.25, "8": 0.94},
           "suffixd_wall_vs_n1": {"4": 0.8, "8": 1.07}, "greedy_same": {}}
    report(out)
    shown = capsys.readouterr().out
    assert "suffixd            1" in shown  # the N = 1 run is in the table though not asked
    assert "N=4: suffixd 4 at once / one after another (same sessions): aggregate tok/s " \
        "1.250; wall 0.800x\n" in shown
    assert "N=8: suffixd 8 at once / one after another (same sessions): aggregate tok/s " \
        "0.940; wall 1.070x  SLOWER than one after another" in shown


def _workload(tmp_path) -> str:
    import json

    path = tmp_path / "w.jsonl"
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    path.write_text(json.dumps({"session": "s", "messages": msgs}) + "\n")
    return str(path)


def _plumbed(monkeypatch, tmp_path, args: list[str]) -> tuple[object, dict, str]:
    """``bench agent --concurrency 1,4 ARGS`` with the runs and the certifier replaced:
    (the exit, what reached them, the output)."""
    import suffixd.cli.bench_agent as agent

    seen: dict = {}

    class Certifier:
        def __init__(self, *a, deterministic: bool = False) -> None:
            seen["certifier"] = deterministic

    def run(*a, **kw):
        seen["daemons"] = a[-1]
        seen["certifier_given"] = a[-2] is not None
        return {"concurrency": [1, 4], "suffixd_vs_ls_best": {}, "deterministic": a[-1]}

    monkeypatch.setattr(agent, "TokenCertifier", Certifier)
    monkeypatch.setattr(agent, "run_concurrency", run)
    monkeypatch.delenv("SUFFIXD_DETERMINISTIC", raising=False)
    result = CliRunner().invoke(main, ["bench", "agent", _workload(tmp_path), "--concurrency",
                                       "1,4", "--json", *args])
    return result, seen, result.output


def test_deterministic_reaches_every_daemon_and_the_certification(monkeypatch, tmp_path) -> None:
    import json

    result, seen, shown = _plumbed(monkeypatch, tmp_path, ["--deterministic"])
    assert result.exit_code == 0, shown
    assert seen == {"daemons": True, "certifier": True, "certifier_given": True}
    assert json.loads(shown)["deterministic"] is True
    _, seen, _ = _plumbed(monkeypatch, tmp_path, ["--no-deterministic", "--no-certify"])
    assert seen == {"daemons": False, "certifier_given": False}
    _, seen, _ = _plumbed(monkeypatch, tmp_path, [])  # serve's default: off
    assert seen == {"daemons": False, "certifier": False, "certifier_given": True}


def test_deterministic_follows_serves_environment_variable(monkeypatch, tmp_path) -> None:
    import suffixd.cli.bench_agent as agent

    got = {}

    def run(*a, **kw):
        got["mode"] = a[-1]
        return {"concurrency": [1], "suffixd_vs_ls_best": {}}

    monkeypatch.setattr(agent, "run_concurrency", run)
    monkeypatch.setenv("SUFFIXD_DETERMINISTIC", "1")
    result = CliRunner().invoke(main, ["bench", "agent", _workload(tmp_path), "--concurrency",
                                       "1", "--no-certify", "--json"])
    assert result.exit_code == 0, result.output
    assert got == {"mode": True}


def test_deterministic_needs_concurrency(tmp_path) -> None:
    result = CliRunner().invoke(main, ["bench", "agent", _workload(tmp_path),
                                       "--deterministic"])
    assert result.exit_code != 0 and "only with --concurrency" in result.output


def test_daemon_mode_args() -> None:
    assert daemon_mode_args(True) == ["--deterministic"]
    assert daemon_mode_args(False) == ["--no-deterministic"]
    assert daemon_mode_args(None) == []


def test_partings_name_the_first_token_that_differs() -> None:
    answers = {1: {("a", 0): [5, 6, 7], ("a", 1): [1, 2], ("b", 0): [9]},
               4: {("a", 0): [5, 6, 7], ("a", 1): [1, 3], ("b", 0): [9, 10]}}
    assert partings(answers, [1, 4]) == {"4": [["a", 1, 1, 2, 3], ["b", 0, 1, None, 10]]}
    assert partings(answers, [1]) == {}


def test_report_says_the_mode_and_where_turns_parted(capsys) -> None:
    fields = ("agg_tok_s", "wall_s", "session_wall_s", "turn_s", "turn_p95_s",
              "decode_tok_s", "turns")
    res = {n: {**dict.fromkeys(fields, 1.0), "batching": {"deterministic": True}}
           for n in ("1", "4")}
    out = {"workload": "w.jsonl", "sessions": 1, "turns": 2, "skipped_turns": 0,
           "n_ctx": 4096, "max_tokens": 64, "threads": 2, "concurrency": [1, 4],
           "deterministic": True, "results": {"suffixd": res}, "ls_best": {},
           "suffixd_vs_ls_best": {}, "suffixd_vs_n1": {}, "greedy_same": {"4": "1/2"},
           "parted": {"4": [["a", 1, 7, 100, 200]]}, "certify_reference": "deterministic",
           "certified": {n: {"identical": 2, "near_tie": 0, "diverged": 0, "diverged_at": []}
                         for n in ("1", "4")}}
    report(out)
    shown = capsys.readouterr().out
    assert "suffixd daemons: serve --deterministic; N=1 deterministic on; " \
        "N=4 deterministic on\n" in shown
    assert "N=4: suffixd token ids parted from N=1's in 1 turns; a turn 1 at token 7 " \
        "(100 vs 200)\n" in shown
    assert "certification: plain decoding in deterministic mode\n" in shown


def _captured_run(monkeypatch) -> dict:
    """run_concurrency replaced by one that keeps the keyword arguments it was given."""
    import suffixd.cli.bench_agent as agent

    got: dict = {}

    def run(*a, **kw):
        got.update(kw)
        return {"concurrency": [1], "suffixd_vs_ls_best": {}}

    monkeypatch.setattr(agent, "run_concurrency", run)
    return got


def test_draft_models_reach_the_daemons_and_llama_server(monkeypatch, tmp_path) -> None:
    got = _captured_run(monkeypatch)
    q4 = tmp_path / "q4.gguf"
    q4.write_bytes(b"")
    result = CliRunner().invoke(main, ["bench", "agent", _workload(tmp_path), "--concurrency",
                                       "1", "--no-certify", "--json", "--draft-model", str(q4),
                                       "--ls-draft-model", str(q4), "--ls-draft-max", "4"])
    assert result.exit_code == 0, result.output
    assert got == {"draft_model": q4, "ls_draft_model": q4, "ls_draft_max": 4,
                   "warm_corpus": None, "llama_server_first": False}
    got.clear()
    CliRunner().invoke(main, ["bench", "agent", _workload(tmp_path), "--concurrency", "1",
                              "--no-certify", "--json"])
    assert got == {"draft_model": None, "ls_draft_model": None, "ls_draft_max": None,
                   "warm_corpus": None, "llama_server_first": False}


def test_a_warm_corpus_reaches_the_daemons_and_needs_concurrency(monkeypatch, tmp_path) -> None:
    got = _captured_run(monkeypatch)
    corpus = tmp_path / "sql"
    corpus.mkdir()
    result = CliRunner().invoke(main, ["bench", "agent", _workload(tmp_path), "--concurrency",
                                       "1", "--no-certify", "--json", "--warm-corpus",
                                       str(corpus)])
    assert result.exit_code == 0, result.output
    assert got["warm_corpus"] == corpus
    result = CliRunner().invoke(main, ["bench", "agent", _workload(tmp_path),
                                       "--warm-corpus", str(corpus)])
    assert result.exit_code != 0 and "only with --concurrency" in result.output


def test_repeats_alternate_which_side_of_a_level_runs_first(monkeypatch, tmp_path) -> None:
    import suffixd.cli.bench_agent as agent

    firsts: list[bool] = []

    def run(*a, **kw):
        firsts.append(kw["llama_server_first"])
        return {"concurrency": [1], "suffixd_vs_ls_best": {"1": 1.0 + len(firsts) / 10}}

    monkeypatch.setattr(agent, "run_concurrency", run)
    result = CliRunner().invoke(main, ["bench", "agent", _workload(tmp_path), "--concurrency",
                                       "1", "--no-certify", "--json", "--repeat", "4"])
    assert result.exit_code == 0, result.output
    assert firsts == [False, True, False, True]
    assert json.loads(result.output)["repeat_summary"]["1"]["suffixd_vs_ls_best"] == [
        1.1, 1.2, 1.3, 1.4]


def test_a_warm_that_fails_is_a_bench_error_with_its_message(tmp_path) -> None:
    from suffixd.benchkit.concurrency import warm
    from suffixd.benchkit.errors import BenchError

    with pytest.raises(BenchError, match="suffixd warm --corpus"):
        warm(f"unix:{tmp_path / 'no.sock'}", tmp_path)


def test_the_daemons_draft_model_needs_concurrency(tmp_path) -> None:
    q4 = tmp_path / "q4.gguf"
    q4.write_bytes(b"")
    result = CliRunner().invoke(main, ["bench", "agent", _workload(tmp_path),
                                       "--draft-model", str(q4)])
    assert result.exit_code != 0 and "only with --concurrency" in result.output


def test_report_shows_the_draft_models_decisions(capsys) -> None:
    fields = ("agg_tok_s", "wall_s", "session_wall_s", "turn_s", "turn_p95_s",
              "decode_tok_s", "turns")
    stats = {"used": 120, "skipped": 3000, "probes": 4, "drafted": 480, "accepted": 300,
             "acceptance": 0.62, "planned_k": 3, "costs": "measured"}
    res = {"1": {**dict.fromkeys(fields, 1.0), "draft_model": stats},
           "4": {**dict.fromkeys(fields, 1.0),
                 "draft_model": {"not_drafting": "its costs are not measured yet"}}}
    out = {"workload": "w.jsonl", "sessions": 1, "turns": 2, "skipped_turns": 0,
           "n_ctx": 4096, "max_tokens": 64, "threads": 2, "concurrency": [1, 4],
           "draft_model": "q4.gguf", "ls_draft_model": "q4.gguf",
           "results": {"suffixd": res}, "ls_best": {}, "suffixd_vs_ls_best": {},
           "suffixd_vs_n1": {}, "greedy_same": {}}
    report(out)
    shown = capsys.readouterr().out
    assert "draft model: suffixd q4.gguf; llama-server (ls-draft) q4.gguf\n" in shown
    assert "N=1: suffixd's draft model used 120 times, skipped 3,000, 300/480 tokens " \
        "accepted (acceptance 0.62, planned k 3, costs measured)\n" in shown
    assert "N=4: suffixd's draft model not drafting: its costs are not measured yet" in shown


def test_the_corpus_is_warmed_into_the_namespace_the_requests_use(monkeypatch, tmp_path) -> None:
    import subprocess

    from suffixd.benchkit import concurrency

    seen = []

    def run(args, **kw):
        seen.append(args)
        return subprocess.CompletedProcess(args, 0, '{"units": 3}', "")

    monkeypatch.setattr(concurrency.subprocess, "run", run)
    assert concurrency.warm("unix:/x.sock", tmp_path) == {"units": 3}
    args = seen[0]
    assert args[args.index("--namespace") + 1] == concurrency.NAMESPACE
    assert args[args.index("--address") + 1] == "unix:/x.sock"
    source = Path(concurrency.__file__).read_text()
    assert '"X-Suffixd-Namespace": NAMESPACE' in source  # the requests' namespace
