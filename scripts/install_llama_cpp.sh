#!/usr/bin/env bash
# Installs llama-cpp-python 0.3.36 compiled from its PyPI source with one patch of ours
# (patches/llama-cpp-python-0.3.36-suffixd.patch) to llama.cpp's CPU kernels:
# - flash attention sums the weighted V rows in F32 instead of F16. Stock, that sum rounds
#   and overflows on long contexts, and only batches of under 64 rows take it, so a row's
#   logits depend on how its batch was cut and speculative decoding would part from plain
#   decoding (daemon/model/files.py: the verifier runs it only on this build, when
#   SUFFIXD_FLASH_ATTN=on asks);
# - matrix products of 2-16 activation rows against Q8_0 weights (2-4 against F16), the
#   rows of a verification step: each weight block is read once for all rows and each dot
#   product runs the one-row kernel's operations in its order. Stock tinyBLAS made 2 rows
#   of gemma-3's output head cost 2.2 one-row passes, so a drafted token cost what decoding
#   it did; here each logit is the very float a one-row decode gives. SUFFIXD_GGML_ROWS=off
#   in a process's environment turns them off (to measure them).
# - grouped-query attention's heads that share one K (and V) matrix in one such product
#   rather than one product per head, so each K row is read and converted once for the
#   group (gemma-3: 4 heads per K); the same floats. SUFFIXD_GGML_ROWS=nogroup multiplies
#   them one by one.
# The patched build reports version 0.3.36+suffixd.3. suffixd works on a stock
# llama-cpp-python too, without flash attention and without those products.
#
#   bash scripts/install_llama_cpp.sh                  # into the active environment
#   bash scripts/install_llama_cpp.sh --target DIR     # into DIR (PYTHONPATH=DIR), no deps
#
# CMAKE_ARGS pass through (default -DLLAVA_BUILD=OFF: suffixd does not use llama.cpp's
# multimodal library, and the compile is shorter without it). Does nothing when the
# patched version is already there. Needs the package index (the source) and a compiler.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
version=0.3.36
patched="$version+suffixd.3"
python="${PYTHON:-python3}"
target=""
if [ "${1:-}" = "--target" ]; then target="$2"; fi
say() { echo "install_llama_cpp: $*" >&2; }

version_of() {  # the llama-cpp-python in $target, else the environment's
  if [ -n "$target" ]; then
    sed -n 's/^__version__ = "\(.*\)"/\1/p' "$target/llama_cpp/__init__.py" 2>/dev/null || true
  else
    # the installed distribution's metadata: importing llama_cpp can read a stale
    # __pycache__ left by the build before (same size, and wheels carry fixed mtimes)
    "$python" -c 'import importlib.metadata as m; print(m.version("llama_cpp_python"))' \
      2>/dev/null || true
  fi
}
installed="$(version_of)"
if [ "$installed" = "$patched" ]; then
  say "llama-cpp-python $patched already installed${target:+ in $target}"
  exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$python" -m pip download --disable-pip-version-check --no-deps --no-binary :all: -q \
  -d "$work" "llama-cpp-python==$version"
tar -xzf "$work"/llama_cpp_python-"$version".tar.gz -C "$work"
src="$work/llama_cpp_python-$version"
patch_file="$root/patches/llama-cpp-python-$version-suffixd.patch"
if command -v git >/dev/null 2>&1; then
  git -C "$src" apply -p1 "$patch_file"
else
  patch -d "$src" -p1 < "$patch_file"
fi
say "compiling llama-cpp-python $patched${target:+ into $target} (minutes)"
export CMAKE_ARGS="${CMAKE_ARGS:--DLLAVA_BUILD=OFF}"
if [ -n "$target" ]; then
  rm -rf "$target"
  "$python" -m pip install --disable-pip-version-check --no-cache-dir --no-deps -q \
    --target "$target" "$src"
else
  "$python" -m pip install --disable-pip-version-check --no-cache-dir -q "$src"
fi
installed="$(version_of)"
[ "$installed" = "$patched" ] || { say "installed $installed, not $patched"; exit 1; }
say "installed llama-cpp-python $patched${target:+ in $target}"
