"""Make a verifier/draft pair from the embedded model: quantized self-speculation.

    python bench/make_quant_pair.py [--types F16,Q8_0,BF16,F32] [--out build/quant-pair]
                                    [--quantize PATH] [--source GGUF]

The draft is the embedded gemma-3-270m Q4_K_M (``embedded_model_path()``); each verifier
is the same model turned into a dearer format by llama.cpp's ``llama-quantize
--allow-requantize`` (the Q4_K_M's weights dequantized and stored again: a verifier whose
every token costs more, with the draft's very vocabulary). ``llama-quantize`` is built
from the llama.cpp vendored in the installed llama-cpp-python by
``bench/build_llama_server.sh --targets llama-quantize`` unless ``--quantize`` names one.

Idempotent: a verifier whose stamp (``<file>.json``: the source's size and SHA-256, the
type, the llama-cpp-python version) matches is kept; otherwise it is made again into a
temporary file and renamed into place. Prints one line per model on stdout, ``ROLE TYPE
PATH BYTES`` (the draft first), and what it does on stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# F32 (1.1 GB) is the dearest per token: a decode reads four bytes a weight, so it is
# bound by memory as a 30B-class model's decode is, and its draft costs a quarter of it
TYPES = ("F16", "BF16", "Q8_0", "F32")


def sha256(path: Path) -> str:
    """The file's SHA-256 (hex)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def llama_quantize() -> Path:
    """The ``llama-quantize`` that bench/build_llama_server.sh builds (or reuses)."""
    out = subprocess.run(
        ["bash", str(ROOT / "bench" / "build_llama_server.sh"), "--targets", "llama-quantize"],
        env={**os.environ, "PYTHON": os.environ.get("PYTHON", sys.executable)},
        check=True, stdout=subprocess.PIPE, text=True).stdout
    return Path(out.strip().splitlines()[-1])


def stamp(source: Path, qtype: str) -> dict[str, object]:
    """What a made verifier was made from (compared before it is kept)."""
    import llama_cpp

    return {"source": source.name, "source_bytes": source.stat().st_size,
            "source_sha256": sha256(source), "type": qtype,
            "llama_cpp_python": llama_cpp.__version__}


def make(quantize: Path, source: Path, out_dir: Path, qtype: str, threads: int) -> Path:
    """The ``qtype`` verifier made from ``source`` in ``out_dir`` (kept when its stamp
    matches); its path."""
    target = out_dir / f"{source.stem.rsplit('-', 1)[0]}-{qtype.lower()}.gguf"
    if source.stem.lower().endswith(qtype.lower()):
        raise SystemExit(f"{source} is already {qtype}")
    want = stamp(source, qtype)
    stamp_path = target.with_name(target.name + ".json")
    if target.is_file() and stamp_path.is_file() \
            and json.loads(stamp_path.read_text()) == want:
        print(f"make_quant_pair: keeping {target} ({qtype})", file=sys.stderr)
        return target
    tmp = target.with_name(target.name + ".part")
    print(f"make_quant_pair: {source.name} -> {target.name} ({qtype})", file=sys.stderr)
    subprocess.run([str(quantize), "--allow-requantize", str(source), str(tmp), qtype,
                    str(threads)], check=True, stdout=sys.stderr)
    os.replace(tmp, target)
    stamp_path.write_text(json.dumps(want, indent=1) + "\n")
    return target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="F16",
                    help=f"comma-separated verifier types, of {', '.join(TYPES)} [F16]")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "quant-pair")
    ap.add_argument("--quantize", type=Path, default=None,
                    help="llama-quantize binary [built by bench/build_llama_server.sh]")
    ap.add_argument("--source", type=Path, default=None,
                    help="the draft GGUF the verifiers are made from [the embedded model]")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    types = [t.strip().upper() for t in args.types.split(",") if t.strip()]
    if not types or any(t not in TYPES for t in types):
        ap.error(f"--types: a comma-separated subset of {', '.join(TYPES)}")
    if args.source is None:
        from suffixd.daemon.model import embedded_model_path

        args.source = embedded_model_path()
    source = args.source.resolve()
    quantize = args.quantize or llama_quantize()
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"draft {source.stem.rsplit('-', 1)[-1].upper()} {source} {source.stat().st_size}")
    for t in types:
        path = make(quantize, source, args.out.resolve(), t, args.threads)
        print(f"verifier {t} {path} {path.stat().st_size}")


if __name__ == "__main__":
    main()
