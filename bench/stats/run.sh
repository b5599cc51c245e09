#!/usr/bin/env bash
# bench/stats: idem_reserve throughput when requests come from 100,000
# tenants against 10 tenants.  With idempotency.stats_max_entries at its
# default (1000), nearly every request of the 100,000-tenant run counts a
# pair that has no entry: it takes the stats lock exclusively to insert one,
# and every 50th insert evicts the least used 5% of the table into
# "(other)".  The 10-tenant run always finds its entry under the shared
# lock.  The goal: the first within 5% of the second.
#
# Each request is one new key reserved in its own transaction (one
# statement, the cheapest call, so that the cost of counting shows), with
# synchronous_commit = off so that the WAL flush does not hide CPU costs.
# The two runs alternate (A B B A ...), several short rounds rather than
# two long ones because the machine may be shared: ratios are taken within a
# round, and the goal is checked on their median (their mean is printed
# too).  DURATION, CLIENTS and ROUNDS override the defaults (5 s, 4 clients
# on 2 threads, 6 rounds).  Runs inside pg_virtualenv as postgres
# (bench/run.sh).
set -euo pipefail
cd "$(dirname "$0")"
DURATION=${DURATION:-5}
CLIENTS=${CLIENTS:-4}
ROUNDS=${ROUNDS:-6}
DB=bench_stats

dropdb --if-exists "$DB" 2>/dev/null
createdb "$DB"
psql -X -q -v ON_ERROR_STOP=1 -d "$DB" -c 'CREATE EXTENSION idempotency'
max_entries=$(psql -X -At -d "$DB" -c 'SHOW idempotency.stats_max_entries')

tps() {
    local ntenants=$1 out
    out=$(PGOPTIONS="-c synchronous_commit=off" \
        pgbench -n -M prepared -c "$CLIENTS" -j 2 -T "$DURATION" \
            -D ntenants="$ntenants" -f reserve.sql "$DB" 2>&1)
    if echo "$out" | grep -q 'aborted'; then
        echo "stats: run with $ntenants tenants aborted:" >&2
        echo "$out" | grep -i error | head -3 >&2
        exit 1
    fi
    echo "$out" | awk '/^tps = / { printf "%.0f", $3 }'
}

# what the stats table looked like after a run
table_state() {
    psql -X -At -d "$DB" -c "
        SELECT count(*) FILTER (WHERE tenant <> '(other)') || ' pairs, '
               || coalesce(sum(created) FILTER (WHERE tenant = '(other)'), 0)
               || ' created counted under (other), '
               || sum(created) || ' created in all'
          FROM idempotency.stats"
}

declare -A tps_of
for round in $(seq 1 "$ROUNDS"); do
    order="10 100000"
    [ $((round % 2)) -eq 0 ] && order="100000 10"
    for n in $order; do
        psql -X -q -d "$DB" -c 'SELECT idem_stats_reset()' >/dev/null
        tps_of[$n.$round]=$(tps "$n")
        echo "round $round  $n tenants: ${tps_of[$n.$round]} tps  (stats: $(table_state))"
    done
done

echo
echo "stats: idem_reserve of a new key, $CLIENTS clients, ${DURATION}s per run," \
     "$ROUNDS rounds, -M prepared, synchronous_commit off," \
     "stats_max_entries $max_entries"
printf '%-8s %12s %12s %8s\n' round "10 tenants" "100,000" ratio
ratios=()
for round in $(seq 1 "$ROUNDS"); do
    r=$(awk -v a="${tps_of[100000.$round]}" -v b="${tps_of[10.$round]}" \
        'BEGIN { printf "%.3f", a / b }')
    ratios+=("$r")
    printf '%-8s %12s %12s %8s\n' "$round" "${tps_of[10.$round]}" \
        "${tps_of[100000.$round]}" "$r"
done
sorted=$(printf '%s\n' "${ratios[@]}" | sort -n)
median=$(echo "$sorted" | awk '{ v[NR] = $1 } END {
    if (NR % 2) printf "%.3f", v[(NR + 1) / 2];
    else printf "%.3f", (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
mean=$(echo "$sorted" | awk '{ s += $1 } END { printf "%.3f", s / NR }')
verdict=$(awk -v m="$median" 'BEGIN { print (m >= 0.95) ? "met" : "NOT met" }')
echo "100,000 tenants vs 10 tenants: median ${median}x, mean ${mean}x" \
     "(goal: median >= 0.95, within 5%: $verdict)"
dropdb "$DB"
