#!/usr/bin/env bash
# idle_cpu.sh - how much CPU an idle server burns.
#
# Starts the given command (normally `lmserv serve -m MODEL`), waits for it
# to settle, then measures the CPU time the process (all its threads) uses
# over an idle window and prints it in milliseconds per idle minute. The
# budget from issue 6 is < 10 ms per idle minute: no thread may spin or poll
# fast while there are no requests.
#
# Usage:
#   bench/idle_cpu.sh COMMAND [ARGS...]
#   bench/idle_cpu.sh build/lmserv serve -m model.gguf --port 8090
#
# Environment:
#   IDLE_SECONDS=60     length of the measured window
#   IDLE_WARMUP_S=10    settle time after start (and after IDLE_READY_URL)
#   IDLE_READY_URL=...  if set, wait until this URL answers 200 first
#                       (e.g. http://127.0.0.1:8090/health); needs curl
#   IDLE_MAX_MS=10      budget per idle minute; exit status 1 when over
#   IDLE_LOG=FILE       where the command's output goes (default: a temp file)
#
# Two measures are printed: utime+stime from /proc/PID/stat (what `top`
# sees; only clock-tick resolution, usually 10 ms) and the sum of the
# threads' on-CPU time from /proc/PID/task/*/schedstat (nanoseconds), plus
# the threads' voluntary context switches (wake-ups) per minute. The verdict
# uses schedstat when the kernel provides it, else utime+stime.
set -euo pipefail

if [ $# -eq 0 ]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 2
fi

IDLE_SECONDS=${IDLE_SECONDS:-60}
IDLE_WARMUP_S=${IDLE_WARMUP_S:-10}
IDLE_MAX_MS=${IDLE_MAX_MS:-10}
IDLE_LOG=${IDLE_LOG:-$(mktemp /tmp/idle_cpu.XXXXXX.log)}
TICK=$(getconf CLK_TCK)

# utime + stime of the whole process, in clock ticks. The command name in
# field 2 may hold spaces, so fields are counted after its closing ')'.
cpu_ticks() {
    local rest
    rest=$(sed 's/^.*) //' "/proc/$1/stat")
    awk '{ print $12 + $13 }' <<<"$rest"
}

# Sum over threads of on-CPU nanoseconds (first schedstat field), or -1.
sched_ns() {
    local total=0 f v
    for f in /proc/"$1"/task/*/schedstat; do
        [ -r "$f" ] || { echo -1; return; }
        read -r v _ <"$f" || { echo -1; return; }
        total=$((total + v))
    done
    echo "$total"
}

# Sum over threads of voluntary context switches.
wakeups() {
    cat /proc/"$1"/task/*/status 2>/dev/null |
        awk '/^voluntary_ctxt_switches:/ { n += $2 } END { print n + 0 }'
}

alive() {
    kill -0 "$1" 2>/dev/null
}

PID=""
# shellcheck disable=SC2317 # runs from the EXIT trap
cleanup() {
    if [ -n "$PID" ] && alive "$PID"; then
        kill -TERM "$PID" 2>/dev/null || true
        for _ in $(seq 50); do alive "$PID" || break; sleep 0.2; done
        if alive "$PID"; then kill -KILL "$PID" 2>/dev/null || true; fi
    fi
}
trap cleanup EXIT

echo "command: $*"
"$@" >"$IDLE_LOG" 2>&1 &
PID=$!
echo "pid: $PID (output in $IDLE_LOG)"

if [ -n "${IDLE_READY_URL:-}" ]; then
    for _ in $(seq 600); do
        alive "$PID" || break
        curl -fs -o /dev/null "$IDLE_READY_URL" && break
        sleep 0.5
    done
fi
sleep "$IDLE_WARMUP_S"
if ! alive "$PID"; then
    wait "$PID" && rc=0 || rc=$?
    echo "error: the command exited (status $rc) before the idle window; last output:" >&2
    tail -n 20 "$IDLE_LOG" >&2
    exit 2
fi

t0=$(cpu_ticks "$PID")
s0=$(sched_ns "$PID")
w0=$(wakeups "$PID")
sleep "$IDLE_SECONDS"
if ! alive "$PID"; then
    echo "error: the command exited during the idle window" >&2
    exit 2
fi
t1=$(cpu_ticks "$PID")
s1=$(sched_ns "$PID")
w1=$(wakeups "$PID")
tasks=(/proc/"$PID"/task/*)
threads=${#tasks[@]}

report=$(awk -v t0="$t0" -v t1="$t1" -v s0="$s0" -v s1="$s1" -v w0="$w0" -v w1="$w1" \
    -v tick="$TICK" -v secs="$IDLE_SECONDS" -v max="$IDLE_MAX_MS" '
    BEGIN {
        per_min = 60 / secs
        tick_ms = (t1 - t0) * 1000 / tick
        printf "cpu (utime+stime, %g ms ticks): %.0f ms in %d s = %.1f ms per idle minute\n",
            1000 / tick, tick_ms, secs, tick_ms * per_min
        use = tick_ms * per_min
        if (s0 >= 0 && s1 >= 0) {
            ns_ms = (s1 - s0) / 1e6
            printf "cpu (schedstat, ns):          %.3f ms in %d s = %.3f ms per idle minute\n",
                ns_ms, secs, ns_ms * per_min
            use = ns_ms * per_min
        }
        printf "wake-ups (voluntary context switches): %.1f per idle minute\n", (w1 - w0) * per_min
        printf "budget: %g ms per idle minute -> %s\n", max, use < max ? "PASS" : "FAIL"
        exit use < max ? 0 : 1
    }') && verdict=0 || verdict=$?
echo "threads: $threads"
echo "$report"
exit "$verdict"
