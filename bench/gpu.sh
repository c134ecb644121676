#!/usr/bin/env bash
# GPU figures of the README (a CUDA build: cmake -B build -DLMS_CUDA=ON):
# an 8B-shaped Q4_K_M model wholly on the GPU (pp512, tg128, 1 vs 8
# sequences), and a 3B-shaped one split by a VRAM budget (prompt offload of
# the CPU layers), each beside llama.cpp with the same layer count when
# LLAMA_BIN (its build/bin) is set. Models are made with `lmserv synth`.
#
#   bench/gpu.sh [WORKDIR=/tmp]
set -euo pipefail
B=${BUILD:-./build}
W=${1:-/tmp}
run() { echo "+ $*"; "$@"; }
[ -f "$W/l8b.gguf" ] || run "$B/lmserv" synth --shape llama-3-8b --type Q4_K_M "$W/l8b.gguf"
[ -f "$W/l3b.gguf" ] || run "$B/lmserv" synth --shape llama-3.2-3b --type Q4_K_M "$W/l3b.gguf"
run "$B/lmserv" bench -m "$W/l8b.gguf" --gpu-layers all -p 512 -n 128 -r 3
# the one-token unit kernels off, for comparison
LMS_CUDA_MV1=0 run "$B/lmserv" bench -m "$W/l8b.gguf" --gpu-layers all -p 0 -n 128 -r 3
run "$B/tests/bench_batched_cuda" "$W/l8b.gguf" 128 128 1,8
LMS_CUDA_PDL=0 run "$B/tests/bench_batched_cuda" "$W/l8b.gguf" 128 128 1,8
# logits into a plain (not page-locked) buffer: a host copy a step, for comparison
LMS_BENCH_PAGEABLE=1 run "$B/tests/bench_batched_cuda" "$W/l8b.gguf" 128 128 1,8
run "$B/lmserv" bench -m "$W/l8b.gguf" --gpu-layers all -p 0 -n 0 --parallel 1,8
if [ -n "${LLAMA_BIN:-}" ]; then
    run "$LLAMA_BIN/llama-bench" -m "$W/l8b.gguf" -ngl 99 -p 512 -n 128 -r 3
    run "$LLAMA_BIN/llama-batched-bench" -m "$W/l8b.gguf" -ngl 99 -c 4096 -b 2048 -ub 512 \
        -npp 128 -ntg 128 -npl 1,8 -fa on
fi
for mb in 3072 2048 1536; do
    out=$("$B/lmserv" bench -m "$W/l3b.gguf" --gpu-layers auto --vram-budget-mb "$mb" \
        -p 512 -n 128 -r 3 2>&1)
    echo "+ $B/lmserv bench -m $W/l3b.gguf --gpu-layers auto --vram-budget-mb $mb -p 512 -n 128 -r 3"
    echo "$out"
    n=$(echo "$out" | grep -o '[0-9]*/[0-9]* layers' | head -1 | cut -d/ -f1)
    # every layer and the head on the GPU: llama.cpp's -ngl 99
    if echo "$out" | grep -q '+ output'; then n=99; fi
    if [ -n "${LLAMA_BIN:-}" ]; then
        run "$LLAMA_BIN/llama-bench" -m "$W/l3b.gguf" -ngl "${n:-99}" -p 512 -n 128 -r 3
    fi
done
