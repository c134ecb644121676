#!/usr/bin/env bash
# test_reasoning.sh - thinking models: the template switch (chat_template_kwargs,
# --reasoning, Ollama's think), the thoughts taken apart from the answer
# (reasoning_content, Ollama's thinking, the Responses API's reasoning item),
# streamed and not, and --chat-template. The replies come from a random-weight
# Qwen3-shaped model held by a grammar to the written form of a thinking reply.
. "$(dirname "$0")/lib.sh" || exit 1
command -v python3 >/dev/null || skip "python3 is not installed"

T=$(mktemp -d /tmp/lmserv-reason.XXXXXX)
trap 'cleanup; rm -rf "$T"' EXIT
QWEN="$LMS_TESTDATA/models/qwen3-synth-f16.gguf"
TPL="$LMS_TESTDATA/templates"
[ -f "$QWEN" ] || skip "no $QWEN"

MSG='"messages":[{"role":"user","content":"hi"}]'
# the prompt (Qwen3.5's template) opened <think>: thoughts, the closing tag, the answer
G_OPEN='"grammar":"root ::= [a-z]{3,8} \" \" [a-z]{2,5} \"\\n</think>\\n\\n\" [a-z]{2,6} \" \" [a-z]{2,6}"'
sse_field() { # FILE FIELD: the concatenated deltas of one field of a chat stream
    python3 -c 'import json,sys
print(repr("".join((json.loads(l[6:])["choices"][0]["delta"].get(sys.argv[2]) or "") for l in open(sys.argv[1]) if l.startswith("data: {") and json.loads(l[6:])["choices"])))' "$1" "$2"
}

# ---- a template that opens the thoughts (Qwen3.5), the template switch ---------------
start_serve -m "$QWEN" -c 512 --chat-template-file "$TPL/Qwen3.5-4B.jinja"
req POST /apply-template -d "{$MSG}"
check "--chat-template-file: its render, ending inside <think>" eq "$(py "$T/out" 'd["prompt"].endswith("<|im_start|>assistant\n<think>\n")')" True
req POST /apply-template -d "{$MSG,\"chat_template_kwargs\":{\"enable_thinking\":false}}"
check "chat_template_kwargs reach the template" eq "$(py "$T/out" 'd["prompt"].endswith("<think>\n\n</think>\n\n")')" True
req GET /props
check "/props shows the template served" eq "$(py "$T/out" '"enable_thinking" in d["chat_template"]')" True

req POST /v1/chat/completions -d "{$MSG,\"max_tokens\":40,\"temperature\":0,$G_OPEN,\"reasoning_format\":\"none\"}"
RAW=$(py "$T/out" 'repr(d["choices"][0]["message"]["content"])')
check "reasoning_format none: the reply as written" eq "$(py "$T/out" '"\n</think>\n\n" in d["choices"][0]["message"]["content"] and "reasoning_content" not in d["choices"][0]["message"]')" True
req POST /v1/chat/completions -d "{$MSG,\"max_tokens\":40,\"temperature\":0,$G_OPEN}"
check "default: thoughts in reasoning_content, the answer in content" eq "$(py "$T/out" 'repr(d["choices"][0]["message"]["reasoning_content"] + "\n</think>\n\n" + d["choices"][0]["message"]["content"])')" "$RAW"
check "usage counts the thoughts' tokens (reasoning_tokens)" eq "$(py "$T/out" '0 < d["usage"]["completion_tokens_details"]["reasoning_tokens"] < d["usage"]["completion_tokens"]')" True
N_THINK=$(py "$T/out" 'd["usage"]["completion_tokens_details"]["reasoning_tokens"]')
check "the thoughts hold no tag, the answer no whitespace around" eq "$(py "$T/out" '("</think>" in d["choices"][0]["message"]["reasoning_content"], d["choices"][0]["message"]["content"] == d["choices"][0]["message"]["content"].strip())')" "(False, True)"
py "$T/out" 'repr(d["choices"][0]["message"]["reasoning_content"])' >"$T/thoughts"
py "$T/out" 'repr(d["choices"][0]["message"]["content"])' >"$T/answer"
curl -sN "$BASE/v1/chat/completions" -d "{$MSG,\"max_tokens\":40,\"temperature\":0,$G_OPEN,\"stream\":true}" >"$T/sse"
check "streamed: the reasoning_content deltas make the thoughts" eq "$(sse_field "$T/sse" reasoning_content)" "$(cat "$T/thoughts")"
check "streamed: the content deltas make the answer" eq "$(sse_field "$T/sse" content)" "$(cat "$T/answer")"
check "streamed: no delta carries a tag" eq "$(grep -c 'think>' "$T/sse")" 0
req POST /v1/chat/completions -d "{$MSG,\"max_tokens\":40,\"temperature\":0,$G_OPEN,\"reasoning_format\":\"deepseek-legacy\"}"
check "deepseek-legacy: the content as written, the thoughts apart too" eq "$(py "$T/out" '(d["choices"][0]["message"]["content"], d["choices"][0]["message"]["reasoning_content"])')" "($RAW, $(cat "$T/thoughts"))"
req POST /v1/chat/completions -d "{$MSG,\"max_tokens\":3,\"temperature\":0,$G_OPEN}"
check "cut before </think>: all thoughts, empty content" eq "$(py "$T/out" '(len(d["choices"][0]["message"]["reasoning_content"]) > 0, d["choices"][0]["message"]["content"], d["choices"][0]["finish_reason"])')" "(True, '', 'length')"
req POST /v1/chat/completions -d "{$MSG,\"max_tokens\":4,\"response_format\":{\"type\":\"json_object\"}}"
check "JSON mode: no thoughts taken out of the JSON" eq "$(py "$T/out" '(d["choices"][0]["message"]["content"][:1], "reasoning_content" in d["choices"][0]["message"])')" "('{', False)"
req POST /v1/chat/completions -d "{$MSG,\"reasoning_format\":\"r1\"}"
check "an unknown reasoning_format: 400 naming it" eq "$(code) $(py "$T/out" 'd["error"]["param"]')" "400 reasoning_format"
req POST /v1/chat/completions -d "{$MSG,\"chat_template_kwargs\":[1]}"
check "chat_template_kwargs not an object: 400 naming it" eq "$(code) $(py "$T/out" 'd["error"]["param"]')" "400 chat_template_kwargs"

# the reasoning budget: after N tokens of thoughts "\n</think>\n\n" is forced, then the answer
req POST /v1/chat/completions -d "{$MSG,\"max_tokens\":12,\"temperature\":0}"
py "$T/out" 'd["choices"][0]["message"]["reasoning_content"]' >"$T/free"
req POST /v1/chat/completions -d "{$MSG,\"max_tokens\":12,\"temperature\":0,\"reasoning_budget\":5}"
check "reasoning_budget 5: the first thoughts, closed, then an answer" eq "$(py "$T/out" '(open(sys.argv[3]).read().startswith(d["choices"][0]["message"]["reasoning_content"]), 0 < len(d["choices"][0]["message"]["reasoning_content"]) < len(open(sys.argv[3]).read()), len(d["choices"][0]["message"]["content"]) > 0, d["usage"]["completion_tokens"])' "$T/free")" "(True, True, True, 12)"
req POST /v1/chat/completions -d "{$MSG,\"max_tokens\":12,\"temperature\":0,\"reasoning_budget\":0}"
check "reasoning_budget 0: no thoughts, only an answer" eq "$(py "$T/out" '("reasoning_content" in d["choices"][0]["message"], len(d["choices"][0]["message"]["content"]) > 0)')" "(False, True)"
req POST /v1/chat/completions -d "{$MSG,\"max_tokens\":12,\"temperature\":0,\"reasoning_budget\":5}"
BUDGET_PARTS=$(py "$T/out" 'repr(d["choices"][0]["message"]["reasoning_content"]) + " " + repr(d["choices"][0]["message"]["content"])')
curl -sN "$BASE/v1/chat/completions" -d "{$MSG,\"max_tokens\":12,\"temperature\":0,\"reasoning_budget\":5,\"stream\":true}" >"$T/bsse"
check "reasoning_budget streamed: the same thoughts and answer" eq "$(sse_field "$T/bsse" reasoning_content) $(sse_field "$T/bsse" content)" "$BUDGET_PARTS"
req POST /v1/chat/completions -d "{$MSG,\"reasoning_budget\":-3}"
check "a reasoning_budget under -1: 400 naming it" eq "$(code) $(py "$T/out" 'd["error"]["param"]')" "400 reasoning_budget"

# Qwen3.5's tool calls: the XML form inside <tool_call>, after the thoughts
TOOLS='"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}}}}}]'
G_CALL='"grammar":"root ::= \"sunny?\\n</think>\\n\\n<tool_call>\\n<function=get_weather>\\n<parameter=city>\\n\" (\"Paris\" | \"Rome\") \"\\n</parameter>\\n<parameter=days>\\n\" [1-9] \"\\n</parameter>\\n</function>\\n</tool_call>\""'
req POST /v1/chat/completions -d "{$MSG,$TOOLS,\"max_tokens\":160,$G_CALL}"
check "Qwen3.5 XML call: thoughts apart, the call with typed arguments" eq "$(py "$T/out" '(d["choices"][0]["finish_reason"], d["choices"][0]["message"]["reasoning_content"], d["choices"][0]["message"]["content"], d["choices"][0]["message"]["tool_calls"][0]["function"]["name"], sorted(json.loads(d["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])), type(json.loads(d["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])["days"]).__name__)')" "('tool_calls', 'sunny?', None, 'get_weather', ['city', 'days'], 'int')"
curl -sN "$BASE/v1/chat/completions" -d "{$MSG,$TOOLS,\"max_tokens\":160,$G_CALL,\"stream\":true}" >"$T/csse"
check "Qwen3.5 XML call streamed: thoughts, no content, one tool_calls delta" eq "$(python3 -c 'import json,sys
ch=[json.loads(l[6:]) for l in open(sys.argv[1]) if l.startswith("data: {")]
d=[c["choices"][0]["delta"] for c in ch if c["choices"]]
print(("".join(x.get("reasoning_content","") for x in d), "".join(x.get("content") or "" for x in d), [t["function"]["name"] for x in d for t in x.get("tool_calls",[])], ch[-1]["choices"][0]["finish_reason"]))' "$T/csse")" "('sunny?', '', ['get_weather'], 'tool_calls')"

# Responses API: a reasoning item before the message
req POST /v1/responses -d "{\"input\":\"hi\",\"max_output_tokens\":40,\"temperature\":0,$G_OPEN}"
check "responses: a reasoning item, then the message" eq "$(py "$T/out" '[o["type"] for o in d["output"]]')" "['reasoning', 'message']"
check "responses: output_tokens_details.reasoning_tokens as chat counts them" eq "$(py "$T/out" 'd["usage"]["output_tokens_details"]["reasoning_tokens"]')" "$N_THINK"
check "responses: the thoughts and the answer as chat gives them" eq "$(py "$T/out" '(d["output"][0]["content"][0]["text"], d["output"][1]["content"][0]["text"])')" "($(cat "$T/thoughts"), $(cat "$T/answer"))"
curl -sN "$BASE/v1/responses" -d "{\"input\":\"hi\",\"max_output_tokens\":40,\"temperature\":0,$G_OPEN,\"stream\":true}" >"$T/rsse"
python3 - "$T/rsse" "$T/thoughts" "$T/answer" >"$T/rcheck" <<'PY'
import ast, json, sys
ev = [json.loads(l[6:]) for l in open(sys.argv[1]) if l.startswith("data: ")]
types = [e["type"] for e in ev]
th = "".join(e["delta"] for e in ev if e["type"] == "response.reasoning_text.delta")
an = "".join(e["delta"] for e in ev if e["type"] == "response.output_text.delta")
assert th == ast.literal_eval(open(sys.argv[2]).read().strip()), th
assert an == ast.literal_eval(open(sys.argv[3]).read().strip()), an
added = [e["item"]["type"] for e in ev if e["type"] == "response.output_item.added"]
assert added == ["reasoning", "message"], added
assert [e["output_index"] for e in ev if e["type"] == "response.output_item.done"] == [0, 1]
assert types.index("response.reasoning_text.done") < types.index("response.output_text.delta")
assert [e["sequence_number"] for e in ev] == list(range(len(ev)))
final = ev[-1]["response"]
assert [o["type"] for o in final["output"]] == ["reasoning", "message"]
print("ok")
PY
check "responses streamed: reasoning_text deltas, then the message's, items in order" eq "$(cat "$T/rcheck")" ok
# Anthropic's Messages API: a thinking block, then the text
req POST /v1/messages -d "{$MSG,\"max_tokens\":40,\"temperature\":0,$G_OPEN}"
check "messages: a thinking block, then the text block" eq "$(py "$T/out" '([b["type"] for b in d["content"]], d["content"][0]["thinking"], d["content"][1]["text"], d["stop_reason"])')" "(['thinking', 'text'], $(cat "$T/thoughts"), $(cat "$T/answer"), 'end_turn')"
curl -sN "$BASE/v1/messages" -d "{$MSG,\"max_tokens\":40,\"temperature\":0,$G_OPEN,\"stream\":true}" >"$T/asse"
check "messages streamed: thinking_delta pieces in block 0, text_delta in block 1" eq "$(python3 -c 'import json,sys
ev=[json.loads(l[6:]) for l in open(sys.argv[1]) if l.startswith("data: ")]
th="".join(e["delta"]["thinking"] for e in ev if e["type"]=="content_block_delta" and e["delta"]["type"]=="thinking_delta" and e["index"]==0)
tx="".join(e["delta"]["text"] for e in ev if e["type"]=="content_block_delta" and e["delta"]["type"]=="text_delta" and e["index"]==1)
print((th, tx, [e["content_block"]["type"] for e in ev if e["type"]=="content_block_start"], ev[-1]["type"]))' "$T/asse")" "($(cat "$T/thoughts"), $(cat "$T/answer"), ['thinking', 'text'], 'message_stop')"
req POST /v1/messages -d "{$MSG,\"max_tokens\":12,\"temperature\":0,\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":5}}"
check "messages thinking.budget_tokens 5: short thoughts, then text" eq "$(py "$T/out" '([b["type"] for b in d["content"]], open(sys.argv[3]).read().startswith(d["content"][0]["thinking"]))' "$T/free")" "(['thinking', 'text'], True)"
req POST /v1/messages/count_tokens -d "{$MSG,\"thinking\":{\"type\":\"disabled\"}}"
N_DIS=$(py "$T/out" 'd["input_tokens"]')
req POST /v1/messages/count_tokens -d "{$MSG}"
check "messages thinking disabled: the template's closed empty block (more prompt tokens)" eq "$([ "$N_DIS" -gt "$(py "$T/out" 'd["input_tokens"]')" ] && echo yes)" yes

# a follow-up turn carrying the reasoning item back: it renders
req POST /v1/responses -d '{"input":[{"role":"user","content":"hi"},{"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":"greet"}]},{"role":"assistant","content":"hello"},{"role":"user","content":"again"}],"max_output_tokens":2}'
check "responses: a reasoning input item is taken" eq "$(code)" 200

# Ollama: think
req POST /api/chat -d "{\"model\":\"qwen3-synth-f16\",$MSG,\"stream\":false,\"think\":true,\"options\":{\"temperature\":0,\"num_predict\":40,$G_OPEN}}"
check "ollama think: thoughts in message.thinking" eq "$(py "$T/out" '(d["message"]["thinking"], d["message"]["content"])')" "($(cat "$T/thoughts"), $(cat "$T/answer"))"
curl -sN "$BASE/api/chat" -d "{\"model\":\"qwen3-synth-f16\",$MSG,\"think\":true,\"options\":{\"temperature\":0,\"num_predict\":40,$G_OPEN}}" >"$T/nd"
check "ollama think streamed: the thinking lines, then the content lines" eq "$(python3 -c 'import json,sys
L=[json.loads(l) for l in open(sys.argv[1])]
print(("".join(o["message"].get("thinking","") for o in L), "".join(o["message"]["content"] for o in L), L[-1]["done"]))' "$T/nd")" "($(cat "$T/thoughts"), $(cat "$T/answer"), True)"
req POST /api/chat -d "{\"model\":\"qwen3-synth-f16\",$MSG,\"stream\":false,\"think\":false,\"options\":{\"num_predict\":1}}"
N_OFF=$(py "$T/out" 'd["prompt_eval_count"]')
req POST /api/chat -d "{\"model\":\"qwen3-synth-f16\",$MSG,\"stream\":false,\"think\":true,\"options\":{\"num_predict\":1}}"
N_ON=$(py "$T/out" 'd["prompt_eval_count"]')
check "ollama think false renders the closed empty block (4 more prompt tokens or so)" eq "$([ "$N_OFF" -gt "$N_ON" ] && echo yes)" yes
req POST /api/chat -d "{\"model\":\"qwen3-synth-f16\",$MSG,\"think\":\"maybe\"}"
check "ollama think of another kind: 400" eq "$(code) $(py "$T/out" '"think" in d["error"]')" "400 True"
# the type WebSocket dialect: thoughts apart only when asked ("reasoning_format")
if command -v node >/dev/null && [ -d "$E2E_DIR/node_modules/ws" ]; then
    R=$(cd "$E2E_DIR" && PORT="$PORT" G="{$G_OPEN}" timeout 60 node --input-type=module -e '
import { Client } from "./wsclient.mjs";
const c = await Client.open(`ws://127.0.0.1:${process.env.PORT}/ws`);
const g = JSON.parse(process.env.G).grammar, out = {};
for (const [sid, rf] of [["split", "deepseek"], ["raw", undefined], ["bad", "r1"]]) {
    c.send(JSON.stringify({type: "generate", session_id: sid, max_tokens: 40, temperature: 0,
                           grammar: g, reasoning_format: rf, messages: [{role: "user", content: "hi"}]}));
    const r = {reasoning: "", token: ""};
    for (;;) {
        const m = await c.next((j) => j.session_id === sid);
        if (m.type === "reasoning" || m.type === "token") { r[m.type] += m.content; continue; }
        r.end = m.type === "done" ? [m.content, m.reasoning_content ?? null] : m.message;
        break;
    }
    out[sid] = r;
}
console.log(JSON.stringify(out));
c.close();
')
    check "ws type, reasoning_format deepseek: reasoning then token messages, done with both" eq "$(python3 -c 'import json,sys
r=json.loads(sys.argv[1])["split"]; print(repr(r["reasoning"]), repr(r["token"]), r["end"] == [r["token"], r["reasoning"]])' "$R")" "$(cat "$T/thoughts") $(cat "$T/answer") True"
    check "ws type without it: the reply as written" eq "$(python3 -c 'import json,sys
r=json.loads(sys.argv[1])["raw"]; print(r["reasoning"] == "", "</think>" in r["token"], r["end"] == [r["token"], None])' "$R")" "True True True"
    check "ws type, reasoning_format r1: an error naming it" eq "$(python3 -c 'import json,sys; print("reasoning_format" in json.loads(sys.argv[1])["bad"]["end"])' "$R")" True
fi
stop_server

# ---- --reasoning-budget: the server's budget, a request's wins ---------------------------
start_serve -m "$QWEN" -c 512 --chat-template-file "$TPL/Qwen3.5-4B.jinja" --reasoning-budget 5
req POST /v1/chat/completions -d "{$MSG,\"max_tokens\":12,\"temperature\":0}"
check "--reasoning-budget 5 closes the thoughts after 5 tokens" eq "$(py "$T/out" '(open(sys.argv[3]).read().startswith(d["choices"][0]["message"]["reasoning_content"]), len(d["choices"][0]["message"]["content"]) > 0)' "$T/free")" "(True, True)"
req POST /v1/chat/completions -d "{$MSG,\"max_tokens\":12,\"temperature\":0,\"reasoning_budget\":-1}"
check "a request's reasoning_budget -1 lifts it" eq "$(py "$T/out" 'd["choices"][0]["message"]["reasoning_content"]')" "$(cat "$T/free")"
stop_server

# ---- a template whose reply opens the thoughts (Qwen3); --reasoning off -----------------
start_serve -m "$QWEN" -c 512 --chat-template-file "$TPL/Qwen-Qwen3-0.6B.jinja" --reasoning off
req POST /apply-template -d "{$MSG}"
check "--reasoning off: enable_thinking false by default" eq "$(py "$T/out" 'd["prompt"].endswith("<think>\n\n</think>\n\n")')" True
req POST /apply-template -d "{$MSG,\"chat_template_kwargs\":{\"enable_thinking\":true}}"
check "a request's chat_template_kwargs win over --reasoning" eq "$(py "$T/out" 'd["prompt"].endswith("<|im_start|>assistant\n")')" True
G_TAG='"grammar":"root ::= \"<think>\\n\" [a-z]{3,8} \"\\n</think>\\n\\n\" [a-z]{2,6}"'
req POST /v1/chat/completions -d "{$MSG,\"max_tokens\":40,\"temperature\":0,$G_TAG}"
check "a reply that opens <think> itself: thoughts apart" eq "$(py "$T/out" '(d["choices"][0]["message"]["reasoning_content"].isalpha(), d["choices"][0]["message"]["content"].isalpha())')" "(True, True)"
req POST /v1/chat/completions -d "{$MSG,\"max_tokens\":6,\"temperature\":0,\"grammar\":\"root ::= [a-z]{2,6}\"}"
check "a reply without thoughts: all content, no reasoning_content, no reasoning tokens" eq "$(py "$T/out" '(d["choices"][0]["message"]["content"].isalpha(), "reasoning_content" in d["choices"][0]["message"], d["usage"]["completion_tokens_details"]["reasoning_tokens"])')" "(True, False, 0)"
stop_server

# ---- control-token markers: a tool-call marker's text stays in the reply ------------------
"$LMSERV" synth --shape mistral-tiny --type F16 "$T/mt.gguf" >/dev/null || die "synth failed"
start_serve -m "$T/mt.gguf" -c 256
req POST /tokenize -d '{"content":"[TOOL_CALLS]<|start_header_id|>","with_pieces":true}'
TC=$(py "$T/out" 'd["tokens"][0]["id"]')
SH=$(py "$T/out" 'd["tokens"][1]["id"]')
req POST /v1/chat/completions -d "{$MSG,\"max_tokens\":2,\"temperature\":0,\"logit_bias\":{\"$TC\":100}}"
check "a drawn [TOOL_CALLS] (a control token) keeps its text" eq "$(py "$T/out" 'd["choices"][0]["message"]["content"]')" "[TOOL_CALLS][TOOL_CALLS]"
req POST /v1/chat/completions -d "{$MSG,\"max_tokens\":2,\"temperature\":0,\"logit_bias\":{\"$SH\":100}}"
check "other control tokens stay unshown" eq "$(py "$T/out" '(d["choices"][0]["message"]["content"], d["usage"]["completion_tokens"])')" "('', 2)"
stop_server

# ---- bad flags and config fields are refused before anything starts -------------------
check "--chat-template naming nothing: refused" eq "$("$LMSERV" serve -m "$QWEN" --port 0 --chat-template /nonexistent.jinja 2>&1 | grep -c 'neither a built-in name nor a readable file')" 1
echo '{% if %}' >"$T/bad.jinja"
check "--chat-template that does not parse: refused" eq "$("$LMSERV" serve -m "$QWEN" --port 0 --chat-template "$T/bad.jinja" 2>&1 | grep -c 'chat-template')" 1
check "--reasoning-format unknown: refused" eq "$("$LMSERV" serve -m "$QWEN" --port 0 --reasoning-format r1 2>&1 | grep -c 'reasoning format')" 1
check "--chat-template-kwargs not an object: refused" eq "$("$LMSERV" serve -m "$QWEN" --port 0 --chat-template-kwargs '[1]' 2>&1 | grep -c 'kwargs')" 1
cp "$QWEN" "$T/q.gguf"
cp "$TPL/Qwen3.5-4B.jinja" "$T/q35.jinja"
echo '{"experts":[{"expert_id":"q","model_path":"q.gguf","chat_template":"nope.jinja"}]}' >"$T/bad.json"
check "config chat_template naming no file: refused naming the field" eq "$("$LMSERV" serve --config "$T/bad.json" --port 0 2>&1 | grep -c 'experts\[0\].chat_template')" 1
echo '{"experts":[{"expert_id":"q","model_path":"q.gguf","chat_template":"q35.jinja"},{"expert_id":"c","model_path":"q.gguf","chat_template":"chatml"}]}' >"$T/ok.json"
start_serve --config "$T/ok.json" -c 256
req POST /apply-template -d "{\"model\":\"q\",$MSG}"
check "config chat_template from a file" eq "$(py "$T/out" 'd["prompt"].endswith("<think>\n")')" True
req POST /apply-template -d "{\"model\":\"c\",$MSG}"
check "config chat_template by built-in name" eq "$(py "$T/out" 'd["prompt"].endswith("<|im_start|>assistant\n")')" True
stop_server
# ---- lmserv chat: thoughts to stderr, the answer to stdout ---------------------------------
GR='root ::= [a-z]{3,8} " " [a-z]{2,5} "\n</think>\n\n" [a-z]{2,6} " " [a-z]{2,6}'
chat() { "$LMSERV" chat -m "$QWEN" -c 512 --template "$TPL/Qwen3.5-4B.jinja" -n 40 --temp 0 --grammar "$GR" "$@"; }
printf 'hi\nagain\n/quit\n' | chat >"$T/cout" 2>"$T/cerr"
check "chat: two answers on stdout, no thoughts or tags there" eq "$(grep -c '^> [a-z]* [a-z]*$' "$T/cout") $(grep -c think "$T/cout")" "2 0"
check "chat: each turn's thoughts on stderr, on lines of their own" eq "$(grep -c '^[a-z]* [a-z]*$' "$T/cerr") $(grep -c think "$T/cerr")" "2 0"
printf 'hi\n' | chat --reasoning-format none 2>/dev/null >"$T/cout"
check "chat --reasoning-format none: the reply as written" eq "$(grep -c '</think>' "$T/cout")" 1
printf 'hi\n' | chat --reasoning off 2>/dev/null >"$T/cout"
check "chat --reasoning off: the template closes the thoughts, the reply is all answer" eq "$(grep -c '</think>' "$T/cout")" 1
check "chat --reasoning maybe: refused" eq "$(printf 'hi\n' | chat --reasoning maybe 2>&1 | grep -c "reasoning 'maybe'")" 1
check "chat --chat-template-kwargs not an object: refused" eq "$(printf 'hi\n' | chat --chat-template-kwargs 7 2>&1 | grep -c 'kwargs')" 1
# lmserv run --chat: the same split (here the reply opens the thoughts itself); without --chat, as written
GT='root ::= "<think>\n" [a-z]{3,8} "\n</think>\n\n" [a-z]{2,6}'
"$LMSERV" run -m "$QWEN" -c 512 -n 40 --temp 0 --chat -p hi --grammar "$GT" >"$T/rout" 2>"$T/rerr"
check "run --chat: the answer alone on stdout, the thoughts on stderr" eq "$(grep -c think "$T/rout") $(grep -c '^[a-z][a-z]*$' "$T/rout") $(grep -c '^[a-z][a-z]*$' "$T/rerr")" "0 1 1"
"$LMSERV" run -m "$QWEN" -c 512 -n 40 --temp 0 --chat -p hi --grammar "$GT" --reasoning-format none 2>/dev/null >"$T/rout"
check "run --chat --reasoning-format none: the reply as written" eq "$(grep -c '</think>' "$T/rout")" 1
"$LMSERV" run -m "$QWEN" -c 512 -n 40 --temp 0 -p hi --grammar "$GT" 2>/dev/null >"$T/rout"
check "run without --chat: the text as written" eq "$(grep -c '</think>' "$T/rout")" 1
check "run --reasoning-format r1: refused" eq "$("$LMSERV" run -m "$QWEN" -p hi --chat --reasoning-format r1 2>&1 | grep -c "reasoning format 'r1'")" 1
"$LMSERV" run -m "$QWEN" -c 512 -n 40 --temp 0 --chat -p hi --template "$TPL/Qwen3.5-4B.jinja" --grammar "$GR" >"$T/rout" 2>"$T/rerr"
check "run --chat --template (Qwen3.5's opens the thoughts): the answer on stdout, the thoughts on stderr" eq "$(grep -c think "$T/rout") $(grep -c '^[a-z]* [a-z]*$' "$T/rout") $(grep -c '^[a-z]* [a-z]*$' "$T/rerr")" "0 1 1"
check "run --template without --chat: refused" eq "$("$LMSERV" run -m "$QWEN" -p hi --template chatml 2>&1 | grep -c 'add --chat')" 1
finish
