"""Synthetic-weights GGUF models of a real model's shape, for timing llama.cpp where the
weights cannot travel (issue 48's device kit): a decode costs what its tensors' shapes and
types make it cost, whatever their values.

    python bench/device/synthetic_gguf.py skeleton MODEL.gguf -o SKELETON.gguf
    python bench/device/synthetic_gguf.py write SKELETON.gguf listed=OUT.gguf \
        gemma-3-27b=OUT27B.gguf ...

``skeleton`` keeps a model's metadata (its tokenizer with it) and the list of its tensors
(name, shape, type) without their data: ~6 MB for gemma-3's 262,144-token vocabulary
where the embedded model is 253 MB. ``write`` makes models of that metadata, one per
NAME=PATH: ``listed``, the skeleton's own tensors; a shape of ``SHAPES``, a model of the same
architecture and vocabulary of that size under llama.cpp's Q4_K_M recipe (which gives the
embedded gemma-3-270m file's 236 tensors their very types). The tensors are random
quantized blocks whose scales are small finite numbers. The skeleton is read once for all
(reading 262,144 token strings takes seconds).

gemma-3-27b is the 30B-class shape here (rather than Qwen2.5-32B's) because its family's
smallest model is the embedded gemma-3-270m: the same vocabulary, so the measured pair is a
real same-family draft and verifier.

Needs numpy and llama.cpp's gguf-py (``--gguf-py DIR``, default the kit's copy).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KIT_GGUF_PY = Path(__file__).resolve().parents[2] / "build/device-kit/llama.cpp/gguf-py"
TENSORS_KEY = "suffixd.skeleton.tensors"


def import_gguf(path: Path) -> Any:
    # gguf-py imports yaml for model cards only; the device has numpy and nothing else.
    if importlib.util.find_spec("yaml") is None:
        sys.modules["yaml"] = types.ModuleType("yaml")
    sys.path.insert(0, str(path))
    return importlib.import_module("gguf")


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]  # GGUF order: the row length first
    type: str  # a GGMLQuantizationType name


@dataclass(frozen=True)
class Shape:
    """A model's hyperparameters, as the ``{arch}.*`` keys name them."""

    block_count: int
    embedding_length: int
    feed_forward_length: int
    head_count: int
    head_count_kv: int
    key_length: int
    sliding_window: int
    context_length: int

    def keys(self, arch: str) -> dict[str, int]:
        return {
            f"{arch}.block_count": self.block_count,
            f"{arch}.embedding_length": self.embedding_length,
            f"{arch}.feed_forward_length": self.feed_forward_length,
            f"{arch}.attention.head_count": self.head_count,
            f"{arch}.attention.head_count_kv": self.head_count_kv,
            f"{arch}.attention.key_length": self.key_length,
            f"{arch}.attention.value_length": self.key_length,
            f"{arch}.attention.sliding_window": self.sliding_window,
            f"{arch}.context_length": self.context_length,
        }


# From the models' config.json files (google/gemma-3-27b-it, -12b-it, -4b-it, -1b-it).
SHAPES = {
    "gemma-3-27b": Shape(62, 5376, 21504, 32, 16, 128, 1024, 131072),
    "gemma-3-12b": Shape(48, 3840, 15360, 16, 8, 256, 1024, 131072),
    "gemma-3-4b": Shape(34, 2560, 10240, 8, 4, 256, 1024, 131072),
    "gemma-3-1b": Shape(26, 1152, 6912, 4, 1, 256, 512, 32768),
    "gemma-3-270m": Shape(18, 640, 2048, 4, 1, 256, 512, 32768),
}


def uses_more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's Q4_K_M gives these layers' attn_v and ffn_down Q6_K (llama-quant.cpp)."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


# A k-quant needs rows of a multiple of 256; llama-quantize falls back to these otherwise.
K_QUANT_FALLBACK = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}


def quant_type(kind: str, row: int) -> str:
    return kind if row % 256 == 0 else K_QUANT_FALLBACK.get(kind, kind)


def gemma3_tensors(shape: Shape, vocab: int) -> list[Tensor]:
    """gemma-3's tensors under Q4_K_M: Q4_K, Q6_K for the tied embedding/output head and
    for attn_v and ffn_down in the layers ``uses_more_bits`` names, F32 norms; rows too
    short for a k-quant take llama-quantize's fallback (gemma-3-270m's file, to the type)."""
    embd, ff, hd = shape.embedding_length, shape.feed_forward_length, shape.key_length
    q, kv = shape.head_count * hd, shape.head_count_kv * hd
    out = [Tensor("token_embd.weight", (embd, vocab), "Q6_K"),
           Tensor("output_norm.weight", (embd,), "F32")]
    for i in range(shape.block_count):
        more = "Q6_K" if uses_more_bits(i, shape.block_count) else "Q4_K"
        b = f"blk.{i}."
        out += [
            Tensor(b + "attn_norm.weight", (embd,), "F32"),
            Tensor(b + "attn_q.weight", (embd, q), "Q4_K"),
            Tensor(b + "attn_k.weight", (embd, kv), "Q4_K"),
            Tensor(b + "attn_v.weight", (embd, kv), more),
            Tensor(b + "attn_output.weight", (q, embd), "Q4_K"),
            Tensor(b + "attn_q_norm.weight", (hd,), "F32"),
            Tensor(b + "attn_k_norm.weight", (hd,), "F32"),
            Tensor(b + "post_attention_norm.weight", (embd,), "F32"),
            Tensor(b + "ffn_norm.weight", (embd,), "F32"),
            Tensor(b + "ffn_gate.weight", (embd, ff), "Q4_K"),
            Tensor(b + "ffn_up.weight", (embd, ff), "Q4_K"),
            Tensor(b + "ffn_down.weight", (ff, embd), more),
            Tensor(b + "post_ffw_norm.weight", (embd,), "F32"),
        ]
    return [Tensor(t.name, t.shape, quant_type(t.type, t.shape[0])) for t in out]


# Byte offsets of each block's f16 scales: random bytes there could be inf or NaN.
F16_SCALES = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
              "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q2_K": (80, 82), "Q3_K": (108,)}


def layout(gguf: Any, t: Tensor) -> tuple[tuple[int, ...], Any, Any]:
    """The array's shape and dtype that ``add_tensor_info`` takes, and the GGML type."""
    import numpy as np

    rows = int(np.prod(t.shape[1:]))
    if t.type in ("F32", "F16"):
        dtype = np.dtype(np.float32 if t.type == "F32" else np.float16)
        return tuple(reversed(t.shape)), dtype, None
    if t.type not in F16_SCALES:
        raise SystemExit(f"synthetic_gguf: no block layout for {t.type} ({t.name})")
    kind = gguf.GGMLQuantizationType[t.type]
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[kind]
    return (rows, t.shape[0] // block_elems * block_bytes), np.dtype(np.uint8), kind


def tensor_data(gguf: Any, t: Tensor, rng: Any) -> Any:
    import numpy as np

    shape, dtype, kind = layout(gguf, t)
    if kind is None:
        # Norm weights of one keep every layer's activations finite.
        return np.ones(shape, dtype=dtype)
    block_bytes = gguf.GGML_QUANT_SIZES[kind][1]
    blocks = shape[0] * shape[1] // block_bytes
    pool = rng.integers(0, 256, size=(min(blocks, 4096), block_bytes), dtype=np.uint8)
    scale = np.frombuffer(np.float16(1 / 1024).tobytes(), dtype=np.uint8)
    for offset in F16_SCALES[t.type]:
        pool[:, offset:offset + 2] = scale
    return np.resize(pool, (blocks, block_bytes)).reshape(shape)


def copy_fields(gguf: Any, reader: Any, writer: Any, skip: set[str]) -> None:
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in skip:
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub)


def skeleton(gguf: Any, model: Path, out: Path) -> None:
    reader = gguf.GGUFReader(str(model))
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(out), arch)
    copy_fields(gguf, reader, writer, {"general.architecture"})
    listed = [{"name": t.name, "shape": [int(d) for d in t.shape], "type": t.tensor_type.name}
              for t in reader.tensors]
    writer.add_string(TENSORS_KEY, json.dumps(listed))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    print(f"synthetic_gguf: {out} ({out.stat().st_size / 2**20:.1f} MiB, {len(listed)} tensors)",
          file=sys.stderr)


def write(gguf: Any, skeleton_path: Path, outputs: list[tuple[str, Path]], seed: int) -> None:
    import numpy as np

    reader = gguf.GGUFReader(str(skeleton_path))
    arch = reader.fields["general.architecture"].contents()
    vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    for name, out in outputs:
        writer = gguf.GGUFWriter(str(out), arch)
        overrides: dict[str, int] = {}
        if name == "listed":
            tensors = [Tensor(t["name"], tuple(t["shape"]), t["type"])
                       for t in json.loads(reader.fields[TENSORS_KEY].contents())]
            name = reader.fields["general.name"].contents()
        else:
            if arch != "gemma3":
                raise SystemExit(f"synthetic_gguf: SHAPES are gemma3's, not {arch}'s")
            overrides = SHAPES[name].keys(arch)
            tensors = gemma3_tensors(SHAPES[name], vocab)
        copy_fields(gguf, reader, writer,
                    {"general.architecture", "general.name", TENSORS_KEY, *overrides})
        for key, value in overrides.items():
            writer.add_uint32(key, value)
        writer.add_string("general.name", f"synthetic {name}")
        rng = np.random.default_rng(seed)
        for t in tensors:
            array_shape, dtype, kind = layout(gguf, t)
            nbytes = int(np.prod(array_shape)) * dtype.itemsize
            writer.add_tensor_info(t.name, array_shape, dtype, nbytes, raw_dtype=kind)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t in tensors:  # one tensor in memory at a time
            writer.write_tensor_data(tensor_data(gguf, t, rng))
        writer.close()
        print(f"synthetic_gguf: {out} ({out.stat().st_size / 2**30:.2f} GiB, "
              f"{len(tensors)} tensors)", file=sys.stderr)


def output(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or (name != "listed" and name not in SHAPES):
        raise argparse.ArgumentTypeError(
            f"{text!r}: NAME=PATH, NAME being listed or one of {', '.join(sorted(SHAPES))}")
    return name, Path(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("skeleton", "write"))
    parser.add_argument("source", type=Path, help="a model (skeleton) or a skeleton (write)")
    parser.add_argument("outputs", nargs="*", type=output,
                        help="write: NAME=PATH for each model (listed, or a shape's name)")
    parser.add_argument("-o", "--output", type=Path, help="skeleton: the skeleton's path")
    parser.add_argument("--seed", type=int, default=48)
    parser.add_argument("--gguf-py", type=Path, default=KIT_GGUF_PY)
    args = parser.parse_args(argv)
    gguf = import_gguf(args.gguf_py)
    if args.command == "skeleton":
        if args.output is None:
            parser.error("skeleton needs -o SKELETON.gguf")
        skeleton(gguf, args.source, args.output)
    else:
        if not args.outputs:
            parser.error("write needs at least one NAME=PATH")
        write(gguf, args.source, args.outputs, args.seed)


if __name__ == "__main__":
    main()
