#!/usr/bin/python3
"""A fake payment provider on loopback, standing in for the outside world.

POST /v1/captures with an Idempotency-Key header captures a charge.  Like a
real provider, it performs the effect once per key: a repeated key gets the
first answer back (Idempotent-Replayed: true) without a second capture.
GET /_ledger returns what it saw: calls per key and the captures it made.

Configuration (environment): PROVIDER_PORT (default 8090).
"""

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
CALLS = {}      # idempotency key -> number of calls seen
CAPTURES = {}   # idempotency key -> the capture made (once)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def reply(self, status, body, headers=None):
        data = json.dumps(body, sort_keys=True).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/_ledger":
            with LOCK:
                self.reply(200, {"calls": dict(CALLS), "captures": dict(CAPTURES)})
        else:
            self.reply(404, {"error": "not found"})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if self.path != "/v1/captures":
            self.reply(404, {"error": "not found"})
            return
        key = self.headers.get("Idempotency-Key")
        if not key:
            self.reply(400, {"error": "Idempotency-Key required"})
            return
        try:
            request = json.loads(raw)
        except ValueError:
            self.reply(400, {"error": "invalid JSON"})
            return
        with LOCK:
            CALLS[key] = CALLS.get(key, 0) + 1
            first = CAPTURES.get(key)
            if first is None:
                first = {"id": "cap_%d" % (len(CAPTURES) + 1), "request": request}
                CAPTURES[key] = first
                replayed = False
            else:
                replayed = True
        if first["request"] != request:
            self.reply(422, {"error": "Idempotency-Key reused with a different request"})
            return
        self.reply(200, {"id": first["id"], "status": "captured"},
                   {"Idempotent-Replayed": "true"} if replayed else None)


def main():
    port = int(os.environ.get("PROVIDER_PORT", "8090"))
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    sys.stderr.write("provider: listening on 127.0.0.1:%d\n" % port)
    server.serve_forever()


if __name__ == "__main__":
    main()
