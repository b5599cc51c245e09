#!/usr/bin/python3
"""The client conformance scenario with psycopg 3.

Connects with the libpq environment (PGHOST, PGPORT, PGDATABASE) as
IDEM_APP_USER (two connections) and IDEM_WORKER_USER.  Parameters go as
psycopg sends them: str untyped, dicts wrapped in Jsonb.  Prints one line per
step and "psycopg: N passed, M failed".  IDEM_PGBOUNCER=1: connected through
PgBouncer in transaction mode (no server-side prepared statements).
"""

import os
import sys
import time

import psycopg
from psycopg.types.json import Jsonb

DRIVER = "psycopg"
TENANT = "conformance-psycopg-%d-%d" % (os.getpid(), time.time())
SCOPE = "orders"
KEY = "order-1001"
ORDER = {"item": "book", "amount": 12.5, "currency": "EUR"}
RESERVE = "SELECT * FROM idem_reserve(%s, %s, %s, %s)"

passed = failed = 0


def step(name):
    """Run the decorated function as one step of the scenario."""
    def run(fn):
        global passed, failed
        try:
            fn()
            passed += 1
            print("ok - %s" % name)
        except Exception as e:  # report every failure, go on with the next step
            failed += 1
            state = getattr(e, "sqlstate", None)
            print("not ok - %s: %s%s" % (name, state + " " if state else "", e))
        return fn
    return run


def expect(cond, what):
    if not cond:
        raise AssertionError("unexpected: %r" % (what,))


def connect(user, **kwargs):
    if os.environ.get("IDEM_PGBOUNCER"):
        # PgBouncer (transaction mode) before 1.21 cannot keep a prepared
        # statement: never prepare
        kwargs["prepare_threshold"] = None
    return psycopg.connect(user=user, application_name="conformance-psycopg", **kwargs)


def main():
    app = connect(os.environ["IDEM_APP_USER"])
    other = connect(os.environ["IDEM_APP_USER"], autocommit=True)
    worker = connect(os.environ["IDEM_WORKER_USER"], autocommit=True)

    @step("reserve: created")
    def _():
        # the first statement opens the transaction (autocommit is off)
        r = app.execute(RESERVE, (TENANT, SCOPE, KEY, Jsonb(ORDER))).fetchone()
        expect(r[0] == "created" and r[7] is not None and r[1] is None, r)

    @step("concurrent duplicate: in_progress, retry_after")
    def _():
        with other.cursor(row_factory=psycopg.rows.dict_row) as cur:
            r = cur.execute(RESERVE, (TENANT, SCOPE, KEY, Jsonb(ORDER))).fetchone()
        expect(r["outcome"] == "in_progress" and r["http_status"] == 409
               and r["retry_after"] > 0, r)

    @step("complete in the reserving transaction: succeeded")
    def _():
        status, = app.execute(
            "SELECT idem_complete(%s, %s, %s, %s, %s, %s)",
            (TENANT, SCOPE, KEY, 201, Jsonb({"order_id": 1001}),
             Jsonb({"Location": "/orders/1001"}))).fetchone()
        app.commit()
        expect(status == "succeeded", status)

    @step("replay, reordered and respaced body: stored response")
    def _():
        body = '{ "currency":"EUR" ,  "amount" : 12.50, "item":"book" }'
        with other.cursor(row_factory=psycopg.rows.dict_row) as cur:
            r = cur.execute(RESERVE, (TENANT, SCOPE, KEY, body)).fetchone()
        expect(r["outcome"] == "replay" and r["http_status"] == 201
               and r["response_code"] == 201
               and r["response_body"] == {"order_id": 1001}
               and r["response_headers"] == {"Location": "/orders/1001"}, r)

    @step("different body: mismatch")
    def _():
        with other.cursor(row_factory=psycopg.rows.dict_row) as cur:
            r = cur.execute(RESERVE, (TENANT, SCOPE, KEY,
                                      Jsonb(dict(ORDER, amount=13)))).fetchone()
        expect(r["outcome"] == "mismatch" and r["http_status"] == 422, r)

    ids = []

    @step("outbox_enqueue with a reservation")
    def _():
        with app.transaction():
            outcome = app.execute("SELECT outcome FROM idem_reserve(%s, %s, %s, %s)",
                                  (TENANT, SCOPE, "order-1002", Jsonb(ORDER))).fetchone()[0]
            expect(outcome == "created", outcome)
            for part in (1, 2):
                ids.append(app.execute(
                    "SELECT outbox_enqueue(%s, %s, %s, key => %s, scope => %s)",
                    (TENANT, "payment.capture", Jsonb({"order": 1002, "part": part}),
                     "order-1002", SCOPE)).fetchone()[0])
            app.execute("SELECT idem_complete(%s, %s, %s, %s, %s)",
                        (TENANT, SCOPE, "order-1002", 201, Jsonb({"order_id": 1002})))
        expect(len(set(ids)) == 2, ids)

    claimed = []

    @step("outbox_claim as the worker")
    def _():
        with worker.cursor(row_factory=psycopg.rows.dict_row) as cur:
            claimed.extend(cur.execute(
                "SELECT id, idem_scope, idem_key, payload, lease_token"
                "  FROM outbox_claim(%s, batch => 10, tenant => %s) ORDER BY id",
                ("worker-psycopg", TENANT)).fetchall())
        expect([row["id"] for row in claimed] == ids
               and all(row["lease_token"] and row["idem_key"] == "order-1002"
                       for row in claimed)
               and claimed[1]["payload"]["part"] == 2, claimed)

    @step("outbox_ack")
    def _():
        row = claimed[0]
        worker.execute("SELECT outbox_ack(%s, %s, %s, %s)",
                       (TENANT, row["id"], row["lease_token"], "ref-1"))

    @step("outbox_nack: pending")
    def _():
        row = claimed[1]
        status, = worker.execute("SELECT outbox_nack(%s, %s, %s, %s)",
                                 (TENANT, row["id"], row["lease_token"],
                                  "HTTP 503")).fetchone()
        expect(status == "pending", status)

    @step("empty key: SQLSTATE 22004")
    def _():
        try:
            other.execute(RESERVE, (TENANT, SCOPE, "", Jsonb(ORDER)))
        except psycopg.errors.NullValueNotAllowed as e:
            expect(e.sqlstate == "22004", e.sqlstate)
        else:
            raise AssertionError("no error")

    for conn in (app, other, worker):
        conn.close()


if __name__ == "__main__":
    try:
        main()
    except Exception as e:
        failed += 1
        print("not ok - connection: %s" % e)
    print("%s: %d passed, %d failed" % (DRIVER, passed, failed))
    sys.exit(0 if failed == 0 and passed > 0 else 1)
