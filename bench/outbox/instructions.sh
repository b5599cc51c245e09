#!/usr/bin/env bash
# Instructions per message, counted by callgrind: one backend in
# single-user mode runs a side's loop procedure (setup.sql, pgmq.sql) for
# ROUNDS rounds and for FEW, each time on a fresh queue of due rows; a
# message costs the difference divided by the messages of ROUNDS - FEW
# rounds (start-up and the first calls' cache loading cancel out).  Timed
# runs on a shared machine move by more than the differences between these
# sides; instruction counts do not (they leave out waits, flushes and cache
# misses, so they complement bench/outbox/run.sh, not replace it).  A
# single-user backend runs no autovacuum: every side leaves its dead row
# versions and index entries in place, as a queue whose vacuum lags does.
# pgmq is left to the timed runs: its read scans its vt index over the
# entries of deleted messages, which without vacuum costs it more with
# every round (a third of its instructions went to _bt_killitems), so a
# count here would say more about vacuum than about pgmq.
#
# Sides, one message per round:
#   none       outbox_claim of one row + outbox_ack, rows kept (done)
#   none-del   the same with idempotency.outbox_retention = 0 (ack deletes)
#   ordered    as none, the rows spread over 1,000 ordering keys
#   plain      the hand-written one-statement queue, marking rows done
#   plain-del  the same queue deleting on ack
# batches of 100 (BATCH_ROUNDS rounds):
#   batch-del  outbox_claim of 100 + outbox_ack_many, retention 0
#
#   OUTBOX_BENCH_ONLY=instructions BENCH=outbox make bench   (as root), or
#   bash bench/outbox/instructions.sh [SIDE ...]     (as postgres, with the
#   server's bin directory first on PATH and valgrind installed)
set -euo pipefail
cd "$(dirname "$0")"
ROUNDS=${ROUNDS:-2000}
BATCH_ROUNDS=${BATCH_ROUNDS:-200}
FEW=${FEW:-10}
PREFILL=${PREFILL:-60000}
sides=${*:-none ordered plain}
declare -A cost
dir=$(mktemp -d /tmp/idem-instructions.XXXXXX)
trap 'pg_ctl -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT

initdb -D "$dir/data" -A trust --no-sync >/dev/null
cat >>"$dir/data/postgresql.conf" <<CONF
listen_addresses = ''
unix_socket_directories = '$dir'
fsync = off
synchronous_commit = off
CONF
export PGHOST=$dir PGDATABASE=postgres
pg_ctl -D "$dir/data" -l "$dir/log" -w start >/dev/null
psql -X -q -v ON_ERROR_STOP=1 -c 'SET client_min_messages = warning' -f setup.sql >/dev/null
pg_ctl -D "$dir/data" -w stop >/dev/null

# a fresh queue for side $1, then the server stopped for single-user mode
prep() {
    local okey=NULL table=idempotency.outbox tenant="'t' || (g % 10)"
    case $1 in
        ordered) okey="'k' || (g % 1000)" ;;
        plain*) table=plain_outbox ;;
        batch*) tenant="'t0'" ;;
    esac
    pg_ctl -D "$dir/data" -l "$dir/log" -w start >/dev/null
    psql -X -q -v ON_ERROR_STOP=1 >/dev/null <<SQL
TRUNCATE plain_outbox, idempotency.outbox;
INSERT INTO $table (tenant_id, topic, payload, idem_scope, idem_key, max_attempts,
                    available_at, ordering_key)
SELECT $tenant, 'payment.capture', jsonb_build_object('order', g, 'amount', 4500),
       'payments', 'order-' || g, 10, now() - interval '1 hour' + g * interval '1 millisecond',
       $okey
  FROM generate_series(1, $PREFILL) g;
VACUUM ANALYZE $table;
CHECKPOINT;
SQL
    pg_ctl -D "$dir/data" -w stop >/dev/null
}

# instructions of one single-user backend running $2 rounds of side $1
count() {
    local call opts=()
    case $1 in
        none|ordered) call="CALL bench_outbox_one($2);" ;;
        none-del) call="CALL bench_outbox_one($2);" opts=(-c idempotency.outbox_retention=0) ;;
        plain) call="CALL bench_plain_one($2);" ;;
        plain-del) call="CALL bench_plain_one($2, true);" ;;
        batch-del) call="CALL bench_outbox_batch($2);" opts=(-c idempotency.outbox_retention=0) ;;
    esac
    prep "$1"
    echo "$call" | valgrind --tool=callgrind --callgrind-out-file="$dir/cg.out" \
        postgres --single "${opts[@]}" -D "$dir/data" postgres >"$dir/out" 2>"$dir/vg.log"
    if grep -q ERROR "$dir/out"; then
        echo "instructions: $1: $(grep ERROR "$dir/out" | head -1)" >&2
        exit 1
    fi
    [ -z "${KEEP:-}" ] || cp "$dir/cg.out" "$KEEP.$1.$2"
    awk '/^(summary|totals):/ { print $2; exit }' "$dir/cg.out"
}

for side in $sides; do
    case $side in
        none|none-del|ordered|plain|plain-del|batch-del) ;;
        *) echo "instructions: unknown side $side" >&2; exit 1 ;;
    esac
    rounds=$ROUNDS per=1
    case $side in batch*) rounds=$BATCH_ROUNDS per=100 ;; esac
    many=$(count "$side" "$rounds")
    few=$(count "$side" "$FEW")
    cost[$side]=$(( (many - few) / ((rounds - FEW) * per) ))
    echo "$side: ${cost[$side]} instructions a message ($rounds rounds of $per: $many, $FEW rounds: $few)"
done

# ratio LABEL A B GOAL: B's instructions over A's (how many times cheaper A is)
ratio() {
    [ -n "${cost[$2]:-}" ] && [ -n "${cost[$3]:-}" ] || return 0
    awk -v a="${cost[$2]}" -v b="${cost[$3]}" -v l="$1" -v g="$4" \
        'BEGIN { printf "%s: %.2fx%s\n", l, b / a, (g == "" ? "" : "  (goal " g ")") }'
}
echo "instructions, ratios (the baseline's count over the extension's):"
ratio "  claim + ack against the one-statement queue marking rows done" none plain ">= 1.00x"
ratio "  the same, both deleting on ack (retention 0)" none-del plain-del ">= 1.00x"
ratio "  1,000 ordering keys against none" ordered none ">= 0.90x"
