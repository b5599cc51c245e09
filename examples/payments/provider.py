#!/usr/bin/python3
"""A fake payment provider on loopback, standing in for the outside world.

Like a real provider, it performs each effect once per Idempotency-Key: a
repeated key gets the first answer back (Idempotent-Replayed: true) without
a second effect, and the same key with a different request is refused (422).

POST /v1/authorizations   authorizes a charge (service.py calls it while it
                          handles the request).  As with a provider's test
                          cards, some customers behave on purpose:
    cus_declined   402 card_declined, a permanent failure (replayed as such)
    cus_flaky      the first call for a key answers 503 and does nothing;
                   later calls authorize
    cus_slow       the first call for a key authorizes, but answers only
                   after PROVIDER_SLOW seconds (the caller has timed out);
                   later calls replay the authorization at once
POST /v1/captures         captures a charge (worker.py calls it from the
                          outbox)
GET /_ledger              what it saw: calls per key and the effects made
                          ({"calls", "captures"} for captures,
                          {"authorization_calls", "authorizations"} for
                          authorizations)

Configuration (environment): PROVIDER_PORT (default 8090), PROVIDER_SLOW
(seconds, default 3), PROVIDER_FAIL_EVERY=N (the first capture call of
every N-th key answers 503 without an effect, so that workers exercise
outbox_nack; default 0, never).
"""

import json
import os
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
SLOW = float(os.environ.get("PROVIDER_SLOW", "3"))
FAIL_EVERY = int(os.environ.get("PROVIDER_FAIL_EVERY", "0"))

# per operation: key -> calls seen, key -> the effect made (once), and the
# keys whose first call has already failed on purpose
LEDGER = {
    "captures": ({}, {}, set()),
    "authorizations": ({}, {}, set()),
}


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
                cap_calls, captures, _ = LEDGER["captures"]
                auth_calls, auths, _ = LEDGER["authorizations"]
                self.reply(200, {"calls": dict(cap_calls), "captures": dict(captures),
                                 "authorization_calls": dict(auth_calls),
                                 "authorizations": dict(auths)})
        else:
            self.reply(404, {"error": "not found"})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        operation = {"/v1/captures": "captures",
                     "/v1/authorizations": "authorizations"}.get(self.path)
        if operation is None:
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
        customer = request.get("customer") if isinstance(request, dict) else None
        calls, effects, failed_once = LEDGER[operation]
        slow = False
        with LOCK:
            calls[key] = calls.get(key, 0) + 1
            first = effects.get(key)
            replayed = first is not None
            if first is None:
                transient = key not in failed_once and (
                    (operation == "authorizations" and customer == "cus_flaky")
                    or (operation == "captures" and FAIL_EVERY
                        and zlib.crc32(key.encode()) % FAIL_EVERY == 0))
                if transient:
                    failed_once.add(key)
                    self.reply(503, {"error": "temporarily unavailable, try again"})
                    return
                slow = (operation == "authorizations" and customer == "cus_slow")
                if operation == "captures":
                    first = {"id": "cap_%d" % (len(effects) + 1), "status": "captured"}
                elif customer == "cus_declined":
                    first = {"id": "auth_%d" % (len(effects) + 1), "status": "declined",
                             "decline_code": "card_declined"}
                else:
                    first = {"id": "auth_%d" % (len(effects) + 1), "status": "authorized"}
                first["request"] = request
                effects[key] = first
        if first["request"] != request:
            self.reply(422, {"error": "Idempotency-Key reused with a different request"})
            return
        if slow:
            # the effect is made; the answer is lost to a caller that gave up
            time.sleep(SLOW)
        answer = {k: v for k, v in first.items() if k != "request"}
        self.reply(402 if first["status"] == "declined" else 200, answer,
                   {"Idempotent-Replayed": "true"} if replayed else None)


def main():
    port = int(os.environ.get("PROVIDER_PORT", "8090"))
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    sys.stderr.write("provider: listening on 127.0.0.1:%d\n" % port)
    server.serve_forever()


if __name__ == "__main__":
    main()
