"""The GGUF model: where its file comes from (the embedded gemma-3 package, a path, a
packaged alternative), how llama.cpp loads it (``llama_defaults``), and its vocabulary
(``Tokenizer``) for the engine and the verifier.
"""

from .files import (
    DEFAULT_MODEL_NAME,
    PACKAGED_MODELS,
    default_cache_dir,
    embedded_model_path,
    extra_weight_buffers,
    flash_attention_sums_f32,
    flash_attention_wanted,
    llama_defaults,
    packaged_model_path,
    resolve_model_path,
    use_batch_invariant_kernels,
)
from .tokenizer import Tokenizer

__all__ = [
    "DEFAULT_MODEL_NAME",
    "PACKAGED_MODELS",
    "Tokenizer",
    "default_cache_dir",
    "embedded_model_path",
    "extra_weight_buffers",
    "flash_attention_sums_f32",
    "flash_attention_wanted",
    "llama_defaults",
    "packaged_model_path",
    "resolve_model_path",
    "use_batch_invariant_kernels",
]
