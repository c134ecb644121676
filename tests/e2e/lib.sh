# lib.sh - shared by the e2e shell tests (sourced, not a test itself).
#
# Environment (set by CTest, see tests/CMakeLists.txt):
#   LMSERV        the lmserv binary
#   LMS_TESTDATA  shared test data (models/stories260K.gguf)
#
# start_server [flags...]  starts `lmserv serve -m $MODEL` on 127.0.0.1 with a port the
#                          kernel picks (--port 0; read back from its log),
#                          sets SRV_PID, PORT, BASE, LOG, and waits for
#                          /health 200 (unless NO_WAIT=1).
# start_serve ARGS...      the same with the model choice in ARGS (--config FILE).
# stop_server              SIGTERM, waits, sets SRV_RC.
# need_node                node + the npm packages of package.json, or SKIP.
# check COND_DESC CMD...   runs CMD; counts a pass or a failure.
#
# A test that cannot run here prints "SKIP: reason" and exits 0.

set -u
: "${LMSERV:?LMSERV must name the lmserv binary}"
: "${LMS_TESTDATA:?LMS_TESTDATA must name the shared test data}"

E2E_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MODEL="$LMS_TESTDATA/models/stories260K.gguf"
SRV_PID=""
LOG=""
N_PASS=0
N_FAIL=0

skip() { echo "SKIP: $*"; exit 0; }

# Helpers of the curl tests (they set T to their scratch folder):
# py FILE EXPR   evaluates EXPR with d = the JSON in FILE; prints the result
# eq GOT WANT    string equality that says what it got
# req METHOD PATH [curl args...]   body in $T/out, status in $T/code; code prints it
py() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$@" 2>/dev/null; }
eq() { [ "$1" = "$2" ] || { echo "    got '$1', want '$2'"; return 1; }; }
req() {
    local m=$1 p=$2
    shift 2
    curl -s -X "$m" -o "$T/out" -w '%{http_code}' "$BASE$p" "$@" >"$T/code"
}
code() { cat "$T/code"; }

[ -f "$MODEL" ] || skip "no $MODEL"
command -v curl >/dev/null || skip "curl is not installed"

cleanup() {
    if [ -n "$SRV_PID" ] && kill -0 "$SRV_PID" 2>/dev/null; then
        kill -KILL "$SRV_PID" 2>/dev/null
        wait "$SRV_PID" 2>/dev/null
    fi
    [ -n "$LOG" ] && [ -z "${KEEP_LOG:-}" ] && rm -f "$LOG"
    return 0
}
trap cleanup EXIT

die() {
    echo "FAIL: $*"
    if [ -n "$LOG" ] && [ -f "$LOG" ]; then
        echo "---- server log (tail) ----"
        tail -40 "$LOG"
    fi
    exit 1
}

check() {
    local desc=$1
    shift
    if "$@"; then
        N_PASS=$((N_PASS + 1))
    else
        N_FAIL=$((N_FAIL + 1))
        echo "  not ok: $desc"
    fi
}

finish() {
    echo "$(basename "$0"): $N_PASS passed, $N_FAIL failed"
    [ "$N_FAIL" -eq 0 ] || die "$N_FAIL checks failed"
    exit 0
}

start_server() {
    start_serve -m "$MODEL" "$@"
}

# start_serve ARGS...: start_server with the whole model choice given
# (--config FILE, or -m another model).
start_serve() {
    [ -n "$LOG" ] && [ -z "${KEEP_LOG:-}" ] && rm -f "$LOG" # a previous server's
    LOG=$(mktemp /tmp/lmserv-e2e.XXXXXX)
    "$LMSERV" serve --host 127.0.0.1 --port 0 "$@" >"$LOG" 2>&1 &
    SRV_PID=$!
    PORT=""
    for _ in $(seq 100); do
        PORT=$(sed -n 's|.*"server_listening".*"url":"http://127\.0\.0\.1:\([0-9]*\)".*|\1|p' "$LOG" | head -1)
        [ -n "$PORT" ] && break
        kill -0 "$SRV_PID" 2>/dev/null || die "the server exited at start"
        sleep 0.05
    done
    [ -n "$PORT" ] || die "the server did not report its port"
    BASE="http://127.0.0.1:$PORT"
    [ "${NO_WAIT:-0}" = 1 ] || wait_ready
}

wait_ready() {
    for _ in $(seq 200); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' "$BASE/health")" = 200 ] && return 0
        kill -0 "$SRV_PID" 2>/dev/null || die "the server died while loading"
        sleep 0.05
    done
    die "the server did not become ready"
}

stop_server() {
    kill -TERM "$SRV_PID"
    wait "$SRV_PID"
    SRV_RC=$?
    SRV_PID=""
}

node_modules_ok() {
    local p
    for p in openai ws playwright-core @anthropic-ai/sdk; do
        [ -d "$E2E_DIR/node_modules/$p" ] || return 1
    done
}

need_node() {
    command -v node >/dev/null || skip "node is not installed"
    command -v npm >/dev/null || skip "npm is not installed"
    if ! node_modules_ok; then
        # one installer at a time when tests run in parallel
        (
            flock 9
            if ! node_modules_ok; then
                cd "$E2E_DIR" && npm ci --no-audit --no-fund --loglevel=error >/dev/null 2>&1
            fi
        ) 9>/tmp/lmserv-e2e-npm.lock || skip "npm ci failed (no registry?)"
        [ -d "$E2E_DIR/node_modules/ws" ] || skip "npm packages are not installed"
    fi
}
