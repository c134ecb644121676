#!/usr/bin/env bash
# Operations end to end: a step that hangs (test-only fault hook) is caught
# by the watchdog, the request fails with an error, the engine restarts and
# the next request succeeds; thermal protection from a fake NVML marks
# /health degraded while still serving; JSON-lines log file with SIGHUP
# reopen; /slots showing a request's progress mid-way (the engine held by
# the same hook); the out-of-the-box default model.
. "$(dirname "$0")/lib.sh"
TMP=$(mktemp -d)
trap 'cleanup; rm -rf "$TMP"' EXIT

complete() { # prompt max_tokens -> prints "status body"
    curl -s -o "$TMP/body" -w '%{http_code}' "$BASE/v1/completions" \
        -H 'Content-Type: application/json' \
        -d "{\"prompt\":\"$1\",\"max_tokens\":$2,\"temperature\":0}"
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# --- watchdog: the 3rd engine step hangs ---------------------------------------
PORT=$(free_port)
BASE="http://127.0.0.1:$PORT"
LOG=$TMP/stderr.log
LMS_FAULT_HANG_STEP=3 "$LMSERV" serve -m "$MODEL" --host 127.0.0.1 --port "$PORT" --stall-ms 400 \
    --log-file "$TMP/srv.log" >"$LOG" 2>&1 &
SRV_PID=$!
wait_ready
code=$(complete "Once upon a time" 20)
check "hung request fails (got $code)" [ "$code" -ge 500 ]
check "error names the stall" grep -q "stalled" "$TMP/body"
code=$(complete "Once upon a time" 8)
check "next request succeeds (got $code)" [ "$code" = 200 ]
check "restart counted" sh -c "curl -s '$BASE/health' | grep -q '\"engine_restarts\": *1'"
# log file: every line is JSON; the stall and the restart are in it
check "log lines parse as JSON" python3 -c "
import json, sys
lines = open('$TMP/srv.log').read().splitlines()
events = [json.loads(l)['event'] for l in lines]
assert 'watchdog_stall' in events and 'engine_restarted' in events and 'request_end' in events, events
"
check "request log has client and tokens" python3 -c "
import json
ends = [json.loads(l) for l in open('$TMP/srv.log') if '\"request_end\"' in l]
e = ends[-1]
assert e['client'] and e['gen_tokens'] == 8 and 'ttft_ms' in e and 'tps' in e, e
"
check "no prompt text without --log-prompts" sh -c "! grep -q 'Once upon' '$TMP/srv.log'"
# SIGHUP reopens the log file (after logrotate moved it)
mv "$TMP/srv.log" "$TMP/srv.log.1"
kill -HUP "$SRV_PID"
sleep 0.2
complete "One day" 4 >/dev/null
check "SIGHUP reopened the log" grep -q request_end "$TMP/srv.log"
stop_server
check "clean exit after restart" [ "$SRV_RC" = 0 ]

# --- /slots mid-request: the engine held at its 4th step (the hook) shows a busy slot
PORT=$(free_port)
BASE="http://127.0.0.1:$PORT"
LMS_FAULT_HANG_STEP=4 "$LMSERV" serve -m "$MODEL" --host 127.0.0.1 --port "$PORT" --parallel 2 \
    >"$TMP/slots.log" 2>&1 &
SRV_PID=$!
wait_ready
curl -s -o /dev/null "$BASE/v1/completions" -d '{"prompt":"Once upon a time","max_tokens":20,"temperature":0}' &
BG=$!
busy=""
for _ in $(seq 100); do
    busy=$(curl -s "$BASE/slots" | python3 -c 'import json,sys; d=json.load(sys.stdin); s=d[0]; print(s["is_processing"], s["n_prompt_tokens"], s["next_token"][0]["has_next_token"], s["next_token"][0]["n_decoded"] + s["next_token"][0]["n_remain"], s["next_token"][0]["n_decoded"] >= 1, d[1]["is_processing"])')
    case "$busy" in "True 5 True 20 True False") break ;; esac
    sleep 0.05
done
check "/slots: the busy slot's prompt, tokens made and left (got '$busy')" [ "$busy" = "True 5 True 20 True False" ]
kill -KILL "$SRV_PID" "$BG" 2>/dev/null
wait "$SRV_PID" "$BG" 2>/dev/null
SRV_PID=""

# --- thermal protection from a (fake) hot GPU --------------------------------------
FAKE_NVML="$(dirname "$LMSERV")/tests/libfake_nvml.so"
if [ -f "$FAKE_NVML" ]; then
    LMS_NVML_LIB="$FAKE_NVML" FAKE_NVML_TEMP=86 start_server --thermal-limit 80 --log-prompts
    sleep 1.3 # one monitor tick
    check "hot GPU: /health degraded" sh -c "curl -s '$BASE/health' | grep -q '\"degraded\"'"
    check "hot GPU: thermal slow" sh -c "curl -s '$BASE/health' | grep -q '\"slow\"'"
    code=$(complete "Once upon a time" 6)
    check "hot GPU: still serving ($code)" [ "$code" = 200 ]
    check "--log-prompts logs the prompt" grep -q '"request_prompt".*Once upon a time' "$LOG"
    check "GPU temperature in /metrics" sh -c "curl -s '$BASE/metrics' | grep -q 'lmserv_gpu_temperature_celsius{gpu=\"0\"} 86'"
    stop_server
else
    echo "note: $FAKE_NVML not built; thermal e2e checks skipped"
fi

# --- no model: the default model is written and served ------------------------------
LOG=$TMP/default.log
XDG_CACHE_HOME=$TMP/cache "$LMSERV" serve --host 127.0.0.1 --port 0 >"$LOG" 2>&1 &
SRV_PID=$!
for _ in $(seq 200); do
    PORT=$(sed -n 's|.*"server_listening".*"url":"http://127\.0\.0\.1:\([0-9]*\)".*|\1|p' "$LOG" | head -1)
    [ -n "$PORT" ] && break
    sleep 0.05
done
BASE="http://127.0.0.1:$PORT"
wait_ready
check "default model written" [ -f "$TMP/cache/lmserv/default-tiny.gguf" ]
code=$(complete "hello" 5)
check "default model serves ($code)" [ "$code" = 200 ]
stop_server
finish
