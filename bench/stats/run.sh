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
# The two runs alternate (A B B A ...), in several short rounds because the
# machine may be shared: ratios are taken within a round, and the goal is
# checked on their median.  Beside throughput, the server's CPU time per
# reserve (all server processes, from /proc) is compared the same way: it
# hardly depends on what else the machine runs.  DURATION, CLIENTS and
# ROUNDS override the defaults (5 s, 4 clients on 2 threads, 10 rounds).
# Runs inside pg_virtualenv as postgres (bench/run.sh).
set -euo pipefail
cd "$(dirname "$0")"
DURATION=${DURATION:-5}
CLIENTS=${CLIENTS:-4}
ROUNDS=${ROUNDS:-10}
DB=bench_stats

dropdb --if-exists "$DB" 2>/dev/null
createdb "$DB"
psql -X -q -v ON_ERROR_STOP=1 -d "$DB" -c 'CREATE EXTENSION idempotency'
max_entries=$(psql -X -At -d "$DB" -c 'SHOW idempotency.stats_max_entries')
datadir=$(psql -X -At -d "$DB" -c 'SHOW data_directory')
postmaster=$(head -1 "$datadir/postmaster.pid")

# CPU time (clock ticks) of the whole server so far: the postmaster with its
# exited children (cutime, cstime), plus its live children
server_ticks() {
    local total=0 p t
    for p in "$postmaster" $(pgrep -P "$postmaster"); do
        # after "pid (comm) ", utime is field 12, stime 13, cutime 14, cstime 15
        t=$(awk -v pm="$([ "$p" = "$postmaster" ] && echo 1)" '{
                sub(/^.*\) /, "");
                print $12 + $13 + (pm ? $14 + $15 : 0) }' "/proc/$p/stat" 2>/dev/null) || continue
        total=$((total + ${t:-0}))
    done
    echo "$total"
}

# one run: "tps cpu_us_per_reserve"
run() {
    local ntenants=$1 out before after n
    before=$(server_ticks)
    out=$(PGOPTIONS="-c synchronous_commit=off" \
        pgbench -n -M prepared -c "$CLIENTS" -j 2 -T "$DURATION" \
            -D ntenants="$ntenants" -f reserve.sql "$DB" 2>&1)
    if echo "$out" | grep -q 'aborted'; then
        echo "stats: run with $ntenants tenants aborted:" >&2
        echo "$out" | grep -i error | head -3 >&2
        exit 1
    fi
    # the backends' time reaches the postmaster's cutime once they are reaped
    while [ "$(psql -X -At -d "$DB" -c "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgbench'")" != 0 ]; do
        sleep 0.1
    done
    after=$(server_ticks)
    n=$(echo "$out" | awk '/^number of transactions actually processed/ { print $NF }')
    echo "$out" | awk -v ticks=$((after - before)) -v hz="$(getconf CLK_TCK)" -v n="$n" \
        '/^tps = / { printf "%.0f %.1f", $3, ticks * 1e6 / hz / n }'
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

declare -A tps_of cpu_of
for round in $(seq 1 "$ROUNDS"); do
    order="10 100000"
    [ $((round % 2)) -eq 0 ] && order="100000 10"
    for n in $order; do
        psql -X -q -d "$DB" -c 'SELECT idem_stats_reset()' >/dev/null
        read -r tps_of[$n.$round] cpu_of[$n.$round] <<<"$(run "$n")"
        echo "round $round  $n tenants: ${tps_of[$n.$round]} tps," \
             "${cpu_of[$n.$round]} us server CPU per reserve  (stats: $(table_state))"
    done
done

median() {
    sort -n | awk '{ v[NR] = $1 } END {
        if (NR % 2) printf "%.3f", v[(NR + 1) / 2];
        else printf "%.3f", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

echo
echo "stats: idem_reserve of a new key, $CLIENTS clients, ${DURATION}s per run," \
     "$ROUNDS rounds, -M prepared, synchronous_commit off," \
     "stats_max_entries $max_entries"
printf '%-6s %10s %10s %8s   %14s %14s %8s\n' round "tps 10" "100,000" ratio \
    "CPU us/res 10" "100,000" ratio
tps_ratios=()
cpu_ratios=()
for round in $(seq 1 "$ROUNDS"); do
    rt=$(awk -v a="${tps_of[100000.$round]}" -v b="${tps_of[10.$round]}" \
        'BEGIN { printf "%.3f", a / b }')
    rc=$(awk -v a="${cpu_of[100000.$round]}" -v b="${cpu_of[10.$round]}" \
        'BEGIN { printf "%.3f", a / b }')
    tps_ratios+=("$rt")
    cpu_ratios+=("$rc")
    printf '%-6s %10s %10s %8s   %14s %14s %8s\n' "$round" \
        "${tps_of[10.$round]}" "${tps_of[100000.$round]}" "$rt" \
        "${cpu_of[10.$round]}" "${cpu_of[100000.$round]}" "$rc"
done
tps_median=$(printf '%s\n' "${tps_ratios[@]}" | median)
cpu_median=$(printf '%s\n' "${cpu_ratios[@]}" | median)
verdict=$(awk -v m="$tps_median" 'BEGIN { print (m >= 0.95) ? "met" : "NOT met" }')
echo "throughput, 100,000 tenants vs 10: median ${tps_median}x" \
     "(goal >= 0.95, within 5%: $verdict)"
echo "server CPU per reserve, 100,000 tenants vs 10: median ${cpu_median}x" \
     "(1.00 = counting costs the same)"
dropdb "$DB"
