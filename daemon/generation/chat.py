"""Chat messages -> prompt tokens, with the model's own chat template.

The template comes from the GGUF (``tokenizer.chat_template``, rendered with
llama-cpp-python's Jinja2ChatFormatter, as Hugging Face would). GGUF files that
carry no template (the embedded gemma-3-270m is one) fall back to llama.cpp's
built-in template for the model's architecture (``llama_chat_apply_template``).
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Mapping, Sequence
from typing import Any

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


class ChatTemplateError(ValueError):
    pass


class ControlTexts:
    """Whether any of a vocabulary's control-token texts occurs in a text (gemma-3 has
    6,250 of them, most ``<unusedN>``): each is looked up, by its length, at the places
    where a text starts with one of their first bytes."""

    def __init__(self, texts: Sequence[bytes]) -> None:
        by_len: dict[int, set[bytes]] = {}
        for t in texts:
            if t:
                by_len.setdefault(len(t), set()).add(t)
        self._by_len = sorted((n, frozenset(ts)) for n, ts in by_len.items())
        firsts = sorted({t[0] for t in texts if t})
        self._first = re.compile(b"[" + b"".join(re.escape(bytes([c])) for c in firsts) + b"]"
                                 ) if firsts else None

    def occurs_in(self, data: bytes) -> bool:
        if self._first is None:
            return False
        for m in self._first.finditer(data):
            i = m.start()
            for n, texts in self._by_len:
                if i + n > len(data):
                    break
                if data[i:i + n] in texts:
                    return True
        return False


class ChatRenderer:
    """Render messages for one model; ``tokens()`` gives what the verifier should see."""

    def __init__(self, verifier: Any) -> None:
        self._v = verifier
        meta: Mapping[str, str] = verifier.metadata()
        self.template = meta.get("tokenizer.chat_template") or ""
        self.arch = meta.get("general.architecture", "")
        self.add_bos = meta.get("tokenizer.ggml.add_bos_token", "true").lower() == "true"
        self.bos_text = verifier.detokenize_special(verifier.bos_token)
        self._control: ControlTexts | None = None  # on the first content with a "<"
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

    def _spells_control_tokens(self, content: str) -> bool:
        # Tokenizing a message twice cost 35 ms a turn on a coding agent's 17k-character
        # conversation (its tool outputs are full of "<"). Without a control token's text
        # in it, a content tokenizes alike either way, so only those are tokenized.
        if self._control is None:
            self._control = ControlTexts(self._v.control_token_texts())
        if not self._control.occurs_in(content.encode("utf-8")):
            return False
        return bool(
            self._v.tokenize(content, special=True) != self._v.tokenize(content, special=False)
        )

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
            head = self._v.tokenize(full[:chars], special=True)
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
        toks += self._v.tokenize(text[pos:], special=True)
        if self.add_bos and (not toks or toks[0] != self._v.bos_token):
            toks = [self._v.bos_token, *toks]
        return toks
