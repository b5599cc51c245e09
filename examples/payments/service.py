#!/usr/bin/python3
"""Example payments API protected by the idempotency extension.

A FastAPI application served by uvicorn, with its database connections from
psycopg_pool (Debian: python3-fastapi, python3-uvicorn, python3-psycopg-pool).

POST /v1/charges
    Authorization: Bearer <tenant token>      (the tenant never comes from the body)
    Idempotency-Key: <1-255 printable ASCII>
    {"amount": 12.50, "currency": "EUR", "customer": "cus_123"}

One database transaction per request, in two round trips to the database
(psycopg's pipeline mode sends a group of statements without waiting for
each answer):

    round trip 1   BEGIN;
                   SET LOCAL idempotency.tenant = <tenant from the token>;
                   idem_reserve(...)       -> created | replay | in_progress
                                              | mismatch | stale | rate_limited
                   (with created: the charge's id, from its sequence)
    (no database)  the provider authorizes the charge, under the request's
                   idempotency key
    round trip 2   INSERT INTO payments.charges ...;
                   outbox_enqueue(...)     -> the capture, made later by worker.py
                   idem_complete(..., 201, body, headers);
                   COMMIT;

A declined card is a permanent failure: the 402 is stored with
idem_complete, and every retry of the key replays it.  A transient one (the
provider timed out or answered 5xx) is completed with retryable => true: the
key is released when the transaction commits, the client is answered 503,
and its retry with the same key runs afresh (and the provider, seeing the
same key again, does not authorize twice).  Either way the completion goes
out in the second round trip, like a success.  When the provider answers
422 (it holds the key for another body: an earlier attempt with that body
reached it, and its answer was lost), the client gets 422 and the key is
released, so a retry with the first body gets the provider's answer to
that one.  A key whose stored answer has expired (its ttl) already made a
charge: payments.charges keeps one per key and the retry is answered 409.

Answers follow the IETF Idempotency-Key header draft and Stripe's behaviour:
missing key 400, concurrent duplicate 409 with Retry-After, same key with a
different body 422, replays carry Idempotent-Replayed: true, errors are
application/problem+json.  The service fails closed: when the database cannot
be reached it answers 503 and charges nothing.

The service logs in as a role granted idempotency_app (roles.sql), not as a
superuser.  PAYMENTS_DSN may list several hosts with
target_session_attrs=read-write: after a failover the pool's next
connection goes to the promoted standby.

Configuration (environment): PAYMENTS_DSN (libpq connection string),
PAYMENTS_PORT (default 8080), PROVIDER_URL (default http://127.0.0.1:8090),
PAYMENTS_PROVIDER_TIMEOUT (seconds, default 2), PAYMENTS_PROCESSING_DELAY
(seconds of simulated work inside the transaction, default 0),
PAYMENTS_POOL_SIZE (database connections, default 10), PAYMENTS_POOL_WAIT
(seconds a request waits for one, default 5), PAYMENTS_PIPELINE=0 to send
every statement in a round trip of its own (for comparison: 7 round trips
per new charge instead of 2), PAYMENTS_PGBOUNCER=1 when PAYMENTS_DSN goes
through PgBouncer in transaction mode (no server-side prepared statements:
PgBouncer before 1.21 cannot carry them from one transaction to the next).
The tenant is set with SET LOCAL, never SET, which would stay on the server
connection for whichever client PgBouncer hands it to next.
"""

import contextlib
import json
import os
import sys
import time
import urllib.error
import urllib.request
from decimal import Decimal
from typing import Optional

import psycopg
import uvicorn
from fastapi import Depends, FastAPI, Header, Request
from fastapi.responses import JSONResponse
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool, PoolTimeout
from starlette.exceptions import HTTPException

SCOPE = "charges"

# A static token map stands in for real authentication.
TENANT_TOKENS = {
    "tok_acme": "acme",
    "tok_globex": "globex",
}

DSN = os.environ.get("PAYMENTS_DSN", "")
PROVIDER_URL = os.environ.get("PROVIDER_URL", "http://127.0.0.1:8090")
PROVIDER_TIMEOUT = float(os.environ.get("PAYMENTS_PROVIDER_TIMEOUT", "2"))
PROCESSING_DELAY = float(os.environ.get("PAYMENTS_PROCESSING_DELAY", "0"))
PIPELINE = os.environ.get("PAYMENTS_PIPELINE", "1") != "0"

# At most PAYMENTS_POOL_SIZE connections: a crowd of retrying clients (after
# an outage, a failover) waits for one instead of exhausting the database's
# max_connections, and fails closed with 503 after PAYMENTS_POOL_WAIT.
# Autocommit, because the transaction is spelt out (BEGIN ... COMMIT) inside
# the pipeline: psycopg's transaction() block would add a round trip of its
# own at BEGIN and at COMMIT.  psycopg prepares a statement on its fifth
# execution, except behind PgBouncer.
POOL = ConnectionPool(
    DSN,
    open=False,
    min_size=int(os.environ.get("PAYMENTS_POOL_SIZE", "10")),
    timeout=float(os.environ.get("PAYMENTS_POOL_WAIT", "5")),
    kwargs={
        "autocommit": True,
        "connect_timeout": 3,
        "prepare_threshold": None if os.environ.get("PAYMENTS_PGBOUNCER") else 5,
    })

RESERVE = """
SELECT r.outcome::text, r.http_status, r.response_code, r.response_body,
       r.response_headers, r.retry_after,
       -- a new charge's id is taken now, so that the second round trip
       -- needs nothing back from the first of its statements
       CASE WHEN r.outcome = 'created'
            THEN pg_catalog.nextval('payments.charges_id_seq') END,
       pg_catalog.now()
  FROM idem_reserve(%s, %s, %s, %s::jsonb) r"""

INSERT_CHARGE = """
INSERT INTO payments.charges (id, tenant_id, idem_key, amount, currency, customer, created_at)
VALUES (%s, %s, %s, %s, %s, %s, %s)"""

ENQUEUE_CAPTURE = "SELECT outbox_enqueue(%s, 'charge.capture', %s::jsonb, %s, %s)"

COMPLETE = ("SELECT idem_complete(%s, %s, %s, %s, %s::jsonb, %s::jsonb,"
            " retryable => %s)")

PROBLEM = {"Content-Type": "application/problem+json"}


class Problem(Exception):
    """An RFC 9457 problem+json answer."""

    def __init__(self, status, title, detail, headers=None):
        super().__init__(detail)
        self.status = status
        self.title = title
        self.detail = detail
        self.headers = headers or {}

    def body(self):
        return {"type": "about:blank", "title": self.title,
                "status": self.status, "detail": self.detail}


class Answer:
    """What the client is told: status, body, headers, and whether it is a
    stored answer replayed."""

    def __init__(self, status, body, headers=None, replayed=False):
        self.status = status
        self.body = body
        self.headers = headers or {}
        self.replayed = replayed

    @classmethod
    def of(cls, problem):
        return cls(problem.status, problem.body(), dict(PROBLEM, **problem.headers))


class ProviderUnavailable(Exception):
    """The provider did not answer in time, or answered 5xx: try again."""


# the largest amount payments.charges.amount (numeric(12, 2)) holds, plus a cent
MAX_AMOUNT = Decimal("10000000000")


def parse_charge(raw):
    """Validate the body; return (text to fingerprint, amount, currency, customer)."""
    try:
        text = raw.decode("utf-8")
        # decimals stay exact: 12.50 is not turned into a binary float
        body = json.loads(text or "null", parse_float=Decimal)
    except (ValueError, RecursionError):
        # RecursionError: nested deeper than the parser goes
        raise Problem(400, "Invalid JSON", "The request body is not valid JSON.")
    if not isinstance(body, dict):
        raise Problem(400, "Invalid request", "The request body must be a JSON object.")
    amount = body.get("amount")
    if isinstance(amount, bool) or not isinstance(amount, (int, Decimal)):
        raise Problem(422, "Invalid amount", "amount must be a JSON number.")
    amount = Decimal(amount)
    # below MAX_AMOUNT (the charges column's numeric(12, 2)) before rounding:
    # round() of a number with more digits than the decimal context holds
    # (1e26, 1e400) raises instead of answering
    if (not amount.is_finite() or amount <= 0 or amount >= MAX_AMOUNT
            or amount != round(amount, 2)):
        raise Problem(422, "Invalid amount",
                      "amount must be positive, below 10000000000, with at most 2 decimals.")
    currency = body.get("currency")
    customer = body.get("customer")
    if not isinstance(currency, str) or len(currency) != 3:
        raise Problem(422, "Invalid currency", "currency must be a 3-letter code.")
    if not isinstance(customer, str) or not customer:
        raise Problem(422, "Invalid customer", "customer is required.")
    # The request is fingerprinted as the client sent it (the extension
    # canonicalises it: key order, whitespace and 12.5 / 12.50 do not matter);
    # the amount goes on as 12.50 however it was spelt.
    return text, amount.quantize(Decimal("0.01")), currency, customer


def authorize(tenant, key, amount, currency, customer):
    """Ask the provider to authorize the charge, under the request's own
    idempotency key; return its answer (status "authorized" or "declined").
    Raise ProviderUnavailable on a timeout or any other error."""
    req = urllib.request.Request(
        PROVIDER_URL + "/v1/authorizations",
        data=json.dumps({"amount": str(amount), "currency": currency,
                         "customer": customer}, sort_keys=True).encode(),
        headers={"Content-Type": "application/json",
                 "Idempotency-Key": "%s:%s:%s" % (tenant, SCOPE, key)},
        method="POST")
    try:
        with urllib.request.urlopen(req, timeout=PROVIDER_TIMEOUT) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as e:
        if e.code == 402:
            return json.loads(e.read())
        if e.code == 422:
            # the provider holds this key for another request: an earlier
            # attempt with another body reached it, and its answer was lost
            return {"status": "key_reused"}
        # a 5xx; or a 4xx, which no retry of the request would change, but
        # nothing was authorized either: the key is released all the same
        raise ProviderUnavailable("HTTP %d" % e.code)
    except (urllib.error.URLError, OSError) as e:
        # a timeout, a refused or reset connection
        raise ProviderUnavailable(str(e))


def answer_reservation(outcome, code, body, headers, retry_after):
    """The answer to every outcome of idem_reserve but created."""
    if outcome == "replay":
        return Answer(code, body, headers, replayed=True)
    if outcome == "in_progress":
        return Answer.of(Problem(409, "Request in progress",
                                 "A request with this Idempotency-Key is being processed.",
                                 {"Retry-After": str(retry_after or 1)}))
    if outcome == "mismatch":
        return Answer.of(Problem(422, "Idempotency-Key reused",
                                 "This Idempotency-Key was used with a different request body."))
    if outcome == "stale":
        return Answer.of(Problem(409, "Outcome unknown",
                                 "An earlier attempt with this Idempotency-Key did not finish; "
                                 "it is being reconciled.",
                                 {"Retry-After": str(retry_after or 60)}))
    if outcome == "rate_limited":
        return Answer.of(Problem(429, "Too many new requests",
                                 "Too many new Idempotency-Keys; slow down.",
                                 {"Retry-After": str(retry_after or 1)}))
    raise AssertionError("unexpected outcome %r" % outcome)


def create_charge(tenant, key, request_text, amount, currency, customer):
    """Run the one-transaction flow; return an Answer.

    Safe to run again after any failure, even one during COMMIT whose
    outcome is unknown: the idempotency key makes the second run a replay.
    """
    try:
        return charge_transaction(tenant, key, request_text, amount, currency, customer)
    except psycopg.OperationalError as e:
        if not connection_lost(e):
            raise
        # most often a pooled connection a database restart broke: drop
        # the broken ones, then one more go (with the same key)
        POOL.check()
        return charge_transaction(tenant, key, request_text, amount, currency, customer)


def connection_lost(e):
    """Whether a database error means the connection, not the request,
    failed.  psycopg files some errors of the request under
    OperationalError too (54000 request too large, 40001 serialization
    failure): those are answered, not retried."""
    if isinstance(e, PoolTimeout):
        # no connection within PAYMENTS_POOL_WAIT: the pool is busy, not
        # broken; waiting again would double the wait before the 503
        return False
    state = e.sqlstate
    return state is None or state.startswith("08") or state in ("57P01", "57P02", "57P03")


def charge_transaction(tenant, key, request_text, amount, currency, customer):
    # Leaving the pool's block rolls back whatever an error left open; a
    # failed statement inside the pipeline is raised at the latest when the
    # pipeline block ends.
    with POOL.connection() as conn, (conn.pipeline() if PIPELINE else contextlib.nullcontext()):
        # ---- round trip 1
        conn.execute("BEGIN")
        conn.execute("SELECT pg_catalog.set_config('idempotency.tenant', %s, true)", (tenant,))
        cur = conn.execute(RESERVE, (tenant, SCOPE, key, request_text))
        outcome, _, code, rbody, rheaders, retry_after, charge_id, now = cur.fetchone()
        if outcome != "created":
            # committed, not rolled back: idem_reserve may have flagged a
            # stale key for reconciliation
            conn.execute("COMMIT")
            return answer_reservation(outcome, code, rbody, rheaders or {}, retry_after)

        if PROCESSING_DELAY > 0:
            time.sleep(PROCESSING_DELAY)
        try:
            auth = authorize(tenant, key, amount, currency, customer)
        except ProviderUnavailable as e:
            auth = None
            sys.stderr.write("payments: provider unavailable for %s/%s: %s\n" % (tenant, key, e))

        # ---- round trip 2 (sent when the pipeline block ends)
        if auth is None:
            # transient: release the key, so that the retry runs afresh
            answer = Answer.of(Problem(503, "Payment provider unavailable",
                                       "The payment provider did not answer; retry with "
                                       "the same Idempotency-Key.", {"Retry-After": "1"}))
            retryable = True
        elif auth["status"] == "key_reused":
            # released, not stored: the retry with the first body gets the
            # provider's answer to that one
            answer = Answer.of(Problem(422, "Idempotency-Key reused",
                                       "This Idempotency-Key was used with a different request body."))
            retryable = True
        elif auth["status"] != "authorized":
            # permanent: stored, and replayed to every retry
            answer = Answer.of(Problem(402, "Card declined",
                                       "The card was declined (%s)."
                                       % auth.get("decline_code", "declined")))
            retryable = False
        else:
            answer = Answer(201, {
                "id": "ch_%d" % charge_id,
                "object": "charge",
                "amount": str(amount),
                "currency": currency,
                "customer": customer,
                "status": "pending",
                "created": now.isoformat(),
            }, {"Location": "/v1/charges/ch_%d" % charge_id})
            retryable = False
            conn.execute(INSERT_CHARGE,
                         (charge_id, tenant, key, amount, currency, customer, now))
            conn.execute(ENQUEUE_CAPTURE,
                         (tenant, Jsonb({"charge_id": charge_id, "amount": str(amount),
                                         "currency": currency, "customer": customer,
                                         "authorization": auth["id"]}),
                          key, SCOPE))
        conn.execute(COMPLETE, (tenant, SCOPE, key, answer.status, Jsonb(answer.body),
                                Jsonb(answer.headers), retryable))
        conn.execute("COMMIT")
    return answer


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
    if state == "23505":
        # payments.charges has one charge per key: this key made a charge
        # whose stored answer has since expired (the key's ttl)
        return Problem(409, "Idempotency-Key already used",
                       "A charge was made with this Idempotency-Key and its answer is "
                       "no longer kept; use a new key for a new charge.")
    sys.stderr.write("payments: database error %s: %s\n" % (state, e))
    return Problem(503, "Service unavailable",
                   "The request could not be completed; retry with the same "
                   "Idempotency-Key.", {"Retry-After": "1"})


class JSON(JSONResponse):
    """JSON with sorted keys: a stored answer, read back from jsonb, is
    replayed byte for byte as it was first sent."""

    def render(self, content):
        return json.dumps(content, sort_keys=True).encode()


app = FastAPI(title="payments example")


@app.on_event("startup")
def open_pool():
    # connections are opened in the background: the service starts (and
    # answers 503) while the database is unreachable
    POOL.open()


@app.on_event("shutdown")
def close_pool():
    POOL.close()


@app.exception_handler(Problem)
def problem_answer(request: Request, p: Problem):
    return JSON(p.body(), status_code=p.status, headers=p.headers,
                media_type="application/problem+json")


@app.exception_handler(HTTPException)
def http_error_answer(request: Request, e: HTTPException):
    # unknown paths and methods answer problem+json too
    return problem_answer(request, Problem(e.status_code, str(e.detail), str(e.detail),
                                           getattr(e, "headers", None)))


def tenant_of(authorization: Optional[str] = Header(None)) -> str:
    """The tenant, from the bearer token (never from the body)."""
    token = authorization[7:] if authorization and authorization.startswith("Bearer ") else None
    tenant = TENANT_TOKENS.get(token)
    if tenant is None:
        raise Problem(401, "Unauthorized", "A valid Bearer token is required.",
                      {"WWW-Authenticate": "Bearer"})
    return tenant


def idempotency_key(idempotency_key: Optional[str] = Header(None)) -> str:
    if not idempotency_key:
        raise Problem(400, "Idempotency-Key missing",
                      "POST /v1/charges requires an Idempotency-Key header.")
    return idempotency_key


async def raw_body(request: Request) -> bytes:
    # the body as the client sent it: that is what gets fingerprinted
    return await request.body()


@app.get("/healthz")
def healthz():
    return JSON({"ok": True})


@app.post("/v1/charges")
def post_charge(tenant: str = Depends(tenant_of), key: str = Depends(idempotency_key),
                raw: bytes = Depends(raw_body)):
    # a plain def: FastAPI runs it in its thread pool, where blocking on the
    # database and the provider is fine
    text, amount, currency, customer = parse_charge(raw)
    try:
        answer = create_charge(tenant, key, text, amount, currency, customer)
    except PoolTimeout:
        # every connection is busy: fail closed, charge nothing
        raise Problem(503, "Service unavailable",
                      "The payments database is unreachable; retry with the same "
                      "Idempotency-Key.", {"Retry-After": "1"})
    except psycopg.Error as e:
        if connection_lost(e):
            # the database is unreachable: fail closed, charge nothing
            raise Problem(503, "Service unavailable",
                          "The payments database is unreachable; retry with the same "
                          "Idempotency-Key.", {"Retry-After": "1"})
        raise problem_from_database(e)
    headers = dict(answer.headers)
    if answer.replayed:
        headers["Idempotent-Replayed"] = "true"
    return JSON(answer.body, status_code=answer.status, headers=headers)


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
    sys.stderr.write("payments: listening on 127.0.0.1:%d (%s)\n"
                     % (port, "pipelined" if PIPELINE else "one round trip per statement"))
    sys.stderr.flush()
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning",
                access_log=bool(os.environ.get("PAYMENTS_ACCESS_LOG")))


if __name__ == "__main__":
    main()
