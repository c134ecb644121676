#!/usr/bin/env bash
# test_rerank_decoder.sh - decoders made into rerankers and embedders, as
# llama.cpp reads their files:
#   - a Qwen3-Reranker (synth qwen3-rerank-tiny: qwen3.pooling_type 4, the
#     head cls.output.weight [n_embd, 2] for "yes" and "no", a "rerank"
#     template with {query} and {document}): /v1/rerank fills the template,
#     runs the prompt, and scores each document by the softmax of the head
#     over the last token's state, P("yes");
#   - a Qwen3-Embedding (synth qwen3-embed-tiny: pooling_type 3):
#     /v1/embeddings, Ollama's /api/embed and llama-server's /embedding
#     (and "content" in place of "input") pool by the last token unless
#     the request or --pooling names another pooling.
# The expected numbers are llama.cpp d32676d's on the same files (a driver
# over libllama: rank pooling, llama_get_embeddings_seq; embeddings with the
# file's pooling, divided by their L2 norm), 1024-vocabulary byte-level BPE.
. "$(dirname "$0")/lib.sh" || exit 1
command -v python3 >/dev/null || skip "python3 is not installed"

T=$(mktemp -d /tmp/lmserv-rrdec.XXXXXX)
trap 'cleanup; rm -rf "$T"' EXIT
"$LMSERV" synth --shape qwen3-rerank-tiny --type F32 "$T/rr.gguf" >/dev/null || die "synth failed"
"$LMSERV" synth --shape qwen3-embed-tiny --type F32 "$T/emb.gguf" >/dev/null || die "synth failed"

"$LMSERV" info "$T/rr.gguf" >"$T/info.out" 2>&1
check "info: a reranker through the last token, 2 scores" eq \
    "$(grep -c 'a reranker (/v1/rerank): the last token.s state through its classification head, 2 scores' "$T/info.out")" 1

start_serve -m "$T/rr.gguf"
DOCS='["a cat is an animal","stocks went up","{document} tricky {query}"]'
req POST /v1/rerank -d "{\"query\":\"what is a cat\",\"documents\":$DOCS}"
check "rerank 200" eq "$(code)" 200
# llama.cpp: P(yes) 0.535704613, 0.52270031, 0.549320817 over 96, 95 and
# 103 tokens (the third document's {query} is the document's text: the
# query is filled in first, then the document)
check "scores as llama.cpp's, best first" eq \
    "$(py "$T/out" '[r["index"] for r in d["results"]] == [2, 0, 1] and max(abs(r["relevance_score"] - {0: 0.535704613, 1: 0.52270031, 2: 0.549320817}[r["index"]]) for r in d["results"]) < 2e-4')" True
check "usage: the three filled-in prompts' tokens" eq "$(py "$T/out" 'd["usage"]["prompt_tokens"]')" 294
req POST /rerank -d '{"query":"what is a cat","texts":["stocks went up"]}'
check "TEI's form: the same score" eq "$(code) $(py "$T/out" 'abs(d[0]["score"] - 0.52270031) < 2e-4')" "200 True"
req POST /v1/embeddings -d '{"input":"hi"}'
check "embeddings from a reranker: 400" eq "$(code) $(py "$T/out" '"is a reranker" in d["error"]["message"]')" "400 True"
req POST /v1/chat/completions -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}'
check "still a language model: chat 200" eq "$(code)" 200
stop_server

start_serve -m "$T/emb.gguf"
# llama.cpp's unit vector (last-token pooling), its first 8 values
REF='[0.151343322, -0.018046182, 0.135714883, -0.0376311002, -0.00954274766, 0.0531086539, 0.11796686, 0.0755153768]'
req POST /v1/embeddings -d '{"input":"Hello world, the cats!"}'
check "embeddings 200, 13 tokens" eq "$(code) $(py "$T/out" 'd["usage"]["prompt_tokens"]')" "200 13"
check "the file's pooling (last): llama.cpp's vector" eq \
    "$(py "$T/out" "max(abs(a - b) for a, b in zip(d[\"data\"][0][\"embedding\"], $REF)) < 1e-3")" True
python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["data"][0]["embedding"]))' "$T/out" >"$T/vec"
same='max(abs(a - b) for a, b in zip(VEC, json.load(open(sys.argv[1][:-3] + "vec")))) < 1e-6'
req POST /v1/embeddings -d '{"input":"Hello world, the cats!","pooling":"last"}'
check "pooling last named: the same vector" eq "$(py "$T/out" "${same/VEC/d[\"data\"][0][\"embedding\"]}")" True
req POST /api/embed -d '{"input":"Hello world, the cats!"}'
check "ollama embed: the same vector" eq "$(py "$T/out" "${same/VEC/d[\"embeddings\"][0]}")" True
req POST /embedding -d '{"content":"Hello world, the cats!"}'
check "llama-server's /embedding: [{index, embedding: [vector]}]" eq "$(code) $(py "$T/out" "len(d) == 1 and d[0][\"index\"] == 0 and len(d[0][\"embedding\"]) == 1 and ${same/VEC/d[0][\"embedding\"][0]}")" "200 True"
req POST /embedding -d '{"content":5}'
check "/embedding with content not text: 400 naming it" eq "$(code) $(py "$T/out" 'd["error"]["param"]')" "400 content"
req POST /embedding -d '{"pooling":"rank","input":"x"}'
check "/embedding with pooling rank: 400 naming it" eq "$(code) $(py "$T/out" 'd["error"]["param"]')" "400 pooling"
req POST /v1/embeddings -d '{"content":["Hello world, the cats!","dog"]}'
check "\"content\" for \"input\": llama-server's form" eq "$(py "$T/out" "[x[\"index\"] for x in d] == [0, 1] and ${same/VEC/d[0][\"embedding\"][0]}")" True
req POST /v1/embeddings -d '{"input":"Hello world, the cats!","pooling":"mean"}'
check "pooling mean named: another vector" eq "$(py "$T/out" "${same/VEC/d[\"data\"][0][\"embedding\"]}")" False
req POST /v1/embeddings -d '{"input":"Hello world, the cats!","pooling":"max"}'
check "an unknown pooling: 400 naming it" eq "$(code) $(py "$T/out" 'd["error"]["param"]')" "400 pooling"
req POST /v1/rerank -d '{"query":"q","documents":["a"]}'
check "rerank on an embedder: 400 naming the model" eq "$(code) $(py "$T/out" 'd["error"]["param"]')" "400 model"
req POST /v1/embeddings -d '{"input":"Hello world, the cats!","pooling":"mean"}'
python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["data"][0]["embedding"]))' "$T/out" >"$T/vec"
stop_server

# llama-server's --pooling sets the default over the file's; none is refused
start_serve -m "$T/emb.gguf" --pooling mean
req POST /v1/embeddings -d '{"input":"Hello world, the cats!"}'
check "--pooling mean: the mean vector by default" eq "$(py "$T/out" "${same/VEC/d[\"data\"][0][\"embedding\"]}")" True
stop_server
"$LMSERV" serve --host 127.0.0.1 --port 0 -m "$T/emb.gguf" --pooling none >"$T/none.out" 2>&1
check "--pooling none refused by name" eq "$? $(grep -c "pooling 'none'" "$T/none.out")" "1 1"
finish
