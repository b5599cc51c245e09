#!/usr/bin/env bash
# bench/keys: the key lifecycle against the baselines, in one cluster and one
# run.  Run by bench/run.sh (as postgres, PG* set, cwd bench/keys).
#
#   new request: BEGIN; reserve; INSERT order; INSERT event; complete; COMMIT
#   new_exec:    the same as one statement: idem_execute with a handler that
#                writes the order and the event
#   new_handler: that handler called alone in one statement, without
#                idempotency (the most one statement can reach)
#   new_rated:   new request in a scope with a rate of new keys and a quota
#                of live keys per tenant (never reached: the cost of the
#                checks)
#   replay:      reserve of a completed key
#   replay_pk:   the floor of a replay: one SELECT of the same row by its
#                primary key
#   new_floor:   the business transaction with two trivial SELECTs in place
#                of reserve and complete: the same six round trips with
#                idempotency that costs nothing
#   new_keyrow:  the floor with its first SELECT replaced by a plain INSERT
#                of the finished key row into a copy of idempotency.keys
#                (key_rows): what storing a key durably costs at the least
#
# Baselines: "plpgsql" (a naive PL/pgSQL implementation, setup.sql), "sql"
# (the same statements sent as bare SQL) and, for new requests, "none" (the
# business transaction without idempotency).  Each variant runs once per
# round, ROUNDS rounds (default 4) in alternating order; a ratio is taken
# within each round, and the median of the rounds' ratios is reported with
# each round's.  New requests are measured with
# durable commits (the WAL flush of each commit dominates them) and again
# with synchronous_commit = off ("_async"), which shows the CPU cost of
# each implementation.  DURATION and CLIENTS override the defaults (5 s,
# 4 clients on 2 threads).
set -euo pipefail
cd "$(dirname "$0")"
DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-4}
CLIENTS=${CLIENTS:-4}

psql -X -q -v ON_ERROR_STOP=1 -d postgres -f setup.sql >/dev/null

# The server-side costs per call (percall.sql) are measured twice: on the
# tables as setup.sql leaves them (10,000 keys each, vacuumed), and again
# after the throughput runs below have filled them with a few hundred
# thousand rows, where finding room for a new row costs more.
percall_fresh=$(psql -X -q -At -F ' ' -d bench_keys -f percall.sql)

tps() {
    local opts=
    case $1 in *_async) opts="-c synchronous_commit=off" ;; esac
    PGOPTIONS="$opts" pgbench -n -M prepared -c "$CLIENTS" -j 2 -T "$DURATION" \
        -f "${1%_async}.sql" bench_keys 2>/dev/null |
        awk '/^tps/ {printf "%.0f", $3}'
}

declare -A tps_of
variants="new_ext new_exec new_handler new_plpgsql new_sql new_none new_floor new_keyrow replay_ext replay_plpgsql replay_sql replay_pk
          new_ext_async new_rated_async new_exec_async new_handler_async new_plpgsql_async new_sql_async new_none_async new_floor_async new_keyrow_async"
reversed=$(echo $variants | tr ' ' '\n' | tac | tr '\n' ' ')
for round in $(seq 1 "$ROUNDS"); do
    # every second round runs in reverse order, so that no variant always
    # runs first (A B ... B A A B ...)
    order=$variants
    [ $((round % 2)) = 0 ] && order=$reversed
    for v in $order; do
        tps_of[$v.$round]=$(tps "$v")
        echo "round $round  $v: ${tps_of[$v.$round]} tps"
    done
done

# the server-side costs, now that the runs have filled the tables
percall=$(psql -X -q -At -F ' ' -d bench_keys -f percall.sql)

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

# The machine is shared: a ratio is taken within a round (the two runs are
# close in time), and the median of the rounds' ratios is reported (one
# disturbed round moves a median less than a mean), with each round's.
median() { tr ' ' '\n' | sort -g | awk '{ v[NR] = $1 } END { printf "%.2f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
compare() {
    local label=$1 a=$2 b=$3 target=${4:-}
    local rs=() r
    for r in $(seq 1 "$ROUNDS"); do
        rs+=("$(ratio "${tps_of[$a.$r]}" "${tps_of[$b.$r]}")")
    done
    printf '%-58s %sx (rounds: %s)%s\n' "$label" "$(echo "${rs[*]}" | median)" \
        "$(echo "${rs[*]}" | sed 's/ /, /g')" "${target:+ target $target}"
}

echo
echo "keys: $CLIENTS clients, ${DURATION}s per run, $ROUNDS interleaved rounds, -M prepared"
printf '%-22s' "workload"
for r in $(seq 1 "$ROUNDS"); do printf ' %9s' "round $r"; done
echo
for v in $variants; do
    printf '%-22s' "$v"
    for r in $(seq 1 "$ROUNDS"); do printf ' %9s' "${tps_of[$v.$r]}"; done
    echo
done
echo
compare "new request vs naive PL/pgSQL (durable commits):" new_ext new_plpgsql ">= 1.4"
compare "new request vs bare SQL (durable commits):" new_ext new_sql ">= 1.0"
compare "idem_execute, one statement, vs naive PL/pgSQL (durable):" new_exec new_plpgsql ">= 2.0"
compare "idem_execute, one statement, vs six statements (durable):" new_exec new_ext
# the handler alone in one statement / naive PL/pgSQL is the most a
# one-statement request could reach against the naive flow on this machine
compare "ceiling: the handler alone, one statement, vs naive (durable):" new_handler new_plpgsql
compare "idem_execute vs the handler alone (durable):" new_exec new_handler
compare "new request vs no idempotency (durable commits):" new_ext new_none
# "floor": the business transaction plus two trivial statements in place of
# reserve and complete, i.e. the same six round trips with free idempotency.
# floor / naive PL/pgSQL is the most any implementation of this workload
# could reach against the naive one on this machine.
compare "ceiling: free idempotency vs naive PL/pgSQL (durable):" new_floor new_plpgsql
compare "new request vs the floor (durable commits):" new_ext new_floor ">= 0.95"
# the floor plus the key's row written by a plain INSERT: the least any
# implementation that stores the key pays; new_ext against it is the cost
# of the extension's own work (probe, lock, fingerprint, checks)
compare "  the key row alone (plain INSERT) vs the floor (durable):" new_keyrow new_floor
compare "  new request vs the floor plus the key row (durable):" new_ext new_keyrow
compare "new request vs the floor (synchronous_commit off):" new_ext_async new_floor_async
compare "  the key row alone (plain INSERT) vs the floor (async):" new_keyrow_async new_floor_async
compare "  new request vs the floor plus the key row (async):" new_ext_async new_keyrow_async
compare "new request vs naive PL/pgSQL (synchronous_commit off):" new_ext_async new_plpgsql_async
compare "new request vs bare SQL (synchronous_commit off):" new_ext_async new_sql_async
compare "new request vs no idempotency (synchronous_commit off):" new_ext_async new_none_async
compare "new request, scope with a rate and a quota, vs without (async):" new_rated_async new_ext_async ">= 0.95"
compare "idem_execute vs naive PL/pgSQL (synchronous_commit off):" new_exec_async new_plpgsql_async ">= 2.0"
compare "idem_execute vs six statements (synchronous_commit off):" new_exec_async new_ext_async
compare "ceiling: the handler alone vs naive (synchronous_commit off):" new_handler_async new_plpgsql_async
compare "idem_execute vs the handler alone (synchronous_commit off):" new_exec_async new_handler_async
compare "replay vs naive PL/pgSQL:" replay_ext replay_plpgsql ">= 1.5"
compare "replay vs bare SQL:" replay_ext replay_sql
compare "replay vs one SELECT of the row by primary key:" replay_ext replay_pk ">= 0.95"
# report_percall LABEL OUTPUT: the figures of one percall.sql run
report_percall() {
    local out=$2 pc_ext pc_plpgsql pc_nc pc_nc_plpgsql pc_new pc_rated pl_ext pl_pk
    pc_ext=$(echo "$out" | awk '$1 == "replay_ext" {print $2}')
    pc_plpgsql=$(echo "$out" | awk '$1 == "replay_plpgsql" {print $2}')
    pc_nc=$(echo "$out" | awk '$1 == "newcomplete_ext" {print $2}')
    pc_nc_plpgsql=$(echo "$out" | awk '$1 == "newcomplete_plpgsql" {print $2}')
    pc_new=$(echo "$out" | awk '$1 == "new_ext" {print $2}')
    pc_rated=$(echo "$out" | awk '$1 == "new_rated" {print $2}')
    pl_ext=$(echo "$out" | awk '$1 == "replay_planned_ext" {print $2}')
    pl_pk=$(echo "$out" | awk '$1 == "replay_planned_pk" {print $2}')
    echo
    echo "server-side costs, $1:"
    echo "replay, cost per call (50000 calls in one statement, best of 4):"
    echo "  idem_reserve ${pc_ext} us, naive PL/pgSQL ${pc_plpgsql} us: $(ratio "$pc_plpgsql" "$pc_ext")x (target >= 3.0)"
    echo "new key reserved and completed, cost per pair (2000 pairs in one statement, best of 3 after a warm-up, each side first in turn):"
    echo "  idem_reserve + idem_complete ${pc_nc} us, naive PL/pgSQL ${pc_nc_plpgsql} us: $(ratio "$pc_nc_plpgsql" "$pc_nc")x (target >= 2.0)"
    echo "new key, cost per call (2000 calls in one statement, best of 4):"
    echo "  without limits ${pc_new} us, with a rate and a quota of new keys ${pc_rated} us: $(ratio "$pc_new" "$pc_rated")x (target >= 0.95)"
    echo "replay parsed and planned on every call (a client that does not prepare; 20000 EXECUTEs, best of 4):"
    echo "  idem_reserve ${pl_ext} us, one SELECT of the row by primary key ${pl_pk} us: $(ratio "$pl_pk" "$pl_ext")x"
}
report_percall "tables as set up (10000 keys, vacuumed)" "$percall_fresh"
report_percall "after the throughput runs ($(psql -X -q -At -d bench_keys -c 'SELECT count(*) FROM idempotency.keys') keys)" "$percall"
psql -X -q -d postgres -c 'DROP DATABASE bench_keys'
