#!/usr/bin/env bash
# Embedding throughput: one /v1/embeddings request of N short inputs, with
# the encoder taking the queued inputs one pass each (LMS_ENC_BATCH=1) and
# together (the default), three timings each, and whether the vectors agree.
#
#   bench/embed.sh MODEL.gguf [THREADS] [N_INPUTS]
#   e.g. lmserv synth --shape bge-small --type F16 bge.gguf; bench/embed.sh bge.gguf 2 64
set -euo pipefail
LMSERV=${LMSERV:-./build/lmserv}
M=$1; T=${2:-$(nproc)}; N=${3:-64}
PORT=${PORT:-18598}
BODY=/tmp/lmserv-bench-embed.json
python3 - "$N" >"$BODY" <<'PY'
import json, sys
words = "the quick brown fox jumps over a lazy dog while cats sleep in warm sun".split()
n = int(sys.argv[1])
print(json.dumps({"input": [" ".join(words[(i * 3) % 10:(i * 3) % 10 + 6]) + f" item {i}" for i in range(n)]}))
PY
for eb in 1 64; do
    cmd=("$LMSERV" serve -m "$M" --host 127.0.0.1 --port "$PORT" -t "$T")
    echo "+ LMS_ENC_BATCH=$eb ${cmd[*]}"
    LMS_ENC_BATCH=$eb "${cmd[@]}" >/tmp/lmserv-bench-embed.log 2>&1 &
    PID=$!
    for _ in $(seq 200); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.1; done
    curl -s "http://127.0.0.1:$PORT/v1/embeddings" -d @"$BODY" >/dev/null # warm-up
    for rep in 1 2 3; do
        s=$(curl -s -o "/tmp/lmserv-bench-embed-$eb.out" -w '%{time_total}' "http://127.0.0.1:$PORT/v1/embeddings" -d @"$BODY")
        echo "  POST /v1/embeddings, $N inputs: $s s"
    done
    kill $PID; wait $PID 2>/dev/null || true
done
python3 - <<'PY'
import json
a, b = (json.load(open(f"/tmp/lmserv-bench-embed-{eb}.out"))["data"] for eb in (1, 64))
print("max |difference| between the two:", max(abs(x - y) for p, q in zip(a, b) for x, y in zip(p["embedding"], q["embedding"])))
PY
