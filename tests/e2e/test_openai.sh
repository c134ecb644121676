#!/usr/bin/env bash
# test_openai.sh - the official openai npm client (tests/e2e/openai.mjs)
# against a server with an API key.
. "$(dirname "$0")/lib.sh" || exit 1
need_node
start_server -c 512 --api-key e2e-key
BASE="$BASE" API_KEY=e2e-key node "$E2E_DIR/openai.mjs" || die "openai.mjs failed"
stop_server
[ "$SRV_RC" -eq 0 ] || die "exit status $SRV_RC after SIGTERM"
echo "test_openai.sh: ok"
