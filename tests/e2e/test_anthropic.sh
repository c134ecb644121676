#!/usr/bin/env bash
# test_anthropic.sh - the official @anthropic-ai/sdk npm client
# (tests/e2e/anthropic.mjs) against a server with an API key.
. "$(dirname "$0")/lib.sh" || exit 1
need_node
[ -d "$E2E_DIR/node_modules/@anthropic-ai/sdk" ] || skip "@anthropic-ai/sdk is not installed"
start_server -c 512 --api-key e2e-key
BASE="$BASE" API_KEY=e2e-key node "$E2E_DIR/anthropic.mjs" || die "anthropic.mjs failed"
stop_server
[ "$SRV_RC" -eq 0 ] || die "exit status $SRV_RC after SIGTERM"
echo "test_anthropic.sh: ok"
