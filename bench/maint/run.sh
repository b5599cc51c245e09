#!/usr/bin/env bash
# Reaper workload: 1M expired keys reaped by CALL idem_maintain() while
# pgbench runs the new-request workload.  Reports rows reaped per second and
# the new-request p99 latency while reaping, against p99 with no reaping
# measured in the same run (A B A B: without, with, without, with), and the
# table and index sizes before, at the peak, and after reaping + VACUUM (the
# files keep their size; the second round shows the space is reused).
# Run by bench/run.sh (as postgres, PG* set, cwd bench/maint).
set -euo pipefail

ROWS=${ROWS:-1000000}
SECONDS_A=${SECONDS_A:-15}     # pgbench run without reaping
SECONDS_B=${SECONDS_B:-75}     # pgbench run during which idem_maintain reaps
CLIENTS=${CLIENTS:-2}
MAINTAIN=${MAINTAIN:-"CALL idem_maintain('80 seconds')"}
DB=bench_maint
psql_q() { psql -X -q -At -v ON_ERROR_STOP=1 -d "$DB" "$@"; }
calc() { awk "BEGIN { printf \"%.2f\", $1 }"; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

dropdb --if-exists "$DB" >/dev/null
createdb "$DB"
psql_q -c 'CREATE EXTENSION idempotency' \
       -c 'CREATE TABLE orders (id bigserial PRIMARY KEY, tenant text, amount bigint)'

# The new-request workload: BEGIN; reserve; business write; complete; COMMIT.
if [ "$(psql_q -c "SELECT to_regprocedure('idem_reserve(text,text,text,jsonb,interval,interval)') IS NOT NULL")" = t ]; then
    workload="idem_reserve + INSERT + idem_complete"
    cat > "$tmp/new_request.sql" <<'SQL'
\set n random(1, 1000000000000000000)
BEGIN;
SELECT outcome FROM idem_reserve('bench', 'orders', 'new-' || :client_id || '-' || :n, jsonb_build_object('amount', :n));
INSERT INTO orders (tenant, amount) VALUES ('bench', :n);
SELECT idem_complete('bench', 'orders', 'new-' || :client_id || '-' || :n, 201, '{"ok": true}');
COMMIT;
SQL
else
    workload="INSERT key + INSERT + UPDATE key (idem_reserve not installed)"
    cat > "$tmp/new_request.sql" <<'SQL'
\set n random(1, 1000000000000000000)
BEGIN;
INSERT INTO idempotency.keys (tenant_id, scope, idem_key, fingerprint, status, lock_token, locked_at, expires_at) VALUES ('bench', 'orders', 'new-' || :client_id || '-' || :n, sha256(:n::text::bytea), 'processing', gen_random_uuid(), now(), now() + interval '1 day') ON CONFLICT DO NOTHING;
INSERT INTO orders (tenant, amount) VALUES ('bench', :n);
UPDATE idempotency.keys SET status = 'succeeded', response_code = 201, response_body = '{"ok": true}', completed_at = now() WHERE tenant_id = 'bench' AND scope = 'orders' AND idem_key = 'new-' || :client_id || '-' || :n;
COMMIT;
SQL
fi

load_expired() {
    psql_q -c "
        INSERT INTO idempotency.keys (tenant_id, scope, idem_key, fingerprint,
                                      status, locked_at, completed_at,
                                      expires_at, response_code, response_body)
        SELECT 'tenant-' || (g % 100), 'orders', 'old-$1-' || g,
               sha256(g::text::bytea), 'succeeded',
               now() - interval '2 days', now() - interval '2 days',
               now() - interval '1 day' + g * interval '1 millisecond',
               201, '{\"ok\": true}'
          FROM generate_series(1, $ROWS) g" \
           -c 'VACUUM ANALYZE idempotency.keys'
}

sizes() {
    psql_q -c "SELECT pg_size_pretty(pg_table_size('idempotency.keys')) || ' table, '
                      || pg_size_pretty(pg_indexes_size('idempotency.keys')) || ' indexes'"
}

# p99 (ms) of transactions that ended between $2 and $3 (epoch seconds,
# empty for all) in the pgbench logs with prefix $1
p99() {
    cat "$1".* | awk -v from="${2:-0}" -v to="${3:-1e12}" '
        { t = $5 + $6 / 1e6; if (t >= from && t <= to) print $3 / 1000 }' |
        sort -n | awk '{ v[NR] = $1 } END {
            if (NR == 0) { print "nan"; exit }
            i = int(NR * 0.99); if (i < 1) i = 1; printf "%.2f %d\n", v[i], NR }'
}

run_without() {
    local log=$tmp/a$1
    (cd "$tmp" && pgbench -n -c "$CLIENTS" -j "$CLIENTS" -T "$SECONDS_A" \
        --log --log-prefix="$log" -f "$tmp/new_request.sql" "$DB" >"$log.out" 2>&1)
    read -r p n < <(p99 "$log")
    tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$log.out")
    echo "  A$1 without reaping: p99 $p ms over $n transactions, $tps tps"
    P99_A+=("$p")
}

run_with() {
    local log=$tmp/b$1
    # what autovacuum does between two reaping runs: makes the pages the
    # last reaping emptied reusable
    psql_q -c 'VACUUM idempotency.keys'
    echo "  B$1 before loading: $(sizes)"
    load_expired "$1"
    echo "  B$1 loaded $ROWS expired keys: $(sizes)"
    (cd "$tmp" && pgbench -n -c "$CLIENTS" -j "$CLIENTS" -T "$SECONDS_B" \
        --log --log-prefix="$log" -f "$tmp/new_request.sql" "$DB" >"$log.out" 2>&1) &
    local bench=$!
    sleep 2
    local t0 t1
    t0=$(date +%s.%N)
    psql_q -c "$MAINTAIN"
    t1=$(date +%s.%N)
    wait $bench
    local left
    left=$(psql_q -c "SELECT count(*) FROM idempotency.keys WHERE idem_key LIKE 'old-%'")
    read -r p n < <(p99 "$log" "$t0" "$t1")
    local secs rate
    secs=$(calc "$t1 - $t0")
    rate=$(awk "BEGIN { printf \"%d\", ($ROWS - $left) / $secs }")
    echo "  B$1 reaped $((ROWS - left)) of $ROWS keys in $secs s = $rate rows/s ($left left)"
    echo "  B$1 during reaping: p99 $p ms over $n transactions"
    P99_B+=("$p")
    RATES+=("$rate")
    psql_q -c 'VACUUM idempotency.keys'
    echo "  B$1 after reaping + VACUUM: $(sizes)"
}

P99_A=()
P99_B=()
RATES=()
echo "workload: $workload; $CLIENTS clients; $ROWS expired keys per reaping run; $MAINTAIN"
echo "  baseline: $(sizes)"
run_without 1
run_with 1
run_without 2
run_with 2

for i in 0 1; do
    echo "round $((i + 1)): p99 during reaping / without = ${P99_B[$i]} / ${P99_A[$i]} ms = $(calc "${P99_B[$i]} / ${P99_A[$i]}")x (target <= 1.5x); ${RATES[$i]} rows/s"
done
pa=$(printf '%s\n' "${P99_A[@]}" | sort -n | tail -1)
pb=$(printf '%s\n' "${P99_B[@]}" | sort -n | tail -1)
echo "worst of both rounds: p99 during $pb ms, without $pa ms, ratio $(calc "$pb / $pa")x"
dropdb "$DB"
