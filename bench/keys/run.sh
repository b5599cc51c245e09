#!/usr/bin/env bash
# bench/keys: the key lifecycle against the baselines, in one cluster and one
# run.  Run by bench/run.sh (as postgres, PG* set, cwd bench/keys).
#
#   new request: BEGIN; reserve; INSERT order; INSERT event; complete; COMMIT
#   replay:      reserve of a completed key
#
# Baselines: "plpgsql" (a naive PL/pgSQL implementation, setup.sql), "sql"
# (the same statements sent as bare SQL) and, for new requests, "none" (the
# business transaction without idempotency).  Each variant runs twice,
# interleaved, and the better run counts.  New requests are measured with
# durable commits (the WAL flush of each commit dominates them) and again
# with synchronous_commit = off ("_async"), which shows the CPU cost of
# each implementation.  DURATION and CLIENTS override the defaults (10 s,
# 4 clients on 2 threads).
set -euo pipefail
cd "$(dirname "$0")"
DURATION=${DURATION:-10}
CLIENTS=${CLIENTS:-4}

psql -X -q -v ON_ERROR_STOP=1 -d postgres -f setup.sql >/dev/null

tps() {
    local opts=
    case $1 in *_async) opts="-c synchronous_commit=off" ;; esac
    PGOPTIONS="$opts" pgbench -n -M prepared -c "$CLIENTS" -j 2 -T "$DURATION" \
        -f "${1%_async}.sql" bench_keys 2>/dev/null |
        awk '/^tps/ {printf "%.0f", $3}'
}

declare -A best
variants="new_ext new_plpgsql new_sql new_none replay_ext replay_plpgsql replay_sql
          new_ext_async new_plpgsql_async new_sql_async new_none_async"
for round in 1 2; do
    for v in $variants; do
        t=$(tps "$v")
        echo "round $round  $v: $t tps"
        if [ -z "${best[$v]:-}" ] || [ "$t" -gt "${best[$v]}" ]; then
            best[$v]=$t
        fi
    done
done

# the server-side cost of a replay call, without the client round trip
percall=$(psql -X -q -At -F ' ' -d bench_keys -f percall.sql)
pc_ext=$(echo "$percall" | awk '$1 == "replay_ext" {print $2}')
pc_plpgsql=$(echo "$percall" | awk '$1 == "replay_plpgsql" {print $2}')

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
echo
echo "keys: $CLIENTS clients, ${DURATION}s per run, best of 2, -M prepared"
printf '%-40s %10s\n' "workload" "tps"
for v in $variants; do printf '%-40s %10s\n' "$v" "${best[$v]}"; done
echo
echo "new request, idem_reserve + idem_complete vs naive PL/pgSQL: $(ratio "${best[new_ext]}" "${best[new_plpgsql]}")x (target >= 1.4)"
echo "new request, idem_reserve + idem_complete vs bare SQL:       $(ratio "${best[new_ext]}" "${best[new_sql]}")x (target >= 1.0)"
echo "new request, idem_reserve + idem_complete vs no idempotency: $(ratio "${best[new_ext]}" "${best[new_none]}")x"
echo "new request, synchronous_commit = off, vs naive PL/pgSQL:    $(ratio "${best[new_ext_async]}" "${best[new_plpgsql_async]}")x"
echo "new request, synchronous_commit = off, vs bare SQL:          $(ratio "${best[new_ext_async]}" "${best[new_sql_async]}")x"
echo "new request, synchronous_commit = off, vs no idempotency:    $(ratio "${best[new_ext_async]}" "${best[new_none_async]}")x"
echo "replay, idem_reserve vs naive PL/pgSQL:                      $(ratio "${best[replay_ext]}" "${best[replay_plpgsql]}")x (target >= 1.5)"
echo "replay, idem_reserve vs bare SQL:                            $(ratio "${best[replay_ext]}" "${best[replay_sql]}")x"
echo
echo "replay, server-side cost per call (50000 calls in one statement, best of 2):"
echo "  idem_reserve ${pc_ext} us, naive PL/pgSQL ${pc_plpgsql} us: $(ratio "$pc_plpgsql" "$pc_ext")x"
psql -X -q -d postgres -c 'DROP DATABASE bench_keys'
