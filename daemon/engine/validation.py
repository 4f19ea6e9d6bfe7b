"""Request validation against the daemon's Limits and the model's vocabulary.

Interface (``Validator``, one per Engine, shared by every engine module):

* ``check_name(what, value)``: a namespace or session id (non-empty UTF-8, no NUL,
  at most ``limits.max_name_bytes``);
* ``check_tokens(tokens, what)`` -> list[int]: at most ``limits.max_tokens_per_call``,
  every id inside the vocabulary (when the daemon has one);
* ``check_kind(kind)``: one of ``KINDS``;
* ``check_metadata(metadata)`` -> dict: a session's metadata within its limits;
* ``check_max_tokens(n)``: a draft length within ``limits.max_draft_tokens``.

Each raises an ``errors.EngineError`` (InvalidArgument, ResourceExhausted) and changes
nothing: the callers validate everything before they write anything. No state but the
limits and the vocabulary size, both fixed at start-up; no locks.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..common.config import Limits
from ..common.errors import InvalidArgument, ResourceExhausted

KINDS = ("prompt", "tool", "response", "generated")


class Validator:
    def __init__(self, limits: Limits, vocab_size: int | None) -> None:
        self.limits = limits
        self.vocab_size = vocab_size

    def check_name(self, what: str, value: str, *, allow_empty: bool = False) -> None:
        if not isinstance(value, str):
            raise InvalidArgument(f"{what} must be a string")
        if not value and not allow_empty:
            raise InvalidArgument(f"{what} must not be empty")
        raw = value.encode("utf-8", errors="surrogatepass")
        if len(raw) > self.limits.max_name_bytes:
            raise InvalidArgument(f"{what} is longer than {self.limits.max_name_bytes} bytes")
        if "\x00" in value:
            raise InvalidArgument(f"{what} must not contain NUL characters")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(f"{what} is not valid UTF-8") from None

    def check_tokens(self, tokens: Sequence[int], what: str = "tokens") -> list[int]:
        toks = list(tokens)
        if len(toks) > self.limits.max_tokens_per_call:
            raise ResourceExhausted(
                f"{len(toks)} {what} in one call; the limit is {self.limits.max_tokens_per_call}"
            )
        hi = self.vocab_size if self.vocab_size is not None else 2**31
        if toks and min(toks) >= 0 and max(toks) < hi:  # the common case, at C speed
            return toks
        for t in toks:
            if not 0 <= t < hi:
                raise InvalidArgument(
                    f"token id {t} out of range [0, {hi})"
                    + (" (the model's vocabulary size)" if self.vocab_size is not None else "")
                )
        return toks

    @staticmethod
    def check_kind(kind: str) -> str:
        if kind not in KINDS:
            raise InvalidArgument(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
        return kind

    def check_metadata(self, metadata: dict[str, str] | None) -> dict[str, str]:
        md = dict(metadata or {})
        if len(md) > self.limits.max_metadata_entries:
            raise ResourceExhausted(
                f"{len(md)} metadata entries; the limit is {self.limits.max_metadata_entries}"
            )
        size = 0
        for k, v in md.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise InvalidArgument("metadata keys and values must be strings")
            try:
                size += len(k.encode("utf-8")) + len(v.encode("utf-8"))
            except UnicodeEncodeError:
                raise InvalidArgument("metadata is not valid UTF-8") from None
        if size > self.limits.max_metadata_bytes:
            raise ResourceExhausted(
                f"metadata is {size} bytes; the limit is {self.limits.max_metadata_bytes}"
            )
        return md

    def check_max_tokens(self, max_tokens: int | None) -> None:
        if max_tokens is not None and max_tokens < 0:
            raise InvalidArgument("max_tokens must be >= 0")
        if max_tokens is not None and max_tokens > self.limits.max_draft_tokens:
            raise ResourceExhausted(
                f"max_tokens {max_tokens} is above the limit {self.limits.max_draft_tokens}"
            )
