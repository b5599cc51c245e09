#!/usr/bin/python3
"""The client conformance scenario with asyncpg.

Connects with the libpq environment (PGHOST, PGPORT, PGDATABASE) as
IDEM_APP_USER (two connections) and IDEM_WORKER_USER.  asyncpg prepares every
statement and encodes each parameter as the type the server inferred; JSON
goes as a str (asyncpg's default for json and jsonb).  Prints one line per
step and "asyncpg: N passed, M failed".  IDEM_PGBOUNCER=1: connected through
PgBouncer in transaction mode (no statement cache).
"""

import asyncio
import json
import os
import sys
import time

import asyncpg

DRIVER = "asyncpg"
TENANT = "conformance-asyncpg-%d-%d" % (os.getpid(), time.time())
SCOPE = "orders"
KEY = "order-1001"
ORDER = json.dumps({"item": "book", "amount": 12.5, "currency": "EUR"})
RESERVE = "SELECT * FROM idem_reserve($1, $2, $3, $4)"

passed = failed = 0


async def step(name, coro):
    global passed, failed
    try:
        await coro
        passed += 1
        print("ok - %s" % name)
    except Exception as e:  # report every failure, go on with the next step
        failed += 1
        state = getattr(e, "sqlstate", None)
        print("not ok - %s: %s%s" % (name, state + " " if state else "", e))


def expect(cond, what):
    if not cond:
        raise AssertionError("unexpected: %r" % (what,))


async def connect(user):
    kwargs = {}
    if os.environ.get("IDEM_PGBOUNCER"):
        # PgBouncer (transaction mode) before 1.21: unnamed statements only
        kwargs["statement_cache_size"] = 0
    return await asyncpg.connect(user=user, server_settings={
        "application_name": "conformance-asyncpg"}, **kwargs)


async def main():
    app = await connect(os.environ["IDEM_APP_USER"])
    other = await connect(os.environ["IDEM_APP_USER"])
    worker = await connect(os.environ["IDEM_WORKER_USER"])
    tx = app.transaction()

    async def reserve_created():
        await tx.start()
        r = await app.fetchrow(RESERVE, TENANT, SCOPE, KEY, ORDER)
        expect(r["outcome"] == "created" and r["lock_token"] is not None
               and r["http_status"] is None, r)
    await step("reserve: created", reserve_created())

    async def duplicate():
        r = await other.fetchrow(RESERVE, TENANT, SCOPE, KEY, ORDER)
        expect(r["outcome"] == "in_progress" and r["http_status"] == 409
               and r["retry_after"] > 0, r)
    await step("concurrent duplicate: in_progress, retry_after", duplicate())

    async def complete():
        status = await app.fetchval(
            "SELECT idem_complete($1, $2, $3, $4, $5, $6)",
            TENANT, SCOPE, KEY, 201, json.dumps({"order_id": 1001}),
            json.dumps({"Location": "/orders/1001"}))
        await tx.commit()
        expect(status == "succeeded", status)
    await step("complete in the reserving transaction: succeeded", complete())

    async def replay():
        body = '{ "currency":"EUR" ,  "amount" : 12.50, "item":"book" }'
        r = await other.fetchrow(RESERVE, TENANT, SCOPE, KEY, body)
        expect(r["outcome"] == "replay" and r["http_status"] == 201
               and r["response_code"] == 201
               and json.loads(r["response_body"]) == {"order_id": 1001}
               and json.loads(r["response_headers"]) == {"Location": "/orders/1001"}, r)
    await step("replay, reordered and respaced body: stored response", replay())

    async def mismatch():
        body = json.dumps({"item": "book", "amount": 13, "currency": "EUR"})
        r = await other.fetchrow(RESERVE, TENANT, SCOPE, KEY, body)
        expect(r["outcome"] == "mismatch" and r["http_status"] == 422, r)
    await step("different body: mismatch", mismatch())

    ids = []

    async def enqueue():
        async with app.transaction():
            outcome = await app.fetchval(
                "SELECT outcome FROM idem_reserve($1, $2, $3, $4)",
                TENANT, SCOPE, "order-1002", ORDER)
            expect(outcome == "created", outcome)
            for part in (1, 2):
                ids.append(await app.fetchval(
                    "SELECT outbox_enqueue($1, $2, $3, key => $4, scope => $5)",
                    TENANT, "payment.capture",
                    json.dumps({"order": 1002, "part": part}), "order-1002", SCOPE))
            await app.execute("SELECT idem_complete($1, $2, $3, $4, $5)",
                              TENANT, SCOPE, "order-1002", 201,
                              json.dumps({"order_id": 1002}))
        expect(len(set(ids)) == 2, ids)
    await step("outbox_enqueue with a reservation", enqueue())

    claimed = []

    async def claim():
        claimed.extend(await worker.fetch(
            "SELECT id, idem_scope, idem_key, payload, lease_token"
            "  FROM outbox_claim($1, batch => 10, tenant => $2) ORDER BY id",
            "worker-asyncpg", TENANT))
        expect([row["id"] for row in claimed] == ids
               and all(row["lease_token"] and row["idem_key"] == "order-1002"
                       for row in claimed)
               and json.loads(claimed[1]["payload"])["part"] == 2, claimed)
    await step("outbox_claim as the worker", claim())

    async def ack():
        row = claimed[0]
        await worker.execute("SELECT outbox_ack($1, $2, $3, $4)",
                             TENANT, row["id"], row["lease_token"], "ref-1")
    await step("outbox_ack", ack())

    async def nack():
        row = claimed[1]
        status = await worker.fetchval("SELECT outbox_nack($1, $2, $3, $4)",
                                       TENANT, row["id"], row["lease_token"], "HTTP 503")
        expect(status == "pending", status)
    await step("outbox_nack: pending", nack())

    async def bad_key():
        try:
            await other.fetchrow(RESERVE, TENANT, SCOPE, "", ORDER)
        except asyncpg.exceptions.NullValueNotAllowedError as e:
            expect(e.sqlstate == "22004", e.sqlstate)
        else:
            raise AssertionError("no error")
    await step("empty key: SQLSTATE 22004", bad_key())

    for conn in (app, other, worker):
        await conn.close()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception as e:
        failed += 1
        print("not ok - connection: %s" % e)
    print("%s: %d passed, %d failed" % (DRIVER, passed, failed))
    sys.exit(0 if failed == 0 and passed > 0 else 1)
