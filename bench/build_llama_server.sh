#!/usr/bin/env bash
# Builds llama-server (and, on request, llama.cpp's other tools: llama-quantize,
# llama-bench) from the llama.cpp source vendored in the llama-cpp-python sdist that this
# environment has installed, so that the side-by-side benchmarks compare suffixd's
# verifier with llama-server on the very same llama.cpp version.
# Benchmark-only: CI never runs it.
#
#   bash bench/build_llama_server.sh [BUILD_DIR]     # default build/llama-server
#   bash bench/build_llama_server.sh --targets "llama-server llama-quantize llama-bench" \
#        [BUILD_DIR]                                 # or SUFFIXD_LLAMA_TARGETS="..."
#   bash bench/build_llama_server.sh --avx2 build/llama-server-avx2
#                       # kernels limited to AVX2, as bench/build_llama_cpp_avx2.sh's verifier
#
# Prints the path of each target's binary, one a line in the order given, on stdout (the
# default, llama-server alone: its path on the last line); what it is doing goes to
# stderr, one line per stage. A second run with the same version reuses the build (only
# the targets not built yet are built).
set -euo pipefail
cd "$(dirname "$0")/.."
targets="${SUFFIXD_LLAMA_TARGETS:-llama-server}"
kernels=(-DGGML_NATIVE=ON)
while [ $# -gt 0 ]; do
  case "$1" in
    --targets) targets="$2"; shift 2 ;;
    --targets=*) targets="${1#--targets=}"; shift ;;
    --avx2) . bench/avx2_kernels.sh; kernels=("${AVX2_KERNELS[@]}"); shift ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) break ;;
  esac
done
read -r -a targets <<< "$targets"
[ ${#targets[@]} -gt 0 ] || { echo "build_llama_server: no targets" >&2; exit 2; }
build_dir="${1:-${SUFFIXD_LLAMA_SERVER_DIR:-build/llama-server}}"
python="${PYTHON:-python3}"
# llama.cpp as released in that version: the sdist on the index, without our patch (a
# local version such as 0.3.36+suffixd.3 names no sdist there), so llama-server runs the
# stock kernels a user of it gets.
version="$("$python" -c 'import llama_cpp; print(llama_cpp.__version__)')"
version="${version%%+*}"
mkdir -p "$build_dir"
build_dir="$(cd "$build_dir" && pwd)"
src="$build_dir/llama_cpp_python-$version"
bin_dir="$build_dir/build-$version/bin"
say() { echo "build_llama_server: $*" >&2; }
missing=()
for t in "${targets[@]}"; do
  [ -x "$bin_dir/$t" ] || missing+=("$t")
done
if [ ${#missing[@]} -eq 0 ]; then
  say "reusing ${targets[*]} in $bin_dir (llama-cpp-python $version)"
  printf '%s\n' "${targets[@]/#/$bin_dir/}"
  exit 0
fi
if [ ! -d "$src/vendor/llama.cpp" ]; then
  sdist="$build_dir/llama_cpp_python-$version.tar.gz"
  if [ ! -f "$sdist" ]; then
    # pip prepares an sdist's metadata even to download it; in an isolated build env it
    # first installs the build backend there, silently: 9+ minutes on a fresh venv. With
    # scikit-build-core (llama-cpp-python's backend) installed and no isolation: ~20 s.
    if ! "$python" -c 'import scikit_build_core' 2>/dev/null; then
      say "installing scikit-build-core (the sdist's build backend, to read its metadata" \
          "without an isolated build)"
      "$python" -m pip install --disable-pip-version-check 'scikit-build-core[pyproject]' >&2
    fi
    say "downloading the llama-cpp-python $version sdist (its vendored llama.cpp) into" \
        "$build_dir"
    "$python" -m pip download --disable-pip-version-check --no-deps --no-binary :all: \
      --no-build-isolation "llama-cpp-python==$version" -d "$build_dir" >&2
  fi
  say "unpacking $sdist"
  tar -xzf "$sdist" -C "$build_dir"
fi
# CPU build, as the verifier's wheel; no curl (nothing is downloaded); the tools (server,
# quantize, bench) without the examples. Only the targets asked for are compiled.
say "configuring llama.cpp (cmake) in $build_dir/build-$version"
cmake -S "$src/vendor/llama.cpp" -B "$build_dir/build-$version" \
  -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
  "${kernels[@]}" >&2
say "building ${missing[*]} (minutes: -j ${CMAKE_BUILD_PARALLEL_LEVEL:-2})"
cmake --build "$build_dir/build-$version" --target "${missing[@]}" \
  -j "${CMAKE_BUILD_PARALLEL_LEVEL:-2}" >&2
printf '%s\n' "${targets[@]/#/$bin_dir/}"
