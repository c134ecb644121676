#!/usr/bin/env bash
# test_template_cli.sh - `lmserv template` end to end: golden renders from
# $LMS_TESTDATA/templates byte for byte, templates embedded in vocabulary
# GGUF files (-m), built-in names, --var/--tools/--no-generation-prompt,
# raise_exception() on stderr with exit 1, and usage errors (exit 2).
#
# Env: LMSERV (the binary), LMS_TESTDATA (the shared test data).
set -u
T="$LMS_TESTDATA/templates"
V="$LMS_TESTDATA/tokenizer"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0

fail() {
    echo "FAIL: $*" >&2
    fails=$((fails + 1))
}

# expect_file NAME EXPECTED_FILE -- ARGS...: stdout must equal the file.
expect_file() {
    local name=$1 want=$2
    shift 3
    if ! "$LMSERV" template "$@" >"$tmp/out" 2>"$tmp/err"; then
        fail "$name: exit $? ($(cat "$tmp/err"))"
    elif ! cmp -s "$tmp/out" "$want"; then
        fail "$name: output differs from $want"
    fi
}

# expect_text NAME TEXT -- ARGS...: stdout must equal TEXT (printf escapes).
expect_text() {
    local name=$1 text=$2
    shift 2
    printf "$text" >"$tmp/want"
    expect_file "$name" "$tmp/want" "$@"
}

cat >"$tmp/b.json" <<'EOF'
[{"role": "system", "content": "You are a helpful assistant. Answer briefly."},
 {"role": "user", "content": "What is 2 + 2?"}]
EOF
cat >"$tmp/c.json" <<'EOF'
{"messages": [{"role": "system", "content": "You are a concise assistant."},
              {"role": "user", "content": "Name a primary color."},
              {"role": "assistant", "content": "Red."},
              {"role": "user", "content": "Name another one."}]}
EOF
cat >"$tmp/tools.json" <<'EOF'
[{"type": "function", "function": {"name": "get_time", "description": "Current time.",
  "parameters": {"type": "object", "properties": {}}}}]
EOF

# golden cases of the shared data
expect_file "llama3.2 b" "$T/meta-llama-Llama-3.2-3B-Instruct.b.txt" -- \
    --messages "$tmp/b.json" --template "$T/meta-llama-Llama-3.2-3B-Instruct.jinja" \
    --bos-token '<|begin_of_text|>' --eos-token '<|eot_id|>' --now-text '26 Nov 2026'
expect_file "qwen3 c (conversation object)" "$T/Qwen-Qwen3-0.6B.c.txt" -- \
    --messages "$tmp/c.json" --template "$T/Qwen-Qwen3-0.6B.jinja"
expect_file "gpt-oss c" "$T/openai-gpt-oss-120b.c.txt" -- \
    --messages "$tmp/c.json" --template "$T/openai-gpt-oss-120b.jinja" --now-text '26 Nov 2026'
expect_file "messages from stdin" "$T/Qwen-Qwen3-0.6B.c.txt" -- \
    --messages - --template "$T/Qwen-Qwen3-0.6B.jinja" <"$tmp/c.json"

# raise_exception(): the message alone on stderr, exit 1, nothing on stdout
"$LMSERV" template --messages "$tmp/b.json" --template "$T/google-gemma-2-2b-it.jinja" \
    >"$tmp/out" 2>"$tmp/err"
rc=$?
[ "$rc" = 1 ] || fail "gemma b: exit $rc, want 1"
[ "$(cat "$tmp/err")" = "$(cat "$T/google-gemma-2-2b-it.b.error")" ] ||
    fail "gemma b: stderr '$(cat "$tmp/err")'"
[ ! -s "$tmp/out" ] || fail "gemma b: output on stdout"

# templates inside vocabulary GGUF files, with their BOS/EOS texts
expect_text "-m llama-bpe" '<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant. Answer briefly.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2 + 2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n' -- \
    -m "$V/ggml-vocab-llama-bpe.gguf" --messages "$tmp/b.json" --now-text '26 Nov 2026'
expect_text "-m phi-3" '<s><|user|>\nWhat is 2 + 2?<|end|>\n<|assistant|>\n' -- \
    -m "$V/ggml-vocab-phi-3.gguf" --messages "$tmp/b.json"
expect_text "-m qwen2, --template overrides" '<|im_start|>system\nYou are a helpful assistant. Answer briefly.<|im_end|>\n<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n' -- \
    -m "$V/ggml-vocab-qwen2.gguf" --messages "$tmp/b.json" --template chatml \
    --no-generation-prompt

# variables and tools
"$LMSERV" template --messages "$tmp/c.json" --template "$T/Qwen-Qwen3-0.6B.jinja" \
    --var enable_thinking=false >"$tmp/out" || fail "--var: exit $?"
printf '<think>\n\n</think>\n\n' >"$tmp/want"
tail -c 19 "$tmp/out" | cmp -s - "$tmp/want" || fail "--var enable_thinking=false: no empty think block"
"$LMSERV" template --messages "$tmp/b.json" --template "$T/Qwen-Qwen2.5-7B-Instruct.jinja" \
    --tools "$tmp/tools.json" >"$tmp/out" || fail "--tools: exit $?"
grep -q '^{"type": "function", "function": {"name": "get_time"' "$tmp/out" ||
    fail "--tools: tool JSON missing"
"$LMSERV" template --messages "$tmp/b.json" --template "$T/openai-gpt-oss-120b.jinja" \
    --now 2026-01-02 --var reasoning_effort=high >"$tmp/out" || fail "--now: exit $?"
grep -q '^Current date: 2026-01-02$' "$tmp/out" || fail "--now: date not used"
grep -q '^Reasoning: high$' "$tmp/out" || fail "--var string: not used"

# errors
printf '{%% if %%}' >"$tmp/bad.jinja"
"$LMSERV" template --messages "$tmp/b.json" --template "$tmp/bad.jinja" 2>"$tmp/err" >/dev/null
rc=$?
[ "$rc" = 1 ] || fail "bad template: exit $rc, want 1"
grep -q '^template:1:7: expected an expression' "$tmp/err" || fail "bad template: '$(cat "$tmp/err")'"
"$LMSERV" template --template chatml >/dev/null 2>&1
[ $? = 2 ] || fail "missing --messages: want exit 2"
"$LMSERV" template --messages "$tmp/nope.json" >/dev/null 2>&1
[ $? = 2 ] || fail "unreadable messages: want exit 2"
"$LMSERV" template --messages "$tmp/b.json" --template no-such-template >/dev/null 2>&1
[ $? = 2 ] || fail "unknown template: want exit 2"
"$LMSERV" template --messages "$tmp/b.json" --now yesterday >/dev/null 2>&1
[ $? = 2 ] || fail "bad --now: want exit 2"

if [ "$fails" -ne 0 ]; then
    echo "$fails check(s) failed" >&2
    exit 1
fi
echo "template CLI: all checks passed"
