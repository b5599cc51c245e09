#!/usr/bin/python3
"""Outbox worker for the example payments service.

Claims 'charge.capture' rows from the transactional outbox, calls the
payment provider over HTTP with the request's idempotency key as the
provider's own Idempotency-Key, then acknowledges the row and marks the
charge captured in one transaction.

Delivery is at least once: a worker that dies after the provider call but
before the ack leaves a leased row whose lease expires; another claim hands it
out again (with a new lease token, so the dead worker's ack could no longer
land), and the provider, seeing the same key, does not capture twice.

Between claims the worker sleeps on LISTEN idempotency_outbox (sent when an
enqueueing transaction commits), polling at least every POLL seconds.  Behind
PgBouncer in transaction mode the LISTEN connection must go straight to the
server (WORKER_LISTEN_DSN): a LISTEN made through PgBouncer stays on a server
connection that other clients use, and its notifications are lost.  Claims
and acks may go through PgBouncer: a lease is a row, not a session lock.

The worker logs in as a role granted idempotency_worker plus UPDATE on the
charges it marks captured (roles.sql), not as a superuser.

Configuration (environment): PAYMENTS_DSN, WORKER_LISTEN_DSN (default
PAYMENTS_DSN), PAYMENTS_PGBOUNCER=1 (no server-side prepared statements, as
in service.py), PROVIDER_URL (default
http://127.0.0.1:8090), WORKER_NAME, WORKER_LEASE (seconds, default 30),
WORKER_BATCH (default 10).  WORKER_CRASH_AFTER_CALLS=N makes the worker kill
itself with SIGKILL right after its N-th provider call, before the ack: the
crash the end-to-end tests exercise.

SIGTERM (or SIGINT) stops the worker cleanly: it delivers the batch it holds,
claims no more, prints what it did (rows acked, nacked, and acks refused
because the lease had passed to another worker) and exits 0.
"""

import json
import os
import select
import signal
import sys
import time
import urllib.error
import urllib.request

import psycopg

DSN = os.environ.get("PAYMENTS_DSN", "")
LISTEN_DSN = os.environ.get("WORKER_LISTEN_DSN", DSN)
PREPARE_THRESHOLD = None if os.environ.get("PAYMENTS_PGBOUNCER") else 5
PROVIDER_URL = os.environ.get("PROVIDER_URL", "http://127.0.0.1:8090")
NAME = os.environ.get("WORKER_NAME", "worker-%d" % os.getpid())
LEASE = int(os.environ.get("WORKER_LEASE", "30"))
BATCH = int(os.environ.get("WORKER_BATCH", "10"))
CRASH_AFTER = int(os.environ.get("WORKER_CRASH_AFTER_CALLS", "0"))
POLL = 1.0

calls = 0
done = {"acked": 0, "nacked": 0, "fenced": 0}
stopping = False


def stop(signum, frame):
    global stopping
    stopping = True


def call_provider(row):
    """POST the capture; return the provider's reference or raise."""
    global calls
    downstream_key = "%s:%s:%s" % (row["tenant_id"], row["idem_scope"], row["idem_key"])
    req = urllib.request.Request(
        PROVIDER_URL + "/v1/captures",
        data=json.dumps(row["payload"], sort_keys=True).encode(),
        headers={"Content-Type": "application/json", "Idempotency-Key": downstream_key},
        method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        answer = json.loads(resp.read())
    calls += 1
    if CRASH_AFTER and calls >= CRASH_AFTER:
        sys.stderr.write("%s: crashing after provider call for %s\n" % (NAME, downstream_key))
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    return answer["id"]


def work_once(conn):
    """Claim one batch and deliver it; return how many rows were claimed."""
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        cur.execute(
            "SELECT * FROM outbox_claim(%s, %s, make_interval(secs => %s),"
            " ARRAY['charge.capture'])",
            (NAME, BATCH, LEASE))
        rows = cur.fetchall()
    conn.commit()
    for row in rows:
        try:
            ref = call_provider(row)
        except (urllib.error.URLError, OSError, ValueError) as e:
            try:
                with conn.transaction():
                    conn.execute(
                        "SELECT outbox_nack(%s, %s, %s, %s)",
                        (row["tenant_id"], row["id"], row["lease_token"], str(e)[:500]))
                done["nacked"] += 1
            except psycopg.errors.ObjectInUse:
                done["fenced"] += 1
            continue
        try:
            with conn.transaction():
                conn.execute(
                    "SELECT outbox_ack(%s, %s, %s, %s)",
                    (row["tenant_id"], row["id"], row["lease_token"], ref))
                conn.execute(
                    "UPDATE payments.charges SET status = 'captured', provider_ref = %s"
                    " WHERE tenant_id = %s AND id = %s",
                    (ref, row["tenant_id"], row["payload"]["charge_id"]))
            done["acked"] += 1
        except psycopg.errors.ObjectInUse as e:
            # 55006: the lease expired and another worker holds the row now;
            # that worker finishes it
            done["fenced"] += 1
            sys.stderr.write("%s: ack of %s refused: %s\n" % (NAME, row["id"], e))
        except psycopg.errors.DatabaseError as e:
            sys.stderr.write("%s: ack of %s refused: %s\n" % (NAME, row["id"], e))
    return len(rows)


def report_role():
    """Say which database role the worker runs as; warn if it is a superuser."""
    try:
        with psycopg.connect(DSN, connect_timeout=3) as conn:
            user, superuser = conn.execute(
                "SELECT current_user::text, rolsuper FROM pg_roles"
                " WHERE rolname = current_user").fetchone()
    except psycopg.Error as e:
        sys.stderr.write("%s: database not reachable yet (%s)\n" % (NAME, e))
        return
    sys.stderr.write("%s: database role %s\n" % (NAME, user))
    if superuser:
        sys.stderr.write("%s: WARNING: %s is a superuser; log in as a role granted"
                         " idempotency_worker instead (examples/payments/roles.sql)\n"
                         % (NAME, user))


def main():
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    report_role()
    while not stopping:
        try:
            conn = psycopg.connect(DSN, autocommit=False, connect_timeout=3,
                                   prepare_threshold=PREPARE_THRESHOLD)
            listen = psycopg.connect(LISTEN_DSN, autocommit=True, connect_timeout=3)
            listen.execute("LISTEN idempotency_outbox")
            sys.stderr.write("%s: started\n" % NAME)
            while not stopping:
                if work_once(conn) >= BATCH:
                    continue
                # idle: wait for a NOTIFY or the poll interval
                if select.select([listen.fileno()], [], [], POLL)[0]:
                    # consume the notification(s) that woke us
                    listen.execute("SELECT 1")
        except psycopg.OperationalError as e:
            sys.stderr.write("%s: database unavailable (%s); retrying\n" % (NAME, e))
            time.sleep(1)
    sys.stderr.write("%s: stopped: acked %d, nacked %d, fenced %d\n"
                     % (NAME, done["acked"], done["nacked"], done["fenced"]))


if __name__ == "__main__":
    main()
