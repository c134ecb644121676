#!/usr/bin/env bash
# A burst of N requests with one long prompt, sent at once to `lmserv
# serve` (--parallel N): the wall time until all have answered and each
# one's TTFT and cached prompt tokens (from the request_end log lines).
# With the in-flight prefix wait, the first request prefills the prompt
# and the others map its blocks.
#
#   bench/burst_prefix.sh MODEL.gguf [N=4] [WORDS=900] [THREADS]
set -euo pipefail
LMSERV=${LMSERV:-./build/lmserv}
M=$1; N=${2:-4}; W=${3:-900}; T=${4:-$(nproc)}
PORT=${PORT:-18190}
D=$(mktemp -d /tmp/lmserv-burst.XXXXXX)
trap 'kill "$SRV" 2>/dev/null || true; rm -rf "$D"' EXIT
python3 - "$W" >"$D/body.json" <<'PY'
import json, sys
w = ("the quick brown fox jumps over the lazy dog while a small cat watches "
     "from the old wooden fence ").split() * 200
print(json.dumps({"prompt": " ".join(w[:int(sys.argv[1])]), "max_tokens": 4, "temperature": 0}))
PY
echo "+ $LMSERV serve -m $M --port $PORT -t $T --parallel $N -c 4096"
"$LMSERV" serve -m "$M" --port "$PORT" -t "$T" --parallel "$N" -c 4096 >"$D/log" 2>&1 &
SRV=$!
for _ in $(seq 120); do
    curl -s "localhost:$PORT/health" | grep -q '"ok"' && break
    sleep 0.5
done
t0=$(date +%s.%N)
pids=()
for _ in $(seq "$N"); do
    curl -s "localhost:$PORT/v1/completions" -H 'Content-Type: application/json' \
        -d @"$D/body.json" >/dev/null &
    pids+=($!)
done
wait "${pids[@]}"
t1=$(date +%s.%N)
python3 - "$D/log" "$t0" "$t1" "$N" <<'PY'
import json, sys
ends = [json.loads(l) for l in open(sys.argv[1]) if '"request_end"' in l]
for e in ends:
    print(f"request: prompt {e['prompt_tokens']} tokens, {e['cached_tokens']} cached, "
          f"TTFT {e['ttft_ms']:.0f} ms")
print(f"{sys.argv[4]} requests answered in {float(sys.argv[3]) - float(sys.argv[2]):.1f} s")
PY
