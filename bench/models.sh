#!/usr/bin/env bash
# Writes the benchmark models (seeded random weights, real shapes) into
# $BENCH_MODELS (default ./bench-models, git-ignored). Prints each command.
set -euo pipefail
LMSERV=${LMSERV:-./build/lmserv}
DIR=${BENCH_MODELS:-bench-models}
mkdir -p "$DIR"
make_model() { # shape type
    local out="$DIR/$1-$(echo "$2" | tr 'A-Z' 'a-z').gguf"
    if [ ! -f "$out" ]; then
        echo "+ $LMSERV synth --shape $1 --type $2 $out"
        "$LMSERV" synth --shape "$1" --type "$2" "$out"
    fi
}
for spec in "${@:-llama-3.2-1b:Q4_K_M llama-3.2-1b:Q8_0 qwen3-0.6b:Q4_K_M}"; do
    for s in $spec; do make_model "${s%%:*}" "${s##*:}"; done
done
