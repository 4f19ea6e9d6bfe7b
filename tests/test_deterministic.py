"""Deterministic mode (``Verifier(deterministic=True)``, ``suffixd serve --deterministic``):
a row's logits depend only on its sequence's tokens and position, so greedy output is
compared exactly, with no near-tie clause: drafted (partly wrong drafts) against plain
decoding, token for token and logits bit for bit (sampled output for a seed too); a
generation alone against the same in steps shared with other generations; a prompt
restored from the prompt cache against the same evaluated; and greedy grammar-constrained
output against llama.cpp's own constrained decoding (its grammar sampler and greedy
sampler, over the logits of plain one-token decodes).

The verifier runs in a process of its own: the mode turns ggml's tiled matrix product off
through an environment variable that ggml reads once per process, at its first matrix
product; set in the test process, it would change the kernels of every other model test
collected with this one. ``PYTHONPATH=build/llama-cpp-avx2`` reaches the worker too.
"""

from __future__ import annotations

import json
import multiprocessing
import threading
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from suffixd.daemon.generation.certify import noisy_drafts
from suffixd.daemon.generation.verifier import GenerateParams, Verifier
from suffixd.daemon.model import embedded_model_path

QUESTIONS = (
    "Write the SQL that lists every singer older than 30.",
    "Explain in one sentence what a primary key is.",
    "Name three tables a concert database needs.",
)
GRAMMARS = Path(__file__).parent / "fixtures" / "grammars"
SCHEMA_CASES = (
    ("nested", "Give a user named Ada, aged 36, with two tags."),
    ("enum_const", "Pick the kind of database object a singer list is."),
    ("sql_answer", "Write the SQL that counts the singers, and the tables it reads."),
)
MAX_TOKENS = 24

_V: Verifier | None = None  # the worker's


def _init_worker() -> None:
    global _V
    # 2,048: past the sliding-window layers' ring of n_swa + n_ubatch = 1,024 cells
    _V = Verifier(embedded_model_path(), n_ctx=2048, n_threads=1, n_slots=3,
                  deterministic=True)


def _verifier() -> Verifier:
    assert _V is not None
    return _V


def _prompt(v: Verifier, text: str) -> list[int]:
    return v.tokenize(f"<start_of_turn>user\n{text}<end_of_turn>\n<start_of_turn>model\n",
                      add_bos=True, special=True)


def _run(v: Verifier, key: str, prompt: list[int], params: GenerateParams,
         propose: Any = None) -> dict[str, Any]:
    toks: list[int] = []
    tops: list[list[tuple[int, float]]] = []
    drafted = accepted = 0
    for c in v.generate(key, prompt, params, propose):
        toks += c.tokens
        tops += [g.top for g in c.gaps]
        if c.stats is not None:
            drafted, accepted = c.stats.drafted_tokens, c.stats.accepted_tokens
    v.forget(key)
    return {"tokens": toks, "tops": tops, "drafted": drafted, "accepted": accepted}


def _job_status() -> dict[str, Any]:
    import llama_cpp

    v = _verifier()
    return {**v.determinism, "extra_buffers": v.extra_buffers,
            "kernels": llama_cpp.llama_print_system_info().decode().strip()}


def _job_drafted_vs_plain() -> list[dict[str, Any]]:
    """Per question: plain greedy decoding, the same drafted from its own output with one
    draft token in five wrong, and every generated position's full logit row evaluated
    one token at a time, 7 at a time and all at once, compared bit for bit."""
    v = _verifier()
    params = GenerateParams(max_tokens=MAX_TOKENS, ignore_eos=True, record_gaps=True)
    out = []
    for i, q in enumerate(QUESTIONS):
        prompt = _prompt(v, q)
        plain = _run(v, f"plain-{i}", prompt, params)
        drafted = _run(v, f"drafted-{i}", prompt, params,
                       noisy_drafts(plain["tokens"], len(prompt), seed=i))
        full = prompt + plain["tokens"]
        by_shape = [v.logit_rows(full, len(prompt) - 1, n) for n in (1, 7, MAX_TOKENS)]
        worst = max(float(np.abs(a - b).max()) for rows in by_shape[1:]
                    for a, b in zip(by_shape[0], rows, strict=True))
        # the rows plain decoding chose from are those of the shapes' evaluation, too
        argmax = [int(np.argmax(r)) for r in by_shape[0][:-1]]
        out.append({"plain": plain, "drafted": drafted, "rows_max_diff": worst,
                    "rows_equal": worst == 0.0, "argmax": argmax})
    return out


def _job_past_the_ring() -> dict[str, Any]:
    """Plain decoding across the 1,024th position (the end of the sliding-window layers'
    KV ring when it is not kept whole), then the same drafted with 12-token drafts whose
    first token is wrong wherever they would cross that position: rows that wrap to the
    ring's start, rolled back (before the fix, the next positions landed in other cells)."""
    v = _verifier()
    ring = v.n_swa + v.n_ubatch
    words = QUESTIONS[1].split() + QUESTIONS[2].split()
    text = " ".join(words[(i * 5) % len(words)] for i in range(ring))
    prompt = v.tokenize(text, add_bos=True)[: ring - 14]
    params = GenerateParams(max_tokens=MAX_TOKENS, ignore_eos=True, record_gaps=True)
    plain = _run(v, "ring-plain", prompt, params)
    crossings = []

    def propose(ctx: list[int], k: int) -> list[int]:
        d = plain["tokens"][len(ctx) - len(prompt):][: min(k, 12)]
        if d and len(ctx) < ring <= len(ctx) + len(d) - 1:
            crossings.append(len(ctx))
            return [(d[0] + 11) % 1000, *d[1:]]
        return d[:2]

    drafted = _run(v, "ring-drafted", prompt, params, propose)
    return {"plain": plain, "drafted": drafted, "crossings": crossings, "ring": ring,
            "prompt": len(prompt)}


def _job_sampled() -> list[dict[str, Any]]:
    """Sampled (temperature 0.8, top-p 0.95, a seed): plain, then drafted from its output."""
    v = _verifier()
    params = GenerateParams(max_tokens=MAX_TOKENS, temperature=0.8, top_p=0.95, seed=7,
                            ignore_eos=True, record_gaps=True)
    out = []
    for i, q in enumerate(QUESTIONS[:2]):
        prompt = _prompt(v, q)
        plain = _run(v, f"s-plain-{i}", prompt, params)
        drafted = _run(v, f"s-drafted-{i}", prompt, params,
                       noisy_drafts(plain["tokens"], len(prompt), seed=30 + i))
        out.append({"plain": plain, "drafted": drafted})
    return out


def _job_alone_vs_shared() -> dict[str, Any]:
    """Each question alone (plain), then all three at once in shared steps, each drafted
    from its own output (partly wrong drafts: unequal rows, padding, rollbacks)."""
    v = _verifier()
    params = GenerateParams(max_tokens=MAX_TOKENS, ignore_eos=True, record_gaps=True)
    prompts = [_prompt(v, q) for q in QUESTIONS]
    alone = [_run(v, f"alone-{i}", p, params) for i, p in enumerate(prompts)]
    before = v.batch_stats()
    together: list[Any] = [None] * len(prompts)
    errors: list[str] = []

    def worker(i: int) -> None:
        try:
            together[i] = _run(v, f"together-{i}", prompts[i], params,
                               noisy_drafts(alone[i]["tokens"], len(prompts[i]), seed=10 + i))
        except BaseException as exc:  # reported by the test
            errors.append(repr(exc))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    after = v.batch_stats()
    shared = sum(n for k, n in after["by_sequences"].items() if int(k) > 1) - sum(
        n for k, n in before["by_sequences"].items() if int(k) > 1)
    return {"alone": alone, "together": together, "errors": errors, "shared_steps": shared,
            "padding_rows": after["padding_rows"] - before["padding_rows"]}


def _job_prompt_cache() -> list[dict[str, Any]]:
    """The same prompt twice, as two conversations: the second starts from the prompt
    cache's checkpoint of the first where the mode restores one (a prompt within the
    sliding window, 300 tokens); of 700 tokens, only a checkpoint within the window (here
    the first prompt's, a prefix of it) is restored and the rest evaluated again."""
    v = _verifier()
    params = GenerateParams(max_tokens=8, ignore_eos=True, record_gaps=True)
    words = QUESTIONS[0].split() + QUESTIONS[1].split()
    out = []
    for n in (300, 700):
        text = " ".join(words[(i * 7) % len(words)] for i in range(n))
        prompt = v.tokenize(text, add_bos=True)[:n]
        runs = []
        for k in range(2):
            toks: list[int] = []
            tops: list[Any] = []
            cached = 0
            for c in v.generate(f"pc-{n}-{k}", prompt, params, cache_scope="pc"):
                toks += c.tokens
                tops += [g.top for g in c.gaps]
                if c.stats is not None:
                    cached = c.stats.cached_prompt_tokens
            v.forget(f"pc-{n}-{k}")
            runs.append({"tokens": toks, "tops": tops, "cached": cached})
        out.append({"n": n, "runs": runs, "window": v.n_swa})
    return out


def _reference_constrained(v: Verifier, prompt: list[int], gbnf: str) -> list[int]:
    """llama.cpp's greedy constrained decoding: its sampler chain (grammar, then greedy)
    over the logits of one-token decodes on a scratch slot of ``v``."""
    ll = v._llama_cpp
    chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
    ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_grammar(
        v._vocab, gbnf.encode(), b"root"))
    ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_greedy())
    out: list[int] = []
    try:
        with v._scratch(prompt[:-1], v.n_batch, MAX_TOKENS + 1) as seq:
            tok, pos = prompt[-1], len(prompt) - 1
            while len(out) < MAX_TOKENS:
                with v._turns:
                    v._decode(seq, [tok], pos, all_logits=True)
                    tok = int(ll.llama_sampler_sample(chain, v._ctx.ctx, 0))
                if v.is_eog(tok):
                    break
                out.append(tok)
                pos += 1
    finally:
        ll.llama_sampler_free(chain)
    return out


def _job_grammar() -> list[dict[str, Any]]:
    v = _verifier()
    reference = json.loads((GRAMMARS / "reference.json").read_text())
    out = []
    for i, (name, question) in enumerate(SCHEMA_CASES):
        gbnf = reference[name]["grammar"]
        prompt = _prompt(v, question)
        want = _reference_constrained(v, prompt, gbnf)
        params = GenerateParams(max_tokens=MAX_TOKENS, grammar=gbnf)
        plain = _run(v, f"g-plain-{i}", prompt, params)
        drafted = _run(v, f"g-drafted-{i}", prompt, params,
                       noisy_drafts(want, len(prompt), seed=20 + i))
        out.append({"name": name, "want": want, "plain": plain, "drafted": drafted})
    return out


@pytest.fixture(scope="module")
def worker() -> Iterator[ProcessPoolExecutor]:
    pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_init_worker)
    status = pool.submit(_job_status).result(timeout=600)
    print(f"deterministic verifier: {status}")
    assert status["on"], f"deterministic mode did not hold: {status.get('why')}"
    assert status["extra_buffers"] is False
    yield pool
    pool.shutdown()


def test_drafted_greedy_equals_plain_token_for_token_and_bit_for_bit(
        worker: ProcessPoolExecutor) -> None:
    for i, r in enumerate(worker.submit(_job_drafted_vs_plain).result(timeout=900)):
        plain, drafted = r["plain"], r["drafted"]
        assert len(plain["tokens"]) == MAX_TOKENS
        # partly wrong drafts: some accepted, some rejected
        assert 0 < drafted["accepted"] < drafted["drafted"], (i, drafted)
        assert drafted["tokens"] == plain["tokens"], i
        # each generated position's 32 best logits, bit for bit (float32 -> float: exact)
        assert drafted["tops"] == plain["tops"], i
        assert r["rows_equal"], (i, r["rows_max_diff"])
        assert r["argmax"] == plain["tokens"][: len(r["argmax"])], i


def test_drafts_rolled_back_past_the_sliding_windows_ring_change_no_logit(
        worker: ProcessPoolExecutor) -> None:
    r = worker.submit(_job_past_the_ring).result(timeout=900)
    plain, drafted = r["plain"], r["drafted"]
    assert r["prompt"] + len(plain["tokens"]) > r["ring"] + 8, r
    assert r["crossings"], "no draft crossed the ring's end"
    assert drafted["tokens"] == plain["tokens"]
    assert drafted["tops"] == plain["tops"]


def test_sampled_output_for_a_seed_is_the_same_drafted_or_not(
        worker: ProcessPoolExecutor) -> None:
    for i, r in enumerate(worker.submit(_job_sampled).result(timeout=900)):
        assert r["drafted"]["accepted"] > 0, i
        assert r["drafted"]["tokens"] == r["plain"]["tokens"], i
        assert r["drafted"]["tops"] == r["plain"]["tops"], i


def test_a_generation_alone_equals_the_same_in_shared_steps(
        worker: ProcessPoolExecutor) -> None:
    r = worker.submit(_job_alone_vs_shared).result(timeout=900)
    assert not r["errors"], r["errors"]
    assert r["shared_steps"] >= 5, r["shared_steps"]
    for i, (alone, together) in enumerate(zip(r["alone"], r["together"], strict=True)):
        assert together["tokens"] == alone["tokens"], i
        assert together["tops"] == alone["tops"], i
        assert together["accepted"] > 0, i


def test_greedy_constrained_output_equals_llama_cpps_constrained_decoding(
        worker: ProcessPoolExecutor) -> None:
    for r in worker.submit(_job_grammar).result(timeout=900):
        assert r["want"], r["name"]
        assert r["plain"]["tokens"] == r["want"], r["name"]
        assert r["drafted"]["tokens"] == r["want"], r["name"]
        assert r["drafted"]["accepted"] > 0, r["name"]


def test_a_prompt_restored_from_the_prompt_cache_gives_the_same_logits(
        worker: ProcessPoolExecutor) -> None:
    short, long = worker.submit(_job_prompt_cache).result(timeout=900)
    assert short["runs"][1]["cached"] >= short["n"] - 2, short["runs"][1]["cached"]
    # past the window a checkpoint's restored cells would lie elsewhere: at most a
    # checkpoint within it is restored, the rest evaluated again
    assert long["n"] > long["window"] >= long["runs"][1]["cached"]
    for case in (short, long):
        first, again = case["runs"]
        assert again["tokens"] == first["tokens"], case["n"]
        assert again["tops"] == first["tops"], case["n"]
