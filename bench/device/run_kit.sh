#!/usr/bin/env bash
# Issue 48's device kit, run on the device machine: what k verified rows cost against one
# decode for a 30B-class verifier (gemma-3-27b's shape, Q4_K_M, synthetic weights) and
# for its family's drafts (gemma-3-270m's shape with the embedded model's types, and
# gemma-3-1b's), on the machine's CPU cores and on its GPU.
#
#   bash bench/device/prepare_kit.sh                  # here, ahead: build/device-kit
#   bash bench/device/build_kit.sh build/kit-portable   # here, ahead: build/device-kit/bin
#   # on the device (the run tool), carrying build/device-kit/{bin.tar.xz,
#   # llama.cpp.tar.xz,gemma-3-270m.skeleton.gguf.xz}:
#   bash bench/device/run_kit.sh [--skip-cpu] [--skip-gpu]     # $OUT: where results go
#   SUFFIXD_KIT_VERIFIER=gemma-3-4b bash bench/device/run_kit.sh --skip-gpu   # a rehearsal
#       on a small machine (the files keep the 27b's names)
#
# Writes to $OUT: machine.txt (CPU, GPU, memory), one JSON per measurement (row_cost's
# output: {cpu,gpu}-{27b,270m,1b}.json, and gpu-27b-x{4,8}.json: 4 and 8 sequences at once)
# and kit.log. Each stage
# writes its file as soon as it ends, so a run cut short still returns what it measured.
# Then, here: python bench/device/kit_profiles.py OUT_DIR.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-build/device-out}"
kit="${SUFFIXD_DEVICE_KIT:-build/device-kit}"
cpu=1 gpu=1
for arg in "$@"; do
  case "$arg" in
    --skip-cpu) cpu=0 ;;
    --skip-gpu) gpu=0 ;;
    *) echo "run_kit: unknown argument $arg" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
log() { echo "[$(date +%T)] $*" | tee -a "$out/kit.log" >&2; }

# The GPU's libraries (cuBLAS) where a toolkit keeps them, if the loader does not know it.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-*/lib64; do
  [ -d "$d" ] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
export LD_LIBRARY_PATH

{
  date -u; uname -a; nproc; lscpu; free -g; df -h /dev/shm "${TMPDIR:-/tmp}"
  nvidia-smi 2>&1; nvcc --version 2>&1 | tail -2
} > "$out/machine.txt" 2>&1
cores="$(lscpu -p=CORE,SOCKET | grep -v '^#' | sort -u | wc -l)"
log "machine: $(grep -m1 'Model name' "$out/machine.txt" | sed 's/.*: *//'), $(nproc) CPUs, $cores cores"

# The kit travels packed (prepare_kit.sh).
[ -d "$kit/llama.cpp/gguf-py" ] || tar -C "$kit" -xJf "$kit/llama.cpp.tar.xz" llama.cpp/gguf-py
[ -f "$kit/gemma-3-270m.skeleton.gguf" ] || xz -dk "$kit/gemma-3-270m.skeleton.gguf.xz"
[ -x "$kit/bin/row_cost" ] || [ ! -f "$kit/bin.tar.xz" ] || tar -C "$kit" -xJf "$kit/bin.tar.xz"

# Models in memory when it has room: the 27b is 16.5 GB, read at every decode on the CPU.
models=/dev/shm/suffixd-kit
[ "$(df --output=avail -B1G /dev/shm 2>/dev/null | tail -1)" -gt 20 ] 2>/dev/null \
  || models="${TMPDIR:-/tmp}/suffixd-kit"
mkdir -p "$models"
# One writer, the skeleton read once; the binary's check (or build) runs beside it.
python3 bench/device/synthetic_gguf.py write "$kit/gemma-3-270m.skeleton.gguf" \
  listed="$models/gemma-3-270m.gguf" gemma-3-1b="$models/gemma-3-1b.gguf" \
  "${SUFFIXD_KIT_VERIFIER:-gemma-3-27b}"="$models/gemma-3-27b.gguf" --gguf-py "$kit/llama.cpp/gguf-py" 2>> "$out/kit.log" &
writer_pid=$!

# The binary: the portable build that came with the kit, else one built here.
row_cost="$kit/bin/row_cost"
"$row_cost" --help > "$out/prebuilt.txt" 2>&1
if ! grep -q usage "$out/prebuilt.txt"; then
  log "the kit's build does not run here ($(tail -1 "$out/prebuilt.txt")); building natively"
  tar -C "$kit" -xJf "$kit/llama.cpp.tar.xz"
  mode=native
  command -v nvcc > /dev/null || mode=cpu
  row_cost="$(SUFFIXD_DEVICE_KIT="$kit" bash bench/device/build_kit.sh "$models/build" "$mode")" \
    || { log "the native build failed"; cp "$models/build/build.log" "$out/" 2>/dev/null; exit 1; }
fi
log "row_cost: $row_cost"

wait "$writer_pid" || { log "writing the models failed"; exit 1; }
log "models written: $(du -sh "$models"/*.gguf | tr '\n' ' ')"

measure() {  # NAME MODEL ARGS...: row_cost's JSON to $out/NAME.json
  local name="$1" model="$2"
  shift 2
  log "measuring $name"
  local limit="${SUFFIXD_KIT_MEASURE_S:-240}"  # a hung run must not take the rest's time
  if timeout "$limit" "$row_cost" "$model" --label "$name" "$@" > "$out/$name.json.part" \
      2>> "$out/kit.log"; then
    mv "$out/$name.json.part" "$out/$name.json"
  elif timeout "$limit" "$row_cost" "$model" --label "$name" --no-extra-bufts "$@" \
      > "$out/$name.json.part" 2>> "$out/kit.log"; then
    # llama.cpp 0.3.36's AMX multiply crashed on a Sapphire Rapids VM: plain weights then
    log "$name failed with repacked weights; measured without them"
    mv "$out/$name.json.part" "$out/$name.json"
  else
    log "$name failed (see kit.log)"
  fi
}
ks=1,2,3,4,6,8,12,16,24,32
# The GPU first: its runs take seconds, the CPU's 27b minutes.
if [ "$gpu" = 1 ]; then
  measure gpu-270m "$models/gemma-3-270m.gguf" --ngl 99 --prompt 1024 --ks "$ks,48,64" --reps 10
  measure gpu-1b "$models/gemma-3-1b.gguf" --ngl 99 --prompt 1024 --ks 1,2,4,8 --reps 10
  measure gpu-27b "$models/gemma-3-27b.gguf" --ngl 99 --prompt 1024 --ks "$ks,48,64" --reps 10
  for seqs in 4 8; do  # many agents at once, a KV stream each
    measure "gpu-27b-x$seqs" "$models/gemma-3-27b.gguf" --ngl 99 --prompt 1024 --seqs "$seqs" \
      --ks 1,2,4,8 --reps 10
  done
fi
if [ "$cpu" = 1 ]; then
  # The CPU alone: no GPU visible, so no matrix product is sent to it either.
  export CUDA_VISIBLE_DEVICES=
  measure cpu-270m "$models/gemma-3-270m.gguf" --ngl 0 \
    --threads "$cores" --prompt 256 --ks "$ks" --reps 5
  measure cpu-1b "$models/gemma-3-1b.gguf" --ngl 0 \
    --threads "$cores" --prompt 256 --ks 1,2,4,8 --reps 5
  measure cpu-27b "$models/gemma-3-27b.gguf" --ngl 0 \
    --threads "$cores" --prompt 128 --ks "$ks" --reps 3
fi
log "done"
