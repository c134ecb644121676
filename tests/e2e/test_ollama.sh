#!/usr/bin/env bash
# test_ollama.sh - the Ollama API with curl: version, tags, ps, show,
# pull (and the model management lmserv leaves out), embed, chat and
# generate streamed as NDJSON and not, options, format "json", errors.
. "$(dirname "$0")/lib.sh" || exit 1
command -v python3 >/dev/null || skip "python3 is not installed"

T=$(mktemp -d /tmp/lmserv-ollama.XXXXXX)
trap 'cleanup; rm -rf "$T"' EXIT

# loaded_after N: the models /api/ps lists once none is, or after N looks 50 ms apart
loaded_after() {
    local n=1
    for _ in $(seq "$1"); do
        req GET /api/ps
        n=$(py "$T/out" 'len(d["models"])')
        [ "$n" = 0 ] && break
        sleep 0.05
    done
    echo "$n"
}

start_server -c 512
req GET /api/version
check "version 200" eq "$(code)" 200
req GET /api/tags
check "tags lists the model as name:latest" eq "$(py "$T/out" 'd["models"][0]["name"]')" "stories260K:latest"
check "tags details say gguf" eq "$(py "$T/out" 'd["models"][0]["details"]["format"]')" gguf
req GET /api/ps
check "ps lists the loaded model" eq "$(py "$T/out" 'len(d["models"])')" 1
req POST /api/show -d '{"model":"stories260K:latest"}'
check "show gives the context length" eq "$(py "$T/out" 'd["model_info"]["llama.context_length"]')" 128
# model management: pull of a served model succeeds as for one already present
req POST /api/pull -d '{"model":"stories260K:latest","stream":false}'
check "pull of a served model: success" eq "$(code) $(py "$T/out" 'd["status"]')" "200 success"
req POST /api/pull -d '{"model":"stories260K"}'
check "pull streamed: one NDJSON success line" eq "$(code) $(python3 -c 'import json,sys; print([json.loads(l)["status"] for l in open(sys.argv[1])])' "$T/out")" "200 ['success']"
req POST /api/pull -d '{"model":"llama3.2:1b","stream":false}'
check "pull of another model: 404 saying lmserv does not download" eq "$(code) $(py "$T/out" '"does not download" in d["error"]')" "404 True"
# nothing to generate: Ollama's preload; with keep_alive 0 its unload (ollama stop)
req POST /api/generate -d '{"model":"stories260K"}'
check "generate without a prompt: loaded, done" eq "$(code) $(py "$T/out" '(d["done"], d["done_reason"], d["response"])')" "200 (True, 'load', '')"
req POST /api/chat -d '{"model":"stories260K","messages":[]}'
check "chat without messages: loaded, done" eq "$(code) $(py "$T/out" '(d["done_reason"], d["message"]["content"])')" "200 ('load', '')"
req POST /api/generate -d '{"model":"stories260K","keep_alive":0}'
check "keep_alive 0 without a prompt: unloaded" eq "$(code) $(py "$T/out" 'd["done_reason"]')" "200 unload"
check "ps: no model loaded after the unload" eq "$(loaded_after 50)" 0
req POST /api/generate -d '{"model":"stories260K","prompt":"Once","stream":false,"options":{"num_predict":4}}'
check "the next request loads it again" eq "$(code) $(py "$T/out" 'd["done"]')" "200 True"
req POST /api/generate -d '{"model":"nope","keep_alive":"0s"}'
check "unload of a model not served: 404" eq "$(code)" 404
# keep_alive with a generation: how long the model stays loaded after it
req POST /api/generate -d '{"model":"stories260K","prompt":"Once","stream":false,"keep_alive":"1h30m","options":{"num_predict":2}}'
req GET /api/ps
check "keep_alive 1h30m: ps says when it expires" eq "$(py "$T/out" '5390 <= (__import__("datetime").datetime.strptime(d["models"][0]["expires_at"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=__import__("datetime").timezone.utc).timestamp() - __import__("time").time()) <= 5401')" True
req POST /api/generate -d '{"model":"stories260K","prompt":"Once","stream":false,"keep_alive":-1,"options":{"num_predict":2}}'
req GET /api/ps
check "keep_alive -1: loaded for good (no expiry)" eq "$(py "$T/out" '(len(d["models"]), "expires_at" in d["models"][0])')" "(1, False)"
req POST /api/generate -d '{"model":"stories260K","prompt":"Once","stream":false,"keep_alive":"300ms","options":{"num_predict":2}}'
check "keep_alive 300ms: unloaded soon after the request" eq "$(loaded_after 60)" 0
req POST /api/generate -d '{"model":"stories260K","prompt":"Once","keep_alive":"5 minutes"}'
check "keep_alive that is no duration: 400 naming it" eq "$(code) $(py "$T/out" '"keep_alive" in d["error"]')" "400 True"
req POST /api/chat -d '{"model":"stories260K","messages":[],"keep_alive":"-1m"}'
check "a preload with keep_alive loads the model" eq "$(code) $(py "$T/out" 'd["done_reason"]')" "200 load"
for ep in push create copy; do
    req POST /api/$ep -d '{"model":"x"}'
    check "/api/$ep: 501 with Ollama's error shape" eq "$(code) $(py "$T/out" '"is not supported" in d["error"]')" "501 True"
done

# embeddings: /api/embed (a string or a list) and the older /api/embeddings
req POST /api/embed -d '{"model":"stories260K","input":["a cat","a dog"]}'
check "embed 200" eq "$(code)" 200
check "embed: two unit vectors of n_embd" eq "$(py "$T/out" '[len(v) == 64 and abs(sum(x * x for x in v) - 1) < 1e-3 for v in d["embeddings"]]')" "[True, True]"
check "embed counts the prompt tokens" eq "$(py "$T/out" 'd["prompt_eval_count"] > 0 and d["model"] == "stories260K"')" True
python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["embeddings"][0]))' "$T/out" >"$T/vec"
req POST /api/embed -d '{"input":"a cat"}'
check "embed of a string: one vector, the same" eq "$(py "$T/out" 'max(abs(a - b) for a, b in zip(d["embeddings"][0], json.load(open(sys.argv[1][:-3] + "vec")))) < 1e-6')" True
req POST /api/embeddings -d '{"model":"stories260K","prompt":"a cat"}'
check "embeddings (older): one vector" eq "$(py "$T/out" 'len(d["embedding"])')" 64
req POST /api/embed -d '{"model":"stories260K","input":[]}'
check "embed with no input: 400, Ollama's error shape" eq "$(code) $(py "$T/out" '"input" in d["error"]')" "400 True"
req POST /api/embeddings -d '{"prompt":["a","b"]}'
check "embeddings (older) wants one string" eq "$(code)" 400

# tools: a reply that is a call (held to one by a schema format) comes back
# as message.tool_calls, arguments an object; streamed: no call text leaks
OT='"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]'
OF='"format":{"type":"object","properties":{"name":{"const":"get_weather"},"arguments":{"type":"object","properties":{"city":{"enum":["Paris"]}},"required":["city"]}},"required":["name","arguments"]}'
req POST /api/chat -d "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"}],$OT,$OF,\"stream\":false,\"options\":{\"num_predict\":250}}"
check "chat tools: the call in message.tool_calls" eq "$(py "$T/out" 'd["message"]["tool_calls"] == [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}] and d["message"]["content"] == ""')" True
curl -s -N "$BASE/api/chat" -d "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"}],$OT,$OF,\"options\":{\"num_predict\":250}}" >"$T/tnd"
check "chat tools streamed: one line with the call, no call text as content" eq "$(python3 -c '
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
calls = [l["message"]["tool_calls"] for l in lines if "tool_calls" in l["message"]]
text = "".join(l["message"]["content"] for l in lines)
print(calls == [[{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]] and text == "" and lines[-1]["done"])' "$T/tnd")" True

# generate, not streamed, raw prompt: the greedy golden text
req POST /api/generate -d '{"model":"stories260K","prompt":"Once upon a time","raw":true,"stream":false,"options":{"num_predict":8,"temperature":0}}'
check "generate 200" eq "$(code)" 200
check "generate greedy text" eq "$(py "$T/out" 'd["response"].startswith(", there was a little girl")')" True
check "generate done with counters" eq "$(py "$T/out" '(d["done"], d["done_reason"], d["eval_count"], d["prompt_eval_count"] > 0)')" "(True, 'length', 8, True)"
py "$T/out" 'd["response"]' >"$T/full"

# the same streamed (the default): NDJSON lines whose pieces add up to the same text
curl -s -N -D "$T/hdr" "$BASE/api/generate" \
    -d '{"model":"stories260K","prompt":"Once upon a time","raw":true,"options":{"num_predict":8,"temperature":0}}' >"$T/nd"
check "streamed as NDJSON" grep -qi '^content-type: application/x-ndjson' "$T/hdr"
python3 - "$T/nd" "$T/full" >"$T/nd_check" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
assert all(not l["done"] for l in lines[:-1]) and lines[-1]["done"], "done only on the last line"
assert lines[-1]["eval_count"] == 8 and lines[-1]["total_duration"] > 0
text = "".join(l["response"] for l in lines)
assert text == open(sys.argv[2]).read().rstrip("\n"), text
print("ok")
PY
check "NDJSON pieces add up to the non-streamed text, last line done with stats" eq "$(cat "$T/nd_check")" ok

# chat through the model's template, stop string, streamed and not
req POST /api/chat -d '{"model":"stories260K:latest","messages":[{"role":"user","content":"Tell me a story"}],"stream":false,"options":{"num_predict":6,"temperature":0}}'
check "chat 200" eq "$(code)" 200
check "chat message is the assistant's" eq "$(py "$T/out" 'd["message"]["role"]')" assistant
check "chat eval_count" eq "$(py "$T/out" 'd["eval_count"]')" 6
curl -s -N "$BASE/api/chat" -d '{"model":"stories260K","messages":[{"role":"user","content":"Tell me a story"}],"options":{"num_predict":6,"temperature":0}}' >"$T/cnd"
check "chat streams message pieces" eq "$(python3 -c '
import json, sys
ls = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(ls[-1]["done"] and all("message" in l for l in ls))' "$T/cnd")" True

# errors
req POST /api/chat -d '{"model":"nope","messages":[{"role":"user","content":"x"}]}'
check "unknown model 404" eq "$(code)" 404
check "error shape {error: message}" eq "$(py "$T/out" 'isinstance(d["error"], str)')" True
req POST /api/generate -d '{"prompt":"x",'
check "broken JSON 400" eq "$(code)" 400
check "broken JSON error names the place" grep -q "line" "$T/out"
req POST /api/chat -d '{"messages":"hello"}'
check "messages not a list 400" eq "$(code)" 400
req POST /api/show -d '{"model":42}'
check "show: model not a string is refused" eq "$(code)" 400
req POST /api/generate -d '{"prompt":""}'
check "an empty prompt is Ollama's preload: 200, done" eq "$(code) $(py "$T/out" 'd["done_reason"]')" "200 load"
req POST /api/generate -d '{"prompt":7}'
check "a prompt that is not a string 400" eq "$(code)" 400
req POST /api/chat -d '{"messages":[{"role":"user","content":"x"}],"options":{"temperature":"hot"}}'
check "bad option type 400" eq "$(code)" 400
req POST /api/chat -d '{"messages":[{"role":"user","content":"x"}],"format":"json","stream":false,"options":{"num_predict":12}}'
check "format json: the reply starts an object" eq "$(py "$T/out" 'd["message"]["content"][:1]')" "{"
req POST /api/chat -d '{"messages":[{"role":"user","content":"x"}],"format":"xml"}'
check "another format refused clearly" grep -q "format" "$T/out"

stop_server
check "SIGTERM exits 0" eq "$SRV_RC" 0
finish
