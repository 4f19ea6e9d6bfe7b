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
"""

from __future__ import annotations

import re
import threading
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass


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
    ``LSTRIP``) a text may be cut before."""

    def __init__(self, tokenize: Callable[[bytes], Sequence[int]],
                 specials: Sequence[tuple[int, bytes]], cut_ids: set[int],
                 max_entries: int = 32, max_bytes: int = 16 << 20) -> None:
        self._tokenize = tokenize
        self._specials = TokenTexts([t for _, t in specials])
        self._cut_text = {i: t for i, t in specials if i in cut_ids and t}
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._entries: list[_Entry] = []  # most recent first
        self._lock = threading.Lock()
        self.reused_tokens = 0  # tokens taken from earlier texts instead of tokenized
        self.tokenized_bytes = 0

    @classmethod
    def of_vocabulary(cls, tokenize: Callable[[bytes], Sequence[int]],
                      specials: Sequence[tuple[int, bytes, str]]) -> PrefixTokenizer:
        """From ``Verifier.special_tokens()``: cuts before its control tokens."""
        return cls(tokenize, [(i, t) for i, t, _ in specials],
                   {i for i, _, kind in specials if kind == "control"})

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
        tail = self._tokenize(data[c:])
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
