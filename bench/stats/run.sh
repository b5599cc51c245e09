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
#
# The number of tenants changes more than the stats table (the keys'
# primary key, for one), so the same two workloads also run on a control
# server that does not preload the library, and therefore counts nothing:
# it shows what 100,000 tenants cost without any counting, and the ratio of
# the two servers at 100,000 tenants is what the stats table costs there.
# The control server is started here with the main server's settings, but
# without this library in shared_preload_libraries.  The four runs of a round alternate (the order
# reverses every other round); ratios are taken within a round and their
# median over the rounds is reported, because the machine may be shared.
# DURATION, CLIENTS and ROUNDS override the defaults (4 s, 4 clients on 2
# threads, 10 rounds).  Runs inside pg_virtualenv as postgres
# (bench/run.sh).
set -euo pipefail
cd "$(dirname "$0")"
DURATION=${DURATION:-4}
CLIENTS=${CLIENTS:-4}
ROUNDS=${ROUNDS:-10}
DB=bench_stats

setting() { psql -X -At -d postgres -c "SHOW $1"; }

dropdb --if-exists "$DB" 2>/dev/null
createdb "$DB"
psql -X -q -v ON_ERROR_STOP=1 -d "$DB" -c 'CREATE EXTENSION idempotency'
max_entries=$(setting idempotency.stats_max_entries)

# the control server: the main server's settings, without this library
ctl=$(mktemp -d /tmp/bench_stats.XXXXXX)
cleanup() {
    pg_ctl -D "$ctl/data" -m immediate -w stop >/dev/null 2>&1 || true
    rm -rf "$ctl"
}
trap cleanup EXIT
initdb -D "$ctl/data" -A trust -E UTF8 >/dev/null
ctl_port=$(( $(setting port) + 1 ))	# names the socket in $ctl only
{
    psql -X -At -d postgres -c "
        SELECT pg_catalog.format('%s = %L', name, setting)
          FROM pg_catalog.pg_settings
         WHERE source = 'configuration file'
           AND name NOT IN ('port', 'unix_socket_directories', 'listen_addresses',
                            'data_directory', 'hba_file', 'ident_file',
                            'external_pid_file', 'cluster_name',
                            'shared_preload_libraries')"
    echo "port = $ctl_port"
    echo "unix_socket_directories = '$ctl'"
    echo "listen_addresses = ''"
    echo "shared_preload_libraries = '$(setting shared_preload_libraries |
        tr ',' '\n' | tr -d ' ' | grep -vx idempotency | paste -sd, -)'"
} >> "$ctl/data/postgresql.conf"
pg_ctl -D "$ctl/data" -l "$ctl/log" -w start >/dev/null
PGHOST=$ctl PGPORT=$ctl_port createdb "$DB"
PGHOST=$ctl PGPORT=$ctl_port psql -X -q -v ON_ERROR_STOP=1 -d "$DB" \
    -c 'CREATE EXTENSION idempotency'

# one run: its tps.  $1: "stats" (the main server) or "none" (the control)
run() {
    local server=$1 ntenants=$2 out
    local -a env=()
    [ "$server" = none ] && env=(PGHOST="$ctl" PGPORT="$ctl_port")
    out=$(env "${env[@]}" PGOPTIONS="-c synchronous_commit=off" \
        pgbench -n -M prepared -c "$CLIENTS" -j 2 -T "$DURATION" \
            -D ntenants="$ntenants" -f reserve.sql "$DB" 2>&1)
    if echo "$out" | grep -q 'aborted'; then
        echo "stats: run with $ntenants tenants ($server) aborted:" >&2
        echo "$out" | grep -i error | head -3 >&2
        exit 1
    fi
    echo "$out" | awk '/^tps = / { printf "%.0f", $3 }'
}

# what the stats table looked like after a run
table_state() {
    psql -X -At -d "$DB" -c "
        SELECT count(*) FILTER (WHERE tenant <> '(other)') || ' rows, '
               || coalesce(sum(created) FILTER (WHERE tenant = '(other)'), 0)
               || ' of ' || sum(created) || ' created counted under (other)'
          FROM idempotency.stats"
}

declare -A tps
runs="stats.10 stats.100000 none.100000 none.10"
reversed="none.10 none.100000 stats.100000 stats.10"
for round in $(seq 1 "$ROUNDS"); do
    order=$runs
    [ $((round % 2)) -eq 0 ] && order=$reversed
    line="round $round:"
    for r in $order; do
        [ "${r%%.*}" = stats ] &&
            psql -X -q -d "$DB" -c 'SELECT idem_stats_reset()' >/dev/null
        tps[$r.$round]=$(run "${r%%.*}" "${r#*.}")
        line="$line  $r ${tps[$r.$round]}"
        if [ "$r" = stats.100000 ]; then
            line="$line ($(table_state))"
        fi
    done
    echo "$line"
done

median() {
    sort -n | awk '{ v[NR] = $1 } END {
        if (NR % 2) printf "%.3f", v[(NR + 1) / 2];
        else printf "%.3f", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
# median over the rounds of tps[$1] / tps[$2]
median_ratio() {
    local round
    for round in $(seq 1 "$ROUNDS"); do
        awk -v a="${tps[$1.$round]}" -v b="${tps[$2.$round]}" \
            'BEGIN { printf "%.3f\n", a / b }'
    done | median
}
median_tps() {
    local round
    for round in $(seq 1 "$ROUNDS"); do echo "${tps[$1.$round]}"; done |
        median | awk '{ printf "%.0f", $1 }'
}

echo
echo "stats: idem_reserve of a new key, $CLIENTS clients, ${DURATION}s per run," \
     "$ROUNDS rounds, -M prepared, synchronous_commit off," \
     "stats_max_entries $max_entries; medians over the rounds"
printf '%-38s %12s %16s %8s\n' "" "10 tenants" "100,000 tenants" ratio
printf '%-38s %12s %16s %8s\n' "with the stats table (tps)" \
    "$(median_tps stats.10)" "$(median_tps stats.100000)" \
    "$(median_ratio stats.100000 stats.10)"
printf '%-38s %12s %16s %8s\n' "control, counting nothing (tps)" \
    "$(median_tps none.10)" "$(median_tps none.100000)" \
    "$(median_ratio none.100000 none.10)"
goal=$(median_ratio stats.100000 stats.10)
echo "100,000 tenants vs 10, with the stats table: ${goal}x" \
     "(goal >= 0.95, within 5%:" \
     "$(awk -v m="$goal" 'BEGIN { print (m >= 0.95) ? "met)" : "NOT met)" }')"
control=$(median_ratio none.100000 none.10)
echo "the same without counting (control): ${control}x; what the stats" \
     "table's churn adds: $(awk -v a="$goal" -v b="$control" \
        'BEGIN { printf "%.3f", a / b }')x"
dropdb "$DB"
PGHOST=$ctl PGPORT=$ctl_port dropdb "$DB"
