"""What a newcomer does first, against one real daemon that loads the embedded model at
start-up: the first generate says what it waits for, chat sessions remember, --stats
reads as speed, the async client generates, external verifiers get drafts, and
SuffixDraftModel's traffic shows in the stats."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from suffixd.client import AsyncClient, Client, SuffixDraftModel

# tests/conftest.py: the daemons here measure their costs (their status and stats show them)
DAEMONS_MEASURE = True

TIER = "daemon"  # tests/conftest.py: the README's commands start their own daemons

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tests.conftest import DaemonProcess

    proc = DaemonProcess(tmp_path_factory.mktemp("newcomer") / "data",
                         args=["--metrics-addr", "127.0.0.1:0"],
                         env={"SUFFIXD_MODEL_LOAD": "startup"}).start()
    client = proc.client()
    client.proc = proc
    yield client
    client.close()
    proc.stop()


def cli(loaded: Any, *args: str) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [sys.executable, "-m", "suffixd.cli.main", *args, "--data-dir", str(loaded.proc.data_dir)],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    return out


def test_1_first_generate_says_what_it_waits_for(loaded: Any) -> None:
    from tests.conftest import wait_costs_measured

    # The daemon started loading the model when it began serving; this first generate
    # arrives while that is under way (it says so and waits), or just after (generation
    # is ready as soon as the model is loaded: its costs are measured while serving).
    out = cli(loaded, "generate", "--max-tokens", "8", "SELECT name FROM singer WHERE")
    first = out.stderr.splitlines()[0] if out.stderr else ""
    if first.startswith("suffixd: "):
        assert "loading model" in first, out.stderr
        assert "first use after start-up: the model load, seconds" in first
        assert "suffixd: model ready" in out.stderr
    assert out.stdout.strip()
    assert '"generation ready"' in loaded.proc.log()
    # nothing at start that means nothing (a vocabulary-only model's context used to warn
    # of a context overflow), and llama.cpp's own lines only through the logger
    assert "possible training context overflow" not in loaded.proc.log()
    assert not [ln for ln in loaded.proc.log().splitlines()
                if ln.startswith(("llama_", "load:", "print_info:", "state_read_meta"))]
    status = wait_costs_measured(loaded)
    assert status["loaded"] and status["phase"] == "" and status["cost_profile"][1] == 1.0


def test_chat_session_continues_the_conversation(loaded: Any) -> None:
    def turn(text: str, *extra: str) -> tuple[str, dict[str, Any]]:
        out = cli(loaded, "generate", "--chat", "--session", "s1", "--max-tokens", "12",
                  "--stats", "--json", *extra, text)
        chunks = [json.loads(line) for line in out.stdout.splitlines()]
        return "".join(c["text"] for c in chunks), json.loads(out.stderr.splitlines()[-1])

    answer1, t1 = turn("My name is Ada.")
    answer2, t2 = turn("What is my name?")
    # The second prompt holds the first exchange: the daemon's KV cache had all of the
    # first turn's prompt (and what it generated) to reuse.
    assert int(t2["prompt_tokens"]) > int(t1["prompt_tokens"])
    assert int(t2["cached_prompt_tokens"]) > int(t1["prompt_tokens"])
    hist = json.loads((loaded.proc.data_dir / "chats" / "default" / "s1.json").read_text())
    assert hist["messages"] == [
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": answer1},
        {"role": "user", "content": "What is my name?"},
        {"role": "assistant", "content": answer2},
    ]
    _, t3 = turn("Hello again.", "--new")  # starts over: only this turn is sent
    assert int(t3["prompt_tokens"]) < int(t1["prompt_tokens"]) + 8
    hist = json.loads((loaded.proc.data_dir / "chats" / "default" / "s1.json").read_text())
    assert [m["role"] for m in hist["messages"]] == ["user", "assistant"]


def test_readme_generate_pair_gives_the_readme_s_figures(loaded: Any) -> None:
    """The README's `suffixd generate --stats` pair, run as written (in a namespace of its
    own: the README's daemon is fresh), gives the token and step counts the README says."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = readme[readme.index("## Generating with the colocated verifier"):]
    commands = [shlex.split(line.split("  #")[0]) for line in block.splitlines()
                if line.startswith("suffixd generate --stats ")][:2]
    assert len(commands) == 2 and commands[0] == commands[1], commands
    said = re.search(r"Both runs above write (\d+) tokens .*?\(about (\d+) verifier steps\)"
                     r".*?takes about (\d+) steps instead of \1", block, re.S)
    assert said, "the README's figures of the pair moved: update this test with them"
    tokens, first_steps, second_steps = (int(g) for g in said.groups())
    runs = []
    for cmd in commands:
        line = cli(loaded, *cmd[1:], "--namespace", "readme-pair").stderr.strip().splitlines()[-1]
        m = re.match(r"(\d+) tokens in .* over (\d+) steps; finish", line)
        assert m, line
        runs.append((int(m.group(1)), int(m.group(2))))
    (n1, s1), (n2, s2) = runs
    assert n1 == n2 == tokens
    # "about": the steps depend on the costs measured on this machine
    assert s1 <= 2 * first_steps and s2 <= 2 * second_steps, runs


def test_stats_flag_prints_speed_and_first_token(loaded: Any) -> None:
    out = cli(loaded, "generate", "--max-tokens", "6", "--stats", "SELECT count(*) FROM")
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith("6 tokens in ") or "finish: stop" in line, line
    assert " tok/s" in line and "first token " in line and " ms;" in line
    assert "seconds" not in line and "{" not in line


def test_metrics_show_generation_speed_and_verifier_costs(loaded: Any) -> None:
    cli(loaded, "generate", "--max-tokens", "4", "SELECT")
    addr = (loaded.proc.data_dir / "metrics.addr").read_text().strip()
    text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=10).read().decode()
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
              if line and not line.startswith("#")}
    assert values["suffixd_generate_first_token_seconds_count"] >= 1
    assert values["suffixd_generate_tokens_per_second_count"] >= 1
    assert values["suffixd_generate_tokens_per_second_sum"] > 0
    assert values["suffixd_generate_completion_tokens_total"] >= 4
    assert values['suffixd_verifier_cost{k="1"}'] == 1.0
    assert values['suffixd_verifier_cost{k="8"}'] > 1.0


def test_async_session_and_generate(loaded: Any) -> None:
    prompt = "SELECT name, country FROM singer WHERE"
    want = "".join(c.text for c in loaded.generate(None, prompt=prompt, max_tokens=8))

    async def main() -> tuple[str, int, int]:
        async with AsyncClient(loaded.target) as ac:
            await ac.wait_ready()
            async with ac.session("async-gen") as s:  # as the README shows
                await s.append(text=prompt, kind="prompt")
                d = await s.speculate(max_tokens=4)
                sid = s.id
            text = ""
            last = None
            async for chunk in ac.generate("a1", namespace="async-gen", prompt=prompt,
                                           max_tokens=8):
                text += chunk.text
                last = chunk
            assert last is not None and last.finish_reason in ("length", "stop")
            with pytest.raises(KeyError):
                await ac.describe_session("async-gen", sid)  # closed on exit
            info = await ac.describe_session("async-gen", "a1")
            return text, info.tokens, len(d.tokens)

    text, tokens, _ = asyncio.run(main())
    assert text == want  # greedy: the same continuation as the sync client's
    assert tokens > 0


def test_external_verifier_gets_drafts_on_an_exact_corpus_match(loaded: Any,
                                                                tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    queries = [
        "SELECT singer.name, singer.country FROM singer JOIN concert ON singer.singer_id = "
        "concert.singer_id WHERE concert.year = 2014 ORDER BY singer.age DESC;",
        "SELECT T1.name FROM stadium AS T1 JOIN concert AS T2 ON T1.stadium_id = "
        "T2.stadium_id GROUP BY T2.stadium_id ORDER BY count(*) DESC LIMIT 1;",
    ]
    (corpus / "q.sql").write_text("\n".join(queries) + "\n")
    cli(loaded, "warm", "--corpus", str(corpus), "-n", "ext")
    # Generation has run on this daemon: its own drafter now plans for its measured CPU
    # verifier and is calibrated by it. A caller with its own verifier is not held to that.
    with Client(loaded.target) as c:
        for q in queries:
            ids = c.tokenize(q)
            with c.session("ext") as s:
                s.append(ids[:20], kind="prompt")
                d = s.speculate(max_tokens=16)
            assert d.tokens == ids[20:36], (q, d)


def test_suffix_draft_model_in_llama_drafts_and_shows_in_stats(loaded: Any) -> None:
    import llama_cpp
    from suffixd.daemon.model import embedded_model_path, llama_defaults

    dm = SuffixDraftModel(loaded, namespace="llama-dm", max_tokens=8)
    with llama_defaults():
        llm = llama_cpp.Llama(model_path=str(embedded_model_path()), n_ctx=512, verbose=False,
                              seed=1, draft_model=dm)
    prompt = "red, green, blue, yellow. " * 6 + "red, green,"
    got = llm(prompt, max_tokens=24, temperature=0.0)["choices"][0]["text"]
    assert got.strip()
    ns = loaded.stats("llama-dm")["namespaces"][0]["counters"]
    assert ns["speculate_calls"] >= 2 and ns["steps"] >= 1
    assert ns["draft_tokens_accepted"] >= 4, ns
    # ... and through the CLI, as a user looks.
    out = cli(loaded, "stats", "-n", "llama-dm").stdout
    assert "namespace llama-dm" in out and "speculate calls" in out
    sessions = cli(loaded, "sessions", "list", "-n", "llama-dm").stdout
    assert dm.session_id is not None and dm.session_id in sessions
    dm.close()
