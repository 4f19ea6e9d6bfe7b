"""Several generations at once share each verifier step (one decode for all of them):
through the real model, each output equals the same generation alone up to certified
near-ties, sampling keeps its distribution, and a generation that leaves mid-batch
(a client gone) frees the others; through the real daemon, concurrent requests are
served in shared steps and a disconnect leaves the batch."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from suffixd.daemon.generation.certify import (
    NEAR_TIE_GAP,
    certify_greedy,
    certify_sampled,
    cut_shortfall,
    noisy_drafts,
)
from suffixd.daemon.generation.chat import ChatRenderer
from suffixd.daemon.generation.sampling import target_probs
from suffixd.daemon.generation.verifier import GenerateParams, Verifier
from suffixd.daemon.model import embedded_model_path

from tests.test_verifier_sampling import CHI2_001, chi_square

WORKLOAD = Path(__file__).resolve().parents[1] / "examples" / "workloads" / "sql_agent.jsonl"


@pytest.fixture(scope="module")
def verifier() -> Iterator[Verifier]:
    v = Verifier(embedded_model_path(), n_ctx=4096, n_threads=2, n_slots=4)
    yield v
    v.close()


def _prompts(v: Verifier, n: int) -> list[list[int]]:
    renderer = ChatRenderer(v)
    out = []
    with WORKLOAD.open() as f:
        for line in f:
            msgs = json.loads(line)["messages"]
            first = next(i for i, m in enumerate(msgs) if m["role"] == "assistant")
            out.append(renderer.tokens(msgs[:first]))
            if len(out) == n:
                break
    return out


def _run(v: Verifier, key: str, prompt: list[int], params: GenerateParams, propose=None):
    toks, gaps = [], []
    for c in v.generate(key, prompt, params, propose):
        toks += c.tokens
        gaps += c.gaps
    return toks, gaps


def _alone_then_together(verifier: Verifier, prompts: list[list[int]],
                          params: GenerateParams, tag: str, seed: int = 0
                          ) -> tuple[list[Any], list[Any]]:
    """Each prompt generated alone (no drafts), then all at once in shared steps with
    noisy drafts from their own reference outputs; both runs' (tokens, gaps)."""
    alone = []
    for i, p in enumerate(prompts):
        alone.append(_run(verifier, f"{tag}alone-{i}", p, params))
        verifier.forget(f"{tag}alone-{i}")
    together: list[Any] = [None] * len(prompts)
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            together[i] = _run(verifier, f"{tag}together-{i}", prompts[i], params,
                               noisy_drafts(alone[i][0], len(prompts[i]), seed + i))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not errors, errors
    for i in range(len(prompts)):
        verifier.forget(f"{tag}together-{i}")
    return alone, together


def _assert_certified(alone: list[Any], together: list[Any]) -> None:
    """Each shared-step output equals its generation alone up to certified near-ties."""
    for i, ((ref, ref_gaps), (out, gaps)) in enumerate(zip(alone, together, strict=True)):
        verdict, where = certify_greedy(ref_gaps, gaps)
        assert verdict != "diverged", (i, where, ref_gaps[where], gaps[where])
        if verdict == "identical":
            assert out == ref


def test_generations_at_once_equal_each_alone_up_to_certified_near_ties(
        verifier: Verifier) -> None:
    prompts = _prompts(verifier, 4)
    params = GenerateParams(max_tokens=24, ignore_eos=True, record_gaps=True)
    before = verifier.batch_stats()
    alone, together = _alone_then_together(verifier, prompts, params, "")
    after = verifier.batch_stats()
    _assert_certified(alone, together)
    # the steps were shared, and sequences of unequal drafts were padded to equal rows
    shared = sum(v for k, v in after["by_sequences"].items() if int(k) > 1) - sum(
        v for k, v in before["by_sequences"].items() if int(k) > 1)
    assert shared >= 10, (before, after)
    assert after["padding_rows"] > before["padding_rows"]


def test_no_decode_spans_two_ubatches_even_when_its_rows_are_left_unequal(
        verifier: Verifier, monkeypatch) -> None:
    """Unequal rows in a run make llama.cpp split a step into ubatches; a drafted decode
    whose rows spanned two of them and was rolled back parted from plain decoding far
    beyond a near-tie (every turn of bench/batched_certify.py with the padding taken out).
    The plan cuts such a decode to its first ubatch's rows: with the padding taken out
    again, each output still equals the same generation alone up to certified near-ties."""
    import suffixd.daemon.generation.step_planner as step_planner

    prompts = _prompts(verifier, 4)
    params = GenerateParams(max_tokens=48, ignore_eos=True, record_gaps=True)
    monkeypatch.setattr(step_planner, "padded_rows", lambda reqs, kept: list(kept))
    alone, together = _alone_then_together(verifier, prompts, params, "whole-", seed=10)
    _assert_certified(alone, together)


def test_sampling_keeps_its_distribution_in_shared_steps(verifier: Verifier) -> None:
    """The first sampled token of a generation that shares its steps with another one
    (which drafts): chi-square against the target's p, with a draft proposing the
    second-likeliest token.

    Every sample's logit row is its own sequence's (the step's row, recorded, matches plain
    decoding's logits within rounding, not the neighbour's), and a token outside plain
    decoding's top-k cut is allowed only as a certified near-tie (its logit within
    NEAR_TIE_GAP of the cut: rounding moved it across). Such tokens compete for the
    cut's last place, so they share one bin with the plain cut's weakest token."""
    prompt = _prompts(verifier, 1)[0]
    k = 4
    plain = verifier.next_logits(prompt)
    p = target_probs(plain, 1.0, k, 1.0)
    order = np.argsort(-p)[:k]
    x = int(order[1])
    stop = threading.Event()
    neighbour_prompt = _prompts(verifier, 2)[1]
    neighbour_plain = verifier.next_logits(neighbour_prompt)

    def neighbour() -> None:
        params = GenerateParams(max_tokens=4000, ignore_eos=True)
        for _ in verifier.generate("neighbour", neighbour_prompt, params,
                                   lambda ctx, m: ctx[-3:][: min(m, 3)]):
            if stop.is_set():
                break

    before = verifier.batch_stats()
    t = threading.Thread(target=neighbour)
    t.start()
    n = 200
    counts = np.zeros(k)
    near_ties: list[tuple[int, int, float]] = []  # (seed, token, its shortfall)
    try:
        for seed in range(n):
            params = GenerateParams(max_tokens=1, temperature=1.0, top_k=k, seed=seed,
                                    record_gaps=True)
            chunks = list(verifier.generate("sampled", prompt, params, lambda ctx, m: [x]))
            tok = chunks[0].tokens[0]
            row = chunks[0].gaps[0]
            # the row read is this sequence's: plain decoding's logits within rounding,
            # and nearer them than the neighbour's
            drift = max(abs(logit - plain[t]) for t, logit in row.top)
            other = max(abs(logit - neighbour_plain[t]) for t, logit in row.top)
            assert drift < NEAR_TIE_GAP and drift < other, (seed, drift, other, row.top[:8])
            verdict = certify_sampled(plain, tok, 1.0, k, 1.0)
            rank = int(np.sum(plain > plain[tok]))
            assert verdict != "outside", (
                f"seed {seed}: token {tok} of plain rank {rank} sampled, "
                f"{cut_shortfall(plain, tok, 1.0, k, 1.0):.3f} below the top-{k} cut")
            if verdict == "near_tie":
                near_ties.append((seed, tok, cut_shortfall(plain, tok, 1.0, k, 1.0)))
                counts[k - 1] += 1
            else:
                counts[int(np.flatnonzero(order == tok)[0])] += 1
    finally:
        stop.set()
        t.join(120)
    if near_ties:
        print(f"certified near-ties (seed, token, shortfall): {near_ties}; "
              f"plain top-{k} {[(int(t), float(plain[t])) for t in order]}")
    after = verifier.batch_stats()
    shared = after["by_sequences"].get("2", 0) - before["by_sequences"].get("2", 0)
    assert shared >= n // 2, (before, after)
    stat = chi_square(counts, p[order], n)
    assert stat < CHI2_001[k - 1], (counts, p[order] * n, stat, near_ties)


def test_a_generation_that_leaves_mid_batch_frees_the_others(verifier: Verifier) -> None:
    prompts = _prompts(verifier, 2)
    params = GenerateParams(max_tokens=40, ignore_eos=True)
    ref, _ = _run(verifier, "stay-ref", prompts[0], params)
    verifier.forget("stay-ref")
    got: list[int] = []
    left = threading.Event()

    def leaver() -> None:
        gen = verifier.generate("leaver", prompts[1], GenerateParams(max_tokens=4000,
                                                                     ignore_eos=True))
        for i, _ in enumerate(gen):
            if i == 5:
                break
        gen.close()  # what a server does when its client hangs up
        left.set()

    t = threading.Thread(target=leaver)
    t.start()
    for c in verifier.generate("stay", prompts[0], params):
        got += c.tokens
    t.join(120)
    assert left.is_set()
    assert len(got) == 40 and got[:8] == ref[:8]
    # nothing waits for the one that left: a third generation runs alone at once
    out, _ = _run(verifier, "after", prompts[0], GenerateParams(max_tokens=4))
    assert len(out) == 4
    assert verifier._steps._members == 0 and verifier._steps._in_flight == 0


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tests.conftest import DaemonProcess

    proc = DaemonProcess(tmp_path_factory.mktemp("batched") / "data",
                         ["--http", "127.0.0.1:0"]).start()
    yield proc
    proc.stop()


def test_the_daemon_serves_concurrent_requests_in_shared_steps(daemon: Any) -> None:
    from suffixd.client import Client

    questions = ["List the names of all singers.", "How many concerts are there?",
                 "Show the stadium with the largest capacity.", "Count the singers by country."]

    def ask(q: str, max_tokens: int = 24, **extra: Any) -> dict[str, Any]:
        r = httpx.post(f"{daemon.http}/chat/completions", timeout=600, json={
            "model": "default", "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": q}], **extra})
        assert r.status_code == 200, r.text
        return r.json()

    alone = [ask(q)["choices"][0]["message"]["content"] for q in questions]
    client = Client(daemon.socket)
    try:
        before = client.generator_status()["batching"]
        together: list[str] = [""] * len(questions)

        def worker(i: int) -> None:
            together[i] = ask(questions[i])["choices"][0]["message"]["content"]

        # a streamed request whose client hangs up after a few chunks, among them
        def hang_up() -> None:
            with httpx.stream("POST", f"{daemon.http}/chat/completions", timeout=600, json={
                "model": "default", "max_tokens": 2000, "stream": True,
                "messages": [{"role": "user", "content": "Write a long story."}]}) as r:
                for n, _ in enumerate(r.iter_lines()):
                    if n == 6:
                        break

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(questions))]
        threads.append(threading.Thread(target=hang_up))
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        after = client.generator_status()["batching"]
    finally:
        client.close()
    shared = sum(v for k, v in after["by_sequences"].items() if int(k) > 1) - sum(
        v for k, v in (before or {"by_sequences": {}})["by_sequences"].items() if int(k) > 1)
    assert shared >= 5, (before, after)
    assert after["max_sequences"] >= 3
    # each answered in full (equality with each alone, up to certified near-ties, is
    # the verifier-level test's: a text cannot say whether a difference is a near-tie)
    assert all(together) and len(alone) == len(together)
    # the hung-up stream left the batch: a request now is served, alone, at once
    assert ask("Say yes.", max_tokens=2)["usage"]["completion_tokens"] >= 1
