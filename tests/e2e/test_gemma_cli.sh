#!/usr/bin/env bash
# gemma2 / gemma3 from the command line: synthetic tiny models written by
# `lmserv synth`, run greedily (reproducible), evaluated at every position
# (the soft-capped gemma2 logits stay within the cap), and on the GPU where
# there is one.
set -euo pipefail
: "${LMSERV:?}"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
ok() { echo "ok - $*"; }

"$LMSERV" synth --shape gemma3-tiny --type Q8_0 "$TMP/g3.gguf" > /dev/null
"$LMSERV" synth --shape gemma2-tiny --type F16 "$TMP/g2.gguf" > /dev/null
ok "synth gemma3-tiny and gemma2-tiny"

for m in g3 g2; do
    a=$("$LMSERV" run -m "$TMP/$m.gguf" -p "hello world" -n 24 --temp 0 2>"$TMP/err")
    b=$("$LMSERV" run -m "$TMP/$m.gguf" -p "hello world" -n 24 --temp 0 2>/dev/null)
    [ -n "$a" ] && [ "$a" = "$b" ] || fail "$m greedy run: '$a' vs '$b'"
    grep -q "generated 24 tokens" "$TMP/err" || fail "$m stats line: $(cat "$TMP/err")"
done
ok "greedy runs reproducible"

# 40 positions: past the window of 16; gemma2-tiny's final cap is 2
ids=$(seq 10 49 | tr '\n' ' ')
"$LMSERV" eval -m "$TMP/g2.gguf" --tokens "$ids" --logits "$TMP/g2.f32" --all-positions > /dev/null
python3 - "$TMP/g2.f32" <<'PY'
import struct, sys
d = open(sys.argv[1], 'rb').read()
assert len(d) == 40 * 1024 * 4, len(d)
x = struct.unpack('%df' % (len(d) // 4), d)
m = max(abs(v) for v in x)
assert 1.0 < m <= 2.0, m
PY
ok "gemma2 logits soft-capped"

# a CUDA build with a device runs gemma's layers on the GPU; else the
# explicit count is refused, naming CUDA (no CUDA build, or no device)
if "$LMSERV" run -m "$TMP/g3.gguf" -p "hi" -n 2 --gpu-layers 1 2>"$TMP/err" >/dev/null; then
    grep -q "1/6 layers" "$TMP/err" || fail "gpu plan line: $(cat "$TMP/err")"
    ok "gemma with a layer on the GPU"
else
    grep -qi "cuda" "$TMP/err" || fail "gpu refusal message: $(cat "$TMP/err")"
    ok "gemma --gpu-layers refused without CUDA or a device"
fi
