"""An outbox worker, as an application would write one, for the TAP test.

Claims batches with outbox_claim, calls the provider carrying the row's
idempotency key (scope:key) in the Idempotency-Key header, then acks with
the provider's reference, or nacks on a provider error.  A late ack refused
with SQLSTATE 55006 (the lease expired and another worker took the row) is
counted and ignored: the other worker finishes the row.

Usage: worker.py CONNINFO PROVIDER_URL WORKER_NAME
Environment:
  OUTBOX_STOP_FILE        exit when this file exists
  OUTBOX_DEADLINE         seconds before giving up (default 60)
  OUTBOX_LEASE            lease interval (default '2 seconds')
  OUTBOX_BATCH            rows per claim (default 5)
  OUTBOX_PAUSE_FILE       after the first provider call, write "pid key"
                          to this file and hang before acking (to be killed)
"""
import json
import os
import sys
import time
import urllib.error
import urllib.request

import psycopg

conninfo, provider_url, name = sys.argv[1:4]
stop_file = os.environ.get("OUTBOX_STOP_FILE", "")
deadline = time.time() + float(os.environ.get("OUTBOX_DEADLINE", "60"))
lease = os.environ.get("OUTBOX_LEASE", "2 seconds")
batch = int(os.environ.get("OUTBOX_BATCH", "5"))
pause_file = os.environ.get("OUTBOX_PAUSE_FILE", "")

conn = psycopg.connect(conninfo, autocommit=True)
acked = nacked = fenced = 0


def deliver(row):
    """POST the payload; return (ok, provider reference or error)."""
    tenant, row_id, token, scope, key, payload = row
    req = urllib.request.Request(
        provider_url, data=json.dumps(payload).encode(), method="POST",
        headers={"Content-Type": "application/json",
                 "Idempotency-Key": "%s:%s" % (scope, key)})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return True, json.load(resp)["id"]
    except urllib.error.HTTPError as e:
        return False, "HTTP %d" % e.code


while time.time() < deadline and not (stop_file and os.path.exists(stop_file)):
    rows = conn.execute(
        "SELECT tenant_id, id, lease_token, idem_scope, idem_key, payload"
        "  FROM outbox_claim(%s, %s, %s::interval)",
        (name, batch, lease)).fetchall()
    if not rows:
        time.sleep(0.05)
        continue
    for row in rows:
        tenant, row_id, token = row[0], row[1], row[2]
        ok, result = deliver(row)
        if pause_file:
            # the provider has done its work; die here before the ack
            with open(pause_file + ".tmp", "w") as f:
                f.write("%d %s:%s" % (os.getpid(), row[3], row[4]))
            os.rename(pause_file + ".tmp", pause_file)
            while True:
                time.sleep(1)
        try:
            if ok:
                conn.execute("SELECT outbox_ack(%s, %s, %s, %s)",
                             (tenant, row_id, token, result))
                acked += 1
            else:
                conn.execute("SELECT outbox_nack(%s, %s, %s, %s, '50 ms')",
                             (tenant, row_id, token, result))
                nacked += 1
        except psycopg.errors.ObjectInUse:
            fenced += 1

print("%s: acked %d, nacked %d, fenced %d" % (name, acked, nacked, fenced))
