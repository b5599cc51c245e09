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
# interleaved, and the better run counts.  DURATION and CLIENTS override the
# defaults (10 s, 4 clients on 2 threads).
set -euo pipefail
cd "$(dirname "$0")"
DURATION=${DURATION:-10}
CLIENTS=${CLIENTS:-4}

psql -X -q -v ON_ERROR_STOP=1 -d postgres -f setup.sql >/dev/null

tps() {
    pgbench -n -M prepared -c "$CLIENTS" -j 2 -T "$DURATION" -f "$1.sql" bench_keys 2>/dev/null |
        awk '/^tps/ {printf "%.0f", $3}'
}

declare -A best
variants="new_ext new_plpgsql new_sql new_none replay_ext replay_plpgsql replay_sql"
for round in 1 2; do
    for v in $variants; do
        t=$(tps "$v")
        echo "round $round  $v: $t tps"
        if [ -z "${best[$v]:-}" ] || [ "$t" -gt "${best[$v]}" ]; then
            best[$v]=$t
        fi
    done
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
echo
echo "keys: $CLIENTS clients, ${DURATION}s per run, best of 2, -M prepared, durable commits"
printf '%-40s %10s\n' "workload" "tps"
for v in $variants; do printf '%-40s %10s\n' "$v" "${best[$v]}"; done
echo
echo "new request, idem_reserve + idem_complete vs naive PL/pgSQL: $(ratio "${best[new_ext]}" "${best[new_plpgsql]}")x (target >= 1.4)"
echo "new request, idem_reserve + idem_complete vs bare SQL:       $(ratio "${best[new_ext]}" "${best[new_sql]}")x (target >= 1.0)"
echo "new request, idem_reserve + idem_complete vs no idempotency: $(ratio "${best[new_ext]}" "${best[new_none]}")x"
echo "replay, idem_reserve vs naive PL/pgSQL:                      $(ratio "${best[replay_ext]}" "${best[replay_plpgsql]}")x (target >= 1.5)"
echo "replay, idem_reserve vs bare SQL:                            $(ratio "${best[replay_ext]}" "${best[replay_sql]}")x"
psql -X -q -d postgres -c 'DROP DATABASE bench_keys'
