#!/usr/bin/env bash
# test_web.sh - the built-in web page in a real browser (tests/e2e/web.mjs),
# against a server with an API key and a LoRA adapter.
. "$(dirname "$0")/lib.sh" || exit 1
CHROMIUM=$(command -v chromium || command -v chromium-browser) || skip "chromium is not installed"
need_node
[ -d "$E2E_DIR/node_modules/playwright-core" ] || skip "playwright-core is not installed"
T=$(mktemp -d)
trap 'cleanup; rm -rf "$T"' EXIT
"$LMSERV" synth --lora-for "$MODEL" --rank 4 --strength 4 "$T/style.gguf" >/dev/null 2>&1 ||
    die "synth --lora-for failed"
# an adapter loaded but not applied (the playground offers it)
start_server -c 512 --api-key web-key --lora "$T/style.gguf" --lora-init-without-apply
BASE="$BASE" API_KEY=web-key CHROMIUM="$CHROMIUM" node "$E2E_DIR/web.mjs" || die "web.mjs failed"
stop_server
[ "$SRV_RC" -eq 0 ] || die "exit status $SRV_RC after SIGTERM"
echo "test_web.sh: ok"
