#!/usr/bin/env bash
# Serving engine: aggregate decode tokens/s and TTFT at 1, 4, 8 and 16
# concurrent requests (128 prompt + 64 generated tokens each), decode speed
# at depth 0 and after a 1024-token prompt (f16, q8_0 and q4_0 KV caches),
# and TTFT of a cached prefix.
#
#   bench/serve.sh MODEL.gguf [THREADS]
set -euo pipefail
LMSERV=${LMSERV:-./build/lmserv}
M=$1; T=${2:-$(nproc)}
run() { echo "+ $*"; "$@"; }
run "$LMSERV" bench -m "$M" -t "$T" -p 0 -n 0 --parallel 1,4,8,16
# depth 0 and depth 1024 alternate (the bandwidth drifts): ratio of neighbours
run "$LMSERV" bench -m "$M" -t "$T" -p 0 -n 64 -r 5 --depth 1024
run "$LMSERV" bench -m "$M" -t "$T" -p 0 -n 64 -r 5 --depth 1024 --kv-type q8_0
run "$LMSERV" bench -m "$M" -t "$T" -p 0 -n 64 -r 5 --depth 1024 --kv-type q4_0
run "$LMSERV" bench -m "$M" -t "$T" -p 0 -n 0 --prefix 1000
