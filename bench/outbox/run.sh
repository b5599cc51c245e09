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
#  3. ordered delivery (1,000 ordering keys) against unordered rows;
#  4. batches of 100: outbox_ack_many against an outbox_ack per row;
#  5. rounds looping on the server (procedures in setup.sql and pgmq.sql,
#     each statement its own transaction, asynchronous commit) so that
#     neither round trips nor flushes hide the work: one message per round
#     at 1 and 4 workers against the one-statement queue and against pgmq
#     (when installed: PGMQ_SRC, see bench/run.sh), batches of 100 at 1
#     and 2 workers against pgmq.
# Every side runs twice, in mirrored order (A B C C B A); a figure is the
# mean of its two runs.  The issue's goals are printed beside their ratios
# and again at the end.  Runs inside pg_virtualenv as postgres (bench/run.sh).
set -euo pipefail
cd "$(dirname "$0")"

DB=bench_outbox
if [ "${OUTBOX_BENCH_ONLY:-}" = instructions ]; then
    exec bash ./instructions.sh none plain ordered none-del plain-del batch-del
fi
SECS=${OUTBOX_BENCH_SECS:-10}
PREFILL=${OUTBOX_BENCH_PREFILL:-60000}
ENQ_CLIENTS=${OUTBOX_BENCH_ENQ_CLIENTS:-4}
BATCH_PREFILL=${OUTBOX_BENCH_BATCH_PREFILL:-600000}
# server-side rounds per pgbench transaction (section 5)
ROUNDS_ONE=${OUTBOX_BENCH_ROUNDS_ONE:-50}
ROUNDS_BATCH=${OUTBOX_BENCH_ROUNDS_BATCH:-5}
PGMQ_PREFILL_ONE=${OUTBOX_BENCH_PGMQ_PREFILL_ONE:-200000}
PGMQ_PREFILL=${OUTBOX_BENCH_PGMQ_PREFILL:-1000000}
# section 5 runs with asynchronous commit (on: durable), so that the flush
# of each of the two commits per round does not hide the queues' work (nor
# the disk's latency, on a machine whose other jobs flush too)
PGMQ_SYNC=${OUTBOX_BENCH_PGMQ_SYNC:-off}
#  6. OUTBOX_BENCH_ONLY=instructions (alone, not part of the others):
#     instructions per message counted by callgrind (instructions.sh) for
#     the one-message rounds, against the one-statement queue and ordered
#     against unordered, with the goals beside the ratios.
# OUTBOX_BENCH_ONLY=features runs sections 3 and 4 only, =pgmq section 5,
# =claim the claim + ack rounds of section 2 and section 5
ONLY=${OUTBOX_BENCH_ONLY:-all}
GOALS=$(mktemp)
trap 'rm -f "$GOALS"' EXIT

dropdb --if-exists "$DB" 2>/dev/null
createdb "$DB"
psql -X -q -v ON_ERROR_STOP=1 -d "$DB" -f setup.sql

# pgbench's tps for one run (without connection time); fails when a client
# aborted, e.g. because its queue ran dry
tps() {
    local script=$1 clients=$2 out mode=prepared
    local -a extra=()
    case $script in
        # CALL of a procedure that commits: simple protocol
        loop_*one*) mode=simple extra=(-D "rounds=$ROUNDS_ONE") ;;
        loop_*batch*) mode=simple extra=(-D "rounds=$ROUNDS_BATCH") ;;
    esac
    out=$(PGOPTIONS="${SIDE_OPTIONS:-}" pgbench -n -M "$mode" "${extra[@]}" -T "$SECS" -c "$clients" -j "$clients" -f "$script" "$DB" 2>&1)
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
$(have_pgmq && echo "TRUNCATE pgmq.q_bench;")
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

# fill pgmq's queue with $1 messages of the same payload
prep_pgmq() {
    psql -X -q -v ON_ERROR_STOP=1 -d "$DB" >/dev/null <<SQL
TRUNCATE plain_outbox, idempotency.outbox, pgmq.q_bench;
INSERT INTO pgmq.q_bench (vt, message)
SELECT now() - interval '1 hour' + g * interval '1 millisecond',
       jsonb_build_object('order', g, 'amount', 4500)
  FROM generate_series(1, $1) g;
VACUUM ANALYZE pgmq.q_bench;
CHECKPOINT;
SQL
}

have_pgmq() {
    [ "$PGMQ" = yes ]
}

# run "label clients table:script ..." twice, in mirrored order (A B C C B
# A, which cancels a steady drift of the machine); print each side's mean
# and the extension's (first side's) ratio to it.  PER (default 1): messages
# per pgbench transaction, which turns tps into msgs/s; GOAL="target text"
# (optional): the issue's target for the ratio to the last side, e.g.
# ">= 1.00x", printed beside it and kept for the summary.
measure() {
    local label=$1 clients=$2 per=${PER:-1} goal=${GOAL:-}
    shift 2
    local -a sides=("$@") order=() runs=()
    local n=$# i side table script
    for ((i = 0; i < n; i++)); do order+=("$i"); done
    for ((i = n - 1; i >= 0; i--)); do order+=("$i"); done
    for i in "${order[@]}"; do
        side=${sides[$i]}
        table=${side%%:*}
        script=${side#*:}
        # "<kind>+del": the same run with idempotency.outbox_retention = 0
        # (outbox_ack deletes the row) or, for the plain queue, the script's
        # deleting form
        SIDE_OPTIONS=
        case $table in
            *+del)
                table=${table%+del}
                SIDE_OPTIONS="-c idempotency.outbox_retention=0"
                ;;
        esac
        case $table in
            enqueue) prep_enqueue on ;;
            enqueue-no-notify) prep_enqueue off ;;
            ordered) prep_queue idempotency.outbox "$PREFILL" "'k' || (g % 1000)" ;;
            batch) prep_queue idempotency.outbox "$BATCH_PREFILL" NULL "'t0'" ;;
            outbox-one) prep_queue idempotency.outbox "$PGMQ_PREFILL_ONE" ;;
            pgmq-one) prep_pgmq "$PGMQ_PREFILL_ONE" ;;
            plain-one) prep_queue plain_outbox "$PGMQ_PREFILL_ONE" ;;
            ordered-one) prep_queue idempotency.outbox "$PGMQ_PREFILL_ONE" "'k' || (g % 1000)" ;;
            outbox-batch) prep_queue idempotency.outbox "$PGMQ_PREFILL" NULL "'t0'" ;;
            pgmq-batch) prep_pgmq "$PGMQ_PREFILL" ;;
            *) prep_queue "$table" ;;
        esac
        runs+=("$(tps "$script" "$clients")")
    done
    echo "${runs[*]}" | awk -v label="$label" -v n=$n -v names="${sides[*]}" \
        -v per="$per" -v goal="$goal" -v goals="$GOALS" '{
        split(names, nm, " ")
        unit = per == 1 ? "tps" : "msgs/s"
        printf "%s\n", label
        for (i = 1; i <= n; i++) {
            first = $i * per; second = $(2 * n + 1 - i) * per
            mean[i] = (first + second) / 2
            if (nm[i] ~ /^enqueue-no-notify:/) nm[i] = nm[i] " (notify off)"
            if (nm[i] ~ /^ordered/) nm[i] = nm[i] " (1,000 keys)"
            if (nm[i] ~ /^[^:]*\+del:/) nm[i] = nm[i] " (retention 0)"
            sub(/^[^:]*:/, "", nm[i]); sub(/\.sql/, "", nm[i])
            printf "    %-36s %9.1f %s  (runs %.1f, %.1f)", nm[i], mean[i], unit, first, second
            if (i > 1) printf "   extension / this = %.2fx", mean[1] / mean[i]
            if (i == n && goal != "") {
                ratio = sprintf("%.2f", mean[1] / mean[i]) + 0
                split(goal, g, " ")
                # judged on the ratio as printed (two decimals)
                met = ratio >= g[2] + 0 ? "met" : "NOT met"
                printf "   goal %s: %s", goal, met
                printf "%-62s %.2fx  goal %s  %s  (%.0f vs %.0f %s)\n", label, ratio, goal, met,
                       mean[1], mean[i], unit >> goals
            }
            printf "\n"
        }
    }'
}

psql -X -q -d "$DB" -c "ALTER DATABASE $DB SET idempotency.outbox_notify = on" >/dev/null
PGMQ=no
PGMQ_WHY=
# (pg_available_extensions does not list extensions under extension_destdir:
# try to create it)
if why=$(psql -X -q -v ON_ERROR_STOP=1 -d "$DB" -f pgmq.sql 2>&1 >/dev/null); then
    PGMQ=yes
    PGMQ_VERSION=$(psql -X -At -d "$DB" -c "SELECT extversion FROM pg_extension WHERE extname = 'pgmq'")
else
    PGMQ_WHY="$(echo "$why" | grep -m1 ERROR | sed 's/.*ERROR: *//') (PGMQ_SRC=<a pgmq checkout> make bench BENCH=outbox installs pgmq first, see bench/run.sh)"
fi

echo "outbox: ${SECS}s per run, every side twice (A B C C B A); $PREFILL rows queued before each claim run"
if [ "$ONLY" = all ]; then
measure "enqueue in a new-request transaction, $ENQ_CLIENTS clients" "$ENQ_CLIENTS" \
    enqueue:enqueue_extension.sql enqueue:enqueue_plain.sql \
    enqueue-no-notify:enqueue_extension.sql
fi
if [ "$ONLY" = all ] || [ "$ONLY" = claim ]; then
for w in 1 2 4; do
    goal=
    [ "$w" = 2 ] || goal=">= 1.00x"
    GOAL=$goal measure "claim + ack, $w worker(s)" "$w" \
        idempotency.outbox:claim_ack_extension.sql \
        plain_outbox:claim_ack_plain.sql \
        plain_outbox:claim_ack_plain_onestmt.sql
    # delivered rows not kept: ack deletes, against the same baseline
    GOAL=$goal measure "claim + ack, $w worker(s), idempotency.outbox_retention = 0" "$w" \
        idempotency.outbox+del:claim_ack_extension.sql \
        plain_outbox:claim_ack_plain_onestmt_delete.sql \
        plain_outbox:claim_ack_plain_onestmt.sql
done
fi
if [ "$ONLY" = all ] || [ "$ONLY" = features ]; then
# 3. ordered delivery: the same rounds over rows spread on 1,000 ordering
#    keys, against the same rows without keys
for w in 1 4; do
    GOAL=">= 0.90x" measure "claim + ack, $w worker(s): 1,000 ordering keys / none" "$w" \
        ordered:claim_ack_extension.sql \
        idempotency.outbox:claim_ack_extension.sql
done
# 4. batches of 100 rows of one tenant: claim, then one outbox_ack_many,
#    against claim, then an outbox_ack per row (server-side, one statement);
#    a transaction is a batch: msgs/s = tps x 100
for w in 1 2; do
    PER=100 measure "batch of 100, $w worker(s): outbox_ack_many / 100 outbox_ack" "$w" \
        batch:claim_ack_many_extension.sql \
        batch:claim_ack_each_extension.sql
done
fi
# 5. rounds looping on the server (asynchronous commit unless
#    OUTBOX_BENCH_PGMQ_SYNC=on): one message per round against the
#    hand-written one-statement queue and against pgmq; batches of 100
#    against pgmq
if [ "$ONLY" = all ] || [ "$ONLY" = pgmq ] || [ "$ONLY" = claim ]; then
    psql -X -q -d "$DB" -c "ALTER DATABASE $DB SET synchronous_commit = $PGMQ_SYNC" >/dev/null
    echo "rounds looping on the server, synchronous_commit = $PGMQ_SYNC: $ROUNDS_ONE rounds (one message) or $ROUNDS_BATCH rounds (100 messages) per CALL"
    for w in 1 4; do
        PER=$ROUNDS_ONE GOAL=">= 1.00x" measure "one message per round, $w worker(s): claim + ack / the one-statement queue" "$w" \
            outbox-one:loop_outbox_one.sql \
            plain-one:loop_plain_one.sql
        PER=$ROUNDS_ONE GOAL=">= 1.00x" measure "one message per round, $w worker(s), retention 0: claim + ack / the one-statement queue" "$w" \
            outbox-one+del:loop_outbox_one.sql \
            plain-one:loop_plain_one_delete.sql \
            plain-one:loop_plain_one.sql
    done
    for w in 1 4; do
        PER=$ROUNDS_ONE GOAL=">= 0.90x" measure "one message per round, $w worker(s): 1,000 ordering keys / none" "$w" \
            ordered-one:loop_outbox_one.sql \
            outbox-one:loop_outbox_one.sql
    done
    if have_pgmq; then
        echo "against pgmq $PGMQ_VERSION"
        for w in 1 4; do
            PER=$ROUNDS_ONE GOAL=">= 1.00x" measure "one message per round, $w worker(s): claim + ack / pgmq read + delete" "$w" \
                outbox-one:loop_outbox_one.sql \
                pgmq-one:loop_pgmq_one.sql
        done
        # pgmq deletes a message on delete: the like-for-like outbox run
        # deletes on ack (retention 0); the default, which keeps the row
        # done, is shown beside it
        for w in 1 2; do
            PER=$((ROUNDS_BATCH * 100)) GOAL=">= 1.00x" measure "batch of 100, $w worker(s): claim + ack_many (retention 0) / pgmq read + delete(ids[])" "$w" \
                outbox-batch+del:loop_outbox_batch.sql \
                outbox-batch:loop_outbox_batch.sql \
                pgmq-batch:loop_pgmq_batch.sql
        done
    else
        echo "outbox: pgmq comparison skipped: $PGMQ_WHY"
    fi
    psql -X -q -d "$DB" -c "ALTER DATABASE $DB RESET synchronous_commit" >/dev/null
fi
if [ -s "$GOALS" ]; then
    echo "goals (extension / baseline, the issue's target, both sides' means):"
    sed 's/^/    /' "$GOALS"
fi
dropdb "$DB"
