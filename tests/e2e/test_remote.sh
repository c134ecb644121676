#!/usr/bin/env bash
# Remote experts: one lmserv (the tiny test model, --api-key) is the
# upstream; a second lmserv (--config) serves it as expert "far" next to a
# local expert, plus "badkey" (the same upstream, a wrong key from
# api_key_env), "down" (nothing listens) and experts on fake_openai.py (an
# upstream that answers in one JSON body, too slowly, with an error or
# garbage mid-stream, quoting the key, or making function calls, whole,
# in fragments or malformed). Greedy answers through "far"
# equal the upstream's own, streamed and not, in chat and completions,
# Ollama's routes and both WebSocket dialects, usage included; errors name
# the expert (401 passes, a dead upstream is 502, a slow one 504); closing
# a streamed request aborts the upstream's; /v1/models, /stats and
# /metrics show "far" as remote; the key shows nowhere (listings, log,
# errors). Tools on /v1/responses and /v1/messages reach the upstream in
# chat's words (tools, tool_choice, text.format as response_format, the
# calls and results of earlier turns as tool_calls and tool messages), and
# its calls come back as function_call items and tool_use blocks, streamed
# and not; on /v1/chat/completions tools, tool_choice, parallel_tool_calls
# and response_format go as written (tool_choice "none" sends no tools)
# and the calls come back as
# message.tool_calls or a delta.tool_calls chunk, on Ollama's /api/chat
# (its calls given ids upstream) as message.tool_calls; a malformed call
# is a 502 naming it, or an error event once streaming.
. "$(dirname "$0")/lib.sh"
T=$(mktemp -d)
# libcurl (the servers' and ours) follows http_proxy: keep local traffic local
export no_proxy=127.0.0.1,localhost NO_PROXY=127.0.0.1,localhost
KEY="sk-test-$(date +%s%N)"
UP_PID="" UP_LOG="" FAKE_PID=""
trap 'cleanup; [ -n "$UP_PID" ] && kill -KILL "$UP_PID" 2>/dev/null;
      [ -n "$FAKE_PID" ] && kill -KILL "$FAKE_PID" 2>/dev/null;
      [ -n "$UP_LOG" ] && [ -z "${KEEP_LOG:-}" ] && rm -f "$UP_LOG"; rm -rf "$T"' EXIT

# ---- a misbehaving upstream (fake_openai.py) ------------------------------------------
python3 "$(dirname "$0")/fake_openai.py" >"$T/fake.port" 2>/dev/null &
FAKE_PID=$!
for _ in $(seq 100); do [ -s "$T/fake.port" ] && break; sleep 0.05; done
FAKE="http://127.0.0.1:$(cat "$T/fake.port")/v1"

# ---- upstream ------------------------------------------------------------------
start_server --api-key "$KEY" -c 8192
UP_PID=$SRV_PID UP_BASE=$BASE UP_LOG=$LOG
SRV_PID="" LOG=""
curl -s -H "Authorization: Bearer $KEY" "$UP_BASE/v1/models" >"$T/upmodels"
UP_MODEL=$(py "$T/upmodels" "d['data'][0]['id']")
[ -n "$UP_MODEL" ] || die "the upstream lists no model"

cat >"$T/cfg.json" <<JSON
{"experts": [
  {"expert_id": "local", "model_path": "$MODEL", "domain": "stories"},
  {"expert_id": "far", "endpoint": "$UP_BASE/v1/", "api_key": "$KEY", "remote_model": "$UP_MODEL",
   "domain": "far away", "timeout_s": 30},
  {"expert_id": "badkey", "endpoint": "$UP_BASE/v1", "api_key_env": "LMS_TEST_BAD_KEY"},
  {"expert_id": "down", "endpoint": "http://127.0.0.1:1/v1"},
  {"expert_id": "json", "endpoint": "$FAKE", "api_key": "fake-key"},
  {"expert_id": "slow", "endpoint": "$FAKE", "timeout_s": 1},
  {"expert_id": "midfail", "endpoint": "$FAKE"},
  {"expert_id": "garbage", "endpoint": "$FAKE"},
  {"expert_id": "echokey", "endpoint": "$FAKE", "api_key": "fake-secret-key"},
  {"expert_id": "thinker", "endpoint": "$FAKE"},
  {"expert_id": "thinkjson", "endpoint": "$FAKE"},
  {"expert_id": "tooler", "endpoint": "$FAKE"},
  {"expert_id": "tooljson", "endpoint": "$FAKE"},
  {"expert_id": "badargs", "endpoint": "$FAKE"},
  {"expert_id": "noname", "endpoint": "$FAKE"},
  {"expert_id": "junkcall", "endpoint": "$FAKE"}],
 "router": {"default": "local"}}
JSON
LMS_TEST_BAD_KEY=wrong-key start_serve --config "$T/cfg.json" -c 512

up() { # METHOD PATH [curl args]: to the upstream directly
    local m=$1 p=$2
    shift 2
    curl -s -X "$m" -o "$T/up" -w '%{http_code}' "$UP_BASE$p" -H "Authorization: Bearer $KEY" "$@" \
        >"$T/upcode"
}

# ---- listing --------------------------------------------------------------------------
req GET /v1/models
check "models 200" eq "$(code)" 200
check "far is remote" eq "$(py "$T/out" "[m['lmserv']['state'] for m in d['data'] if m['id']=='far'][0]")" remote
check "far's endpoint" eq "$(py "$T/out" "[m['lmserv']['endpoint'] for m in d['data'] if m['id']=='far'][0]")" \
    "$UP_BASE/v1"
check "no key in /v1/models" eval "! grep -q -- '$KEY' '$T/out'"

# ---- chat, not streamed ------------------------------------------------------------------
CHAT='"messages":[{"role":"user","content":"Once upon a time"}],"temperature":0,"max_tokens":24'
up POST /v1/chat/completions -d "{\"model\":\"$UP_MODEL\",$CHAT}"
check "upstream chat 200" eq "$(cat "$T/upcode")" 200
WANT=$(py "$T/up" "d['choices'][0]['message']['content']")
WANT_USAGE=$(py "$T/up" "(d['usage']['prompt_tokens'], d['usage']['completion_tokens'])")
check "upstream said something" test -n "$WANT"
req POST /v1/chat/completions -d "{\"model\":\"far\",$CHAT}"
check "far chat 200" eq "$(code)" 200
check "far chat text" eq "$(py "$T/out" "d['choices'][0]['message']['content']")" "$WANT"
check "far chat model" eq "$(py "$T/out" "d['model']")" far
check "far chat usage" eq "$(py "$T/out" "(d['usage']['prompt_tokens'], d['usage']['completion_tokens'])")" \
    "$WANT_USAGE"
check "far chat finish" eq "$(py "$T/out" "d['choices'][0]['finish_reason']")" \
    "$(py "$T/up" "d['choices'][0]['finish_reason']")"

# Anthropic's Messages API on a remote expert: the same conversation upstream
MSGS='"messages":[{"role":"user","content":"Once upon a time"}],"temperature":0,"max_tokens":24'
req POST /v1/messages -d "{\"model\":\"far\",$MSGS}"
check "far messages: the upstream's text" eq "$(py "$T/out" "d['content'][0]['text']")" "$WANT"
check "far messages: one text block, stop_reason, usage" eq "$(py "$T/out" "(len(d['content']), d['content'][0]['type'], d['stop_reason'], d['usage']['output_tokens'])")" \
    "(1, 'text', '$([ "$(py "$T/up" "d['choices'][0]['finish_reason']")" = length ] && echo max_tokens || echo end_turn)', $(py "$T/up" "d['usage']['completion_tokens']"))"
curl -sN "$BASE/v1/messages" -d "{\"model\":\"far\",\"stream\":true,$MSGS}" >"$T/asse"
check "far messages streamed: text_delta pieces make the text" eq "$(python3 -c 'import json,sys
ev=[json.loads(l[6:]) for l in open(sys.argv[1]) if l.startswith("data: ")]
print("".join(e["delta"]["text"] for e in ev if e["type"]=="content_block_delta"))' "$T/asse")" "$WANT"
check "far messages streamed: message_start first, message_stop last" eq "$(python3 -c 'import json,sys
ev=[json.loads(l[6:]) for l in open(sys.argv[1]) if l.startswith("data: ")]
print(ev[0]["type"], ev[-1]["type"])' "$T/asse")" "message_start message_stop"
req POST /v1/messages -d '{"model":"thinker","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}'
check "messages on an upstream thinking model: a thinking block, then text" eq "$(py "$T/out" "[(b['type'], b.get('thinking', b.get('text'))) for b in d['content']]")" "[('thinking', 'Let me think'), ('text', 'The answer')]"
req POST /v1/messages -d '{"model":"down","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hi"}]}'
check "messages, upstream down, streamed: an HTTP 502 in Anthropic's shape" eq "$(code) $(py "$T/out" "d['type']")" "502 error"
req POST /v1/messages/count_tokens -d '{"model":"far","messages":[{"role":"user","content":"hi"}]}'
check "count_tokens on a remote expert: 400" eq "$(code)" 400
# the Responses API on a remote expert
req POST /v1/responses -d '{"model":"far","input":"Once upon a time","temperature":0,"max_output_tokens":24}'
check "far responses: the upstream's text" eq "$(py "$T/out" "d['output'][-1]['content'][0]['text']")" "$WANT"
check "far responses: one message, usage" eq "$(py "$T/out" "([o['type'] for o in d['output']], d['usage']['output_tokens'])")" "(['message'], $(py "$T/up" "d['usage']['completion_tokens']"))"
curl -sN "$BASE/v1/responses" -d '{"model":"far","input":"Once upon a time","temperature":0,"max_output_tokens":24,"stream":true}' >"$T/rsse"
check "far responses streamed: the deltas make the text" eq "$(python3 -c 'import json,sys
ev=[json.loads(l[6:]) for l in open(sys.argv[1]) if l.startswith("data: ")]
print("".join(e["delta"] for e in ev if e["type"]=="response.output_text.delta"))' "$T/rsse")" "$WANT"
req POST /v1/responses -d '{"model":"thinker","input":"hi"}'
check "responses on an upstream thinking model: a reasoning item, then the message" eq "$(py "$T/out" "[(o['type'], o['content'][0]['text']) for o in d['output']]")" "[('reasoning', 'Let me think'), ('message', 'The answer')]"
req POST /v1/responses -d '{"model":"down","input":"hi","stream":true}'
check "responses, upstream down, streamed: an HTTP 502" eq "$(code)" 502

# ---- tools on a remote expert (fake_openai.py's tooler, tooljson, badargs, noname) -----------
last() { curl -s "${FAKE%/v1}/last" >"$T/last"; py "$T/last" "$1"; }
evs() { # FILE EXPR: EXPR over ev, the data of the streamed events
    python3 -c 'import json,sys; ev=[json.loads(l[6:]) for l in open(sys.argv[1]) if l.startswith("data: {")]; print(eval(sys.argv[2]))' "$@"
}
WANT_CALLS="[('get_weather', {'city': 'Paris', 'unit': 'C'}), ('get_time', {'tz': 'CET'})]"
CHAT_TOOLS="[{'type': 'function', 'function': {'name': 'get_weather', 'description': 'Weather', 'parameters': {'type': 'object'}}}, {'type': 'function', 'function': {'name': 'get_time', 'parameters': {}}}]"
RTOOLS='"tools":[{"type":"function","name":"get_weather","description":"Weather","parameters":{"type":"object"}},{"type":"function","name":"get_time"}]'
for m in tooler tooljson; do
    req POST /v1/responses -d "{\"model\":\"$m\",\"input\":\"Weather in Paris?\",$RTOOLS,\"tool_choice\":\"required\"}"
    check "responses, $m: the text, then two function_call items" eq "$(code) $(py "$T/out" "(d['status'], [o['type'] for o in d['output']], d['output'][0]['content'][0]['text'])")" \
        "200 ('completed', ['message', 'function_call', 'function_call'], 'Let me check.')"
    check "responses, $m: the calls put together" eq "$(py "$T/out" "[(o['name'], json.loads(o['arguments'])) for o in d['output'][1:]]")" "$WANT_CALLS"
done
check "responses: tools and tool_choice went upstream in chat's form" eq "$(last "(d['body']['tools'], d['body']['tool_choice'])")" "($CHAT_TOOLS, 'required')"
RESP1=$(py "$T/out" "d['id']")
CALLS_IN=$(py "$T/out" "json.dumps([{k: o[k] for k in ('type', 'call_id', 'name', 'arguments')} for o in d['output'][1:]])")
curl -sN "$BASE/v1/responses" -d "{\"model\":\"tooler\",\"stream\":true,\"input\":\"Weather?\",$RTOOLS}" >"$T/rsse"
check "responses streamed, tooler: the text, then each call's added, arguments delta and done, item done" eq \
    "$(evs "$T/rsse" "([e['type'] for e in ev if 'function_call' in e['type'] or e.get('item', {}).get('type') == 'function_call'], ''.join(e['delta'] for e in ev if e['type'] == 'response.output_text.delta'), ev[-1]['type'])")" \
    "(['response.output_item.added', 'response.function_call_arguments.delta', 'response.function_call_arguments.done', 'response.output_item.done', 'response.output_item.added', 'response.function_call_arguments.delta', 'response.function_call_arguments.done', 'response.output_item.done'], 'Let me check.', 'response.completed')"
check "responses streamed, tooler: the calls, and in the completed response" eq \
    "$(evs "$T/rsse" "([(e['item']['name'], json.loads(e['item']['arguments'])) for e in ev if e['type'] == 'response.output_item.done' and e['item']['type'] == 'function_call'] == [(o['name'], json.loads(o['arguments'])) for o in ev[-1]['response']['output'][1:]], [(e['item']['name'], json.loads(e['item']['arguments'])) for e in ev if e['type'] == 'response.output_item.done' and e['item']['type'] == 'function_call'])")" \
    "(True, $WANT_CALLS)"
# the round trip: the calls and their outputs in the input, or after previous_response_id
OUTS=$(python3 -c 'import json,sys; c=json.loads(sys.argv[1]); print(json.dumps([{"type": "function_call_output", "call_id": x["call_id"], "output": o} for x, o in zip(c, ["18C", "12:00"])]))' "$CALLS_IN")
python3 -c 'import json,sys; c=json.loads(sys.argv[1]); o=json.loads(sys.argv[2]); print(json.dumps({"model": "tooler", "input": [{"role": "user", "content": "Weather in Paris?"}] + c + o, "tools": [{"type": "function", "name": "get_weather"}]}))' "$CALLS_IN" "$OUTS" >"$T/rt.json"
req POST /v1/responses -d @"$T/rt.json"
check "responses round trip: the tool results reach the upstream" eq "$(code) $(py "$T/out" "d['output'][-1]['content'][0]['text']")" "200 tool said: 18C | 12:00"
check "responses round trip: upstream got assistant tool_calls (arguments as text), then tool messages" eq \
    "$(last "[(m['role'], [(c['id'], c['type'], c['function']['name'], json.loads(c['function']['arguments'])) for c in m.get('tool_calls', [])], m.get('tool_call_id'), m['content']) for m in d['body']['messages']]")" \
    "$(python3 -c 'import json,sys; c=json.loads(sys.argv[1]); print([("user", [], None, "Weather in Paris?"), ("assistant", [(x["call_id"], "function", x["name"], json.loads(x["arguments"])) for x in c], None, ""), ("tool", [], c[0]["call_id"], "18C"), ("tool", [], c[1]["call_id"], "12:00")])' "$CALLS_IN")"
python3 -c 'import json,sys; print(json.dumps({"model": "tooler", "previous_response_id": sys.argv[1], "input": json.loads(sys.argv[2]), "tools": [{"type": "function", "name": "get_weather"}]}))' "$RESP1" "$OUTS" >"$T/rt.json"
req POST /v1/responses -d @"$T/rt.json"
check "responses round trip after previous_response_id" eq "$(code) $(py "$T/out" "d['output'][-1]['content'][0]['text']")" "200 tool said: 18C | 12:00"
req POST /v1/responses -d "{\"model\":\"tooler\",\"input\":\"hi\",$RTOOLS,\"tool_choice\":{\"type\":\"function\",\"name\":\"get_time\"}}"
check "responses: a named tool_choice in chat's form" eq "$(last "d['body']['tool_choice']")" "{'type': 'function', 'function': {'name': 'get_time'}}"
req POST /v1/responses -d "{\"model\":\"tooler\",\"input\":\"hi\",$RTOOLS,\"tool_choice\":\"none\"}"
check "responses: tool_choice none sends no tools (as a local prompt has none)" eq "$(code) $(last "('tools' in d['body'], 'tool_choice' in d['body'])")" "200 (False, False)"
req POST /v1/responses -d '{"model":"tooler","input":"hi","tools":[{"type":"web_search"}]}'
check "responses: a built-in tool is refused naming it" eq "$(code) $(py "$T/out" "d['error']['param']")" "400 tools"
req POST /v1/responses -d '{"model":"tooler","input":"hi","text":{"format":{"type":"json_schema","name":"w","strict":true,"schema":{"type":"object","properties":{"a":{"type":"integer"}}}}}}'
check "responses: text.format json_schema as response_format" eq "$(code) $(last "d['body']['response_format']")" \
    "200 {'type': 'json_schema', 'json_schema': {'name': 'w', 'schema': {'type': 'object', 'properties': {'a': {'type': 'integer'}}}, 'strict': True}}"
req POST /v1/responses -d '{"model":"tooler","input":"hi","text":{"format":{"type":"json_object"}}}'
check "responses: text.format json_object as response_format" eq "$(code) $(last "d['body']['response_format']")" "200 {'type': 'json_object'}"
req POST /v1/responses -d '{"model":"tooler","input":"hi","text":{"format":{"type":"json_schema","name":"w","schema":"no"}}}'
check "responses: a schema that is no object is refused" eq "$(code) $(py "$T/out" "d['error']['param']")" "400 text.format"
req POST /v1/responses -d "{\"model\":\"badargs\",\"input\":\"hi\",$RTOOLS}"
check "responses, arguments that are no JSON object: 502 naming the call" eq "$(code) $(py "$T/out" "'tool call 0 (\'get_weather\'): its arguments are not a JSON object' in d['error']['message']")" "502 True"
curl -sN "$BASE/v1/responses" -d "{\"model\":\"badargs\",\"stream\":true,\"input\":\"hi\",$RTOOLS}" >"$T/rsse"
check "responses streamed, malformed call after text: the text, then an error event naming the call" eq \
    "$(evs "$T/rsse" "(''.join(e['delta'] for e in ev if e['type'] == 'response.output_text.delta'), ev[-1]['type'], 'tool call 0' in ev[-1]['message'], any('function_call' in e['type'] for e in ev))")" \
    "('Checking.', 'error', True, False)"

ATOOLS='"tools":[{"name":"get_weather","description":"Weather","input_schema":{"type":"object"}},{"name":"get_time","input_schema":{}}]'
for m in tooler tooljson; do
    req POST /v1/messages -d "{\"model\":\"$m\",\"max_tokens\":64,$ATOOLS,\"tool_choice\":{\"type\":\"any\"},\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}]}"
    check "messages, $m: a text block, two tool_use blocks, stop_reason tool_use" eq "$(code) $(py "$T/out" "([b['type'] for b in d['content']], d['content'][0]['text'], d['stop_reason'])")" \
        "200 (['text', 'tool_use', 'tool_use'], 'Let me check.', 'tool_use')"
    check "messages, $m: the inputs" eq "$(py "$T/out" "[(b['name'], b['input']) for b in d['content'][1:]]")" "$WANT_CALLS"
done
check "messages: tools and tool_choice any went upstream in chat's form" eq "$(last "(d['body']['tools'], d['body']['tool_choice'])")" "($CHAT_TOOLS, 'required')"
cp "$T/out" "$T/amsg"
curl -sN "$BASE/v1/messages" -d "{\"model\":\"tooler\",\"stream\":true,\"max_tokens\":64,$ATOOLS,\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"}]}" >"$T/asse"
check "messages streamed, tooler: tool_use blocks start with input {}, then input_json_delta, stop" eq \
    "$(evs "$T/asse" "([(e['content_block']['name'], e['content_block']['input']) for e in ev if e['type'] == 'content_block_start' and e['content_block']['type'] == 'tool_use'], [json.loads(''.join(x['delta']['partial_json'] for x in ev if x['type'] == 'content_block_delta' and x['index'] == i)) for i in (1, 2)], sum(e['type'] == 'content_block_stop' for e in ev), [e['delta']['stop_reason'] for e in ev if e['type'] == 'message_delta'], ev[-1]['type'])")" \
    "([('get_weather', {}), ('get_time', {})], [{'city': 'Paris', 'unit': 'C'}, {'tz': 'CET'}], 3, ['tool_use'], 'message_stop')"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps({"model": "tooler", "max_tokens": 64, "tools": [{"name": "get_weather", "input_schema": {}}], "messages": [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": d["content"]}, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": b["id"], "content": r} for b, r in zip(d["content"][1:], ["18C", [{"type": "text", "text": "12:00"}]])]}]}))' "$T/amsg" >"$T/rt.json"
req POST /v1/messages -d @"$T/rt.json"
check "messages round trip: the tool results reach the upstream" eq "$(code) $(py "$T/out" "(d['content'][0]['text'], d['stop_reason'])")" "200 ('tool said: 18C | 12:00', 'end_turn')"
check "messages round trip: upstream got assistant tool_calls (arguments as text), then tool messages" eq \
    "$(last "[(m['role'], [(c['id'], c['type'], c['function']['name'], json.loads(c['function']['arguments'])) for c in m.get('tool_calls', [])], m.get('tool_call_id'), m['content']) for m in d['body']['messages']]")" \
    "$(py "$T/amsg" "[('user', [], None, 'Weather in Paris?'), ('assistant', [(b['id'], 'function', b['name'], b['input']) for b in d['content'][1:]], None, 'Let me check.'), ('tool', [], d['content'][1]['id'], '18C'), ('tool', [], d['content'][2]['id'], '12:00')]")"
req POST /v1/messages -d "{\"model\":\"tooler\",\"max_tokens\":8,$ATOOLS,\"tool_choice\":{\"type\":\"tool\",\"name\":\"get_time\"},\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"
check "messages: tool_choice tool in chat's form" eq "$(last "d['body']['tool_choice']")" "{'type': 'function', 'function': {'name': 'get_time'}}"
req POST /v1/messages -d "{\"model\":\"tooler\",\"max_tokens\":8,$ATOOLS,\"tool_choice\":{\"type\":\"none\"},\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"
check "messages: tool_choice none sends no tools" eq "$(code) $(last "'tools' in d['body']")" "200 False"
req POST /v1/messages -d '{"model":"tooler","max_tokens":8,"tools":[{"type":"bash_20250124","name":"bash"}],"messages":[{"role":"user","content":"hi"}]}'
check "messages: a built-in tool is refused naming it" eq "$(code) $(py "$T/out" "('tools[0]' in d['error']['message'], 'bash_20250124' in d['error']['message'])")" "400 (True, True)"
req POST /v1/messages -d "{\"model\":\"noname\",\"max_tokens\":8,$ATOOLS,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"
check "messages, a call without a name: 502 naming it" eq "$(code) $(py "$T/out" "(d['type'], 'tool call 0 has no function name' in d['error']['message'])")" "502 ('error', True)"
curl -sN "$BASE/v1/messages" -d "{\"model\":\"badargs\",\"stream\":true,\"max_tokens\":8,$ATOOLS,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}" >"$T/asse"
check "messages streamed, malformed call after text: an error event naming the call, no tool_use" eq \
    "$(evs "$T/asse" "(ev[-1]['type'], 'tool call 0' in ev[-1]['error']['message'], any(e.get('content_block', {}).get('type') == 'tool_use' for e in ev))")" \
    "('error', True, False)"
# chat completions and Ollama's /api/chat: tools, tool_choice, parallel_tool_calls and
# response_format go upstream as written; the calls come back as a local model's do
CTOOLS='"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather","parameters":{"type":"object"}}},{"type":"function","function":{"name":"get_time","parameters":{}}}]'
chat_calls() { # FILE: the streamed calls put together by index, [(name, arguments)]
    python3 - "$1" <<'PY'
import json, sys
calls = {}
for line in open(sys.argv[1]):
    if line.startswith("data: {"):
        for c in json.loads(line[6:]).get("choices", []):
            for t in c["delta"].get("tool_calls", []):
                k = calls.setdefault(t["index"], {"name": "", "args": ""})
                k["name"] += t.get("function", {}).get("name") or ""
                k["args"] += t.get("function", {}).get("arguments") or ""
print([(calls[i]["name"], calls[i]["args"]) for i in sorted(calls)])
PY
}
for m in tooler tooljson; do
    req POST /v1/chat/completions -d "{\"model\":\"$m\",$CTOOLS,\"tool_choice\":\"required\",\"parallel_tool_calls\":true,\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}]}"
    check "chat, $m: the text, two tool_calls, finish_reason tool_calls" eq "$(code) $(py "$T/out" "(d['choices'][0]['message']['content'], [(c['type'], c['id'][:5]) for c in d['choices'][0]['message']['tool_calls']], d['choices'][0]['finish_reason'])")" \
        "200 ('Let me check.', [('function', 'call_'), ('function', 'call_')], 'tool_calls')"
    check "chat, $m: the calls put together" eq "$(py "$T/out" "[(c['function']['name'], json.loads(c['function']['arguments'])) for c in d['choices'][0]['message']['tool_calls']]")" "$WANT_CALLS"
    check "chat, $m: tools, tool_choice and parallel_tool_calls went upstream as written" eq \
        "$(last "(d['body']['tools'], d['body']['tool_choice'], d['body']['parallel_tool_calls'])")" "($CHAT_TOOLS, 'required', True)"
done
cp "$T/out" "$T/cmsg"
req POST /v1/chat/completions -d "{\"model\":\"tooler\",$CTOOLS,\"messages\":[{\"role\":\"user\",\"content\":\"just call\"}]}"
check "chat, calls without text: content null" eq "$(code) $(py "$T/out" "(d['choices'][0]['message']['content'], len(d['choices'][0]['message']['tool_calls']), d['choices'][0]['finish_reason'])")" \
    "200 (None, 2, 'tool_calls')"
curl -sN "$BASE/v1/chat/completions" -d "{\"model\":\"tooler\",\"stream\":true,\"stream_options\":{\"include_usage\":true},$CTOOLS,\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}]}" >"$T/csse"
check "chat streamed, tooler: the text, a tool_calls delta (index, id, type, function), finish tool_calls, usage, [DONE]" eq \
    "$(evs "$T/csse" "(''.join(c['delta'].get('content') or '' for e in ev for c in e['choices']), [sorted(t) + sorted(t['function']) for e in ev for c in e['choices'] for t in c['delta'].get('tool_calls', [])], [c['finish_reason'] for e in ev for c in e['choices'] if c['finish_reason']], ev[-1]['usage']['completion_tokens'])") $(tail -n 2 "$T/csse" | head -1)" \
    "('Let me check.', [['function', 'id', 'index', 'type', 'arguments', 'name'], ['function', 'id', 'index', 'type', 'arguments', 'name']], ['tool_calls'], 6) data: [DONE]"
check "chat streamed: the deltas' calls put together by index are the non-streamed ones" eq "$(chat_calls "$T/csse")" \
    "$(py "$T/cmsg" "[(c['function']['name'], c['function']['arguments']) for c in d['choices'][0]['message']['tool_calls']]")"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); m=d["choices"][0]["message"]; print(json.dumps({"model": "tooler", "tools": [{"type": "function", "function": {"name": "get_weather"}}], "messages": [{"role": "user", "content": "Weather in Paris?"}, m] + [{"role": "tool", "tool_call_id": c["id"], "content": r} for c, r in zip(m["tool_calls"], ["18C", "12:00"])]}))' "$T/cmsg" >"$T/rt.json"
req POST /v1/chat/completions -d @"$T/rt.json"
check "chat round trip: the tool results reach the upstream" eq "$(code) $(py "$T/out" "(d['choices'][0]['message']['content'], d['choices'][0]['finish_reason'], 'tool_calls' in d['choices'][0]['message'])")" \
    "200 ('tool said: 18C | 12:00', 'stop', False)"
check "chat round trip: the upstream got the messages as given (assistant tool_calls, tool messages)" eq \
    "$(last "d['body']['messages']")" "$(py "$T/rt.json" "d['messages']")"
req POST /v1/chat/completions -d "{\"model\":\"tooler\",$CTOOLS,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}},\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"
check "chat: a named tool_choice went upstream" eq "$(code) $(last "d['body']['tool_choice']")" "200 {'type': 'function', 'function': {'name': 'get_time'}}"
for st in false true; do
    req POST /v1/chat/completions -d "{\"model\":\"tooler\",\"stream\":$st,$CTOOLS,\"tool_choice\":\"none\",\"parallel_tool_calls\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"
    check "chat (stream $st): tool_choice none sends no tools (as a local prompt has none)" eq \
        "$(code) $(last "[k for k in ('tools', 'tool_choice', 'parallel_tool_calls') if k in d['body']]")" "200 []"
done
check "chat (stream true): tool_choice none, the upstream answered without tools, nothing called" eq \
    "$(grep -c '"tool_calls"' "$T/out") $(grep -o 'no tools' "$T/out" | head -1)" "0 no tools"
req POST /v1/chat/completions -d '{"model":"tooler","messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema","json_schema":{"name":"w","schema":{"type":"object"}}}}'
check "chat: response_format json_schema went upstream" eq "$(code) $(last "d['body']['response_format']")" \
    "200 {'type': 'json_schema', 'json_schema': {'name': 'w', 'schema': {'type': 'object'}}}"
req POST /v1/chat/completions -d '{"model":"tooler","messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_object"}}'
check "chat: response_format json_object went upstream" eq "$(code) $(last "d['body']['response_format']")" "200 {'type': 'json_object'}"
req POST /v1/chat/completions -d '{"model":"tooler","tools":{"a":1},"messages":[{"role":"user","content":"hi"}]}'
check "chat: tools that are no array are refused" eq "$(code) $(py "$T/out" "d['error']['param']")" "400 tools"
req POST /v1/chat/completions -d "{\"model\":\"badargs\",$CTOOLS,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"
check "chat, arguments that are no JSON object: 502 naming the call" eq "$(code) $(py "$T/out" "('tool call 0 (\'get_weather\'): its arguments are not a JSON object' in d['error']['message'], d['error']['code'])")" "502 (True, 'upstream_error')"
req POST /v1/chat/completions -d "{\"model\":\"noname\",\"stream\":true,$CTOOLS,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"
check "chat streamed, a call without a name (nothing sent yet): 502 naming it" eq "$(code) $(py "$T/out" "'tool call 0 has no function name' in d['error']['message']")" "502 True"
curl -sN "$BASE/v1/chat/completions" -d "{\"model\":\"badargs\",\"stream\":true,$CTOOLS,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}" >"$T/csse"
check "chat streamed, malformed call after text: the text, then an error event naming the call, no tool_calls" eq \
    "$(evs "$T/csse" "(''.join(c['delta'].get('content') or '' for e in ev for c in e.get('choices', [])), 'tool call 0' in ev[-1]['error']['message'], any('tool_calls' in c['delta'] for e in ev for c in e.get('choices', [])))") $(tail -n 2 "$T/csse" | head -1)" \
    "('Checking.', True, False) data: [DONE]"
# garbage in the upstream's tool_calls: a clear 502 naming it, or ignored where it is no call at all
junk() { req POST /v1/chat/completions -d "{\"model\":\"junkcall\",$CTOOLS,\"messages\":[{\"role\":\"user\",\"content\":\"$1\"}]}"; }
junk "number name"
check "chat, a call whose name is no string: 502 naming it" eq "$(code) $(py "$T/out" "'tool call 0 has no function name' in d['error']['message']")" "502 True"
junk "index 99"
check "chat, a call index past the calls taken: 502 naming it" eq "$(code) $(py "$T/out" "'tool call index 99' in d['error']['message']")" "502 True"
junk "huge"
check "chat, a call's arguments over 1 MiB: 502 naming the call and the limit" eq "$(code) $(py "$T/out" "'tool call 0: its arguments are over 1048576 bytes' in d['error']['message']")" "502 True"
junk "other"
check "chat, tool_calls that are no array or hold no objects: ignored" eq "$(code) $(py "$T/out" "(d['choices'][0]['message']['content'], d['choices'][0]['message'].get('tool_calls'))")" "200 ('fine', None)"
# Ollama: its calls have no ids and its tool messages name the tool at most
req POST /api/chat -d "{\"model\":\"tooljson\",\"stream\":false,$CTOOLS,\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}]}"
check "ollama chat, tooljson: the text and tool_calls (arguments as objects)" eq "$(code) $(py "$T/out" "(d['message']['content'], [(c['function']['name'], c['function']['arguments']) for c in d['message']['tool_calls']], d['done'])")" \
    "200 ('Let me check.', $WANT_CALLS, True)"
check "ollama chat: the tools went upstream" eq "$(last "d['body']['tools']")" "$CHAT_TOOLS"
req POST /api/chat -d "{\"model\":\"tooler\",$CTOOLS,\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}]}"
check "ollama chat streamed, tooler: the text, then a line with the calls, then done" eq "$(code) $(python3 -c 'import json,sys
ls=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(("".join(x["message"]["content"] for x in ls), [[(c["function"]["name"], c["function"]["arguments"]) for c in x["message"]["tool_calls"]] for x in ls if x["message"].get("tool_calls")], ls[-1]["done"]))' "$T/out")" \
    "200 ('Let me check.', [$WANT_CALLS], True)"
req POST /api/chat -d "{\"model\":\"tooler\",\"stream\":false,$CTOOLS,\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"},{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"function\":{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}},{\"function\":{\"name\":\"get_time\",\"arguments\":{\"tz\":\"CET\"}}}]},{\"role\":\"tool\",\"tool_name\":\"get_time\",\"content\":\"12:00\"},{\"role\":\"tool\",\"content\":\"18C\"}]}"
check "ollama round trip: the tool results reach the upstream" eq "$(code) $(py "$T/out" "d['message']['content']")" "200 tool said: 12:00 | 18C"
check "ollama round trip: calls with ids (arguments as text), tool messages answering them" eq \
    "$(last "[(m['role'], [(c['id'], c['type'], c['function']['name'], c['function']['arguments']) for c in m.get('tool_calls', [])], m.get('tool_call_id')) for m in d['body']['messages']]")" \
    "[('user', [], None), ('assistant', [('call_1_0', 'function', 'get_weather', '{\"city\":\"Paris\"}'), ('call_1_1', 'function', 'get_time', '{\"tz\":\"CET\"}')], None), ('tool', [], 'call_1_1'), ('tool', [], 'call_1_0')]"
check "ollama round trip: tool_name, Ollama's own, not sent upstream" eq "$(py "$T/last" "any('tool_name' in m for m in d['body']['messages'])")" False
req POST /api/chat -d "{\"model\":\"badargs\",\"stream\":false,$CTOOLS,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"
check "ollama chat, malformed call: 502 naming it" eq "$(code) $(py "$T/out" "'tool call 0' in d['error']")" "502 True"
req POST /api/chat -d "{\"model\":\"badargs\",$CTOOLS,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"
check "ollama chat streamed, malformed call after text: the text, then an error line" eq "$(code) $(python3 -c 'import json,sys
ls=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(("".join(x.get("message", {}).get("content", "") for x in ls), "tool call 0" in ls[-1].get("error", ""), any(x.get("message", {}).get("tool_calls") for x in ls)))' "$T/out")" \
    "200 ('Checking.', True, False)"
# the official clients put the streamed calls together as they do a local model's
if command -v node >/dev/null && node_modules_ok; then
    R=$(cd "$E2E_DIR" && BASE="$BASE" timeout 60 node --input-type=module -e '
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";
const base = process.env.BASE;
const o = new OpenAI({ baseURL: `${base}/v1`, apiKey: "x", maxRetries: 0 });
const a = new Anthropic({ baseURL: base, apiKey: "x", maxRetries: 0 });
const fr = await o.responses.stream({ model: "tooler", input: "Weather?",
    tools: [{ type: "function", name: "get_weather", parameters: { type: "object" } }] }).finalResponse();
const fm = await a.messages.stream({ model: "tooler", max_tokens: 64, messages: [{ role: "user", content: "Weather?" }],
    tools: [{ name: "get_weather", input_schema: { type: "object" } }] }).finalMessage();
console.log(JSON.stringify([fr.output.find((x) => x.type === "message").content[0].text, fr.output.filter((x) => x.type === "function_call").map((x) => [x.name, JSON.parse(x.arguments)]),
                            fm.stop_reason, fm.content.filter((b) => b.type === "tool_use").map((b) => [b.name, b.input])]));
' 2>&1)
    check "SDKs: streamed remote calls through OpenAI's ResponseStream and Anthropic's MessageStream" eq "$R" \
        '["Let me check.",[["get_weather",{"city":"Paris","unit":"C"}],["get_time",{"tz":"CET"}]],"tool_use",[["get_weather",{"city":"Paris","unit":"C"}],["get_time",{"tz":"CET"}]]]'
    R=$(cd "$E2E_DIR" && BASE="$BASE" timeout 60 node --input-type=module -e '
import OpenAI from "openai";
const o = new OpenAI({ baseURL: `${process.env.BASE}/v1`, apiKey: "x", maxRetries: 0 });
const s = o.chat.completions.stream({ model: "tooler", messages: [{ role: "user", content: "Weather?" }],
    tools: [{ type: "function", function: { name: "get_weather", parameters: { type: "object" } } }] });
const done = [];
s.on("tool_calls.function.arguments.done", (e) => done.push([e.name, JSON.parse(e.arguments)]));
const c = (await s.finalChatCompletion()).choices[0];
console.log(JSON.stringify([c.message.content, c.finish_reason, c.message.tool_calls.map((x) => [x.type, x.function.name, JSON.parse(x.function.arguments)]), done]));
' 2>&1)
    check "SDK: a streamed remote chat's calls through OpenAI's ChatCompletionStream" eq "$R" \
        '["Let me check.","tool_calls",[["function","get_weather",{"city":"Paris","unit":"C"}],["function","get_time",{"tz":"CET"}]],[["get_weather",{"city":"Paris","unit":"C"}],["get_time",{"tz":"CET"}]]]'
else
    echo "  (no node or SDKs: the client library checks are skipped)"
fi

# ---- chat, streamed ------------------------------------------------------------------------
sse_text() { # FILE KIND: the streamed text (chat deltas or completion text) and the usage
    python3 - "$1" "$2" <<'PY'
import json, sys
text, usage, done = "", None, False
for line in open(sys.argv[1]):
    line = line.strip()
    if not line.startswith("data: "):
        continue
    p = line[6:]
    if p == "[DONE]":
        done = True
        continue
    o = json.loads(p)
    for c in o.get("choices", []):
        text += (c.get("delta", {}).get("content") or "") if sys.argv[2] == "chat" else c.get("text", "")
    if o.get("usage"):
        usage = (o["usage"]["prompt_tokens"], o["usage"]["completion_tokens"])
print(json.dumps([text, usage, done]))
PY
}
req POST /v1/chat/completions -d "{\"model\":\"far\",\"stream\":true,\"stream_options\":{\"include_usage\":true},$CHAT}"
check "far chat stream 200" eq "$(code)" 200
GOT=$(sse_text "$T/out" chat)
check "far chat stream text" eq "$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])[0])' "$GOT")" "$WANT"
check "far chat stream usage+done" eq "$(python3 -c 'import json,sys; v=json.loads(sys.argv[1]); print((tuple(v[1]) if v[1] else None, v[2]))' "$GOT")" \
    "($WANT_USAGE, True)"

CHAT_WANT=$WANT

# ---- Ollama's /api/chat and /api/generate ---------------------------------------------------
OPTS='"options":{"temperature":0,"num_predict":24}'
req POST /api/chat -d "{\"model\":\"far\",\"stream\":false,\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"}],$OPTS}"
check "ollama chat 200" eq "$(code)" 200
check "ollama chat text" eq "$(py "$T/out" "d['message']['content']")" "$CHAT_WANT"
check "ollama chat counts" eq "$(py "$T/out" "(d['prompt_eval_count'], d['eval_count'], d['done'])")" \
    "${WANT_USAGE%)}, True)"
req POST /api/generate -d "{\"model\":\"far\",\"prompt\":\"Once upon a time\",$OPTS}"
check "ollama generate stream 200" eq "$(code)" 200
check "ollama generate stream text" eq "$(python3 -c 'import json,sys; print("".join(json.loads(l).get("response","") for l in open(sys.argv[1]) if l.strip()))' "$T/out")" "$CHAT_WANT"
check "ollama generate done" eq "$(tail -1 "$T/out" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["done"], d["eval_count"])')" "True 24"
req POST /api/chat -d "{\"model\":\"down\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"
check "ollama down: 502" eq "$(code)" 502
check "ollama down: names it" eval "grep -q \"expert 'down'\" '$T/out'"

# ---- the WebSocket dialects (with node) -------------------------------------------------------
if command -v node >/dev/null && [ -d "$E2E_DIR/node_modules/ws" ]; then
    R=$(cd "$E2E_DIR" && PORT="$PORT" timeout 60 node --input-type=module -e '
import { Client } from "./wsclient.mjs";
const c = await Client.open(`ws://127.0.0.1:${process.env.PORT}/ws`);
const out = {};
c.send(JSON.stringify({op: "infer", model: "far", prompt: "Once upon a time",
                       params: {temp: 0, max_tokens: 24}}));
let text = "";
for (;;) {
    const m = await c.next((j) => ["token", "end", "error"].includes(j.op));
    if (m.op === "token") { text += m.content; continue; }
    out.op = m.op === "end" ? [text, m.stats.tokens] : ["error", m.message];
    break;
}
c.send(JSON.stringify({type: "generate", model: "far", session_id: "s1", max_tokens: 24,
                       temperature: 0, messages: [{role: "user", content: "Once upon a time"}]}));
let m = await c.next((j) => ["done", "error"].includes(j.type));
out.type = m.type === "done" ? m.content : "error: " + m.message;
c.send(JSON.stringify({type: "generate", model: "down", session_id: "s2", prompt: "hi"}));
m = await c.next((j) => ["done", "error"].includes(j.type));
out.down = m.type === "error" ? m.message : "not an error";
c.send(JSON.stringify({op: "infer", model: "far", prompt: "Once",
                       params: {max_tokens: 8000, ignore_eos: true, temp: 0}}));
await c.next((j) => j.op === "token");
c.send(JSON.stringify({op: "abort"}));
m = await c.next((j) => ["end", "error"].includes(j.op));
out.abort = m.op === "end" ? m.finish_reason : "error";
console.log(JSON.stringify(out));
c.close();
')
    check "ws op: same text, 24 tokens" eq "$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["op"])' "$R")" \
        "$(python3 -c 'import sys; print([sys.argv[1], 24])' "$CHAT_WANT")"
    check "ws type: same text" eq "$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["type"])' "$R")" "$CHAT_WANT"
    check "ws op: abort ends it" eq "$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["abort"])' "$R")" abort
    ws_down() { printf '%s' "$R" | grep -q "\"down\":\"expert 'down'"; }
    check "ws type: down names it" ws_down
else
    echo "  (no node: the WebSocket checks are skipped)"
fi

# ---- completions -------------------------------------------------------------------------------
CMPL='"prompt":"The little dog","temperature":0,"max_tokens":20'
up POST /v1/completions -d "{\"model\":\"$UP_MODEL\",$CMPL}"
WANT=$(py "$T/up" "d['choices'][0]['text']")
WANT_USAGE=$(py "$T/up" "(d['usage']['prompt_tokens'], d['usage']['completion_tokens'])")
req POST /v1/completions -d "{\"model\":\"far\",$CMPL}"
check "far completion 200" eq "$(code)" 200
check "far completion text" eq "$(py "$T/out" "d['choices'][0]['text']")" "$WANT"
check "far completion usage" eq "$(py "$T/out" "(d['usage']['prompt_tokens'], d['usage']['completion_tokens'])")" \
    "$WANT_USAGE"
req POST /v1/completions -d "{\"model\":\"far\",\"stream\":true,$CMPL}"
check "far completion stream" eq "$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])[0])' "$(sse_text "$T/out" completion)")" "$WANT"
req POST /v1/completions -d "{\"model\":\"far\",\"n\":2,\"prompt\":[\"a\",\"b\"],\"temperature\":0,\"max_tokens\":4}"
check "far: 2 prompts x n 2" eq "$(py "$T/out" "sorted(c['index'] for c in d['choices'])")" "[0, 1, 2, 3]"

# ---- the router may choose a remote expert ---------------------------------------------------------
req POST /v1/chat/completions -d '{"messages":[{"role":"user","content":"far away"}],"max_tokens":4}'
check "routed to far" eq "$(code) $(py "$T/out" "d['model']")" "200 far"

# ---- what stays local ----------------------------------------------------------------------------
req POST /v1/embeddings -d '{"model":"far","input":"hi"}'
check "far embeddings 400" eq "$(code)" 400
check "names the remote expert" eval "grep -q \"'far' is a remote expert\" '$T/out'"
req POST /v1/chat/completions -d "{\"model\":\"far\",\"logprobs\":true,$CHAT}"
check "far logprobs 400" eq "$(code)" 400

# ---- errors ------------------------------------------------------------------------------------------
req POST /v1/chat/completions -d "{\"model\":\"down\",$CHAT}"
check "down: 502" eq "$(code)" 502
check "down: names it" eval "grep -q \"expert 'down'\" '$T/out'"
req POST /v1/chat/completions -d "{\"model\":\"down\",\"stream\":true,$CHAT}"
check "down streamed: 502" eq "$(code)" 502
req POST /v1/chat/completions -d "{\"model\":\"badkey\",$CHAT}"
check "wrong key: 401" eq "$(code)" 401
check "wrong key: names it" eval "grep -q \"expert 'badkey'\" '$T/out'"
check "wrong key: not shown" eval "! grep -q wrong-key '$T/out' '$LOG'"

# ---- odd upstreams -------------------------------------------------------------------------------------
req POST /v1/chat/completions -d '{"model":"json","n":1,"lora":[],"messages":[{"role":"user","content":"hi"}]}'
check "whole JSON answer" eq "$(py "$T/out" "(d['choices'][0]['message']['content'], d['choices'][0]['finish_reason'], d['usage']['prompt_tokens'])")" \
    "('whole answer', 'length', 7)"
curl -s "${FAKE%/v1}/last" >"$T/last"
check "sent upstream: model, stream, usage asked, ours removed, key" eq \
    "$(py "$T/last" "(d['path'], d['body']['model'], d['body']['stream'], d['body']['stream_options'], 'n' in d['body'], 'lora' in d['body'], d['auth'])")" \
    "('/v1/chat/completions', 'json', True, {'include_usage': True}, False, False, 'Bearer fake-key')"
req POST /v1/chat/completions -d '{"model":"slow","messages":[{"role":"user","content":"hi"}]}'
check "too slow: 504" eq "$(code)" 504
check "too slow: names it" eval "grep -q \"expert 'slow'\" '$T/out'"
req POST /v1/chat/completions -d '{"model":"midfail","stream":true,"messages":[{"role":"user","content":"hi"}]}'
check "error mid-stream: in the stream" eval "grep -q 'boom in the middle' '$T/out' && grep -q 'DONE' '$T/out'"
req POST /v1/chat/completions -d '{"model":"garbage","messages":[{"role":"user","content":"hi"}]}'
check "not JSON: 502" eq "$(code)" 502
req POST /v1/chat/completions -d '{"model":"echokey","messages":[{"role":"user","content":"hi"}]}'
check "a quoted key is masked" eq "$(code) $(grep -c fake-secret-key "$T/out") $(grep -c 'refused Bearer \*\*\*' "$T/out")" "401 0 1"
# an upstream thinking model: its reasoning_content comes back apart
req POST /v1/chat/completions -d '{"model":"thinker","messages":[{"role":"user","content":"hi"}]}'
check "upstream thoughts: reasoning_content apart from content" eq "$(py "$T/out" '(d["choices"][0]["message"]["reasoning_content"], d["choices"][0]["message"]["content"])')" "('Let me think', 'The answer')"
curl -sN "$BASE/v1/chat/completions" -d '{"model":"thinker","stream":true,"messages":[{"role":"user","content":"hi"}]}' >"$T/tsse"
check "upstream thoughts streamed: reasoning_content deltas, then content" eq "$(python3 -c 'import json,sys
d=[json.loads(l[6:])["choices"][0]["delta"] for l in open(sys.argv[1]) if l.startswith("data: {") and json.loads(l[6:])["choices"]]
print(("".join(x.get("reasoning_content","") for x in d), "".join(x.get("content") or "" for x in d)))' "$T/tsse")" "('Let me think', 'The answer')"
req POST /v1/chat/completions -d '{"model":"thinkjson","messages":[{"role":"user","content":"hi"}]}'
check "upstream whole answer with thoughts: apart" eq "$(py "$T/out" '(d["choices"][0]["message"]["reasoning_content"], d["choices"][0]["message"]["content"])')" "('Mull it over', 'Done')"
req POST /v1/chat/completions -d '{"model":"thinker","reasoning_format":"none","messages":[{"role":"user","content":"hi"}]}'
check "upstream thoughts with reasoning_format none: in the content, tagged" eq "$(py "$T/out" 'd["choices"][0]["message"]["content"]')" "$(printf '<think>\nLet me think\n</think>\n\nThe answer')"

# ---- abort: the client goes, the upstream request stops --------------------------------------------------
aborted() { # the upstream's aborted requests
    up GET /stats
    py "$T/up" "d['requests']['abort']"
}
sleep 0.3 # the WebSocket abort above has reached the upstream
A0=$(aborted)
curl -s -N --max-time 0.3 "$BASE/v1/completions" -d \
    '{"model":"far","stream":true,"prompt":"Once","max_tokens":8000,"ignore_eos":true,"temperature":0}' \
    >/dev/null 2>&1
ok=0
for _ in $(seq 100); do
    [ "$(aborted)" -gt "$A0" ] 2>/dev/null && { ok=1; break; }
    sleep 0.05
done
check "abort reaches the upstream" test "$ok" = 1
req GET /stats
check "stats: far counts its abort" test "$(py "$T/out" "[m['remote']['aborted'] for m in d['models'] if m['id']=='far'][0]")" -ge 1
check "no key in /stats" eval "! grep -q -- '$KEY' '$T/out'"
req GET /metrics
check "metrics: far is remote" grep -q '^lmserv_model_state{model="far",state="remote"} 1' "$T/out"
check "metrics: far's requests" grep -Eq '^lmserv_model_requests_total\{model="far"\} [1-9]' "$T/out"
check "no key in /metrics" eval "! grep -q -- '$KEY' '$T/out'"
check "no key in the log" eval "! grep -q -- '$KEY' '$LOG'"

# ---- config errors name the field -------------------------------------------------------------------------
bad_cfg() { # JSON, expected text in the error
    echo "$1" >"$T/bad.json"
    "$LMSERV" serve --config "$T/bad.json" --port 0 >"$T/bad.out" 2>&1 && return 1
    grep -q -- "$2" "$T/bad.out" || { echo "    $(tail -1 "$T/bad.out")"; return 1; }
}
check "endpoint + model_path" bad_cfg \
    '{"experts":[{"expert_id":"a","endpoint":"http://h/v1","model_path":"x.gguf"}]}' \
    "experts\[0\].model_path: cannot be given with endpoint"
check "ftp endpoint" bad_cfg '{"experts":[{"expert_id":"a","endpoint":"ftp://h/v1"}]}' \
    "experts\[0\].endpoint: must start with http"
check "api_key without endpoint" bad_cfg \
    "{\"experts\":[{\"expert_id\":\"a\",\"model_path\":\"$MODEL\",\"api_key\":\"k\"}]}" \
    "experts\[0\].api_key: is only for an expert with 'endpoint'"

stop_server
check "downstream exits 0" eq "$SRV_RC" 0
kill -TERM "$UP_PID" && wait "$UP_PID"
UP_PID=""
kill "$FAKE_PID"
FAKE_PID=""
finish
