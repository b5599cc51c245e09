#!/usr/bin/env bash
# bench/maint: the keys table at scale.  Fills a database with KEYS keys
# (10 million by default) and another with SMALL_KEYS (10,000), the same mix
# in both: 50 tenants, 4 scopes, 70% finished and live (one in ten of them
# failed), 30% finished and expired, one key in 100,000 in flight.  Then:
#
#   1. new-request and replay throughput in the large database against the
#      small one (pgbench, two interleaved rounds, ratios within a round),
#      and a plain SELECT of a key's row by primary key likewise: the
#      share of the difference that is PostgreSQL's own; for new requests,
#      ../keys/new_keyrow.sql likewise (the business transaction and a
#      plain INSERT of the key's row into key_rows, a copy of
#      idempotency.keys holding the same keys): what a larger primary key
#      costs any implementation that stores its keys;
#   2. the sweeper's cost per run with those keys in flight: the scheduled
#      sweep (idem_sweep(), one slice of the table) against a sweep of the
#      whole table (idem_sweep(older_than), what every run did before),
#      in heap blocks read and milliseconds;
#   3. the reaper: CALL idem_maintain(...) reaping the expired millions
#      while pgbench runs the new-request workload, with a stretch without
#      reaping before and after; reports rows reaped per second, and p50,
#      p99, p99.9, the slowest request and the worst second's p99 before,
#      while and after reaping, and draws p50/p99 per second with the
#      reaping marked (gnuplot) into ../results/maint-latency.png.
#
# Run by bench/run.sh (as postgres, PG* set, cwd bench/maint).  Settings:
# KEYS, SMALL_KEYS, CLIENTS and DURATION (throughput runs), REAP_CLIENTS,
# REAP_SECONDS (time budget of idem_maintain), QUIET_SECONDS (without
# reaping, before and after), MAINTAIN (the statement that reaps),
# REAPER_PGOPTIONS (PGOPTIONS of the reaping session only, e.g.
# "-c backend_flush_after=256kB"), FILL_JOBS (parallel fill sessions),
# BENCH_RESULTS (where the picture and its data go; ../results).
# A quick run: KEYS=1000000 REAP_SECONDS=30.
set -euo pipefail
cd "$(dirname "$0")"

KEYS=${KEYS:-10000000}
SMALL_KEYS=${SMALL_KEYS:-10000}
CLIENTS=${CLIENTS:-4}
DURATION=${DURATION:-10}
REAP_CLIENTS=${REAP_CLIENTS:-2}
REAP_SECONDS=${REAP_SECONDS:-150}
QUIET_SECONDS=${QUIET_SECONDS:-20}
MAINTAIN=${MAINTAIN:-"CALL idem_maintain('$REAP_SECONDS seconds')"}
FILL_JOBS=${FILL_JOBS:-2}
CHUNK=${CHUNK:-500000}
BIG=bench_maint_big
SMALL=bench_maint_small
RESULTS=${BENCH_RESULTS:-$(cd .. && pwd)/results}
KEYS_DIR=$(cd ../keys && pwd)
mkdir -p "$RESULTS"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
psql_q() { local db=$1; shift; psql -X -q -At -v ON_ERROR_STOP=1 -d "$db" "$@"; }
calc() { awk "BEGIN { printf \"%.2f\", $1 }"; }
now() { date +%s.%N; }

# The request body every key was reserved with (its fingerprint is stored).
BODY='{"customer": "cus_42", "amount": 19.99, "currency": "EUR", "items": [{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}]}'
SCOPES="ARRAY['orders', 'payments', 'refunds', 'signups']"

create_db() {
    dropdb --if-exists "$1" >/dev/null
    createdb "$1"
    psql_q "$1" -c 'CREATE EXTENSION idempotency' \
        -c 'CREATE TABLE orders (id bigserial PRIMARY KEY, customer text NOT NULL,
                                 amount numeric NOT NULL,
                                 created_at timestamptz NOT NULL DEFAULT now())' \
        -c 'CREATE TABLE events (id bigserial PRIMARY KEY, topic text NOT NULL,
                                 payload jsonb NOT NULL,
                                 created_at timestamptz NOT NULL DEFAULT now())' \
        -c 'CREATE TABLE key_rows (LIKE idempotency.keys INCLUDING DEFAULTS
                                   INCLUDING INDEXES INCLUDING STORAGE)
                WITH (fillfactor = 70)'
}

# Keys g = lo .. hi.  Key g: tenant g % 50, scope g % 4; g % 10 < 3 expired
# (up to a day ago), else live (expiring within a day), g % 10 = 9 failed
# (422); g % 100000 = 1 in flight (processing, locked now).
fill_range() {
    psql_q "$1" -c "
        INSERT INTO idempotency.keys (tenant_id, scope, idem_key, fingerprint,
                                      status, lock_token, locked_at,
                                      response_code, response_body,
                                      created_at, completed_at, expires_at)
        SELECT 'tenant-' || (g % 50), ($SCOPES)[g % 4 + 1], 'k-' || g, f.fp,
               CASE WHEN inflight THEN 'processing'
                    WHEN g % 10 = 9 THEN 'failed'
                    ELSE 'succeeded' END::idempotency.status,
               gen_random_uuid(),
               CASE WHEN inflight THEN now() ELSE exp - interval '1 day' END,
               CASE WHEN inflight THEN NULL WHEN g % 10 = 9 THEN 422 ELSE 201 END,
               CASE WHEN inflight THEN NULL
                    ELSE jsonb_build_object('id', g, 'status', 'paid') END,
               CASE WHEN inflight THEN now() ELSE exp - interval '1 day' END,
               CASE WHEN inflight THEN NULL
                    ELSE exp - interval '1 day' + interval '40 milliseconds' END,
               CASE WHEN inflight THEN now() + interval '1 day' ELSE exp END
          FROM (SELECT idem_fingerprint('$BODY'::jsonb) AS fp) f,
               generate_series($2::bigint, $3::bigint) g,
               LATERAL (SELECT g % 100000 = 1 AS inflight,
                               CASE WHEN g % 10 < 3
                                    THEN now() - interval '1 minute'
                                         - (g * 7919 % 86400) * interval '1 second'
                                    ELSE now() + interval '1 hour'
                                         + (g * 7919 % 82800) * interval '1 second'
                               END AS exp) x"
}

fill() {
    local db=$1 total=$2 started done_rows=0 shown=0 j
    started=$(now)
    echo "filling $db with $total keys ($FILL_JOBS sessions, $CHUNK keys per statement)"
    # chunk i goes to session i % FILL_JOBS; each session prints its chunks
    for ((j = 0; j < FILL_JOBS; j++)); do
        (
            local lo
            for ((lo = 1 + j * CHUNK; lo <= total; lo += FILL_JOBS * CHUNK)); do
                local hi=$((lo + CHUNK - 1))
                [ "$hi" -gt "$total" ] && hi=$total
                fill_range "$db" "$lo" "$hi"
                echo "$hi" >> "$tmp/fill.$db"
            done
        ) &
    done
    while [ "$(jobs -rp | wc -l)" -gt 0 ]; do
        sleep 5
        done_rows=0
        [ -f "$tmp/fill.$db" ] && done_rows=$(($(wc -l < "$tmp/fill.$db") * CHUNK))
        [ "$done_rows" -gt "$total" ] && done_rows=$total
        if [ "$done_rows" -gt "$shown" ]; then
            echo "  $db: $done_rows of $total keys, $(calc "$done_rows / ($(now) - $started)") keys/s"
            shown=$done_rows
        fi
    done
    wait
    local got
    got=$(psql_q "$db" -c "SELECT count(*) FROM idempotency.keys")
    if [ "$got" != "$total" ]; then
        echo "filling $db failed: $got keys instead of $total" >&2
        exit 1
    fi
    echo "  $db: $total keys in $(calc "$(now) - $started") s; VACUUM ANALYZE (as autovacuum would)"
    # the same keys in key_rows, the baseline's copy of the table
    psql_q "$db" -c 'INSERT INTO key_rows SELECT * FROM idempotency.keys'
    psql_q "$db" -c 'VACUUM (ANALYZE) idempotency.keys' -c 'VACUUM (ANALYZE) key_rows' -c 'CHECKPOINT'
    echo "  $db: $(sizes "$db"), done after $(calc "$(now) - $started") s"
}

sizes() {
    psql_q "$1" -c "SELECT pg_size_pretty(pg_table_size('idempotency.keys')) || ' table ('
                      || pg_relation_size('idempotency.keys') / current_setting('block_size')::int
                      || ' pages), ' || pg_size_pretty(pg_indexes_size('idempotency.keys'))
                      || ' indexes'"
}

# replay of a random live key of the table (g % 10 in 3 .. 9)
cat > "$tmp/replay.sql" <<SQL
\\set k 10 * random(0, :nkeys / 10 - 1) + random(3, 9)
SELECT outcome, response_code, response_body FROM idem_reserve('tenant-' || (:k % 50), ($SCOPES)[:k % 4 + 1], 'k-' || :k, '$BODY'::jsonb);
SQL

# the same row by primary key in plain SQL: what a larger table costs
# PostgreSQL itself (more index levels, fewer cache hits)
cat > "$tmp/select.sql" <<SQL
\\set k 10 * random(0, :nkeys / 10 - 1) + random(3, 9)
SELECT status, response_code, response_body FROM idempotency.keys WHERE tenant_id = 'tenant-' || (:k % 50) AND scope = ($SCOPES)[:k % 4 + 1] AND idem_key = 'k-' || :k;
SQL

tps() {
    local db=$1 script=$2 nkeys=$3 opts=${4:-}
    PGOPTIONS="$opts" pgbench -n -M prepared -c "$CLIENTS" -j 2 -T "$DURATION" \
        -D nkeys="$nkeys" -f "$script" "$db" 2>/dev/null |
        awk '/^tps/ {printf "%.0f", $3}'
}

echo "bench/maint: $KEYS keys against $SMALL_KEYS, $(nproc) cores, $(df -h --output=avail . | tail -1 | tr -d ' ') free on disk"
create_db "$SMALL"
create_db "$BIG"
fill "$SMALL" "$SMALL_KEYS"
fill "$BIG" "$KEYS"

# every replay must be a replay: the fill matches what idem_reserve stores
for db in "$SMALL" "$BIG"; do
    n=$([ "$db" = "$BIG" ] && echo "$KEYS" || echo "$SMALL_KEYS")
    check=$(psql_q "$db" -c "
        SELECT string_agg(outcome || ' ' || c, ', ') FROM (
            SELECT r.outcome, count(*) AS c
              FROM generate_series(1, 200) i,
                   LATERAL (SELECT 10 * (random() * ($n / 10 - 1) + 0 * i)::int + 3 + (random() * 6)::int AS k) x,
                   LATERAL idem_reserve('tenant-' || (x.k % 50), ($SCOPES)[x.k % 4 + 1],
                                        'k-' || x.k, '$BODY'::jsonb) r
             GROUP BY 1) s")
    echo "  $db: 200 sample reserves of live keys: $check"
    case $check in "replay 200") ;; *) echo "the fill does not replay" >&2; exit 1 ;; esac
done

################ 1. throughput, large against small
echo
echo "1. throughput: $CLIENTS clients, ${DURATION}s per run, -M prepared, two rounds (small large, large small)"
declare -A T
for round in 1 2; do
    order="$SMALL $BIG"
    [ "$round" = 2 ] && order="$BIG $SMALL"
    for db in $order; do
        n=$([ "$db" = "$BIG" ] && echo "$KEYS" || echo "$SMALL_KEYS")
        T[new.$db.$round]=$(tps "$db" ../keys/new_ext.sql "$n")
        T[new_async.$db.$round]=$(tps "$db" ../keys/new_ext.sql "$n" "-c synchronous_commit=off")
        T[keyrow.$db.$round]=$(tps "$db" ../keys/new_keyrow.sql "$n")
        T[keyrow_async.$db.$round]=$(tps "$db" ../keys/new_keyrow.sql "$n" "-c synchronous_commit=off")
        T[replay.$db.$round]=$(tps "$db" "$tmp/replay.sql" "$n")
        T[select.$db.$round]=$(tps "$db" "$tmp/select.sql" "$n")
        echo "  round $round $db: new ${T[new.$db.$round]} tps, new (synchronous_commit off) ${T[new_async.$db.$round]} tps, key row by plain INSERT ${T[keyrow.$db.$round]} / ${T[keyrow_async.$db.$round]} tps (durable / off), replay ${T[replay.$db.$round]} tps, plain SELECT by primary key ${T[select.$db.$round]} tps"
    done
done
for w in new new_async keyrow keyrow_async replay select; do
    r1=$(calc "${T[$w.$BIG.1]} / ${T[$w.$SMALL.1]}")
    r2=$(calc "${T[$w.$BIG.2]} / ${T[$w.$SMALL.2]}")
    goal="target >= 0.90"
    case $w in select|keyrow*) goal="(PostgreSQL alone, for reference)" ;; esac
    printf '  %-52s %sx (rounds %s, %s) %s\n' \
        "$w: $KEYS keys against $SMALL_KEYS:" "$(calc "($r1 + $r2) / 2")" "$r1" "$r2" "$goal"
done

################ 2. the sweeper
echo
inflight_keys="SELECT 'tenant-' || (g % 50), ($SCOPES)[g % 4 + 1], 'k-' || g
                 FROM generate_series(1, $KEYS, 100000) g"
# the in-flight keys are live attempts: locked just now
psql_q "$BIG" -c "UPDATE idempotency.keys SET locked_at = now(), needs_reconciliation = false
                   WHERE (tenant_id, scope, idem_key) IN ($inflight_keys)"
inflight=$(psql_q "$BIG" -c "SELECT count(*) FROM idempotency.keys
                              WHERE (tenant_id, scope, idem_key) IN ($inflight_keys)
                                AND status = 'processing'")
pages=$(psql_q "$BIG" -c "SELECT pg_relation_size('idempotency.keys') / current_setting('block_size')::int")
per_run=$(psql_q "$BIG" -c "SELECT pages_per_run FROM idempotency.sweep_state")
echo "2. sweeper: $inflight keys in flight among $KEYS ($pages pages); a scheduled run reads $per_run pages"
# one sweep in a fresh session: heap blocks of the keys table it read, ms
sweep_cost() {
    psql -X -q -At -F ' ' -v ON_ERROR_STOP=1 -d "$BIG" <<SQL | tail -1
BEGIN;
SELECT clock_timestamp() AS t0 \\gset
SELECT $1 AS flagged \\gset
SELECT :flagged, pg_stat_get_xact_blocks_fetched('idempotency.keys'::regclass),
       pg_stat_get_xact_blocks_fetched('idempotency.keys'::regclass)
       - pg_stat_get_xact_blocks_hit('idempotency.keys'::regclass),
       round(extract(epoch FROM clock_timestamp() - :'t0') * 1000, 1);
COMMIT;
SQL
}
SLICE_MS=() SLICE_BLOCKS=() FULL_MS=() FULL_BLOCKS=()
for label in "whole table (idem_sweep('1 hour'), every run before):idem_sweep('1 hour')" \
             "scheduled run (idem_sweep(), one slice):idem_sweep()"; do
    call=${label##*:}
    for i in 1 2 3; do
        read -r flagged blocks misses ms < <(sweep_cost "$call")
        echo "  ${label%%:*} run $i: $blocks blocks ($misses not in shared buffers), $ms ms, $flagged flagged"
        [ "$call" = "idem_sweep()" ] && SLICE_MS+=("$ms") && SLICE_BLOCKS+=("$blocks")
        [ "$call" != "idem_sweep()" ] && FULL_MS+=("$ms") && FULL_BLOCKS+=("$blocks")
    done
done
echo "  a scheduled run reads ${SLICE_BLOCKS[1]} blocks in ${SLICE_MS[1]} ms against ${FULL_BLOCKS[1]} blocks in ${FULL_MS[1]} ms for the whole table (second runs); $(( (pages + per_run - 1) / per_run )) runs go round the table"

################ 3. the reaper under load, and the picture
echo
expired=$(psql_q "$BIG" -c "SELECT count(*) FROM idempotency.keys WHERE expires_at < now()")
echo "3. reaper: $expired expired keys; $REAP_CLIENTS pgbench clients run new requests (durable commits) for ${QUIET_SECONDS}s, then during '$MAINTAIN', then ${QUIET_SECONDS}s more"
reaped_so_far() { psql_q "$BIG" -c "SELECT coalesce(sum(reaped), 0) FROM idempotency.stats"; }
reaped0=$(reaped_so_far)
total_s=$((QUIET_SECONDS + REAP_SECONDS + QUIET_SECONDS + 10))
(cd "$tmp" && pgbench -n -M prepared -c "$REAP_CLIENTS" -j "$REAP_CLIENTS" -T "$total_s" \
    --log --log-prefix="$tmp/txlog" -f "$KEYS_DIR/new_ext.sql" "$BIG" \
    >"$tmp/reap.out" 2>&1 || true) &
bench_pid=$!
start=$(now)
sleep "$QUIET_SECONDS"
t0=$(now)
(PGOPTIONS="${REAPER_PGOPTIONS:-}" psql_q "$BIG" -c "$MAINTAIN" && now > "$tmp/t1") &
maint_pid=$!
ticks=0
while kill -0 "$maint_pid" 2>/dev/null; do
    sleep 1
    ticks=$((ticks + 1))
    if [ $((ticks % 10)) = 0 ] && kill -0 "$maint_pid" 2>/dev/null; then
        r=$(( $(reaped_so_far) - reaped0 ))
        echo "  reaping: $r keys after $(calc "$(now) - $t0") s, $(calc "$r / ($(now) - $t0)") rows/s"
    fi
done
wait "$maint_pid"
t1=$(cat "$tmp/t1")
reaped=$(( $(reaped_so_far) - reaped0 ))
wait "$bench_pid"
rate=$(calc "$reaped / ($t1 - $t0)")
echo "  reaped $reaped keys in $(calc "$t1 - $t0") s = $rate rows/s; $(sizes "$BIG")"

# per transaction: end time (epoch s) and latency (ms)
cat "$tmp"/txlog.* 2>/dev/null | awk 'NF == 6 && $5 > 1e9 { printf "%.6f %.3f\n", $5 + $6 / 1e6, $3 / 1000 }' > "$tmp/lat"
# p50 / p99 / transactions per second since the start, for the picture
# and for each window's worst second
awk -v s="$start" '{ printf "%d %s\n", int($1 - s), $2 }' "$tmp/lat" | sort -k1,1n -k2,2n |
    awk 'function flush() { if (n == 0) return
             i50 = int(n * 0.5); if (i50 < 1) i50 = 1
             i99 = int(n * 0.99); if (i99 < 1) i99 = 1
             printf "%d %.3f %.3f %d\n", sec, v[i50], v[i99], n; n = 0 }
         { if ($1 != sec && n > 0) flush(); sec = $1; v[++n] = $2 }
         END { flush() }' > "$RESULTS/maint-latency.dat"
from=$(calc "$t0 - $start")
to=$(calc "$t1 - $start")
# window b|r|a: the requests that ended before (b), during (r) or after
# (a) the reaping: count, p50, p99, p99.9, the slowest, and the worst
# second's p99 (of the picture's seconds, counted from the start, with at
# least 20 requests: those wholly before, any part of which fell while
# reaping, or wholly after); stalls of a few seconds hide below a p99
# taken over minutes.
window() {
    local sel
    sel=$(awk -v a="$t0" -v b="$t1" -v w="$1" '(w == "b" && $1 < a) || (w == "r" && $1 >= a && $1 <= b) ||
                                               (w == "a" && $1 > b) { print $2 }' "$tmp/lat")
    if [ -z "$sel" ]; then echo "0 nan nan nan nan nan"; return; fi
    echo "$(echo "$sel" | sort -n |
                awk 'function at(q) { i = int(NR * q); if (i < 1) i = 1; return v[i] }
                     { v[NR] = $1 }
                     END { printf "%d %.2f %.2f %.2f %.2f", NR, at(0.5), at(0.99), at(0.999), v[NR] }')" \
         "$(awk -v a="$from" -v b="$to" -v w="$1" '
                $4 >= 20 && ((w == "b" && $1 + 1 <= a) || (w == "r" && $1 + 1 > a && $1 <= b) ||
                             (w == "a" && $1 >= b)) && (n++ == 0 || $3 > worst) { worst = $3 }
                END { if (n) printf "%.2f", worst; else printf "nan" }' "$RESULTS/maint-latency.dat")"
}
read -r n_before p50_before p99_before p999_before max_before worst_before < <(window b)
read -r n_reap p50_reap p99_reap p999_reap max_reap worst_reap < <(window r)
read -r n_after p50_after p99_after p999_after max_after worst_after < <(window a)
last=$(awk 'BEGIN { m = 0 } $1 > m { m = $1 } END { printf "%.6f", m }' "$tmp/lat")
line() { echo "  $1 p50 $2 ms, p99 $3 ms, p99.9 $4 ms, slowest $5 ms, worst second's p99 $6 ms, $7 tps"; }
line "before reaping:" "$p50_before" "$p99_before" "$p999_before" "$max_before" "$worst_before" "$(calc "$n_before / ($t0 - $start)")"
line "while reaping: " "$p50_reap" "$p99_reap" "$p999_reap" "$max_reap" "$worst_reap" "$(calc "$n_reap / ($t1 - $t0)")"
line "after reaping: " "$p50_after" "$p99_after" "$p999_after" "$max_after" "$worst_after" "$(calc "$n_after / ($last - $t1)")"
echo "  p99 while reaping / before: $(calc "$p99_reap / $p99_before")x (target <= 1.5x); reaper $rate rows/s"
echo "  (the reference is the stretch before: after reaping, the pages the reaper dirtied are still being written out)"

echo "$from $to" > "$RESULTS/maint-latency.reaping"
if command -v gnuplot >/dev/null; then
    gnuplot <<GP
set terminal png size 1100,520 font ",11"
set output "$RESULTS/maint-latency.png"
set title "New requests (durable commits, $REAP_CLIENTS clients) while the reaper deletes expired keys of a $(echo "$KEYS" | sed ':a;s/\B[0-9]\{3\}\>/,&/;ta')-key table"
set xlabel "seconds"
set ylabel "latency per second (ms)"
set y2label "transactions per second"
set ytics nomirror
set y2tics
set yrange [0:*]
set y2range [0:*]
set key top left
set grid ytics
set object 1 rect from $from, graph 0 to $to, graph 1 fc rgb "#fde0c5" fs solid 0.6 noborder behind
set label 1 "reaping: $reaped keys, $rate rows/s" at $from, graph 0.95 offset 1,0
plot "$RESULTS/maint-latency.dat" using 1:4 axes x1y2 with lines lc rgb "#bbbbbb" title "tps", \
     "" using 1:2 with lines lw 2 lc rgb "#1f77b4" title "p50", \
     "" using 1:3 with lines lw 2 lc rgb "#d62728" title "p99"
GP
    echo "  picture: bench/results/maint-latency.png (data: maint-latency.dat, reaping from ${from}s to ${to}s)"
else
    echo "  gnuplot not installed: no picture (data in bench/results/maint-latency.dat)"
fi

dropdb "$SMALL"
dropdb "$BIG"
