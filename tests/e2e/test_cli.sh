#!/usr/bin/env bash
# The command line end to end: run/eval/tokenize/info/quantize/synth/bench/
# template on the shared test models, run and chat held to a grammar or a
# JSON schema, and bad input (truncated file,
# out-of-range token ids, empty and non-UTF-8 prompts) giving clear errors.
set -euo pipefail
: "${LMSERV:?}" "${LMS_TESTDATA:?}"
M=$LMS_TESTDATA/models
G=$LMS_TESTDATA/golden
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
pass=0
ok() { pass=$((pass + 1)); echo "ok - $*"; }

# greedy story: the same 32 tokens as llama.cpp, streamed to stdout
out=$("$LMSERV" run -m "$M/stories260K.gguf" -p "Once upon a time" -n 32 --temp 0 2>"$TMP/err")
[ "$out" = "$(cat "$G/stories260K/case0.greedy_text.txt")" ] || fail "run greedy: '$out'"
grep -q "prompt 5 tokens" "$TMP/err" || fail "run stats line: $(cat "$TMP/err")"
grep -q "t/s" "$TMP/err" || fail "run stats tokens/s"
ok "run greedy matches llama.cpp"

# the output held to a GBNF grammar or a JSON schema (llama.cpp's --grammar,
# --grammar-file, -j, --json-schema-file), also in chat
for seed in 1 2 3; do
    out=$("$LMSERV" run -m "$M/stories260K.gguf" -p "Once upon a time" -n 30 --temp 1.5 --seed $seed \
        --grammar 'root ::= ("yes" | "no") " " [0-9]{3}' 2>"$TMP/err")
    [[ "$out" =~ ^(yes|no)\ [0-9]{3}$ ]] || fail "run --grammar (seed $seed): '$out'"
    grep -q "finish stop" "$TMP/err" || fail "run --grammar: the end token after the grammar's text"
done
printf 'root ::= item ("," item)*\nitem ::= [a-z]+ # words\n' >"$TMP/list.gbnf"
out=$("$LMSERV" run -m "$M/stories260K.gguf" -p "Once" -n 16 --seed 4 --grammar-file "$TMP/list.gbnf" 2>/dev/null)
[[ "$out" =~ ^[a-z]+(,[a-z]+)*,?$ ]] || fail "run --grammar-file: '$out'"
printf '{"type":"object","properties":{"ok":{"type":"boolean"}},"required":["ok"]}' >"$TMP/s.json"
out=$("$LMSERV" run -m "$M/stories260K.gguf" -p "Once" -n 60 --seed 2 --json-schema-file "$TMP/s.json" 2>/dev/null)
python3 -c 'import json,re,sys; t=sys.argv[1]; sys.exit(0 if re.fullmatch(r"\s*\{\s*\"ok\"\s*:\s*(t(r(ue?)?)?|f(a(l(se?)?)?)?)?\s*(\}\s*)?", t) or json.loads(t) in ({"ok": True}, {"ok": False}) else 1)' "$out" ||
    fail "run --json-schema-file: '$out'"
if "$LMSERV" run -m "$M/stories260K.gguf" -p hi --grammar 'root ::= item' 2>"$TMP/err"; then fail "bad grammar accepted"; fi
grep -q "grammar: line 1, column 10: rule 'item' is never defined" "$TMP/err" || fail "bad grammar message: $(cat "$TMP/err")"
if "$LMSERV" run -m "$M/stories260K.gguf" -p hi --grammar 'root ::= "a"' --json 2>"$TMP/err"; then fail "two shapes accepted"; fi
grep -q "give one of --grammar" "$TMP/err" || fail "two shapes message"
if "$LMSERV" run -m "$M/stories260K.gguf" -p hi -j '{"type":"object","properties":{"n":{"type":"number","multipleOf":2}}}' 2>"$TMP/err"; then fail "bad schema accepted"; fi
grep -q "multipleOf" "$TMP/err" || fail "bad schema message: $(cat "$TMP/err")"
out=$(printf 'hello\n/quit\n' | "$LMSERV" chat -m "$M/stories260K.gguf" -n 20 --grammar 'root ::= "Sure, " [a-z ]+ "."' 2>/dev/null)
out=${out%%$'\n'*} # the first reply's line
re='^> Sure, [a-z ]+[.]?$'
[[ "$out" =~ $re ]] || fail "chat --grammar: '$out'"
ok "run and chat held to a grammar or a JSON schema; bad ones refused by line or keyword"

# sampling with a seed is reproducible
a=$("$LMSERV" run -m "$M/stories260K.gguf" -p "The dog" -n 24 --temp 0.9 --top-k 40 --top-p 0.95 --min-p 0.05 --seed 7 --repeat-penalty 1.1 2>/dev/null)
b=$("$LMSERV" run -m "$M/stories260K.gguf" -p "The dog" -n 24 --temp 0.9 --top-k 40 --top-p 0.95 --min-p 0.05 --seed 7 --repeat-penalty 1.1 2>/dev/null)
[ "$a" = "$b" ] && [ -n "$a" ] || fail "seeded sampling differs"
ok "seeded sampling reproducible"

# eval: all positions of the golden prompt, compared with llama.cpp's logits
"$LMSERV" eval -m "$M/stories260K.gguf" --tokens "$(cat "$G/stories260K/case0.tokens.txt")" \
    --logits "$TMP/all.f32" --all-positions
python3 - "$TMP/all.f32" "$G/stories260K/case0.all_logits.f32" <<'PY'
import struct, sys
a = open(sys.argv[1], 'rb').read(); b = open(sys.argv[2], 'rb').read()
assert len(a) == len(b), (len(a), len(b))
n = len(a) // 4
x = struct.unpack('%df' % n, a); y = struct.unpack('%df' % n, b)
d = max(abs(p - q) for p, q in zip(x, y))
assert d < 2e-2, d
PY
"$LMSERV" eval -m "$M/stories260K.gguf" --tokens "1 403" --logits "$TMP/last.f32"
[ "$(stat -c %s "$TMP/last.f32")" = 2048 ] || fail "eval last-position size"
ok "eval logits within tolerance"

# bad input: clear errors, no crash
if "$LMSERV" eval -m "$M/stories260K.gguf" --tokens "1 99999" --logits "$TMP/x.f32" 2>"$TMP/err"; then fail "eval bad id accepted"; fi
grep -q "99999" "$TMP/err" || fail "eval bad id message: $(cat "$TMP/err")"
if "$LMSERV" eval -m "$M/stories260K.gguf" --tokens "1 x2" --logits "$TMP/x.f32" 2>"$TMP/err"; then fail "eval junk accepted"; fi
head -c 3000 "$M/stories260K.gguf" > "$TMP/trunc.gguf"
if "$LMSERV" run -m "$TMP/trunc.gguf" -p hi 2>"$TMP/err"; then fail "truncated model accepted"; fi
grep -q "gguf" "$TMP/err" || fail "truncated message: $(cat "$TMP/err")"
printf 'GGUF\x07\x00\x00\x00' > "$TMP/ver.gguf"; head -c 64 /dev/zero >> "$TMP/ver.gguf"
if "$LMSERV" info "$TMP/ver.gguf" 2>"$TMP/err"; then fail "bad version accepted"; fi
grep -q "version 7" "$TMP/err" || fail "version message: $(cat "$TMP/err")"
if "$LMSERV" run -m "$M/qwen2-synth-q4_k_m.gguf" -p "" -n 4 2>"$TMP/err"; then fail "empty prompt accepted"; fi
grep -qi "empty" "$TMP/err" || fail "empty prompt message: $(cat "$TMP/err")"
"$LMSERV" run -m "$M/stories260K.gguf" -p $'\xff\xfe bad \xc3' -n 8 --temp 0 >/dev/null 2>&1 || fail "non-UTF-8 prompt"
if "$LMSERV" run -m "$M/stories260K.gguf" -p hi --temp -1 2>/dev/null; then fail "negative temperature accepted"; fi
if "$LMSERV" run -m /nonexistent.gguf -p hi 2>/dev/null; then fail "missing file accepted"; fi
if "$LMSERV" run -m "$M/stories260K.gguf" -p hi --kv-type q4 2>"$TMP/err"; then fail "bad --kv-type accepted"; fi
grep -q "kv-type" "$TMP/err" || fail "kv-type message: $(cat "$TMP/err")"
if "$LMSERV" eval -m "$M/stories260K.gguf" --kv-type q8_0 --tokens "1 403" --logits "$TMP/k.f32" \
    2>"$TMP/err"; then fail "Q8_0 cache with head_dim 8 accepted"; fi
grep -q "head_dim" "$TMP/err" || fail "Q8_0 cache message: $(cat "$TMP/err")"
"$LMSERV" eval -m "$M/llama-synth-f32.gguf" --kv-type q8_0 --tokens "1 403 407" --logits "$TMP/k.f32" \
    || fail "eval with a Q8_0 KV cache"
if "$LMSERV" eval -m "$M/stories260K.gguf" --kv-type q4_0 --tokens "1 403" --logits "$TMP/k.f32" \
    2>"$TMP/err"; then fail "Q4_0 cache with head_dim 8 accepted"; fi
grep -q "head_dim" "$TMP/err" || fail "Q4_0 cache message: $(cat "$TMP/err")"
"$LMSERV" eval -m "$M/llama-synth-f32.gguf" --kv-type Q4_0 --tokens "1 403 407" --logits "$TMP/k.f32" \
    || fail "eval with a Q4_0 KV cache"
if "$LMSERV" serve -m "$M/stories260K.gguf" --kv-type q4 2>"$TMP/err"; then fail "serve: bad --kv-type accepted"; fi
grep -q "q4_0" "$TMP/err" || fail "serve kv-type message: $(cat "$TMP/err")"
ok "bad input gives errors"

# tokenize, also on a vocab-only file
[ "$("$LMSERV" tokenize -m "$M/stories260K.gguf" "Once upon a time")" = "1 403 407 261 378" ] || fail "tokenize spm"
[ "$("$LMSERV" tokenize -m "$LMS_TESTDATA/tokenizer/ggml-vocab-llama-bpe.gguf" --no-bos "Hello world")" = "9906 1917" ] \
    || fail "tokenize vocab-only"
"$LMSERV" tokenize -m "$M/stories260K.gguf" --pieces "Hi" | grep -q "'<s>'" || fail "tokenize --pieces"
ok "tokenize"

# info: metadata, tensor types, memory estimate
"$LMSERV" info "$M/qwen3-synth-q4_k_m.gguf" -c 1024 > "$TMP/info"
grep -q "arch qwen3" "$TMP/info" && grep -q "q4_K" "$TMP/info" && grep -q "KV cache 1.00 MiB" "$TMP/info" \
    || fail "info: $(cat "$TMP/info")"
"$LMSERV" info "$LMS_TESTDATA/tokenizer/ggml-vocab-qwen2.gguf" | grep -q "not loadable as a model" || fail "info vocab-only"
ok "info"

# quantize: f32 -> each type loads, and its logits move away from the f32
# logits no more than llama-quantize's own file of that type does (x1.5)
for t in Q8_0 Q4_K_M Q5_K_M Q6_K Q4_0 F16; do
    "$LMSERV" quantize "$M/llama-synth-f32.gguf" "$TMP/q.gguf" $t > "$TMP/qlog"
    grep -q "rms error" "$TMP/qlog" || fail "quantize $t report"
    "$LMSERV" eval -m "$TMP/q.gguf" --tokens "$(cat "$G/llama-synth-f32/case0.tokens.txt")" --logits "$TMP/q.f32"
    ref="$G/llama-synth-$(echo $t | tr 'A-Z' 'a-z')/case0.last_logits.f32"
    python3 - "$TMP/q.f32" "$G/llama-synth-f32/case0.last_logits.f32" "$ref" $t <<'PY'
import struct, sys
def rd(p):
    b = open(p, 'rb').read(); return struct.unpack('%df' % (len(b) // 4), b)
ours, f32, theirs = rd(sys.argv[1]), rd(sys.argv[2]), rd(sys.argv[3])
d_ours = max(abs(p - q) for p, q in zip(ours, f32))
d_ref = max(abs(p - q) for p, q in zip(theirs, f32))
print("quantize %-6s max |logit - f32| %.3f (llama-quantize's file: %.3f)" % (sys.argv[4], d_ours, d_ref))
assert d_ours <= 1.5 * d_ref + 0.02, (d_ours, d_ref)
PY
done
if "$LMSERV" quantize "$M/llama-synth-f32.gguf" "$TMP/q.gguf" Q9_X 2>/dev/null; then fail "bad type accepted"; fi
ok "quantize"

# synth + bench --json
"$LMSERV" synth --shape tiny --type Q8_0 "$TMP/tiny.gguf" >/dev/null
"$LMSERV" run -m "$TMP/tiny.gguf" -p "hello" -n 8 >/dev/null 2>&1 || fail "run synth model"
"$LMSERV" bench -m "$TMP/tiny.gguf" -p 16 -n 4 -r 1 -t 1 --json > "$TMP/bench"
python3 - "$TMP/bench" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["test"] for r in rows] == ["pp16", "tg4"], rows
for r in rows:
    assert r["tokens_per_s"]["median"] > 0 and "gb_per_s" in r and "gflop_per_s" in r
PY
# --depth: tg at depth 0 and at depth D, alternating, with their ratio
"$LMSERV" bench -m "$TMP/tiny.gguf" -p 0 -n 4 -r 3 -t 1 --depth 32 --json > "$TMP/bench"
python3 - "$TMP/bench" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [(r["test"], r["depth"]) for r in rows] == [("tg4", 0), ("tg4", 32)], rows
assert "vs_depth0" not in rows[0] and 0 < rows[1]["vs_depth0"] < 10, rows
# the ratio the cache's bytes allow at the peak: below 1, above 0
assert 0 < rows[1]["kv_ceiling"] < 1, rows
PY
ok "synth and bench"

echo "$pass passed, 0 failed"
