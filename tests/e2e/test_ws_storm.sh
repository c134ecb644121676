#!/usr/bin/env bash
# test_ws_storm.sh - 64 simultaneous WebSocket clients, a third misbehaving
# (tests/e2e/storm.mjs); the server must stay up, serve every well-formed
# request completely, and return to its idle KV level.
. "$(dirname "$0")/lib.sh" || exit 1
need_node
start_server -c 512 --parallel 8 --queue 256
# under AddressSanitizer freed memory sits in quarantine: RSS says nothing
RSS_CHECK=1
ldd "$LMSERV" 2>/dev/null | grep -q libasan && RSS_CHECK=0
PORT="$PORT" PID="$SRV_PID" RSS_CHECK=$RSS_CHECK node "$E2E_DIR/storm.mjs" || die "storm.mjs failed"
kill -0 "$SRV_PID" || die "the server died"
stop_server
[ "$SRV_RC" -eq 0 ] || die "exit status $SRV_RC after SIGTERM"
echo "test_ws_storm.sh: ok"
