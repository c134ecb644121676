#!/usr/bin/env bash
# test_shutdown.sh - SIGTERM while streams run: new connections are
# refused, every running or queued stream still ends with [DONE] (finished,
# or an error event once the grace period is over), and the server exits 0.
# A second SIGTERM cuts the rest short and still exits 0.
. "$(dirname "$0")/lib.sh" || exit 1

T=$(mktemp -d /tmp/lmserv-shutdown.XXXXXX)
trap 'cleanup; rm -rf "$T"' EXIT
BODY='{"prompt":"Once upon a time","max_tokens":480,"temperature":0.8,"stream":true,"ignore_eos":true}'

streams() { # starts N streams into $T/s.I, pids in CURLS
    CURLS=""
    for i in $(seq "$1"); do
        curl -s -N "$BASE/v1/completions" -d "$BODY" >"$T/s.$i" &
        CURLS="$CURLS $!"
    done
    for _ in $(seq 400); do # until the first stream is under way
        grep -q '^data: ' "$T/s.1" 2>/dev/null && break
        sleep 0.01
    done
    # and the server holds every stream (running, queued or done): on a
    # loaded machine the later curls may not have connected yet
    for _ in $(seq 400); do
        held=$(curl -s "$BASE/metrics" |
            awk '/^lmserv_num_requests_(running|waiting) /{s+=$2} END{print s+0}')
        for i in $(seq "$1"); do
            grep -q '^data: \[DONE\]' "$T/s.$i" 2>/dev/null && held=$((held + 1))
        done
        [ "$held" -ge "$1" ] && return 0
        sleep 0.01
    done
}

# ---- graceful: everything accepted finishes --------------------------------------
start_server -c 512 --parallel 1 --grace 120
streams 4
kill -TERM "$SRV_PID"
sleep 0.05
refused=$(curl -s -o /dev/null -w '%{http_code}' "$BASE/health")
check "a new connection is refused while draining ($refused)" [ "$refused" != 200 ]
wait $CURLS
for i in 1 2 3 4; do
    check "stream $i ends with [DONE]" [ "$(grep '^data: ' "$T/s.$i" | tail -1)" = "data: [DONE]" ]
    check "stream $i has a finish_reason" grep -q '"finish_reason":"length"' "$T/s.$i"
done
wait "$SRV_PID"
SRV_RC=$?
SRV_PID=""
check "exit 0 after draining" [ "$SRV_RC" -eq 0 ]

# ---- the grace period runs out: the rest is cut short, still exit 0 ---------------------
start_server -c 512 --parallel 1 --grace 0.3
streams 6
t0=$(date +%s%N)
kill -TERM "$SRV_PID"
wait "$SRV_PID"
SRV_RC=$?
SRV_PID=""
ms=$((($(date +%s%N) - t0) / 1000000))
wait $CURLS
check "exit 0 after the grace period" [ "$SRV_RC" -eq 0 ]
check "the grace period bounds the wait (${ms} ms)" [ "$ms" -lt 4000 ]
for i in 1 2 3 4 5 6; do # finished, or told "shutting down"; never cut
    check "stream $i still ends with [DONE]" [ "$(grep '^data: ' "$T/s.$i" | tail -1)" = "data: [DONE]" ]
done

# ---- a second signal stops at once ---------------------------------------------------
start_server -c 512 --parallel 1 --grace 60
streams 4
kill -TERM "$SRV_PID"
sleep 0.05
kill -TERM "$SRV_PID" 2>/dev/null
t0=$(date +%s)
wait "$SRV_PID"
SRV_RC=$?
SRV_PID=""
wait $CURLS
check "exit 0 after a second SIGTERM" [ "$SRV_RC" -eq 0 ]
check "the second SIGTERM does not wait for the grace period" [ $(($(date +%s) - t0)) -lt 10 ]

finish
