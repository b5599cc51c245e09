#!/usr/bin/env bash
# Walk through the example payments API with curl: a charge, its replay, a
# mismatch, a concurrent duplicate, a transient provider failure retried, a
# declined card replayed, the outbox delivering the capture to
# the provider exactly once, and the reconciliation job settling an attempt
# that died after the provider captured.  The service, the worker and the
# operator each log in as a role of their own, granted one of the
# extension's roles; none is a superuser.  Needs a database with the
# idempotency extension and a superuser connection for the set-up (libpq
# environment: PGHOST, PGPORT, PGDATABASE, ...); run by "make demo".
set -euo pipefail
cd "$(dirname "$0")"
PY=/usr/bin/python3
: "${PGDATABASE:=demo}"
export PGDATABASE

free_port() { $PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
password() { $PY -c 'import secrets; print(secrets.token_hex(16))'; }
SVC_PORT=$(free_port)
PRV_PORT=$(free_port)
SVC_PW=$(password) WRK_PW=$(password) OPS_PW=$(password)
export PROVIDER_URL="http://127.0.0.1:$PRV_PORT"
SERVICE_DSN="dbname=$PGDATABASE user=payments_service password=$SVC_PW"
WORKER_DSN="dbname=$PGDATABASE user=payments_worker password=$WRK_PW"
LOGS=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; rm -rf "$LOGS"; }
trap cleanup EXIT

as_ops() { PGUSER=payments_ops PGPASSWORD=$OPS_PW psql -X "$@"; }
as_service() { PGUSER=payments_service PGPASSWORD=$SVC_PW psql -X "$@"; }

echo "== 0. least privilege: the DBA creates the tables and three LOGIN roles (schema.sql, roles.sql)"
psql -X -q -v ON_ERROR_STOP=1 -f schema.sql -f roles.sql
psql -X -q -v ON_ERROR_STOP=1 \
    -c "ALTER ROLE payments_service PASSWORD '$SVC_PW'" \
    -c "ALTER ROLE payments_worker PASSWORD '$WRK_PW'" \
    -c "ALTER ROLE payments_ops PASSWORD '$OPS_PW'"
grep -E '^GRANT idempotency_' roles.sql
psql -X -c "SELECT r.rolname AS login_role, r.rolsuper AS superuser,
                   string_agg(g.rolname, ', ' ORDER BY g.rolname) AS granted
              FROM pg_roles r
              JOIN pg_auth_members m ON m.member = r.oid
              JOIN pg_roles g ON g.oid = m.roleid
             WHERE r.rolname LIKE 'payments\_%'
             GROUP BY 1, 2 ORDER BY 1"
echo "the operator (payments_ops, granted idempotency_admin) sets the scope's policy (scope.sql):"
as_ops -q -v ON_ERROR_STOP=1 -f scope.sql
echo "the service's role may not do the operator's work, nor read the extension's tables:"
as_service -c "SELECT idem_configure_scope('charges', '{\"ttl\": \"1 year\"}')" 2>&1 || true
as_service -c "SELECT count(*) FROM idempotency.keys" 2>&1 || true
echo

PROVIDER_PORT=$PRV_PORT $PY provider.py 2>"$LOGS/provider.log" & pids+=($!)
# one second of simulated work inside the transaction makes the concurrent
# duplicate below visible
PAYMENTS_DSN=$SERVICE_DSN PAYMENTS_PORT=$SVC_PORT PAYMENTS_PROCESSING_DELAY=1 \
    $PY service.py 2>"$LOGS/service.log" & pids+=($!)
for _ in $(seq 50); do curl -s -o /dev/null "http://127.0.0.1:$SVC_PORT/healthz" && break; sleep 0.1; done
head -1 "$LOGS/service.log"
echo

API="http://127.0.0.1:$SVC_PORT/v1/charges"
charge() {  # charge KEY BODY
    echo "\$ curl -X POST $API -H 'Authorization: Bearer tok_acme' -H 'Idempotency-Key: $1' -d '$2'"
    curl -s -i -X POST "$API" -H 'Authorization: Bearer tok_acme' \
        -H "Idempotency-Key: $1" -H 'Content-Type: application/json' -d "$2" \
        | grep -v -i -E '^(date|server|content-length):' | tr -d '\r'
    echo; echo
}

echo "== 1. a new charge: 201, one row in payments.charges, one outbox row"
charge order-1001 '{"amount": 42.50, "currency": "EUR", "customer": "cus_7"}'
echo "== 2. the client retries (keys reordered, 42.5 spelt differently): the stored answer is replayed"
charge order-1001 '{"customer": "cus_7", "currency": "EUR", "amount": 42.5}'
echo "== 3. same key, different amount: 422"
charge order-1001 '{"amount": 99.00, "currency": "EUR", "customer": "cus_7"}'
echo "== 4. no Idempotency-Key: 400"
echo "\$ curl -X POST $API -H 'Authorization: Bearer tok_acme' -d '...'"
curl -s -X POST "$API" -H 'Authorization: Bearer tok_acme' -d '{"amount": 1.00, "currency": "EUR", "customer": "cus_7"}'
echo; echo
echo "== 5. two copies of one request at once: one charges, the other gets 409 + Retry-After"
charge order-1002 '{"amount": 10.00, "currency": "USD", "customer": "cus_8"}' >"$LOGS/a" &
first=$!
sleep 0.3
charge order-1002 '{"amount": 10.00, "currency": "USD", "customer": "cus_8"}' >"$LOGS/b"
wait $first
cat "$LOGS/a" "$LOGS/b"
echo "== 6. the provider fails for a moment (cus_flaky: 503): the key is released"
echo "   (idem_complete retryable => true), the client is answered 503, and its retry charges"
charge order-1004 '{"amount": 15.00, "currency": "EUR", "customer": "cus_flaky"}'
charge order-1004 '{"amount": 15.00, "currency": "EUR", "customer": "cus_flaky"}'
echo "== 7. a declined card is a permanent failure: the 402 is stored and replayed"
charge order-1005 '{"amount": 99.00, "currency": "EUR", "customer": "cus_declined"}'
charge order-1005 '{"amount": 99.00, "currency": "EUR", "customer": "cus_declined"}'
echo "== charges so far (one per key charged), as the operator sees them:"
as_ops -c "SELECT id, tenant_id, idem_key, amount, currency, status FROM payments.charges ORDER BY id"

echo "== 8. the worker claims the outbox and captures each charge at the provider, once"
PAYMENTS_DSN=$WORKER_DSN WORKER_NAME=demo-worker WORKER_LEASE=5 \
    $PY worker.py 2>"$LOGS/worker.log" & pids+=($!)
for _ in $(seq 50); do
    [ "$(as_ops -Atc "SELECT count(*) FROM idempotency.outbox WHERE status <> 'done'")" = 0 ] && break
    sleep 0.2
done
as_ops -c "SELECT id, topic, idem_key, status, attempts, provider_ref FROM idempotency.outbox WHERE topic = 'charge.capture' ORDER BY id"
as_ops -c "SELECT id, idem_key, status, provider_ref FROM payments.charges ORDER BY id"
echo "\$ curl $PROVIDER_URL/_ledger"
curl -s "$PROVIDER_URL/_ledger"; echo
echo
head -1 "$LOGS/worker.log"

echo "== 9. the operator, as payments_ops: maintenance and health"
echo "\$ psql -U payments_ops -c 'CALL idem_maintain()'"
as_ops -q -c 'CALL idem_maintain()'
as_ops -c 'SELECT processing, needs_reconciliation, outbox_pending, outbox_leased, outbox_dead FROM idempotency.health'

echo
echo "== 10. reconciliation: a two-phase attempt (reservation and charge committed first,"
echo "   then the provider called) dies after the provider captured, before idem_complete"
as_service -q -v ON_ERROR_STOP=1 <<'SQL'
BEGIN;
SELECT set_config('idempotency.tenant', 'acme', true) \g /dev/null
SELECT outcome FROM idem_reserve('acme', 'charges', 'order-1003',
    '{"amount": 7.00, "currency": "EUR", "customer": "cus_9"}') \g /dev/null
INSERT INTO payments.charges (tenant_id, idem_key, amount, currency, customer)
VALUES ('acme', 'order-1003', 7.00, 'EUR', 'cus_9');
COMMIT;
SQL
curl -s -o /dev/null -X POST "$PROVIDER_URL/v1/captures" -H 'Idempotency-Key: acme:charges:order-1003' \
    -H 'Content-Type: application/json' -d '{"amount": "7.00", "currency": "EUR", "customer": "cus_9"}'
sleep 1.2
echo "the sweeper flags the stuck reservation (as if its 30-second lock_timeout had passed):"
echo "\$ psql -U payments_ops -c \"SELECT idem_sweep('1 second')\""
as_ops -Atc "SELECT idem_sweep('1 second')"
as_ops -c 'SELECT processing, needs_reconciliation FROM idempotency.health'
echo "the client's retry cannot know the outcome yet:"
charge order-1003 '{"amount": 7.00, "currency": "EUR", "customer": "cus_9"}'
echo "the reconciliation job, as payments_ops, compares the provider's ledger with the charges and the keys:"
echo "\$ PAYMENTS_OPS_DSN='... user=payments_ops' PROVIDER_URL=$PROVIDER_URL ./reconcile.py"
rc=0
PAYMENTS_OPS_DSN="dbname=$PGDATABASE user=payments_ops password=$OPS_PW" $PY reconcile.py || rc=$?
echo "(exit status $rc; 0: nothing unexplained, 1: discrepancies reported)"
echo
as_ops -c "SELECT idem_key, status, provider_ref FROM payments.charges WHERE idem_key = 'order-1003'"
as_ops -c 'SELECT processing, needs_reconciliation FROM idempotency.health'
echo "the retry now replays the outcome the provider proved:"
charge order-1003 '{"amount": 7.00, "currency": "EUR", "customer": "cus_9"}'
[ "$rc" = 0 ]
