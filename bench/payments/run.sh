#!/usr/bin/env bash
# The example payments service (examples/payments) end to end over HTTP,
# pipelined (2 round trips to the database per new charge) against
# PAYMENTS_PIPELINE=0 (7 round trips), both measured in the same run by
# examples/payments/loadtest.py --compare-pipeline.  Runs inside the
# throwaway cluster as postgres (bench/run.sh), twice: with the database on
# the same machine, and 1 ms away (loadtest.py --db-delay-ms, a relay that
# holds each answer of the server as a network between machines would).
# PAYMENTS_BENCH_DELAYS (milliseconds, default "0 1"), PAYMENTS_BENCH_CLIENTS
# (default 4), PAYMENTS_BENCH_REQUESTS (per side, default 4000) and
# PAYMENTS_BENCH_ROUNDS (default 4) change that.
set -euo pipefail
cd "$(dirname "$0")/../../examples/payments"
DB=bench_payments
PY=/usr/bin/python3

dropdb --if-exists "$DB" 2>/dev/null
createdb "$DB"
psql -X -q -v ON_ERROR_STOP=1 -d "$DB" -c 'CREATE EXTENSION idempotency' -f schema.sql -f roles.sql
PW=$($PY -c 'import secrets; print(secrets.token_hex(16))')
psql -X -q -v ON_ERROR_STOP=1 -d "$DB" -c "ALTER ROLE payments_service PASSWORD '$PW'" \
    -c "ALTER ROLE payments_ops PASSWORD '$PW'"
PGUSER=payments_ops PGPASSWORD=$PW psql -X -q -v ON_ERROR_STOP=1 -d "$DB" -f scope.sql >/dev/null

for delay in ${PAYMENTS_BENCH_DELAYS:-0 1}; do
    $PY loadtest.py --compare-pipeline "dbname=$DB user=payments_service password=$PW" \
        --db-delay-ms "$delay" --clients "${PAYMENTS_BENCH_CLIENTS:-4}" \
        --requests "${PAYMENTS_BENCH_REQUESTS:-4000}" --rounds "${PAYMENTS_BENCH_ROUNDS:-4}" \
        2> >(grep -v -E '^(payments|provider): ' >&2)
done
dropdb "$DB"
