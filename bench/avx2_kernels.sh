# Sourced by bench/build_llama_cpp_avx2.sh and bench/build_llama_server.sh: the cmake
# options that limit llama.cpp's CPU kernels to AVX2 (no native tuning, AVX-512, AVX-VNNI
# or AMX), so that the verifier and llama-server on AVX2 kernels are built alike.
# shellcheck shell=bash
AVX2_KERNELS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
              -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF
              -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF
              -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
