#!/usr/bin/env bash
# Speculative decoding (prompt lookup, or a draft model): decode tokens/s of
# one request with speculation and without, in alternation on one server,
# the guesses taken, and where the tokens first differ from plain decoding
# (they may, where the model's kernels sum rows in another order when
# several are verified at once).
#
#   bench/spec.sh MODEL.gguf [THREADS] [N_MAX] [-- SERVE FLAGS]
#   e.g. bench/spec.sh qwen3-0.6b-q4_k_m.gguf 2 4
#        bench/spec.sh target.gguf 2 8 -- --draft draft.gguf
set -euo pipefail
LMSERV=${LMSERV:-./build/lmserv}
M=$1; T=${2:-$(nproc)}; K=${3:-4}
shift $(($# < 3 ? $# : 3))
[ "${1:-}" = "--" ] && shift
SPEC=("$@"); [ ${#SPEC[@]} -eq 0 ] && SPEC=(--spec ngram)
PORT=${PORT:-18599}
PROMPT="The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick brown fox"
cmd=("$LMSERV" serve -m "$M" --host 127.0.0.1 --port "$PORT" -c 1024 -t "$T" --parallel 1 "${SPEC[@]}")
echo "+ ${cmd[*]}"
"${cmd[@]}" >/tmp/lmserv-bench-spec.log 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null' EXIT
for _ in $(seq 200); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.1; done
for rep in 1 2; do
    for n in 0 "$K"; do
        body=$(printf '{"prompt":"%s","n_predict":128,"temperature":0,"n_probs":1,"speculative.n_max":%s}' "$PROMPT" "$n")
        echo "+ POST /completion speculative.n_max=$n"
        curl -s "http://127.0.0.1:$PORT/completion" -d "$body" >"/tmp/lmserv-bench-spec-$n.json"
    done
    python3 - "$K" <<'PY'
import json, sys
k = sys.argv[1]
d0, dk = (json.load(open(f"/tmp/lmserv-bench-spec-{n}.json")) for n in ("0", k))
a, b = ([e["id"] for e in d["completion_probabilities"]] for d in (d0, dk))
same = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
print(f"plain {d0['timings']['predicted_per_second']:.1f} t/s, speculative (n_max {k}) "
      f"{dk['timings']['predicted_per_second']:.1f} t/s; tokens equal for the first {same} of {len(a)}")
PY
done
curl -s "http://127.0.0.1:$PORT/stats" |
    python3 -c 'import json,sys; s=json.load(sys.stdin)["sched"]; print("guesses:", s["draft_accepted"], "of", s["draft_tokens"], "taken")'
