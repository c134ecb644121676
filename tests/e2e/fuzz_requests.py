#!/usr/bin/env python3
"""fuzz_requests.py - black-box request fuzzer for `lmserv serve`.

From a fixed seed it sends mutated requests to every endpoint of a running
server (HTTP routes of src/serve/http.c and both WebSocket dialects of /ws)
and stops at the first failure:

  - the server process is gone, or its log holds a sanitizer report;
  - a request gets no complete answer within --timeout seconds;
  - GET /health does not answer 200 after a request;
  - a response is malformed: a bad status line or framing, an error whose
    body is not JSON naming the error, a 5xx for a request the client got
    wrong (500, 502, 504; 503 and 429 only with a JSON error body), a
    non-streamed JSON 2xx that does not parse, an SSE event that is not JSON;
  - a WebSocket reply that is not a JSON text message.

Python 3 standard library only; WebSocket frames are written by hand.

  fuzz_requests.py --port P --pid PID --log SERVER_LOG [--seed S] [--count N]

--count is the number of requests (each WebSocket session counts as one).
The deterministic short mode (the CTest test e2e/test_fuzz_requests) is
the default seed and --count 600; --regress first replays the inputs that
once crashed or wedged the server (see REGRESSIONS).
Exit status: 0 all well, 1 a failure (printed with the request that
caused it, and the server log's tail).
"""
import argparse
import base64
import json
import os
import random
import re
import socket
import struct
import sys
import threading
import time

HOST = "127.0.0.1"

# ---- valid bodies, one set per endpoint ------------------------------------------

MSGS = [{"role": "user", "content": "Tell me a story"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                         "required": ["city"]}}}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 1, "maximum": 9},
          "s": {"type": "string", "maxLength": 4}}, "required": ["a"]}

BODIES = {
    "/v1/chat/completions": [
        {"messages": MSGS, "max_tokens": 4},
        {"messages": MSGS, "max_tokens": 4, "stream": True,
         "stream_options": {"include_usage": True}},
        {"messages": MSGS, "max_tokens": 3, "n": 2, "logprobs": True, "top_logprobs": 2},
        {"messages": MSGS, "max_tokens": 6, "tools": TOOLS, "tool_choice": "auto"},
        {"messages": MSGS, "max_tokens": 6, "tools": TOOLS,
         "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
        {"messages": MSGS, "max_tokens": 8, "response_format": {"type": "json_object"}},
        {"messages": MSGS, "max_tokens": 8, "response_format": {
            "type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA}}},
        {"messages": MSGS, "max_tokens": 4, "grammar": "root ::= \"a\" [b-d]*"},
        {"messages": [{"role": "system", "content": "be brief"},
                      {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                      {"role": "assistant", "content": None, "tool_calls": [
                          {"id": "c1", "type": "function",
                           "function": {"name": "get_weather", "arguments": "{\"city\":\"x\"}"}}]},
                      {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
         "max_tokens": 3, "temperature": 0.5, "top_p": 0.9, "top_k": 5, "min_p": 0.1,
         "seed": 3, "stop": ["x", "y"], "presence_penalty": 0.5, "frequency_penalty": 0.2,
         "logit_bias": {"7": 2}, "mirostat": 2, "reasoning_format": "deepseek"},
    ],
    "/v1/completions": [
        {"prompt": "Once upon a time", "max_tokens": 4},
        {"prompt": ["Once", "a cat"], "max_tokens": 3, "n": 2, "stream": True},
        {"prompt": "Once upon a time", "max_tokens": 0, "echo": True, "logprobs": 2},
        {"prompt": [1, 2, 3], "max_tokens": 3, "logprobs": 1, "suffix": "x"},
    ],
    "/v1/embeddings": [
        {"input": "Hello world"},
        {"input": ["a", "b"], "encoding_format": "base64", "dimensions": 16},
        {"input": [2, 90, 91]},
    ],
    "/v1/rerank": [
        {"query": "cat", "documents": ["a cat", "a dog"], "top_n": 1, "return_documents": True},
    ],
    "/v1/messages": [
        {"model": "stories260K", "max_tokens": 4, "messages": MSGS},
        {"max_tokens": 4, "stream": True, "system": "be kind",
         "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
        {"max_tokens": 6, "tools": [{"name": "w", "description": "d",
                                     "input_schema": {"type": "object"}}],
         "tool_choice": {"type": "auto"}, "messages": MSGS,
         "thinking": {"type": "enabled", "budget_tokens": 10}, "stop_sequences": ["x"]},
    ],
    "/v1/messages/count_tokens": [
        {"messages": MSGS, "system": [{"type": "text", "text": "s"}]},
    ],
    "/v1/responses": [
        {"input": "Once upon a time", "max_output_tokens": 4},
        {"input": "hi", "max_output_tokens": 4, "stream": True, "instructions": "short"},
        {"input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
         "max_output_tokens": 4, "text": {"format": {"type": "json_schema", "name": "w",
                                                     "schema": SCHEMA}}},
        {"input": "hi", "max_output_tokens": 4, "store": False,
         "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
         "tool_choice": "required"},
        {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                   {"type": "function_call_output", "call_id": "c", "output": "ok"}],
         "previous_response_id": "resp_nope", "max_output_tokens": 2},
    ],
    "/completion": [
        {"prompt": "Once upon a time", "n_predict": 4, "n_probs": 2, "post_sampling_probs": True},
        {"prompt": "Once", "n_predict": 4, "stream": True, "cache_prompt": True},
        {"prompt": [1, 2, "x"], "n_predict": 2, "grammar": "root ::= [a-z]+",
         "json_schema": {"type": "string"}},
    ],
    "/infill": [
        {"input_prefix": "def f(", "input_suffix": "):\n", "n_predict": 3,
         "input_extra": [{"filename": "a.py", "text": "y = 1\n"}]},
    ],
    "/tokenize": [
        {"content": "Once upon a time", "add_special": True, "with_pieces": True},
    ],
    "/detokenize": [
        {"tokens": [1, 2, 90, 91]},
    ],
    "/apply-template": [
        {"messages": MSGS},
    ],
    "/api/chat": [
        {"model": "stories260K", "messages": MSGS, "stream": False,
         "options": {"num_predict": 4, "temperature": 0}},
        {"model": "stories260K", "messages": MSGS, "format": "json",
         "options": {"num_predict": 4}},
        {"model": "stories260K", "messages": MSGS, "format": SCHEMA, "tools": TOOLS,
         "stream": False, "keep_alive": "5m", "options": {"num_predict": 4}},
    ],
    "/api/generate": [
        {"model": "stories260K", "prompt": "Once", "raw": True, "stream": False,
         "options": {"num_predict": 4}},
        {"model": "stories260K", "prompt": "Once", "options": {"num_predict": 3},
         "system": "s", "template": "{{ .Prompt }}", "context": [1, 2]},
    ],
    "/api/show": [{"model": "stories260K"}],
    "/api/embed": [{"model": "stories260K", "input": ["a cat", "a dog"]}],
    "/api/embeddings": [{"model": "stories260K", "prompt": "a cat"}],
    "/api/pull": [{"model": "stories260K", "stream": False}],
    "/api/copy": [{"source": "a", "destination": "b"}],
    "/lora-adapters": [[{"id": 0, "scale": 1}]],
    "/lora-adapters/load": [{"path": "a2.gguf"}, {"path": "../x.gguf"}, {"path": "a1.gguf",
                                                                         "scale": 0.5}],
    "/lora-adapters/unload": [{"id": 1}, {"path": "a2.gguf"}],
}
# aliases (same handlers)
for a, b in (("/chat/completions", "/v1/chat/completions"), ("/completions", "/v1/completions"),
             ("/embeddings", "/v1/embeddings"), ("/rerank", "/v1/rerank"),
             ("/v1/reranking", "/v1/rerank"), ("/api/push", "/api/pull"),
             ("/api/create", "/api/copy")):
    BODIES[a] = BODIES[b]

GET_PATHS = ["/", "/health", "/stats", "/metrics", "/v1/models", "/v1/models/stories260K",
             "/v1/models/", "/v1/models/nope", "/props", "/slots", "/api/tags", "/api/ps",
             "/api/version", "/lora-adapters", "/v1/responses/resp_nope", "/ws"]

WS_MSGS = [
    {"op": "infer", "prompt": "Once upon a time", "params": {"temp": 0.7, "max_tokens": 6}},
    {"op": "infer", "prompt": "hi", "params": {"raw": True, "max_tokens": 4,
                                               "grammar": "root ::= [a-c]+"}},
    {"op": "abort"}, {"op": "ping"}, {"op": "metrics"}, {"op": "metrics", "subscribe": False},
    {"type": "generate", "messages": MSGS, "session_id": "s1", "system_prompt": "be kind",
     "max_tokens": 6, "temperature": 0.7, "top_k": 50, "top_p": 0.9},
    {"type": "generate", "messages": MSGS, "session_id": "s2", "max_tokens": 4,
     "reasoning_format": "deepseek", "lora": [{"id": 0, "scale": 0.5}]},
    {"type": "abort", "session_id": "s1"}, {"type": "ping"},
    {"type": "load_adapter", "adapter_path": "a2.gguf", "scale": 1},
    {"type": "load_adapter", "adapter_path": None}, {"type": "unload_adapter"},
]

# ---- JSON mutation -----------------------------------------------------------------


class Raw:
    """A JSON fragment written as it is (NaN, lone surrogates, huge numbers)."""

    def __init__(self, text):
        self.text = text


class Dup:
    """An object written with repeated keys: a list of (key, value) pairs."""

    def __init__(self, pairs):
        self.pairs = pairs


def dump(v):
    if isinstance(v, Raw):
        return v.text
    if isinstance(v, Dup):
        return "{" + ",".join(json.dumps(k) + ":" + dump(x) for k, x in v.pairs) + "}"
    if isinstance(v, dict):
        return "{" + ",".join(json.dumps(k) + ":" + dump(x) for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ",".join(dump(x) for x in v) + "]"
    return json.dumps(v)


ODD_NUMBERS = ["0", "-1", "-0", "1e400", "-1e400", "1e-400", "9223372036854775807",
               "9223372036854775808", "-9223372036854775809", "18446744073709551616",
               "4294967296", "2147483648", "-2147483649", "1.5", "0.0000001", "65536", "1e9",
               "123456789012345678901234567890", "NaN", "Infinity", "-Infinity", "1e308",
               "-2", "100000", "3.4e38", "2.5e-324"]
ODD_STRINGS = ['"\\ud800"', '"\\udfff"', '"a\\ud800b"', '"\\ud800\\u0041"', '"\\u0000"',
               '"\\u0000abc"', '""', '"\\uDBFF\\uDFFF"', '"\\\\"', '"%s"',
               '"%n%n%n%n"', '"\\/"', '"\\ud83d\\ude00"', '"<|endoftext|>"', '"<s></s>"',
               '"{{ raise }}"', '"../../../etc/passwd"', '"\\n\\n\\n"']


def odd_scalar(rng):
    r = rng.random()
    if r < 0.35:
        return Raw(rng.choice(ODD_NUMBERS))
    if r < 0.6:
        return Raw(rng.choice(ODD_STRINGS))
    if r < 0.7:
        return Raw('"' + "x" * rng.choice([256, 4096, 70000, 300000]) + '"')
    if r < 0.75:
        return "é" * rng.choice([1, 1000, 20000])
    return rng.choice([None, True, False, 0, -1, 1, 2, "", "x", [], {}, [None], {"": None},
                       [1, "a", None], {"type": "text", "text": "t"}, 1.5, -1e9])


def deep(rng):
    d = rng.choice([64, 500, 3000, 20000])
    if rng.random() < 0.5:
        return Raw("[" * d + "1" + "]" * d)
    return Raw('{"a":' * d + "1" + "}" * d)


def paths_of(v, pre=()):
    out = [pre]
    if isinstance(v, dict):
        for k, x in v.items():
            out += paths_of(x, pre + (k,))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            out += paths_of(x, pre + (i,))
    return out


def get_at(v, p):
    for k in p:
        v = v[k]
    return v


def set_at(v, p, x):
    if not p:
        return x
    get_at(v, p[:-1])[p[-1]] = x
    return v


def retype(x, rng):
    opts = ["s", 1, -7, 2.5, None, True, False, [], {}, [x], {"x": x}, "[]", "1", str(x)[:50]]
    if isinstance(x, str):
        opts += [Raw(x) if x and x[0].isdigit() else 0, [x, x], {"type": "text", "text": x}]
    return rng.choice(opts)


TYPED_INTS = [0, 1, -1, 2, 63, 64, 65, 255, 256, 257, 511, 512, 1024, 32000, 2 ** 31 - 1,
              2 ** 31, 2 ** 32, 2 ** 53, 2 ** 63 - 1, -2 ** 31, -2 ** 63]
TYPED_FLOATS = [0.0, -0.0, 1e-30, 1e30, -1.0, 0.5, 1.0, 2.0, 100.0, 1e308, -1e308, 5e-324]
TYPED_STRS = ["", " ", "\u0000", "\ud7ff\ue000", "🙂" * 50, "a" * 5000, "<|im_start|>",
              "{", "}", "root ::= root", "root ::= [", "\\", "\n", "0", "x\u0000y"]


def mutate_typed(v, rng):
    """Right-typed edge values: a number stays a number (0, negative, huge), a
    string a string (empty, long, odd code points), a list may empty or grow."""
    v = json.loads(json.dumps(v))
    for _ in range(rng.choice([1, 1, 2, 3])):
        ps = [p for p in paths_of(v) if p]
        if not ps:
            break
        p = rng.choice(ps)
        x = get_at(v, p)
        if isinstance(x, bool):
            y = not x
        elif isinstance(x, int):
            y = rng.choice(TYPED_INTS) * rng.choice([1, 1, -1])
        elif isinstance(x, float):
            y = rng.choice(TYPED_FLOATS + [float(i) for i in TYPED_INTS[:8]])
        elif isinstance(x, str):
            y = rng.choice(TYPED_STRS)
        elif isinstance(x, list):
            y = rng.choice([[], x * rng.choice([2, 50, 300]), x[:1], list(reversed(x))])
        elif isinstance(x, dict):
            y = rng.choice([{}, dict(list(x.items())[:1])])
        else:
            continue
        set_at(v, p, y)
    return v


# Right-typed values of the generation fields, combined at random: the
# requests that get past validation into sampling, grammars and formats.
FIELDS = {
    "temperature": [0, 0.0001, 0.7, 2, 100], "top_p": [0, 0.01, 1, 0.5],
    "top_k": [0, 1, 2, 40, 100000], "min_p": [0, 0.99, 1], "typical_p": [0.01, 1],
    "seed": [0, 1, 4294967295, 18446744073709551615], "n": [1, 2, 5],
    "max_tokens": [0, 1, 3, 31], "n_predict": [0, 1, -1, 5], "max_output_tokens": [1, 5],
    "stop": [[], [""], ["a", "b", "c", "d"], "\n", ["Once"], [" "]],
    "presence_penalty": [-2, 2], "frequency_penalty": [-2, 2], "repeat_penalty": [0, 1, 2],
    "repeat_last_n": [0, -1, 64], "mirostat": [1, 2], "mirostat_tau": [0, 5, 100],
    "mirostat_eta": [0, 1], "logprobs": [True, 0, 5, 20], "top_logprobs": [0, 5, 20],
    "n_probs": [0, 1, 10, 100], "echo": [True], "stream": [True, False],
    "stream_options": [{"include_usage": True}], "logit_bias": [{"1": -100}, {"0": 100},
                                                                  {"2": -1e9}, {"99999": 1}],
    "grammar": ["root ::= [a-z]{1,3}", "root ::= \"x\" root | \"y\"", "root ::= [^\\x00]*",
                "root ::= (\"a\" | \"b\")+ \"\\n\""],
    "response_format": [{"type": "json_object"}, {"type": "text"},
                        {"type": "json_schema", "json_schema": {"schema": SCHEMA}},
                        {"type": "json_schema", "json_schema": {"schema": {
                            "type": "array", "items": {"enum": ["a", "b", 1, None]},
                            "minItems": 2, "maxItems": 3}}},
                        {"type": "json_schema", "json_schema": {"schema": {
                            "$defs": {"n": {"anyOf": [{"type": "null"},
                                                      {"$ref": "#/$defs/n"}]}},
                            "$ref": "#/$defs/n"}}},
                        {"type": "json_schema", "json_schema": {"schema": {
                            "type": "string", "pattern": "^[0-9]{2}-x$"}}}],
    "tools": [TOOLS, TOOLS * 3], "tool_choice": ["auto", "none", "required",
                                                {"type": "function",
                                                 "function": {"name": "get_weather"}}],
    "parallel_tool_calls": [True, False], "reasoning_format": ["deepseek", "none", "auto"],
    "cache_prompt": [True, False], "id_slot": [0, 3, 7], "ignore_eos": [True],
    "lora": [[{"id": 0, "scale": 1}], [{"id": 0, "scale": -3}], []],
    "chat_template_kwargs": [{"enable_thinking": False}], "add_generation_prompt": [False],
    "format": ["json", SCHEMA], "options": [{"num_predict": 3, "temperature": 0, "top_k": 1,
                                             "num_ctx": 64, "stop": ["a"]}],
    "keep_alive": ["5m", 0, -1, "0s"], "think": [True, False], "raw": [True],
    "suffix": ["end"], "best_of": [2], "user": ["u"],
}


def mutate_combo(v, rng):
    if not isinstance(v, dict):
        return v
    v = json.loads(json.dumps(v))
    for k in rng.sample(sorted(FIELDS), rng.randint(2, 7)):
        v[k] = rng.choice(FIELDS[k])
    return v


def mutate_json(v, rng):
    r = rng.random()
    if r < 0.25:
        return mutate_combo(v, rng)
    if r < 0.5:
        return mutate_typed(v, rng)
    v = json.loads(json.dumps(v))
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        ps = paths_of(v)
        p = rng.choice(ps)
        r = rng.random()
        try:
            if r < 0.2 and p:
                parent = get_at(v, p[:-1])
                del parent[p[-1]]
            elif r < 0.45:
                v = set_at(v, p, retype(get_at(v, p), rng))
            elif r < 0.7:
                v = set_at(v, p, odd_scalar(rng))
            elif r < 0.75:
                v = set_at(v, p, deep(rng))
            elif r < 0.85:
                tgt = get_at(v, p)
                if isinstance(tgt, dict):
                    key = rng.choice(["stream", "n", "logprobs", "top_logprobs", "tools",
                                      "tool_choice", "response_format", "grammar",
                                      "json_schema", "max_tokens", "n_predict", "stop",
                                      "messages", "prompt", "input", "model", "seed",
                                      "temperature", "lora", "logit_bias", "n_probs",
                                      "stream_options", "echo", "format", "options",
                                      "top_k", "dimensions", "id_slot", "cache_prompt",
                                      "session_id", "params", "suffix", "mirostat", "tokens",
                                      "with_pieces", "reasoning_format", "thinking",
                                      "chat_template_kwargs", "previous_response_id"])
                    tgt[key] = rng.choice([True, False, 0, 2, 65, -1, "x", None, [], {},
                                           odd_scalar(rng), {"type": "json_schema"},
                                           [{"type": "function"}], "required", "none",
                                           {"type": "json_object"}, "root ::= x", [7, "y"]])
                elif isinstance(tgt, list):
                    tgt.append(odd_scalar(rng) if rng.random() < 0.5 else
                               rng.choice(tgt) if tgt else None)
                    if rng.random() < 0.2:
                        tgt *= rng.choice([8, 100])
            else:
                tgt = get_at(v, p)
                if isinstance(tgt, dict) and tgt:
                    k = rng.choice(list(tgt))
                    pairs = list(tgt.items()) + [(k, odd_scalar(rng))]
                    v = set_at(v, p, Dup(pairs))
        except (KeyError, IndexError, TypeError):
            pass
        if isinstance(v, (Raw, Dup)):
            break
    return v


# ---- HTTP --------------------------------------------------------------------------


STATS = {}  # responses by status


class Fail(Exception):
    pass


class Hang(Fail):
    pass


def connect(port, timeout):
    s = socket.create_connection((HOST, port), timeout=timeout)
    s.settimeout(timeout)
    return s


class Reader:
    def __init__(self, sock, deadline):
        self.s = sock
        self.buf = b""
        self.deadline = deadline
        self.eof = False

    def fill(self):
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise Hang("no complete answer in time")
        self.s.settimeout(left)
        try:
            d = self.s.recv(65536)
        except socket.timeout:
            raise Hang("no complete answer in time")
        except ConnectionResetError:
            d = b""
        if not d:
            self.eof = True
        self.buf += d
        return bool(d)

    def line(self):
        while b"\r\n" not in self.buf:
            if not self.fill():
                return None
        ln, self.buf = self.buf.split(b"\r\n", 1)
        return ln

    def exact(self, n):
        while len(self.buf) < n:
            if not self.fill():
                return None
        d, self.buf = self.buf[:n], self.buf[n:]
        return d

    def rest(self):
        while self.fill():
            pass
        d, self.buf = self.buf, b""
        return d


def read_response(rd, head_req=False, abort_after=None):
    """One response: (status, headers, body). None if the connection closed
    before a status line. abort_after: stop after that many body bytes."""
    ln = rd.line()
    if ln is None:
        return None
    parts = ln.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise Fail("bad status line %r" % ln[:200])
    status = int(parts[1])
    hdrs = {}
    while True:
        h = rd.line()
        if h is None:
            raise Fail("the connection closed inside the headers")
        if h == b"":
            break
        if b":" not in h:
            raise Fail("bad header line %r" % h[:200])
        k, v = h.split(b":", 1)
        hdrs[k.strip().lower().decode("latin-1")] = v.strip().decode("latin-1")
    if head_req or status in (101, 204, 304) or 100 <= status < 200:
        return status, hdrs, b""
    if "content-length" in hdrs:
        n = int(hdrs["content-length"])
        if abort_after is not None:
            n = min(n, abort_after)
        body = rd.exact(n)
        if body is None:
            raise Fail("the body ended before its content-length %d" % n)
        return status, hdrs, body
    if hdrs.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            sz = rd.line()
            if sz is None:
                raise Fail("the connection closed inside a chunked body")
            try:
                n = int(sz.split(b";")[0], 16)
            except ValueError:
                raise Fail("bad chunk size line %r" % sz[:100])
            if n == 0:
                rd.line()
                return status, hdrs, body
            d = rd.exact(n + 2)
            if d is None or d[-2:] != b"\r\n":
                raise Fail("bad chunk framing")
            body += d[:-2]
            if abort_after is not None and len(body) >= abort_after:
                return status, hdrs, body
    return status, hdrs, rd.rest()


def is_json_error(body):
    try:
        j = json.loads(body)
    except ValueError:
        return False
    if not isinstance(j, dict):
        return False
    e = j.get("error")
    if isinstance(e, str) and e:
        return True  # Ollama's shape
    if isinstance(e, dict) and isinstance(e.get("message"), str) and e["message"]:
        return True  # OpenAI's and Anthropic's
    return False


def check_response(st, hdrs, body, complete=True, lax=False, head=False):
    if not 100 <= st < 600:
        raise Fail("status %d" % st)
    if st in (500, 502, 504):
        raise Fail("status %d for a client's request: %r" % (st, body[:300]))
    ctype = hdrs.get("content-type", "")
    if st >= 400:
        if (lax and 400 <= st < 500) or not complete or head:
            return  # libwebsockets' own HTML refusal of what is not HTTP; a cut body
        if not is_json_error(body):
            raise Fail("error %d without a JSON error body: %r" % (st, body[:300]))
        if st == 503 and b"out of memory" in body:  # these requests are all small
            raise Fail("503 out of memory: %r" % body[:300])
        return
    if not complete:
        return
    if ctype.startswith("application/json") and body:
        try:
            json.loads(body)
        except ValueError as e:
            raise Fail("a %d JSON body that does not parse (%s): %r" % (st, e, body[:300]))
    elif ctype.startswith("text/event-stream"):
        for ev in body.split(b"\n\n"):
            for ln in ev.split(b"\n"):
                if ln.startswith(b"data: ") and ln != b"data: [DONE]":
                    try:
                        json.loads(ln[6:])
                    except ValueError:
                        raise Fail("an SSE event that is not JSON: %r" % ln[:300])
    elif ctype.startswith("application/x-ndjson"):
        for ln in body.split(b"\n"):
            if ln.strip():
                try:
                    json.loads(ln)
                except ValueError:
                    raise Fail("an NDJSON line that is not JSON: %r" % ln[:300])


def exchange(port, raw, timeout, abort_after=None, close_early=False, expect_reply=True,
             lax=False):
    """Sends raw bytes, reads responses until the connection is done or the one
    response is in. Returns the list of (status, headers, body)."""
    s = connect(port, timeout)
    out = []
    try:
        try:
            s.sendall(raw)
        except (BrokenPipeError, ConnectionResetError):
            pass
        if close_early:
            return out
        rd = Reader(s, time.monotonic() + timeout)
        head = raw.startswith(b"HEAD ")
        r = read_response(rd, head, abort_after)
        if r is None:
            if expect_reply and not lax:
                raise Fail("the connection closed without a response")
            return out
        out.append(r)
        STATS[r[0]] = STATS.get(r[0], 0) + 1
        check_response(*r, complete=abort_after is None, lax=lax, head=head)
    finally:
        s.close()
    return out


def http_raw(method, path, body=b"", headers=None, cl=True, version="HTTP/1.1", keep=False):
    h = "%s %s %s\r\nHost: %s\r\n" % (method, path, version, HOST)
    for k, v in (headers or {}).items():
        h += "%s: %s\r\n" % (k, v)
    if cl and (body or method == "POST"):
        h += "Content-Length: %d\r\n" % len(body)
    h += "\r\n" if keep else "Connection: close\r\n\r\n"
    return h.encode("latin-1") + body


# ---- WebSocket -------------------------------------------------------------------


def ws_frame(opcode, payload, fin=True, mask=True, rsv=0, force_len=None):
    b0 = (0x80 if fin else 0) | (rsv << 4) | (opcode & 0xF)
    n = len(payload) if force_len is None else force_len
    if n < 126:
        hdr = struct.pack("!BB", b0, (0x80 if mask else 0) | n)
    elif n < 65536:
        hdr = struct.pack("!BBH", b0, (0x80 if mask else 0) | 126, n)
    else:
        hdr = struct.pack("!BBQ", b0, (0x80 if mask else 0) | 127, n)
    if mask:
        key = os.urandom(4)
        payload = bytes(c ^ key[i % 4] for i, c in enumerate(payload))
        hdr += key
    return hdr + payload


def ws_open(port, timeout):
    s = connect(port, timeout)
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(("GET /ws HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n" % (HOST, key))
              .encode())
    rd = Reader(s, time.monotonic() + timeout)
    r = read_response(rd, True)
    if r is None or r[0] != 101:
        s.close()
        raise Fail("WebSocket upgrade refused: %r" % (r,))
    return s, rd


def ws_read(rd):
    """One frame: (opcode, payload), or None at the end of the connection."""
    h = rd.exact(2)
    if h is None:
        return None
    op = h[0] & 0xF
    n = h[1] & 0x7F
    if h[1] & 0x80:
        raise Fail("the server sent a masked frame")
    if n == 126:
        n = struct.unpack("!H", rd.exact(2))[0]
    elif n == 127:
        n = struct.unpack("!Q", rd.exact(8))[0]
    d = rd.exact(n)
    if d is None:
        raise Fail("a WebSocket frame cut short")
    return op, d


def ws_check_msg(op, d):
    if op == 1:
        try:
            j = json.loads(d)
        except ValueError:
            raise Fail("a WebSocket text message that is not JSON: %r" % d[:300])
        if not isinstance(j, dict) or not ("op" in j or "type" in j):
            raise Fail("a WebSocket message without op/type: %r" % d[:300])
        if j.get("op") == "error" or j.get("type") == "error":
            if not isinstance(j.get("message"), str) or not j["message"]:
                raise Fail("a WebSocket error without a message: %r" % d[:300])
    elif op not in (8, 9, 10):
        raise Fail("unexpected WebSocket opcode %d from the server" % op)


def ws_session(port, rng, timeout, desc):
    """Opens /ws, sends a handful of mutated or malformed frames, reads what
    comes back for a moment, and ends the session one of several ways."""
    s, rd = ws_open(port, timeout)
    try:
        frames = []
        if rng.random() < 0.15:  # more sessions than a connection may run at once
            for k in range(rng.choice([3, 17, 40])):
                m = {"type": "generate", "messages": MSGS, "max_tokens": rng.choice([1, 8]),
                     "session_id": rng.choice(["s%d" % k, "s0", "x" * 3000, ""])}
                frames.append(ws_frame(1, json.dumps(m).encode()))
            if rng.random() < 0.5:
                frames.append(ws_frame(1, b'{"type":"abort"}'))
        for _ in range(rng.randint(1, 5)):
            base = rng.choice(WS_MSGS)
            r = rng.random()
            if r < 0.2:
                body = json.dumps(mutate_combo(base, rng)).encode()
            elif r < 0.45:
                body = dump(mutate_json(base, rng)).encode("utf-8", "surrogatepass")
            elif r < 0.55:
                body = json.dumps(base).encode()
            elif r < 0.65:
                body = rng.choice([b"", b"null", b"[]", b"1", b"\"x\"", b"{", b"\xff\xfe",
                                   b"{\"op\":1}", b"{\"type\":null}", b"{\"x\":1,\"op\":\"ping\"}",
                                   b"{\"op\":\"infer\"}", b"{\"type\":\"generate\"}",
                                   b"{\"op\":\"nope\"}", b"{\"type\":\"nope\"}"])
            else:
                body = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 64)))
            kind = rng.random()
            if kind < 0.55:
                frames.append(ws_frame(1, body, mask=rng.random() < 0.9))
            elif kind < 0.7:  # fragmented, maybe with a ping between
                cut = rng.randint(0, len(body))
                frames.append(ws_frame(1, body[:cut], fin=False))
                if rng.random() < 0.5:
                    frames.append(ws_frame(9, b"p"))
                frames.append(ws_frame(0, body[cut:], fin=True))
            elif kind < 0.75:
                frames.append(ws_frame(2, body))  # binary
            elif kind < 0.8:
                frames.append(ws_frame(rng.choice([3, 4, 5, 6, 7, 11, 12, 13, 14, 15]), body))
            elif kind < 0.85:
                frames.append(ws_frame(1, body, rsv=rng.randint(1, 7)))
            elif kind < 0.9:  # oversized
                frames.append(ws_frame(1, b"{\"op\":\"ping\",\"x\":\"" + b"a" * rng.choice(
                    [70000, 1100000]) + b"\"}"))
            elif kind < 0.93:  # continuation without a start
                frames.append(ws_frame(0, body))
            elif kind < 0.96:  # a length that promises more than comes
                frames.append(ws_frame(1, body, force_len=len(body) + rng.randint(1, 100)))
            else:
                frames.append(ws_frame(rng.choice([9, 10]), body[:125]))
        desc.append("ws frames: %r" % [f[:120] for f in frames])
        for f in frames:
            try:
                s.sendall(f)
            except (BrokenPipeError, ConnectionResetError):
                return
        end = rng.random()
        t_read = rng.choice([0.0, 0.05, 0.3])
        rd.deadline = time.monotonic() + t_read
        try:
            while True:
                fr = ws_read(rd)
                if fr is None:
                    return
                ws_check_msg(*fr)
                if fr[0] == 8:
                    return
        except Hang:
            pass
        except (ConnectionResetError, BrokenPipeError):
            return
        if end < 0.4:
            try:
                s.sendall(ws_frame(8, struct.pack("!H", 1000)))
            except OSError:
                pass
            rd.deadline = time.monotonic() + timeout
            try:
                while True:
                    fr = ws_read(rd)
                    if fr is None or fr[0] == 8:
                        break
                    ws_check_msg(*fr)
            except (ConnectionResetError, BrokenPipeError):
                pass
            except Hang:
                raise Hang("no close reply within %gs after a close frame" % timeout)
        elif end < 0.5:
            try:
                s.sendall(ws_frame(8, b"\x03"))  # a 1-byte close payload
            except OSError:
                pass
        # else: drop the connection mid-whatever
    finally:
        s.close()


# ---- one request ------------------------------------------------------------------

METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "TRACE", "CONNECT",
           "FOO", "get", "P\x00ST"]
ODD_PATHS = ["/../health", "/%2e%2e/health", "/v1/../v1/models", "/v1/chat/completions/",
             "/v1/chat/completions?x=1&&&=&a", "//v1/models", "/v1/models/" + "a" * 5000,
             "/" + "x" * 9000, "/v1/models/%00", "/v1/models/..%2f..%2fetc", "*",
             "http://h/v1/models", "/v1/responses/" + "%41" * 300, "/api/%2e%2e/tags",
             "/v1/models/\xff\xfe", "/lora-adapters/../health", "/ws?api_key=" + "k" * 600,
             "/v1/models/stories260K?model=" + "m" * 3000, "/props?model=%", "/slots?id=-1",
             "/health#frag", "/%", "/metrics?%zz"]


def burst(port, rng, timeout, desc):
    """Several requests at once (threads), WebSocket sessions among them, so
    that aborts, slot reuse and closes race; each with its own seeded rng."""
    seeds = [rng.getrandbits(32) for _ in range(rng.randint(2, 6))]
    errors, descs = [], [[] for _ in seeds]

    def run(i):
        r = random.Random(seeds[i])
        try:
            one_request(port, r, timeout, descs[i], nested=True)
        except Fail as e:
            errors.append((i, e))
        except (OSError, ValueError):
            pass  # the server closed on us: the health check decides
    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(seeds))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    desc.append("burst of %d: " % len(seeds) + " || ".join(" | ".join(d) for d in descs))
    if errors:
        i, e = errors[0]
        raise type(e)("in a burst, request %d: %s" % (i, e))


def one_request(port, rng, timeout, desc, nested=False):
    r = rng.random()
    post_paths = sorted(BODIES)
    if not nested and r < 0.04:
        burst(port, rng, timeout, desc)
        return
    if r < 0.08:  # WebSocket
        desc.append("ws session")
        ws_session(port, rng, timeout, desc)
        return
    if r < 0.14:  # odd method / path / GET routes
        method = rng.choice(METHODS)
        path = rng.choice(ODD_PATHS + GET_PATHS + post_paths)
        body = b""
        if rng.random() < 0.3:
            body = b'{"prompt":"x"}'
        raw = http_raw(method, path, body).replace(b"\xc3", b"")
        desc.append(repr(raw[:300]))
        # libwebsockets answers what is not HTTP/1.1 as it knows (an HTML 403
        # for an unknown method, a closed connection for headers over its
        # 4 KiB); the server's own routes answer in JSON
        lax = (method not in ("GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD")
               or not path.startswith("/") or len(raw) > 4000
               or re.search("%(?![0-9a-fA-F]{2})", path))
        if method == "CONNECT":  # libwebsockets holds it until its 30 s timeout
            exchange(port, raw, timeout, close_early=True)
            return
        exchange(port, raw, timeout, lax=lax)
        return
    if r < 0.19:  # pipelined on one kept-alive connection: every answer, in order
        reqs = []
        for _ in range(rng.randint(2, 4)):
            path = rng.choice(post_paths + GET_PATHS[:9])
            if path in BODIES:
                b = rng.choice(BODIES[path])
                b = dump(mutate_json(b, rng)) if rng.random() < 0.5 else json.dumps(b)
                b = b.encode("utf-8", "surrogatepass")
                m = rng.choice(["POST"] * 6 + ["GET", "PUT", "DELETE"])
            else:
                b, m = b"", rng.choice(["GET"] * 6 + ["POST", "HEAD"])
            reqs.append(http_raw(m, path, b, {"Content-Type": "application/json"}, keep=True))
        raw = b"".join(reqs) + b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        desc.append("pipelined: " + repr(raw[:1500]))
        s = connect(port, timeout)
        try:
            s.sendall(raw)
            rd = Reader(s, time.monotonic() + timeout)
            got = []
            for q in reqs + [b"GET /health"]:
                r = read_response(rd, q.startswith(b"HEAD "))
                if r is None:
                    break
                got.append(r[0])
                STATS[r[0]] = STATS.get(r[0], 0) + 1
                check_response(*r, head=q.startswith(b"HEAD "))
                if r[1].get("connection", "").lower() == "close":
                    break
            # the server may close early (after a refusal whose body it cannot
            # skip, or behind a POST body: see reg_pipelined_posts), never in
            # the middle of an answer (read_response fails on that)
            if not got:
                raise Fail("pipelined requests: no answer at all")
        finally:
            s.close()
        return
    path = rng.choice(post_paths)
    base = rng.choice(BODIES[path])
    r2 = rng.random()
    headers = {"Content-Type": "application/json"}
    if r2 < 0.6:
        body = dump(mutate_json(base, rng)).encode("utf-8", "surrogatepass")
    elif r2 < 0.65:
        body = json.dumps(base).encode()
    elif r2 < 0.72:  # truncated
        full = dump(mutate_json(base, rng) if rng.random() < 0.5 else base).encode()
        body = full[:rng.randint(0, max(0, len(full) - 1))]
    elif r2 < 0.76:  # random bytes
        body = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 300)))
    elif r2 < 0.8:  # invalid UTF-8 inside strings
        body = json.dumps(base).encode().replace(b"a", rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80",
                                                                  b"\xf4\x90\x80\x80", b"\x00"]), 3)
    elif r2 < 0.84:  # not an object at the top
        body = rng.choice([b"[]", b"null", b"1", b"\"s\"", b"true", b"", b"   ", b"{}",
                           b"[{}]", b"{\"a\":1}{\"b\":2}", b"{} x", b"\xef\xbb\xbf{}"])
    elif r2 < 0.88:  # wrong Content-Length
        body = json.dumps(base).encode()
        delta = rng.choice([-5, -1, 1, 20])
        hdr = headers.copy()
        hdr["Content-Length"] = str(max(0, len(body) + delta))
        raw = http_raw("POST", path, body, hdr, cl=False)
        desc.append(repr(raw[:400]))
        if delta > 0:  # the server waits for the rest: give up and close
            s = connect(port, timeout)
            s.sendall(raw)
            time.sleep(0.02)
            s.close()
            return
        exchange(port, raw, timeout)
        return
    elif r2 < 0.91:  # chunked upload, odd lengths
        body = json.dumps(base).encode()
        hdr = headers.copy()
        hdr["Transfer-Encoding"] = "chunked"
        cl = rng.random() < 0.3
        chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        raw = http_raw("POST", path, chunked, hdr, cl=cl)
        desc.append(repr(raw[:400]))
        exchange(port, raw, timeout, expect_reply=False)
        return
    elif r2 < 0.94:  # odd headers
        body = json.dumps(base).encode()
        hdr = rng.choice([{"Content-Length": "-1"}, {"Content-Length": "abc"},
                          {"Content-Length": "99999999999999999999999"},
                          {"Content-Length": "1e3"}, {"Content-Length": " 5"},
                          {"Authorization": "Bearer " + "k" * 2000},
                          {"Content-Type": "text/plain"}, {"Expect": "100-continue"},
                          {"X-" + "h" * 3000: "v"}, {"Host": "h" * 5000},
                          {"Connection": "Upgrade", "Upgrade": "h2c",
                           "HTTP2-Settings": "AAMAAABkAARAAAAAAAIAAAAA"},
                          {"Connection": "Upgrade", "Upgrade": "websocket"}])
        cl = "Content-Length" not in hdr
        if not cl:
            body = body[:5]
        raw = http_raw("POST", path, body, hdr, cl=cl)
        desc.append(repr(raw[:400]))
        s = connect(port, timeout)
        try:
            s.sendall(raw)
            rd = Reader(s, time.monotonic() + timeout)
            res = read_response(rd)
            if res:
                check_response(*res, lax=len(raw) > 4000)
            elif len(raw) <= 4000:
                raise Fail("the connection closed without a response")
        except Hang:
            if "Content-Length" not in hdr or hdr["Content-Length"] != " 5":
                raise
        finally:
            s.close()
        return
    else:  # aborting mid-stream
        b = json.loads(json.dumps(base))
        if isinstance(b, dict):
            b["stream"] = True
            for k in ("max_tokens", "n_predict", "max_output_tokens"):
                if k in b:
                    b[k] = 200
        body = json.dumps(b).encode()
        raw = http_raw("POST", path, body, headers)
        desc.append("abort mid-stream: " + repr(raw[:400]))
        if rng.random() < 0.3:
            exchange(port, raw, timeout, close_early=True)
        else:
            exchange(port, raw, timeout, abort_after=rng.choice([1, 10, 200]))
        return
    if rng.random() < 0.05:
        path += rng.choice(["?model=x", "?" + "q" * 1000, "?stream=true"])
    raw = http_raw("POST", path, body, headers, version=rng.choice(["HTTP/1.1"] * 9 + ["HTTP/1.0"]))
    desc.append(repr(raw[:600]) + (" (%d bytes)" % len(raw)))
    exchange(port, raw, timeout)


# ---- the server's health ------------------------------------------------------------


def log_tail(path, n=40):
    try:
        with open(path, "rb") as f:
            lines = [ln for ln in f.read().splitlines() if b'"request_end"' not in ln]
            return b"\n".join(lines[-n:]).decode("utf-8", "replace")
    except OSError:
        return "(no log)"


def sanitizer_report(path, pos):
    try:
        with open(path, "rb") as f:
            f.seek(pos)
            t = f.read()
    except OSError:
        return None, pos
    for pat in (b"ERROR: AddressSanitizer", b"ERROR: LeakSanitizer", b"runtime error:",
                b"AddressSanitizer:DEADLYSIGNAL", b"Assertion", b"SUMMARY: "):
        i = t.find(pat)
        if i >= 0:
            return t[max(0, i - 200):i + 3000].decode("utf-8", "replace"), pos + len(t)
    return None, pos + len(t)


def healthy(port, pid, timeout):
    if pid:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            raise Fail("the server process %d is gone" % pid)
        try:  # a zombie counts as gone
            with open("/proc/%d/stat" % pid) as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    raise Fail("the server process %d exited" % pid)
        except OSError:
            pass
    deadline = time.monotonic() + timeout
    while True:
        try:
            s = connect(port, timeout)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            r = read_response(Reader(s, deadline))
            s.close()
            if r and r[0] == 200:
                return
            if r and r[0] == 503 and time.monotonic() < deadline:  # busy or loading
                time.sleep(0.05)
                continue
            raise Fail("GET /health answered %r" % (r[:2] if r else r,))
        except Hang:
            raise Hang("GET /health did not answer within %gs" % timeout)
        except (ConnectionRefusedError, ConnectionResetError) as e:
            raise Fail("GET /health: %s" % e)


# Inputs that once crashed, wedged or confused the server: (why, fn(port, timeout)).


def reg_head_keepalive(port, timeout):
    """HEAD then GET on one kept-alive connection: the HEAD answer once carried
    a body, which the client then read as the GET's response."""
    s = connect(port, timeout)
    try:
        s.sendall(b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n"
                  b"HEAD /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n"
                  b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        rd = Reader(s, time.monotonic() + timeout)
        for want, head in ((200, True), (405, True), (200, False)):
            r = read_response(rd, head)
            if r is None or r[0] != want:
                raise Fail("HEAD, HEAD, GET on one connection: got %r, want status %d" %
                           (r and r[:2], want))
        check_response(*r)
        if not r[2].startswith(b"{"):
            raise Fail("GET /health after HEAD: body %r" % r[2][:100])
    finally:
        s.close()


def reg_connect(port, timeout):
    """CONNECT: libwebsockets made the connection a raw socket that nothing
    closed, outside the connection limit (fds could be pinned at will)."""
    s = connect(port, timeout)
    try:
        s.sendall(b"CONNECT /health HTTP/1.1\r\nHost: x\r\n\r\n")
        rd = Reader(s, time.monotonic() + min(timeout, 10))
        try:
            rd.rest()
        except Hang:
            raise Hang("a CONNECT request's connection stays open with no answer")
    finally:
        s.close()


def reg_pipelined_posts(port, timeout):
    """Two POSTs and a GET in one packet: libwebsockets 4.1 looped without end
    over the buffered requests behind the first body, and the whole server
    hung (it did not even stop on SIGTERM)."""
    b = b'{"content":"Once"}'
    post = b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(b), b)
    s = connect(port, timeout)
    try:
        s.sendall(post + post + b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        rd = Reader(s, time.monotonic() + timeout)
        r = read_response(rd)
        if r is None or r[0] != 200 or b"tokens" not in r[2]:
            raise Fail("pipelined POST /tokenize: first answer %r" % (r and r[:3],))
        while r is not None:  # the rest may be cut by a close, never malformed
            check_response(*r)
            r = read_response(rd)
    finally:
        s.close()


def reg_pipelined_big_body(port, timeout):
    """GET /health, then a POST with a 70 kB body in the same packet:
    libwebsockets 4.1 parsed the POST from its read-ahead buffer and passed
    HTTP_BODY bytes from a buffer it had freed (ASan: heap-use-after-free
    in http_on_body)."""
    b = b'{"content":"' + b"x" * 69990 + b'"}'
    s = connect(port, timeout)
    try:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
                  b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                  b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % (len(b), b))
        rd = Reader(s, time.monotonic() + timeout)
        r = read_response(rd)
        if r is None or r[0] != 200:
            raise Fail("pipelined GET, POST: first answer %r" % (r and r[:3],))
        while r is not None:
            check_response(*r)
            r = read_response(rd)
    except (ConnectionResetError, BrokenPipeError):
        pass  # closing on the pipelined POST is allowed
    finally:
        s.close()


def reg_many_tools_forced(port, timeout):
    """tool_choice "required" over 100 tools: the forced call's schema (an
    enum of their names) was refused by the schema compiler and the request
    answered 503 "out of memory". Now a repeated name counts once, 100
    distinct names are an enum the compiler takes (200), and past its 4096
    values the request is a 400 naming tool_choice."""
    def tool(name):
        t = json.loads(json.dumps(TOOLS[0]))
        t["function"]["name"] = name
        return t
    for tools, want in (([tool("get_weather")] * 100, 200),
                        ([tool("f%d" % i) for i in range(100)], 200),
                        ([tool("f%d" % i) for i in range(4097)], 400)):
        body = json.dumps({"messages": MSGS, "max_tokens": 2, "tools": tools,
                           "tool_choice": "required"}).encode()
        r = exchange(port, http_raw("POST", "/v1/chat/completions", body), timeout)[0]
        if r[0] != want or (want == 400 and b"tool_choice" not in r[2]):
            raise Fail("100 tools, tool_choice required: %d %r, want %d" % (r[0], r[2][:200], want))


REGRESSIONS = [
    ("forced tool call over 100 tools: no 503", reg_many_tools_forced),
    ("pipelined POST with a big body: no use after free", reg_pipelined_big_body),
    ("pipelined POSTs do not hang the server", reg_pipelined_posts),
    ("HEAD answers carry no body", reg_head_keepalive),
    ("CONNECT is closed", reg_connect),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pid", type=int, default=0)
    ap.add_argument("--log", default="")
    ap.add_argument("--seed", type=int, default=20261127)
    ap.add_argument("--count", type=int, default=400)
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--regress", action="store_true")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    pos = 0
    n_sent = 0
    slowest = 0.0
    t0 = time.monotonic()
    statuses = {}
    cases = []
    if a.regress:
        cases += [("regression: " + why, fn) for why, fn in REGRESSIONS]
    cases += [(None, None)] * a.count
    for i, (why, fn) in enumerate(cases):
        desc = [why] if why else []
        try:
            t_req = time.monotonic()
            if fn:
                fn(a.port, a.timeout)
            else:
                one_request(a.port, rng, a.timeout, desc)
            slowest = max(slowest, time.monotonic() - t_req)
            n_sent += 1
            healthy(a.port, a.pid, a.timeout)
            rep, pos = sanitizer_report(a.log, pos) if a.log else (None, pos)
            if rep:
                raise Fail("sanitizer report in the server log:\n" + rep)
        except Fail as e:
            if a.log:
                time.sleep(0.5)
                rep, _ = sanitizer_report(a.log, 0)
            else:
                rep = None
            print("FAIL after %d requests (request #%d): %s" % (n_sent, i, e))
            print("request: " + " | ".join(desc)[:4000])
            if rep:
                print("---- sanitizer ----\n" + rep)
            if a.log:
                print("---- server log (tail) ----\n" + log_tail(a.log))
            return 1
        except (OSError, ValueError) as e:
            # a client-side socket error (the server closed on us) is fine as long
            # as the server stays healthy
            try:
                healthy(a.port, a.pid, a.timeout)
            except Fail as f:
                print("FAIL after %d requests (request #%d): %s (client saw %r)" %
                      (n_sent, i, f, e))
                print("request: " + " | ".join(desc)[:4000])
                if a.log:
                    print("---- server log (tail) ----\n" + log_tail(a.log))
                return 1
            statuses["client:" + type(e).__name__] = statuses.get(
                "client:" + type(e).__name__, 0) + 1
        if not a.quiet and (i + 1) % 100 == 0:
            print("%d requests, %.1fs" % (i + 1, time.monotonic() - t0), flush=True)
    statuses.update({str(k): v for k, v in sorted(STATS.items())})
    print("ok: %d requests in %.1fs (seed %d, slowest %.1fs) %s" % (
        n_sent, time.monotonic() - t0, a.seed, slowest, json.dumps(statuses)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
