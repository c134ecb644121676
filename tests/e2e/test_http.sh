#!/usr/bin/env bash
# test_http.sh - the HTTP side with curl: /health while loading and ready,
# /v1/models, completions and chat (streamed over SSE and not), keep-alive,
# /stats, /metrics, and every error status with OpenAI's error shape.
. "$(dirname "$0")/lib.sh" || exit 1
command -v python3 >/dev/null || skip "python3 is not installed"

T=$(mktemp -d /tmp/lmserv-http.XXXXXX)
trap 'cleanup; rm -rf "$T"' EXIT

CHAT='{"messages":[{"role":"user","content":"Tell me a story"}],"max_tokens":12,"temperature":0}'

# ---- loading, then ready ----------------------------------------------------------
LMSERV_DEBUG_LOAD_DELAY_MS=1500 NO_WAIT=1 start_server -c 512
req GET /health
check "health is 503 while loading" eq "$(code)" 503
check "health says loading" eq "$(py "$T/out" 'd["status"]')" loading
req POST /v1/chat/completions -d "$CHAT"
check "inference is 503 while loading" eq "$(code)" 503
check "503 has the error shape" eq "$(py "$T/out" 'd["error"]["type"]')" unavailable_error
wait_ready
req GET /health
check "health is 200 when ready" eq "$(code)" 200

# ---- models ---------------------------------------------------------------------------
req GET /v1/models
check "models 200" eq "$(code)" 200
check "models lists stories260K" eq "$(py "$T/out" 'd["data"][0]["id"]')" stories260K
check "models object list" eq "$(py "$T/out" 'd["object"]')" list
req GET /v1/models/stories260K
check "one model 200" eq "$(code)" 200
req GET /v1/models/nope
check "unknown model 404" eq "$(code)" 404

# ---- completions ----------------------------------------------------------------------
req POST /v1/completions -d '{"prompt":"Once upon a time","max_tokens":8,"temperature":0}'
check "completions 200" eq "$(code)" 200
check "greedy text" eq "$(py "$T/out" 'd["choices"][0]["text"].startswith(", there was a little girl")')" True
check "usage" eq "$(py "$T/out" 'd["usage"]["completion_tokens"]')" 8
check "finish length" eq "$(py "$T/out" 'd["choices"][0]["finish_reason"]')" length
check "object text_completion" eq "$(py "$T/out" 'd["object"]')" text_completion

# ---- chat, not streamed and streamed ------------------------------------------------------
req POST /v1/chat/completions -H 'content-type: application/json' -d "$CHAT"
check "chat 200" eq "$(code)" 200
check "chat object" eq "$(py "$T/out" 'd["object"]')" chat.completion
check "assistant role" eq "$(py "$T/out" 'd["choices"][0]["message"]["role"]')" assistant
py "$T/out" 'd["choices"][0]["message"]["content"]' >"$T/full"

curl -s -N -D "$T/hdr" "$BASE/v1/chat/completions" \
    -d "${CHAT%\}},\"stream\":true,\"stream_options\":{\"include_usage\":true}}" >"$T/sse"
check "SSE content type" grep -qi '^content-type: text/event-stream' "$T/hdr"
check "SSE is chunked (keep-alive)" grep -qi '^transfer-encoding: chunked' "$T/hdr"
check "SSE ends with [DONE]" eq "$(grep '^data: ' "$T/sse" | tail -1)" "data: [DONE]"
python3 - "$T/sse" "$T/full" >"$T/sse_check" <<'EOF'
import json, sys
events = [l[6:] for l in open(sys.argv[1]).read().split("\n") if l.startswith("data: ")]
assert events[-1] == "[DONE]"
chunks = [json.loads(e) for e in events[:-1]]
ids = {c["id"] for c in chunks}
assert len(ids) == 1, "one id for the stream"
assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
fin = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
assert fin[-1] in ("stop", "length") and all(f is None for f in fin[:-1])
assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] <= 12
assert all(c["usage"] is None for c in chunks[:-1])
full = open(sys.argv[2]).read().rstrip("\n")
assert text == full, (text, full)
print("ok")
EOF
check "SSE chunks: role first, one id, usage last, text = non-streamed" eq "$(cat "$T/sse_check")" ok

# ---- tools: a reply without a call stays content, streamed or not --------------------------
TOOLS='"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]'
req POST /v1/chat/completions -d "${CHAT%\}},$TOOLS}"
check "chat with tools 200" eq "$(code)" 200
py "$T/out" 'd["choices"][0]["message"]["content"]' >"$T/tfull"
check "no tool_calls when the reply has none" eq "$(py "$T/out" '"tool_calls" in d["choices"][0]["message"]')" False
curl -s -N "$BASE/v1/chat/completions" -d "${CHAT%\}},$TOOLS,\"stream\":true}" >"$T/tsse"
check "streamed with tools: same text, nothing held back at the end" eq "$(python3 -c '
import json, sys
ev = [l[6:] for l in open(sys.argv[1]).read().split("\n") if l.startswith("data: ")][:-1]
print("".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in ev))' "$T/tsse")" "$(cat "$T/tfull")"
req POST /v1/chat/completions -d "${CHAT%\}},\"tools\":{}}"
check "tools must be an array" eq "$(code)" 400

# ---- keep-alive ----------------------------------------------------------------------------
curl -sv -o /dev/null "$BASE/health" -o /dev/null "$BASE/v1/models" 2>"$T/ka"
check "keep-alive reuses the connection" grep -q 'Re-using existing connection' "$T/ka"

# ---- errors ----------------------------------------------------------------------------------
req POST /v1/chat/completions -d '{"messages": [1,}'
check "bad JSON 400" eq "$(code)" 400
check "bad JSON names line and column" grep -q 'line 1, column 17' "$T/out"
req POST /v1/chat/completions -d '{"messages":[{"role":"user","content":"x"}],"temperature":"hot"}'
check "wrong type 400" eq "$(code)" 400
check "wrong type names the field" eq "$(py "$T/out" 'd["error"]["param"]')" temperature
req POST /v1/chat/completions -d '{"messages":[{"role":"user","content":"x"}],"max_tokens":5,"frobnicate":1}'
check "unknown fields are ignored" eq "$(code)" 200
req POST /v1/chat/completions -d '{"model":"gpt-4o","messages":[{"role":"user","content":"x"}]}'
check "unknown model 404" eq "$(code)" 404
check "unknown model code" eq "$(py "$T/out" 'd["error"]["code"]')" model_not_found
head -c 1100000 /dev/zero | tr '\0' a >"$T/big"
req POST /v1/completions --data-binary @"$T/big"
check "body too large 413" eq "$(code)" 413
req POST /v1/completions -d '{"prompt":"x","max_tokens":100000}'
check "max_tokens over the context 400" eq "$(code)" 400
check "context_length_exceeded" eq "$(py "$T/out" 'd["error"]["code"]')" context_length_exceeded
req POST /v1/chat/completions -d '{"messages":[{"role":"user","content":"x"}],"n":3,"max_tokens":2}'
check "n=3 gives three choices" eq "$(py "$T/out" '[c["index"] for c in d["choices"]]')" "[0, 1, 2]"
req POST /v1/chat/completions -d '{"messages":[{"role":"user","content":"x"}],"n":0}'
check "n=0 refused" eq "$(code)" 400
req POST /v1/completions -d '{"prompt":"Once upon a time","max_tokens":3,"temperature":0,"logit_bias":{"261":100}}'
check "logit_bias +100 forces a token" eq "$(py "$T/out" 'd["choices"][0]["text"]')" " a a a"
req POST /v1/completions -d '{"prompt":"Once upon a time","max_tokens":3,"logit_bias":{"7":"x"}}'
check "logit_bias with a non-number refused" eq "$(code)" 400
req POST /v1/completions -d '{"prompt":["Once","Twice"],"max_tokens":2,"temperature":0}'
check "two prompts give two choices" eq "$(py "$T/out" 'len(d["choices"])')" 2
req POST /v1/completions -d '{"prompt":["Once",7],"max_tokens":2}'
check "a prompt list of mixed kinds refused" eq "$(code)" 400
check "the refusal names prompt" eq "$(py "$T/out" 'd["error"]["param"]')" prompt
req POST /v1/completions -d '{"prompt":["Once"],"max_tokens":2}'
check "a list of one prompt is taken" eq "$(code)" 200
req POST /v1/chat/completions -d '[]'
check "non-object body 400" eq "$(code)" 400
curl -s -D "$T/hdr" -o "$T/out" "$BASE/"
check "GET / serves the web page" grep -q '/v1/chat/completions' "$T/out"
check "the page is HTML" grep -qi '^content-type: text/html' "$T/hdr"
req POST /tokenize -d '{"content":"Once upon a time"}'
check "tokenize 200" eq "$(code)" 200
TOKS=$(py "$T/out" 'json.dumps(d["tokens"])')
check "tokenize gives ids" eq "$(py "$T/out" 'len(d["tokens"]) > 0 and all(isinstance(x, int) for x in d["tokens"])')" True
req POST /detokenize -d "{\"tokens\":$TOKS}"
check "detokenize(tokenize(text)) == text" eq "$(py "$T/out" 'd["content"]')" "Once upon a time"
req POST /tokenize -d '{"content":"Once","add_special":true,"with_pieces":true}'
check "tokenize with BOS and pieces" eq "$(py "$T/out" 'd["tokens"][0]["piece"]')" "<s>"
# ---- llama-server's /props and /apply-template ---------------------------------------
req GET /props
check "props 200" eq "$(code)" 200
check "props: loaded, one slot or more, the context, BOS and EOS" eq "$(py "$T/out" '(d["model"], d["loaded"], d["total_slots"] >= 1, d["default_generation_settings"]["n_ctx"], d["bos_token"], d["eos_token"])')" "('stories260K', True, True, 512, '<s>', '</s>')"
check "props: the chat template and the sampling defaults" eq "$(py "$T/out" '(len(d["chat_template"]) > 0, d["default_generation_settings"]["params"]["top_k"], d["default_generation_settings"]["params"]["temperature"])')" "(True, 40, 0.8)"
req GET "/props?model=stories260K"
check "props ?model= names the model" eq "$(code) $(py "$T/out" 'd["model"]')" "200 stories260K"
req GET "/props?model=nope"
check "props ?model= of an unknown model 404" eq "$(code)" 404
req GET /slots
check "slots: one per parallel sequence, idle, with the context" eq "$(code) $(py "$T/out" '(len(d), [s["id"] for s in d] == list(range(len(d))), d[0]["n_ctx"], any(s["is_processing"] for s in d), {s["id_task"] for s in d}, d[0]["speculative"])')" "200 (4, True, 512, False, {-1}, False)"
req GET "/slots?model=nope"
check "slots ?model= of an unknown model 404" eq "$(code)" 404
MSGS='[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi there"}]'
req POST /apply-template -d "{\"messages\":$MSGS}"
check "apply-template 200" eq "$(code)" 200
check "apply-template renders both messages" eq "$(py "$T/out" '"Be brief." in d["prompt"] and "Hi there" in d["prompt"]')" True
py "$T/out" 'd["prompt"]' >"$T/prompt1"
req POST /tokenize -d "$(python3 -c 'import json,sys; print(json.dumps({"content": open(sys.argv[1]).read()[:-1], "add_special": True}))' "$T/prompt1")"
NTOK=$(py "$T/out" 'len(d["tokens"])')
req POST /v1/chat/completions -d "{\"messages\":$MSGS,\"max_tokens\":1}"
check "the rendered prompt is what chat completions decodes: same token count" eq "$(py "$T/out" 'd["usage"]["prompt_tokens"]')" "$NTOK"
req POST /apply-template -d "{\"messages\":$MSGS,\"add_generation_prompt\":false}"
check "without the generation prompt the text is a prefix, shorter" eq "$(py "$T/out" '(lambda p, q: len(p) < len(q) and q.startswith(p))(d["prompt"], open(sys.argv[1][:-3] + "prompt1").read()[:-1])')" True
req POST /apply-template -d '{"messages":"hello"}'
check "apply-template: messages not an array 400" eq "$(py "$T/out" '(d["error"]["param"])')" messages
req POST /apply-template -d '{"messages":[{"role":"user","content":"x"}],"tools":5}'
check "apply-template: tools not an array 400" eq "$(code)" 400
req POST /apply-template -d '{"messages":[{"role":"user","content":"x"}],"model":"nope"}'
check "apply-template: unknown model 404" eq "$(code)" 404
# ---- llama-server's /completion -------------------------------------------------------
req POST /completion -d '{"prompt":"Once upon a time","n_predict":8,"temperature":0}'
check "completion 200" eq "$(code)" 200
check "completion: the greedy text of /v1/completions" eq "$(py "$T/out" 'd["content"].startswith(", there was a little girl")')" True
check "completion: counters, stop and its type" eq "$(py "$T/out" '(d["tokens_predicted"], d["tokens_evaluated"] > 0, d["stop"], d["stop_type"], d["model"])')" "(8, True, True, 'limit', 'stories260K')"
check "completion: timings" eq "$(py "$T/out" '(lambda t: t["predicted_n"] == 8 and t["predicted_per_second"] > 0 and t["prompt_n"] + d["tokens_cached"] == d["tokens_evaluated"])(d["timings"])')" True
py "$T/out" 'd["content"]' >"$T/ncontent"
req POST /tokenize -d '{"content":"Once upon a time","add_special":true}'
req POST /completion -d "{\"prompt\":$(py "$T/out" 'json.dumps(d["tokens"])'),\"n_predict\":8,\"temperature\":0}"
check "completion from token ids: the same text" eq "$(py "$T/out" 'd["content"]')" "$(cat "$T/ncontent")"
req POST /completion -d '{"prompt":[1,"Once upon a time"],"n_predict":8,"temperature":0}'
check "completion from an id and a text: the same text" eq "$(py "$T/out" 'd["content"]')" "$(cat "$T/ncontent")"
req POST /completion -d '{"prompt":"Once upon a time","n_predict":40,"temperature":0,"stop":["girl"]}'
check "completion: a stop string ends it as a word" eq "$(py "$T/out" '(d["stop_type"], d["stopping_word"], d["content"].endswith("little "), "girl" in d["content"])')" "('word', 'girl', True, False)"
curl -s -N -D "$T/hdr" "$BASE/completion" -d '{"prompt":"Once upon a time","n_predict":8,"temperature":0,"stream":true}' >"$T/nsse"
check "completion stream: SSE" grep -qi '^content-type: text/event-stream' "$T/hdr"
check "completion stream: pieces, then one stop object with the counters; the same text" eq "$(python3 - "$T/nsse" "$T/ncontent" <<'EOF2'
import json, sys
ev = [json.loads(l[6:]) for l in open(sys.argv[1]).read().split("\n") if l.startswith("data: ")]
text = "".join(e["content"] for e in ev)
ok = all(not e["stop"] and len(e["tokens"]) == 1 for e in ev[:-1]) and ev[-1]["stop"]
ok = ok and ev[-1]["tokens_predicted"] == 8 and text == open(sys.argv[2]).read()[:-1]
print(ok)
EOF2
)" True
req POST /completion -d '{"prompt":"Once upon a time","n_predict":4,"temperature":0,"n_probs":3}'
check "completion n_probs: an entry per token, three alternatives, the greedy pick first" eq "$(py "$T/out" '(lambda p: len(p) == 4 and all(len(e["top_logprobs"]) == 3 and e["id"] == e["top_logprobs"][0]["id"] and e["logprob"] <= 0 and bytes(e["bytes"]).decode("utf-8", "replace") == e["token"] and e["top_logprobs"][0]["logprob"] >= e["top_logprobs"][1]["logprob"] for e in p))(d["completion_probabilities"])')" True
req POST /completion -d '{"prompt":"Once upon a time","n_predict":4,"temperature":0,"n_probs":2,"post_sampling_probs":true}'
check "completion post_sampling_probs: prob and top_probs in (0, 1]" eq "$(py "$T/out" 'all(0 < e["prob"] <= 1 and len(e["top_probs"]) == 2 and "logprob" not in e for e in d["completion_probabilities"])')" True
curl -s -N "$BASE/completion" -d '{"prompt":"Once upon a time","n_predict":4,"temperature":0,"n_probs":2,"stream":true}' >"$T/psse"
check "completion stream with n_probs: one entry a piece" eq "$(python3 -c 'import json,sys; ev=[json.loads(l[6:]) for l in open(sys.argv[1]).read().split("\n") if l.startswith("data: ")]; print(all(len(e["completion_probabilities"]) == 1 for e in ev[:-1]) and len(ev) >= 2)' "$T/psse")" True
req POST /completion -d '{"prompt":"x","n_probs":21}'
check "completion: n_probs over 20 refused" eq "$(code) $(py "$T/out" 'd["error"]["param"]')" "400 n_probs"
req POST /completion -d '{"prompt":[1,99999]}'
check "completion: a token id outside the vocabulary 400, naming it" eq "$(code) $(py "$T/out" '"prompt[1]" in d["error"]["message"]')" "400 True"
req POST /completion -d '{"n_predict":3}'
check "completion: no prompt 400" eq "$(code) $(py "$T/out" 'd["error"]["param"]')" "400 prompt"
req POST /completion -d '{"prompt":[1,2.5]}'
check "completion: a prompt item neither id nor text 400" eq "$(code)" 400
req POST /completion -d '{"prompt":"x","grammar":"root ::= \"a\"","n_predict":8}'
check "completion: a grammar of one text gives that text" eq "$(code) $(py "$T/out" '(d["content"], d["stop_type"])')" "200 ('a', 'eos')"
req POST /completion -d '{"prompt":"x","json_schema":{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]},"n_predict":24,"temperature":0}'
check "completion: json_schema holds the output to an object" eq "$(code) $(py "$T/out" 'd["content"].lstrip().startswith("{")')" "200 True"
req POST /infill -d '{"input_prefix":"def f(","input_suffix":"):\n"}'
check "infill on a model without FIM tokens: 400 saying so" eq "$(code) $(py "$T/out" '"fill-in-the-middle" in d["error"]["message"]')" "400 True"
req POST /api/generate -d '{"prompt":"def f(","suffix":"):\n","stream":false}'
check "ollama generate with a suffix on a model without FIM tokens: 400 saying so" eq "$(code) $(py "$T/out" '"fill-in-the-middle" in d["error"]')" "400 True"
# ---- prompt log-probabilities (completions: echo + logprobs, max_tokens 0 allowed) ----
req POST /v1/completions -d '{"prompt":"Once upon a time","max_tokens":0,"echo":true,"logprobs":2}'
check "echo + logprobs, max_tokens 0: the prompt, nothing generated" eq "$(py "$T/out" '(d["choices"][0]["text"], d["usage"]["completion_tokens"])')" "('Once upon a time', 0)"
check "one entry per prompt token, the first null, the others log-probabilities" eq "$(py "$T/out" '(lambda l: len(l["token_logprobs"]) == d["usage"]["prompt_tokens"] and l["token_logprobs"][0] is None and all(x <= 0 for x in l["token_logprobs"][1:]) and all(len(t) == 2 for t in l["top_logprobs"][1:]))(d["choices"][0]["logprobs"])')" True
py "$T/out" 'd["choices"][0]["logprobs"]["token_logprobs"]' >"$T/plp"
req POST /v1/completions -d '{"prompt":"Once upon a time","max_tokens":3,"echo":true,"logprobs":0,"temperature":0}'
check "text_offset points into the returned text: each token's text (less a leading space) starts there, in order" eq "$(py "$T/out" '(lambda c: all(c["text"][o:].startswith(t.lstrip(" ") if o == 0 else t) for t, o in zip(c["logprobs"]["tokens"], c["logprobs"]["text_offset"])) and c["logprobs"]["text_offset"] == sorted(c["logprobs"]["text_offset"]) and c["logprobs"]["text_offset"][-3] >= len("Once upon a time") - 5)(d["choices"][0])')" True
check "with generated tokens: the same prompt entries, then theirs" eq "$(py "$T/out" 'str(d["choices"][0]["logprobs"]["token_logprobs"][:-3]) == open(sys.argv[1][:-3] + "plp").read().strip() and len(d["choices"][0]["logprobs"]["tokens"]) == d["usage"]["prompt_tokens"] + 3')" True
req POST /tokenize -d '{"content":"Once upon a time","add_special":true}'
req POST /v1/completions -d "{\"prompt\":$(py "$T/out" 'json.dumps(d["tokens"])'),\"max_tokens\":0,\"echo\":true,\"logprobs\":2}"
check "the same from token ids (echo of their pieces)" eq "$(py "$T/out" 'str(d["choices"][0]["logprobs"]["token_logprobs"])')" "$(cat "$T/plp")"
req POST /v1/completions -d '{"prompt":[1,99999],"max_tokens":0,"echo":true,"logprobs":1}'
check "echo of a token id outside the vocabulary refused, naming it" eq "$(code) $(py "$T/out" '"prompt[1]" in d["error"]["message"]')" "400 True"
req POST /v1/completions -d '{"prompt":"Once","max_tokens":0}'
check "max_tokens 0 without echo + logprobs refused" eq "$(code)" 400
req POST /v1/completions -d '{"prompt":"Once","echo":true,"logprobs":1,"stream":true}'
check "echo + logprobs streamed refused" eq "$(code)" 400

# ---- JSON mode (response_format json_object, Ollama's format "json") -----------
req POST /tokenize -d '{"content":"{}"}'
CLOSE=$(py "$T/out" 'd["tokens"][-1]')
req POST /v1/chat/completions -d "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":40,\"temperature\":0,\"response_format\":{\"type\":\"json_object\"},\"logit_bias\":{\"$CLOSE\":100}}"
check "JSON mode: '}' favoured, the object closes at once" eq "$(py "$T/out" 'd["choices"][0]["message"]["content"].strip()')" "{}"
check "JSON mode: then the end token, finish stop" eq "$(py "$T/out" 'd["choices"][0]["finish_reason"]')" stop
req POST /v1/chat/completions -d '{"messages":[{"role":"user","content":"Tell me a story"}],"max_tokens":40,"response_format":{"type":"json_object"},"seed":3}'
check "JSON mode: the reply is an object's beginning" eq "$(py "$T/out" 'd["choices"][0]["message"]["content"].lstrip()[:2] in ("{", "{ ", "{\n", "{\"", "{}")')" True
check "JSON mode: a reply that stopped parses" eq "$(py "$T/out" 'd["choices"][0]["finish_reason"] == "length" or isinstance(json.loads(d["choices"][0]["message"]["content"]), dict)')" True
SCHEMA='{"type":"object","properties":{"a":{"type":"boolean"},"n":{"type":"integer"}},"required":["a","n"]}'
req POST /v1/chat/completions -d "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":200,\"seed\":1,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"t\",\"schema\":$SCHEMA}}}"
check "json_schema: the keys in order, a boolean first" eq "$(py "$T/out" '__import__("re").sub(r"\s", "", d["choices"][0]["message"]["content"])[:6] in ("{\"a\":t", "{\"a\":f")')" True
check "json_schema: a reply that stopped is a valid instance" eq "$(py "$T/out" 'd["choices"][0]["finish_reason"] == "length" or (lambda o: list(o) == ["a", "n"] and isinstance(o["a"], bool) and isinstance(o["n"], int))(json.loads(d["choices"][0]["message"]["content"]))')" True
CALL='{"type":"object","properties":{"name":{"const":"get_weather"},"arguments":{"type":"object","properties":{"city":{"enum":["Paris"]}},"required":["city"]}},"required":["name","arguments"]}'
req POST /v1/chat/completions -d "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],$TOOLS,\"max_tokens\":250,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"c\",\"schema\":$CALL}}}"
check "a reply held to a call's shape comes back as tool_calls" eq "$(py "$T/out" '(d["choices"][0]["finish_reason"], d["choices"][0]["message"]["tool_calls"][0]["function"]["name"], json.loads(d["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]))')" "('tool_calls', 'get_weather', {'city': 'Paris'})"
# tool_choice naming a function: the reply is held to a call of it
FT='"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"enum":["Paris","Rome"]}},"required":["city"]}}},{"type":"function","function":{"name":"get_time","parameters":{"type":"object"}}}]'
req POST /v1/chat/completions -d "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],$FT,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}},\"max_tokens\":250}"
check "tool_choice naming a function forces its call" eq "$(py "$T/out" '(d["choices"][0]["finish_reason"], d["choices"][0]["message"]["tool_calls"][0]["function"]["name"], json.loads(d["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])["city"] in ("Paris", "Rome"))')" "('tool_calls', 'get_weather', True)"
req POST /v1/chat/completions -d "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],$FT,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"nope\"}}}"
check "tool_choice naming no tool refused" eq "$(code) $(py "$T/out" 'd["error"]["param"]')" "400 tool_choice"
req POST /v1/chat/completions -d "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],$FT,\"tool_choice\":\"required\",\"response_format\":{\"type\":\"json_object\"}}"
check "a forced call with a response_format refused" eq "$(code)" 400
PSCHEMA='{"type":"object","properties":{"c":{"type":"string","pattern":"^[a-c]{2,3}$"},"k":{"type":"integer","minimum":10,"maximum":20}},"required":["c","k"]}'
req POST /v1/chat/completions -d "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":250,\"seed\":2,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\",\"schema\":$PSCHEMA}}}"
check "json_schema pattern and bounds: a finished reply holds them" eq "$(py "$T/out" 'd["choices"][0]["finish_reason"] == "length" or (lambda o: bool(__import__("re").fullmatch("[a-c]{2,3}", o["c"])) and 10 <= o["k"] <= 20)(json.loads(d["choices"][0]["message"]["content"]))')" True
check "json_schema pattern: the string so far fits it" eq "$(py "$T/out" 'bool(__import__("re").match(r"\s*\{\s*\"c\"\s*:\s*\"[a-c]{0,3}(\"|$)", d["choices"][0]["message"]["content"]))')" True
req POST /v1/chat/completions -d '{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"object","properties":{"s":{"type":"number","multipleOf":3}}}}}}'
check "json_schema with an unsupported keyword refused, naming it" eq "$(code) $(py "$T/out" '"multipleOf" in d["error"]["message"]')" "400 True"
req POST /api/generate -d '{"prompt":"Once","format":"json","stream":false,"options":{"num_predict":20}}'
check "Ollama format json: an object's beginning" eq "$(py "$T/out" 'd["response"].lstrip()[:1]')" "{"
req POST /api/generate -d "{\"prompt\":\"Once\",\"format\":$SCHEMA,\"stream\":false,\"options\":{\"num_predict\":30}}"
check "Ollama format schema: the first key" eq "$(py "$T/out" '__import__("re").sub(r"\s", "", d["response"])[:5]')" '{"a":'
req POST /api/generate -d '{"prompt":"Once","format":{"type":"string"},"stream":false}'
check "Ollama format schema of a non-object refused" eq "$(code)" 400

# ---- GBNF grammars (llama-server's "grammar"), on every generation endpoint ------------
YN='root ::= (\"yes\" | \"no\") \" \" [0-9]{3}\n'
for seed in 1 2 3 4; do
    req POST /completion -d "{\"prompt\":\"Once upon a time\",\"n_predict\":30,\"temperature\":1.5,\"seed\":$seed,\"grammar\":\"$YN\"}"
    check "grammar (seed $seed): the text is one the grammar makes" eq "$(py "$T/out" 'bool(__import__("re").fullmatch("(yes|no) [0-9]{3}", d["content"]))')" True
    check "grammar (seed $seed): closed, then the end token" eq "$(py "$T/out" 'd["stop_type"]')" eos
done
LIST='root ::= \"[\" item (\", \" item)* \"]\"\nitem ::= [a-z]+'
req POST /v1/completions -d "{\"prompt\":\"Once upon a time\",\"max_tokens\":24,\"seed\":5,\"grammar\":\"$LIST\"}"
check "grammar on /v1/completions: a prefix of a list" eq "$(py "$T/out" 'bool(__import__("re").fullmatch(r"\[[a-z]+(, [a-z]+)*(, [a-z]*)?\]?|\[[a-z]*", d["choices"][0]["text"]))')" True
curl -sN "$BASE/v1/chat/completions" -d "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":30,\"stream\":true,\"seed\":7,\"grammar\":\"root ::= [0-9]{1,4} \\\".\\\"\"}" >"$T/sse"
check "grammar on streamed chat: the pieces make a number and a dot" eq "$(python3 -c 'import json,sys,re; t="".join((json.loads(l[6:])["choices"][0]["delta"].get("content") or "") for l in open(sys.argv[1]) if l.startswith("data: {") and json.loads(l[6:])["choices"]); print(bool(re.fullmatch(r"[0-9]{1,4}\.", t)))' "$T/sse")" True
req POST /completion -d '{"prompt":"Once","n_predict":4,"grammar":""}'
check "an empty grammar is no grammar" eq "$(code)" 200
req POST /completion -d '{"prompt":"Once","grammar":"root ::= item\n"}'
check "a grammar naming an undefined rule: 400 with line and column" eq "$(code) $(py "$T/out" '(d["error"]["param"], d["error"]["message"])')" "400 ('grammar', \"grammar: line 1, column 10: rule 'item' is never defined\")"
req POST /completion -d '{"prompt":"Once","grammar":"root ::= root \"a\""}'
check "a left-recursive grammar refused" eq "$(code) $(py "$T/out" '"left recursion" in d["error"]["message"]')" "400 True"
req POST /completion -d '{"prompt":"Once","grammar":["root"]}'
check "a grammar that is not a string refused" eq "$(code) $(py "$T/out" 'd["error"]["param"]')" "400 grammar"
req POST /completion -d '{"prompt":"Once","grammar":"root ::= \"a\"","json_schema":{"type":"object"}}'
check "grammar and json_schema together refused" eq "$(code) $(py "$T/out" 'd["error"]["param"]')" "400 grammar"
req POST /v1/chat/completions -d '{"messages":[{"role":"user","content":"x"}],"grammar":"root ::= \"a\"","response_format":{"type":"json_object"}}'
check "grammar and JSON mode together refused" eq "$(code)" 400

# ---- /v1/responses with bad input: a 400 naming the field, never a crash --------------------
for bad in '{"input":5}|input' '{"input":[]}|input' '{"input":[{"role":"robot","content":"x"}]}|input' \
           '{"input":[{"role":"user","content":[{"type":"input_image","image_url":"x"}]}]}|input' \
           '{"input":[{"role":"user","content":7}]}|input' \
           '{"input":[{"type":"function_call","name":"f","arguments":"{}"}]}|input' \
           '{"input":[{"type":"function_call_output","call_id":"c","output":5}]}|input' \
           '{"input":"x","instructions":5}|instructions' '{"input":"x","max_output_tokens":0}|max_output_tokens' \
           '{"input":"x","text":{"format":{"type":"grammar"}}}|text.format' \
           '{"input":"x","text":{"format":{"type":"json_schema","schema":5}}}|text.format' \
           '{"input":"x","tools":[{"type":"function"}]}|tools' '{"input":"x","tool_choice":{"type":"function"}}|tool_choice'; do
    req POST /v1/responses -d "${bad%|*}"
    check "responses: ${bad%|*} refused naming ${bad#*|}" eq "$(code) $(py "$T/out" 'd["error"]["param"]')" "400 ${bad#*|}"
done
req POST /v1/responses -d '{"input":"x"'
check "responses: broken JSON 400" eq "$(code)" 400

req POST /detokenize -d '{"tokens":[1,99999]}'
check "detokenize refuses an id outside the vocabulary" eq "$(py "$T/out" 'd["error"]["param"]')" tokens
req POST /tokenize -d '{"content":42}'
check "tokenize: content not a string 400" eq "$(code)" 400
req POST /tokenize -d '{"content":"x"'
check "tokenize: broken JSON 400" eq "$(code)" 400
req POST /detokenize -d '{"tokens":"1 2"}'
check "detokenize: tokens not an array 400" eq "$(code)" 400
req POST /detokenize -d '{"tokens":[1,"x",2.5]}'
check "detokenize: non-integer ids 400" eq "$(code)" 400
# a request's own deadline ("timeout", seconds): the stream ends early, as "length"
req POST /v1/completions -d '{"prompt":"Once","max_tokens":480,"ignore_eos":true,"timeout":0.001}'
check "timeout ends the request early" eq "$(py "$T/out" 'd["usage"]["completion_tokens"] < 480')" True
check "a deadline reads as length" eq "$(py "$T/out" 'd["choices"][0]["finish_reason"]')" length
req POST /v1/completions -d '{"prompt":"Once","timeout":-1}'
check "a negative timeout is refused" eq "$(code)" 400
req GET /v1/nothing
check "unknown path 404" eq "$(code)" 404
req GET /v1/chat/completions
check "wrong method 405" eq "$(code)" 405
req DELETE /v1/models
check "DELETE where it is not taken: 405" eq "$(code)" 405
# Anthropic's Messages API fed bad input: each a 400 in Anthropic's error shape
for bad in '{"max_tokens":4,"messages":"x"}|messages' '{"max_tokens":4,"messages":[]}|messages' \
           '{"max_tokens":4,"messages":[{"role":"user","content":5}]}|messages' \
           '{"max_tokens":4,"messages":[{"role":"assistant","content":[{"type":"tool_use","name":"f"}]}]}|tool_use' \
           '{"max_tokens":4,"messages":[{"role":"user","content":[{"type":"tool_result","content":"x"}]}]}|tool_result' \
           '{"max_tokens":0,"messages":[{"role":"user","content":"x"}]}|max_tokens' \
           '{"max_tokens":4,"system":7,"messages":[{"role":"user","content":"x"}]}|system' \
           '{"max_tokens":4,"tools":[{"input_schema":{}}],"messages":[{"role":"user","content":"x"}]}|tools' \
           '{"max_tokens":4,"tool_choice":{"type":"maybe"},"messages":[{"role":"user","content":"x"}]}|tool_choice' \
           '{"max_tokens":4,"thinking":{"type":"on"},"messages":[{"role":"user","content":"x"}]}|thinking'; do
    req POST /v1/messages -d "${bad%|*}"
    check "messages: ${bad%|*} refused naming ${bad##*|}" eq "$(code) $(py "$T/out" '(d["type"], d["error"]["type"], sys.argv[3] in d["error"]["message"])' "${bad##*|}")" "400 ('error', 'invalid_request_error', True)"
done
# ... and refused before its handler runs: broken JSON, a body over the limit, an unknown model
req POST /v1/messages -d '{"max_tokens":4,'
check "messages: broken JSON in Anthropic's shape" eq "$(code) $(py "$T/out" '(d["type"], d["error"]["type"], "line 1" in d["error"]["message"])')" "400 ('error', 'invalid_request_error', True)"
req POST /v1/messages --data-binary @"$T/big"
check "messages: 413 in Anthropic's shape" eq "$(code) $(py "$T/out" '(d["type"], d["error"]["type"])')" "413 ('error', 'request_too_large')"
req POST /v1/messages/count_tokens -d '{"model":"claude-x","messages":[{"role":"user","content":"x"}]}'
check "count_tokens: unknown model 404 in Anthropic's shape" eq "$(code) $(py "$T/out" '(d["type"], d["error"]["type"])')" "404 ('error', 'not_found_error')"
req DELETE /v1/responses/resp_nope
check "DELETE of no stored response: 404" eq "$(code)" 404
req GET /v1/responses/resp_nope
check "GET of no stored response: 404" eq "$(code) $(py "$T/out" '"resp_nope" in d["error"]["message"]')" "404 True"
check "error shape has all four keys" eq "$(py "$T/out" 'sorted(d["error"])')" "['code', 'message', 'param', 'type']"

# ---- stats and metrics -----------------------------------------------------------------------
req GET /stats
check "stats 200" eq "$(code)" 200
check "stats state ready" eq "$(py "$T/out" 'd["state"]')" ready
check "stats kv blocks used 0 when idle" eq "$(py "$T/out" 'd["kv"]["blocks_used"]')" 0
req GET /metrics
check "metrics 200" eq "$(code)" 200
for m in lmserv_requests_total lmserv_prompt_tokens_total lmserv_generation_tokens_total \
    lmserv_time_to_first_token_seconds_bucket lmserv_inter_token_latency_seconds_bucket \
    lmserv_num_requests_waiting lmserv_kv_blocks_used lmserv_kv_blocks_cached \
    lmserv_prefix_cache_queries_total lmserv_prefix_cache_hits_total; do
    check "metric $m" grep -q "^$m" "$T/out"
done
check "requests by status" grep -q '^lmserv_requests_total{status="length"} [1-9]' "$T/out"

# ---- a client that goes away mid-stream: its request is aborted ---------------------------
curl -s -N -m 0.3 "$BASE/v1/completions" \
    -d '{"prompt":"Once","max_tokens":480,"ignore_eos":true,"stream":true}' >/dev/null 2>&1
for _ in $(seq 50); do
    req GET /stats
    [ "$(py "$T/out" 'd["live_requests"]')" = 0 ] && break
    sleep 0.05
done
check "no live request after the client left" eq "$(py "$T/out" 'd["live_requests"]')" 0
check "KV blocks freed after the client left" eq "$(py "$T/out" 'd["kv"]["blocks_used"]')" 0

# ---- a body without Content-Length (chunked upload): 411 --------------------------------------
exec 7<>"/dev/tcp/127.0.0.1/$PORT"
(trap '' PIPE; printf 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{"a":\r\n' >&7) || true
read -r -t 5 status_line <&7
exec 7>&-
check "chunked upload refused with 411 ($status_line)" grep -q ' 411 ' <<<"$status_line"

stop_server
check "SIGTERM exits 0" eq "$SRV_RC" 0

# ---- queue full: 429 ------------------------------------------------------------------------------
start_server -c 512 --parallel 1 --queue 1
QPIDS=""
for i in 1 2 3 4 5 6; do
    curl -s -o "$T/q.$i" -w '%{http_code}' "$BASE/v1/completions" \
        -d '{"prompt":"Once","max_tokens":480,"ignore_eos":true}' >"$T/qc.$i" &
    QPIDS="$QPIDS $!"
done
wait $QPIDS
check "queue full gives 429" grep -q 429 "$T"/qc.*
check "429 says why" grep -q '"code":"queue_full"' "$T"/q.*
check "the accepted ones complete" grep -q 200 "$T"/qc.*
stop_server

# ---- connection limit ----------------------------------------------------------------------------
start_server -c 512 --max-conns 2
# Wait until the readiness probe's connection is gone (only the asking one is open).
for _ in $(seq 50); do
    req GET /stats
    [ "$(py "$T/out" 'd["connections"]["http"]')" = 1 ] && break
    sleep 0.05
done
# Each of the two connections completes one keep-alive request first, so the
# server has certainly accepted (and counts) both before the third one comes.
exec 7<>"/dev/tcp/127.0.0.1/$PORT" 8<>"/dev/tcp/127.0.0.1/$PORT"
for fd in 7 8; do
    printf 'GET /health HTTP/1.1\r\nHost: x\r\n\r\n' >&$fd
    read -r -t 5 status_line <&$fd || status_line=none
    check "held connection $fd answered ($status_line)" grep -q ' 200 ' <<<"$status_line"
done
check "a connection over --max-conns is refused" [ "$(curl -s -o /dev/null -w '%{http_code}' "$BASE/health")" = 000 ]
exec 7>&- 8>&-
sleep 0.2
req GET /health
check "accepted again once connections close" eq "$(code)" 200
stop_server

# ---- a model that cannot load: the server says why and exits 1 -----------------------------
"$LMSERV" serve -m /nonexistent/model.gguf --host 127.0.0.1 --port 0 >"$T/fail" 2>&1
check "a model that cannot load exits 1" eq "$?" 1
check "and says which model" grep -q "cannot serve '/nonexistent/model.gguf'" "$T/fail"

# ---- /infill on a model with FIM tokens (a tiny synthetic Qwen2, Qwen2.5's FIM tokens) -----------
"$LMSERV" synth --shape qwen2-tiny --type Q8_0 "$T/fim.gguf" >/dev/null 2>&1
check "synth qwen2-tiny" [ -s "$T/fim.gguf" ]
start_serve -m "$T/fim.gguf" -c 1024 --batch-tokens 256 --parallel 2
INF='{"input_prefix":"def add(a, b):\n    return ","input_suffix":"\n\nprint(add(1, 2))\n","prompt":"a","n_predict":6,"temperature":0,"ignore_eos":true}'
req POST /infill -d "$INF"
check "infill 200, six tokens, the counters of /completion" eq "$(code) $(py "$T/out" '(d["tokens_predicted"], d["stop"], d["stop_type"])')" "200 (6, True, 'limit')"
py "$T/out" 'd["content"]' >"$T/icontent"
# the same prompt spelled out: [PRE]prefix prompt [SUF]suffix [MID] as token ids
req POST /tokenize -d '{"content":"def add(a, b):\n    return "}'
P=$(py "$T/out" 'json.dumps(d["tokens"])')
req POST /tokenize -d '{"content":"a"}'
Q=$(py "$T/out" 'json.dumps(d["tokens"])')
req POST /tokenize -d '{"content":"\n\nprint(add(1, 2))\n"}'
S=$(py "$T/out" 'json.dumps(d["tokens"])')
req POST /tokenize -d '{"content":"<|fim_prefix|><|fim_suffix|><|fim_middle|><|file_sep|><|repo_name|>"}'
F=$(py "$T/out" 'json.dumps(d["tokens"])')
IDS=$(python3 -c 'import json,sys; p,q,s,f = (json.loads(a) for a in sys.argv[1:5]); print(json.dumps([f[0]] + p + q + [f[1]] + s + [f[2]]))' "$P" "$Q" "$S" "$F")
check "the FIM tokens are single special tokens" eq "$(python3 -c 'import json,sys; print(len(json.loads(sys.argv[1])))' "$F")" 5
req POST /completion -d "{\"prompt\":$IDS,\"n_predict\":6,\"temperature\":0,\"ignore_eos\":true}"
check "infill = /completion of [PRE]prefix prompt [SUF]suffix [MID] (llama-server's layout)" eq "$(py "$T/out" 'd["content"]')" "$(cat "$T/icontent")"
check "the same prompt length" eq "$(py "$T/out" 'd["tokens_evaluated"]')" "$(python3 -c 'import json,sys; print(len(json.loads(sys.argv[1])))' "$IDS")"
req POST /infill -d '{"input_prefix":"x = ","input_suffix":"","input_extra":[{"filename":"a.py","text":"y = 1\n"}],"n_predict":2,"temperature":0}'
check "infill with extra files: their tokens count in the prompt" eq "$(code) $(py "$T/out" 'd["tokens_evaluated"] > 8')" "200 True"
py "$T/out" 'd["content"]' >"$T/xcontent"
EX=$(python3 - "$BASE" <<'EOF2'
import json, sys, urllib.request
def tok(s):
    r = urllib.request.Request(sys.argv[1] + "/tokenize", json.dumps({"content": s}).encode())
    return json.load(urllib.request.urlopen(r))["tokens"]
pre, mid, suf, sep, rep = (tok(t)[0] for t in ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|file_sep|>", "<|repo_name|>"))
ids = [rep] + tok("myproject\n") + [sep] + tok("a.py") + tok("\n") + tok("y = 1\n") + [sep] + tok("filename\n")
print(json.dumps(ids + [pre] + tok("x = ") + [suf] + [mid]))
EOF2
)
req POST /completion -d "{\"prompt\":$EX,\"n_predict\":2,\"temperature\":0}"
check "extra files laid out as llama-server: [REP]myproject [SEP]file text ... [SEP]filename, then the FIM part" eq "$(py "$T/out" '(d["tokens_evaluated"], d["content"])')" "$(python3 -c 'import json,sys; print((len(json.loads(sys.argv[1])), open(sys.argv[2]).read()[:-1]))' "$EX" "$T/xcontent")"
# Ollama's and OpenAI's "suffix": the prompt is the text before it, laid out as /infill
req POST /infill -d '{"input_prefix":"def add(a, b):\n    return ","input_suffix":"\n\nprint(add(1, 2))\n","n_predict":6,"temperature":0,"ignore_eos":true}'
py "$T/out" 'd["content"]' >"$T/scontent"
req POST /api/generate -d '{"prompt":"def add(a, b):\n    return ","suffix":"\n\nprint(add(1, 2))\n","stream":false,"options":{"num_predict":6,"temperature":0,"ignore_eos":true}}'
check "ollama generate with a suffix = /infill of that prefix and suffix" eq "$(code) $(py "$T/out" 'd["response"]')" "200 $(cat "$T/scontent")"
req POST /v1/completions -d '{"prompt":"def add(a, b):\n    return ","suffix":"\n\nprint(add(1, 2))\n","max_tokens":6,"temperature":0,"ignore_eos":true}'
check "completions with a suffix = /infill of that prefix and suffix" eq "$(code) $(py "$T/out" 'd["choices"][0]["text"]')" "200 $(cat "$T/scontent")"
req POST /v1/completions -d '{"prompt":[1,2,3],"suffix":"x"}'
check "completions: a suffix with a token-id prompt 400" eq "$(code) $(py "$T/out" 'd["error"]["param"]')" "400 suffix"
req POST /infill -d '{"input_prefix":"x","input_extra":"a.py"}'
check "infill: input_extra not an array 400" eq "$(code) $(py "$T/out" 'd["error"]["param"]')" "400 input_extra"
req POST /infill -d '{"input_prefix":"x","input_extra":[{"filename":3,"text":"y"}]}'
check "infill: a bad extra chunk 400 naming it" eq "$(code) $(py "$T/out" '"input_extra[0]" in d["error"]["message"]')" "400 True"
req POST /infill -d '{"input_prefix":7}'
check "infill: input_prefix not a string 400" eq "$(code)" 400
stop_server

# ---- API key ------------------------------------------------------------------------------------
start_server -c 512 --api-key s3cret
req GET /v1/models
check "no key 401" eq "$(code)" 401
check "401 type" eq "$(py "$T/out" 'd["error"]["type"]')" authentication_error
req GET /v1/models -H 'Authorization: Bearer wrong'
check "wrong key 401" eq "$(code)" 401
req POST /v1/messages -H 'x-api-key: wrong' -d '{"max_tokens":4,"messages":[{"role":"user","content":"x"}]}'
check "messages: 401 in Anthropic's shape" eq "$(code) $(py "$T/out" '(d["type"], d["error"]["type"])')" "401 ('error', 'authentication_error')"
req POST /v1/chat/completions -d '{"messages":[{"role":"user","content":"x"}]}'
check "chat: 401 keeps OpenAI's shape" eq "$(code) $(py "$T/out" 'sorted(d["error"])')" "401 ['code', 'message', 'param', 'type']"
req GET /v1/models -H 'Authorization: Bearer s3cret'
check "right key 200" eq "$(code)" 200
req GET /health
check "health needs no key" eq "$(code)" 200
stop_server

finish
