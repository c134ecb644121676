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


srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(srv.server_address[1], flush=True)
srv.serve_forever()
