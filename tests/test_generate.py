"""Generate over gRPC against a real daemon (real socket, LMDB, embedded gemma model)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from suffixd.client import InvalidArgumentError
from suffixd.daemon.generation.certify import certify_greedy
from suffixd.daemon.generation.chat import ChatRenderer
from suffixd.daemon.generation.verifier import GenerateParams, Verifier
from suffixd.daemon.model import embedded_model_path

from tests.conftest import THREADS

# tests/conftest.py: the daemons here measure their costs (their status and stats show them)
DAEMONS_MEASURE = True

# Text-to-SQL agent sessions written for the project (examples/make_examples.py).
WORKLOAD = Path(__file__).resolve().parents[1] / "examples" / "workloads" / "sql_agent.jsonl"


@pytest.fixture(scope="module")
def gen_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tests.conftest import DaemonProcess

    proc = DaemonProcess(tmp_path_factory.mktemp("gen") / "data").start()
    client = proc.client()
    client.proc = proc
    yield client
    client.close()
    proc.stop()


def spider_messages(turn: int) -> list[dict[str, str]]:
    msgs = json.loads(WORKLOAD.open().readline())["messages"]
    idx = [i for i, m in enumerate(msgs) if m["role"] == "assistant"][turn]
    return msgs[:idx]


def collect(chunks: Any) -> tuple[list[int], str, Any]:
    toks: list[int] = []
    text = ""
    last = None
    for c in chunks:
        toks += c.token_ids
        text += c.text
        last = c
    return toks, text, last


def test_generate_streams_plain_equivalent_output(gen_daemon: Any) -> None:
    msgs = spider_messages(0)
    chunks = list(gen_daemon.generate("g1", messages=msgs, max_tokens=24, namespace="gen"))
    toks, text, last = collect(chunks)
    assert last.finish_reason in ("length", "stop") and all(
        c.finish_reason is None for c in chunks[:-1]
    )
    t = last.totals
    assert int(t["completion_tokens"]) == len(toks) and int(t["prompt_tokens"]) > 50
    # the same prompt decoded plainly in this process, certified equal
    v = Verifier(embedded_model_path(), n_threads=THREADS, n_ctx=4096, n_slots=1)
    try:
        prompt = ChatRenderer(v).tokens(msgs)
        params = GenerateParams(max_tokens=24, record_gaps=True)
        ref_gaps = [g for c in v.generate("ref", prompt, params) for g in c.gaps]
        ref = [g.token for g in ref_gaps if not v.is_eog(g.token)]
        if toks != ref:  # only a certified near-tie may separate them
            cand_gaps = [
                g
                for c in v.generate(
                    "ref", prompt, params, lambda c, k: toks[len(c) - len(prompt) :][:k]
                )
                for g in c.gaps
            ]
            assert certify_greedy(ref_gaps, cand_gaps)[0] != "diverged"
        else:
            assert text == v.detokenize(ref)
    finally:
        v.close()


def test_session_memory_drafts_and_kv_reuse(gen_daemon: Any) -> None:
    msgs = spider_messages(0)
    _, _, first = collect(gen_daemon.generate("mem", messages=msgs, max_tokens=32, namespace="mem"))
    # the same request again: the response is in the session and global trees now
    toks2, _, again = collect(
        gen_daemon.generate("mem", messages=msgs, max_tokens=32, namespace="mem")
    )
    t = again.totals
    assert int(t.get("cached_prompt_tokens", 0)) >= int(t["prompt_tokens"]) - 1
    assert int(t.get("accepted_tokens", 0)) > len(toks2) // 2
    assert int(t["steps"]) < len(toks2)
    assert set(t["by_source"]) <= {"session", "global", "corpus", "draft_model"}
    # the follow-up turn extends the first prompt: most of it comes from the KV cache
    _, _, nxt = collect(
        gen_daemon.generate("mem", messages=spider_messages(1), max_tokens=8, namespace="mem")
    )
    assert int(nxt.totals["cached_prompt_tokens"]) > int(first.totals["prompt_tokens"]) // 2
    info = (
        gen_daemon.describe_session("mem", "mem")
        if hasattr(gen_daemon, "describe_session")
        else None
    )
    if info is not None:
        assert getattr(info, "tokens", 1) > 0


def test_sampling_is_seeded_and_stop_strings_apply(gen_daemon: Any) -> None:
    kw = dict(prompt="SELECT name FROM", max_tokens=12, temperature=0.9, top_k=20, seed=5)
    a = collect(gen_daemon.generate(None, **kw))[0]
    b = collect(gen_daemon.generate(None, **kw))[0]
    assert a == b and len(a) == 12
    _, text, last = collect(
        gen_daemon.generate(None, prompt="1, 2, 3, 4,", max_tokens=30, stop=[" 7"])
    )
    assert " 7" not in text
    if last.finish_reason == "stop":
        assert "6" in text


@pytest.mark.parametrize(
    "kwargs",
    [
        {"tokens": [10**9]},
        {"tokens": []},
        {"prompt": "x", "temperature": -1.0},
        {"prompt": "x", "top_p": 1.5},
        {"messages": [{"role": "wizard", "content": "hi"}]},
        {"prompt": "x", "max_tokens": 100_000},
    ],
)
def test_bad_requests_are_invalid_argument(gen_daemon: Any, kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError):
        list(gen_daemon.generate("bad", namespace="bad", **kwargs))


def test_cli_generate(gen_daemon: Any) -> None:
    addr = gen_daemon.proc.socket
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "suffixd.cli.main",
            "generate",
            "--address",
            addr,
            "--session",
            "cli1",
            "--max-tokens",
            "6",
            "--stats",
            "--json",  # --stats alone prints a line for people (tests/test_newcomer.py)
            "SELECT count(*) FROM",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()
    stats = json.loads(out.stderr.strip().splitlines()[-1])
    assert stats["finish_reason"] in ("length", "stop") and int(stats["completion_tokens"]) <= 6
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "suffixd.cli.main",
            "generate",
            "--address",
            addr,
            "--top-k",
            "-1",
            "x",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode != 0 and "top-k" in bad.stderr.lower()


def test_response_reaches_the_trees_once_and_durably(gen_daemon: Any) -> None:
    """Generated tokens go to the session tree step by step (their commits queued) and
    the response ends with one durable append: the session holds prompt + response
    exactly once, and the response is in the namespace's global tree."""
    msgs = spider_messages(2)
    stream = gen_daemon.generate("once", messages=msgs, max_tokens=40, namespace="once")
    first = [next(stream) for _ in range(3)]
    assert all(c.finish_reason in ("", None) for c in first)
    mid = gen_daemon.describe_session("once", "once").tokens  # while generating
    toks, _, last = collect([*first, *stream])
    assert len(toks) > 8
    info = gen_daemon.describe_session("once", "once", include_counters=True)
    prompt_tokens = int(last.totals["prompt_tokens"])
    assert info.tokens == prompt_tokens + len(toks)
    # the session already held generated tokens before the response ended
    assert mid > prompt_tokens
    assert info.responses == 1
    # another session of the namespace gets the response drafted from the global tree
    with gen_daemon.session(namespace="once") as other:
        draft = other.speculate(context=toks[:6], max_tokens=16, cost_profile={1: 1.0, 64: 1.0})
    assert list(draft.tokens[:4]) == toks[6:10]


def test_speculate_is_served_while_a_generate_runs(gen_daemon: Any) -> None:
    """A Generate holds the model for seconds; the draft RPCs of other sessions must not
    wait for it (a regression guard for the server's threading: the model's work must
    never run where it blocks the hot path)."""
    import threading

    started, finished = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def generate() -> None:
        try:
            last = None
            # greedy counting runs to max_tokens (checked below), so the run is long
            for c in gen_daemon.generate(
                None, prompt="1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", max_tokens=200, namespace="busy"
            ):
                started.set()
                last = c
            outcome["finish"] = last.finish_reason if last is not None else None
        finally:
            started.set()
            finished.set()

    t = threading.Thread(target=generate)
    t.start()
    assert started.wait(120)
    text = (
        "SELECT T1.name, T2.title FROM singer AS T1 JOIN song AS T2 ON T1.singer_id ="
        " T2.singer_id WHERE T1.age > 20 AND T2.sales > 1000 ORDER BY T2.sales DESC LIMIT 5"
    )
    truth = gen_daemon.tokenize(text)
    rounds, pos = 0, 2
    with gen_daemon.session("busy-drafts") as s:
        s.append(truth, kind="response")
        s.append(truth[:pos], kind="prompt")
        while rounds < 10 and pos + 4 < len(truth):
            if finished.is_set():
                break
            d = s.speculate(max_tokens=2)
            # the session holds the text once: a draft (if the policy drafts) follows it
            assert d.tokens == truth[pos : pos + len(d)]
            s.append(truth[pos : pos + 1], kind="generated")
            pos += 1
            rounds += 1
        served_while_busy = not finished.is_set()
    t.join(120)
    assert outcome.get("finish") == "length", outcome
    assert rounds == 10 and served_while_busy


def test_stats_shows_the_verifier(gen_daemon: Any) -> None:
    from tests.conftest import wait_costs_measured

    collect(gen_daemon.generate(None, prompt="SELECT", max_tokens=2, namespace="st"))
    # generation is served at once; the costs are measured meanwhile, on a thread of
    # their own (or were stored by an earlier start)
    assert wait_costs_measured(gen_daemon)["cost_profile_source"] in ("measured", "stored")

    def stats(*extra: str) -> str:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "suffixd.cli.main",
                "stats",
                "--address",
                gen_daemon.proc.socket,
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    g = json.loads(stats("--json"))["generator"]
    assert g["loaded"] and g["model"].endswith(".gguf")
    profile = g["cost_profile"]
    # the measured profile, relative to one token (the cheapest batch: see
    # Verifier.measure_cost_profile), for every batch size from 1 to 33
    assert profile["1"] == 1.0 and sorted(map(int, profile)) == list(range(1, 34))
    assert all(c >= 1.0 for c in profile.values())
    assert all(int(k) < int(v) for k, v in g["batch_padding"].items())
    assert g["draft_model"] is None  # this daemon has no --draft-model
    text = stats()
    assert "cost of verifying k tokens" in text and "draft model: none" in text


def test_a_one_off_generate_learns_and_the_readme_pair_works(gen_daemon: Any) -> None:
    """The README's pair of commands: a generate without --session, twice. The first
    answer enters the namespace's global tree (its session of its own is closed, its
    response kept), so the second is drafted from it; no session stays open."""
    addr = gen_daemon.proc.socket
    prompt = "SELECT name, country FROM singer WHERE"

    def once() -> dict[str, Any]:
        out = subprocess.run(
            [sys.executable, "-m", "suffixd.cli.main", "generate", "--address", addr,
             "--namespace", "oneoff", "--max-tokens", "48", "--stats", "--json", prompt],
            capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stderr.strip().splitlines()[-1])

    first = once()
    assert int(first["completion_tokens"]) > 8
    assert gen_daemon.list_sessions("oneoff") == []
    ns = next(n for n in gen_daemon.stats(top_documents=1)["namespaces"]
              if n["namespace"] == "oneoff")
    assert ns["global"]["sequences"] == 1
    second = once()
    assert int(second["accepted_tokens"]) > 8, second
    assert gen_daemon.list_sessions("oneoff") == []
