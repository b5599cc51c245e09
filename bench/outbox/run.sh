#!/usr/bin/env bash
# Outbox throughput, each figure against baselines measured in the same run
# on tables of the same shape (same columns, keys, indexes, fillfactor):
#  1. enqueue: a new-request transaction (business INSERT + outbox_enqueue,
#     which also queues the NOTIFY) against the same transaction with a
#     plain INSERT into the plain table, and against outbox_enqueue with
#     idempotency.outbox_notify off;
#  2. claim + ack with 1, 2 and 4 workers: outbox_claim(batch 1), then
#     outbox_ack, each in its own transaction as a worker does, against
#     - "plain": the hand-written queue: BEGIN; SELECT ... FOR UPDATE SKIP
#       LOCKED; UPDATE ... RETURNING *; COMMIT; then the ack UPDATE;
#     - "plain 1-stmt": a tighter hand-written round that locks and leases
#       in one UPDATE ... FROM (SELECT ... FOR UPDATE SKIP LOCKED).
#     Both queues are refilled with the same rows before every run.
# Every side runs twice, in mirrored order (A B C C B A); a figure is the
# mean of its two runs.  Runs inside pg_virtualenv as postgres (bench/run.sh).
set -euo pipefail
cd "$(dirname "$0")"

DB=bench_outbox
SECS=${OUTBOX_BENCH_SECS:-10}
PREFILL=${OUTBOX_BENCH_PREFILL:-60000}
ENQ_CLIENTS=${OUTBOX_BENCH_ENQ_CLIENTS:-4}
BATCH_PREFILL=${OUTBOX_BENCH_BATCH_PREFILL:-600000}
# OUTBOX_BENCH_ONLY=features runs sections 3 and 4 only
ONLY=${OUTBOX_BENCH_ONLY:-all}

dropdb --if-exists "$DB" 2>/dev/null
createdb "$DB"
psql -X -q -v ON_ERROR_STOP=1 -d "$DB" -f setup.sql

# pgbench's tps for one run (without connection time); fails when a client
# aborted, e.g. because its queue ran dry
tps() {
    local script=$1 clients=$2 out
    out=$(pgbench -n -M prepared -T "$SECS" -c "$clients" -j "$clients" -f "$script" "$DB" 2>&1)
    if echo "$out" | grep -q 'aborted'; then
        echo "outbox: $script with $clients clients aborted:" >&2
        echo "$out" | grep -i error | head -3 >&2
        exit 1
    fi
    echo "$out" | awk '/^tps = / { print $3 }'
}

# $1 = on or off: idempotency.outbox_notify for the run's new sessions
prep_enqueue() {
    psql -X -q -d "$DB" -c "TRUNCATE bench_orders, plain_outbox, idempotency.outbox" \
         -c "ALTER DATABASE $DB SET idempotency.outbox_notify = $1" \
         -c "CHECKPOINT" >/dev/null
}

# fill the queue table $1 with $2 (default PREFILL) due rows, vacuumed and
# analysed; $3 is the ordering_key of row g (default none), $4 its tenant
prep_queue() {
    local rows=${2:-$PREFILL} okey=${3:-NULL} tenant=${4:-"'t' || (g % 10)"}
    psql -X -q -v ON_ERROR_STOP=1 -d "$DB" >/dev/null <<SQL
TRUNCATE plain_outbox, idempotency.outbox;
INSERT INTO $1 (tenant_id, topic, payload, idem_scope, idem_key, max_attempts, available_at,
                ordering_key)
SELECT $tenant, 'payment.capture', jsonb_build_object('order', g, 'amount', 4500),
       'payments', 'order-' || g, 10, now() - interval '1 hour' + g * interval '1 millisecond',
       $okey
  FROM generate_series(1, $rows) g;
VACUUM ANALYZE $1;
CHECKPOINT;
SQL
}

# run "label clients table:script ..." twice, in mirrored order (A B C C B
# A, which cancels a steady drift of the machine); print each side's mean
# and the extension's (first side's) ratio to it
measure() {
    local label=$1 clients=$2
    shift 2
    local -a sides=("$@") order=() runs=()
    local n=$# i side table script
    for ((i = 0; i < n; i++)); do order+=("$i"); done
    for ((i = n - 1; i >= 0; i--)); do order+=("$i"); done
    for i in "${order[@]}"; do
        side=${sides[$i]}
        table=${side%%:*}
        script=${side#*:}
        case $table in
            enqueue) prep_enqueue on ;;
            enqueue-no-notify) prep_enqueue off ;;
            ordered) prep_queue idempotency.outbox "$PREFILL" "'k' || (g % 1000)" ;;
            batch) prep_queue idempotency.outbox "$BATCH_PREFILL" NULL "'t0'" ;;
            *) prep_queue "$table" ;;
        esac
        runs+=("$(tps "$script" "$clients")")
    done
    echo "${runs[*]}" | awk -v label="$label" -v n=$n -v names="${sides[*]}" '{
        split(names, nm, " ")
        printf "%s\n", label
        for (i = 1; i <= n; i++) {
            first = $i; second = $(2 * n + 1 - i)
            mean[i] = (first + second) / 2
            if (nm[i] ~ /^enqueue-no-notify:/) nm[i] = nm[i] " (notify off)"
            sub(/^[^:]*:/, "", nm[i]); sub(/\.sql/, "", nm[i])
            printf "    %-36s %8.1f tps  (runs %.1f, %.1f)", nm[i], mean[i], first, second
            if (i > 1) printf "   extension / this = %.2fx", mean[1] / mean[i]
            printf "\n"
        }
    }'
}

echo "outbox: ${SECS}s per run, every side twice (A B C C B A); $PREFILL rows queued before each claim run"
if [ "$ONLY" = all ]; then
measure "enqueue in a new-request transaction, $ENQ_CLIENTS clients" "$ENQ_CLIENTS" \
    enqueue:enqueue_extension.sql enqueue:enqueue_plain.sql \
    enqueue-no-notify:enqueue_extension.sql
for w in 1 2 4; do
    measure "claim + ack, $w worker(s)" "$w" \
        idempotency.outbox:claim_ack_extension.sql \
        plain_outbox:claim_ack_plain.sql \
        plain_outbox:claim_ack_plain_onestmt.sql
done
fi
# 3. ordered delivery: the same rounds over rows spread on 1,000 ordering
#    keys, against the same rows without keys
for w in 1 4; do
    measure "claim + ack, $w worker(s): 1,000 ordering keys / none" "$w" \
        ordered:claim_ack_extension.sql \
        idempotency.outbox:claim_ack_extension.sql
done
# 4. batches of 100 rows of one tenant: claim, then one outbox_ack_many,
#    against claim, then an outbox_ack per row (server-side, one statement);
#    a transaction is a batch: msgs/s = tps x 100
for w in 1 2; do
    measure "batch of 100, $w worker(s): outbox_ack_many / 100 outbox_ack" "$w" \
        batch:claim_ack_many_extension.sql \
        batch:claim_ack_each_extension.sql
done
dropdb "$DB"
