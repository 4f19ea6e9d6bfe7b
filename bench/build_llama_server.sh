#!/usr/bin/env bash
# Builds llama-server from the llama.cpp source vendored in the llama-cpp-python sdist
# that this environment has installed, so that the side-by-side benchmarks compare
# suffixd's verifier with llama-server on the very same llama.cpp version.
# Benchmark-only: CI never runs it.
#
#   bash bench/build_llama_server.sh [BUILD_DIR]     # default build/llama-server
#
# Prints the path of the llama-server binary on its last line. A second run with the
# same version reuses the build.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${1:-${SUFFIXD_LLAMA_SERVER_DIR:-build/llama-server}}"
python="${PYTHON:-python3}"
version="$("$python" -c 'import llama_cpp; print(llama_cpp.__version__)')"
mkdir -p "$build_dir"
build_dir="$(cd "$build_dir" && pwd)"
src="$build_dir/llama_cpp_python-$version"
bin="$build_dir/build-$version/bin/llama-server"
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
if [ ! -d "$src/vendor/llama.cpp" ]; then
  sdist="$build_dir/llama_cpp_python-$version.tar.gz"
  if [ ! -f "$sdist" ]; then
    "$python" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$version" \
      -d "$build_dir" >&2
  fi
  tar -xzf "$sdist" -C "$build_dir"
fi
# CPU build, as the verifier's wheel; no curl (nothing is downloaded), server only.
cmake -S "$src/vendor/llama.cpp" -B "$build_dir/build-$version" \
  -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DGGML_NATIVE=ON >&2
cmake --build "$build_dir/build-$version" --target llama-server \
  -j "${CMAKE_BUILD_PARALLEL_LEVEL:-2}" >&2
echo "$bin"
