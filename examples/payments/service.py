#!/usr/bin/python3
"""Example payments API protected by the idempotency extension.

POST /v1/charges
    Authorization: Bearer <tenant token>      (the tenant never comes from the body)
    Idempotency-Key: <1-255 printable ASCII>
    {"amount": 12.50, "currency": "EUR", "customer": "cus_123"}

One database transaction per request:

    BEGIN;
    SET LOCAL idempotency.tenant = <tenant from the token>;
    idem_reserve(...)            -> created | replay | in_progress | mismatch | stale
    INSERT INTO payments.charges ...
    outbox_enqueue(...)          -> the capture call, made later by worker.py
    idem_complete(..., 201, body, headers)
    COMMIT;

Answers follow the IETF Idempotency-Key header draft and Stripe's behaviour:
missing key 400, concurrent duplicate 409 with Retry-After, same key with a
different body 422, replays carry Idempotent-Replayed: true, errors are
application/problem+json.  The service fails closed: when the database cannot
be reached it answers 503 and charges nothing.

The service logs in as a role granted idempotency_app (roles.sql), not as a
superuser.  PAYMENTS_DSN may list several hosts with
target_session_attrs=read-write: after a failover the service's next
connection goes to the promoted standby.

Configuration (environment): PAYMENTS_DSN (libpq connection string),
PAYMENTS_PORT (default 8080), PAYMENTS_PROCESSING_DELAY (seconds of simulated
work inside the transaction, default 0), PAYMENTS_POOL_SIZE (database
connections at most, default 10), PAYMENTS_POOL_WAIT (seconds a request
waits for one, default 5), PAYMENTS_PGBOUNCER=1 when PAYMENTS_DSN
goes through PgBouncer in transaction mode (no server-side prepared
statements: PgBouncer before 1.21 cannot carry them from one transaction to
the next).  The tenant is set with SET LOCAL, never SET, which would stay on
the server connection for whichever client PgBouncer hands it to next.
"""

import json
import os
import sys
import threading
import time
from decimal import Decimal, InvalidOperation
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg
from psycopg.types.json import Jsonb

SCOPE = "charges"

# A static token map stands in for real authentication.
TENANT_TOKENS = {
    "tok_acme": "acme",
    "tok_globex": "globex",
}

DSN = os.environ.get("PAYMENTS_DSN", "")
# psycopg prepares a statement on its fifth execution by default
PREPARE_THRESHOLD = None if os.environ.get("PAYMENTS_PGBOUNCER") else 5
PROCESSING_DELAY = float(os.environ.get("PAYMENTS_PROCESSING_DELAY", "0"))


class PoolTimeout(Exception):
    """Every connection of the pool stayed busy for PAYMENTS_POOL_WAIT."""


class ConnectionPool:
    """A minimal bounded pool: at most "size" connections at a time, idle
    ones reused, broken ones dropped.  The bound keeps a crowd of retrying
    clients (after an outage, a failover) from opening a connection each and
    exhausting the database's max_connections: requests over it wait for a
    connection, then fail closed with 503."""

    def __init__(self, dsn, size=10, wait=5.0):
        self.dsn = dsn
        self.wait = wait
        self.slots = threading.BoundedSemaphore(size)
        self.idle = []
        self.lock = threading.Lock()

    def get(self):
        if not self.slots.acquire(timeout=self.wait):
            raise PoolTimeout()
        with self.lock:
            if self.idle:
                return self.idle.pop()
        try:
            return psycopg.connect(self.dsn, connect_timeout=3,
                                   prepare_threshold=PREPARE_THRESHOLD)
        except BaseException:
            self.slots.release()
            raise

    def clear(self):
        with self.lock:
            idle, self.idle = self.idle, []
        for conn in idle:
            conn.close()

    def put(self, conn):
        ok = (not conn.closed
              and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE)
        with self.lock:
            if ok:
                self.idle.append(conn)
                conn = None
        if conn is not None:
            conn.close()
        self.slots.release()


POOL = ConnectionPool(DSN, int(os.environ.get("PAYMENTS_POOL_SIZE", "10")),
                      float(os.environ.get("PAYMENTS_POOL_WAIT", "5")))


class Problem(Exception):
    """An RFC 9457 problem+json answer."""

    def __init__(self, status, title, detail, headers=None):
        super().__init__(detail)
        self.status = status
        self.title = title
        self.detail = detail
        self.headers = headers or {}


def parse_charge(raw):
    """Validate the body; return (text to fingerprint, amount, currency, customer)."""
    try:
        text = raw.decode("utf-8")
        # decimals stay exact: 12.50 is not turned into a binary float
        body = json.loads(text or "null", parse_float=Decimal)
    except ValueError:
        raise Problem(400, "Invalid JSON", "The request body is not valid JSON.")
    if not isinstance(body, dict):
        raise Problem(400, "Invalid request", "The request body must be a JSON object.")
    amount = body.get("amount")
    if isinstance(amount, bool) or not isinstance(amount, (int, Decimal)):
        raise Problem(422, "Invalid amount", "amount must be a JSON number.")
    amount = Decimal(amount)
    if not amount.is_finite() or amount <= 0 or amount != round(amount, 2):
        raise Problem(422, "Invalid amount", "amount must be positive, with at most 2 decimals.")
    currency = body.get("currency")
    customer = body.get("customer")
    if not isinstance(currency, str) or len(currency) != 3:
        raise Problem(422, "Invalid currency", "currency must be a 3-letter code.")
    if not isinstance(customer, str) or not customer:
        raise Problem(422, "Invalid customer", "customer is required.")
    # The request is fingerprinted as the client sent it (the extension
    # canonicalises it: key order, whitespace and 12.5 / 12.50 do not matter).
    return text, amount, currency, customer


def create_charge(tenant, key, request_text, amount, currency, customer):
    """Run the one-transaction flow; return (status, body, headers, replayed).

    Safe to run again after any failure, even one during COMMIT whose
    outcome is unknown: the idempotency key makes the second run a replay.
    """
    try:
        return charge_transaction(tenant, key, request_text, amount, currency, customer)
    except psycopg.OperationalError:
        # most often a pooled connection the database restart broke: one
        # more go with a fresh connection (and the same key)
        POOL.clear()
        return charge_transaction(tenant, key, request_text, amount, currency, customer)


def charge_transaction(tenant, key, request_text, amount, currency, customer):
    conn = POOL.get()
    try:
        with conn.transaction():
            cur = conn.cursor()
            cur.execute("SELECT set_config('idempotency.tenant', %s, true)", (tenant,))
            cur.execute(
                "SELECT outcome::text, http_status, response_code, response_body,"
                "       response_headers, retry_after"
                "  FROM idem_reserve(%s, %s, %s, %s::jsonb)",
                (tenant, SCOPE, key, request_text))
            outcome, http_status, code, rbody, rheaders, retry_after = cur.fetchone()
            if outcome == "replay":
                return code, rbody, rheaders or {}, True
            if outcome == "in_progress":
                raise Problem(409, "Request in progress",
                              "A request with this Idempotency-Key is being processed.",
                              {"Retry-After": str(retry_after or 1)})
            if outcome == "mismatch":
                raise Problem(422, "Idempotency-Key reused",
                              "This Idempotency-Key was used with a different request body.")
            if outcome == "stale":
                raise Problem(409, "Outcome unknown",
                              "An earlier attempt with this Idempotency-Key did not finish; "
                              "it is being reconciled.",
                              {"Retry-After": str(retry_after or 60)})
            assert outcome == "created", outcome

            if PROCESSING_DELAY > 0:
                time.sleep(PROCESSING_DELAY)
            cur.execute(
                "INSERT INTO payments.charges (tenant_id, idem_key, amount, currency, customer)"
                " VALUES (%s, %s, %s, %s, %s) RETURNING id, created_at",
                (tenant, key, amount, currency, customer))
            charge_id, created_at = cur.fetchone()
            charge = {
                "id": "ch_%d" % charge_id,
                "object": "charge",
                "amount": str(amount),
                "currency": currency,
                "customer": customer,
                "status": "pending",
                "created": created_at.isoformat(),
            }
            cur.execute(
                "SELECT outbox_enqueue(%s, 'charge.capture', %s::jsonb, %s, %s)",
                (tenant, Jsonb({"charge_id": charge_id, "amount": str(amount),
                                "currency": currency, "customer": customer}),
                 key, SCOPE))
            headers = {"Location": "/v1/charges/ch_%d" % charge_id}
            cur.execute(
                "SELECT idem_complete(%s, %s, %s, 201, %s::jsonb, %s::jsonb)",
                (tenant, SCOPE, key, Jsonb(charge), Jsonb(headers)))
        return 201, charge, headers, False
    finally:
        POOL.put(conn)


def problem_from_database(e):
    """Map an error the extension raised to the HTTP answer (see README)."""
    state = e.sqlstate or ""
    message = e.diag.message_primary or str(e)
    if state.startswith("22"):
        # key empty, too long or not printable ASCII, ...
        return Problem(400, "Invalid request", message)
    if state == "54000":
        return Problem(413, "Request too large", message)
    if state == "40001":
        return Problem(409, "Conflict", "Retry the request.", {"Retry-After": "1"})
    sys.stderr.write("payments: database error %s: %s\n" % (state, e))
    return Problem(503, "Service unavailable",
                   "The request could not be completed; retry with the same "
                   "Idempotency-Key.", {"Retry-After": "1"})


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "payments-example/1.0"

    def log_message(self, fmt, *args):
        if os.environ.get("PAYMENTS_ACCESS_LOG"):
            super().log_message(fmt, *args)

    def send_json(self, status, body, headers=None, content_type="application/json"):
        data = json.dumps(body, sort_keys=True).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def send_problem(self, p):
        self.send_json(p.status,
                       {"type": "about:blank", "title": p.title,
                        "status": p.status, "detail": p.detail},
                       p.headers, "application/problem+json")

    def do_GET(self):
        if self.path == "/healthz":
            self.send_json(200, {"ok": True})
        else:
            self.send_problem(Problem(404, "Not found", "No such resource."))

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            if self.path != "/v1/charges":
                raise Problem(404, "Not found", "No such resource.")
            auth = self.headers.get("Authorization", "")
            tenant = TENANT_TOKENS.get(auth[7:]) if auth.startswith("Bearer ") else None
            if tenant is None:
                raise Problem(401, "Unauthorized", "A valid Bearer token is required.",
                              {"WWW-Authenticate": "Bearer"})
            key = self.headers.get("Idempotency-Key")
            if not key:
                raise Problem(400, "Idempotency-Key missing",
                              "POST /v1/charges requires an Idempotency-Key header.")
            body, amount, currency, customer = parse_charge(raw)
            try:
                status, rbody, rheaders, replayed = create_charge(
                    tenant, key, body, amount, currency, customer)
            except (psycopg.OperationalError, PoolTimeout):
                # the database is unreachable (or every connection is busy):
                # fail closed, charge nothing
                raise Problem(503, "Service unavailable",
                              "The payments database is unreachable; retry with the same "
                              "Idempotency-Key.", {"Retry-After": "1"})
            except psycopg.Error as e:
                raise problem_from_database(e)
            headers = dict(rheaders)
            if replayed:
                headers["Idempotent-Replayed"] = "true"
            self.send_json(status, rbody, headers)
        except Problem as p:
            self.send_problem(p)


def report_role(program, extension_role):
    """Say which database role the program runs as; warn if it is a superuser.

    The program should log in as a role of its own granted the extension's
    role (see roles.sql), never as a superuser.
    """
    try:
        with psycopg.connect(DSN, connect_timeout=3) as conn:
            user, superuser = conn.execute(
                "SELECT current_user::text, rolsuper FROM pg_roles"
                " WHERE rolname = current_user").fetchone()
    except psycopg.Error as e:
        sys.stderr.write("%s: database not reachable yet (%s)\n" % (program, e))
        return
    sys.stderr.write("%s: database role %s\n" % (program, user))
    if superuser:
        sys.stderr.write("%s: WARNING: %s is a superuser; log in as a role granted %s"
                         " instead (examples/payments/roles.sql)\n"
                         % (program, user, extension_role))


def main():
    port = int(os.environ.get("PAYMENTS_PORT", "8080"))
    report_role("payments", "idempotency_app")
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    sys.stderr.write("payments: listening on 127.0.0.1:%d\n" % port)
    server.serve_forever()


if __name__ == "__main__":
    main()
