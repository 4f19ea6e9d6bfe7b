"""A conversation's prompt tokens, each turn, without tokenizing its past again.

An agent's every request carries the whole conversation, so tokenizing it anew costs
more each turn (130 ms at 28,649 tokens on the Zen 3 VM), and ``cache_points`` tokenized
most of it a second time. ``PrefixTokenizer`` gives exactly what the tokenizer gives, but
reuses the tokens of a recent text the new one begins like, up to a *cut*: the start of a
control token (``<start_of_turn>``) that llama.cpp's special-token partition is sure to
match there. The partition tokenizes the raw text between special tokens piece by piece,
so at such a cut the tokens of the whole are the tokens of the two sides.

A control token's text at byte ``c`` is matched there when no special token's text in the
text straddles ``c`` or the control text's end (the partition tries longer texts first,
each left to right, and an occurrence that overlaps ours could take its place) and the
token does not strip whitespace on its left (``LSTRIP``: the text before the cut would
lose it). A text's j-th occurrence of such a control text is its tokens' j-th such id
only when the two counts agree; otherwise that token gives no cuts.

What is new is tokenized piece by piece too, and each piece the cheap way where that is
exact. llama.cpp's partition looks for each of the vocabulary's special texts in turn
(gemma-3: 6,414) through the whole text, so a text dense in their first byte costs
n x 6,414 comparisons (a message of 200,000 ``<`` took 19 s), and its list of fragments is
walked from its head at each split (a 5,000-message conversation took 2.6 s). The new part
is split around each control token that stands alone and strips no whitespace on either
side; a piece holding no control or unknown token's text tokenizes alike with special
tokens parsed or not, and not parsing them skips all but the user-defined texts (164).
"""

from __future__ import annotations

import re
import threading
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any


def _trie_pattern(texts: Iterable[bytes]) -> bytes:
    """A regex matching any of ``texts``, the longest where several begin at a place: one
    alternation per node of their trie, so that a place costs a few comparisons whatever
    the texts' number (an alternation of 6,250 texts tries each in turn)."""
    root: dict[int, Any] = {}
    for t in texts:
        node = root
        for c in t:
            node = node.setdefault(c, {})
        node[-1] = {}

    def node_pattern(node: dict[int, Any]) -> bytes:
        alts = [re.escape(bytes([c])) + node_pattern(child)
                for c, child in sorted(node.items()) if c >= 0]
        if not alts:
            return b""
        body = alts[0] if len(alts) == 1 else b"(?:" + b"|".join(alts) + b")"
        return b"(?:" + body + b")?" if -1 in node else body  # greedy: the longest first

    return node_pattern(root)


class LongestTexts:
    """Where a set of texts occurs in a text: at each place where some begin, the longest.
    What a control token's text standing alone needs (a longer text beginning at its
    place would straddle its end), at the cost of one regex pass over the text."""

    def __init__(self, texts: Iterable[bytes]) -> None:
        texts = [t for t in texts if t]
        self._rx = re.compile(b"(?=(" + _trie_pattern(texts) + b"))") if texts else None

    def find(self, data: bytes, start: int = 0) -> Iterator[tuple[int, bytes]]:
        """(place, text) of the longest text at each place from ``start`` on."""
        if self._rx is not None:
            for m in self._rx.finditer(data, start):
                yield m.start(), m.group(1)


class TokenTexts:
    """Where a vocabulary's special-token texts occur in a text (gemma-3 has 6,250
    control texts, most ``<unusedN>``): each is looked up, by its length, at the places
    where a text starts with one of their first bytes."""

    def __init__(self, texts: Sequence[bytes]) -> None:
        # by first byte, then by length: gemma-3's user-defined runs of spaces, tabs and
        # newlines start at most places of a text, and only their own lengths are tried
        groups: dict[int, dict[int, set[bytes]]] = {}
        for t in texts:
            if t:
                groups.setdefault(t[0], {}).setdefault(len(t), set()).add(t)
        self._by_first = {c: tuple(sorted((n, frozenset(ts)) for n, ts in by_len.items()))
                          for c, by_len in groups.items()}
        self.longest = max((len(t) for t in texts), default=0)
        self._first = re.compile(b"[" + b"".join(re.escape(bytes([c])) for c in sorted(groups))
                                 + b"]") if groups else None

    def occurs_in(self, data: bytes) -> bool:
        return next(self.spans(data), None) is not None

    def spans(self, data: bytes, start: int = 0, stop: int | None = None
              ) -> Iterator[tuple[int, int]]:
        """(begin, end) of every occurrence beginning in ``data[start:stop]``, overlapping
        ones included, by where they begin."""
        if self._first is None:
            return
        for m in self._first.finditer(data, max(start, 0), len(data) if stop is None else stop):
            i = m.start()
            for n, texts in self._by_first[data[i]]:
                if i + n > len(data):
                    break
                if data[i:i + n] in texts:
                    yield i, i + n


@dataclass(frozen=True)
class _Entry:
    text: bytes
    tokens: array[int]
    cuts: tuple[tuple[int, int, int], ...]  # (byte, token index, length of its text), by byte


class PrefixTokenizer:
    """``tokenize(data)`` (special tokens parsed, no BOS added), reusing recent results.

    ``specials``: (id, text) of every token the partition matches when parsing special
    tokens (control, user-defined, unknown); ``cut_ids``: the control tokens (none with
    ``LSTRIP``) a text may be cut before. With ``plain`` (tokenizing without parsing
    special tokens), what is new is split around the tokens of ``split_ids`` (control
    tokens stripping nothing, a subset of ``cut_ids``) and each piece without a text of
    ``parsed_ids`` (the control and unknown tokens) is tokenized by ``plain``."""

    def __init__(self, tokenize: Callable[[bytes], Sequence[int]],
                 specials: Sequence[tuple[int, bytes]], cut_ids: set[int],
                 max_entries: int = 32, max_bytes: int = 16 << 20, *,
                 plain: Callable[[bytes], Sequence[int]] | None = None,
                 parsed_ids: set[int] | None = None, split_ids: set[int] | None = None
                 ) -> None:
        self._tokenize = tokenize
        self._plain = plain
        self._specials = TokenTexts([t for _, t in specials])
        self._cut_text = {i: t for i, t in specials if i in cut_ids and t}
        parsed = cut_ids if parsed_ids is None else parsed_ids
        self.parsed_texts = LongestTexts(t for i, t in specials if i in parsed)
        split = cut_ids if split_ids is None else split_ids & cut_ids
        self._split_id = {t: i for i, t in specials if i in split and t}
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._entries: list[_Entry] = []  # most recent first
        self._lock = threading.Lock()
        self.reused_tokens = 0  # tokens taken from earlier texts instead of tokenized
        self.tokenized_bytes = 0

    @classmethod
    def of_vocabulary(cls, tokenize: Callable[[bytes], Sequence[int]],
                      specials: Sequence[tuple[int, bytes, str]],
                      plain: Callable[[bytes], Sequence[int]] | None = None
                      ) -> PrefixTokenizer:
        """From ``Verifier.special_tokens()``: cuts before its control tokens that keep the
        whitespace before them, pieces around those that keep it on both sides."""
        return cls(tokenize, [(i, t) for i, t, _ in specials],
                   {i for i, _, kind in specials if kind in ("control", "control-rstrip")},
                   plain=plain, parsed_ids={i for i, _, kind in specials if kind != "user"},
                   split_ids={i for i, _, kind in specials if kind == "control"})

    def tokenize(self, data: bytes) -> list[int]:
        with self._lock:
            entries = list(self._entries)
        base, cut = None, (0, 0, 0)
        for e in entries:
            if e.cuts and e.cuts[-1][0] > cut[0]:
                found = self._usable_cut(e, data, cut[0])
                if found is not None:
                    base, cut = e, found
        c, i, _ = cut
        tail = self._tokenize_new(data, c)
        tokens = array("i", base.tokens[:i]) if base is not None else array("i")
        tokens.extend(tail)
        # The earlier cuts hold in the new text too: a special text straddling one there
        # but not in the old text would reach past the cut taken, so straddle it.
        cuts = [k for k in base.cuts if k[0] < c] if base is not None else []
        cuts += self._find_cuts(data, tokens, c, i)
        self._remember(_Entry(data, tokens, tuple(cuts)), i, len(data) - c)
        return tokens.tolist()

    def _usable_cut(self, e: _Entry, data: bytes, beyond: int) -> tuple[int, int, int] | None:
        """The last cut of ``e`` past byte ``beyond`` where ``data`` begins like ``e``'s
        text up to the end of the cut's token and holds it as a cut too."""
        view = memoryview(e.text)
        cuts = e.cuts
        lo, hi = 0, len(cuts)  # cuts[:lo] are shared; cuts[hi:] are not
        while lo < hi:
            mid = (lo + hi) // 2
            c, _, n = cuts[mid]
            if data.startswith(view[:c + n]):
                lo = mid + 1
            else:
                hi = mid
        for k in range(lo - 1, -1, -1):
            c, i, n = cuts[k]
            if c <= beyond:
                return None
            if self.stands_alone(data, c, c + n):
                return cuts[k]
        return None

    def _tokenize_new(self, data: bytes, start: int) -> Sequence[int]:
        """``data[start:]``'s tokens (``start`` is 0 or a cut): piece by piece between
        the control tokens that stand alone and strip nothing, each piece that holds no
        control or unknown token's text without parsing special tokens."""
        if self._plain is None:
            return self._tokenize(data[start:])
        tokens = array("i")
        at, parsed = start, False  # the piece's start; whether it holds a parsed text
        for p, text in self.parsed_texts.find(data, start):
            if p < at:  # inside the last split token
                continue
            tid = self._split_id.get(text)
            if tid is not None and self.stands_alone(data, p, p + len(text)):
                tokens.extend(self._piece(data[at:p], parsed))
                tokens.append(tid)
                at, parsed = p + len(text), False
            else:
                parsed = True
        tokens.extend(self._piece(data[at:], parsed))
        return tokens

    def _piece(self, data: bytes, parsed: bool) -> Sequence[int]:
        if not data:
            return ()
        assert self._plain is not None
        return self._tokenize(data) if parsed else self._plain(data)

    def stands_alone(self, data: bytes, begin: int, end: int) -> bool:
        """Whether no special text in ``data`` straddles byte ``begin`` or ``end``: then
        the special text ``data[begin:end]`` is matched there by the partition."""
        for s, e in self._specials.spans(data, begin - self._specials.longest + 1, end):
            if s < begin < e or s < end < e:
                return False
        return True

    def _find_cuts(self, data: bytes, tokens: array[int], c0: int, i0: int
                   ) -> list[tuple[int, int, int]]:
        at: dict[int, list[int]] = {}
        cut_text = self._cut_text
        for i in range(i0, len(tokens)):
            t = tokens[i]
            if t in cut_text:
                at.setdefault(t, []).append(i)
        found = []
        for t, indices in at.items():
            text = cut_text[t]
            places = []
            p = data.find(text, c0)
            while p >= 0:
                places.append(p)
                p = data.find(text, p + len(text))
            if len(places) != len(indices):  # some occurrence is not that token: no cuts
                continue
            found += [(p, i, len(text)) for p, i in zip(places, indices, strict=True)
                      if self.stands_alone(data, p, p + len(text))]
        found.sort()
        return found

    def _remember(self, entry: _Entry, reused: int, tokenized: int) -> None:
        with self._lock:
            self.reused_tokens += reused
            self.tokenized_bytes += tokenized
            if not entry.cuts or len(entry.text) > self._max_bytes:
                return
            kept = [entry]
            size = len(entry.text)
            for e in self._entries:
                if e.text == entry.text:
                    continue
                size += len(e.text)
                if len(kept) >= self._max_entries or size > self._max_bytes:
                    break
                kept.append(e)
            self._entries = kept
