#!/usr/bin/env bash
# test_fuzz_requests.sh - the deterministic short mode of fuzz_requests.py: the
# inputs that once crashed or wedged the server, then 600 mutated requests from a
# fixed seed to every HTTP route and both WebSocket dialects. Fails if the
# server dies (or its log holds a sanitizer report), a request or GET /health
# goes unanswered for 120 s (a slow sanitizer build under load is not a hang),
# or a response is malformed: an error that is not
# JSON naming it, a 5xx for a client's mistake, broken framing.
. "$(dirname "$0")/lib.sh" || exit 1
command -v python3 >/dev/null || skip "python3 is not installed"

T=$(mktemp -d /tmp/lmserv-fuzz.XXXXXX)
trap 'cleanup; rm -rf "$T"' EXIT
# two adapters in --lora-dir, one of them loaded, for the LoRA routes and the
# WebSocket's load_adapter
mkdir "$T/ad"
for s in 1 2; do
    "$LMSERV" synth --lora-for "$MODEL" --rank 8 --strength 4 --seed "$s" "$T/ad/a$s.gguf" \
        >/dev/null 2>&1 || die "synth --lora-for failed"
done
# -n 32 and a small context bound every generation, so that the time goes to
# many requests rather than to a few long replies
start_server --parallel 4 -c 256 -n 32 --lora "$T/ad/a1.gguf" --lora-init-without-apply \
    --lora-dir "$T/ad"
python3 "$E2E_DIR/fuzz_requests.py" --port "$PORT" --pid "$SRV_PID" --log "$LOG" \
    --regress --count "${FUZZ_COUNT:-600}" --timeout 120
# a wedged server may not stop on SIGTERM either: die (cleanup kills it)
[ $? -eq 0 ] || die "fuzz_requests.py failed (seed 20261127)"
check "the server is still up" kill -0 "$SRV_PID"
stop_server
check "the server stops cleanly after the fuzzing (exit $SRV_RC)" [ "$SRV_RC" -eq 0 ]
finish
