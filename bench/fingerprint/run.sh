#!/usr/bin/env bash
# Fingerprint benchmark: idem_fingerprint(body) against
# digest(body::text, 'sha256') (pgcrypto; not even canonical) on a ~1 KiB
# and a ~100 KiB order body.  Run by bench/run.sh inside a throwaway
# cluster (PG* set, cwd bench/fingerprint).
#
# Two measurements, each side three times, interleaved (A B A B A B), the
# median of each side compared (other load on a shared machine only ever
# slows a run down, and the median discards one such run per side):
#  - pgbench, one client, SELECT fn(body) FROM a one-row table; for the
#    1 KiB body 50 calls per statement (generate_series), or the round trip
#    of a statement would hide the functions' cost; reported as calls/s;
#  - a PL/pgSQL loop over a value held in memory: the functions alone.
# Ratio = idem_fingerprint rate / digest rate (above 1.0: fingerprint faster).
set -euo pipefail
DB=bench_fingerprint
T=${BENCH_SECONDS:-10}
N_SMALL=${BENCH_LOOP_SMALL:-100000}
N_LARGE=${BENCH_LOOP_LARGE:-1500}

dropdb --if-exists "$DB" 2>/dev/null || true
createdb "$DB"
psql -X -q -v ON_ERROR_STOP=1 -d "$DB" -c 'CREATE EXTENSION idempotency' \
    -c 'CREATE EXTENSION pgcrypto'
psql -X -q -v ON_ERROR_STOP=1 -d "$DB" -f setup.sql

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
REPS=(0 50 1)                   # calls per statement, by body id
for id in 1 2; do
    echo "SELECT count(idem_fingerprint(body)) FROM bench_body, generate_series(1, ${REPS[$id]}) WHERE id = $id;" \
        > "$tmp/fingerprint_$id.sql"
    echo "SELECT count(digest(body::text, 'sha256')) FROM bench_body, generate_series(1, ${REPS[$id]}) WHERE id = $id;" \
        > "$tmp/digest_$id.sql"
done

# calls per second: transactions per second times calls per statement
tps() {
    pgbench -n -M prepared -c 1 -j 1 -T "$T" -f "$1" "$DB" 2>&1 |
        awk -v reps="$2" '/^tps/ { printf "%.1f\n", $3 * reps; exit }'
}
loop() {
    psql -X -qAt -d "$DB" -c "SELECT round(bench_loop('$1', $2, $3)::numeric, 1)"
}
ratio() {
    awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'
}
median() {
    printf '%s\n' "$@" | sort -g | sed -n 2p
}

for id in 1 2; do
    size=$([ $id -eq 1 ] && echo "1 KiB" || echo "100 KiB")
    n=$([ $id -eq 1 ] && echo "$N_SMALL" || echo "$N_LARGE")

    f=(); d=()
    for r in 1 2 3; do
        f+=("$(tps "$tmp/fingerprint_$id.sql" "${REPS[$id]}")")
        d+=("$(tps "$tmp/digest_$id.sql" "${REPS[$id]}")")
    done
    fm=$(median "${f[@]}"); dm=$(median "${d[@]}")
    echo "pgbench $size body (${T}s runs, ${REPS[$id]} calls per statement, calls/s): idem_fingerprint ${f[*]} (median $fm)," \
         "digest(body::text) ${d[*]} (median $dm): ratio $(ratio "$fm" "$dm")"

    f=(); d=()
    for r in 1 2 3; do
        f+=("$(loop fingerprint $id "$n")"); d+=("$(loop digest $id "$n")")
    done
    fm=$(median "${f[@]}"); dm=$(median "${d[@]}")
    echo "loop    $size body ($n calls, calls/s): idem_fingerprint ${f[*]} (median $fm)," \
         "digest(body::text) ${d[*]} (median $dm): ratio $(ratio "$fm" "$dm")"
done

dropdb "$DB"
