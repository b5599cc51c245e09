"""A fake downstream provider for the outbox worker test.

An HTTP server on 127.0.0.1 that deduplicates by the Idempotency-Key
header, as a payment provider does: the first successful call with a key
performs the effect and answers a reference; later calls with the same key
replay that answer without a second effect.  GET /stats returns, per key,
how many calls arrived and how many effects were performed.

Usage: provider.py PORT_FILE [FAIL_EVERY]
  The chosen port is written to PORT_FILE once the server listens.
  With FAIL_EVERY = n > 0, the first call for every n-th key answers 503
  without an effect, so workers exercise outbox_nack.
"""
import json
import os
import sys
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

lock = threading.Lock()
calls = {}
effects = {}
refs = {}
failed_once = set()
fail_every = int(sys.argv[2]) if len(sys.argv) > 2 else 0


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        with lock:
            self.reply(200, {"calls": calls, "effects": effects, "refs": refs})

    def do_POST(self):
        key = self.headers.get("Idempotency-Key")
        length = int(self.headers.get("Content-Length", 0))
        self.rfile.read(length)
        if not key:
            self.reply(400, {"error": "Idempotency-Key header required"})
            return
        with lock:
            calls[key] = calls.get(key, 0) + 1
            if key in refs:
                self.reply(200, {"id": refs[key], "replayed": True})
                return
            if (fail_every and zlib.crc32(key.encode()) % fail_every == 0
                    and key not in failed_once):
                failed_once.add(key)
                self.reply(503, {"error": "try again"})
                return
            effects[key] = effects.get(key, 0) + 1
            refs[key] = "ref-%d" % len(refs)
            self.reply(201, {"id": refs[key], "replayed": False})


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
server.serve_forever()
