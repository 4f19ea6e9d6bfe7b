#!/usr/bin/env bash
# Builds a second llama-cpp-python, the same version as this environment's, with llama.cpp's
# CPU kernels limited to AVX2 (GGML_NATIVE off, AVX-512 and AMX off), into its own folder.
# llama.cpp picks its kernels by CPU at build time: a test can pass on this machine's
# AVX-512 kernels and fail on a user's AVX2 ones (an AMD EPYC Zen 3, an older Xeon). With
# this build first on PYTHONPATH, the tests (and the daemons they start, which inherit the
# variable) run on AVX2 kernels here:
#
#   bash bench/build_llama_cpp_avx2.sh                       # default build/llama-cpp-avx2
#   PYTHONPATH=build/llama-cpp-avx2 pytest -q -m model       # the tests that run the model
#
# Prints the folder on its last line (stdout); the build's own output goes to stderr.
# A second run with the same version reuses the build. Not part of CI.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${1:-build/llama-cpp-avx2}"
python="${PYTHON:-python3}"
version="$("$python" -c 'import llama_cpp; print(llama_cpp.__version__)')"
say() { echo "build_llama_cpp_avx2: $*" >&2; }
if [ -f "$target/.version" ] && [ "$(cat "$target/.version")" = "$version" ]; then
  say "reusing $target (llama-cpp-python $version, AVX2 kernels)"
  echo "$target"
  exit 0
fi
say "building llama-cpp-python $version with AVX2 kernels into $target (minutes)"
# The multimodal library (LLAVA_BUILD) is not used by suffixd. A patched build (version
# +suffixd.*, scripts/install_llama_cpp.sh) is built again from the same source and
# patch; pip's wheel cache is keyed by the sdist, not by CMAKE_ARGS, so it is not used.
. bench/avx2_kernels.sh
if [[ "$version" == *+suffixd.* ]]; then
  CMAKE_ARGS="${AVX2_KERNELS[*]} -DLLAVA_BUILD=OFF" PYTHON="$python" \
    bash scripts/install_llama_cpp.sh --target "$target" >&2
else
  rm -rf "$target"
  CMAKE_ARGS="${AVX2_KERNELS[*]} -DLLAVA_BUILD=OFF" \
    "$python" -m pip install --disable-pip-version-check --no-cache-dir --no-deps \
    --target "$target" "llama-cpp-python==$version" >&2
fi
features="$(PYTHONPATH="$target" "$python" -c \
  'import llama_cpp; print(llama_cpp.llama_print_system_info().decode())')"
say "system info: $features"
if echo "$features" | grep -Eq '(AVX512|AMX)[A-Z0-9_]* = 1'; then
  say "the build still uses AVX-512 or AMX kernels"; exit 1
fi
echo "$version" > "$target/.version"
echo "$target"
