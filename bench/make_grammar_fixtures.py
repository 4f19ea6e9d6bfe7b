"""Writes tests/fixtures/grammars/reference.json: llama.cpp's own grammar for each schema
of tests/fixtures/grammars/schemas.json (or of --schemas FILE, to --out FILE).

    python bench/make_grammar_fixtures.py [--schemas FILE] [--out FILE]

It builds llama-server with bench/build_llama_server.sh (the llama.cpp vendored by the
installed llama-cpp-python, so its converter is the one llama-server runs), compiles
bench/grammar_reference/main.cpp against that build's common library and runs it.
Benchmark and fixture tooling: CI reads the committed fixtures and never runs this.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "grammars"


def build_reference() -> Path:
    env = {**os.environ, "PYTHON": os.environ.get("PYTHON", sys.executable)}
    server = subprocess.run(["bash", str(ROOT / "bench" / "build_llama_server.sh")],
                            check=True, stdout=subprocess.PIPE, text=True, env=env).stdout
    build = Path(server.strip().splitlines()[-1]).parent.parent  # build-<version>/bin/..
    src = next(build.parent.glob("llama_cpp_python-*/vendor/llama.cpp"))
    out = build / "bin" / "grammar-reference"
    main = ROOT / "bench" / "grammar_reference" / "main.cpp"
    if out.exists() and out.stat().st_mtime > main.stat().st_mtime:
        return out
    # the common library is shared (libllama-common.so) in current llama.cpp builds
    cmd = ["g++", "-std=c++17", "-O1", str(main), "-o", str(out),
           f"-I{src / 'common'}", f"-I{src / 'include'}", f"-I{src / 'ggml' / 'include'}",
           f"-I{src / 'vendor'}", f"-L{build / 'bin'}", "-lllama-common", "-lllama",
           "-lggml", "-lggml-base", f"-Wl,-rpath,{build / 'bin'}", "-pthread"]
    print(" ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schemas", type=Path, default=FIXTURES / "schemas.json")
    ap.add_argument("--out", type=Path, default=FIXTURES / "reference.json")
    args = ap.parse_args()
    tool = build_reference()
    result = subprocess.run([str(tool)], input=args.schemas.read_text(), check=True,
                            stdout=subprocess.PIPE, text=True).stdout
    reference = json.loads(result)
    args.out.write_text(json.dumps(reference, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(reference)} grammars -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
