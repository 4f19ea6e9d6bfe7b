"""The daemon's process memory by part (``suffixd stats``' process memory, Prometheus'
``suffixd_process_memory_bytes``): daemon/common/process_memory.py measures RSS, the
model's mapping, the allocator and the stacks; this adds what the daemon knows it holds:
llama.cpp's buffers (daemon/model/llama_buffers.py), the prompt caches and the trees.
"""

from __future__ import annotations

import logging
from typing import Any

from ..common.process_memory import KnownParts, Sampler
from ..model.llama_buffers import BUFFERS

log = logging.getLogger("suffixd.memory")

# One per process: Stats, the metrics endpoint and the housekeeping share its last sample.
SAMPLER = Sampler(min_interval_s=1.0)


def known_parts(engine: Any) -> KnownParts:
    """What the engine and the loaded models hold (bytes)."""
    trees = 0
    try:
        trees = sum(int(m.get("bytes", 0)) for m in engine.memory())
    except Exception:  # an engine closing, or a test's stand-in without trees
        trees = 0
    prompt_cache = 0
    rt = getattr(getattr(engine, "generator", None), "loaded", None)
    if rt is not None:
        prompt_cache += int(rt.verifier.prompt_cache.nbytes)
        draft = getattr(rt, "draft_model", None)
        inner = getattr(draft, "_llm", None)  # the draft model's own verifier
        if inner is not None:
            prompt_cache += int(inner.prompt_cache.nbytes)
    allocated = BUFFERS.allocated()
    return KnownParts(llama_context=sum(allocated.values()),
                      llama_context_resident=BUFFERS.resident(),
                      prompt_cache=prompt_cache, trees=trees)


def process_memory(engine: Any) -> dict[str, Any]:
    """The breakdown (``process_memory.breakdown``) with llama.cpp's buffers by kind;
    measured at most once a second. {} when it fails: Stats and a scrape answer without
    it rather than not at all."""
    try:
        out = dict(SAMPLER.sample(lambda: known_parts(engine)))
    except Exception:
        log.exception("process memory: measuring failed")
        return {}
    out["llama_buffers"] = BUFFERS.allocated()
    trimmer = getattr(engine, "malloc_trimmer", None)  # daemon/server/malloc_tuning.py
    if trimmer is not None:
        out["malloc_trim"] = {"interval_s": trimmer.interval_s, "trims": trimmer.trims,
                              "seconds": round(trimmer.seconds, 3)}
    return out
