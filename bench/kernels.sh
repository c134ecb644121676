#!/usr/bin/env bash
# kernels.sh - microbenchmark of the matrix-product kernels (tools/kbench.c):
# vec_dot vs the gemm tile kernel on one thread, lms_matmul with the thread
# team for a prompt batch, and decode GB/s, on the Llama-3.2-1B shapes; then
# decode alone from DRAM (kbench -d: matrices over the 32 MiB L3, the gemv
# kernels and vec_dot row by row next to the read bandwidth of the buffer);
# then batched decode from DRAM (kbench -b: 8 tokens, as 8 sequences decode).
#
#   bench/kernels.sh [build-dir] [threads]     (LMS_ISA=avx2 etc. to force an ISA)
set -euo pipefail
build=${1:-build}
threads=${2:-2}
kb="$build/kbench"
[ -x "$kb" ] || { echo "kernels.sh: $kb not built (ninja -C $build kbench)" >&2; exit 1; }
echo "# $(date -u +%FT%TZ) $(uname -m) load: $(cut -d' ' -f1-3 /proc/loadavg)"
run() { echo "+ $*"; "$@"; }
# attention q/o (2048x2048), ffn gate/up (8192x2048), ffn down (2048x8192)
run "$kb" -t "$threads" -k 2048 -m 2048 -n 512 -r 5 q4_K q6_K q8_0 f16
run "$kb" -t "$threads" -k 2048 -m 8192 -n 512 -r 3 q4_K q8_0
run "$kb" -t "$threads" -k 8192 -m 2048 -n 512 -r 3 q6_K q4_K q8_0
# decode from DRAM: attention/ffn shapes, ffn_down, the Llama and Qwen3 output heads
run "$kb" -d -t "$threads" -k 2048 -m 32768 -r 3 q4_K q8_0
run "$kb" -d -t "$threads" -k 8192 -m 8192 -r 3 q4_K q6_K
run "$kb" -d -t "$threads" -k 2048 -m 128256 -r 3 q6_K
run "$kb" -d -t "$threads" -k 1024 -m 151936 -r 3 q6_K
# batched decode (8 tokens) from DRAM: rows of 2048 and 8192 columns, the Llama output head
run "$kb" -b -t "$threads" -k 2048 -m 65536 -r 5 q4_K q6_K
run "$kb" -b -t "$threads" -k 8192 -m 16384 -r 5 q4_K q6_K
run "$kb" -b -t "$threads" -k 2048 -m 128256 -r 3 q6_K
