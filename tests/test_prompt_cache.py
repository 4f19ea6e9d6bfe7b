"""Prompt reuse across conversations: the checkpoint store against a reference model, and
the verifier starting new conversations from checkpoints on the real model."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from suffixd.daemon.generation.certify import certify_greedy
from suffixd.daemon.generation.prompt_cache import PromptCache
from suffixd.daemon.generation.verifier import GenerateParams, Verifier
from suffixd.daemon.model import embedded_model_path

from tests.conftest import THREADS

# ------------------------------------------------------------------ the store (no model)

TOKENS = st.lists(st.integers(0, 3), min_size=0, max_size=12)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.sampled_from("ab"), TOKENS, st.integers(1, 40)),
        st.tuples(st.just("best"), st.sampled_from("ab"), TOKENS, st.booleans()),
    ),
    max_size=40,
)


class Reference:
    """The store's rules spelt out: LRU order as a list, bytes summed, nothing clever."""

    def __init__(self, max_bytes: int, min_tokens: int) -> None:
        self.max_bytes, self.min_tokens = max_bytes, min_tokens
        self.entries: list[tuple[str, tuple[int, ...], int]] = []  # least recent first

    def size(self, tokens: tuple[int, ...], nbytes: int) -> int:
        return nbytes + 4 * len(tokens)

    def add(self, scope: str, tokens: tuple[int, ...], nbytes: int) -> bool:
        if self.size(tokens, nbytes) > self.max_bytes:
            return False
        self.entries = [e for e in self.entries if e[:2] != (scope, tokens)]
        while self.entries and sum(self.size(t, n) for _, t, n in self.entries) \
                + self.size(tokens, nbytes) > self.max_bytes:
            self.entries.pop(0)
        self.entries.append((scope, tokens, nbytes))
        return True

    def best(self, scope: str, prompt: tuple[int, ...], partial: bool) -> int:
        best, where = 0, -1
        for i, (s, t, _) in enumerate(self.entries):
            if s != scope:
                continue
            n = 0
            while n < min(len(t), len(prompt)) and t[n] == prompt[n]:
                n += 1
            if (partial or n == len(t)) and n >= self.min_tokens and n > best:
                best, where = n, i
        if where >= 0:
            self.entries.append(self.entries.pop(where))
        return best


@settings(max_examples=300, deadline=None)
@given(ops=OPS, max_bytes=st.integers(0, 120))
def test_the_store_matches_its_reference(ops: list[Any], max_bytes: int) -> None:
    cache, ref = PromptCache(max_bytes, min_tokens=1), Reference(max_bytes, 1)
    for op in ops:
        if op[0] == "add":
            _, scope, tokens, nbytes = op
            assert cache.add(scope, tokens, b"x" * nbytes) == (
                max_bytes > 0 and ref.add(scope, tuple(tokens), nbytes))
        else:
            _, scope, prompt, partial = op
            found = cache.best(scope, prompt, len(prompt), partial=partial)
            want = ref.best(scope, tuple(prompt), partial)
            assert (found[1] if found else 0) == want
            if found:
                cp, n = found
                assert cp.scope == scope and list(cp.tokens[:n]) == prompt[:n]
        assert cache.nbytes == sum(ref.size(t, n) for _, t, n in ref.entries) <= max(max_bytes, 0)
        assert len(cache) == len(ref.entries)


def test_checkpoint_points() -> None:
    cache = PromptCache(1 << 20, min_tokens=4)
    prompt = list(range(100))
    # a new conversation: the hints (long enough, past the start) and its end
    assert cache.points("ns", prompt, 0, [2, 30, 60, 200]) == [30, 60, 99]
    # a session's next turn: no end point; what its slot holds already is not wanted
    assert cache.points("ns", prompt, 40, [30, 60], new=False) == [60]
    # learnt: the longest prefix shared with a recent prompt of the same scope
    cache.remember_prompt("ns", [*range(50), 7, 7, 7])
    cache.remember_prompt("other", list(range(90)) + [1])
    assert cache.points("ns", prompt, 0, new=False) == [50]
    # already stored: not again
    cache.add("ns", list(range(50)), b"s")
    assert cache.points("ns", prompt, 0, new=False) == []
    assert PromptCache(0).points("ns", prompt, 0, [30]) == []


def test_announced_checkpoints_are_awaited_longest_first() -> None:
    cache = PromptCache(1 << 20, min_tokens=4)
    prompt = list(range(100))
    short, long_ = cache.expect("ns", prompt, [30, 60])
    cache.expect("other", prompt, [80])  # another scope's: never this one's
    assert cache.awaited("ns", prompt, 0, 99) is long_
    assert cache.awaited("ns", prompt, 0, 50) is short  # the longer one is past the limit
    assert cache.awaited("ns", prompt, 60, 99) is None  # nothing longer than what it holds
    assert cache.awaited("ns", [*range(40), 5, 5], 0, 41) is short  # parts from it at 40
    assert cache.awaited("ns", [9, *range(99)], 0, 99) is None
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(cache.wait(long_, 30)))
    waiter.start()
    cache.settle([long_])
    waiter.join(30)
    assert woke == [True]
    assert cache.awaited("ns", prompt, 0, 99) is short
    cache.settle([short, short])  # settling twice is harmless
    assert cache.awaited("ns", prompt, 0, 99) is None
    assert cache.wait(short, 0) is True
    assert PromptCache(0).expect("ns", prompt, [30]) == []


# ------------------------------------------------------------------- the real model

SHARED = (
    "You are the coding agent of a small team. You receive a task and the repository's "
    "layout; you answer with a plan, then the patch. Rules: keep changes small; every "
    "function gets type hints; tests come with every change; never touch generated files; "
    "explain what you did in one paragraph at the end. The repository: a Python package "
    "with folders daemon, client, cli, suffixcache and tests; the daemon serves drafts "
    "over gRPC and an OpenAI-compatible endpoint; the cache keeps suffix trees per "
    "namespace in LMDB. "
) * 4


@pytest.fixture(scope="module")
def verifiers() -> Iterator[tuple[Verifier, Verifier]]:
    cached = Verifier(embedded_model_path(), n_threads=THREADS, n_ctx=2048, n_slots=3)
    plain = Verifier(embedded_model_path(), n_threads=THREADS, n_ctx=2048, n_slots=3,
                     prompt_cache_mb=0)
    yield cached, plain
    cached.close()
    plain.close()


def _run(v: Verifier, key: str, prompt: list[int], **kw: Any) -> tuple[list[int], Any, Any]:
    params = GenerateParams(max_tokens=24, ignore_eos=True, record_gaps=True)
    chunks = list(v.generate(key, prompt, params, **kw))
    v.forget(key)
    return ([t for c in chunks for t in c.tokens], [g for c in chunks for g in c.gaps],
            chunks[-1].stats)


def test_new_conversations_start_from_a_shared_prefix_and_stay_lossless(
        verifiers: tuple[Verifier, Verifier]) -> None:
    cached, plain = verifiers
    shared = [cached.bos_token, *cached.tokenize(SHARED)]
    assert len(shared) > 400
    tasks = ["\nTask: add a --verbose flag to the CLI.\nPlan:",
             "\nTask: fix the flaky test of the fleet.\nPlan:",
             "\nTask: document the limits table.\nPlan:"]
    before = cached.prompt_cache.as_dict()
    for i, task in enumerate(tasks):
        prompt = shared + cached.tokenize(task)
        out, gaps, stats = _run(cached, f"task-{i}", prompt, cache_points=[len(shared)],
                                cache_scope="team")
        ref, ref_gaps, ref_stats = _run(plain, f"task-{i}", prompt, cache_points=[len(shared)],
                                        cache_scope="team")
        assert ref_stats.cached_prompt_tokens == 0
        # the first conversation evaluates everything; the next ones only their task (the
        # third starts a few tokens later: "\nTask: " is what the first two shared)
        if i == 0:
            assert stats.cached_prompt_tokens == 0
        else:
            assert len(shared) <= stats.cached_prompt_tokens < len(prompt) - 6, i
        verdict, where = certify_greedy(ref_gaps, gaps)
        assert verdict != "diverged", (i, where)
        if verdict == "identical":
            assert out == ref
    after = cached.prompt_cache.as_dict()
    assert after["hits"] - before["hits"] == 2
    assert after["reused_tokens"] - before["reused_tokens"] >= 2 * len(shared)
    # another namespace shares nothing
    _, _, stats = _run(cached, "elsewhere", shared + cached.tokenize(tasks[0]),
                       cache_points=[len(shared)], cache_scope="another-team")
    assert stats.cached_prompt_tokens == 0


def test_conversations_started_at_once_evaluate_their_shared_prefix_once(
        verifiers: tuple[Verifier, Verifier]) -> None:
    """Agents started together on one system prompt: the first evaluates it, the others
    wait for its checkpoint instead of evaluating it beside it, and stay lossless. The
    prefix takes the first several steps, so the others arrive while it is under way."""
    cached, plain = verifiers
    shared = [cached.bos_token, *cached.tokenize(SHARED * 3)]
    assert len(shared) > 2 * cached.n_batch
    prompts = [shared + cached.tokenize(f"\nTask {i}: rename module number {i}.\nPlan:")
               for i in range(3)]
    before = cached.prompt_cache.as_dict()
    results: dict[int, tuple[list[int], Any, Any]] = {}

    def run(i: int) -> None:
        results[i] = _run(cached, f"together-{i}", prompts[i], cache_points=[len(shared)],
                          cache_scope="together")

    first = threading.Thread(target=run, args=(0,))
    first.start()
    # the others arrive once the first has announced its checkpoints
    for _ in range(2000):
        if cached.prompt_cache.awaited("together", prompts[1], 0, len(prompts[1]) - 1):
            break
        time.sleep(0.005)
    others = [threading.Thread(target=run, args=(i,)) for i in (1, 2)]
    for t in others:
        t.start()
    for t in [first, *others]:
        t.join(300)
    assert sorted(results) == [0, 1, 2]
    assert results[0][2].cached_prompt_tokens == 0
    for i in (1, 2):
        assert results[i][2].cached_prompt_tokens >= len(shared), i
        ref = _run(plain, f"together-{i}", prompts[i], cache_scope="together")
        verdict, where = certify_greedy(ref[1], results[i][1])
        assert verdict != "diverged", (i, where)
    after = cached.prompt_cache.as_dict()
    assert after["awaited"] - before["awaited"] == 2


def test_the_same_request_again_reuses_all_but_its_last_token(
        verifiers: tuple[Verifier, Verifier]) -> None:
    cached, _ = verifiers
    prompt = [cached.bos_token, *cached.tokenize(SHARED + " Once more, in other words:")]
    first = _run(cached, "once", prompt, cache_scope="again")
    second = _run(cached, "twice", prompt, cache_scope="again")
    assert first[2].cached_prompt_tokens == 0
    assert second[2].cached_prompt_tokens == len(prompt) - 1
    verdict, where = certify_greedy(first[1], second[1])
    assert verdict != "diverged", where


def test_a_store_too_small_for_a_checkpoint_refuses_it_and_serves() -> None:
    v = Verifier(embedded_model_path(), n_threads=THREADS, n_ctx=1024, n_slots=1, prompt_cache_mb=1)
    try:
        prompt = [v.bos_token, *v.tokenize(SHARED)]
        a = _run(v, "a", prompt, cache_scope="tiny")
        b = _run(v, "b", prompt, cache_scope="tiny")
        assert a[0] == b[0] and b[2].cached_prompt_tokens == 0
        pc = v.prompt_cache.as_dict()
        assert pc["refused"] >= 1 and pc["entries"] == 0 and pc["bytes"] == 0
    finally:
        v.close()
