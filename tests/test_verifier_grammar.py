"""Constrained decoding with speculation, on the real model: drafts never change what a
grammar-constrained generation gives (greedy up to certified near-ties, sampled token for
token with the same seed up to a certified near-tied race), a draft token the grammar
forbids is never verified, and the sampled first token follows the constrained
distribution."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import numpy as np
import pytest
from suffixd.daemon.generation.certify import NEAR_TIE_GAP, certify_greedy
from suffixd.daemon.generation.chat import ChatRenderer
from suffixd.daemon.generation.grammar import (
    Grammar,
    GrammarError,
    constrained_argmax,
    grammar_for_schema,
)
from suffixd.daemon.generation.sampling import SamplingNoise, target_probs
from suffixd.daemon.generation.verifier import GenerateParams, Verifier
from suffixd.daemon.http_api.tool_calls import GENERIC
from suffixd.daemon.model import embedded_model_path

from tests.conftest import THREADS

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"},
                                         "unit": {"type": "string", "enum": ["c", "f"]}},
        "required": ["city", "unit"]}}}]


@pytest.fixture(scope="module")
def verifier() -> Iterator[Verifier]:
    v = Verifier(embedded_model_path(), n_threads=THREADS, n_ctx=1024, n_slots=2)
    yield v
    v.close()


@pytest.fixture(scope="module")
def prompt(verifier: Verifier) -> list[int]:
    msgs = [{"role": "system", "content": GENERIC.system_prompt(TOOLS, False)},
            {"role": "user", "content": "What is the weather in Paris?"}]
    return ChatRenderer(verifier).tokens(msgs)


GBNF = grammar_for_schema(GENERIC.json_schema(TOOLS, required=True, parallel=False))


def _run(v: Verifier, prompt: list[int], propose: object = None, **kw: object) -> tuple[
        list[int], list, int, int]:
    toks: list[int] = []
    gaps: list = []
    last = None
    for ch in v.generate("g", prompt, GenerateParams(max_tokens=60, grammar=GBNF, **kw),
                         propose=propose):  # type: ignore[arg-type]
        toks += ch.tokens
        gaps += ch.gaps
        last = ch
    assert last is not None and last.stats is not None
    return toks, gaps, last.stats.drafted_tokens, last.stats.accepted_tokens


def _drafter(ref: list[int], prompt_len: int, junk: int):
    """Drafts the reference continuation with every fourth token replaced by ``junk``."""
    def propose(ctx: list[int], k: int) -> list[int]:
        d = list(ref[len(ctx) - prompt_len:][:k])
        return [junk if i % 4 == 3 else t for i, t in enumerate(d)]
    return propose


def test_a_bad_grammar_is_refused(verifier: Verifier) -> None:
    with pytest.raises(GrammarError):
        Grammar(verifier, 'root ::= "a" (')
    state = Grammar(verifier, 'root ::= "{" "}"').start()
    brace = verifier.tokenize("{")[0]
    assert state.allows(brace) and not state.allows(verifier.tokenize("hello")[0])
    with pytest.raises(GrammarError):
        state.accept(verifier.tokenize("hello")[0])


def test_mask_and_allows_agree(verifier: Verifier) -> None:
    state = Grammar(verifier, GBNF).start()
    rng = np.random.default_rng(0)
    row = rng.normal(size=verifier.vocab_size).astype(np.float32)
    masked = state.mask(row)
    allowed = np.flatnonzero(np.isfinite(masked))
    assert 0 < len(allowed) < verifier.vocab_size
    assert np.array_equal(masked[allowed], row[allowed])
    for t in [*allowed[:20], *rng.choice(verifier.vocab_size, 50)]:
        assert state.allows(int(t)) == bool(np.isfinite(masked[int(t)]))
    assert constrained_argmax(row, state) == int(allowed[np.argmax(row[allowed])])


def test_greedy_with_drafts_equals_constrained_plain_decoding(
        verifier: Verifier, prompt: list[int]) -> None:
    plain, plain_gaps, drafted, _ = _run(verifier, prompt, record_gaps=True)
    assert drafted == 0
    assert GENERIC.parse(verifier.detokenize(plain)).calls  # a valid call came out
    junk = verifier.tokenize("hello")[0]  # never allowed inside this JSON
    got, gaps, drafted, accepted = _run(verifier, prompt, _drafter(plain, len(prompt), junk),
                                        record_gaps=True)
    verdict, where = certify_greedy(plain_gaps, gaps)
    assert verdict in ("identical", "near_tie"), (verdict, where)
    if verdict == "identical":
        assert got == plain
    assert accepted > 0
    # the forbidden tokens were cut from the drafts before verification: every drafted
    # token the verifier saw was allowed, so at most 3 of each 4 were drafted
    assert drafted <= 3 * (len(got) // 4 + 3)


def _same_up_to_a_near_tied_race(verifier: Verifier, prompt: list[int], plain: list[int],
                                 got: list[int], temperature: float, seed: int,
                                 top_k: int = 0) -> None:
    """``got`` is ``plain`` token for token, or they part where the constrained race was
    a near-tie: plain decoding's one-token batches round the logits differently from a
    verification batch, which can only swap two tokens whose race scores are closer than
    the greedy near-tie gap allows (as tests/test_verifier_sampling.py certifies)."""
    if got == plain:
        return
    i = next((j for j, (x, y) in enumerate(zip(plain, got, strict=False)) if x != y),
             min(len(plain), len(got)))
    assert i < min(len(plain), len(got)), (plain, got)  # one stopped where the other went on
    state = Grammar(verifier, GBNF).start()
    for t in plain[:i]:
        state.accept(t)
    logits = state.mask(verifier.next_logits(prompt + plain[:i]))
    p = target_probs(logits, temperature, top_k, 1.0)
    u = SamplingNoise(seed, verifier.vocab_size).at(i)
    x, y = plain[i], got[i]
    assert p[x] > 0 and p[y] > 0
    gap = np.log(p[x] / p[y]) - np.log(np.log1p(-u[x]) / np.log1p(-u[y]))
    assert abs(gap) < NEAR_TIE_GAP / temperature, (i, gap, plain, got)


def test_sampled_with_drafts_is_token_for_token_the_same(
        verifier: Verifier, prompt: list[int]) -> None:
    for seed in (1, 2):
        plain, *_ = _run(verifier, prompt, temperature=0.9, seed=seed)
        got, _, _, accepted = _run(verifier, prompt, _drafter(plain, len(prompt), 0),
                                   temperature=0.9, seed=seed)
        _same_up_to_a_near_tied_race(verifier, prompt, plain, got, 0.9, seed)
        assert accepted > 0
    # the same with top-k (every row masked: the raw race winner says nothing)
    plain_k, *_ = _run(verifier, prompt, temperature=0.9, seed=3, top_k=5)
    got_k, *_ = _run(verifier, prompt, _drafter(plain_k, len(prompt), 0),
                     temperature=0.9, seed=3, top_k=5)
    _same_up_to_a_near_tied_race(verifier, prompt, plain_k, got_k, 0.9, 3, top_k=5)


def test_the_first_sampled_token_follows_the_constrained_distribution(
        verifier: Verifier) -> None:
    """A grammar of four words: the sampled first token's frequencies over 400 seeds
    match softmax over the tokens the grammar allows there (chi-square), and no other
    token ever comes out."""
    g = 'root ::= ("yes" | "no" | "maybe" | "never") "."'
    v = verifier
    prompt = v.tokenize("Q: Is the sky green? A:", add_bos=True)
    counts: Counter[int] = Counter()
    for seed in range(400):
        out: list[int] = []
        for ch in v.generate("dist", prompt, GenerateParams(
                max_tokens=1, grammar=g, temperature=1.0, seed=seed)):
            out += ch.tokens
        counts[out[0]] += 1
    p = target_probs(Grammar(v, g).start().mask(_last_row(v, prompt)), 1.0, 0, 1.0)
    support = {int(t) for t in np.flatnonzero(p > 0)}
    assert len(support) >= 2 and set(counts) <= support
    expected = {t: 400 * float(p[t]) for t in support}
    big = [t for t, e in expected.items() if e >= 5]
    chi2 = sum((counts[t] - expected[t]) ** 2 / expected[t] for t in big)
    assert chi2 < 29.6, (chi2, counts, expected)  # p = 0.001 up to 10 degrees of freedom


def _last_row(v: Verifier, prompt: list[int]) -> np.ndarray:
    """The logits after ``prompt``, from a plain evaluation in a slot of its own."""
    slot = v._acquire_slot("dist-row")
    try:
        v._llama_cpp.llama_memory_seq_rm(v._mem, slot.seq_id, -1, -1)
        slot.tokens.clear()
        v._decode(slot.seq_id, prompt, 0, all_logits=False)
        return v._logits(len(prompt) - 1)
    finally:
        v._release_slot(slot)
