#!/usr/bin/env bash
# Several models behind one port (`serve --config`): three tiny random
# models as experts with lazy loading, max_loaded_experts 1 and
# auto_unload_after_s 1. A request naming an expert loads it (its state
# shows "loading" meanwhile; the request waits and is answered by it); a
# request for another unloads the first (max 1); an idle model unloads on
# its own; a request without a model goes where its text points (the
# semantic router); unknown models are 404; a model that cannot load fails
# its request with a message naming it; a bad config file stops
# `serve --config` with the field named.
. "$(dirname "$0")/lib.sh"
T=$(mktemp -d)
trap 'cleanup; rm -rf "$T"' EXIT

for i in 1 2 3; do
    "$LMSERV" synth --shape tiny --seed "$i" "$T/m$i.gguf" >/dev/null 2>&1 || die "synth failed"
done
head -c 4096 /dev/urandom >"$T/broken.gguf"
cat >"$T/cfg.json" <<'JSON'
{"experts": [
  {"expert_id": "coder", "model_path": "m1.gguf", "domain": "programming and source code",
   "priority": 2, "examples": ["write a python function", "fix this javascript bug"]},
  {"expert_id": "chef", "model_path": "m2.gguf", "domain": "cooking and recipes",
   "priority": 1, "examples": ["how do I bake bread", "a recipe for tomato soup"]},
  {"expert_id": "general", "model_path": "m3.gguf", "domain": "small talk",
   "examples": ["hello how are you"]},
  {"expert_id": "broken", "model_path": "broken.gguf", "priority": -1}],
 "lazy_loading": {"enabled": true, "warmup_pool_size": 0, "max_loaded_experts": 1,
                  "auto_unload_after_s": 1},
 "router": {"default": "general", "embedding_model": null}}
JSON

# loads take at least 700 ms, so the "loading" state can be seen
LMSERV_DEBUG_LOAD_DELAY_MS=700 start_serve --config "$T/cfg.json" -c 256

state() { # expert -> its state in /v1/models
    curl -s "$BASE/v1/models" >"$T/models"
    py "$T/models" "[m['lmserv']['state'] for m in d['data'] if m['id'] == '$1'][0]"
}
wait_state() { # expert state: polls up to 10 s
    for _ in $(seq 200); do
        [ "$(state "$1")" = "$2" ] && return 0
        sleep 0.05
    done
    echo "    $1 is '$(state "$1")', want '$2'"
    return 1
}
chat() { # model-json text -> body in $T/out, status in $T/code
    req POST /v1/chat/completions -H 'Content-Type: application/json' \
        -d "{$1\"messages\":[{\"role\":\"user\",\"content\":\"$2\"}],\"max_tokens\":4}"
}

# --- ready with nothing loaded; every expert listed ----------------------------------
req GET /health
check "health 200 with nothing loaded" eq "$(code)" 200
check "health names the default" eq "$(py "$T/out" "d['model'], d['models_loaded']")" "('general', 0)"
req GET /v1/models
check "models lists all four" eq "$(py "$T/out" "[m['id'] for m in d['data']]")" \
    "['coder', 'chef', 'general', 'broken']"
check "all unloaded" eq "$(py "$T/out" "set(m['lmserv']['state'] for m in d['data'])")" "{'unloaded'}"
req GET /api/tags
check "ollama tags lists all" eq "$(py "$T/out" "len(d['models'])")" 4

# --- naming an expert loads it; the request waits --------------------------------------
chat '"model":"chef",' "hi" &
CHAT_PID=$!
check "chef shows loading" wait_state chef loading
# while chef loads (and its request waits), nothing can make room for another
chat '"model":"coder",' "hi"
check "every loaded expert busy: 503 at once, not a wait" eq \
    "$(code) $(py "$T/out" "'busy' in d['error']['message']")" "503 True"
wait "$CHAT_PID"
check "chef answers 200" eq "$(code)" 200
check "the answer names chef" eq "$(py "$T/out" "d['model']")" chef
check "chef ready" eq "$(state chef)" ready
req GET /api/ps
check "ollama ps lists chef" eq "$(py "$T/out" "[m['name'] for m in d['models']]")" "['chef:latest']"

# --- another expert: max_loaded_experts 1 unloads chef ---------------------------------
chat '"model":"coder",' "hi"
check "coder answers" eq "$(code) $(py "$T/out" "d['model']")" "200 coder"
check "chef unloaded for coder" wait_state chef unloaded
check "coder ready" eq "$(state coder)" ready
grep -q '"event":"model_unloading","model":"chef","reason":"max_loaded_experts"' "$LOG"
check "unload logged with its reason" [ $? -eq 0 ]

# --- idle for over a second: unloaded --------------------------------------------------
check "idle coder unloads itself" wait_state coder unloaded
grep -q '"event":"model_unloading","model":"coder","reason":"idle"' "$LOG"
check "idle unload logged" [ $? -eq 0 ]

# --- no model: the router reads the text ---------------------------------------------------
chat "" "Please write a Python function that sorts a list"
check "routed to coder" eq "$(code) $(py "$T/out" "d['model']")" "200 coder"
req POST /v1/completions -H 'Content-Type: application/json' \
    -d '{"model":"auto","prompt":"a good recipe for tomato soup","max_tokens":2}'
check "auto routed to chef" eq "$(code) $(py "$T/out" "d['model']")" "200 chef"
chat "" "zzq xxv"
check "nothing alike: the default" eq "$(code) $(py "$T/out" "d['model']")" "200 general"
grep -q '"event":"route","model":"coder"' "$LOG"
check "routing logged" [ $? -eq 0 ]
req POST /api/generate -H 'Content-Type: application/json' \
    -d '{"model":"chef:latest","prompt":"hi","stream":false,"options":{"num_predict":2}}'
check "ollama names chef:latest" eq "$(code) $(py "$T/out" "d['model']")" "200 chef"

# --- errors ----------------------------------------------------------------------------------
chat '"model":"nope",' "hi"
check "unknown model 404" eq "$(code) $(py "$T/out" "d['error']['code']")" "404 model_not_found"
chat '"model":"broken",' "hi"
check "a model that cannot load: 500" eq "$(code)" 500
check "the error names it" eq "$(py "$T/out" "'broken' in d['error']['message'] and d['error']['code']")" \
    model_load_failed
check "broken failed" eq "$(state broken)" failed
chat '"model":"general",' "hi"
check "the others still serve" eq "$(code) $(py "$T/out" "d['model']")" "200 general"

# --- visibility ------------------------------------------------------------------------------
req GET /stats
check "stats per model" eq "$(py "$T/out" "[(m['id'], m['loads'] >= 1) for m in d['models']][:3]")" \
    "[('coder', True), ('chef', True), ('general', True)]"
req GET /metrics
check "metrics: loads of chef" grep -q '^lmserv_model_loads_total{model="chef"} [1-9]' "$T/out"
check "metrics: unloads of coder" grep -q '^lmserv_model_unloads_total{model="coder"} [1-9]' "$T/out"
check "metrics: broken failed" grep -q '^lmserv_model_state{model="broken",state="failed"} 1' "$T/out"

stop_server
check "clean exit" eq "$SRV_RC" 0

# --- the embedding router: router.embedding_model names a model file ----------------------
# Random weights give arbitrary similarities, except that a text equal to an
# example embeds exactly like it (cosine 1): that example's expert answers.
python3 - "$T/cfg.json" "$T/cfg_emb.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["experts"] = c["experts"][:3]
c["router"]["embedding_model"] = "m3.gguf"
c["router"]["threshold"] = 0.5
json.dump(c, open(sys.argv[2], "w"))
PY
start_serve --config "$T/cfg_emb.json" -c 256
chat "" "a recipe for tomato soup"
check "embedding router: chef" eq "$(code) $(py "$T/out" "d['model']")" "200 chef"
chat "" "fix this javascript bug"
check "embedding router: coder" eq "$(code) $(py "$T/out" "d['model']")" "200 coder"
grep -q '"event":"route","model":"coder","by":"embedding"' "$LOG"
check "embedding routing logged" [ $? -eq 0 ]
req GET /v1/models
check "the router's model is not an expert" eq "$(py "$T/out" "[m['id'] for m in d['data']]")" \
    "['coder', 'chef', 'general']"
stop_server
check "embedding router: clean exit" eq "$SRV_RC" 0

# --- memory_threshold: a load that cannot fit is refused with the reason ------------------
printf '{"experts":[{"expert_id":"a","model_path":"m1.gguf"}],
 "lazy_loading":{"enabled":true,"memory_threshold":1e-9}}' >"$T/mem.json"
start_serve --config "$T/mem.json" -c 256
chat '"model":"a",' "hi"
check "over the memory threshold: 503" eq "$(code) $(py "$T/out" "d['error']['code']")" \
    "503 model_unavailable"
check "the reason is given" eq "$(py "$T/out" "'memory_threshold' in d['error']['message']")" True
stop_server

# --- an expert's own draft model ("draft"): speculative decoding for that expert alone ----------
printf '{"experts":[{"expert_id":"fast","model_path":"m1.gguf","draft":"m1.gguf"},
 {"expert_id":"plain","model_path":"m2.gguf"}],"lazy_loading":{"enabled":false}}' >"$T/draft.json"
start_serve --config "$T/draft.json" -c 256 --draft-p-min 0
draft_counts() { # expert -> its draft_tokens draft_accepted
    curl -s "$BASE/stats" | python3 -c 'import json,sys; d=json.load(sys.stdin); s=[m["sched"] for m in d["models"] if m["id"] == sys.argv[1]][0]; print(s["draft_tokens"], s["draft_accepted"])' "$1"
}
chat '"model":"plain","temperature":0,' "hello"
check "plain expert: 200, no guesses" eq "$(code) $(draft_counts plain)" "200 0 0"
chat '"model":"fast","temperature":0,' "hello"
check "expert with a draft: 200, guesses made and taken" eq "$(code) $(draft_counts fast | python3 -c 'import sys; a, b = map(int, sys.stdin.read().split()); print(a > 0 and 0 < b <= a)')" "200 True"
stop_server
printf '{"experts":[{"expert_id":"a","endpoint":"http://127.0.0.1:9/v1","draft":"m1.gguf"}]}' >"$T/bad3.json"
"$LMSERV" serve --config "$T/bad3.json" --port 0 >"$T/bad3.out" 2>&1
check "a remote expert takes no draft" grep -q "takes no 'draft'" "$T/bad3.out"
printf '{"experts":[{"expert_id":"a","model_path":"m1.gguf","draft":"../x.gguf"}]}' >"$T/bad4.json"
"$LMSERV" serve --config "$T/bad4.json" --port 0 >"$T/bad4.out" 2>&1
check "a draft outside the config's folder refused, naming the field" grep -q "experts\[0\].draft" "$T/bad4.out"

# --- a bad config file: exit non-zero, field named ---------------------------------------------
printf '{"experts":[{"expert_id":"a","model_path":"m1.gguf","priority":"high"}]}' >"$T/bad.json"
"$LMSERV" serve --config "$T/bad.json" --port 0 >"$T/bad.out" 2>&1
rc=$?
check "bad config: exit non-zero" [ "$rc" -ne 0 ]
check "bad config: the field named" grep -q 'experts\[0\].priority: must be an integer' "$T/bad.out"
printf '{"experts":[{"expert_id":"a","model_path":"nope.gguf"}]}' >"$T/bad2.json"
"$LMSERV" serve --config "$T/bad2.json" --port 0 >"$T/bad2.out" 2>&1
check "missing model file refused" grep -q "experts\[0\].model_path: 'nope.gguf' does not exist" \
    "$T/bad2.out"
finish
