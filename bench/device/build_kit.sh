#!/usr/bin/env bash
# Builds the device kit's row_cost with llama.cpp from the kit's pruned source, into one
# folder (BUILD_DIR/bin: the binary and the libraries it loads through $ORIGIN).
#
#   bash bench/device/build_kit.sh BUILD_DIR [portable|native|cpu]   # default portable
#
# A portable build's folder is copied, stripped, to the kit (KIT/bin) and packed
# (KIT/bin.tar.xz), which the device carries.
#
# portable: llama.cpp's dynamically loaded backends, CPU kernels for the x86 servers
#   (x64, haswell, skylakex, icelake, zen4, sapphirerapids: ggml picks the best the CPU
#   runs) and CUDA for sm_90 (H100/H200), flash attention's CUDA kernels left out (they
#   are most of a CUDA build's time; see BENCHMARKS.md). Built here, ahead of a device
#   session, on no GPU (~70 minutes on 2 cores), none of the device's time.
# native: the same on the machine it runs on (its own CPU's kernels, CUDA for its GPU), the
#   fallback where no portable build came with the kit.
# cpu: native, without CUDA.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"  # paths in flags spelled one way: a new spelling rebuilds all
build="${1:?usage: build_kit.sh BUILD_DIR [portable|native|cpu]}"
mode="${2:-portable}"
kit="${SUFFIXD_DEVICE_KIT:-$root/build/device-kit}"
jobs="${JOBS:-$(nproc)}"
# libstdc++ stays shared (GCC 12's here: GLIBCXX_3.4.30, glibc 2.34); linked statically it
# pulled in arc4random and _dl_find_object, glibc 2.35-2.36 symbols a device may lack.
common=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_EXE_LINKER_FLAGS= -DCMAKE_SHARED_LINKER_FLAGS=
        -DLLAMA_CPP_DIR="$(cd "$kit/llama.cpp" && pwd)"
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_CUDA_NCCL=OFF -DGGML_CUDA_FA=OFF)
case "$mode" in
  portable)
    # No GPU here, and perhaps no cuBLAS: the toolkit's nvcc with the cuBLAS wheel's headers
    # and libraries (pip download "nvidia-cublas>=13,<14", unzipped to build/cublas, its
    # lib/libcublas.so -> libcublas.so.13 linked); the device loads its own cuBLAS. No
    # libcuda here either, so CUDA's virtual memory pool is off (the legacy pool instead).
    flags=(-DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DGGML_NATIVE=OFF -DGGML_CUDA=ON
           -DCMAKE_CUDA_ARCHITECTURES=90-real -DGGML_CUDA_NO_VMM=ON)
    cublas="${SUFFIXD_CUBLAS_DIR:-$root/build/cublas/nvidia/cu13}"
    if [ -d "$cublas" ]; then
      flags+=(-DCMAKE_LIBRARY_PATH="$cublas/lib" -DCMAKE_CUDA_FLAGS="-I$cublas/include"
              -DCMAKE_CXX_FLAGS="-I$cublas/include")
    fi ;;
  native) flags=(-DGGML_NATIVE=ON -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=native) ;;
  cpu) flags=(-DGGML_NATIVE=ON) ;;
  *) echo "build_kit: mode is portable, native or cpu, not $mode" >&2; exit 2 ;;
esac
mkdir -p "$build"
cmake -S "$here" -B "$build" "${common[@]}" "${flags[@]}" > "$build/configure.log" 2>&1 \
  || { tail -20 "$build/configure.log" >&2; exit 1; }
cmake --build "$build" -j "$jobs" > "$build/build.log" 2>&1 \
  || { grep -m5 -B2 -A8 "error" "$build/build.log" >&2; exit 1; }
if [ "$mode" = portable ]; then
  rm -rf "$kit/bin"
  cp -r "$build/bin" "$kit/bin"
  strip --strip-unneeded "$kit/bin"/*
  tar -C "$kit" -cJf "$kit/bin.tar.xz" bin  # what travels (the device takes 64 MiB)
  echo "$kit/bin/row_cost"
else
  echo "$build/bin/row_cost"
fi
