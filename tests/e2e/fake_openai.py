#!/usr/bin/env python3
"""fake_openai.py - an OpenAI-compatible upstream that misbehaves on
purpose, for tests/e2e/test_remote.sh. Prints its port, then serves
POST /v1/chat/completions by the request's "model":

  json      one application/json answer although "stream" was asked
  slow      waits 5 s before answering (the expert's timeout_s is shorter)
  midfail   one streamed piece, then an error event in the stream
  garbage   a streamed event that is not JSON
  echokey   401 with the Authorization header quoted in the message
  thinker   streamed thoughts (delta.reasoning_content), then the content
  thinkjson one JSON answer whose message has reasoning_content and content
  tooler    with tools: a streamed reply of some text and two function calls
            in fragments (their pieces interleaved by index); once the last
            message is a tool result: the text "tool said: " and the results
  tooljson  the same calls in one JSON answer (message.tool_calls)
            (both without the text when the last message says "just call")
  badargs   some text, then a streamed call whose arguments never make a
            JSON object
  noname    a streamed call whose pieces never name the function
  junkcall  streamed tool_calls that are garbage, by the last message:
            "number name" (a name that is no string), "index 99" (past
            the calls taken), "huge" (arguments over 1 MiB in two pieces
            under 1 MiB each), else "fine" with tool_calls that are no
            array and entries that are no object (to be ignored)

GET /last gives the last request as it came: its body and Authorization.
"""
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LAST = {}


class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send(self, code, ctype, body):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.send(200, "application/json", json.dumps(LAST).encode())

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(n) or b"{}")
        LAST.clear()
        LAST.update(body=body, auth=self.headers.get("Authorization"), path=self.path)
        model = body.get("model")
        if model == "json":
            ans = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "whole answer"},
                                "finish_reason": "length"}],
                   "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}}
            self.send(200, "application/json", json.dumps(ans).encode())
            return
        if model == "thinkjson":
            msg = {"role": "assistant", "reasoning_content": "Mull it over", "content": "Done"}
            ans = {"choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
                   "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}}
            self.send(200, "application/json", json.dumps(ans).encode())
            return
        if model == "echokey":
            err = {"error": {"message": "refused %s" % self.headers.get("Authorization")}}
            self.send(401, "application/json", json.dumps(err).encode())
            return
        if model in ("tooler", "tooljson", "badargs", "noname", "junkcall"):
            self.tools(model, body)
            return
        if model == "slow":
            time.sleep(5)
        chunks = [{"choices": [{"index": 0, "delta": {"content": "piece"}, "finish_reason": None}]}]
        if model == "thinker":
            chunks = [{"choices": [{"index": 0, "delta": {"reasoning_content": t}, "finish_reason": None}]}
                      for t in ("Let me", " think")]
            chunks += [{"choices": [{"index": 0, "delta": {"content": t}, "finish_reason": None}]}
                       for t in ("The ", "answer")]
        if model == "midfail":
            chunks.append({"error": {"message": "boom in the middle"}})
        out = "".join("data: %s\n\n" % json.dumps(c) for c in chunks)
        if model == "garbage":
            out += "data: {not json\n\n"
        out += "data: [DONE]\n\n"
        try:
            self.send(200, "text/event-stream", out.encode())
        except (BrokenPipeError, ConnectionResetError):
            pass


    def tools(self, model, body):
        msgs = body.get("messages", [])
        if msgs and msgs[-1].get("role") == "tool":
            said = " | ".join(m["content"] for m in msgs if m.get("role") == "tool")
            chunks = [{"content": "tool said: "}, {"content": said}]
            finish = "stop"
        elif not body.get("tools"):
            chunks, finish = [{"content": "no tools"}], "stop"
        elif model == "badargs":
            chunks = [{"content": "Checking."},
                      {"tool_calls": [{"index": 0, "id": "c0", "type": "function",
                                       "function": {"name": "get_weather", "arguments": ""}}]},
                      {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Par'}}]}]
            finish = "tool_calls"
        elif model == "noname":
            chunks = [{"tool_calls": [{"index": 0, "id": "c0", "type": "function",
                                       "function": {"arguments": '{"city": "Paris"}'}}]}]
            finish = "tool_calls"
        elif model == "junkcall":
            chunks, finish = self.junk(msgs[-1].get("content") if msgs else None), "tool_calls"
        else:
            chunks = [{"role": "assistant", "content": "Let me check."},
                      {"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                       "function": {"name": "get_weather", "arguments": ""}}]},
                      {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Par'}}]},
                      {"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                                       "function": {"name": "get_time", "arguments": '{"tz":'}}]},
                      {"tool_calls": [{"index": 0, "function": {"arguments": 'is", "unit": "C"}'}}]},
                      {"tool_calls": [{"index": 1, "function": {"arguments": ' "CET"}'}}]}]
            if msgs and msgs[-1].get("content") == "just call":
                chunks = chunks[1:]
            finish = "tool_calls"
        usage = {"prompt_tokens": 11, "completion_tokens": 6, "total_tokens": 17}
        if model == "tooljson":
            msg = {"role": "assistant", "content": None, "tool_calls": []}
            for c in chunks:
                msg["content"] = (msg["content"] or "") + c.get("content", "")
                for tc in c.get("tool_calls", []):
                    calls = msg["tool_calls"]
                    if tc["index"] == len(calls):
                        calls.append({"id": tc["id"], "type": "function",
                                      "function": {"name": tc["function"]["name"], "arguments": ""}})
                    calls[tc["index"]]["function"]["arguments"] += tc["function"]["arguments"]
            ans = {"choices": [{"index": 0, "message": msg, "finish_reason": finish}], "usage": usage}
            self.send(200, "application/json", json.dumps(ans).encode())
            return
        out = "".join("data: %s\n\n" % json.dumps({"choices": [{"index": 0, "delta": d,
                                                                 "finish_reason": None}]})
                      for d in chunks)
        out += "data: %s\n\n" % json.dumps({"choices": [{"index": 0, "delta": {},
                                                          "finish_reason": finish}]})
        out += "data: %s\n\ndata: [DONE]\n\n" % json.dumps({"choices": [], "usage": usage})
        self.send(200, "text/event-stream", out.encode())

    @staticmethod
    def junk(what):
        if what == "number name":
            return [{"tool_calls": [{"index": 0, "function": {"name": 5, "arguments": "{}"}}]}]
        if what == "index 99":
            return [{"tool_calls": [{"index": 99, "function": {"name": "f", "arguments": "{}"}}]}]
        if what == "huge":
            half = "x" * 600000
            return [{"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": '{"a": "' + half}}]},
                    {"tool_calls": [{"index": 0, "function": {"arguments": half + '"}'}}]}]
        return [{"content": "fine"}, {"tool_calls": "oops"}, {"tool_calls": [5, None, "x"]}]


srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(srv.server_address[1], flush=True)
srv.serve_forever()
