#!/usr/bin/env bash
# Runs inside the throwaway cluster as postgres (from scripts/demo.sh).
set -euo pipefail
WORK=$1
cd "$WORK"

psql -X -q -d postgres -c 'CREATE EXTENSION IF NOT EXISTS pg_cron'
createdb demo
psql -X -q -d demo -c 'CREATE EXTENSION idempotency'

for f in examples/walkthrough/*.sql; do
    echo
    echo "################ $(basename "$f")"
    # -e echoes each statement before its result
    psql -X -e -v ON_ERROR_STOP=1 -d demo -f "$f"
done

if [ -x examples/payments/demo.sh ]; then
    echo
    echo "################ examples/payments: an HTTP payments API"
    PGDATABASE=demo examples/payments/demo.sh
fi
echo
echo "demo: done"
