#!/usr/bin/env bash
# test_bert.sh - a BERT embedding model (synth bert-tiny: context 128,
# n_embd 128) served: /v1/embeddings (text, token ids, base64), Ollama's
# /api/embed and /api/embeddings give the same unit vectors; text requests
# and `lmserv run` are refused as "an embedding model"; an input longer
# than the context gets a 400 naming the limit (Ollama's /api/embed
# truncates it unless truncate is false); --gpu-layers is refused.
# A reranker (bert-rerank-tiny): /v1/rerank, /rerank (and TEI's form)
# order the documents by score, top_n, return_documents; errors by field.
. "$(dirname "$0")/lib.sh" || exit 1
command -v python3 >/dev/null || skip "python3 is not installed"

T=$(mktemp -d /tmp/lmserv-bert.XXXXXX)
trap 'cleanup; rm -rf "$T"' EXIT
"$LMSERV" synth --shape bert-tiny --type Q8_0 "$T/bert.gguf" >/dev/null || die "synth failed"

start_serve -m "$T/bert.gguf"
req POST /v1/embeddings -d '{"input":["Hello world, the cats!","dog"]}'
check "embeddings 200" eq "$(code)" 200
check "two unit vectors of 128" eq "$(py "$T/out" '[len(x["embedding"]) == 128 and abs(sum(v * v for v in x["embedding"]) - 1) < 1e-5 for x in d["data"]]')" "[True, True]"
check "usage counts [CLS] and [SEP]" eq "$(py "$T/out" 'd["usage"]["prompt_tokens"]')" 12
python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["data"][0]["embedding"]))' "$T/out" >"$T/vec"
same='max(abs(a - b) for a, b in zip(VEC, json.load(open(sys.argv[1][:-3] + "vec")))) < 1e-6'
# the tokens of "Hello world, the cats!" (synth.c's WordPiece vocabulary)
req POST /v1/embeddings -d '{"input":[2,90,91,79,89,94,42,81,3]}'
check "token ids: the same vector" eq "$(py "$T/out" "${same/VEC/d[\"data\"][0][\"embedding\"]}")" True
req POST /v1/embeddings -d '{"input":"Hello world, the cats!","encoding_format":"base64"}'
check "base64: the same floats" eq "$(py "$T/out" "${same/VEC/__import__(\"struct\").unpack(\"128f\", __import__(\"base64\").b64decode(d[\"data\"][0][\"embedding\"]))}")" True
# OpenAI's "dimensions": the first values, back to unit length (matryoshka)
req POST /v1/embeddings -d '{"input":"Hello world, the cats!","dimensions":32}'
check "dimensions 32: the full vector's first 32, renormalized" eq "$(py "$T/out" '(lambda v, w: len(v) == 32 and max(abs(a - b / sum(x * x for x in w[:32]) ** 0.5) for a, b in zip(v, w)) < 1e-6)(d["data"][0]["embedding"], json.load(open(sys.argv[1][:-3] + "vec")))')" True
req POST /v1/embeddings -d '{"input":"x","dimensions":129}'
check "dimensions past n_embd: 400 naming it" eq "$(code) $(py "$T/out" 'd["error"]["param"]')" "400 dimensions"
req POST /api/embed -d '{"input":"Hello world, the cats!"}'
check "ollama embed: the same vector" eq "$(py "$T/out" "${same/VEC/d[\"embeddings\"][0]}")" True
req POST /api/embeddings -d '{"prompt":"Hello world, the cats!"}'
check "ollama embeddings: the same vector" eq "$(py "$T/out" "${same/VEC/d[\"embedding\"]}")" True

long=$(python3 -c 'print("{\"input\":\"" + "a " * 200 + "\"}")')
req POST /v1/embeddings -d "$long"
check "too long: 400 naming the limit" eq "$(code) $(py "$T/out" '"202 tokens" in d["error"]["message"] and "at most 127" in d["error"]["message"]')" "400 True"
# Ollama truncates by default: the first 126 tokens and [SEP], as "a" x 125 gives
req POST /v1/embeddings -d "$(python3 -c 'print("{\"input\":\"" + "a " * 125 + "\"}")')"
python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["data"][0]["embedding"]))' "$T/out" >"$T/vec125"
req POST /api/embed -d "$long"
check "ollama embed of a long input: truncated to [CLS] 125 tokens [SEP]" eq "$(code) $(py "$T/out" '(d["prompt_eval_count"], max(abs(a - b) for a, b in zip(d["embeddings"][0], json.load(open(sys.argv[1][:-3] + "vec125")))) < 1e-6)')" "200 (127, True)"
req POST /api/embed -d "$(python3 -c 'print("{\"truncate\":false,\"input\":\"" + "a " * 200 + "\"}")')"
check "ollama embed with truncate false: 400" eq "$(code)" 400
req POST /v1/embeddings -d '{"input":"a cat","pooling":"last"}'
check "pooling is the model's" eq "$(code)" 400
req POST /v1/chat/completions -d '{"messages":[{"role":"user","content":"hi"}]}'
check "chat: 400, an embedding model" eq "$(code) $(py "$T/out" '"is an embedding model" in d["error"]["message"]')" "400 True"
req POST /api/generate -d '{"prompt":"hi"}'
check "ollama generate: 400" eq "$(code)" 400
req POST /v1/rerank -d '{"query":"q","documents":["a"]}'
check "rerank on an embedding model: 400 naming the model field" eq "$(code) $(py "$T/out" 'd["error"]["param"]')" "400 model"
stop_server

# ---- a reranker (synth bert-rerank-tiny: rank pooling, a one-score head) ------------------
"$LMSERV" synth --shape bert-rerank-tiny --type F32 "$T/rr.gguf" >/dev/null || die "synth failed"
"$LMSERV" info "$T/rr.gguf" >"$T/rinfo.out" 2>&1
check "info: a reranker with one score" eq "$(grep -c 'a reranker: \[CLS\] through its classification head, 1 score' "$T/rinfo.out")" 1
start_serve -m "$T/rr.gguf"
DOCS='["hello world","the cats are here","dog","a world of cats and dogs"]'
echo "$DOCS" >"$T/docs"
req POST /v1/rerank -d "{\"query\":\"the cats\",\"documents\":$DOCS}"
check "rerank 200" eq "$(code)" 200
check "every document once, best first" eq "$(py "$T/out" '(sorted(r["index"] for r in d["results"]), all(a["relevance_score"] >= b["relevance_score"] for a, b in zip(d["results"], d["results"][1:])))')" "([0, 1, 2, 3], True)"
check "usage: the pairs' tokens" eq "$(py "$T/out" 'd["usage"]["prompt_tokens"] > 4 * 4')" True
python3 -c 'import json,sys; print(json.dumps({r["index"]: r["relevance_score"] for r in json.load(open(sys.argv[1]))["results"]}))' "$T/out" >"$T/scores"
req POST /v1/rerank -d "{\"query\":\"the cats\",\"documents\":$DOCS,\"top_n\":2,\"return_documents\":true}"
check "top_n 2 with documents: the same two best" eq "$(py "$T/out" '[(r["index"], r["document"]["text"]) for r in d["results"]] == [(int(k), json.load(open(sys.argv[1][:-3] + "docs"))[int(k)]) for k, v in sorted(json.load(open(sys.argv[1][:-3] + "scores")).items(), key=lambda kv: -kv[1])[:2]]')" True
# one document alone scores as it did among the others
req POST /rerank -d '{"query":"the cats","documents":["dog"]}'
check "a document's score does not depend on the others" eq "$(py "$T/out" 'abs(d["results"][0]["relevance_score"] - json.load(open(sys.argv[1][:-3] + "scores"))["2"]) < 1e-6')" True
req POST /rerank -d "{\"query\":\"the cats\",\"texts\":$DOCS,\"return_text\":true}"
check "TEI's form: [{index, score, text}] best first" eq "$(py "$T/out" '[(r["index"], round(r["score"], 6)) for r in d] == [(int(k), round(v, 6)) for k, v in sorted(json.load(open(sys.argv[1][:-3] + "scores")).items(), key=lambda kv: -kv[1])] and d[0]["text"] in json.load(open(sys.argv[1][:-3] + "docs"))')" True
req POST /v1/embeddings -d '{"input":"hi"}'
check "embeddings from a reranker: 400" eq "$(code) $(py "$T/out" '"is a reranker" in d["error"]["message"]')" "400 True"
req POST /v1/rerank -d '{"query":"","documents":["a"]}'
check "an empty query: 400 naming it" eq "$(code) $(py "$T/out" 'd["error"]["param"]')" "400 query"
req POST /v1/rerank -d '{"query":"q","documents":["a",7]}'
check "a document that is not text: 400 naming it" eq "$(code) $(py "$T/out" '"documents[1]" in d["error"]["message"]')" "400 True"
req POST /v1/rerank -d '{"query":"q","documents":["a"],"top_n":0}'
check "top_n 0 refused" eq "$(code)" 400
LONG=$(python3 -c 'print(" ".join(["cats"] * 200))')
req POST /v1/rerank -d "{\"query\":\"q\",\"documents\":[\"$LONG\"]}"
check "a pair longer than the context: 400 naming the limit" eq "$(code) $(py "$T/out" 'd["error"]["code"]')" "400 context_length_exceeded"
stop_server

"$LMSERV" run -m "$T/bert.gguf" -p hi -n 2 >"$T/run.out" 2>&1
check "run refuses it" eq "$? $(grep -c 'is an embedding model' "$T/run.out")" "1 1"
"$LMSERV" serve --host 127.0.0.1 --port 0 -m "$T/bert.gguf" --gpu-layers 2 >"$T/gpu.out" 2>&1 &
GPID=$!
for _ in $(seq 100); do
    kill -0 "$GPID" 2>/dev/null || break
    grep -q -- "--gpu-layers is not supported" "$T/gpu.out" && break
    sleep 0.05
done
kill "$GPID" 2>/dev/null
wait "$GPID" 2>/dev/null
check "--gpu-layers refused by name" eq "$(grep -c -- '--gpu-layers is not supported' "$T/gpu.out")" 1
"$LMSERV" info "$T/bert.gguf" >"$T/info.out" 2>&1
check "info: an embedding model, mean pooling, no KV cache" eq \
    "$(grep -c 'embedding model: bidirectional attention, mean pooling' "$T/info.out") $(grep -c 'no KV cache' "$T/info.out")" "1 1"
finish
