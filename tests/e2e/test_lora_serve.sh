#!/usr/bin/env bash
# LoRA adapters in the server (serve/api_lora.c): an adapter started with
# the model at scale 0 changes nothing until a request lists it ("lora":
# [{"id", "scale"}]), and then gives the same greedy text as `lmserv run
# --lora`; POST /lora-adapters sets the scales every request gets; adapters
# load and unload at run time from --lora-dir only (a path outside it is
# refused, one that does not exist is 404); the `type` WebSocket dialect's
# load_adapter / unload_adapter switch the connection's generations; loads
# run beside the other requests.
. "$(dirname "$0")/lib.sh"
need_node
MODEL=$LMS_TESTDATA/models/stories260K.gguf
T=$(mktemp -d)
trap 'cleanup; rm -rf "$T"' EXIT
mkdir -p "$T/ad" "$T/elsewhere"
for s in 1 2; do
    "$LMSERV" synth --lora-for "$MODEL" --rank 8 --strength 4 --seed "$s" "$T/ad/a$s.gguf" \
        >/dev/null 2>&1 || die "synth --lora-for failed"
done
cp "$T/ad/a2.gguf" "$T/elsewhere/c.gguf"
ln -s "$T/elsewhere/c.gguf" "$T/ad/link.gguf"

PROMPT="Once upon a time"
cli() { "$LMSERV" run -m "$MODEL" -p "$PROMPT" -n 12 --temp 0 -t 1 -c 256 "$@" 2>/dev/null; }
BASE_TXT=$(cli)
LORA_TXT=$(cli --lora "$T/ad/a1.gguf")
check "the adapter changes the greedy text" [ "$BASE_TXT" != "$LORA_TXT" ]

start_server -c 256 -t 1 --lora "$T/ad/a1.gguf" --lora-init-without-apply --lora-dir "$T/ad"
complete() { # body extra -> the completion text
    req POST /v1/completions -H 'Content-Type: application/json' \
        -d "{\"prompt\":\"$PROMPT\",\"max_tokens\":12,\"temperature\":0$1}"
    py "$T/out" 'd["choices"][0]["text"]'
}

req GET /lora-adapters
check "listed, id 0, scale 0" eq "$(code) $(py "$T/out" '[(a["id"], a["scale"], a["rank"]) for a in d]')" \
    "200 [(0, 0.0, 8)]"
check "scale 0: the base model's text" eq "$(complete '')" "$BASE_TXT"
check "a request listing it: run --lora's text" eq "$(complete ',"lora":[{"id":0,"scale":1}]')" "$LORA_TXT"
check "and again (no cached blocks shared with the base)" eq "$(complete ',"lora":[{"id":0}]')" "$LORA_TXT"
check "after it, the base again" eq "$(complete '')" "$BASE_TXT"

req POST /lora-adapters -H 'Content-Type: application/json' -d '[{"id":0,"scale":1}]'
check "global scale set (llama-server's array form)" eq "$(code) $(py "$T/out" 'd[0]["scale"]')" "200 1.0"
check "requests naming none now get it" eq "$(complete '')" "$LORA_TXT"
check "a request may still turn it off" eq "$(complete ',"lora":[]')" "$BASE_TXT"

req POST /v1/completions -d "{\"prompt\":\"x\",\"max_tokens\":1,\"lora\":[{\"id\":7}]}"
check "unknown id refused, naming the field" eq "$(code) $(py "$T/out" 'd["error"]["param"]')" "400 lora[0]"
req POST /v1/completions -d "{\"prompt\":\"x\",\"max_tokens\":1,\"lora\":{\"id\":0}}"
check "lora must be an array" eq "$(code)" "400"

req POST /lora-adapters/load -d '{"path":"a2.gguf"}'
check "run-time load from the folder" eq "$(code) $(py "$T/out" '(d["id"], d["scale"])')" "200 (1, 0.0)"
A2_TXT=$(complete ',"lora":[{"id":1,"scale":1}]')
check "the second adapter gives another text" [ "$A2_TXT" != "$LORA_TXT" -a "$A2_TXT" != "$BASE_TXT" ]
check "two adapters at once differ from each alone" \
    [ "$(complete ',"lora":[{"id":0},{"id":1}]')" != "$A2_TXT" ]
req POST /lora-adapters/load -d "{\"path\":\"$T/elsewhere/c.gguf\"}"
check "a path outside the folder: 403" eq "$(code)" "403"
req POST /lora-adapters/load -d '{"path":"../elsewhere/c.gguf"}'
check "climbing out: 403" eq "$(code)" "403"
req POST /lora-adapters/load -d '{"path":"link.gguf"}'
check "a link leading out: 403" eq "$(code)" "403"
req POST /lora-adapters/load -d '{"path":"nope.gguf"}'
check "missing file: 404" eq "$(code)" "404"
printf 'GGUF junk' >"$T/ad/bad.gguf"
req POST /lora-adapters/load -d '{"path":"bad.gguf"}'
check "not an adapter: 400 with the reason" eq "$(code) $(py "$T/out" '"bad.gguf" in d["error"]["message"]')" "400 True"
req POST /lora-adapters/unload -d '{"id":1}'
check "unloaded" eq "$(code) $(py "$T/out" 'd["unloaded"]')" "200 True"
req GET /lora-adapters
check "listed no more" eq "$(py "$T/out" '[a["id"] for a in d]')" "[0]"
req POST /v1/completions -d "{\"prompt\":\"x\",\"max_tokens\":1,\"lora\":[{\"id\":1}]}"
check "its id is refused" eq "$(code)" "400"

# the type dialect: the connection's adapter
R=$(cd "$E2E_DIR" && PORT="$PORT" timeout 60 node --input-type=module -e '
import { Client } from "./wsclient.mjs";
const c = await Client.open(`ws://127.0.0.1:${process.env.PORT}/ws`);
const out = [];
const step = async (msg, want) => {
    c.send(JSON.stringify(msg));
    const m = await c.next((j) => want.includes(j.type));
    out.push(m.type === "done" ? "done:" + m.content : m.type);
};
const gen = {type: "generate", max_tokens: 12, temperature: 0, messages: [{role: "user", content: "Hi"}]};
await step(gen, ["done", "error"]);
await step({type: "load_adapter", adapter_path: "a2.gguf"}, ["adapter_loaded", "error"]);
await step(gen, ["done", "error"]);
await step({type: "load_adapter", adapter_path: "../elsewhere/c.gguf"}, ["adapter_loaded", "error"]);
await step({type: "unload_adapter"}, ["adapter_unloaded", "error"]);
await step(gen, ["done", "error"]);
console.log(JSON.stringify(out));
c.close();
')
check "ws: loaded, refused outside, unloaded" eq \
    "$(python3 -c 'import json,sys; print([x for x in json.loads(sys.argv[1]) if not x.startswith("done:")])' "$R")" \
    "['adapter_loaded', 'error', 'adapter_unloaded']"
check "ws: the adapter changes the session's text, unloading restores it" python3 -c '
import json, sys
d = [x for x in json.loads(sys.argv[1]) if x.startswith("done:")]
sys.exit(0 if len(d) == 3 and d[0] == d[2] and d[0] != d[1] else 1)' "$R"

stop_server
check "clean stop" eq "$SRV_RC" "0"

# run-time loads read the file on a thread of their own (held 2.5 s each
# here): other clients are answered meanwhile, two loads run side by side,
# a client that leaves first gets no entry, a WebSocket connection's ping
# is answered before its load_adapter, a stop waits for a load
LMSERV_DEBUG_LORA_DELAY_MS=2500 start_server -c 256 -t 1 --lora-dir "$T/ad"
load_bg() { # name path: POST /lora-adapters/load in the background
    curl -s -o "$T/$1.out" -w '%{http_code}' -X POST "$BASE/lora-adapters/load" \
        -d "{\"path\":\"$2\"}" "${@:3}" >"$T/$1.code"
}
seen() { # event n: wait until the server has logged event n times
    for _ in $(seq 200); do
        [ "$(grep -c "\"$1\"" "$LOG")" -ge "$2" ] && return 0
        sleep 0.05
    done
    return 1
}
load_bg l1 a1.gguf & L1=$!
load_bg l2 a2.gguf & L2=$!
check "two loads begin" seen lora_load_begin 2
req GET /health
check "health answers while they load" eq "$(code) $(cat "$T/l1.code" "$T/l2.code" 2>/dev/null)" "200 "
wait "$L1" "$L2"
check "then both loads answer" eq "$(cat "$T/l1.code") $(cat "$T/l2.code")" "200 200"
req GET /lora-adapters
check "both listed" eq "$(py "$T/out" 'sorted(a["path"].split("/")[-1] for a in d)')" "['a1.gguf', 'a2.gguf']"
load_bg gone a1.gguf --max-time 0.5
check "a client that leaves before its load ends" seen lora_load_begin 3
check "leaves it unanswered" seen lora_load_dropped 1
req GET /lora-adapters
check "gets no entry" eq "$(code) $(py "$T/out" 'len(d)')" "200 2"
R=$(cd "$E2E_DIR" && PORT="$PORT" timeout 60 node --input-type=module -e '
import { Client } from "./wsclient.mjs";
const c = await Client.open(`ws://127.0.0.1:${process.env.PORT}/ws`);
const answer = (j) => ["pong", "adapter_loaded", "error"].includes(j.type);
c.send({type: "load_adapter", adapter_path: "a1.gguf"});
c.send({type: "ping"});
const first = await c.next(answer), second = await c.next(answer);
console.log(first.type, second.type);
c.close();
')
check "ws: a ping is answered while load_adapter reads its file" eq "$R" "pong adapter_loaded"
load_bg last a2.gguf & L3=$!
check "a load runs when the server is told to stop" seen lora_load_begin 5
stop_server
wait "$L3"
check "the stop waits for it: answered, clean exit" eq "$(cat "$T/last.code") $SRV_RC" "200 0"

# a configuration's experts list their adapters ("lora": paths or {path, scale})
cp "$MODEL" "$T/m.gguf"
cat >"$T/cfg.json" <<JSON
{"experts": [{"expert_id": "story", "model_path": "m.gguf",
              "lora": ["ad/a1.gguf", {"path": "ad/a2.gguf", "scale": 0}]}]}
JSON
start_serve --config "$T/cfg.json" -c 256 -t 1
req GET /lora-adapters
check "config adapters listed with their scales" eq "$(py "$T/out" '[(a["id"], a["scale"]) for a in d]')" \
    "[(0, 1.0), (1, 0.0)]"
check "the expert applies its scale-1 adapter" eq "$(complete '')" "$LORA_TXT"
stop_server
printf '{"experts":[{"expert_id":"s","model_path":"m.gguf","lora":["ad/none.gguf"]}]}' >"$T/bad.json"
"$LMSERV" serve --config "$T/bad.json" --port 0 >"$T/bad.out" 2>&1
check "a missing adapter in the config stops serve, naming the field" \
    grep -q 'experts\[0\].lora\[0\].path' "$T/bad.out"
"$LMSERV" serve --config "$T/cfg.json" --lora "$T/ad/a1.gguf" --port 0 >"$T/bad.out" 2>&1
check "--lora with --config refused" grep -q -- "--lora goes with -m" "$T/bad.out"
finish
