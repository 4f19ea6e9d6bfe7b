"""SuffixDraftModel: suffixd drafts for llama-cpp-python's own speculative decoding.

    from llama_cpp import Llama
    from suffixd.client import Client, SuffixDraftModel

    llm = Llama(model_path="target.gguf",
                draft_model=SuffixDraftModel(Client(), namespace="sql"))

llama-cpp-python calls the draft model with the whole token sequence so far
(prompt + generated) before each verification step. The new tokens of each call
are appended to a session (``session_id``; by default one of its own, named
``draft-model-<hex>``, opened on the first call), kind "generated" once
generation started, "prompt" otherwise: the session tree learns the conversation
and the daemon counts each step's acceptance, so the traffic shows in ``suffixd
stats`` and ``suffixd sessions``. ``session_id=False`` drafts from the
namespace's global and corpus trees only (nothing appended, nothing counted but
the calls).

``cost_profile`` describes the Llama that verifies the drafts (see
Client/requests.CostProfileLike); drafts are sized for it. None: the client's
(default "flat", a verifier whose cost barely grows with the draft: a GPU). On a
CPU build of llama.cpp, pass "cpu" or your measured points: long drafts cost a
CPU verifier several times a single token.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from llama_cpp.llama_speculative import LlamaDraftModel

from .client import Client
from .errors import SuffixdError
from .requests import CostProfileLike, resolve_cost_profile


class SuffixDraftModel(LlamaDraftModel):
    def __init__(
        self,
        client: Client,
        namespace: str = "default",
        session_id: str | Literal[False] | None = None,
        max_tokens: int = 16,
        context_tokens: int = 256,
        open_session: bool = True,
        cost_profile: CostProfileLike = None,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.session_id: str | None = (
            None if session_id is False else session_id or f"draft-model-{uuid.uuid4().hex[:12]}"
        )
        self.max_tokens = max_tokens
        self.context_tokens = context_tokens
        resolve_cost_profile(cost_profile)  # a bad profile fails here, not at each call
        self.cost_profile = cost_profile
        self._seen: list[int] = []
        self._opened = not open_session
        if self.session_id and session_id and open_session:
            self._open()

    def _open(self) -> None:
        assert self.session_id is not None
        try:
            self.client.open_session(self.namespace, self.session_id,
                                     metadata={"client": "SuffixDraftModel"})
        except SuffixdError as exc:
            if exc.code.name != "ALREADY_EXISTS":
                raise
        self._opened = True

    def _sync_session(self, ids: list[int]) -> None:
        assert self.session_id is not None
        if not self._opened:
            self._open()
        n = len(self._seen)
        if ids[:n] == self._seen and len(ids) > n:
            new = ids[n:]
            kind = "generated" if n else "prompt"
        elif ids[:n] == self._seen:
            return
        else:
            # A new prompt that does not extend the previous one: the old response is over.
            new, kind = ids, "prompt"
        self.client.append(self.namespace, self.session_id, new, kind=kind)
        self._seen = list(ids)

    def __call__(self, input_ids: npt.NDArray[np.intc], /, **kwargs: Any) -> npt.NDArray[np.intc]:
        ids = [int(t) for t in input_ids]
        try:
            if self.session_id:
                self._sync_session(ids)
            draft = self.client.speculate(
                self.namespace, self.session_id, ids[-self.context_tokens:], self.max_tokens,
                self.cost_profile,
            )
        except SuffixdError:
            # The daemon being away must not break generation: no draft means plain decoding.
            return np.array([], dtype=np.intc)
        return np.array(draft.path(), dtype=np.intc)

    def close(self) -> None:
        """Close the session (its responses stay in the namespace's global tree)."""
        if self.session_id and self._opened:
            with contextlib.suppress(SuffixdError):
                self.client.close_session(self.namespace, self.session_id)
            self._opened = False
