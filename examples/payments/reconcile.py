#!/usr/bin/python3
"""Reconciliation job for the example payments service.

Compares what the payment provider recorded (GET /_ledger: its captures,
keyed by the Idempotency-Key worker.py sends, tenant:scope:key) with the
charges (payments.charges) and the idempotency keys, once per run (run it
from cron, a systemd timer or by hand), and prints a report: what it
compared, one line per item, then a summary (counts per kind).

    uncaptured TENANT charges KEY: ...
        A charge the provider never captured: no capture under the charge's
        key, the charge older than RECONCILE_GRACE seconds (younger ones are
        in flight: the worker has not delivered them yet) and its key
        finished (a processing key is an attempt in flight, or flagged).  The line shows
        the charge's outbox row (pending, leased, dead, with its last
        error).  Reported only: the outbox delivers it (a dead letter is
        requeued by an operator with outbox_requeue).

    capture_without_charge TENANT charges KEY: ...
        A capture the provider made under a key of the charges scope for
        which there is no charge row and no reservation in flight: money
        taken with nothing on our side.  Reported only (refund it, or
        record the charge by hand).

    resolved TENANT charges KEY: ...
        A key flagged needs_reconciliation (its attempt died after reserving
        and the key went stale, see idem_sweep) that the provider proves:
        it captured under that key, and the charge row exists.  In one
        transaction the job marks the charge captured with the provider's
        reference (as worker.py would) and calls idem_resolve(tenant,
        'charges', key, 201, <the charge>), so the client's retry replays
        that 201 instead of getting 409.  Resolved keys are explained: they
        do not make the run fail.

    unresolved TENANT SCOPE KEY: ...
        A flagged key the job cannot prove, left for an operator:
        - the provider has no capture under it.  Absence is not proof of
          failure (the call may still be in flight or retried by the
          provider), and releasing the key would let the retry charge a
          second time, so the job never releases or fails a key; an
          operator who has established the outcome stores it with
          idem_resolve (e.g. a 502 problem body) or, once sure nothing was
          charged, completes the business side by hand;
        - the provider captured, but there is no charge row: the job does
          not invent business rows; the operator records the charge (in a
          transaction with idem_guard_bypass) or refunds, then resolves;
        - the key is in another scope, which this job does not reconcile.

Exit status: 0 when nothing is unexplained (no item, or only resolved
keys), 1 when the run found uncaptured charges, captures without a charge
or unresolved keys, 2 when it could not run (database or provider
unreachable).

The job logs in as payments_ops (granted idempotency_admin: it reads
idempotency.keys and idempotency.outbox and may call idem_resolve), which
may read payments.charges and update a charge's status and provider_ref
(roles.sql).

Configuration (environment): PAYMENTS_OPS_DSN (libpq connection string of
payments_ops), PROVIDER_URL (default http://127.0.0.1:8090),
RECONCILE_GRACE (seconds, default 300).  Tenant names in the provider's keys
are taken to contain no ':' (the example's tenants are acme and globex).
"""

import json
import os
import sys
import urllib.request

import psycopg
from psycopg.types.json import Jsonb

SCOPE = "charges"
DSN = os.environ.get("PAYMENTS_OPS_DSN", "")
PROVIDER_URL = os.environ.get("PROVIDER_URL", "http://127.0.0.1:8090")
GRACE = float(os.environ.get("RECONCILE_GRACE", "300"))


def provider_key(tenant, scope, key):
    """The Idempotency-Key worker.py sends the provider."""
    return "%s:%s:%s" % (tenant, scope, key)


def fetch_ledger():
    with urllib.request.urlopen(PROVIDER_URL + "/_ledger", timeout=10) as resp:
        ledger = json.loads(resp.read())
    return ledger.get("calls", {}), ledger.get("captures", {})


def charge_body(row):
    """A charge as service.py shows it."""
    return {
        "id": "ch_%d" % row["id"],
        "object": "charge",
        "amount": str(row["amount"]),
        "currency": row["currency"],
        "customer": row["customer"],
        "status": row["status"],
        "created": row["created_at"].isoformat(),
    }


def resolve(conn, key, charge, capture):
    """Mark the charge captured and store its 201 for the flagged key, in one
    transaction; return the charge's body, or raise."""
    with conn.transaction():
        looked = conn.execute(
            "SELECT status::text, needs_reconciliation FROM idempotency.keys"
            " WHERE tenant_id = %s AND scope = %s AND idem_key = %s",
            (key["tenant_id"], key["scope"], key["idem_key"])).fetchone()
        if looked != ("processing", True):
            raise RuntimeError("the key changed meanwhile (%s)" % (looked,))
        row = conn.cursor(row_factory=psycopg.rows.dict_row).execute(
            "UPDATE payments.charges SET status = 'captured', provider_ref = %s"
            " WHERE tenant_id = %s AND id = %s"
            " RETURNING id, amount, currency, customer, status, created_at",
            (capture["id"], charge["tenant_id"], charge["id"])).fetchone()
        body = charge_body(row)
        conn.execute(
            "SELECT idem_resolve(%s, %s, %s, 201, %s)",
            (key["tenant_id"], key["scope"], key["idem_key"], Jsonb(body)))
    return body


def run(conn, calls, captures):
    """Compare, resolve what the provider proves; return the report's items
    as (kind, tenant, scope, key, detail), the charges and the number of
    flagged keys."""
    items = []
    cur = conn.cursor(row_factory=psycopg.rows.dict_row)
    charges = cur.execute(
        "SELECT c.id, c.tenant_id, c.idem_key, c.amount, c.currency, c.customer,"
        "       c.status, c.provider_ref, c.created_at,"
        "       now() - c.created_at > make_interval(secs => %s) AS past_grace,"
        "       o.id AS outbox_id, o.status::text AS outbox_status, o.attempts,"
        "       o.last_error"
        "  FROM payments.charges c"
        "  LEFT JOIN idempotency.outbox o"
        "    ON o.tenant_id = c.tenant_id AND o.topic = 'charge.capture'"
        "   AND o.idem_scope = %s AND o.idem_key = c.idem_key"
        " ORDER BY c.id",
        (GRACE, SCOPE)).fetchall()
    keys = cur.execute(
        "SELECT tenant_id, scope, idem_key, status::text, needs_reconciliation,"
        "       created_at, locked_at"
        "  FROM idempotency.keys"
        " WHERE status = 'processing'"
        " ORDER BY created_at, tenant_id, scope, idem_key").fetchall()
    conn.commit()

    charge_of = {provider_key(c["tenant_id"], SCOPE, c["idem_key"]): c for c in charges}
    processing = {provider_key(k["tenant_id"], k["scope"], k["idem_key"]): k for k in keys}

    # flagged keys: resolve what the provider proves, report the rest
    for pkey, key in processing.items():
        if not key["needs_reconciliation"]:
            continue
        where = (key["tenant_id"], key["scope"], key["idem_key"])
        capture = captures.get(pkey)
        charge = charge_of.get(pkey) if key["scope"] == SCOPE else None
        if key["scope"] != SCOPE:
            items.append(("unresolved",) + where + (
                "scope %s is not reconciled by this job" % key["scope"],))
        elif capture is None:
            items.append(("unresolved",) + where + (
                "the provider has no capture under this key (%d call(s) seen);"
                " reserved %s, left for an operator"
                % (calls.get(pkey, 0), key["created_at"].isoformat()),))
        elif charge is None:
            items.append(("unresolved",) + where + (
                "the provider captured %s but there is no charge row;"
                " record the charge or refund, then idem_resolve" % capture["id"],))
        else:
            try:
                body = resolve(conn, key, charge, capture)
            except (psycopg.Error, RuntimeError) as e:
                items.append(("unresolved",) + where + (
                    "the provider captured %s, but resolving failed: %s"
                    % (capture["id"], str(e).strip()),))
            else:
                items.append(("resolved",) + where + (
                    "the provider captured %s; charge %s marked captured;"
                    " idem_resolve 201" % (capture["id"], body["id"]),))

    # charges the provider never captured
    for pkey, c in charge_of.items():
        if pkey in captures or not c["past_grace"]:
            continue
        if pkey in processing:
            continue    # a two-phase attempt in flight, or flagged (reported above)
        if c["outbox_id"] is None:
            outbox = "no outbox row"
        else:
            outbox = "outbox row %d %s, %d attempt(s)" % (
                c["outbox_id"], c["outbox_status"], c["attempts"])
            if c["last_error"]:
                outbox += ", last error: %s" % c["last_error"]
        items.append(("uncaptured", c["tenant_id"], SCOPE, c["idem_key"],
                      "charge ch_%d (%s %s, %s) has no capture at the provider; %s"
                      % (c["id"], c["amount"], c["currency"], c["status"], outbox)))

    # captures with no charge
    for pkey, capture in sorted(captures.items()):
        parts = pkey.split(":", 2)
        if len(parts) != 3 or parts[1] != SCOPE or pkey in charge_of:
            continue
        if pkey in processing:
            continue    # in flight, or flagged (reported above)
        items.append(("capture_without_charge", parts[0], parts[1], parts[2],
                      "the provider captured %s; there is no charge and no"
                      " reservation under this key" % capture["id"]))
    return items, charges, sum(1 for k in keys if k["needs_reconciliation"])


def main():
    try:
        calls, captures = fetch_ledger()
        with psycopg.connect(DSN, connect_timeout=5) as conn:
            items, charges, nflagged = run(conn, calls, captures)
    except (OSError, ValueError, psycopg.Error) as e:
        sys.stderr.write("reconcile: could not run: %s\n" % e)
        return 2
    print("reconcile: %d charge(s), %d flagged key(s); the provider at %s made %d capture(s)"
          % (len(charges), nflagged, PROVIDER_URL, len(captures)))
    kinds = ["uncaptured", "capture_without_charge", "resolved", "unresolved"]
    items.sort(key=lambda i: (kinds.index(i[0]),) + i[1:4])
    for kind, tenant, scope, key, detail in items:
        print("%s %s %s %s: %s" % (kind, tenant, scope, key, detail))
    counts = {k: sum(1 for i in items if i[0] == k) for k in kinds}
    unexplained = len(items) - counts["resolved"]
    print("summary: %s; unexplained %d"
          % (", ".join("%s %d" % (k, counts[k]) for k in kinds), unexplained))
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
