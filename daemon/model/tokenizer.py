"""A GGUF model's vocabulary as the engine uses it: token ids for text and back, and a
fingerprint the store keeps so that a data directory is never read with another vocabulary.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path


class Tokenizer:
    """The vocabulary of a GGUF model, loaded vocab-only through llama-cpp-python.

    ``tokenize`` never adds BOS and never parses special tokens, as the replay
    protocol requires; text coming from users is data, not control tokens.
    """

    def __init__(self, model_path: str | Path) -> None:
        import llama_cpp
        from llama_cpp import _internals

        from .llama_log import route_llama_logs

        route_llama_logs()
        llama_cpp.llama_backend_init()
        self.model_path = Path(model_path)
        # The model alone, vocabulary only: llama_cpp.Llama would add a context too, which
        # on a vocab-only model (trained length 0) warns of a context overflow at every start.
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self._model = _internals.LlamaModel(
            path_model=str(self.model_path), params=params, verbose=False
        )

    @property
    def vocab_size(self) -> int:
        return int(self._model.n_vocab())

    def tokenize(self, text: str) -> list[int]:
        if not text:
            return []
        import llama_cpp

        # Not LlamaModel.tokenize: it sizes its buffer by n_ctx_train, which is 0 for a
        # vocab-only model, so every call tokenized twice (first to learn the size).
        # A text never has more tokens than UTF-8 bytes (byte fallback is the worst case).
        data = text.encode("utf-8")
        cap = len(data) + 1
        buf = (llama_cpp.llama_token * cap)()
        vocab = self._model.vocab
        n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, cap, False, False)
        if n < 0:  # cannot happen by the bound above; fall back rather than truncate
            return list(self._model.tokenize(data, add_bos=False, special=False))
        return buf[:n]

    def detokenize(self, tokens: Sequence[int]) -> str:
        """Linear in the number of tokens (llama-cpp-python's own detokenize appends
        bytes one piece at a time: quadratic, 38 s for a million ids), with each token's
        piece looked up once and kept."""
        pieces = self._pieces
        out = b"".join(p if (p := pieces[t]) is not None else self._piece(t) for t in tokens)
        # As llama-cpp-python: the space a BOS-started text gains is not part of it.
        if tokens and tokens[0] == self._bos and out[:1] == b" ":
            out = out[1:]
        return out.decode("utf-8", errors="replace")

    @cached_property
    def _pieces(self) -> list[bytes | None]:
        return [None] * self.vocab_size

    @cached_property
    def _bos(self) -> int:
        return int(self._model.token_bos())

    def _piece(self, token: int) -> bytes:
        import ctypes

        import llama_cpp

        vocab = self._model.vocab
        size = 64
        while True:
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_token_to_piece(vocab, token, buf, size, 0, False)
            if n >= 0:
                break
            size = -n
        piece = buf.raw[:n]
        self._pieces[token] = piece
        return piece

    @cached_property
    def fingerprint(self) -> str:
        """A hash of the vocabulary: every token's bytes, in id order.

        Two GGUF files with the same vocabulary (a target and its draft model,
        or the same model quantised differently) share a fingerprint.
        """
        import llama_cpp

        # Each token's text as the C string llama.cpp holds (what token_get_text decodes),
        # joined in one call: a start-up cost (0.1 s of 262k gemma tokens, half the loop's).
        text_of = llama_cpp.llama_vocab_get_text
        vocab = self._model.vocab
        n = self.vocab_size
        h = hashlib.sha256()
        h.update(str(n).encode())
        h.update(b"\x00".join([text_of(vocab, i) for i in range(n)]))
        h.update(b"\x00")
        return h.hexdigest()[:32]
