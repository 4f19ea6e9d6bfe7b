"""The Generator gRPC service: streamed generation through the colocated verifier.

Per request: render/tokenize the prompt; append what the session has not seen
yet to its tree (durably, kind "prompt"); then run the verifier with drafts
from the engine's trees (falling back to the draft model when configured and
worth it); every verified step is counted with ``engine.record_step``. The
generated tokens reach the session tree at every step (kind "generated", their
commit queued) and the last ones are appended as "response", which waits until
everything is durable and puts the whole response into the namespace's global
tree.

The model is loaded on the first Generate call, or in the background once
serving (``suffixd serve --model-load startup``, the default; see
daemon/startup.py); GeneratorStatus reports the load's phase. The draft model comes from
``engine.draft_model_path`` or the ``SUFFIXD_DRAFT_MODEL`` environment variable.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
from suffixd.v1 import generate_pb2 as gpb
from suffixd.v1 import generate_pb2_grpc as gpb_grpc

from suffixcache import CostProfile

from .chat import ChatRenderer, ChatTemplateError
from .errors import EngineError, FailedPrecondition, NotFound
from .verifier import ContextOverflowError, GenerateParams, Verifier

log = logging.getLogger("suffixd.generate")

SERVICE_NAME = "suffixd.v1.Generator"
DEFAULT_MAX_TOKENS = 256
MAX_TOKENS_LIMIT = 8192
DEFAULT_DRAFT = 32


class _Runtime:
    """The loaded models and measured costs (created once, on first use)."""

    def __init__(self, engine: Any, phase: Any = lambda what: None) -> None:
        path = getattr(engine, "model_path", None)
        if path is None:
            raise FailedPrecondition(
                "the daemon runs without a model (--model none): no generation"
            )
        phase("loading model")
        self.verifier = Verifier(path, n_ctx=int(os.environ.get("SUFFIXD_N_CTX", "8192")))
        self.renderer = ChatRenderer(self.verifier)
        phase("measuring verifier costs")
        profile = self.verifier.measure_cost_profile()
        self.cost_profile = {str(k): v for k, v in profile.items()}
        log.info("verifier cost profile (relative to 1 token): %s", self.cost_profile)
        # The daemon's own drafter plans for its own verifier from now on: generation
        # drafts with it and its calibration learns from generation's verdicts (a
        # separate per-profile drafter would draft without ever learning).
        engine.drafter.set_cost_profile(CostProfile.from_json(self.cost_profile))
        self.fallback = None
        draft_path = getattr(engine, "draft_model_path", None) or os.environ.get(
            "SUFFIXD_DRAFT_MODEL"
        )
        if draft_path:
            from .draft_model import DraftModel, measure

            phase("loading draft model")
            self.draft_model = DraftModel(draft_path, self.verifier)
            self.fallback = measure(self.verifier, self.draft_model)
            log.info("draft model policy: %s", self.fallback.stats())


class GeneratorServicer(gpb_grpc.GeneratorServicer):
    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._runtime: _Runtime | None = None
        self._load_lock = threading.Lock()
        self.phase = ("", 0.0)  # (what the first load is doing, since when): GeneratorStatus
        # (ns, sid) -> the tokens this service last appended for the session (prompt +
        # response), so a follow-up prompt that repeats them appends only its new part
        self._seen: dict[tuple[str, str], list[int]] = {}
        self._seen_lock = threading.Lock()

    def runtime(self) -> _Runtime:
        with self._load_lock:
            if self._runtime is None:
                try:
                    self._runtime = _Runtime(self.engine, self._set_phase)
                except Exception as exc:
                    self._set_phase(f"failed: {exc}")
                    raise
                self._set_phase("")
            return self._runtime

    def _set_phase(self, what: str) -> None:
        self.phase = (what, time.monotonic())

    # ------------------------------------------------------------------ helpers
    def _params(self, req: gpb.GenerateRequest) -> GenerateParams:
        if req.max_tokens > MAX_TOKENS_LIMIT:
            raise ValueError(f"max_tokens above the limit of {MAX_TOKENS_LIMIT}")
        return GenerateParams(
            max_tokens=req.max_tokens or DEFAULT_MAX_TOKENS,
            temperature=float(req.temperature),
            top_p=float(req.top_p) or 1.0,
            top_k=int(req.top_k),
            seed=int(req.seed) if req.HasField("seed") else None,
            stop=list(req.stop),
            ignore_eos=req.ignore_eos,
            max_draft=min(req.max_draft_tokens or DEFAULT_DRAFT, 64),
        )

    def _prompt(self, rt: _Runtime, req: gpb.GenerateRequest) -> list[int]:
        which = req.WhichOneof("prompt")
        if which == "text":
            toks = rt.verifier.tokenize(req.text, add_bos=not req.no_bos)
        elif which == "tokens":
            toks = list(req.tokens.ids)
        elif which == "messages":
            msgs = [{"role": m.role, "content": m.content} for m in req.messages.messages]
            toks = rt.renderer.tokens(msgs)
        else:
            raise ValueError("no prompt: give text, tokens or messages")
        if not toks:
            raise ValueError("empty prompt")
        return toks

    def _new_prompt_part(self, key: tuple[str, str], prompt: list[int]) -> list[int]:
        with self._seen_lock:
            seen = self._seen.get(key)
        if seen and prompt[: len(seen)] == seen:
            return prompt[len(seen) :]
        return prompt

    # --------------------------------------------------------------------- RPC
    def GeneratorStatus(
        self, request: gpb.GeneratorStatusRequest, context: grpc.ServicerContext
    ) -> gpb.GeneratorStatusResponse:
        out = gpb.GeneratorStatusResponse(model=str(getattr(self.engine, "model_path", "") or ""))
        phase, since = self.phase
        if phase:
            out.phase, out.phase_seconds = phase, time.monotonic() - since
        rt = self._runtime  # not loaded on demand: asking must not cost a model load
        if rt is not None:
            out.loaded = True
            for k, cost in rt.cost_profile.items():
                out.cost_profile[int(k)] = cost
            for k, padded in rt.verifier.batch_padding.items():
                out.batch_padding[k] = padded
            if rt.fallback is not None:
                out.draft_model = json.dumps(rt.fallback.stats())
        return out

    def Generate(
        self, request: gpb.GenerateRequest, context: grpc.ServicerContext
    ) -> Iterator[gpb.GenerateChunk]:
        try:
            yield from self._generate(request, context)
        except (ValueError, ChatTemplateError, ContextOverflowError) as exc:
            if isinstance(exc, EngineError):
                context.abort(getattr(grpc.StatusCode, exc.code), str(exc))
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except EngineError as exc:
            context.abort(getattr(grpc.StatusCode, exc.code), str(exc))
        except Exception as exc:
            if isinstance(exc, grpc.RpcError) or type(exc).__name__ == "_AbortError":
                raise
            log.exception("internal error in Generate")
            context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")

    def _generate(
        self, req: gpb.GenerateRequest, context: grpc.ServicerContext
    ) -> Iterator[gpb.GenerateChunk]:
        engine = self.engine
        ns = req.namespace or "default"
        sid = req.session_id
        params = self._params(req)
        rt = self.runtime()
        prompt = self._prompt(rt, req)
        if any(not 0 <= t < rt.verifier.vocab_size for t in prompt):
            raise ValueError(f"token ids must be in [0, {rt.verifier.vocab_size})")
        if sid:
            try:
                engine.describe_session(ns, sid)
            except NotFound:
                engine.open_session(ns, sid)
            new = self._new_prompt_part((ns, sid), prompt)
            if new:
                engine.append(ns, sid, "prompt", new)
            vkey = f"{ns}\x00{sid}"
        else:
            vkey = f"\x00oneoff-{uuid.uuid4().hex}"

        fallback = rt.fallback
        sess = engine.stream_session(ns, sid) if sid else None
        fed = [len(prompt)]  # context tokens the session already holds

        def propose(ctx: list[int], k: int) -> Any:
            if sess is not None and len(ctx) > fed[0]:
                # The session tree follows the response step by step, so a response that
                # repeats itself is drafted from its own beginning. Each step's tokens
                # go to the trees now and their commit is queued; the final "response"
                # append waits for all of them (the store commits in order).
                engine.step(sess, "generated", ctx[fed[0] :], draft=False, defer_commit=True)
                fed[0] = len(ctx)
            # A one-off request (no session) still drafts from its namespace's global
            # and corpus trees.
            draft = engine.propose(ns, sid or None, ctx, max_tokens=k, remember=False)
            if (draft is None or not len(draft.tokens)) and fallback is not None:
                model_draft = fallback(ctx, k)
                if model_draft is not None:
                    return model_draft
            return draft

        def on_step(draft: Any, accepted: int, new: list[int]) -> None:
            path = draft.path()
            if getattr(draft, "source", "") == "draft_model" and fallback is not None:
                fallback.observe(draft, accepted)
            engine.record_step(
                ns,
                sid or None,
                draft.source if path else "none",
                len(path),
                accepted,
                draft=draft,
                accepted_tokens=new,
            )

        generated: list[int] = []
        # Set when the RPC ends early (the client went away). add_callback, unlike
        # is_active, exists on the contexts of both the sync and the asyncio server.
        ended = threading.Event()
        context.add_callback(ended.set)
        try:
            for chunk in rt.verifier.generate(vkey, prompt, params, propose, on_step):
                if ended.is_set():
                    break
                generated += chunk.tokens
                if chunk.finish_reason is not None and sid:
                    # The rest of the response (possibly empty) ends it, durably, and puts
                    # the whole response into the namespace's global tree.
                    engine.append(ns, sid, "response", generated[fed[0] - len(prompt) :])
                    with self._seen_lock:
                        self._seen[(ns, sid)] = prompt + generated
                yield self._chunk(chunk, rt)
                hook = getattr(engine, "on_generate", None)  # metrics (daemon/metrics.py)
                if hook is not None and chunk.stats is not None:
                    hook(ns, chunk.stats)
        finally:
            if not sid:
                rt.verifier.forget(vkey)

    @staticmethod
    def _chunk(chunk: Any, rt: _Runtime) -> gpb.GenerateChunk:
        out = gpb.GenerateChunk(
            text=chunk.text,
            token_ids=chunk.tokens,
            source=chunk.source,
            proposed=chunk.proposed,
            accepted=chunk.accepted,
            finish_reason=chunk.finish_reason or "",
        )
        st = chunk.stats
        if st is not None:
            t = out.totals
            t.prompt_tokens = st.prompt_tokens
            t.cached_prompt_tokens = st.cached_prompt_tokens
            t.completion_tokens = st.completion_tokens
            t.steps = st.steps
            t.drafted_tokens = st.drafted_tokens
            t.accepted_tokens = st.accepted_tokens
            t.prompt_seconds = st.prompt_s
            t.first_token_seconds = st.first_token_s
            t.decode_seconds = st.decode_s
            t.total_seconds = st.total_s
            for src, (drafted, accepted) in st.by_source.items():
                t.by_source[src].proposed = drafted
                t.by_source[src].accepted = accepted
            if rt.fallback is not None:
                t.draft_model = json.dumps(rt.fallback.stats())
        return out


def register(server: grpc.Server, engine: Any) -> list[str]:
    """Add the Generator service to ``server`` (before it starts); returns its name."""
    engine.generator = GeneratorServicer(engine)  # server.run preloads it (runtime())
    gpb_grpc.add_GeneratorServicer_to_server(engine.generator, server)
    return [SERVICE_NAME]
