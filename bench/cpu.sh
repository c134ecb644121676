#!/usr/bin/env bash
# CPU speed: pp512 and tg128 of lmserv (and of llama.cpp's llama-bench when
# LLAMA_BENCH points at it) on the same model files and thread count.
#
#   bench/cpu.sh [-t THREADS] [-r REPS] MODEL.gguf...
#   LLAMA_BENCH=/path/to/llama-bench bench/cpu.sh bench-models/*.gguf
set -euo pipefail
LMSERV=${LMSERV:-./build/lmserv}
T=$(nproc); R=3
while getopts "t:r:" o; do case $o in t) T=$OPTARG;; r) R=$OPTARG;; *) exit 2;; esac; done
shift $((OPTIND - 1))
for m in "$@"; do
    echo "== $m"
    cmd=("$LMSERV" bench -m "$m" -p 512 -n 128 -t "$T" -r "$R")
    echo "+ ${cmd[*]}"; "${cmd[@]}"
    if [ -n "${LLAMA_BENCH:-}" ]; then
        cmd=("$LLAMA_BENCH" -m "$m" -p 512 -n 128 -t "$T" -r "$R" -o md)
        echo "+ ${cmd[*]}"; "${cmd[@]}" 2>/dev/null
    fi
done
