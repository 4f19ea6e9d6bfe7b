"""The Generator gRPC service: streamed generation through the colocated verifier.

A thin front over daemon/generation/pipeline.py (the same path the OpenAI-compatible HTTP
endpoint uses): it converts a GenerateRequest into a GenerationRequest, maps the
verifier's chunks onto GenerateChunk messages and errors onto gRPC status codes.
GeneratorStatus reports the model's load phase (daemon/server/startup.py loads it in the
background once serving, unless ``--model-load first-use``), and the draft model's state
(``draft_model_status``: its policy's decisions, or why it does not draft yet).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
from suffixd.v1 import generate_pb2 as gpb
from suffixd.v1 import generate_pb2_grpc as gpb_grpc

from suffixcache.store import DiskFullError

from ..common.errors import EngineError, Unavailable
from ..generation.chat import ChatTemplateError
from ..generation.pipeline import Generation, GenerationRequest, Runtime
from ..generation.verifier import ContextOverflowError
from .registrar import ServiceRegistrar

log = logging.getLogger("suffixd.generate")

SERVICE_NAME = "suffixd.v1.Generator"


def _request(req: gpb.GenerateRequest) -> GenerationRequest:
    """The transport-neutral request of a GenerateRequest."""
    which = req.WhichOneof("prompt")
    out = GenerationRequest(
        namespace=req.namespace or "default",
        session_id=req.session_id,
        add_bos=not req.no_bos,
        max_tokens=req.max_tokens,
        temperature=float(req.temperature),
        top_p=float(req.top_p),
        top_k=int(req.top_k),
        seed=int(req.seed) if req.HasField("seed") else None,
        stop=list(req.stop),
        ignore_eos=req.ignore_eos,
        max_draft_tokens=req.max_draft_tokens,
    )
    if which == "text":
        out.text = req.text
    elif which == "tokens":
        out.tokens = list(req.tokens.ids)
    elif which == "messages":
        out.messages = [{"role": m.role, "content": m.content} for m in req.messages.messages]
    return out


# Why a loaded draft model does not draft, by the cost profile's source: its policy
# starts once its and the verifier's costs are measured (Runtime._use).
_NOT_DRAFTING = {
    "measuring": "waiting for the cost measurement (it drafts once its and the verifier's "
                 "costs are measured)",
    "failed": "the cost measurement failed: it does not draft until the daemon restarts",
    "conservative": "costs are never measured here (SUFFIXD_COST_ROUNDS=0): it does not draft",
}


def draft_model_status(rt: Runtime) -> str:
    """GeneratorStatus's ``draft_model``: JSON with the draft model's ``path`` and its
    policy's decisions, or ``not_drafting`` (why) while it has no policy yet; "" without
    a draft model."""
    if rt.draft_model is None:
        return ""
    path = {"path": str(rt.draft_model.path)}
    if rt.fallback is not None:
        return json.dumps({**path, **rt.fallback.stats()})
    why = _NOT_DRAFTING.get(rt.profile_source, "its costs are not measured yet")
    return json.dumps({**path, "not_drafting": why})


class GeneratorServicer(gpb_grpc.GeneratorServicer):
    def __init__(self, engine: Any, generation: Generation) -> None:
        self.engine = engine
        self.generation = generation

    # --------------------------------------------------------------------- RPC
    def GeneratorStatus(
        self, request: gpb.GeneratorStatusRequest, context: grpc.ServicerContext
    ) -> gpb.GeneratorStatusResponse:
        out = gpb.GeneratorStatusResponse(model=str(getattr(self.engine, "model_path", "") or ""))
        phase, since = self.generation.phase
        if phase:
            out.phase, out.phase_seconds = phase, time.monotonic() - since
        rt = self.generation.loaded  # not loaded on demand: asking must not cost a load
        if rt is not None:
            out.loaded = True
            out.cost_profile_source = rt.profile_source
            for k, cost in rt.cost_profile.items():
                out.cost_profile[int(k)] = cost
            for n, padded in rt.verifier.batch_padding.items():
                out.batch_padding[n] = padded
            out.draft_model = draft_model_status(rt)
            out.batching = json.dumps(rt.verifier.batch_stats())
            out.prompt_cache = json.dumps(rt.verifier.prompt_cache.as_dict())
            out.determinism = json.dumps(rt.verifier.determinism)
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
        except DiskFullError as exc:  # the session's appends could not be stored
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except Exception as exc:
            if isinstance(exc, grpc.RpcError) or type(exc).__name__ == "_AbortError":
                raise
            log.exception("internal error in Generate")
            context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")

    def _generate(
        self, req: gpb.GenerateRequest, context: grpc.ServicerContext
    ) -> Iterator[gpb.GenerateChunk]:
        # Set when the RPC ends early (the client went away). add_callback, unlike
        # is_active, exists on the contexts of both the sync and the asyncio server.
        ended = threading.Event()
        context.add_callback(ended.set)
        request = _request(req)
        request.params()  # a bad value is refused before the model loads
        try:
            rt = self.generation.runtime()
        except EngineError:
            raise  # a refusal of the request's own (e.g. --model none), mapped as such
        except Exception as exc:
            # The model did not load: the server's failure, not a bad argument (as the
            # HTTP front's 503).
            raise Unavailable(f"generation is unavailable: the model did not load ({exc})") \
                from exc
        for chunk in self.generation.run(request, ended):
            yield self._chunk(chunk, rt)

    @staticmethod
    def _chunk(chunk: Any, rt: Runtime) -> gpb.GenerateChunk:
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


def register(server: ServiceRegistrar, engine: Any) -> list[str]:
    """Add the Generator service to ``server`` (before it starts); returns its name."""
    # One Generation per daemon, shared with the HTTP front; server.run preloads it.
    if getattr(engine, "generator", None) is None:
        engine.generator = Generation(engine)
    gpb_grpc.add_GeneratorServicer_to_server(GeneratorServicer(engine, engine.generator), server)
    return [SERVICE_NAME]
