#!/usr/bin/env bash
# test_ws.sh - both WebSocket dialects with npm `ws` (tests/e2e/ws.mjs).
. "$(dirname "$0")/lib.sh" || exit 1
need_node
# the GPU part of the metrics broadcast runs on the fake NVML when it was built
FAKE_GPU=0
FAKE_NVML="$(dirname "$LMSERV")/tests/libfake_nvml.so"
if [ -f "$FAKE_NVML" ]; then
    export LMS_NVML_LIB="$FAKE_NVML" FAKE_GPU=1
fi
start_server -c 512 --api-key ws-key --max-body 65536
PORT="$PORT" API_KEY=ws-key MAX_FRAME=65536 FAKE_GPU=$FAKE_GPU node "$E2E_DIR/ws.mjs" || die "ws.mjs failed"
kill -0 "$SRV_PID" || die "the server died"
stop_server
[ "$SRV_RC" -eq 0 ] || die "exit status $SRV_RC after SIGTERM"

# while the model loads: hello says "loading", infer is refused, then a
# second hello says "ready"
LMSERV_DEBUG_LOAD_DELAY_MS=1500 NO_WAIT=1 start_server -c 512
cd "$E2E_DIR" && PORT="$PORT" node --input-type=module -e '
import { Client } from "./wsclient.mjs";
const c = await Client.open(`ws://127.0.0.1:${process.env.PORT}/ws`);
const h1 = await c.next((m) => m.op === "hello");
c.send({ op: "infer", prompt: "x" });
const e = await c.next((m) => m.op === "error");
const h2 = await c.next((m) => m.op === "hello", 10000);
const ok = h1.status === "loading" && /loading/.test(e.message) && h2.status === "ready";
console.log(ok ? "loading hello ok" : `loading hello FAILED ${JSON.stringify([h1, e, h2])}`);
c.close();
process.exit(ok ? 0 : 1);' || die "hello while loading"
stop_server
echo "test_ws.sh: ok"
