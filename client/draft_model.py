"""SuffixDraftModel: suffixd drafts for llama-cpp-python's own speculative decoding.

    from llama_cpp import Llama
    from suffixd.client import Client, SuffixDraftModel

    llm = Llama(model_path="target.gguf",
                draft_model=SuffixDraftModel(Client(), namespace="sql"))

llama-cpp-python calls the draft model with the whole token sequence so far
(prompt + generated) before each verification step. With a ``session_id`` the
new tokens of each call are appended to that session (kind "generated" once
generation started, "prompt" otherwise), so the session tree learns the
conversation and the daemon counts acceptance; without one, drafts come from
the namespace's global and corpus trees (plus the context itself).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from llama_cpp.llama_speculative import LlamaDraftModel

from .client import Client
from .errors import SuffixdError


class SuffixDraftModel(LlamaDraftModel):
    def __init__(
        self,
        client: Client,
        namespace: str = "default",
        session_id: str | None = None,
        max_tokens: int = 16,
        context_tokens: int = 256,
        open_session: bool = True,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.session_id = session_id
        self.max_tokens = max_tokens
        self.context_tokens = context_tokens
        self._seen: list[int] = []
        if session_id and open_session:
            try:
                client.open_session(namespace, session_id)
            except SuffixdError as exc:
                if exc.code.name != "ALREADY_EXISTS":
                    raise

    def _sync_session(self, ids: list[int]) -> None:
        n = len(self._seen)
        if ids[:n] == self._seen and len(ids) > n:
            new = ids[n:]
            kind = "generated" if n else "prompt"
        elif ids[:n] == self._seen:
            return
        else:
            # A new prompt that does not extend the previous one: the old response is over.
            new, kind = ids, "prompt"
        self.client.append(self.namespace, self.session_id or "", new, kind=kind)
        self._seen = list(ids)

    def __call__(self, input_ids: npt.NDArray[np.intc], /, **kwargs: Any) -> npt.NDArray[np.intc]:
        ids = [int(t) for t in input_ids]
        try:
            if self.session_id:
                self._sync_session(ids)
            draft = self.client.speculate(
                self.namespace, self.session_id, ids[-self.context_tokens:], self.max_tokens
            )
        except SuffixdError:
            # The daemon being away must not break generation: no draft means plain decoding.
            return np.array([], dtype=np.intc)
        return np.array(draft.path(), dtype=np.intc)
