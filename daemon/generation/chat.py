"""Chat messages -> prompt tokens, with the model's own chat template.

The template comes from the GGUF (``tokenizer.chat_template``, rendered with
llama-cpp-python's Jinja2ChatFormatter, as Hugging Face would). GGUF files that
carry no template (the embedded gemma-3-270m is one) fall back to llama.cpp's
built-in template for the model's architecture (``llama_chat_apply_template``).
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from .prompt_tokens import LongestTexts, PrefixTokenizer

# GGUF architecture -> llama.cpp built-in template name, for models without a template.
_BUILTIN_BY_ARCH = {
    "gemma": "gemma",
    "gemma2": "gemma",
    "gemma3": "gemma",
    "gemma3n": "gemma",
    "llama": "llama3",
    "qwen2": "chatml",
    "qwen3": "chatml",
    "phi3": "phi3",
    "mistral": "mistral-v7",
}

VALID_ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})
_TOOL_KEYS = ("tool_calls", "tool_call_id", "name")
# A message content no real one starts with: where a rendering with it parts from the
# real prompt is where the real message's content begins (cache_points).
_SENTINEL = "\u2063\u2063"
_SPELLED_KEPT = 4096  # message contents whose control-token check is remembered


class ChatTemplateError(ValueError):
    pass


class ChatRenderer:
    """Render messages for one model; ``tokens()`` gives what the verifier should see."""

    def __init__(self, verifier: Any) -> None:
        self._v = verifier
        meta: Mapping[str, str] = verifier.metadata()
        self.template = meta.get("tokenizer.chat_template") or ""
        self.arch = meta.get("general.architecture", "")
        self.add_bos = meta.get("tokenizer.ggml.add_bos_token", "true").lower() == "true"
        self.bos_text = verifier.detokenize_special(verifier.bos_token)
        # built by prepare() when the model loads, from one walk over the vocabulary
        self._control: LongestTexts | None = None
        self._prefix: PrefixTokenizer | None = None
        self._vocab_lock = threading.Lock()
        self._spelled: OrderedDict[bytes, bool] = OrderedDict()  # recent contents' answers
        self._formatter = None
        if self.template:
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            eos_text = verifier.detokenize_special(verifier.eos_token)
            self._formatter = Jinja2ChatFormatter(
                template=self.template, eos_token=eos_text, bos_token=self.bos_text
            )
            self.builtin = ""
        else:
            self.builtin = _BUILTIN_BY_ARCH.get(self.arch, "chatml")

    @staticmethod
    def _check(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        if not messages:
            raise ChatTemplateError("no messages")
        out = []
        for i, m in enumerate(messages):
            role, content = m.get("role"), m.get("content")
            if role not in VALID_ROLES:
                raise ChatTemplateError(f"message {i}: unknown role {role!r}")
            if not isinstance(content, str):
                raise ChatTemplateError(f"message {i}: content must be a string")
            msg: dict[str, Any] = {"role": role, "content": content}
            # what a Jinja template with tool support reads of tool-calling turns
            msg.update({k: m[k] for k in _TOOL_KEYS if m.get(k)})
            out.append(msg)
        return out

    def render(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        msgs = self._check(messages)
        if self._formatter is not None:
            self._formatter.add_generation_prompt = add_generation_prompt
            # llama_cpp types messages and tools as its OpenAI TypedDicts; ours are
            # plain mappings, checked by _check and by the template itself
            return self._formatter(
                messages=msgs, tools=list(tools) if tools else None,  # type: ignore[arg-type]
            ).prompt
        import llama_cpp

        arr = (llama_cpp.llama_chat_message * len(msgs))()
        keep = []  # the C structs borrow these buffers
        for i, m in enumerate(msgs):
            r, c = m["role"].encode(), m["content"].encode("utf-8")
            keep += [r, c]
            arr[i].role = r
            arr[i].content = c
        size = 2 * sum(len(m["content"]) + 32 for m in msgs) + 256
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_chat_apply_template(
                self.builtin.encode(), arr, len(msgs), add_generation_prompt, buf, size
            )
            if n < 0:
                raise ChatTemplateError(f"llama.cpp has no chat template {self.builtin!r}")
            if n <= size:
                return buf.raw[:n].decode("utf-8")
            size = n + 1
        raise ChatTemplateError("chat template output did not fit")  # pragma: no cover

    def prepare(self) -> None:
        """Read the vocabulary's special tokens now (0.45 s for gemma-3's 262k tokens on
        the Zen 3), not in the first chat request."""
        self._vocab()

    def _vocab(self) -> tuple[LongestTexts, PrefixTokenizer]:
        with self._vocab_lock:
            if self._control is None or self._prefix is None:
                specials = self._v.special_tokens()
                self._prefix = PrefixTokenizer.of_vocabulary(
                    self._v.tokenize_bytes, specials,
                    lambda data: self._v.tokenize_bytes(data, special=False))
                self._control = self._prefix.parsed_texts  # the control and unknown texts
            return self._control, self._prefix

    def _tokenize(self, text: str) -> list[int]:
        """``text`` tokenized with special tokens parsed, its beginning's tokens reused
        from a recent prompt that began alike (each turn repeats the conversation)."""
        return self._vocab()[1].tokenize(text.encode("utf-8"))

    def _spells_control_tokens(self, content: str) -> bool:
        # Each turn repeats the conversation's messages: their answers are kept.
        data = content.encode("utf-8")
        key = hashlib.blake2b(data, digest_size=16).digest()
        with self._vocab_lock:
            known = self._spelled.get(key)
            if known is not None:
                self._spelled.move_to_end(key)
                return known
        spells = self._spells(content, data)
        with self._vocab_lock:
            self._spelled[key] = spells
            while len(self._spelled) > _SPELLED_KEPT:
                self._spelled.popitem(last=False)
        return spells

    def _spells(self, content: str, data: bytes) -> bool:
        # Tokenizing every message with a "<" twice cost 35 ms a turn on a coding agent's
        # conversation. Without a control token's text in it, a content tokenizes alike
        # either way; and a control text no other special text overlaps is a control token
        # when special tokens are parsed and never otherwise, so the two differ. Both are
        # made only where every one found is overlapped.
        control, prefix = self._vocab()
        overlapped = False
        # one standing alone is the longest control text at its place (a longer one
        # there would straddle its end)
        for begin, text in control.find(data):
            if prefix.stands_alone(data, begin, begin + len(text)):
                return True
            overlapped = True
        return overlapped and bool(
            self._v.tokenize(content, special=True) != self._v.tokenize(content, special=False))

    def cache_points(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None,
        tokens: Sequence[int],
    ) -> list[int]:
        """Prompt positions (token counts of ``tokens``, this chat's prompt) that other
        prompts are likely to start with: the end of the leading system/developer messages
        (an agent's next conversation repeats them, and the tools) and the end of all but
        the last message (a retry, or a branch of the conversation).

        Each is found without assuming how the template lays messages out: the messages
        before the cut plus a sentinel user message are rendered, the text they share with
        the whole prompt is tokenized, and the tokens it shares with the prompt, less the
        last (a token at the cut may merge with what follows in another prompt), count."""
        msgs = self._check(messages)
        lead = 0
        while lead < len(msgs) and msgs[lead]["role"] in ("system", "developer"):
            lead += 1
        full = self.render(msgs, True, tools)
        out = set()
        for cut in {lead, len(msgs) - 1} - {0}:
            try:
                probe = self.render([*msgs[:cut], {"role": "user", "content": _SENTINEL}],
                                    False, tools)
            except Exception:  # a template that refuses the probe (roles must alternate)
                continue
            chars = 0
            for a, b in zip(probe, full, strict=False):
                if a != b:
                    break
                chars += 1
            head = self._tokenize(full[:chars])
            if self.add_bos and (not head or head[0] != self._v.bos_token):
                head = [self._v.bos_token, *head]
            n = 0
            for ta, tb in zip(head, tokens, strict=False):
                if ta != tb:
                    break
                n += 1
            if n > 1:
                out.add(n - 1)
        return sorted(out)

    def tokens(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        text = self.render(messages, add_generation_prompt, tools)
        # Control tokens written by the template are meant (<start_of_turn>, ...); the
        # same text inside a message is data: a user must not be able to close its turn
        # and open the model's. Such contents are tokenized on their own, as plain text.
        # Other messages keep the whole-text tokenization (no new token boundaries).
        toks: list[int] = []
        pos = 0
        for m in self._check(messages):
            content = m["content"]
            if "<" not in content or not self._spells_control_tokens(content):
                continue
            at = text.find(content, pos)
            if at < 0:
                content = content.strip()
                at = text.find(content, pos)
            if at < 0:
                raise ChatTemplateError(
                    "a message spells control tokens and the chat template rewrote it: "
                    "cannot keep them out of the prompt's control tokens"
                )
            toks += self._v.tokenize(text[pos:at], special=True)
            toks += self._v.tokenize(content, special=False)
            pos = at + len(content)
        if pos:
            toks += self._v.tokenize(text[pos:], special=True)
        else:  # the common case, no message spells one: the whole text, its past reused
            toks = self._tokenize(text)
        if self.add_bos and (not toks or toks[0] != self._v.bos_token):
            toks = [self._v.bos_token, *toks]
        return toks
