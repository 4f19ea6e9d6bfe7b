#!/usr/bin/env bash
# Prepares what issue 48's device kit carries to a machine with nothing on it
# (build/device-kit; the device takes 64 MiB): a pruned copy of the llama.cpp source
# vendored in llama-cpp-python (the core library, its CPU and CUDA backends, gguf-py) and
# the embedded model's metadata without its weights (synthetic_gguf.py skeleton), from
# which run_kit.sh writes synthetic-weights models of any shape on the device.
# Benchmark-only: CI never runs it.
#
#   bash bench/build_llama_server.sh     # once, for the llama.cpp source (the sdist)
#   bash bench/device/prepare_kit.sh [KIT_DIR]     # default build/device-kit
#
# The device carries KIT/{llama.cpp.tar.xz,gemma-3-270m.skeleton.gguf.xz,bin.tar.xz} (the
# last from build_kit.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
kit="${1:-build/device-kit}"
python="${PYTHON:-python3}"
version="$("$python" -c 'import llama_cpp; print(llama_cpp.__version__)')"
version="${version%%+*}"
src="build/llama-server/llama_cpp_python-$version/vendor/llama.cpp"
[ -d "$src" ] || { echo "prepare_kit: no $src; run bench/build_llama_server.sh first" >&2; exit 2; }
rm -rf "$kit/llama.cpp"
mkdir -p "$kit/llama.cpp/ggml/src" "$kit/llama.cpp/vendor"
cp -r "$src/CMakeLists.txt" "$src/cmake" "$src/include" "$src/src" "$src/gguf-py" "$src/LICENSE" \
  "$kit/llama.cpp/"
cp -r "$src/ggml/CMakeLists.txt" "$src/ggml/cmake" "$src/ggml/include" "$kit/llama.cpp/ggml/"
# ggml's core files and the two backends measured; the others' folders are only read when
# their option is on.
find "$src/ggml/src" -maxdepth 1 -type f -exec cp {} "$kit/llama.cpp/ggml/src/" \;
cp -r "$src/ggml/src/ggml-cpu" "$src/ggml/src/ggml-cuda" "$kit/llama.cpp/ggml/src/"
# A portable build's CPU kernels: the x86 servers' variants only (ggml has 14; each is a
# whole CPU backend to compile).
sed -i -E '/ggml_add_cpu_backend_variant\((sse42|sandybridge|ivybridge|piledriver|cannonlake|cascadelake|cooperlake|alderlake) /d' \
  "$kit/llama.cpp/ggml/src/CMakeLists.txt"
# The vendored header-only libraries the core's CMake adds (cpp-httplib only with common).
for lib in "$src"/vendor/*/; do
  [ "$(basename "$lib")" = cpp-httplib ] || cp -r "$lib" "$kit/llama.cpp/vendor/"
done
cp "$src/vendor/CMakeLists.txt" "$kit/llama.cpp/vendor/"
# What travels is packed: the source (the device unpacks gguf-py, to write the models, and
# the rest only to build where the kit's build does not run), the skeleton, the build.
tar -C "$kit" -cJf "$kit/llama.cpp.tar.xz" llama.cpp
"$python" bench/device/synthetic_gguf.py skeleton "$("$python" -c \
  'from suffixd.daemon.model.files import embedded_model_path; print(embedded_model_path())')" \
  -o "$kit/gemma-3-270m.skeleton.gguf"
xz -kf "$kit/gemma-3-270m.skeleton.gguf"
ls -l "$kit"/*.xz >&2
