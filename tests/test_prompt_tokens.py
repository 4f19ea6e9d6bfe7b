"""``PrefixTokenizer`` gives exactly what tokenizing the whole text gives, while reusing
the tokens of texts it has seen: against a reference of llama.cpp's special-token
partition with adversarial special texts, and against the real gemma-3 tokenizer."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from suffixd.daemon.generation.prompt_tokens import LongestTexts, PrefixTokenizer, TokenTexts
from suffixd.daemon.generation.verifier import Verifier
from suffixd.daemon.model import embedded_model_path

T = TypeVar("T")


@settings(max_examples=300, deadline=None)
@given(texts=st.lists(st.binary(max_size=6), max_size=12),
       data=st.binary(max_size=40), plant=st.integers(min_value=-1, max_value=11))
def test_token_texts_finds_exactly_the_texts_that_occur(texts: list[bytes], data: bytes,
                                                        plant: int) -> None:
    """``occurs_in`` and ``spans`` against the plain reference: every occurrence of every
    text, overlapping ones too (with one of them planted in the data now and then)."""
    if 0 <= plant < len(texts):
        data = data[: len(data) // 2] + texts[plant] + data[len(data) // 2:]
    index = TokenTexts(texts)
    want = sorted({(i, i + len(t)) for t in texts if t
                   for i in range(len(data) - len(t) + 1) if data.startswith(t, i)})
    assert sorted(index.spans(data)) == want
    assert index.occurs_in(data) == bool(want)
    mid = len(data) // 2
    assert sorted(index.spans(data, 2, mid)) == [s for s in want if 2 <= s[0] < mid]


@settings(max_examples=300, deadline=None)
@given(texts=st.lists(st.binary(min_size=1, max_size=5).map(
           lambda b: bytes(b"ab<>"[x % 4] for x in b)), max_size=12),
       data=st.binary(max_size=40).map(lambda b: bytes(b"ab<>"[x % 4] for x in b)))
def test_longest_texts_finds_the_longest_text_at_every_place(texts: list[bytes],
                                                             data: bytes) -> None:
    """Against the plain reference, with texts that are prefixes of each other."""
    want = []
    for i in range(len(data)):
        here = [t for t in texts if data.startswith(t, i)]
        if here:
            want.append((i, max(here, key=len)))
    index = LongestTexts(texts)
    assert list(index.find(data)) == want
    assert list(index.find(data, 3)) == [w for w in want if w[0] >= 3]


def reference_tokenize(specials: Sequence[tuple[int, bytes]], data: bytes) -> list[int]:
    """llama.cpp's partition: special texts longest first, each found left to right in
    the raw fragments left by the ones before; then each raw fragment tokenized alone
    (here greedily in pairs of bytes, so that a fragment split elsewhere tokenizes
    differently)."""
    frags: list[int | bytes] = [data] if data else []
    for tid, text in sorted(specials, key=lambda s: -len(s[1])):
        out: list[int | bytes] = []
        for f in frags:
            if isinstance(f, int):
                out.append(f)
                continue
            at = 0
            while (p := f.find(text, at)) >= 0:
                if p > at:
                    out.append(f[at:p])
                out.append(tid)
                at = p + len(text)
            if at < len(f):
                out.append(f[at:])
        frags = out
    tokens: list[int] = []
    for f in frags:
        if isinstance(f, int):
            tokens.append(f)
        else:
            tokens += [10_000 + f[i] * 256 + f[i + 1] if i + 1 < len(f) else 1_000 + f[i]
                       for i in range(0, len(f), 2)]
    return tokens


_ALPHABET = b"ab<>/"


def successive_texts(steps: list[list[T]], ops: list[int]) -> Iterator[list[T]]:
    """A conversation's texts as lists of pieces: each step goes on (op 0), goes back to
    a text the last one begins with (1), or parts from it halfway (2)."""
    parts: list[T] = []
    for p, op in zip(steps, ops * len(steps), strict=False):
        if op == 0:
            parts = parts + p
        elif op == 1:
            parts = parts[: len(parts) * (len(p) % 13 + 1) // 13]
        else:
            parts = parts[: len(parts) // 2] + p
        yield parts


@settings(max_examples=400, deadline=None)
@given(texts=st.lists(st.binary(min_size=1, max_size=4).map(
           lambda b: bytes(_ALPHABET[x % len(_ALPHABET)] for x in b)),
           min_size=1, max_size=5, unique=True),
       cut_mask=st.integers(min_value=0, max_value=31),
       user_mask=st.integers(min_value=0, max_value=31),
       plain=st.booleans(),
       pieces=st.lists(st.lists(st.integers(min_value=0, max_value=9), max_size=12),
                       min_size=1, max_size=5),
       ops=st.lists(st.integers(min_value=0, max_value=2), min_size=1, max_size=5))
def test_same_tokens_as_the_whole_text_with_adversarial_specials(
        texts: list[bytes], cut_mask: int, user_mask: int, plain: bool,
        pieces: list[list[int]], ops: list[int]) -> None:
    """Special texts that overlap each other and the cut tokens ("a<", "<a", "a<a"),
    texts that extend, shorten and part from the ones before; with ``plain``, new text
    split into pieces and those without a control text tokenized with only the
    user-defined texts parsed: every result is the whole text's tokens."""
    specials = [(i, t) for i, t in enumerate(texts)]
    users = {i for i in range(len(texts)) if user_mask >> i & 1}
    cut_ids = {i for i in range(len(texts)) if cut_mask >> i & 1} - users
    words = [*texts, b"a", b"b", b"<", b">", b"ab"]

    def render(p: list[int]) -> bytes:
        return b"".join(words[i % len(words)] for i in p)

    user_specials = [s for s in specials if s[0] in users]
    tok = PrefixTokenizer(lambda b: reference_tokenize(specials, b), specials, cut_ids,
                          plain=(lambda b: reference_tokenize(user_specials, b)) if plain
                          else None,
                          parsed_ids={i for i, _ in specials} - users)
    # byte by byte, so that texts are cut anywhere
    for parts in successive_texts([[bytes([c]) for c in render(p)] for p in pieces], ops):
        data = b"".join(parts)
        assert tok.tokenize(data) == reference_tokenize(specials, data), data


def test_a_cut_is_reused_only_where_no_special_text_straddles_it() -> None:
    """``<`` + ``a`` is a cut; ``x<a`` is a longer special: where it occurs the partition
    takes it, so the tokens before ``<a`` cannot be reused there."""
    specials = [(1, b"<a"), (2, b"x<a")]
    tok = PrefixTokenizer(lambda b: reference_tokenize(specials, b), specials, {1})
    first = b"hello <a world <a again"
    assert tok.tokenize(first) == reference_tokenize(specials, first)
    assert tok.reused_tokens == 0
    second = first + b" and more"
    assert tok.tokenize(second) == reference_tokenize(specials, second)
    assert tok.reused_tokens > 0  # the last "<a" is a cut
    straddled = b"hello <a worldx<a again"
    assert tok.tokenize(straddled) == reference_tokenize(specials, straddled)


@pytest.fixture(scope="module")
def verifier() -> Verifier:
    v = Verifier(embedded_model_path(), n_ctx=256, n_threads=1, n_slots=1)
    yield v
    v.close()


@pytest.fixture(scope="module")
def gemma_specials(verifier: Verifier) -> list[tuple[int, bytes, str]]:
    return verifier.special_tokens()


# gemma-3's own: control (<start_of_turn>), user-defined (newline, space and tab runs,
# <table>, <start_of_image>), pieces of them, and text
_GEMMA_PIECES = ["<start_of_turn>", "<end_of_turn>", "user\n", "model\n", "\n", "\n\n",
                 "  ", "   ", "\t", "<table>", "<s>", "</s>", "<start_of_", "turn>",
                 "<unused3>", "<eos>", "<bos>", "<start_of_image>", "hello", " world", "é",
                 "日本", "<", ">", "_of_turn>", " ", "SELECT * FROM t;", "<start_of_turn"]


@settings(max_examples=150, deadline=None)
@given(pieces=st.lists(st.lists(st.sampled_from(_GEMMA_PIECES), max_size=14),
                       min_size=1, max_size=5),
       ops=st.lists(st.integers(min_value=0, max_value=2), min_size=1, max_size=5))
def test_same_tokens_as_the_real_tokenizer(verifier: Verifier,
                                           gemma_specials: list[tuple[int, bytes, str]],
                                           pieces: list[list[str]], ops: list[int]) -> None:
    tok = PrefixTokenizer.of_vocabulary(
        verifier.tokenize_bytes, gemma_specials,
        lambda data: verifier.tokenize_bytes(data, special=False))
    for parts in successive_texts(pieces, ops):
        data = "".join(parts).encode("utf-8")
        assert tok.tokenize(data) == verifier.tokenize_bytes(data), data


def test_a_message_dense_in_a_special_texts_first_byte_skips_the_special_partition(
        verifier: Verifier, gemma_specials: list[tuple[int, bytes, str]]) -> None:
    """llama.cpp looks for each of gemma-3's 6,414 special texts through the text when
    parsing them (a message of 200,000 "<" took 19 s): pieces between the standing
    control tokens that hold none of the control texts never go that way, and the tokens
    are the whole text's."""
    parsed_calls: list[bytes] = []

    def parsed(data: bytes) -> list[int]:
        parsed_calls.append(data)
        return verifier.tokenize_bytes(data)

    tok = PrefixTokenizer.of_vocabulary(
        parsed, gemma_specials, lambda data: verifier.tokenize_bytes(data, special=False))
    message = b"<" * 20_000 + b" <table> \n\n x<y " + b"<<end_of_tur" * 500
    data = (b"<start_of_turn>user\n" + message + b"<end_of_turn>\n<start_of_turn>model\n")
    assert tok.tokenize(data) == verifier.tokenize_bytes(data)
    # a control token spelled inside the message is split out like the template's
    spelled = data.replace(b" x<y ", b" x<unused3><y ")
    assert tok.tokenize(spelled) == verifier.tokenize_bytes(spelled)
    assert parsed_calls == []


def test_a_conversation_is_tokenized_once(verifier: Verifier) -> None:
    """Turn after turn of a chat, only what is new is tokenized, and what the renderer
    gives is the whole prompt tokenized (cache_points' prefixes too)."""
    from suffixd.daemon.generation.chat import ChatRenderer

    renderer = ChatRenderer(verifier)
    messages = [{"role": "system", "content": "You write SQL for the tables below.\n" * 20}]
    for turn in range(6):
        messages.append({"role": "user", "content": f"Question {turn}: " + "how many rows? " * 50})
        prompt = renderer.tokens(messages)
        expected = verifier.tokenize(renderer.render(messages), special=True)
        if renderer.add_bos and expected[:1] != [verifier.bos_token]:
            expected = [verifier.bos_token, *expected]
        assert prompt == expected
        assert renderer.cache_points(messages, None, prompt)
        messages.append({"role": "assistant", "content": f"SELECT count(*) FROM t{turn};"})
    prefix = renderer._vocab()[1]
    # each turn re-tokenized little more than its new message
    assert prefix.tokenized_bytes < 3 * sum(len(m["content"]) for m in messages)
