#!/usr/bin/env bash
# test_llama_flags.sh - a launch command written for llama-server starts
# `lmserv serve` unchanged: its names for lmserv's settings, its default
# sampling (--temp, -n, --seed, ...), and the switches lmserv takes and
# drops (-fa, --jinja, --cont-batching, ...); --no-webui; bad values refused.
. "$(dirname "$0")/lib.sh" || exit 1
command -v python3 >/dev/null || skip "python3 is not installed"
T=$(mktemp -d /tmp/lmserv-llflags.XXXXXX)
trap 'cleanup; rm -rf "$T"' EXIT

start_server -ngl 0 --ctx-size 384 -fa on --jinja --cont-batching --metrics -ctk f16 -ctv f16 \
    --temp 0 -n 5 --seed 3 --top-k 40 -a story --no-webui -tb 2 -ub 128 --no-mmap
check "the dropped switches are named on stderr" eval "grep -q -- '-fa is taken and has no effect here' '$LOG' && grep -q -- '--jinja is taken' '$LOG'"
req GET /v1/models
check "-a: the alias" eq "$(py "$T/out" 'd["data"][0]["id"]')" story
req GET /props
check "--ctx-size: the context" eq "$(py "$T/out" 'd["default_generation_settings"]["n_ctx"]')" 384
req POST /v1/chat/completions -d '{"messages":[{"role":"user","content":"Tell me a story"}]}'
check "-n 5: five tokens for a request that sets no limit" eq "$(py "$T/out" '(d["usage"]["completion_tokens"], d["choices"][0]["finish_reason"])')" "(5, 'length')"
py "$T/out" 'd["choices"][0]["message"]["content"]' >"$T/a"
req POST /v1/chat/completions -d '{"messages":[{"role":"user","content":"Tell me a story"}],"temperature":0,"max_tokens":5}'
check "--temp 0: the greedy reply" eq "$(py "$T/out" 'd["choices"][0]["message"]["content"]')" "$(cat "$T/a")"
req POST /v1/chat/completions -d '{"messages":[{"role":"user","content":"Tell me a story"}],"max_tokens":2}'
check "a request's own fields win" eq "$(py "$T/out" 'd["usage"]["completion_tokens"]')" 2
req GET /
check "--no-webui: no page" eq "$(code)" 404
req GET /metrics
check "/metrics is served" eq "$(code)" 200
stop_server

M="$MODEL"
check "-ctk and -ctv of different types: refused" eq "$("$LMSERV" serve -m "$M" --port 0 -ctk q8_0 -ctv f16 2>&1 | grep -c 'one type for K and V')" 1
check "--temp that is no number: refused" eq "$("$LMSERV" serve -m "$M" --port 0 --temp hot 2>&1 | grep -c -- '--temp needs a number')" 1
check "-n that is no integer: refused" eq "$("$LMSERV" serve -m "$M" --port 0 -n 2.5 2>&1 | grep -c -- '-n needs an integer')" 1
check "--top-p out of range: refused at start" eq "$("$LMSERV" serve -m "$M" --port 0 --top-p 7 2>&1 | grep -c 'sampling defaults: .*top_p')" 1
check "-ngld without a draft model: refused" eq "$("$LMSERV" serve -m "$M" --port 0 -ngld 2 2>&1 | grep -c -- '--gpu-layers-draft is for a draft model')" 1
check "-ngld that is no count: refused, naming it" eq "$("$LMSERV" serve -m "$M" --port 0 -md "$M" -ngld many 2>&1 | grep -c -- "--gpu-layers-draft: 'many'")" 1
check "a flag neither knows: still refused" eq "$("$LMSERV" serve -m "$M" --port 0 --frobnicate 2>&1 | grep -c "unknown option '--frobnicate'")" 1
finish
