/*-------------------------------------------------------------------------
 *
 * outbox.c
 *	  The transactional outbox: intents to call the outside world, written
 *	  in the same transaction as the business rows and delivered at least
 *	  once by workers outside the database.
 *
 * outbox_enqueue inserts a row in the caller's transaction and arranges a
 * NOTIFY on channel "idempotency_outbox" (payload: the topic), sent only if
 * that transaction commits, and not at all if it is prepared for two-phase
 * commit (see "NOTIFY at commit" below).  Workers call
 * outbox_claim, deliver each row carrying its idem_scope/idem_key to the
 * provider as the provider's own idempotency key, and finish each row with
 * outbox_ack or outbox_nack (or a batch of them with outbox_ack_many and
 * outbox_nack_many), extending a lease that runs short with outbox_extend.
 * outbox_requeue returns a dead letter to the queue.  Enqueues may be
 * deduplicated (dedup_key), delivered in order per key (ordering_key, see
 * OUTBOX_ORDER_LOCK_CLASS) and written to the WAL for a relay
 * (idempotency.outbox_emit_messages, see "WAL relay").
 *
 * Row states: pending -> leased -> done, or leased -> pending (nack with
 * retries left), or leased -> dead.  available_at is the earliest time a
 * row may be claimed: for a pending row, when it is due; for a leased row,
 * when its lease expires.  A single partial index on available_at over
 * pending and leased rows therefore serves both new work and the reclaim
 * of expired leases, oldest first.
 *
 * Locking: outbox_claim locks its candidates with FOR UPDATE SKIP LOCKED,
 * so concurrent claimers never wait on each other and never receive the
 * same row.  outbox_ack, outbox_nack and outbox_requeue update one row by
 * primary key and wait for a claimer that holds it, which is brief.
 * Fencing: every claim writes a fresh lease_token, and ack/nack only touch
 * a row that is still leased under the caller's token, so a worker whose
 * lease expired and whose row was claimed again cannot overwrite the new
 * holder's outcome.
 *
 * Every statement is prepared once per backend (SPI_prepare_cursor +
 * SPI_keepplan) with parameters and a generic plan; the plan cache replans
 * them by itself when the table changes.  Workers should claim under READ
 * COMMITTED: under REPEATABLE READ, locking a row that another worker
 * changed since the snapshot raises a serialization failure.
 *
 * IDENTIFICATION
 *	  outbox.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/index.h"
#include "catalog/pg_am_d.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_enum.h"
#include "catalog/pg_index.h"
#include "catalog/pg_namespace.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "commands/async.h"
#include "executor/executor.h"
#include "common/hashfn.h"
#include "common/pg_prng.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "optimizer/optimizer.h"
#include "replication/message.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/relcache.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
#include "utils/uuid.h"

#include "idempotency.h"

/*
 * idempotency.outbox_emit_messages: outbox_enqueue also writes each row it
 * inserts to the WAL as a transactional logical decoding message with this
 * prefix (see outbox_emit_message).
 */
bool		idem_outbox_emit_messages = false;
bool		idem_outbox_notify = true;
int			idem_max_payload_size = 1024 * 1024;
int			idem_outbox_max_attempts = 10;
int			idem_outbox_retention = 7 * 24 * 60 * 60;

#define OUTBOX_MESSAGE_PREFIX "idempotency.outbox"

/* Channel outbox_enqueue and outbox_requeue notify on commit. */
#define OUTBOX_CHANNEL "idempotency_outbox"

/*
 * Longest topic, in bytes.  The topic is the NOTIFY payload, which must stay
 * well under the server's 8000-byte limit; topics are short names anyway.
 */
#define OUTBOX_MAX_TOPIC_LEN 255

/* Longest worker name, in bytes: it is only a label in leased_by. */
#define OUTBOX_MAX_WORKER_LEN 255

/*
 * Backoff of outbox_nack when the worker gives no retry_in:
 * min(cap, base * 2^(attempts - 1)) * jitter, jitter uniform in [0.5, 1.0),
 * "attempts" counting the failure being reported.  README.md quotes them.
 */
#define OUTBOX_BACKOFF_BASE_SECS 5
#define OUTBOX_BACKOFF_CAP_SECS 3600

/*
 * "Now" for leases, due times and delivery times: the start of the calling
 * statement, as for any statement, or of the transaction when that is later:
 * a procedure that loops with COMMIT runs every round inside one statement
 * (its CALL), whose start would make its leases end in the past once it has
 * run longer than them.  Stable, so a claim's index scan can use it.
 */
#define OUTBOX_NOW \
	"GREATEST(pg_catalog.statement_timestamp(), pg_catalog.now())"

PG_FUNCTION_INFO_V1(idem_outbox_enqueue);
PG_FUNCTION_INFO_V1(idem_outbox_claim);
PG_FUNCTION_INFO_V1(idem_outbox_ack);
PG_FUNCTION_INFO_V1(idem_outbox_nack);
PG_FUNCTION_INFO_V1(idem_outbox_requeue);
PG_FUNCTION_INFO_V1(idem_outbox_discard);
PG_FUNCTION_INFO_V1(idem_outbox_extend);
PG_FUNCTION_INFO_V1(idem_outbox_ack_many);
PG_FUNCTION_INFO_V1(idem_outbox_nack_many);

/*
 * idem_outbox_init
 *		Called from _PG_init: the outbox's parameters (idempotency.
 *		outbox_retention is read by the purge in maintenance.c).
 */
void
idem_outbox_init(void)
{
	DefineCustomIntVariable("idempotency.max_payload_size",
							gettext_noop("Largest outbox payload (plus headers) outbox_enqueue accepts."),
							NULL,
							&idem_max_payload_size,
							1024 * 1024, 1, INT_MAX,
							PGC_SUSET,
							GUC_UNIT_BYTE,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.outbox_max_attempts",
							gettext_noop("Delivery attempts before an outbox row is dead-lettered, unless the row sets its own."),
							NULL,
							&idem_outbox_max_attempts,
							10, 1, 1000000,
							PGC_USERSET,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.outbox_retention",
							gettext_noop("How long delivered outbox rows are kept before idem_maintain purges them."),
							gettext_noop("0: outbox_ack and outbox_ack_many delete the row instead of keeping it done."),
							&idem_outbox_retention,
							7 * 24 * 60 * 60, 0, INT_MAX,
							PGC_SUSET,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomBoolVariable("idempotency.outbox_notify",
							 gettext_noop("Whether outbox_enqueue and outbox_requeue send NOTIFY idempotency_outbox at commit."),
							 gettext_noop("Turn it off when workers only poll: PostgreSQL serializes the commits of transactions that notify."),
							 &idem_outbox_notify,
							 true,
							 PGC_USERSET,
							 0,
							 NULL, NULL, NULL);
	DefineCustomBoolVariable("idempotency.outbox_emit_messages",
							 gettext_noop("Whether outbox_enqueue also writes each row to the WAL as a logical decoding message."),
							 gettext_noop("Prefix \"idempotency.outbox\", transactional: relays reading a logical replication slot get outbox rows in commit order."),
							 &idem_outbox_emit_messages,
							 false,
							 PGC_USERSET,
							 0,
							 NULL, NULL, NULL);
}

/* ----------------------------------------------------------------
 * Statements
 * ----------------------------------------------------------------
 */

static const char *outbox_enqueue_sql =
"INSERT INTO idempotency.outbox"
"  (tenant_id, topic, payload, headers, idem_scope, idem_key,"
"   max_attempts, available_at, dedup_key, ordering_key)"
" VALUES ($1, $2, $3, $4, $5, $6, $7, pg_catalog.now() OPERATOR(pg_catalog.+) $8, $9, $10)"
" RETURNING id";

/*
 * The insert of the 1.0 SQL function (8 arguments), for a database whose
 * extension is not updated yet: its table lacks the 1.1 columns.
 */
static const char *outbox_enqueue_v10_sql =
"INSERT INTO idempotency.outbox"
"  (tenant_id, topic, payload, headers, idem_scope, idem_key,"
"   max_attempts, available_at)"
" VALUES ($1, $2, $3, $4, $5, $6, $7, pg_catalog.now() OPERATOR(pg_catalog.+) $8)"
" RETURNING id";

/*
 * Deduplicated enqueue: the same insert, which outbox_dedup_idx turns into
 * nothing when (tenant, topic, dedup_key) has a row already.  A conflicting
 * row that is not yet committed is waited for: if its transaction commits,
 * this insert does nothing and the lookup below finds it; if it rolls back,
 * this insert goes ahead.  Enqueues without a dedup_key keep the plain
 * insert above, which skips the speculative insertion.
 */
static const char *outbox_enqueue_dedup_sql =
"INSERT INTO idempotency.outbox"
"  (tenant_id, topic, payload, headers, idem_scope, idem_key,"
"   max_attempts, available_at, dedup_key, ordering_key)"
" VALUES ($1, $2, $3, $4, $5, $6, $7, pg_catalog.now() OPERATOR(pg_catalog.+) $8, $9, $10)"
" ON CONFLICT (tenant_id, topic, dedup_key) WHERE dedup_key IS NOT NULL"
" DO NOTHING"
" RETURNING id";

static const char *outbox_dedup_lookup_sql =
"SELECT id FROM idempotency.outbox"
" WHERE tenant_id OPERATOR(pg_catalog.=) $1 AND topic OPERATOR(pg_catalog.=) $2"
"   AND dedup_key OPERATOR(pg_catalog.=) $3";

/*
 * Ordered delivery.  Rows of one tenant with the same ordering_key are
 * delivered one at a time, in id order: a row is a claim candidate only
 * when no row of its tenant and ordering key with a smaller id is pending,
 * leased or dead (idempotency.outbox_ordering_head, below, answers that by
 * probing outbox_ordering_idx; the claim's statements call it for rows
 * that have an ordering key, which the OR leaves out for the others: a
 * NOT EXISTS subquery would cost every claim, ordered or not, the start-up
 * of its scan).  So the head of a key
 * is its oldest unfinished row, and everything behind it waits: while it
 * is leased, while it waits for a retry after a nack, and while it is dead,
 * until it is requeued and delivered, or deleted.
 *
 * Id order is commit order within a key: outbox_enqueue takes a
 * transaction-level advisory lock on (tenant, ordering_key) before it
 * inserts, so a second transaction enqueueing for the same key waits until
 * the first commits or rolls back, and its row (and id) comes after.
 * Without it, a later id could commit first and be delivered before an
 * earlier one became visible.  The lock is an advisory LOCKTAG of the
 * database and a 64-bit hash of tenant and key whose fourth field,
 * OUTBOX_ORDER_LOCK_CLASS, no SQL advisory lock function produces (they
 * use 1 and 2): no role can take it to stall a tenant's enqueues, as the
 * key locks (IDEM_LOCKTAG_CLASS).  Another key with the same hash only
 * shares the wait.
 */
#define OUTBOX_ORDER_LOCK_CLASS 0x4f52

static const char *outbox_ordered_filter =
"   AND (c.ordering_key IS NULL OR idempotency.outbox_ordering_head("
"        c.tableoid, c.tenant_id, c.ordering_key, c.id))";

/* Longest dedup_key or ordering_key, in bytes. */
#define OUTBOX_MAX_DEDUP_KEY_LEN 255

/*
 * How often a deduplicated enqueue retries when the row it conflicted with
 * was deleted before it could be looked up (purged or removed by hand).
 */
#define OUTBOX_DEDUP_RETRIES 3

/*
 * outbox_claim runs two statements.  The first locks the candidates, oldest
 * available_at first, FOR UPDATE SKIP LOCKED; there is one such statement
 * per combination of filters, so each gets a plan of its own (a generic
 * plan with "$2 IS NULL OR ..." would filter no better than the worst
 * case).  Its status condition must stay the predicate of outbox_claim_idx
 * (the same statuses; written here as "= ANY" with the operator qualified,
 * which the planner proves equal to the index's IN list) for the planner
 * to use that index.
 *
 * The second leases the locked rows, found by the ctids the first returned:
 * a TID scan.  Two statements rather than one UPDATE ... FROM (subquery)
 * because a generic plan guesses a tenth of the table for "LIMIT $1", and
 * would then join the subquery to the table by a hash join over a
 * sequential scan; apart, neither plan depends on that guess.  Under READ
 * COMMITTED the second statement's snapshot sees the versions the first
 * one locked, even those committed after the first statement began.
 *
 * A row whose lease expired counts the lost attempt: it is handed out again
 * with attempts + 1, or dead-lettered once that reaches max_attempts, so a
 * message that crashes every worker cannot loop forever.  Dead-lettered
 * rows (the only ones left without a lease_token) are left out of the
 * result, which outbox_claim sorts back into the order the rows were locked
 * in.
 */
static const char *outbox_lock_sql_format =
"SELECT c.ctid, c.tenant_id, c.id"
"  FROM idempotency.outbox c"
" WHERE %s"
"   AND c.available_at OPERATOR(pg_catalog.<=) " OUTBOX_NOW
"   %s%s%s"
" ORDER BY c.available_at"
" LIMIT $1"
"   FOR UPDATE SKIP LOCKED";

/*
 * The status condition of the claim statements above and below: pending
 * rows (outbox_claim_idx and the topic and tenant claim indexes hold only
 * them since 1.1, and the expired leases are claimed first, through
 * outbox_lease_idx, by outbox_lock_expired_sql_format); a database still
 * at 1.0, whose outbox_claim_idx holds the leased rows too (available_at
 * being a lease's end) and which has no outbox_lease_idx, claims both in
 * one available_at order.
 */
#define OUTBOX_CLAIM_STATUS_V11 "c.status OPERATOR(pg_catalog.=) 'pending'"
#define OUTBOX_CLAIM_STATUS_V10 \
	"c.status OPERATOR(pg_catalog.=) ANY ('{pending,leased}'::idempotency.outbox_status[])"

/*
 * The first step of a claim (1.1): lock up to $1 leases that expired (their
 * worker died or hung), longest expired first, through outbox_lease_idx;
 * outbox_claim_lease then counts each lost attempt.  A leased row heads its
 * ordering key, so the ordering condition is not repeated; the status
 * condition (first %s) and the ordering condition (fourth) are left out
 * ("%.0s"), the topics and the tenant filter as for pending rows.
 */
static const char *outbox_lock_expired_sql_format =
"SELECT c.ctid, c.tenant_id, c.id"
"  FROM idempotency.outbox c"
" WHERE c.status OPERATOR(pg_catalog.=) 'leased'%.0s"
"   AND c.lease_until OPERATOR(pg_catalog.<=) " OUTBOX_NOW
"   %s%s%.0s"
" ORDER BY c.lease_until"
" LIMIT $1"
"   FOR UPDATE SKIP LOCKED";

/*
 * The lease: status leased, a fresh token (from "token", an expression),
 * the worker, the end of the lease; a row whose lease expired counts the
 * lost attempt, and is dead-lettered (left without a token) when that was
 * its last.  $1 is the worker, $2 the lease.
 */
#define OUTBOX_LEASE_SET(token) \
"    SET status = CASE WHEN o.status OPERATOR(pg_catalog.=) 'leased' AND " IDEM_OUTBOX_LOST_LEASE_IS_LAST \
"                      THEN 'dead'::idempotency.outbox_status" \
"                      ELSE 'leased'::idempotency.outbox_status END," \
"        attempts = o.attempts OPERATOR(pg_catalog.+) CASE WHEN o.status OPERATOR(pg_catalog.=) 'leased' THEN 1 ELSE 0 END," \
"        last_error = CASE WHEN o.status OPERATOR(pg_catalog.=) 'leased'" \
"                          THEN " IDEM_OUTBOX_LOST_LEASE_ERROR \
"                          ELSE o.last_error END," \
"        lease_token = CASE WHEN o.status OPERATOR(pg_catalog.=) 'leased' AND " IDEM_OUTBOX_LOST_LEASE_IS_LAST \
"                           THEN NULL ELSE " token " END," \
"        leased_by = CASE WHEN o.status OPERATOR(pg_catalog.=) 'leased' AND " IDEM_OUTBOX_LOST_LEASE_IS_LAST \
"                         THEN o.leased_by ELSE $1 END," \
"        lease_until = CASE WHEN o.status OPERATOR(pg_catalog.=) 'leased' AND " IDEM_OUTBOX_LOST_LEASE_IS_LAST \
"                           THEN NULL ELSE " OUTBOX_NOW " OPERATOR(pg_catalog.+) $2 END," \
"        available_at = " OUTBOX_NOW " OPERATOR(pg_catalog.+) $2"

/*
 * The token expression: idempotency.new_lease_token() (1.1) draws tokens
 * from a pool filled 32 at a time, where gen_random_uuid() reads the
 * random source for each (a system call per leased row); a database still
 * at 1.0 has only the latter.  Each statement below comes in both forms,
 * indexed by OUTBOX_V11 (whether the catalog has new_lease_token()).
 */
#define OUTBOX_TOKEN_V10 "pg_catalog.gen_random_uuid()"
#define OUTBOX_TOKEN_V11 "idempotency.new_lease_token()"

#define OUTBOX_LEASE_SQL(token) \
"UPDATE idempotency.outbox o" \
OUTBOX_LEASE_SET(token) \
"  WHERE o.ctid OPERATOR(pg_catalog.=) ANY ($3)" \
" RETURNING o.*"

static const char *const outbox_lease_sql[2] = {
	OUTBOX_LEASE_SQL(OUTBOX_TOKEN_V10),
	OUTBOX_LEASE_SQL(OUTBOX_TOKEN_V11)
};

/*
 * A claim of one row (batch 1, what a worker that delivers one message at
 * a time asks for) locks and leases in one statement.  Its LIMIT is a
 * constant, so the plan is a nested loop over a TID scan whatever the
 * backlog, and cheap enough never to be compiled by JIT.  $3 and $4 are
 * the topics and the tenant, filtered as in outbox_lock_sql_format.
 *
 * It leases a pending row only, so its SET list is the plain lease,
 * without the lost-lease accounting of OUTBOX_LEASE_SET: when the oldest
 * due row is a leased row whose lease expired, the statement locks it and
 * leases nothing, and the claim falls back to the two statements, which
 * count the lost attempt (a row this transaction locked is not skipped by
 * its own SKIP LOCKED).  The same fallback serves a row that another
 * transaction changed after this statement's snapshot was taken: it is
 * locked in its new version, which the statement cannot see.
 */
#define OUTBOX_CLAIM_ONE_SQL(token) \
"UPDATE idempotency.outbox o" \
"   SET status = 'leased'::idempotency.outbox_status," \
"       lease_token = " token "," \
"       leased_by = $1," \
"       lease_until = " OUTBOX_NOW " OPERATOR(pg_catalog.+) $2," \
"       available_at = " OUTBOX_NOW " OPERATOR(pg_catalog.+) $2" \
"  FROM (SELECT c.ctid" \
"          FROM idempotency.outbox c" \
"         WHERE %s" \
"           AND c.available_at OPERATOR(pg_catalog.<=) " OUTBOX_NOW \
"           %s%s%s" \
"         ORDER BY c.available_at" \
"         LIMIT 1" \
"           FOR UPDATE SKIP LOCKED) l" \
" WHERE o.ctid OPERATOR(pg_catalog.=) l.ctid" \
"   AND o.status OPERATOR(pg_catalog.=) 'pending'" \
" RETURNING o.*"

static const char *const outbox_claim_one_sql_format[2] = {
	OUTBOX_CLAIM_ONE_SQL(OUTBOX_TOKEN_V10),
	OUTBOX_CLAIM_ONE_SQL(OUTBOX_TOKEN_V11)
};

static const char *outbox_ack_sql =
"UPDATE idempotency.outbox"
"   SET status = 'done', done_at = " OUTBOX_NOW ","
"       provider_ref = $4, lease_until = NULL"
" WHERE tenant_id OPERATOR(pg_catalog.=) $1 AND id OPERATOR(pg_catalog.=) $2"
"   AND status OPERATOR(pg_catalog.=) 'leased' AND lease_token OPERATOR(pg_catalog.=) $3";

/*
 * With idempotency.outbox_retention = 0 delivered rows are not kept: ack
 * deletes the row under the same fence (provider_ref, $4, is then not
 * stored).  A DELETE writes no new row version and no index entry, where
 * marking the row done writes both.
 */
static const char *outbox_ack_delete_sql =
"DELETE FROM idempotency.outbox"
" WHERE tenant_id OPERATOR(pg_catalog.=) $1 AND id OPERATOR(pg_catalog.=) $2"
"   AND status OPERATOR(pg_catalog.=) 'leased' AND lease_token OPERATOR(pg_catalog.=) $3";

static const char *outbox_nack_sql =
"UPDATE idempotency.outbox"
"   SET attempts = attempts OPERATOR(pg_catalog.+) 1,"
"       status = CASE WHEN attempts OPERATOR(pg_catalog.+) 1"
"                          OPERATOR(pg_catalog.>=) max_attempts"
"                THEN 'dead'::idempotency.outbox_status"
"                ELSE 'pending'::idempotency.outbox_status END,"
"       available_at = " OUTBOX_NOW
"           OPERATOR(pg_catalog.+) COALESCE($5, pg_catalog.make_interval(secs =>"
"                 LEAST(" CppAsString2(OUTBOX_BACKOFF_CAP_SECS) "::pg_catalog.float8,"
"                       " CppAsString2(OUTBOX_BACKOFF_BASE_SECS) "::pg_catalog.float8"
"                       OPERATOR(pg_catalog.*) pg_catalog.power(2.0::pg_catalog.float8,"
"                                          LEAST(attempts, 30)::pg_catalog.float8))"
"                 OPERATOR(pg_catalog.*) $6)),"
"       last_error = $4, lease_token = NULL, lease_until = NULL"
" WHERE tenant_id OPERATOR(pg_catalog.=) $1 AND id OPERATOR(pg_catalog.=) $2"
"   AND status OPERATOR(pg_catalog.=) 'leased' AND lease_token OPERATOR(pg_catalog.=) $3"
" RETURNING status";

static const char *outbox_requeue_sql =
"UPDATE idempotency.outbox"
"   SET status = 'pending', attempts = 0,"
"       available_at = " OUTBOX_NOW ","
"       lease_token = NULL, lease_until = NULL"
" WHERE tenant_id OPERATOR(pg_catalog.=) $1 AND id OPERATOR(pg_catalog.=) $2"
"   AND status OPERATOR(pg_catalog.=) 'dead'"
" RETURNING topic";

/* outbox_discard: a dead letter deleted; the next row of its key heads it */
static const char *outbox_discard_sql =
"DELETE FROM idempotency.outbox"
" WHERE tenant_id OPERATOR(pg_catalog.=) $1 AND id OPERATOR(pg_catalog.=) $2"
"   AND status OPERATOR(pg_catalog.=) 'dead'"
" RETURNING topic";

/*
 * outbox_extend: a heartbeat.  Fenced like ack: only the current lease
 * holder moves the end of its lease (and available_at with it, so the
 * claim path keeps ignoring the row until then).
 */
static const char *outbox_extend_sql =
"UPDATE idempotency.outbox"
"   SET lease_until = " OUTBOX_NOW " OPERATOR(pg_catalog.+) $4,"
"       available_at = " OUTBOX_NOW " OPERATOR(pg_catalog.+) $4"
" WHERE tenant_id OPERATOR(pg_catalog.=) $1 AND id OPERATOR(pg_catalog.=) $2"
"   AND status OPERATOR(pg_catalog.=) 'leased' AND lease_token OPERATOR(pg_catalog.=) $3"
" RETURNING lease_until";

/*
 * outbox_ack_many and outbox_nack_many: one statement per batch.  The
 * arrays are zipped by ROWS FROM (a row per index, NULL where provider_refs
 * is shorter, i.e. NULL) and joined to the table by primary key; each row
 * is fenced by its own token exactly as in outbox_ack and outbox_nack, and
 * rows that fail the fence are left out of the result, not raised.
 */
static const char *outbox_ack_many_sql =
"UPDATE idempotency.outbox o"
"   SET status = 'done', done_at = " OUTBOX_NOW ","
"       provider_ref = r.ref, lease_until = NULL"
"  FROM ROWS FROM (pg_catalog.unnest($2), pg_catalog.unnest($3),"
"                  pg_catalog.unnest($4)) AS r(id, token, ref)"
" WHERE o.tenant_id OPERATOR(pg_catalog.=) $1 AND o.id OPERATOR(pg_catalog.=) r.id"
"   AND o.status OPERATOR(pg_catalog.=) 'leased'"
"   AND o.lease_token OPERATOR(pg_catalog.=) r.token"
" RETURNING o.id";

static const char *outbox_ack_many_delete_sql =
"DELETE FROM idempotency.outbox o"
" USING ROWS FROM (pg_catalog.unnest($2), pg_catalog.unnest($3)) AS r(id, token)"
" WHERE o.tenant_id OPERATOR(pg_catalog.=) $1 AND o.id OPERATOR(pg_catalog.=) r.id"
"   AND o.status OPERATOR(pg_catalog.=) 'leased'"
"   AND o.lease_token OPERATOR(pg_catalog.=) r.token"
" RETURNING o.id";

static const char *outbox_nack_many_sql =
"UPDATE idempotency.outbox o"
"   SET attempts = o.attempts OPERATOR(pg_catalog.+) 1,"
"       status = CASE WHEN o.attempts OPERATOR(pg_catalog.+) 1"
"                          OPERATOR(pg_catalog.>=) o.max_attempts"
"                THEN 'dead'::idempotency.outbox_status"
"                ELSE 'pending'::idempotency.outbox_status END,"
"       available_at = " OUTBOX_NOW
"           OPERATOR(pg_catalog.+) COALESCE($5, pg_catalog.make_interval(secs =>"
"                 LEAST(" CppAsString2(OUTBOX_BACKOFF_CAP_SECS) "::pg_catalog.float8,"
"                       " CppAsString2(OUTBOX_BACKOFF_BASE_SECS) "::pg_catalog.float8"
"                       OPERATOR(pg_catalog.*) pg_catalog.power(2.0::pg_catalog.float8,"
"                                          LEAST(o.attempts, 30)::pg_catalog.float8))"
"                 OPERATOR(pg_catalog.*) r.jitter)),"
"       last_error = $4, lease_token = NULL, lease_until = NULL"
"  FROM ROWS FROM (pg_catalog.unnest($2), pg_catalog.unnest($3),"
"                  pg_catalog.unnest($6)) AS r(id, token, jitter)"
" WHERE o.tenant_id OPERATOR(pg_catalog.=) $1 AND o.id OPERATOR(pg_catalog.=) r.id"
"   AND o.status OPERATOR(pg_catalog.=) 'leased'"
"   AND o.lease_token OPERATOR(pg_catalog.=) r.token"
" RETURNING o.id, o.status";

/*
 * The same three on Citus, one row per statement.  Inside a function Citus
 * delegates to the tenant's worker, a statement must be one Citus routes by
 * the distribution argument alone, which the joins above are not: the
 * batch functions there run one of these per row, fenced alike.
 */
static const char *outbox_ack_one_sql =
"UPDATE idempotency.outbox o"
"   SET status = 'done', done_at = " OUTBOX_NOW ","
"       provider_ref = $4, lease_until = NULL"
" WHERE o.tenant_id OPERATOR(pg_catalog.=) $1 AND o.id OPERATOR(pg_catalog.=) $2"
"   AND o.status OPERATOR(pg_catalog.=) 'leased'"
"   AND o.lease_token OPERATOR(pg_catalog.=) $3"
" RETURNING o.id";

static const char *outbox_ack_one_delete_sql =
"DELETE FROM idempotency.outbox o"
" WHERE o.tenant_id OPERATOR(pg_catalog.=) $1 AND o.id OPERATOR(pg_catalog.=) $2"
"   AND o.status OPERATOR(pg_catalog.=) 'leased'"
"   AND o.lease_token OPERATOR(pg_catalog.=) $3"
" RETURNING o.id";

static const char *outbox_nack_one_sql =
"UPDATE idempotency.outbox o"
"   SET attempts = o.attempts OPERATOR(pg_catalog.+) 1,"
"       status = CASE WHEN o.attempts OPERATOR(pg_catalog.+) 1"
"                          OPERATOR(pg_catalog.>=) o.max_attempts"
"                THEN 'dead'::idempotency.outbox_status"
"                ELSE 'pending'::idempotency.outbox_status END,"
"       available_at = " OUTBOX_NOW
"           OPERATOR(pg_catalog.+) COALESCE($5, pg_catalog.make_interval(secs =>"
"                 LEAST(" CppAsString2(OUTBOX_BACKOFF_CAP_SECS) "::pg_catalog.float8,"
"                       " CppAsString2(OUTBOX_BACKOFF_BASE_SECS) "::pg_catalog.float8"
"                       OPERATOR(pg_catalog.*) pg_catalog.power(2.0::pg_catalog.float8,"
"                                          LEAST(o.attempts, 30)::pg_catalog.float8))"
"                 OPERATOR(pg_catalog.*) $6)),"
"       last_error = $4, lease_token = NULL, lease_until = NULL"
" WHERE o.tenant_id OPERATOR(pg_catalog.=) $1 AND o.id OPERATOR(pg_catalog.=) $2"
"   AND o.status OPERATOR(pg_catalog.=) 'leased'"
"   AND o.lease_token OPERATOR(pg_catalog.=) $3"
" RETURNING o.id, o.status";

static const char *outbox_status_sql =
"SELECT status::pg_catalog.text FROM idempotency.outbox"
" WHERE tenant_id OPERATOR(pg_catalog.=) $1 AND id OPERATOR(pg_catalog.=) $2";

/* whether the row is leased with token $3 (read in the latest snapshot) */
static const char *outbox_fence_sql =
"SELECT FROM idempotency.outbox"
" WHERE tenant_id OPERATOR(pg_catalog.=) $1 AND id OPERATOR(pg_catalog.=) $2"
" AND status OPERATOR(pg_catalog.=) 'leased'"
" AND lease_token OPERATOR(pg_catalog.=) $3";

/* Saved plans, prepared on first use in this backend. */
static SPIPlanPtr enqueue_plan = NULL;
static SPIPlanPtr enqueue_v10_plan = NULL;
static SPIPlanPtr enqueue_dedup_plan = NULL;
static SPIPlanPtr dedup_lookup_plan = NULL;
static SPIPlanPtr lock_plans[64];
static SPIPlanPtr lock_expired_plans[64];
static SPIPlanPtr lease_plans[2] = {NULL, NULL};
static SPIPlanPtr claim_one_plans[64];
static SPIPlanPtr ack_plan = NULL;
static SPIPlanPtr ack_delete_plan = NULL;
static SPIPlanPtr nack_plan = NULL;
static SPIPlanPtr requeue_plan = NULL;
static SPIPlanPtr discard_plan = NULL;
static SPIPlanPtr status_plan = NULL;
static SPIPlanPtr fence_plan = NULL;
static SPIPlanPtr extend_plan = NULL;
static SPIPlanPtr ack_many_plan = NULL;
static SPIPlanPtr ack_many_delete_plan = NULL;
static SPIPlanPtr nack_many_plan = NULL;
static SPIPlanPtr ack_one_plan = NULL;
static SPIPlanPtr ack_one_delete_plan = NULL;
static SPIPlanPtr nack_one_plan = NULL;

#define CLAIM_FILTER_TOPICS 1
#define CLAIM_FILTER_TENANT 2
#define CLAIM_ORDERED 4			/* the table has ordering_key (1.1) */
#define CLAIM_TOKEN_FN 8		/* idempotency.new_lease_token() exists */
#define CLAIM_ONE_TOPIC 16		/* with CLAIM_FILTER_TOPICS: one topic */
#define CLAIM_LEASE_IDX 32		/* outbox_lease_idx exists (1.1) */
#define OUTBOX_V11(filters) (((filters) & CLAIM_TOKEN_FN) ? 1 : 0)

/* A row locked by outbox_claim, and its place in the result. */
typedef struct ClaimedRow
{
	int64		id;
	char	   *tenant;
	uint64		position;		/* in lock order: oldest available_at first */
	HeapTuple	leased;			/* leased version; NULL if dead-lettered */
} ClaimedRow;

/* Order ClaimedRows by primary key, (id, tenant) for a cheaper compare. */
static int
claimed_row_cmp(const void *a, const void *b)
{
	const ClaimedRow *ra = (const ClaimedRow *) a;
	const ClaimedRow *rb = (const ClaimedRow *) b;

	if (ra->id != rb->id)
		return ra->id < rb->id ? -1 : 1;
	return strcmp(ra->tenant, rb->tenant);
}

/*
 * Outbox plans are forced generic: the plan cache would otherwise compare the
 * generic plan of "LIMIT $1", priced for a tenth of the table, with a custom
 * plan for the actual batch, find it dearer and re-plan on every call.  The
 * generic plans of these statements are the index and TID scans the
 * statements are written for.
 */
#define outbox_plan(cache, sql, nargs, argtypes) \
	idem_saved_plan((cache), (sql), (nargs), (argtypes), CURSOR_OPT_GENERIC_PLAN)

/*
 * What the database's catalog has of 1.1 (a database whose extension is
 * still at 1.0 runs on this library until it is updated):
 * OUTBOX_HAS_ORDERING when idempotency.outbox has the column ordering_key
 * (without it the claim runs without ordering), OUTBOX_HAS_TOKEN_FN when
 * idempotency.new_lease_token() exists (without it leases draw their
 * tokens from gen_random_uuid()).  Kept until the next invalidation of a
 * relation or a function (ALTER EXTENSION UPDATE sends both), so that a
 * claim does not look them up in the catalogs each time.
 */
#define OUTBOX_HAS_ORDERING 1
#define OUTBOX_HAS_TOKEN_FN 2
#define OUTBOX_HAS_LEASE_IDX 4	/* outbox_lease_idx: claim pending rows */

static int	outbox_catalog_known = -1;	/* -1: look it up */

/* What outbox_ack_direct knows of the table (see there). */
typedef struct OutboxDirectIndex
{
	Oid			oid;
	IndexInfo  *info;
	ExprState  *predicate;		/* NULL: not a partial index */
	List	   *exprs;			/* ExprStates of its expression columns */
	bool		unique;
	bool		unchanged;		/* no key column is one the ack sets */
	bool		claim_unchanged;	/* no key column is one a claim sets */
} OutboxDirectIndex;

typedef struct OutboxDirect
{
	bool		valid;			/* what follows is current */
	bool		usable;			/* the table is as the extension makes it */
	Oid			relid;
	AttrNumber	status;
	AttrNumber	lease_token;
	AttrNumber	done_at;
	AttrNumber	provider_ref;
	AttrNumber	lease_until;
	AttrNumber	leased_by;		/* what outbox_claim_direct reads or sets */
	AttrNumber	available_at;
	AttrNumber	tenant_id;
	AttrNumber	id;
	AttrNumber	ordering_key;
	AttrNumber	topic;
	bool		claim_usable;	/* no CHECK on a column a claim sets */
	Oid			claim_idx;		/* outbox_claim_idx (available_at) */
	Oid			topic_claim_idx;	/* (topic, available_at) */
	Oid			tenant_claim_idx;	/* (tenant_id, available_at) */
	Oid			lease_idx;		/* (lease_until) of leased rows (1.1) */
	Oid			pending;		/* enum values of status */
	Oid			leased;
	Oid			done;
	Oid			pkey;
	int			nindexes;
	OutboxDirectIndex *indexes;
	ExprContext *econtext;		/* evaluates the index predicates */
	MemoryContext cxt;			/* all of the above */
} OutboxDirect;

static OutboxDirect outbox_direct = {false};
static uint64 outbox_direct_invals = 0; /* counts its invalidations */

/* The table and index outbox_ordering_head last probed (see there). */
static Oid	ordering_head_heap = InvalidOid;	/* InvalidOid: look up */
static Oid	ordering_head_index = InvalidOid;
static bool outbox_callbacks_installed = false;

static void
outbox_relcache_callback(Datum arg pg_attribute_unused(), Oid relid)
{
	outbox_catalog_known = -1;
	if (relid == InvalidOid || relid == outbox_direct.relid)
	{
		outbox_direct.valid = false;
		outbox_direct_invals++;
	}
	if (relid == InvalidOid || relid == ordering_head_heap ||
		relid == ordering_head_index)
		ordering_head_heap = InvalidOid;
}

static void
outbox_syscache_callback(Datum arg pg_attribute_unused(),
						 int cacheid pg_attribute_unused(),
						 uint32 hashvalue pg_attribute_unused())
{
	outbox_catalog_known = -1;
}

static int
outbox_catalog(void)
{
	Oid			nsp;
	Oid			rel;
	int			flags = 0;

	if (outbox_catalog_known >= 0)
		return outbox_catalog_known;
	if (!outbox_callbacks_installed)
	{
		idem_register_relcache_callback(outbox_relcache_callback);
		CacheRegisterSyscacheCallback(PROCOID, outbox_syscache_callback,
									  (Datum) 0);
		outbox_callbacks_installed = true;
	}
	nsp = get_namespace_oid("idempotency", true);
	if (OidIsValid(nsp))
	{
		rel = get_relname_relid("outbox", nsp);
		if (OidIsValid(rel) &&
			get_attnum(rel, "ordering_key") != InvalidAttrNumber)
			flags |= OUTBOX_HAS_ORDERING;
		if (SearchSysCacheExists3(PROCNAMEARGSNSP,
								  CStringGetDatum("new_lease_token"),
								  PointerGetDatum(buildoidvector(NULL, 0)),
								  ObjectIdGetDatum(nsp)))
			flags |= OUTBOX_HAS_TOKEN_FN;
		if (OidIsValid(get_relname_relid("outbox_lease_idx", nsp)))
			flags |= OUTBOX_HAS_LEASE_IDX;
	}
	outbox_catalog_known = flags;
	return flags;
}

static bool
outbox_has_ordering_key(void)
{
	return (outbox_catalog() & OUTBOX_HAS_ORDERING) != 0;
}

/* Whether the outbox has outbox_lease_idx (1.1), for maintenance.c. */
bool
idem_outbox_has_lease_idx(void)
{
	return (outbox_catalog() & OUTBOX_HAS_LEASE_IDX) != 0;
}

/*
 * Wait for, then hold until the end of the transaction, the lock of
 * (tenant, ordering_key) that orders enqueues of one key (see
 * OUTBOX_ORDER_LOCK_CLASS).  An ordinary lock wait: lock_timeout and the
 * deadlock check apply.
 */
static void
outbox_lock_ordering_key(const char *tenant, const char *ordering_key)
{
	uint64		h;
	LOCKTAG		tag;

	h = hash_bytes_extended((const unsigned char *) tenant, strlen(tenant), 0);
	h = hash_combine64(h, hash_bytes_extended((const unsigned char *) ordering_key,
											  strlen(ordering_key), 0));
	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, (uint32) (h >> 32), (uint32) h,
						 OUTBOX_ORDER_LOCK_CLASS);
	idem_lock_wait(&tag);
}

/*
 * idempotency.outbox_ordering_head(outbox oid, tenant text,
 *                                  ordering_key text, id bigint) RETURNS bool
 *
 * The claim's ordering condition for a row with an ordering key: true when
 * no row of "tenant" and "ordering_key" with an id below "id" is pending,
 * leased or dead, in the snapshot of the statement that calls it (the
 * claim's; its rechecks of a row updated concurrently keep that snapshot,
 * as a subquery's would).  "outbox" is the table the row came from: the
 * claim passes the row's tableoid, which on Citus is the shard the pass
 * reads.
 *
 * It probes the table's index directly, as keys_fetch probes the primary
 * key: outbox_ordering_idx, which holds exactly the rows with an ordering
 * key that are pending, leased or dead, by a 64-bit hash of the tenant and
 * the ordering key, then id.  Integers make each step of its descent
 * cheap, where the two text columns cost two string comparisons a step,
 * the second at an offset computed anew for every entry.  A row reached
 * through it can only be such a row (status and ordering_key are in its
 * predicate, so an update changing either is never HOT and leaves the
 * index); the status is checked all the same, and so are the tenant and
 * the key: rows of another key with the same hash are passed over.  Only
 * the extension's owner may call it: it is not granted to any role.
 */
static AttrNumber ordering_head_status_attnum;
static AttrNumber ordering_head_id_attnum;
static AttrNumber ordering_head_tenant_attnum;
static AttrNumber ordering_head_key_attnum;
static Oid	ordering_head_status[3];	/* pending, leased, dead */

/*
 * Whether "expr" is hashtextextended(<text column "arg">, seed), in
 * collation "C"; *seed is set to the second argument.
 */
static bool
ordering_hash_call(Node *expr, AttrNumber arg, Node **seed)
{
	FuncExpr   *f;
	Var		   *v;

	if (expr == NULL || !IsA(expr, FuncExpr))
		return false;
	f = (FuncExpr *) expr;
	if (f->funcid != F_HASHTEXTEXTENDED || list_length(f->args) != 2 ||
		f->inputcollid != C_COLLATION_OID)
		return false;
	v = (Var *) linitial(f->args);
	if (!IsA(v, Var) || v->varattno != arg)
		return false;
	*seed = (Node *) lsecond(f->args);
	return true;
}

/*
 * Whether "index" is outbox_ordering_idx's shape:
 * (hashtextextended(ordering_key, hashtextextended(tenant_id, 0)), id).
 */
static bool
ordering_index_matches(Relation index, AttrNumber tenant, AttrNumber key,
					   AttrNumber id)
{
	Form_pg_index form = index->rd_index;
	List	   *exprs;
	Node	   *seed;
	Node	   *zero;
	bool		match;

	if (index->rd_rel->relam != BTREE_AM_OID || !form->indisvalid ||
		form->indnkeyatts != 2 || form->indkey.values[0] != 0 ||
		form->indkey.values[1] != id)
		return false;
	exprs = RelationGetIndexExpressions(index);
	match = list_length(exprs) == 1 &&
		ordering_hash_call((Node *) linitial(exprs), key, &seed) &&
		ordering_hash_call(seed, tenant, &zero) &&
		IsA(zero, Const) && ((Const *) zero)->consttype == INT8OID &&
		!((Const *) zero)->constisnull &&
		DatumGetInt64(((Const *) zero)->constvalue) == 0;
	list_free(exprs);
	return match;
}

/*
 * The key outbox_ordering_idx orders a tenant's and ordering key's rows
 * by: hashtextextended(ordering_key, hashtextextended(tenant_id, 0)), as
 * the index computes it (both columns are in collation "C").
 */
static int64
ordering_hash(Datum tenant, Datum ordering_key)
{
	Datum		seed;

	seed = DirectFunctionCall2Coll(hashtextextended, C_COLLATION_OID,
								   tenant, Int64GetDatum(0));
	return DatumGetInt64(DirectFunctionCall2Coll(hashtextextended,
												 C_COLLATION_OID,
												 ordering_key, seed));
}

static void
ordering_head_lookup(Relation heap)
{
	Oid			relid = RelationGetRelid(heap);
	AttrNumber	want[3];
	const char *const names[3] = {"tenant_id", "ordering_key", "id"};
	const char *const labels[3] = {"pending", "leased", "dead"};
	AttrNumber	status;
	Oid			status_type;
	Oid			found = InvalidOid;
	List	   *indexes;
	ListCell   *lc;

	for (int i = 0; i < 3; i++)
		want[i] = get_attnum(relid, names[i]);
	status = get_attnum(relid, "status");
	status_type = status == InvalidAttrNumber ? InvalidOid :
		get_atttype(relid, status);
	indexes = (want[0] == InvalidAttrNumber || want[1] == InvalidAttrNumber ||
			   want[2] == InvalidAttrNumber) ? NIL : RelationGetIndexList(heap);
	foreach(lc, indexes)
	{
		Relation	index;
		bool		match;

		index = index_open(lfirst_oid(lc), AccessShareLock);
		match = ordering_index_matches(index, want[0], want[1], want[2]);
		index_close(index, NoLock);
		if (match)
		{
			found = lfirst_oid(lc);
			break;
		}
	}
	list_free(indexes);
	if (!OidIsValid(found) || !OidIsValid(status_type))
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("\"%s\" is not an outbox with ordered delivery",
						RelationGetRelationName(heap)),
				 errdetail("It has no index on (hash of tenant_id and ordering_key, id) or no status column."),
				 errhint("Pass the tableoid of an idempotency.outbox row; if outbox_ordering_idx was dropped, reinstall the extension.")));
	for (int i = 0; i < 3; i++)
	{
		ordering_head_status[i] =
			GetSysCacheOid2(ENUMTYPOIDNAME, Anum_pg_enum_oid,
							ObjectIdGetDatum(status_type),
							CStringGetDatum(labels[i]));
		if (!OidIsValid(ordering_head_status[i]))
			ereport(ERROR,
					(errcode(ERRCODE_WRONG_OBJECT_TYPE),
					 errmsg("\"%s\" is not an outbox with ordered delivery",
							RelationGetRelationName(heap)),
					 errdetail("Its status column has no value \"%s\".",
							   labels[i]),
					 errhint("Pass the tableoid of an idempotency.outbox row.")));
	}
	ordering_head_index = found;
	ordering_head_status_attnum = status;
	ordering_head_tenant_attnum = want[0];
	ordering_head_key_attnum = want[1];
	ordering_head_id_attnum = want[2];
	ordering_head_heap = relid;
}

/* Whether the text "d" holds the same bytes as "t". */
static bool
ordering_text_equal(Datum d, text *t)
{
	text	   *u = DatumGetTextPP(d);

	return VARSIZE_ANY_EXHDR(u) == VARSIZE_ANY_EXHDR(t) &&
		memcmp(VARDATA_ANY(u), VARDATA_ANY(t), VARSIZE_ANY_EXHDR(t)) == 0;
}

/*
 * Whether the row "id" of "tenant" and "ordering_key" in the outbox
 * "heap" (opened) heads its key in "snapshot": no row of that tenant and
 * key with a smaller id is pending, leased or dead.  *head is set to the
 * smallest such id when there is one (the first the index returns), else
 * to "id".
 */
static bool
outbox_ordering_probe(Relation heap, Datum tenant, Datum ordering_key,
					  Datum id, Snapshot snapshot, int64 *head)
{
	Relation	index;
	ScanKeyData skey[2];
	IndexScanDesc scan;
	TupleTableSlot *slot;
	text	   *t = DatumGetTextPP(tenant);
	text	   *k = DatumGetTextPP(ordering_key);
	bool		earlier = false;

	/* registers the relcache callback that clears the cache below */
	(void) outbox_catalog();
	if (ordering_head_heap != RelationGetRelid(heap))
		ordering_head_lookup(heap);
	index = index_open(ordering_head_index, AccessShareLock);
	ScanKeyEntryInitialize(&skey[0], 0, 1, BTEqualStrategyNumber, InvalidOid,
						   InvalidOid, F_INT8EQ,
						   Int64GetDatum(ordering_hash(PointerGetDatum(t),
													   PointerGetDatum(k))));
	ScanKeyEntryInitialize(&skey[1], 0, 2, BTLessStrategyNumber, InvalidOid,
						   InvalidOid, F_INT8LT, id);
	slot = table_slot_create(heap, NULL);
#if PG_VERSION_NUM >= 180000
	scan = index_beginscan(heap, index, snapshot, NULL, 2, 0);
#else
	scan = index_beginscan(heap, index, snapshot, 2, 0);
#endif
	index_rescan(scan, skey, 2, NULL, 0);
	while (!earlier && index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		bool		isnull;
		Oid			status;
		Datum		d;

		status = DatumGetObjectId(slot_getattr(slot,
											   ordering_head_status_attnum,
											   &isnull));
		if (isnull || (status != ordering_head_status[0] &&
					   status != ordering_head_status[1] &&
					   status != ordering_head_status[2]))
			continue;

		/* another tenant and key with the same hash: not a predecessor */
		d = slot_getattr(slot, ordering_head_tenant_attnum, &isnull);
		if (isnull || !ordering_text_equal(d, t))
			continue;
		d = slot_getattr(slot, ordering_head_key_attnum, &isnull);
		if (isnull || !ordering_text_equal(d, k))
			continue;
		earlier = true;
		*head = DatumGetInt64(slot_getattr(slot, ordering_head_id_attnum,
										   &isnull));
	}
	if (!earlier)
		*head = DatumGetInt64(id);
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	index_close(index, NoLock);
	return !earlier;
}

/*
 * The heads one claim has found (OrderingHeads): for a table, a tenant and
 * an ordering key, the smallest id of its rows that are pending, leased or
 * dead in the claim's snapshot.  A claim reads its candidates in
 * available_at order, where the rows of one key follow each other when
 * its head is held back (leased, dead, or waiting for a retry): each of
 * them would probe outbox_ordering_idx again, and a probe reads the whole
 * leaf page of the key's entries, so a backlog of 100,000 rows behind one
 * held head cost every claim four seconds.  With the heads remembered, a
 * candidate whose id is above its key's head is behind it without a probe
 * (in the same snapshot the head is still there), and each key is probed
 * once per claim.
 */
typedef struct OrderingHead
{
	uint64		hash;			/* hash key: the table, tenant and key */
	char	   *tenant;			/* to tell apart keys with the same hash */
	char	   *ordering_key;
	int64		head;
} OrderingHead;

typedef struct OrderingHeads
{
	OrderingHead first;			/* the first key probed (most claims probe
								 * one) */
	bool		has_first;
	HTAB	   *heads;			/* the others: created for the second */
	MemoryContext cxt;
	/* the snapshot the heads were found in */
	TransactionId xmin;
	TransactionId xmax;
	CommandId	curcid;
	uint64		completions;	/* snapXactCompletionCount */
} OrderingHeads;

/*
 * outbox_ordering_probe, answered from "memo" (palloc0'd in the memory
 * context that is to hold it, or NULL for none) when it knows the key's
 * head in this snapshot, else probed and remembered.  "live": the row
 * "id" is pending, leased or dead in the snapshot (a claim's candidate),
 * so that when the probe finds nothing before it, it is its key's head;
 * otherwise only a head found before it is remembered.
 */
static bool
outbox_ordering_is_head(Relation heap, Datum tenant, Datum ordering_key,
						Datum id, bool live, Snapshot snapshot,
						OrderingHeads *memo)
{
	text	   *t;
	text	   *k;
	uint64		hash;
	OrderingHead *entry;
	bool		found;
	bool		is_head;
	int64		head;
	MemoryContext old;

	if (memo == NULL)
		return outbox_ordering_probe(heap, tenant, ordering_key, id, snapshot,
									 &head);
	if (memo->xmin != snapshot->xmin || memo->xmax != snapshot->xmax ||
		memo->curcid != snapshot->curcid ||
		memo->completions != snapshot->snapXactCompletionCount)
	{
		/* another snapshot (or the first): forget what was found */
		if (memo->heads != NULL)
			hash_destroy(memo->heads);
		memo->heads = NULL;
		memo->has_first = false;
		memo->xmin = snapshot->xmin;
		memo->xmax = snapshot->xmax;
		memo->curcid = snapshot->curcid;
		memo->completions = snapshot->snapXactCompletionCount;
	}
	t = DatumGetTextPP(tenant);
	k = DatumGetTextPP(ordering_key);
	hash = hash_bytes_uint32_extended(RelationGetRelid(heap), 0);
	hash = hash_combine64(hash,
						  hash_bytes_extended((const unsigned char *) VARDATA_ANY(t),
											  VARSIZE_ANY_EXHDR(t), 0));
	hash = hash_combine64(hash,
						  hash_bytes_extended((const unsigned char *) VARDATA_ANY(k),
											  VARSIZE_ANY_EXHDR(k), 0));
	if (memo->has_first && memo->first.hash == hash)
		entry = &memo->first;
	else if (memo->heads != NULL)
		entry = (OrderingHead *) hash_search(memo->heads, &hash, HASH_FIND,
											 NULL);
	else
		entry = NULL;
	if (entry != NULL &&
		strlen(entry->tenant) == VARSIZE_ANY_EXHDR(t) &&
		memcmp(entry->tenant, VARDATA_ANY(t), VARSIZE_ANY_EXHDR(t)) == 0 &&
		strlen(entry->ordering_key) == VARSIZE_ANY_EXHDR(k) &&
		memcmp(entry->ordering_key, VARDATA_ANY(k), VARSIZE_ANY_EXHDR(k)) == 0)
	{
		if (DatumGetInt64(id) > entry->head)
			return false;
		if (DatumGetInt64(id) == entry->head)
			return true;
	}
	is_head = outbox_ordering_probe(heap, tenant, ordering_key, id, snapshot,
									&head);
	if (entry == NULL && (live || !is_head))
	{
		old = MemoryContextSwitchTo(memo->cxt);
		if (!memo->has_first)
		{
			entry = &memo->first;
			entry->hash = hash;
			memo->has_first = true;
		}
		else
		{
			if (memo->heads == NULL)
			{
				HASHCTL		ctl;

				ctl.keysize = sizeof(uint64);
				ctl.entrysize = sizeof(OrderingHead);
				ctl.hcxt = memo->cxt;
				memo->heads = hash_create("outbox ordering heads", 64, &ctl,
										  HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
			}
			entry = (OrderingHead *) hash_search(memo->heads, &hash,
												 HASH_ENTER, &found);
		}
		entry->tenant = text_to_cstring(t);
		entry->ordering_key = text_to_cstring(k);
		entry->head = head;
		MemoryContextSwitchTo(old);
	}
	return is_head;
}

PG_FUNCTION_INFO_V1(idem_outbox_ordering_head);

Datum
idem_outbox_ordering_head(PG_FUNCTION_ARGS)
{
	Oid			relid = PG_GETARG_OID(0);
	Relation	heap;
	bool		head;
	AclResult	aclresult;

	aclresult = pg_class_aclcheck(relid, GetUserId(), ACL_SELECT);
	if (aclresult != ACLCHECK_OK)
		aclcheck_error(aclresult, OBJECT_TABLE, get_rel_name(relid));
	heap = table_open(relid, AccessShareLock);
	/* the heads this statement found, for as long as its plan runs */
	if (fcinfo->flinfo->fn_extra == NULL)
	{
		OrderingHeads *memo = MemoryContextAllocZero(fcinfo->flinfo->fn_mcxt,
													 sizeof(OrderingHeads));

		memo->cxt = fcinfo->flinfo->fn_mcxt;
		fcinfo->flinfo->fn_extra = memo;
	}
	head = outbox_ordering_is_head(heap, PG_GETARG_DATUM(1),
								   PG_GETARG_DATUM(2), PG_GETARG_DATUM(3),
								   false, GetActiveSnapshot(),
								   (OrderingHeads *) fcinfo->flinfo->fn_extra);
	table_close(heap, NoLock);
	PG_RETURN_BOOL(head);
}

/* ----------------------------------------------------------------
 * Argument checks: all of them run before anything is written
 * ----------------------------------------------------------------
 */

/*
 * The tenant argument (argument 0 of every function but outbox_claim): not
 * NULL, and the one the session is bound to if idempotency.tenant is set.
 */
static char *
outbox_tenant_arg(FunctionCallInfo fcinfo, int argno)
{
	char	   *tenant;

	idem_require_arg(fcinfo, argno, "tenant");
	tenant = text_to_cstring(PG_GETARG_TEXT_PP(argno));
	idem_check_tenant(tenant);
	return tenant;
}


/* Whether "j" is the JSON value null. */
static bool
outbox_jsonb_is_null(Jsonb *j)
{
	JsonbValue	v;

	return JB_ROOT_IS_SCALAR(j) && JsonbExtractScalar(&j->root, &v) &&
		v.type == jbvNull;
}

/*
 * Raise the error that explains why an update by (tenant, id) touched no
 * row.  "action" names the caller for the messages; "token" is the lease
 * token it was fenced by, 0 for none.  Called with SPI connected; never
 * returns.
 */
static void
outbox_explain_miss(const char *tenant, int64 id, const char *action,
					bool expected_dead, Datum token)
{
	Oid			argtypes[3] = {TEXTOID, INT8OID, UUIDOID};
	Datum		values[3];
	SPIPlanPtr	plan;
	int			rc;
	char	   *status;

	values[0] = CStringGetTextDatum(tenant);
	values[1] = Int64GetDatum(id);

	/*
	 * Under REPEATABLE READ and SERIALIZABLE, the token is the row's lease in
	 * a transaction that committed after this one's snapshot (the claim came
	 * from another connection): the update saw the row as it was before,
	 * which is a serialization failure, not a lost lease.
	 */
	if (token != (Datum) 0 && IsolationUsesXactSnapshot())
	{
		values[2] = token;
		plan = outbox_plan(&fence_plan, outbox_fence_sql, 3, argtypes);
		rc = SPI_execute_snapshot(plan, values, NULL, GetLatestSnapshot(),
								  InvalidSnapshot, true, false, 1);
		if (rc != SPI_OK_SELECT)
			elog(ERROR, "outbox lease lookup failed: %s",
				 SPI_result_code_string(rc));
		if (SPI_processed > 0)
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not serialize access to outbox row " INT64_FORMAT,
							id),
					 errdetail("The row was leased with this token by a transaction that committed after this transaction's snapshot was taken."),
					 errhint(IDEM_SERIALIZATION_HINT)));
	}

	plan = outbox_plan(&status_plan, outbox_status_sql, 2, argtypes);

	/*
	 * Not read-only: a fresh snapshot (under READ COMMITTED), so that a
	 * caller that waited for a concurrent ack of the same lease sees what
	 * that ack did (done, or the row deleted) rather than the row as its own
	 * statement's snapshot saw it.
	 */
	rc = SPI_execute_plan(plan, values, NULL, false, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "outbox status lookup failed: %s",
			 SPI_result_code_string(rc));

	/* a row of another tenant is reported as missing: tenants never meet */
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_NO_DATA_FOUND),
				 errmsg("outbox row does not exist"),
				 errdetail("Tenant \"%s\" has no outbox row " INT64_FORMAT ".",
						   tenant, id),
				 idem_outbox_retention == 0 ?
				 errhint("With idempotency.outbox_retention = 0 an acknowledged row is deleted: treat a row that no longer exists as delivered.") :
				 errhint("Pass the tenant and id returned by outbox_enqueue or outbox_claim.")));

	status = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);

	if (expected_dead)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("outbox row is not dead"),
				 errdetail("Row " INT64_FORMAT " is %s; %s takes only a dead letter.",
						   id, status, action),
				 strcmp(status, "done") == 0 ?
				 errhint("The row was delivered; only the rows of idempotency.dead_letters can be requeued or discarded.") :
				 errhint("Pick the row from idempotency.dead_letters; a pending or leased row is still being delivered.")));

	if (strcmp(status, "done") == 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("outbox row is already done"),
				 errdetail("Row " INT64_FORMAT " was acknowledged before; %s changes nothing.",
						   id, action),
				 errhint("Do not acknowledge or retry a row twice; treat this delivery as finished.")));
	if (strcmp(status, "dead") == 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("outbox row is dead"),
				 errdetail("Row " INT64_FORMAT " used up its max_attempts; %s changes nothing.",
						   id, action),
				 errhint("Requeue it with outbox_requeue once the cause is fixed, or discard it with outbox_discard if it is never to be delivered.")));

	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_IN_USE),
			 errmsg("lease token does not match the current lease of the outbox row"),
			 errdetail("Row " INT64_FORMAT " is %s: its lease expired and it was claimed again or reclaimed by maintenance, or the lease was already released.",
					   id, status),
			 errhint("Abandon this delivery attempt; the current lease holder finishes the row.")));
}

/* The number of column "name" in "desc"; raises if there is none. */
static int
outbox_column(TupleDesc desc, const char *name)
{
	int			attno = SPI_fnumber(desc, name);

	if (attno <= 0)
		elog(ERROR, "outbox lease returned no column \"%s\"", name);
	return attno;
}

/*
 * For each column of the result row type "result", the number of the
 * column of the same name in "returned" (what RETURNING o.* gave), or 0 for
 * a dropped column.  The row type keeps the slots of dropped columns, which
 * o.* leaves out, so positions differ as soon as a column of
 * idempotency.outbox was ever dropped; names and types do not.
 */
static int *
outbox_map_columns(TupleDesc result, TupleDesc returned)
{
	int		   *map = palloc0(sizeof(int) * result->natts);
	int			a;

	/* the usual case: no column was ever dropped, the positions agree */
	if (result->natts == returned->natts)
	{
		for (a = 0; a < result->natts; a++)
		{
			Form_pg_attribute ra = TupleDescAttr(result, a);
			Form_pg_attribute ta = TupleDescAttr(returned, a);

			if (ra->attisdropped || ta->attisdropped ||
				ra->atttypid != ta->atttypid ||
				strcmp(NameStr(ra->attname), NameStr(ta->attname)) != 0)
				break;
			map[a] = a + 1;
		}
		if (a == result->natts)
			return map;
	}

	for (a = 0; a < result->natts; a++)
	{
		Form_pg_attribute attr = TupleDescAttr(result, a);

		if (attr->attisdropped)
			continue;
		map[a] = outbox_column(returned, NameStr(attr->attname));
		if (TupleDescAttr(returned, map[a] - 1)->atttypid != attr->atttypid)
			elog(ERROR,
				 "outbox lease returned column \"%s\" of type %u, expected %u",
				 NameStr(attr->attname),
				 TupleDescAttr(returned, map[a] - 1)->atttypid,
				 attr->atttypid);
	}
	return map;
}

/* ----------------------------------------------------------------
 * NOTIFY at commit
 * ----------------------------------------------------------------
 *
 * Topics to notify are collected here and handed to Async_Notify only at
 * pre-commit, not when outbox_enqueue or outbox_requeue runs: PostgreSQL
 * refuses to PREPARE a transaction that has executed NOTIFY, and a NOTIFY
 * once queued cannot be withdrawn.  A transaction that is prepared
 * (two-phase commit) therefore sends no NOTIFY; its rows are found by the
 * workers' next poll once COMMIT PREPARED makes them visible.  Topics
 * queued in a subtransaction that rolls back are forgotten, as NOTIFY's
 * own are.
 */

typedef struct OutboxPendingNotify
{
	char	   *topic;
	int			nestlevel;		/* subtransaction that queued it */
} OutboxPendingNotify;

/* In TopTransactionContext; NIL outside a transaction that enqueued. */
static List *outbox_pending_notifies = NIL;
static bool outbox_callbacks_registered = false;

static void
outbox_xact_callback(XactEvent event, void *arg pg_attribute_unused())
{
	List	   *pending = outbox_pending_notifies;
	ListCell   *lc;

	if (pending == NIL)
		return;

	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			/* before PreCommit_Notify, which queues what we add here */
			outbox_pending_notifies = NIL;
			foreach(lc, pending)
				Async_Notify(OUTBOX_CHANNEL,
							 ((OutboxPendingNotify *) lfirst(lc))->topic);
			break;
		case XACT_EVENT_PRE_PREPARE:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PREPARE:
			/* the list goes with TopTransactionContext */
			outbox_pending_notifies = NIL;
			break;
		default:
			break;
	}
}

static void
outbox_subxact_callback(SubXactEvent event,
						SubTransactionId mySubid pg_attribute_unused(),
						SubTransactionId parentSubid pg_attribute_unused(),
						void *arg pg_attribute_unused())
{
	int			level = GetCurrentTransactionNestLevel();
	List	   *kept = NIL;
	ListCell   *lc;

	if (outbox_pending_notifies == NIL)
		return;

	if (event == SUBXACT_EVENT_COMMIT_SUB)
	{
		/* the parent inherits what this subtransaction queued */
		foreach(lc, outbox_pending_notifies)
		{
			OutboxPendingNotify *p = lfirst(lc);

			if (p->nestlevel >= level)
				p->nestlevel = level - 1;
		}
	}
	else if (event == SUBXACT_EVENT_ABORT_SUB)
	{
		MemoryContext oldcontext;
		bool		dropped = false;

		/* most aborts drop nothing queued: leave the list as it is */
		foreach(lc, outbox_pending_notifies)
		{
			OutboxPendingNotify *p = lfirst(lc);

			if (p->nestlevel >= level)
				dropped = true;
		}
		if (!dropped)
			return;
		oldcontext = MemoryContextSwitchTo(TopTransactionContext);
		foreach(lc, outbox_pending_notifies)
		{
			OutboxPendingNotify *p = lfirst(lc);

			if (p->nestlevel < level)
				kept = lappend(kept, p);
			else
			{
				pfree(p->topic);
				pfree(p);
			}
		}
		MemoryContextSwitchTo(oldcontext);
		list_free(outbox_pending_notifies);
		outbox_pending_notifies = kept;
	}
}

/*
 * Notify idempotency_outbox with "topic" when the current transaction
 * commits (see above); once per topic per transaction.
 */
static void
outbox_notify_at_commit(const char *topic)
{
	MemoryContext oldcontext;
	OutboxPendingNotify *p;
	ListCell   *lc;

	/*
	 * Every topic already pending belongs to this level or an enclosing one:
	 * it is sent whenever this one would be.
	 */
	foreach(lc, outbox_pending_notifies)
	{
		if (strcmp(((OutboxPendingNotify *) lfirst(lc))->topic, topic) == 0)
			return;
	}

	if (!outbox_callbacks_registered)
	{
		RegisterXactCallback(outbox_xact_callback, NULL);
		RegisterSubXactCallback(outbox_subxact_callback, NULL);
		outbox_callbacks_registered = true;
	}

	oldcontext = MemoryContextSwitchTo(TopTransactionContext);
	p = palloc(sizeof(OutboxPendingNotify));
	p->topic = pstrdup(topic);
	p->nestlevel = GetCurrentTransactionNestLevel();
	outbox_pending_notifies = lappend(outbox_pending_notifies, p);
	MemoryContextSwitchTo(oldcontext);
}

/* ----------------------------------------------------------------
 * WAL relay
 * ----------------------------------------------------------------
 *
 * With idempotency.outbox_emit_messages on, every row outbox_enqueue
 * inserts is also written as a transactional logical decoding message
 * (what pg_logical_emit_message(true, prefix, content) writes), prefix
 * "idempotency.outbox", content a JSON object:
 *
 *	{"tenant": ..., "topic": ..., "id": ..., "idem_scope": ...,
 *	 "idem_key": ..., "payload": {...}, "headers": {...} or null,
 *	 "ordering_key": ..., "available_at": "2026-01-31T12:00:00.5+00:00"}
 *
 * available_at is the row's, in UTC: when a relay may publish it (the
 * enqueue's deliver_after from the start of its transaction).
 *
 * A logical decoding plugin (pgoutput with messages 'true', test_decoding,
 * wal2json) hands it to a relay with the transaction's other changes, at
 * its commit and in commit order; a transaction or subtransaction that
 * rolls back emits nothing.  A deduplicated enqueue that inserted nothing
 * emits nothing.
 */

/* Append "str" to "buf" as a JSON string, or null. */
static void
outbox_json_string(StringInfo buf, const char *str)
{
	if (str == NULL)
		appendStringInfoString(buf, "null");
	else
		escape_json(buf, str);
}

static void
outbox_emit_message(const char *tenant, const char *topic, int64 id,
					const char *scope, const char *key, Jsonb *payload,
					Jsonb *headers, const char *ordering_key,
					Datum deliver_after)
{
	StringInfoData buf;
	char		when[MAXDATELEN + 1];
	const int	utc = 0;
	Datum		available_at;

	initStringInfo(&buf);
	appendStringInfoString(&buf, "{\"tenant\": ");
	outbox_json_string(&buf, tenant);
	appendStringInfoString(&buf, ", \"topic\": ");
	outbox_json_string(&buf, topic);
	appendStringInfo(&buf, ", \"id\": " INT64_FORMAT, id);
	appendStringInfoString(&buf, ", \"idem_scope\": ");
	outbox_json_string(&buf, scope);
	appendStringInfoString(&buf, ", \"idem_key\": ");
	outbox_json_string(&buf, key);
	appendStringInfoString(&buf, ", \"payload\": ");
	(void) JsonbToCString(&buf, &payload->root, VARSIZE(payload));
	appendStringInfoString(&buf, ", \"headers\": ");
	if (headers)
		(void) JsonbToCString(&buf, &headers->root, VARSIZE(headers));
	else
		appendStringInfoString(&buf, "null");
	appendStringInfoString(&buf, ", \"ordering_key\": ");
	outbox_json_string(&buf, ordering_key);
	/* as the insert computes it: now() + deliver_after */
	available_at = DirectFunctionCall2(timestamptz_pl_interval,
									   TimestampTzGetDatum(GetCurrentTransactionStartTimestamp()),
									   deliver_after);
	appendStringInfo(&buf, ", \"available_at\": \"%s\"",
					 JsonEncodeDateTime(when, available_at, TIMESTAMPTZOID, &utc));
	appendStringInfoChar(&buf, '}');

#if PG_VERSION_NUM >= 170000
	(void) LogLogicalMessage(OUTBOX_MESSAGE_PREFIX, buf.data, buf.len, true,
							 false);
#else
	(void) LogLogicalMessage(OUTBOX_MESSAGE_PREFIX, buf.data, buf.len, true);
#endif
	pfree(buf.data);
}

/* ----------------------------------------------------------------
 * User-facing functions
 * ----------------------------------------------------------------
 */

/*
 * An enqueue's arguments, checked, and the parameters of its insert
 * (outbox_enqueue_sql's $1..$10).
 */
typedef struct OutboxEnqueueArgs
{
	char	   *tenant;
	char	   *topic;
	Jsonb	   *payload;
	Jsonb	   *headers;		/* NULL: none */
	char	   *key;			/* NULL: none */
	char	   *scope;			/* NULL: none */
	char	   *dedup_key;		/* NULL: none (and always with the 1.0 SQL) */
	char	   *ordering_key;	/* NULL: none (and always with the 1.0 SQL) */
	Datum		values[10];
	char		nulls[10];
} OutboxEnqueueArgs;

static const Oid outbox_enqueue_argtypes[10] = {
	TEXTOID, TEXTOID, JSONBOID, JSONBOID, TEXTOID, TEXTOID, INT4OID,
	INTERVALOID, TEXTOID, TEXTOID
};

/*
 * The text argument "argno" of an enqueue, NULL when NULL or when the SQL
 * function has fewer arguments (1.0's has 8); "what" (dedup_key or
 * ordering_key) must be 1 to OUTBOX_MAX_DEDUP_KEY_LEN bytes, "hint" says
 * what to pass.
 */
static char *
outbox_enqueue_key_arg(FunctionCallInfo fcinfo, int argno, const char *what,
					   const char *hint)
{
	char	   *value;

	if (PG_NARGS() <= argno || PG_ARGISNULL(argno))
		return NULL;
	value = text_to_cstring(PG_GETARG_TEXT_PP(argno));
	if (value[0] == '\0' || strlen(value) > OUTBOX_MAX_DEDUP_KEY_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be 1 to %d bytes long", what,
						OUTBOX_MAX_DEDUP_KEY_LEN),
				 errdetail("The %s given is %zu bytes long.", what,
						   strlen(value)),
				 errhint("%s", hint)));
	return value;
}

/*
 * Check outbox_enqueue's arguments, before anything is written, into "a".
 */
static void
outbox_enqueue_args(FunctionCallInfo fcinfo, OutboxEnqueueArgs *a)
{
	Interval   *deliver_after = NULL;
	int32		max_attempts = idem_outbox_max_attempts;
	Size		size;

	memset(a, 0, sizeof(*a));
	a->tenant = outbox_tenant_arg(fcinfo, 0);
	idem_require_arg(fcinfo, 1, "topic");
	idem_require_arg(fcinfo, 2, "payload");
	a->payload = PG_GETARG_JSONB_P(2);

	a->topic = text_to_cstring(PG_GETARG_TEXT_PP(1));
	if (a->topic[0] == '\0' || strlen(a->topic) > OUTBOX_MAX_TOPIC_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("outbox topic must be 1 to %d bytes long",
						OUTBOX_MAX_TOPIC_LEN),
				 errhint("Name the kind of side effect, for example 'payment.capture'.")));

	if (!PG_ARGISNULL(3))
	{
		/*
		 * the rule of idempotency keys: it travels in an Idempotency-Key
		 * header
		 */
		idem_check_key(PG_GETARG_TEXT_PP(3));
		a->key = text_to_cstring(PG_GETARG_TEXT_PP(3));
	}
	if (!PG_ARGISNULL(4))
	{
		a->scope = text_to_cstring(PG_GETARG_TEXT_PP(4));
		if (a->scope[0] == '\0')
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("outbox scope must not be empty"),
					 errhint("Pass the scope of the idempotency key, or NULL for none.")));
		idem_check_name_length("scope", a->scope);
		if (a->key == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("outbox scope given without a key"),
					 errhint("Pass the key together with its scope, or neither.")));
	}
	if (!PG_ARGISNULL(5))
	{
		a->headers = PG_GETARG_JSONB_P(5);
		/* an object, or the JSON value null (stored and sent as such) */
		if ((!JB_ROOT_IS_OBJECT(a->headers) || JB_ROOT_IS_SCALAR(a->headers)) &&
			!outbox_jsonb_is_null(a->headers))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("outbox headers must be a JSON object"),
					 errhint("Pass the headers for the worker to send as an object of names and values, for example {\"Content-Type\": \"application/json\"}, or NULL for none.")));
	}
	if (!PG_ARGISNULL(6))
	{
		deliver_after = PG_GETARG_INTERVAL_P(6);
		idem_check_interval(deliver_after, "deliver_after", true,
							"Pass '0' to deliver at once, or a positive delay.");
	}
	if (!PG_ARGISNULL(7))
	{
		max_attempts = PG_GETARG_INT32(7);
		if (max_attempts <= 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("max_attempts must be positive"),
					 errdetail("The value given is %d.", max_attempts),
					 errhint("Pass at least 1, or NULL for idempotency.outbox_max_attempts.")));
	}
	a->dedup_key = outbox_enqueue_key_arg(fcinfo, 8, "dedup_key",
										  "Pass what identifies the message for its topic, such as the order id, or NULL for no deduplication.");
	a->ordering_key = outbox_enqueue_key_arg(fcinfo, 9, "ordering_key",
											 "Pass what the messages to deliver in order share, such as the account id, or NULL for no ordering.");

	/* binary (jsonb) sizes: what the row will hold */
	size = VARSIZE(a->payload) + (a->headers ? VARSIZE(a->headers) : 0);
	if (size > (Size) idem_max_payload_size)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("outbox payload is too large"),
				 errdetail("Payload and headers take %zu bytes; idempotency.max_payload_size is %d bytes.",
						   size, idem_max_payload_size),
				 errhint("Store large documents elsewhere and enqueue a reference, or raise idempotency.max_payload_size.")));

	/* the insert's parameters; NULL deliver_after is now */
	memset(a->nulls, ' ', sizeof(a->nulls));
	a->values[0] = CStringGetTextDatum(a->tenant);
	a->values[1] = PointerGetDatum(PG_GETARG_TEXT_PP(1));
	a->values[2] = JsonbPGetDatum(a->payload);
	a->values[3] = PointerGetDatum(a->headers);
	a->nulls[3] = a->headers ? ' ' : 'n';
	a->values[4] = a->scope ? CStringGetTextDatum(a->scope) : (Datum) 0;
	a->nulls[4] = a->scope ? ' ' : 'n';
	a->values[5] = a->key ? CStringGetTextDatum(a->key) : (Datum) 0;
	a->nulls[5] = a->key ? ' ' : 'n';
	a->values[6] = Int32GetDatum(max_attempts);
	if (deliver_after == NULL)
		deliver_after = palloc0(sizeof(Interval));
	a->values[7] = IntervalPGetDatum(deliver_after);
	a->values[8] = a->dedup_key ? CStringGetTextDatum(a->dedup_key) : (Datum) 0;
	a->nulls[8] = a->dedup_key ? ' ' : 'n';
	a->values[9] = a->ordering_key ?
		CStringGetTextDatum(a->ordering_key) : (Datum) 0;
	a->nulls[9] = a->ordering_key ? ' ' : 'n';
}

/*
 * Run "plan" with "nargs" parameters of "values" and "nulls" (inside SPI);
 * returns the id it answers, in its one row, or false when it answers no
 * row.  "what" names the statement in an error.
 */
static bool
outbox_enqueue_id(SPIPlanPtr plan, Datum *values, const char *nulls,
				  int expected_rc, const char *what, int64 *id)
{
	bool		isnull;
	int			rc;

	rc = idem_spi_execute(plan, values, nulls, false, 1);
	if (rc != expected_rc)
		elog(ERROR, "outbox %s failed: %s", what, SPI_result_code_string(rc));
	if (SPI_processed != 1)
		return false;
	*id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
									  SPI_tuptable->tupdesc, 1, &isnull));
	return true;
}

/*
 * Deduplicated insert (inside SPI): insert, or find the row of the same
 * tenant, topic and dedup_key; sets "id" and returns whether it inserted.
 */
static bool
outbox_enqueue_dedup(OutboxEnqueueArgs *a, int64 *id)
{
	Oid			lookup_argtypes[3] = {TEXTOID, TEXTOID, TEXTOID};
	Datum		lookup_values[3];
	SPIPlanPtr	insert;
	SPIPlanPtr	lookup;
	int			attempt;

	insert = outbox_plan(&enqueue_dedup_plan, outbox_enqueue_dedup_sql, 10,
						 (Oid *) outbox_enqueue_argtypes);
	lookup = outbox_plan(&dedup_lookup_plan, outbox_dedup_lookup_sql, 3,
						 lookup_argtypes);
	lookup_values[0] = a->values[0];
	lookup_values[1] = a->values[1];
	lookup_values[2] = a->values[8];
	for (attempt = 0;; attempt++)
	{
		if (outbox_enqueue_id(insert, a->values, a->nulls,
							  SPI_OK_INSERT_RETURNING, "insert", id))
			return true;
		/* a row with this dedup_key exists: answer its id */
		if (outbox_enqueue_id(lookup, lookup_values, NULL, SPI_OK_SELECT,
							  "dedup lookup", id))
			return false;
		/* it was deleted in between: try the insert again */
		if (attempt >= OUTBOX_DEDUP_RETRIES)
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not enqueue or find the outbox row of dedup_key \"%s\"",
							a->dedup_key),
					 errdetail("A row with this dedup_key kept being deleted while it was looked up."),
					 errhint("Retry the transaction.")));
	}
}

/*
 * outbox_enqueue(tenant text, topic text, payload jsonb, key text,
 *				  scope text, headers jsonb, deliver_after interval,
 *				  max_attempts int, dedup_key text, ordering_key text)
 *		RETURNS bigint
 *
 * Inserts one pending row in the caller's transaction and arranges a
 * NOTIFY on idempotency_outbox with the topic as payload at commit; both
 * vanish if the transaction rolls back.  Takes no lock beyond the inserted
 * row.  NULL deliver_after means now; NULL max_attempts means
 * idempotency.outbox_max_attempts.  With a dedup_key, while a row of the
 * same tenant, topic and dedup_key exists, returns that row's id and
 * inserts and notifies nothing (see outbox_enqueue_dedup_sql).  With an
 * ordering_key, first waits for other transactions enqueueing for the
 * same tenant and key (see OUTBOX_ORDER_LOCK_CLASS).
 */
static Datum
idem_outbox_enqueue_body(FunctionCallInfo fcinfo)
{
	OutboxEnqueueArgs a;
	SPIPlanPtr	plan;
	int64		id = 0;
	bool		inserted;

	outbox_enqueue_args(fcinfo, &a);

	/*
	 * On Citus the id comes from the sequence of the node that holds the
	 * tenant's shard: a call Citus did not delegate there (nested in a block
	 * or a function of the caller's) is refused, as the key functions refuse
	 * it, rather than given an id of another node's
	 */
	if (idem_citus_distributed())
		(void) idem_keys_probe_relid(get_relname_relid("keys",
													   get_namespace_oid("idempotency", false)),
									 CStringGetTextDatum(a.tenant));

	/* before the insert draws its id: see OUTBOX_ORDER_LOCK_CLASS */
	if (a.ordering_key)
		outbox_lock_ordering_key(a.tenant, a.ordering_key);

	idem_spi_connect();
	if (a.dedup_key != NULL)
		inserted = outbox_enqueue_dedup(&a, &id);
	else
	{
		if (PG_NARGS() > 8)
			plan = outbox_plan(&enqueue_plan, outbox_enqueue_sql, 10,
							   (Oid *) outbox_enqueue_argtypes);
		else
			plan = outbox_plan(&enqueue_v10_plan, outbox_enqueue_v10_sql, 8,
							   (Oid *) outbox_enqueue_argtypes);
		inserted = outbox_enqueue_id(plan, a.values, a.nulls,
									 SPI_OK_INSERT_RETURNING, "insert", &id);
		if (!inserted)
			elog(ERROR, "outbox insert returned no row");
	}
	SPI_finish();

	/*
	 * A deduplicated enqueue that found its row wrote nothing, and notifies
	 * nothing: the first enqueue did.  Transactional: delivered to listeners
	 * only when the caller commits.
	 */
	if (inserted && idem_outbox_notify)
		outbox_notify_at_commit(a.topic);
	if (inserted && idem_outbox_emit_messages)
		outbox_emit_message(a.tenant, a.topic, id, a.scope, a.key, a.payload,
							a.headers, a.ordering_key, a.values[7]);

	PG_RETURN_INT64(id);
}

/* As the owner of the function, search_path pinned (idem_owner_enter). */
Datum
idem_outbox_enqueue(PG_FUNCTION_ARGS)
{
	return idem_call_as_owner(fcinfo, idem_outbox_enqueue_body);
}

/* outbox_claim's arguments, checked before anything is read or written. */
static void
outbox_claim_args(FunctionCallInfo fcinfo, char **worker, int32 *batch,
				  Interval **lease, char **tenant)
{
	idem_require_arg(fcinfo, 0, "worker");
	idem_require_arg(fcinfo, 1, "batch");
	idem_require_arg(fcinfo, 2, "lease");
	*worker = text_to_cstring(PG_GETARG_TEXT_PP(0));
	if ((*worker)[0] == '\0' || strlen(*worker) > OUTBOX_MAX_WORKER_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("worker name must be 1 to %d bytes long",
						OUTBOX_MAX_WORKER_LEN),
				 errhint("Name the worker so leased rows show who holds them, for example host and process id.")));
	*batch = PG_GETARG_INT32(1);
	if (*batch <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch must be positive"),
				 errdetail("The value given is %d.", *batch),
				 errhint("Pass the number of rows the worker can deliver within one lease.")));
	*lease = PG_GETARG_INTERVAL_P(2);
	idem_check_interval(*lease, "lease", false,
						"Pass how long the worker needs to deliver the batch, for example '30 seconds'.");
	if (!PG_ARGISNULL(3))
	{
		ArrayType  *topics = PG_GETARG_ARRAYTYPE_P(3);

		/* a topic list that can match nothing is a mistake, not "idle" */
		if (ARR_NDIM(topics) != 1)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg(ARR_NDIM(topics) == 0 ?
							"topics must name at least one topic" :
							"topics must be a one-dimensional array"),
					 errhint("Pass the topics this worker delivers, such as '{payment.capture}', or NULL for every topic.")));
		if (ARR_HASNULL(topics))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("topics must not contain NULL"),
					 errhint("Pass the topics this worker delivers, such as '{payment.capture}', or NULL for every topic.")));
		/* nor can a name outbox_enqueue refuses as a topic */
		{
			ArrayIterator it = array_create_iterator(topics, 0, NULL);
			Datum		t;
			bool		isnull;

			while (array_iterate(it, &t, &isnull))
			{
				int			len = VARSIZE_ANY_EXHDR(DatumGetPointer(t));

				if (len == 0 || len > OUTBOX_MAX_TOPIC_LEN)
					ereport(ERROR,
							(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
							 errmsg("every topic in topics must be 1 to %d bytes long",
									OUTBOX_MAX_TOPIC_LEN),
							 errdetail("outbox_enqueue refuses such a topic, so no row can have it."),
							 errhint("Pass the topics this worker delivers, such as '{payment.capture}', or NULL for every topic.")));
			}
			array_free_iterator(it);
		}
	}
	if (!PG_ARGISNULL(4))
	{
		*tenant = text_to_cstring(PG_GETARG_TEXT_PP(4));
		idem_check_tenant(*tenant);
	}
	else
		*tenant = (char *) idem_effective_tenant();
}

#define OUTBOX_CLAIM_NO_DIRECT (-1)
static int	outbox_claim_direct(const char *worker, Interval *lease,
								Datum topics, const char *tenant,
								TupleDesc tupdesc, Tuplestorestate *tupstore);
static void outbox_claim_emit(TupleDesc source, HeapTuple *ordered, uint64 n,
							  TupleDesc tupdesc, Tuplestorestate *tupstore);

/*
 * The filters of a claim: CLAIM_FILTER_TOPICS when "topics" (a text[]
 * Datum, or 0 for any) is given, with CLAIM_ONE_TOPIC when it holds one
 * topic (a one-dimensional array of one non-null element from index 1),
 * CLAIM_FILTER_TENANT when "tenant" is given, CLAIM_ORDERED when the table
 * has ordering_key.  Sets the statement's values and nulls for both, at
 * "values[0]" and "values[1]".
 */
static int
outbox_claim_filters(Datum topics, const char *tenant, Datum *values,
					 char *nulls)
{
	int			filters = 0;

	values[0] = topics;
	nulls[0] = 'n';
	values[1] = (Datum) 0;
	nulls[1] = 'n';
	if (topics != (Datum) 0)
	{
		ArrayType  *arr = DatumGetArrayTypeP(topics);

		filters |= CLAIM_FILTER_TOPICS;
		if (ARR_NDIM(arr) == 1 && ARR_DIMS(arr)[0] == 1 &&
			ARR_LBOUND(arr)[0] == 1 && !ARR_HASNULL(arr))
			filters |= CLAIM_ONE_TOPIC;
		values[0] = PointerGetDatum(arr);
		nulls[0] = ' ';
	}
	if (tenant != NULL)
	{
		filters |= CLAIM_FILTER_TENANT;
		values[1] = CStringGetTextDatum(tenant);
		nulls[1] = ' ';
	}
	if (outbox_has_ordering_key())
		filters |= CLAIM_ORDERED;
	if (outbox_catalog() & OUTBOX_HAS_LEASE_IDX)
		filters |= CLAIM_LEASE_IDX;
	return filters;
}

/*
 * Format a claim statement, "format" with three %s (topics, tenant,
 * ordering), for "filters"; the topics are parameter $"param", the tenant
 * $"param" + 1.  The fragments are fixed: one saved plan per combination.
 * One topic is an equality, which outbox_topic_claim_idx serves in
 * available_at order without reading other topics' due rows, and so is
 * the tenant (outbox_tenant_claim_idx); several topics are
 * "= ANY", read through outbox_claim_idx in available_at order (an index
 * on the topic would return each topic's rows apart, to be sorted whole).
 * A filter not asked for leaves its parameter unreferenced (its type is
 * fixed by the prepare): a "$n IS NULL" in its place would put a gating
 * Result node into every plan, to be set up on every claim.
 */
static void
outbox_claim_sql(char *sql, size_t len, const char *format, int filters,
				 int param)
{
	char		topics[64];
	char		tenant[64];

	if (filters & CLAIM_ONE_TOPIC)
		snprintf(topics, sizeof(topics), " AND c.topic OPERATOR(pg_catalog.=) ($%d)[1]", param);
	else if (filters & CLAIM_FILTER_TOPICS)
		snprintf(topics, sizeof(topics), " AND c.topic OPERATOR(pg_catalog.=) ANY ($%d)", param);
	else
		topics[0] = '\0';
	if (filters & CLAIM_FILTER_TENANT)
		snprintf(tenant, sizeof(tenant), " AND c.tenant_id OPERATOR(pg_catalog.=) $%d", param + 1);
	else
		tenant[0] = '\0';
	snprintf(sql, len, format,
			 (filters & CLAIM_LEASE_IDX) ? OUTBOX_CLAIM_STATUS_V11 :
			 OUTBOX_CLAIM_STATUS_V10,
			 topics, tenant,
			 (filters & CLAIM_ORDERED) ? outbox_ordered_filter : "");
}

/*
 * Step 1 of a claim: lock up to "batch" due rows, FOR UPDATE SKIP LOCKED,
 * restricted to "topics" (a text[] Datum, or 0 for any) and "tenant" (NULL
 * for any): with "expired", leases that ran out, longest expired first
 * (none on a database at 1.0, whose other statement takes them with the
 * pending rows); else pending rows, oldest available_at first.  Inside
 * SPI; returns how many, with (ctid, tenant_id, id) of each in
 * SPI_tuptable, in that order.
 */
static uint64
outbox_claim_lock(int32 batch, Datum topics, const char *tenant, bool expired)
{
	Oid			argtypes[3] = {INT4OID, TEXTARRAYOID, TEXTOID};
	Datum		values[3];
	char		nulls[3] = {' ', 'n', 'n'};
	int			filters;
	int			save_nestlevel;
	SPIPlanPtr	plan;
	int			rc;

	values[0] = Int32GetDatum(batch);
	filters = outbox_claim_filters(topics, tenant, &values[1], &nulls[1]);
	if (expired && !(filters & CLAIM_LEASE_IDX))
		return 0;				/* 1.0: the expired leases come with the rest */
	plan = expired ? lock_expired_plans[filters] : lock_plans[filters];
	if (plan == NULL || idem_citus_pass_active)
	{
		char		sql[2048];

		outbox_claim_sql(sql, sizeof(sql),
						 expired ? outbox_lock_expired_sql_format :
						 outbox_lock_sql_format, filters, 2);
		plan = outbox_plan(expired ? &lock_expired_plans[filters] :
						   &lock_plans[filters], sql, 3, argtypes);
	}

	/*
	 * The generic plan prices "LIMIT $1" at a tenth of the backlog, which on
	 * a backlog of some hundred thousand rows passes jit_above_cost: JIT
	 * would then compile the statement's expressions on every claim, tens of
	 * milliseconds for a statement that reads "batch" rows.  Plan (the plan
	 * cache may re-plan here) and run it with jit off.
	 */
	save_nestlevel = NewGUCNestLevel();
	(void) set_config_option("jit", "off", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	rc = idem_spi_execute(plan, values, nulls, false, 0);
	AtEOXact_GUC(true, save_nestlevel);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "outbox claim failed: %s", SPI_result_code_string(rc));
	return SPI_processed;
}

/*
 * A claim of one row in one statement (outbox_claim_one_sql_format): lease
 * the oldest due row, when it is pending, to "worker" for "lease" and put
 * it into "tupstore" as a row of "tupdesc".  Inside SPI; returns how many
 * rows the statement leased (0 or 1).
 */
static uint64
outbox_claim_one(const char *worker, Interval *lease, Datum topics,
				 const char *tenant, TupleDesc tupdesc,
				 Tuplestorestate *tupstore)
{
	Oid			argtypes[4] = {TEXTOID, INTERVALOID, TEXTARRAYOID, TEXTOID};
	Datum		values[4];
	char		nulls[4] = {' ', ' ', 'n', 'n'};
	int			filters;
	SPIPlanPtr	plan;
	int			rc;

	values[0] = CStringGetTextDatum(worker);
	values[1] = IntervalPGetDatum(lease);
	filters = outbox_claim_filters(topics, tenant, &values[2], &nulls[2]);
	if (outbox_catalog() & OUTBOX_HAS_TOKEN_FN)
		filters |= CLAIM_TOKEN_FN;
	plan = claim_one_plans[filters];
	if (plan == NULL || idem_citus_pass_active)
	{
		char		sql[4096];

		outbox_claim_sql(sql, sizeof(sql),
						 outbox_claim_one_sql_format[OUTBOX_V11(filters)],
						 filters, 3);
		plan = outbox_plan(&claim_one_plans[filters], sql, 4, argtypes);
	}
	rc = idem_spi_execute(plan, values, nulls, false, 1);
	if (rc != SPI_OK_UPDATE_RETURNING)
		elog(ERROR, "outbox claim failed: %s", SPI_result_code_string(rc));
	if (SPI_processed > 0)
		outbox_claim_emit(SPI_tuptable->tupdesc, SPI_tuptable->vals, 1,
						  tupdesc, tupstore);
	return SPI_processed;
}

/*
 * The TID scan of the lease returns rows in physical order: put them back
 * in lock order, which is available_at order, by looking each up by key.
 * Returns the leased tuples by lock position (NULL: dead-lettered), and
 * in "*ndead" how many rows the lease dead-lettered.
 */
static HeapTuple *
outbox_claim_order(SPITupleTable *leased, uint64 nleased, ClaimedRow *rows,
				   uint64 nlocked, uint64 *ndead)
{
	int			lease_token_attno = outbox_column(leased->tupdesc, "lease_token");
	int			tenant_attno = outbox_column(leased->tupdesc, "tenant_id");
	int			id_attno = outbox_column(leased->tupdesc, "id");
	HeapTuple  *ordered;
	uint64		i;

	*ndead = 0;
	qsort(rows, nlocked, sizeof(ClaimedRow), claimed_row_cmp);
	for (i = 0; i < nleased; i++)
	{
		HeapTuple	tuple = leased->vals[i];
		bool		isnull;
		ClaimedRow	key;
		ClaimedRow *found;

		(void) SPI_getbinval(tuple, leased->tupdesc, lease_token_attno,
							 &isnull);
		if (isnull)
		{
			(*ndead)++;			/* dead-lettered by this claim */
			continue;
		}
		key.id = DatumGetInt64(SPI_getbinval(tuple, leased->tupdesc,
											 id_attno, &isnull));
		key.tenant = SPI_getvalue(tuple, leased->tupdesc, tenant_attno);
		found = bsearch(&key, rows, nlocked, sizeof(ClaimedRow),
						claimed_row_cmp);
		if (found == NULL)
			elog(ERROR, "outbox lease returned a row it did not lock");
		found->leased = tuple;
	}

	ordered = palloc0(sizeof(HeapTuple) * nlocked);
	for (i = 0; i < nlocked; i++)
		ordered[rows[i].position] = rows[i].leased;
	return ordered;
}

/*
 * Put the "n" tuples of "ordered" (of "source", the table's row) into
 * "tupstore" as rows of "tupdesc", column by column name; NULL entries
 * are skipped, a dropped column of the result type is NULL.
 */
static void
outbox_claim_emit(TupleDesc source, HeapTuple *ordered, uint64 n,
				  TupleDesc tupdesc, Tuplestorestate *tupstore)
{
	int		   *source_attno = outbox_map_columns(tupdesc, source);
	Datum	   *srcvalues = palloc(sizeof(Datum) * source->natts);
	bool	   *srcnulls = palloc(sizeof(bool) * source->natts);
	Datum	   *rowvalues = palloc(sizeof(Datum) * tupdesc->natts);
	bool	   *rownulls = palloc(sizeof(bool) * tupdesc->natts);
	uint64		i;

	for (i = 0; i < n; i++)
	{
		if (ordered[i] == NULL)
			continue;			/* dead-lettered */
		heap_deform_tuple(ordered[i], source, srcvalues, srcnulls);
		for (int a = 0; a < tupdesc->natts; a++)
		{
			if (source_attno[a] == 0)
			{
				/* a dropped column of the row type */
				rowvalues[a] = (Datum) 0;
				rownulls[a] = true;
				continue;
			}
			rowvalues[a] = srcvalues[source_attno[a] - 1];
			rownulls[a] = srcnulls[source_attno[a] - 1];
		}
		/* copies the values into the tuplestore's context */
		tuplestore_putvalues(tupstore, tupdesc, rowvalues, rownulls);
	}
}

/*
 * Step 2 of a claim: lease the "nlocked" rows of "locked" to "worker" and
 * put them into "tupstore" as rows of "tupdesc" (the function's result
 * type, mapped by column name), in the order they were locked.  A row the
 * lease dead-lettered (its expired lease used up its attempts) is left out.
 * Returns how many rows it dead-lettered.
 */
static uint64
outbox_claim_lease(SPITupleTable *locked, uint64 nlocked, const char *worker,
				   Interval *lease, TupleDesc tupdesc,
				   Tuplestorestate *tupstore)
{
	Oid			argtypes[3] = {TEXTOID, INTERVALOID, TIDARRAYOID};
	Datum		values[3];
	Datum	   *tids = palloc(sizeof(Datum) * nlocked);
	ClaimedRow *rows = palloc(sizeof(ClaimedRow) * nlocked);
	SPIPlanPtr	plan;
	SPITupleTable *leased;
	HeapTuple  *ordered;
	int			v11;
	int			rc;
	uint64		i;
	uint64		ndead;

	for (i = 0; i < nlocked; i++)
	{
		bool		isnull;

		tids[i] = SPI_getbinval(locked->vals[i], locked->tupdesc, 1, &isnull);
		rows[i].tenant = SPI_getvalue(locked->vals[i], locked->tupdesc, 2);
		rows[i].id = DatumGetInt64(SPI_getbinval(locked->vals[i],
												 locked->tupdesc, 3,
												 &isnull));
		rows[i].position = i;
		rows[i].leased = NULL;
	}
	values[0] = CStringGetTextDatum(worker);
	values[1] = IntervalPGetDatum(lease);
	values[2] = PointerGetDatum(construct_array(tids, (int) nlocked, TIDOID,
												sizeof(ItemPointerData), false,
												TYPALIGN_SHORT));
	v11 = (outbox_catalog() & OUTBOX_HAS_TOKEN_FN) ? 1 : 0;
	plan = outbox_plan(&lease_plans[v11], outbox_lease_sql[v11], 3, argtypes);
	rc = idem_spi_execute(plan, values, NULL, false, 0);
	if (rc != SPI_OK_UPDATE_RETURNING)
		elog(ERROR, "outbox lease failed: %s", SPI_result_code_string(rc));
	leased = SPI_tuptable;

	ordered = outbox_claim_order(leased, SPI_processed, rows, nlocked, &ndead);
	outbox_claim_emit(leased->tupdesc, ordered, nlocked, tupdesc, tupstore);
	return ndead;
}

/* Raise 0A000 unless the caller accepts a set in materialize mode. */
static void
outbox_require_set_context(FunctionCallInfo fcinfo, const char *name)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;

	if (rsinfo == NULL || !IsA(rsinfo, ReturnSetInfo) ||
		(rsinfo->allowedModes & SFRM_Materialize) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("%s must be called in a context that accepts a set", name),
				 errhint("Call it in FROM: SELECT * FROM %s(...).", name)));
}

/*
 * Lock idempotency.outbox as an UPDATE of it does (RowExclusiveLock), for a
 * call that reads the claim indexes with one statement (SELECT ... FOR
 * UPDATE SKIP LOCKED, which locks the table in a weaker mode) and then
 * updates the rows it locked with another.  Otherwise a REINDEX of the
 * table that arrives between the two takes the table, then waits for the
 * index this call has read, while this call waits for the table: a
 * deadlock (40P01).  Locked first, the two wait for each other in turn.
 * Not in a read-only transaction or on a standby, where the update is
 * refused anyway (25006).
 */
void
idem_outbox_lock_for_update(void)
{
	Oid			relid;

	if (XactReadOnly || RecoveryInProgress())
		return;
	relid = get_relname_relid("outbox", get_namespace_oid("idempotency", false));
	if (OidIsValid(relid))
		LockRelationOid(relid, RowExclusiveLock);
}

/*
 * outbox_claim(worker text, batch int, lease interval, topics text[],
 *				tenant text) RETURNS SETOF idempotency.outbox
 *
 * Leases up to "batch" rows that are due (pending, or leased with an
 * expired lease), oldest available_at first, to "worker" for "lease":
 * status leased, a fresh lease_token, lease_until = now + lease.  Rows are
 * locked FOR UPDATE SKIP LOCKED: rows held by a concurrent claimer are
 * skipped, never waited for.  "topics" and "tenant" (NULL: any) filter the
 * candidates; when idempotency.tenant is set and "tenant" is NULL, only
 * that tenant's rows are claimed.  Returns the leased rows.
 */
static Datum
idem_outbox_claim_body(FunctionCallInfo fcinfo)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	char	   *worker;
	int32		batch;
	Interval   *lease;
	char	   *tenant;
	TupleDesc	tupdesc;
	Tuplestorestate *tupstore;
	uint64		nlocked;
	int			npasses;
	int			first;
	int			pass;

	outbox_require_set_context(fcinfo, "outbox_claim");
	outbox_claim_args(fcinfo, &worker, &batch, &lease, &tenant);

	/* the result set, in the query's memory, as the function's row type */
	InitMaterializedSRF(fcinfo, 0);
	tupstore = rsinfo->setResult;
	tupdesc = rsinfo->setDesc;

	/* one row, on the table as the extension makes it: without the executor */
	if (batch == 1 &&
		outbox_claim_direct(worker, lease,
							PG_ARGISNULL(3) ? (Datum) 0 : PG_GETARG_DATUM(3),
							tenant, tupdesc, tupstore) != OUTBOX_CLAIM_NO_DIRECT)
		return (Datum) 0;

	idem_outbox_lock_for_update();
	idem_spi_connect();
	npasses = idem_citus_passes();
	first = idem_citus_first_pass(npasses);
	for (pass = 0; pass < npasses && batch > 0; pass++)
	{
		/*
		 * On Citus, the local shards one after the other, until the batch is
		 * full: SKIP LOCKED works within a shard (citus.c).
		 */
		Datum		topics = PG_ARGISNULL(3) ? (Datum) 0 : PG_GETARG_DATUM(3);

		idem_citus_enter((first + pass) % npasses);

		/*
		 * Expired leases first (1.1): each is leased again with its lost
		 * attempt counted, or dead-lettered when that was its last; rows
		 * dead-lettered leave their places to the next expired leases, until
		 * none is left or the batch is full.  Each round either fills the
		 * batch, finds none, or dead-letters rows for good, so the loop ends.
		 */
		while (batch > 0)
		{
			uint64		ndead;
			int32		asked = batch;

			nlocked = outbox_claim_lock(batch, topics, tenant, true);
			if (nlocked == 0)
				break;
			ndead = outbox_claim_lease(SPI_tuptable, nlocked, worker, lease,
									   tupdesc, tupstore);
			batch -= (int32) (nlocked - ndead);
			if (nlocked < (uint64) asked)
				break;			/* no expired lease left to lock */
		}
		while (batch > 0)
		{
			uint64		ndead;

			if (batch == 1 &&
				outbox_claim_one(worker, lease, topics, tenant, tupdesc,
								 tupstore) > 0)
			{
				batch = 0;
				break;
			}
			nlocked = outbox_claim_lock(batch, topics, tenant, false);
			if (nlocked == 0)
				break;
			ndead = outbox_claim_lease(SPI_tuptable, nlocked, worker, lease,
									   tupdesc, tupstore);
			batch -= (int32) (nlocked - ndead);

			/*
			 * (1.0, which locks expired leases with the pending rows.) Rows
			 * whose expired lease used up their last attempt became dead
			 * instead of being leased: look again for due rows to take their
			 * places, so that an empty result means nothing is due. Each pass
			 * either fills the batch, finds nothing, or dead-letters rows for
			 * good, so the loop ends.
			 */
			if (ndead == 0)
				break;
		}
		idem_citus_leave();
	}
	SPI_finish();
	return (Datum) 0;
}

/* As the owner of the function, search_path pinned (idem_owner_enter). */
Datum
idem_outbox_claim(PG_FUNCTION_ARGS)
{
	return idem_call_as_owner(fcinfo, idem_outbox_claim_body);
}

/*
 * The ack of a kept row without the executor.
 *
 * An ack is one UPDATE of one row found by primary key, and a worker sends
 * one per message: executor start-up for it (plan copy, index scan and
 * ModifyTable state, the indexes opened and their predicates prepared)
 * costs as much again as the update itself.  outbox_ack_direct does what
 * that UPDATE does: it probes outbox_pkey with the statement's snapshot (a
 * fresh one under READ COMMITTED, after a command-counter increment, as
 * SPI takes it), checks the fence on the version it sees, updates that
 * version with table_tuple_update (the row lock, the wait for a concurrent
 * writer, WAL, logical decoding and SERIALIZABLE checks are the table AM's)
 * and inserts the new version into each index whose predicate it
 * satisfies, as ExecInsertIndexTuples does.
 *
 * When a concurrent transaction updated or deleted the row after the
 * snapshot (an extend by the same worker, a reclaim once the lease
 * expired, another ack), the update waits for it and fails; under READ
 * COMMITTED the ack then starts over with a fresh snapshot and checks the
 * fence on the version that transaction left, which is what EvalPlanQual
 * does for the UPDATE (the row is found by a key no update changes).
 * Under REPEATABLE READ and SERIALIZABLE it raises the serialization
 * failure the UPDATE would raise.
 *
 * With outbox_retention = 0 the ack deletes the row the same way, with
 * table_tuple_delete (a deleted row needs no index entry).
 *
 * Only for the table as the extension creates it: no trigger, rule, row
 * security, partition or Citus, only B-tree indexes on columns, no
 * exclusion or deferred constraint, no CHECK constraint on a column the
 * ack changes (the ack leaves the others as they are, so theirs still
 * hold), no NOT NULL on one it may set to null, and no generated column;
 * and only in a transaction that may write.  Anything else goes through
 * the SPI statement.
 */
#define OUTBOX_ACK_NO_DIRECT 0	/* use the SPI statement */
#define OUTBOX_ACK_DONE 1
#define OUTBOX_ACK_MISS 2		/* no row passed the fence */

/*
 * Whether the table has a generated column (a DBA's): stored ones are
 * computed by the executor, and a CHECK over a virtual one (PostgreSQL 18)
 * names the generated column, not the columns it is computed from, so the
 * check below could not see that the ack changes them.
 */
static bool
outbox_has_generated(TupleDesc desc)
{
	if (desc->constr == NULL)
		return false;
#if PG_VERSION_NUM >= 180000
	if (desc->constr->has_generated_virtual)
		return true;
#endif
	return desc->constr->has_generated_stored;
}

/*
 * The index "name" of "heap" (idempotency.outbox), if it is a valid B-tree
 * on (col1, col2), or (col2) when col1 is NULL, without expressions; else
 * InvalidOid.  outbox_claim_direct reads the claim indexes by name.
 */
static Oid
outbox_direct_claim_index(Relation heap, const char *name, const char *col1,
						  const char *col2)
{
	Oid			relid = RelationGetRelid(heap);
	Oid			indexid = get_relname_relid(name, RelationGetNamespace(heap));
	Relation	index;
	bool		match;
	int			ncols = col1 == NULL ? 1 : 2;

	if (!OidIsValid(indexid))
		return InvalidOid;
	index = index_open(indexid, AccessShareLock);
	match = index->rd_index->indrelid == relid &&
		index->rd_rel->relam == BTREE_AM_OID &&
		index->rd_index->indisvalid &&
		index->rd_index->indnkeyatts == ncols &&
		RelationGetIndexExpressions(index) == NIL &&
		index->rd_index->indkey.values[ncols - 1] == get_attnum(relid, col2) &&
		(col1 == NULL || index->rd_index->indkey.values[0] == get_attnum(relid, col1));
	index_close(index, AccessShareLock);
	return match ? indexid : InvalidOid;
}

/*
 * Whether column "attnum" of "desc" is of type "typid" itself: not a domain
 * over it, without a type modifier.  A column the direct paths read or set
 * that a DBA gave another type sends them to the statements, which convert
 * and check the values (length, domain constraints) as an UPDATE does.
 */
static bool
outbox_attr_typed(TupleDesc desc, AttrNumber attnum, Oid typid)
{
	Form_pg_attribute att;

	if (attnum == InvalidAttrNumber)
		return false;
	att = TupleDescAttr(desc, attnum - 1);
	return att->atttypid == typid && att->atttypmod == -1;
}

/*
 * Whether the ack may update "heap" (idempotency.outbox, opened) directly;
 * fills outbox_direct, with what inserting a new version into each index
 * needs (its IndexInfo and prepared predicate), kept until the next
 * invalidation of the table (which any change to its indexes, constraints
 * or triggers sends): the executor would build them for every UPDATE.
 */
static bool
outbox_direct_check(Relation heap)
{
	TupleDesc	desc = RelationGetDescr(heap);
	Oid			relid = RelationGetRelid(heap);
	Oid			status_type;
	Bitmapset  *changed = NULL;
	Bitmapset  *claim_changed = NULL;
	List	   *indexes;
	ListCell   *lc;
	bool		usable;
	MemoryContext oldcxt;
	uint64		invals = outbox_direct_invals;

	if (outbox_direct.cxt == NULL)
		outbox_direct.cxt = AllocSetContextCreate(CacheMemoryContext,
												  "idempotency outbox ack",
												  ALLOCSET_SMALL_SIZES);
	else
		MemoryContextReset(outbox_direct.cxt);
	outbox_direct.nindexes = 0;
	outbox_direct.indexes = NULL;
	outbox_direct.econtext = NULL;
	oldcxt = MemoryContextSwitchTo(outbox_direct.cxt);

	outbox_direct.status = get_attnum(relid, "status");
	outbox_direct.lease_token = get_attnum(relid, "lease_token");
	outbox_direct.done_at = get_attnum(relid, "done_at");
	outbox_direct.provider_ref = get_attnum(relid, "provider_ref");
	outbox_direct.lease_until = get_attnum(relid, "lease_until");
	outbox_direct.leased_by = get_attnum(relid, "leased_by");
	outbox_direct.available_at = get_attnum(relid, "available_at");
	outbox_direct.tenant_id = get_attnum(relid, "tenant_id");
	outbox_direct.topic = get_attnum(relid, "topic");
	outbox_direct.id = get_attnum(relid, "id");
	outbox_direct.ordering_key = get_attnum(relid, "ordering_key");
	outbox_direct.claim_idx = outbox_direct_claim_index(heap, "outbox_claim_idx",
														NULL, "available_at");
	outbox_direct.topic_claim_idx =
		outbox_direct_claim_index(heap, "outbox_topic_claim_idx", "topic",
								  "available_at");
	outbox_direct.tenant_claim_idx =
		outbox_direct_claim_index(heap, "outbox_tenant_claim_idx", "tenant_id",
								  "available_at");
	outbox_direct.lease_idx = outbox_direct_claim_index(heap, "outbox_lease_idx",
														NULL, "lease_until");
#if PG_VERSION_NUM >= 180000
	outbox_direct.pkey = RelationGetPrimaryKeyIndex(heap, false);
#else
	outbox_direct.pkey = RelationGetPrimaryKeyIndex(heap);
#endif
	usable = outbox_direct.status != InvalidAttrNumber &&
		outbox_direct.lease_token != InvalidAttrNumber &&
		outbox_direct.done_at != InvalidAttrNumber &&
		outbox_direct.provider_ref != InvalidAttrNumber &&
		outbox_direct.lease_until != InvalidAttrNumber &&
	/* the types the ack reads and writes */
		outbox_attr_typed(desc, outbox_direct.lease_token, UUIDOID) &&
		outbox_attr_typed(desc, outbox_direct.done_at, TIMESTAMPTZOID) &&
		outbox_attr_typed(desc, outbox_direct.provider_ref, TEXTOID) &&
		outbox_attr_typed(desc, outbox_direct.lease_until, TIMESTAMPTZOID) &&
		get_typtype(TupleDescAttr(desc, outbox_direct.status - 1)->atttypid) == TYPTYPE_ENUM &&
		TupleDescAttr(desc, outbox_direct.status - 1)->atttypmod == -1 &&
	/* a DBA's NOT NULL on a column the ack may set to null */
		!TupleDescAttr(desc, outbox_direct.provider_ref - 1)->attnotnull &&
		!TupleDescAttr(desc, outbox_direct.lease_until - 1)->attnotnull &&
		OidIsValid(outbox_direct.pkey) &&
		heap->rd_rel->relkind == RELKIND_RELATION &&
		heap->rd_rel->relam == HEAP_TABLE_AM_OID &&
		!heap->rd_rel->relispartition &&
		!heap->rd_rel->relrowsecurity &&
		heap->trigdesc == NULL &&
	/* not relhasrules: it stays set after the last rule is dropped */
		heap->rd_rules == NULL &&
		!outbox_has_generated(desc) &&
		!OidIsValid(get_relname_relid("pg_dist_partition",
									  PG_CATALOG_NAMESPACE));
	if (usable)
	{
		changed = bms_add_member(changed, outbox_direct.status);
		changed = bms_add_member(changed, outbox_direct.done_at);
		changed = bms_add_member(changed, outbox_direct.provider_ref);
		changed = bms_add_member(changed, outbox_direct.lease_until);

		status_type = TupleDescAttr(desc, outbox_direct.status - 1)->atttypid;
		outbox_direct.pending = idem_enum_label_oid(status_type, "pending");
		outbox_direct.leased = idem_enum_label_oid(status_type, "leased");
		outbox_direct.done = idem_enum_label_oid(status_type, "done");
	}

	/*
	 * outbox_claim_direct: the columns it reads and sets, and its indexes; a
	 * CHECK constraint on a column it sets leaves claims to the executor
	 */
	outbox_direct.claim_usable = usable &&
		outbox_attr_typed(desc, outbox_direct.leased_by, TEXTOID) &&
		outbox_attr_typed(desc, outbox_direct.available_at, TIMESTAMPTZOID) &&
		outbox_attr_typed(desc, outbox_direct.tenant_id, TEXTOID) &&
		outbox_attr_typed(desc, outbox_direct.topic, TEXTOID) &&
		outbox_attr_typed(desc, outbox_direct.id, INT8OID) &&
		outbox_attr_typed(desc, outbox_direct.ordering_key, TEXTOID) &&
		OidIsValid(outbox_direct.claim_idx) &&
		OidIsValid(outbox_direct.topic_claim_idx) &&
		OidIsValid(outbox_direct.tenant_claim_idx);
	if (outbox_direct.claim_usable)
	{
		claim_changed = bms_add_member(claim_changed, outbox_direct.status);
		claim_changed = bms_add_member(claim_changed, outbox_direct.lease_token);
		claim_changed = bms_add_member(claim_changed, outbox_direct.leased_by);
		claim_changed = bms_add_member(claim_changed, outbox_direct.lease_until);
		claim_changed = bms_add_member(claim_changed, outbox_direct.available_at);
	}
	for (int i = 0; outbox_direct.claim_usable && desc->constr != NULL &&
		 i < desc->constr->num_check; i++)
	{
		Bitmapset  *attrs = NULL;
		int			attr = -1;

		pull_varattnos(stringToNode(desc->constr->check[i].ccbin), 1, &attrs);
		while (outbox_direct.claim_usable &&
			   (attr = bms_next_member(attrs, attr)) >= 0)
		{
			AttrNumber	attnum = attr + FirstLowInvalidHeapAttributeNumber;

			if (attnum <= 0 || bms_is_member(attnum, claim_changed))
				outbox_direct.claim_usable = false;
		}
	}

	/* a CHECK constraint on a column the ack changes: the executor checks */
	for (int i = 0; usable && desc->constr != NULL &&
		 i < desc->constr->num_check; i++)
	{
		Bitmapset  *attrs = NULL;
		int			attr = -1;

		pull_varattnos(stringToNode(desc->constr->check[i].ccbin), 1, &attrs);
		while (usable && (attr = bms_next_member(attrs, attr)) >= 0)
		{
			AttrNumber	attnum = attr + FirstLowInvalidHeapAttributeNumber;

			if (attnum <= 0 || bms_is_member(attnum, changed))
				usable = false;
		}
	}

	/*
	 * Indexes: B-trees on columns and expressions (outbox_ordering_idx is on
	 * a hash of two columns); exclusion and deferred uniqueness are the
	 * executor's.
	 */
	indexes = usable ? RelationGetIndexList(heap) : NIL;
	outbox_direct.indexes = palloc0(Max(list_length(indexes), 1) *
									sizeof(OutboxDirectIndex));
	foreach(lc, indexes)
	{
		Relation	index = index_open(lfirst_oid(lc), AccessShareLock);
		OutboxDirectIndex *entry;
		IndexInfo  *info;

		if (index->rd_rel->relam != BTREE_AM_OID ||
			index->rd_index->indisexclusion ||
			!index->rd_index->indimmediate)
		{
			usable = false;
			index_close(index, AccessShareLock);
			break;
		}
		info = BuildIndexInfo(index);
		entry = &outbox_direct.indexes[outbox_direct.nindexes++];
		entry->oid = lfirst_oid(lc);
		entry->info = info;
		entry->predicate = info->ii_Predicate == NIL ? NULL :
			ExecInitQual((List *) expression_planner((Expr *) info->ii_Predicate),
						 NULL);
		entry->exprs = info->ii_Expressions == NIL ? NIL :
			ExecInitExprList((List *) expression_planner((Expr *) info->ii_Expressions),
							 NULL);
		entry->unique = index->rd_index->indisunique;
		entry->unchanged = true;
		entry->claim_unchanged = true;
		for (int a = 0; a < info->ii_NumIndexAttrs; a++)
		{
			if (info->ii_IndexAttrNumbers[a] < 0)
				usable = false; /* a system column: the executor's */
			if (bms_is_member(info->ii_IndexAttrNumbers[a], changed))
				entry->unchanged = false;
			if (bms_is_member(info->ii_IndexAttrNumbers[a], claim_changed))
				entry->claim_unchanged = false;
		}
		if (info->ii_Expressions != NIL)
		{
			Bitmapset  *attrs = NULL;
			int			attr = -1;

			/* the columns its expressions read */
			pull_varattnos((Node *) info->ii_Expressions, 1, &attrs);
			while ((attr = bms_next_member(attrs, attr)) >= 0)
			{
				AttrNumber	attnum = attr + FirstLowInvalidHeapAttributeNumber;

				if (attnum <= 0)
					usable = false;
				if (bms_is_member(attnum, changed))
					entry->unchanged = false;
				if (bms_is_member(attnum, claim_changed))
					entry->claim_unchanged = false;
			}
		}
		index_close(index, AccessShareLock);
		if (!usable)
			break;
	}
	if (usable)
		outbox_direct.econtext = CreateStandaloneExprContext();
	MemoryContextSwitchTo(oldcxt);

	outbox_direct.relid = relid;
	outbox_direct.usable = usable;
	outbox_direct.claim_usable = outbox_direct.claim_usable && usable;
	/* an invalidation that came while this was read: read it again next time */
	outbox_direct.valid = invals == outbox_direct_invals;
	return usable;
}

/*
 * Insert the new version in "slot" into the indexes that take it, as
 * ExecInsertIndexTuples does for an UPDATE: an index not ready for
 * inserts, or whose predicate the version fails, is skipped (and not
 * opened: a done row enters only the primary key and outbox_done_idx, and
 * outbox_dedup_idx when it has a dedup_key).  "pkey" is open already.
 * "update_indexes": what table_tuple_update said of them (none when the
 * update was HOT; on 16 and later, summarizing ones only when it was HOT
 * for the others).  "claim": the update is a claim's (else an ack's),
 * which tells the index whether its key columns changed.
 */
#if PG_VERSION_NUM >= 160000
typedef TU_UpdateIndexes OutboxUpdateIndexes;
#else
typedef bool OutboxUpdateIndexes;
#endif

/*
 * The values of "entry"'s columns for the version in "slot", as
 * FormIndexDatum computes them, its expressions evaluated in "econtext"
 * (FormIndexDatum wants an executor state for them).
 */
static void
outbox_direct_index_values(OutboxDirectIndex *entry, TupleTableSlot *slot,
						   ExprContext *econtext, Datum *values, bool *isnull)
{
	ListCell   *next = list_head(entry->exprs);

	for (int a = 0; a < entry->info->ii_NumIndexAttrs; a++)
	{
		AttrNumber	attnum = entry->info->ii_IndexAttrNumbers[a];

		if (attnum != 0)
			values[a] = slot_getattr(slot, attnum, &isnull[a]);
		else
		{
			Assert(next != NULL);
			values[a] = ExecEvalExprSwitchContext((ExprState *) lfirst(next),
												  econtext, &isnull[a]);
			next = lnext(entry->exprs, next);
		}
	}
}

static void
outbox_direct_index(Relation heap, Relation pkey, TupleTableSlot *slot,
					OutboxUpdateIndexes update_indexes, bool claim)
{
	ExprContext *econtext = outbox_direct.econtext;
#if PG_VERSION_NUM >= 160000
	bool		summarizing_only = update_indexes == TU_Summarizing;

	if (update_indexes == TU_None)
		return;
#else
	bool		summarizing_only = false;

	if (!update_indexes)
		return;
#endif

	econtext->ecxt_scantuple = slot;
	for (int i = 0; i < outbox_direct.nindexes; i++)
	{
		OutboxDirectIndex *entry = &outbox_direct.indexes[i];
		Relation	index;
		Datum		values[INDEX_MAX_KEYS];
		bool		isnull[INDEX_MAX_KEYS];

		if (!entry->info->ii_ReadyForInserts)
			continue;
#if PG_VERSION_NUM >= 160000
		if (summarizing_only && !entry->info->ii_Summarizing)
			continue;
#else
		(void) summarizing_only;
#endif
		if (entry->predicate != NULL && !ExecQual(entry->predicate, econtext))
			continue;
		index = entry->oid == RelationGetRelid(pkey) ? pkey :
			index_open(entry->oid, RowExclusiveLock);
		outbox_direct_index_values(entry, slot, econtext, values, isnull);
		(void) index_insert(index, values, isnull, &slot->tts_tid, heap,
							entry->unique ? UNIQUE_CHECK_YES : UNIQUE_CHECK_NO,
							claim ? entry->claim_unchanged : entry->unchanged,
							entry->info);
		if (index != pkey)
			index_close(index, NoLock);
	}
	ResetExprContext(econtext);
}

/*
 * idempotency.outbox, opened (RowExclusiveLock) for a direct ack, or a
 * direct claim when "claim", with outbox_direct current; NULL when the
 * table is not one these may write (the caller runs its statement).
 */
static Relation
outbox_direct_open(bool claim)
{
	Relation	heap;

	/* registers the relcache callback that clears outbox_direct */
	(void) outbox_catalog();
	if (outbox_direct.valid &&
		!(claim ? outbox_direct.claim_usable : outbox_direct.usable))
		return NULL;
	if (!outbox_direct.valid)
	{
		Oid			nsp = get_namespace_oid("idempotency", false);

		outbox_direct.relid = get_relname_relid("outbox", nsp);
		if (!OidIsValid(outbox_direct.relid))
			return NULL;
	}
	/* locking processes invalidations: check again once the table is ours */
	heap = table_open(outbox_direct.relid, RowExclusiveLock);
	if (!outbox_direct.valid)
		(void) outbox_direct_check(heap);
	if (!(claim ? outbox_direct.claim_usable : outbox_direct.usable))
	{
		table_close(heap, NoLock);
		return NULL;
	}
	return heap;
}

/*
 * After a direct update or delete that failed with "res": true when a
 * concurrent transaction changed or deleted the row and the ack, under
 * READ COMMITTED, should check the fence again on what it left (as
 * EvalPlanQual would); the serialization failure of REPEATABLE READ and
 * SERIALIZABLE, and the executor's error for a row changed by the same
 * command, are raised.  False for anything else.
 */
static bool
outbox_direct_retry(TM_Result res, TM_FailureData *tmfd, CommandId cid,
					int64 id)
{
	if (res == TM_Updated || res == TM_Deleted)
	{
		if (IsolationUsesXactSnapshot())
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not serialize access to outbox row " INT64_FORMAT,
							id),
					 errdetail("The row was changed by a transaction that committed after this transaction's snapshot was taken."),
					 errhint(IDEM_SERIALIZATION_HINT)));
		return true;
	}
	if (res == TM_SelfModified && tmfd->cmax == cid)
		ereport(ERROR,
				(errcode(ERRCODE_TRIGGERED_DATA_CHANGE_VIOLATION),
				 errmsg("tuple to be updated was already modified by an operation triggered by the current command")));
	return false;
}

/*
 * outbox_ack directly (see above), marking the row done, or deleting it
 * when "delete_row" (outbox_retention = 0): returns OUTBOX_ACK_DONE,
 * OUTBOX_ACK_MISS when no row of "tenant" and "id" is leased with "token"
 * (nothing written; the caller explains why), or OUTBOX_ACK_NO_DIRECT.
 */
static int
outbox_ack_direct(Datum tenant, int64 id, Datum token, Datum ref,
				  bool ref_null, bool delete_row)
{
	Relation	heap;
	Relation	pkey;
	TupleDesc	desc;
	TupleTableSlot *oldslot;
	TupleTableSlot *newslot;
	Datum	   *values;
	bool	   *nulls;
	ScanKeyData skey[2];
	CommandId	cid;
	int			result = OUTBOX_ACK_MISS;

	/*
	 * A read-only transaction (and a standby's) gets the executor's error:
	 * the table AM does not check.
	 */
	if (XactReadOnly || RecoveryInProgress())
		return OUTBOX_ACK_NO_DIRECT;
	heap = outbox_direct_open(false);
	if (heap == NULL)
		return OUTBOX_ACK_NO_DIRECT;
	CheckCmdReplicaIdentity(heap, delete_row ? CMD_DELETE : CMD_UPDATE);
	desc = RelationGetDescr(heap);

	pkey = index_open(outbox_direct.pkey, RowExclusiveLock);
	if (pkey->rd_index->indnkeyatts != 2)
		elog(ERROR, "idempotency.outbox has no primary key on (tenant_id, id)");
	ScanKeyEntryInitialize(&skey[0], 0, 1, BTEqualStrategyNumber, InvalidOid,
						   pkey->rd_indcollation[0], F_TEXTEQ, tenant);
	ScanKeyEntryInitialize(&skey[1], 0, 2, BTEqualStrategyNumber, InvalidOid,
						   InvalidOid, F_INT8EQ, Int64GetDatum(id));

	oldslot = table_slot_create(heap, NULL);
	newslot = MakeSingleTupleTableSlot(desc, &TTSOpsHeapTuple);
	values = palloc(desc->natts * sizeof(Datum));
	nulls = palloc(desc->natts * sizeof(bool));

	for (;;)
	{
		Snapshot	snapshot;
		IndexScanDesc scan;
		bool		found;
		bool		isnull;
		Datum		cur;
		ItemPointerData tid;
		TM_Result	res;
		TM_FailureData tmfd;
		LockTupleMode lockmode;
		OutboxUpdateIndexes update_indexes;

		CommandCounterIncrement();
		cid = GetCurrentCommandId(true);
		snapshot = RegisterSnapshot(GetTransactionSnapshot());
#if PG_VERSION_NUM >= 180000
		scan = index_beginscan(heap, pkey, snapshot, NULL, 2, 0);
#else
		scan = index_beginscan(heap, pkey, snapshot, 2, 0);
#endif
		index_rescan(scan, skey, 2, NULL, 0);
		found = index_getnext_slot(scan, ForwardScanDirection, oldslot);
		index_endscan(scan);

		/* the fence: leased, and by this token */
		if (found)
		{
			cur = slot_getattr(oldslot, outbox_direct.status, &isnull);
			found = !isnull && DatumGetObjectId(cur) == outbox_direct.leased;
		}
		if (found)
		{
			cur = slot_getattr(oldslot, outbox_direct.lease_token, &isnull);
			found = !isnull &&
				memcmp(DatumGetUUIDP(cur), DatumGetUUIDP(token),
					   UUID_LEN) == 0;
		}
		if (!found)
		{
			UnregisterSnapshot(snapshot);
			result = OUTBOX_ACK_MISS;
			break;
		}

		if (delete_row)
		{
			tid = oldslot->tts_tid;
			ExecClearTuple(oldslot);
			res = table_tuple_delete(heap, &tid, cid, snapshot,
									 InvalidSnapshot, true, &tmfd, false);
			UnregisterSnapshot(snapshot);
			if (res == TM_Ok)
			{
				result = OUTBOX_ACK_DONE;
				break;
			}
			if (!outbox_direct_retry(res, &tmfd, cid, id))
				elog(ERROR, "unexpected result %d deleting an outbox row",
					 (int) res);
			continue;
		}

		slot_getallattrs(oldslot);
		memcpy(values, oldslot->tts_values, desc->natts * sizeof(Datum));
		memcpy(nulls, oldslot->tts_isnull, desc->natts * sizeof(bool));
		values[outbox_direct.status - 1] = ObjectIdGetDatum(outbox_direct.done);
		nulls[outbox_direct.status - 1] = false;
		values[outbox_direct.done_at - 1] =
			TimestampTzGetDatum(Max(GetCurrentStatementStartTimestamp(),
									GetCurrentTransactionStartTimestamp()));
		nulls[outbox_direct.done_at - 1] = false;
		values[outbox_direct.provider_ref - 1] = ref;
		nulls[outbox_direct.provider_ref - 1] = ref_null;
		nulls[outbox_direct.lease_until - 1] = true;
		ExecStoreHeapTuple(heap_form_tuple(desc, values, nulls), newslot, true);
		tid = oldslot->tts_tid;
		ExecClearTuple(oldslot);

		res = table_tuple_update(heap, &tid, newslot, cid, snapshot,
								 InvalidSnapshot, true, &tmfd, &lockmode,
								 &update_indexes);
		UnregisterSnapshot(snapshot);
		if (res == TM_Ok)
		{
			outbox_direct_index(heap, pkey, newslot, update_indexes, false);
			result = OUTBOX_ACK_DONE;
			break;
		}
		if (!outbox_direct_retry(res, &tmfd, cid, id))
			elog(ERROR, "unexpected result %d updating an outbox row",
				 (int) res);
	}

	ExecDropSingleTupleTableSlot(oldslot);
	ExecDropSingleTupleTableSlot(newslot);
	index_close(pkey, NoLock);
	table_close(heap, NoLock);
	return result;
}

/*
 * Whether outbox_lease_idx has a lease of "heap" that ended by "now" and
 * that a claim for "topic" (0: any) and "tenant" (NULL: any) takes, in
 * the claim's "snapshot".  Leases end in the future but when workers die, so this
 * reads an empty range of the index, or the few leases that ran out.
 */
static bool
outbox_expired_lease_exists(Relation heap, TimestampTz now, Datum topic,
							const char *tenant, Snapshot snapshot)
{
	Relation	index;
	ScanKeyData skey;
	IndexScanDesc scan;
	TupleTableSlot *slot;
	bool		found = false;

	index = index_open(outbox_direct.lease_idx, AccessShareLock);
	ScanKeyEntryInitialize(&skey, 0, 1, BTLessEqualStrategyNumber, InvalidOid,
						   InvalidOid, F_TIMESTAMPTZ_LE,
						   TimestampTzGetDatum(now));
	slot = table_slot_create(heap, NULL);
#if PG_VERSION_NUM >= 180000
	scan = index_beginscan(heap, index, snapshot, NULL, 1, 0);
#else
	scan = index_beginscan(heap, index, snapshot, 1, 0);
#endif
	index_rescan(scan, &skey, 1, NULL, 0);
	while (!found && index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		bool		isnull;
		Datum		value;

		value = slot_getattr(slot, outbox_direct.status, &isnull);
		if (isnull || DatumGetObjectId(value) != outbox_direct.leased)
			continue;
		if (tenant != NULL)
		{
			value = slot_getattr(slot, outbox_direct.tenant_id, &isnull);
			if (isnull || strcmp(TextDatumGetCString(value), tenant) != 0)
				continue;
		}
		if (topic != (Datum) 0)
		{
			value = slot_getattr(slot, outbox_direct.topic, &isnull);
			if (isnull ||
				!DatumGetBool(DirectFunctionCall2Coll(texteq,
													  TupleDescAttr(RelationGetDescr(heap),
																	outbox_direct.topic - 1)->attcollation,
													  value, topic)))
				continue;
		}
		found = true;
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	index_close(index, NoLock);
	return found;
}

/*
 * A claim of one row without the executor.
 *
 * What outbox_claim_one's statement does, for the common case: the due
 * rows are read from the claim index the filters choose (by tenant, by
 * one topic, or all), oldest available_at first, with a fresh snapshot
 * (READ COMMITTED only); the first pending row that passes the filters
 * and heads its ordering key is locked without waiting
 * (table_tuple_lock, LockWaitSkip: a row another transaction holds is
 * skipped, as SKIP LOCKED does), leased with table_tuple_update, and its
 * new version inserted into the indexes that take it.  Returns the rows
 * claimed (0 or 1), or OUTBOX_CLAIM_NO_DIRECT, having written nothing,
 * when the statements must do it: the table is not as the extension
 * makes it (see outbox_direct_check), the transaction is read-only or
 * uses a transaction snapshot, several topics are asked for, a lease
 * that the filters take has expired (1.1: outbox_expired_lease_exists; on
 * 1.0, whose claim index holds leases too, the first candidate is one: the
 * statements claim it first and count its lost attempt), or a candidate
 * changed after the snapshot (the statement rechecks the new version).
 */
static int
outbox_claim_direct(const char *worker, Interval *lease, Datum topics,
					const char *tenant, TupleDesc tupdesc,
					Tuplestorestate *tupstore)
{
	Relation	heap;
	Relation	index;
	Relation	pkey;
	TupleDesc	desc;
	TupleTableSlot *slot;
	TupleTableSlot *newslot = NULL;
	ScanKeyData skey[2];
	int			nkeys;
	Oid			indexid;
	Datum		topic = (Datum) 0;
	Datum		tenant_datum = (Datum) 0;
	TimestampTz now;
	Datum		lease_end;
	Snapshot	snapshot;
	IndexScanDesc scan;
	CommandId	cid;
	int			result = 0;
	bool		locked = false;
	ItemPointerData tid;
	OrderingHeads heads = {0};

	if (XactReadOnly || RecoveryInProgress() || IsolationUsesXactSnapshot() ||
		!(outbox_catalog() & OUTBOX_HAS_TOKEN_FN))
		return OUTBOX_CLAIM_NO_DIRECT;

	/*
	 * A topic and a tenant (named, bound, or idempotency.tenant): either
	 * index would read the other's backlog (the tenant's due rows of other
	 * topics, or the topic's of other tenants); the statement's planner picks
	 * the smaller.
	 */
	if (topics != (Datum) 0 && tenant != NULL)
		return OUTBOX_CLAIM_NO_DIRECT;
	if (topics != (Datum) 0)
	{
		ArrayType  *arr = DatumGetArrayTypeP(topics);
		bool		isnull;

		if (ARR_NDIM(arr) != 1 || ARR_DIMS(arr)[0] != 1 || ARR_HASNULL(arr))
			return OUTBOX_CLAIM_NO_DIRECT;
		topic = array_get_element(PointerGetDatum(arr), 1, &ARR_LBOUND(arr)[0],
								  -1, -1, false, TYPALIGN_INT, &isnull);
	}
	heap = outbox_direct_open(true);
	if (heap == NULL)
		return OUTBOX_CLAIM_NO_DIRECT;
	CheckCmdReplicaIdentity(heap, CMD_UPDATE);
	desc = RelationGetDescr(heap);

	now = Max(GetCurrentStatementStartTimestamp(),
			  GetCurrentTransactionStartTimestamp());
	lease_end = DirectFunctionCall2(timestamptz_pl_interval,
									TimestampTzGetDatum(now),
									IntervalPGetDatum(lease));

	CommandCounterIncrement();
	cid = GetCurrentCommandId(true);
	snapshot = RegisterSnapshot(GetTransactionSnapshot());

	/*
	 * 1.1: expired leases are claimed first, by the statements (which count
	 * the lost attempt); look for one the filters take
	 */
	if (outbox_catalog() & OUTBOX_HAS_LEASE_IDX)
	{
		if (!OidIsValid(outbox_direct.lease_idx) ||
			outbox_expired_lease_exists(heap, now, topic, tenant, snapshot))
		{
			UnregisterSnapshot(snapshot);
			table_close(heap, NoLock);
			return OUTBOX_CLAIM_NO_DIRECT;
		}
	}

	/* the index the statement would read: by tenant, by one topic, or all */
	if (tenant != NULL)
	{
		indexid = outbox_direct.tenant_claim_idx;
		tenant_datum = CStringGetTextDatum(tenant);
	}
	else if (topic != (Datum) 0)
		indexid = outbox_direct.topic_claim_idx;
	else
		indexid = outbox_direct.claim_idx;
	index = index_open(indexid, RowExclusiveLock);
	nkeys = 0;
	if (tenant != NULL || topic != (Datum) 0)
		ScanKeyEntryInitialize(&skey[nkeys++], 0, 1, BTEqualStrategyNumber,
							   InvalidOid, index->rd_indcollation[0], F_TEXTEQ,
							   tenant != NULL ? tenant_datum : topic);
	ScanKeyEntryInitialize(&skey[nkeys], 0, nkeys + 1,
						   BTLessEqualStrategyNumber, InvalidOid, InvalidOid,
						   F_TIMESTAMPTZ_LE, TimestampTzGetDatum(now));
	nkeys++;

	heads.cxt = CurrentMemoryContext;
	slot = table_slot_create(heap, NULL);
#if PG_VERSION_NUM >= 180000
	scan = index_beginscan(heap, index, snapshot, NULL, nkeys, 0);
#else
	scan = index_beginscan(heap, index, snapshot, nkeys, 0);
#endif
	index_rescan(scan, skey, nkeys, NULL, 0);
	while (index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		bool		isnull;
		Datum		value;
		TM_Result	res;
		TM_FailureData tmfd;

		value = slot_getattr(slot, outbox_direct.status, &isnull);
		if (isnull)
			continue;
		if (DatumGetObjectId(value) == outbox_direct.leased)
		{
			/* an expired lease: the statements count its lost attempt */
			result = OUTBOX_CLAIM_NO_DIRECT;
			break;
		}
		if (DatumGetObjectId(value) != outbox_direct.pending)
			continue;
		value = slot_getattr(slot, outbox_direct.ordering_key, &isnull);
		if (!isnull &&
			!outbox_ordering_is_head(heap,
									 slot_getattr(slot, outbox_direct.tenant_id,
												  &isnull),
									 value,
									 slot_getattr(slot, outbox_direct.id,
												  &isnull),
									 true, snapshot, &heads))
			continue;

		tid = slot->tts_tid;
		res = table_tuple_lock(heap, &tid, snapshot, slot, cid,
							   LockTupleExclusive, LockWaitSkip, 0, &tmfd);
		if (res == TM_WouldBlock)
			continue;			/* another transaction holds it */
		if (res != TM_Ok)
		{
			/* changed since the snapshot: the statement rechecks it */
			result = OUTBOX_CLAIM_NO_DIRECT;
			break;
		}
		locked = true;
		break;
	}
	index_endscan(scan);

	if (locked)
	{
		Datum	   *values = palloc(desc->natts * sizeof(Datum));
		bool	   *nulls = palloc(desc->natts * sizeof(bool));
		pg_uuid_t  *token = palloc(sizeof(pg_uuid_t));
		TM_Result	res;
		TM_FailureData tmfd;
		LockTupleMode lockmode;
		HeapTuple	leased;
		OutboxUpdateIndexes update_indexes;

		slot_getallattrs(slot);
		memcpy(values, slot->tts_values, desc->natts * sizeof(Datum));
		memcpy(nulls, slot->tts_isnull, desc->natts * sizeof(bool));
		idem_new_token(token);
		values[outbox_direct.status - 1] = ObjectIdGetDatum(outbox_direct.leased);
		nulls[outbox_direct.status - 1] = false;
		values[outbox_direct.lease_token - 1] = UUIDPGetDatum(token);
		nulls[outbox_direct.lease_token - 1] = false;
		values[outbox_direct.leased_by - 1] = CStringGetTextDatum(worker);
		nulls[outbox_direct.leased_by - 1] = false;
		values[outbox_direct.lease_until - 1] = lease_end;
		nulls[outbox_direct.lease_until - 1] = false;
		values[outbox_direct.available_at - 1] = lease_end;
		nulls[outbox_direct.available_at - 1] = false;
		newslot = MakeSingleTupleTableSlot(desc, &TTSOpsHeapTuple);
		leased = heap_form_tuple(desc, values, nulls);
		ExecStoreHeapTuple(leased, newslot, false);
		tid = slot->tts_tid;
		ExecClearTuple(slot);

		res = table_tuple_update(heap, &tid, newslot, cid, snapshot,
								 InvalidSnapshot, true, &tmfd, &lockmode,
								 &update_indexes);
		if (res != TM_Ok)
			elog(ERROR, "unexpected result %d leasing a locked outbox row",
				 (int) res);
		pkey = index_open(outbox_direct.pkey, RowExclusiveLock);
		outbox_direct_index(heap, pkey, newslot, update_indexes, true);
		index_close(pkey, NoLock);
		/* the new version's own tid, for the row returned */
		leased->t_self = newslot->tts_tid;
		outbox_claim_emit(desc, &leased, 1, tupdesc, tupstore);
		ExecDropSingleTupleTableSlot(newslot);
		result = 1;
	}
	UnregisterSnapshot(snapshot);
	ExecDropSingleTupleTableSlot(slot);
	if (heads.heads != NULL)
		hash_destroy(heads.heads);
	index_close(index, NoLock);
	table_close(heap, NoLock);
	return result;
}

/*
 * outbox_ack(tenant text, id bigint, lease_token uuid, provider_ref text)
 *
 * Marks a row delivered: status done, done_at, provider_ref; with
 * idempotency.outbox_retention = 0 it deletes the row instead.  Only the
 * current lease holder may do so; the lease may have expired as long as
 * no one claimed the row since (the token would have changed).  Takes the
 * row lock.  Errors, nothing written: P0002 unknown row (or another
 * tenant's, or one already deleted by ack), 55000 already done or dead,
 * 55006 stale lease token.
 */
static Datum
idem_outbox_ack_body(FunctionCallInfo fcinfo)
{
	char	   *tenant;
	int64		id;
	Oid			argtypes[4] = {TEXTOID, INT8OID, UUIDOID, TEXTOID};
	Datum		values[4];
	char		nulls[4] = {' ', ' ', ' ', ' '};
	SPIPlanPtr	plan;
	int			rc;

	tenant = outbox_tenant_arg(fcinfo, 0);
	idem_require_arg(fcinfo, 1, "id");
	idem_require_arg(fcinfo, 2, "lease_token");
	id = PG_GETARG_INT64(1);

	values[0] = CStringGetTextDatum(tenant);
	values[1] = Int64GetDatum(id);
	values[2] = PG_GETARG_DATUM(2);
	values[3] = PG_ARGISNULL(3) ? (Datum) 0 : PG_GETARG_DATUM(3);
	nulls[3] = PG_ARGISNULL(3) ? 'n' : ' ';

	switch (outbox_ack_direct(values[0], id, values[2], values[3],
							  PG_ARGISNULL(3), idem_outbox_retention == 0))
	{
		case OUTBOX_ACK_DONE:
			PG_RETURN_VOID();
		case OUTBOX_ACK_MISS:
			idem_spi_connect();
			outbox_explain_miss(tenant, id, "outbox_ack", false, values[2]);
			pg_unreachable();
		default:
			break;
	}

	idem_spi_connect();
	if (idem_outbox_retention == 0)
		plan = outbox_plan(&ack_delete_plan, outbox_ack_delete_sql, 4,
						   argtypes);
	else
		plan = outbox_plan(&ack_plan, outbox_ack_sql, 4, argtypes);
	rc = idem_spi_execute(plan, values, nulls, false, 0);
	if (rc != SPI_OK_UPDATE && rc != SPI_OK_DELETE)
		elog(ERROR, "outbox ack failed: %s", SPI_result_code_string(rc));
	if (SPI_processed == 0)
		outbox_explain_miss(tenant, id, "outbox_ack", false, values[2]);
	SPI_finish();

	PG_RETURN_VOID();
}

/* As the owner of the function, search_path pinned (idem_owner_enter). */
Datum
idem_outbox_ack(PG_FUNCTION_ARGS)
{
	return idem_call_as_owner(fcinfo, idem_outbox_ack_body);
}

/*
 * Run the fenced one-row UPDATE ... RETURNING of outbox_nack or
 * outbox_extend (inside SPI) and return its one column, a by-value Datum
 * that stays valid after SPI_finish; a row not updated raises what
 * outbox_explain_miss says about it.
 */
static Datum
outbox_fenced_returning(SPIPlanPtr plan, Datum *values, const char *nulls,
						const char *tenant, int64 id, const char *funcname)
{
	int			rc;
	bool		isnull;

	rc = idem_spi_execute(plan, values, nulls, false, 0);
	if (rc != SPI_OK_UPDATE_RETURNING)
		elog(ERROR, "%s failed: %s", funcname, SPI_result_code_string(rc));
	if (SPI_processed == 0)
		outbox_explain_miss(tenant, id, funcname, false, values[2]);
	return SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1,
						 &isnull);
}

/*
 * The error of a nack (argument 3): required and not blank, since
 * last_error is what an operator reads on a dead letter, and an empty one
 * would erase the one before.
 */
static void
outbox_require_error(FunctionCallInfo fcinfo)
{
	text	   *error;
	const char *p;
	int			len;

	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("error must not be null"),
				 errhint("Pass what went wrong, such as 'HTTP 503 from the provider': the row keeps it as last_error, and a dead letter shows it.")));
	error = PG_GETARG_TEXT_PP(3);
	p = VARDATA_ANY(error);
	len = VARSIZE_ANY_EXHDR(error);
	/* blank as in idem_guard_bypass: space, \t, \n, \v, \f or \r only */
	while (len > 0 && (*p == ' ' || (*p >= '\t' && *p <= '\r')))
		p++, len--;
	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("error must not be empty"),
				 errhint("Pass what went wrong, such as 'HTTP 503 from the provider': the row keeps it as last_error, and a dead letter shows it.")));
}

/*
 * outbox_nack(tenant text, id bigint, lease_token uuid, error text,
 *			   retry_in interval) RETURNS idempotency.outbox_status
 *
 * Reports a failed delivery by the current lease holder: attempts + 1,
 * last_error, and either pending again after retry_in (NULL: exponential
 * backoff with jitter, see OUTBOX_BACKOFF_*) or dead once attempts reaches
 * max_attempts.  Returns the new status.  Takes the row lock.  Errors as
 * outbox_ack, plus 22023 for a negative retry_in.
 */
static Datum
idem_outbox_nack_body(PG_FUNCTION_ARGS)
{
	char	   *tenant;
	int64		id;
	Oid			argtypes[6] = {TEXTOID, INT8OID, UUIDOID, TEXTOID,
	INTERVALOID, FLOAT8OID};
	Datum		values[6];
	char		nulls[6] = {' ', ' ', ' ', ' ', ' ', ' '};
	double		jitter;
	SPIPlanPtr	plan;
	Datum		status;

	tenant = outbox_tenant_arg(fcinfo, 0);
	idem_require_arg(fcinfo, 1, "id");
	idem_require_arg(fcinfo, 2, "lease_token");
	outbox_require_error(fcinfo);
	id = PG_GETARG_INT64(1);
	if (!PG_ARGISNULL(4))
		idem_check_interval(PG_GETARG_INTERVAL_P(4), "retry_in", true,
							"Pass '0' to retry at once, or NULL for exponential backoff.");

	/* uniform in [0.5, 1.0): spreads retries of rows that failed together */
	jitter = 0.5 + 0.5 * pg_prng_double(&pg_global_prng_state);

	values[0] = CStringGetTextDatum(tenant);
	values[1] = Int64GetDatum(id);
	values[2] = PG_GETARG_DATUM(2);
	values[3] = PG_ARGISNULL(3) ? (Datum) 0 : PG_GETARG_DATUM(3);
	nulls[3] = PG_ARGISNULL(3) ? 'n' : ' ';
	values[4] = PG_ARGISNULL(4) ? (Datum) 0 : PG_GETARG_DATUM(4);
	nulls[4] = PG_ARGISNULL(4) ? 'n' : ' ';
	values[5] = Float8GetDatum(jitter);

	idem_spi_connect();
	plan = outbox_plan(&nack_plan, outbox_nack_sql, 6, argtypes);
	/* an enum is an Oid, passed by value: safe after SPI_finish */
	status = outbox_fenced_returning(plan, values, nulls, tenant, id,
									 "outbox_nack");
	SPI_finish();

	PG_RETURN_DATUM(status);
}

/* As the owner of the function, search_path pinned (idem_owner_enter). */
Datum
idem_outbox_nack(PG_FUNCTION_ARGS)
{
	return idem_call_as_owner(fcinfo, idem_outbox_nack_body);
}

/*
 * Run "sql" (outbox_requeue_sql or outbox_discard_sql: it changes the
 * tenant's row $2 only while it is dead, and returns its topic) for
 * outbox_requeue or outbox_discard, named by "action".  Returns the topic,
 * in the caller's memory.  Errors, nothing written: P0002 unknown row,
 * 55000 row not dead.
 */
static char *
outbox_dead_letter_change(FunctionCallInfo fcinfo, SPIPlanPtr *planp,
						  const char *sql, const char *action)
{
	char	   *tenant;
	int64		id;
	Oid			argtypes[2] = {TEXTOID, INT8OID};
	Datum		values[2];
	int			rc;
	char	   *topic;
	MemoryContext callcontext = CurrentMemoryContext;

	tenant = outbox_tenant_arg(fcinfo, 0);
	idem_require_arg(fcinfo, 1, "id");
	id = PG_GETARG_INT64(1);

	values[0] = CStringGetTextDatum(tenant);
	values[1] = Int64GetDatum(id);

	idem_spi_connect();
	rc = idem_spi_execute(outbox_plan(planp, sql, 2, argtypes), values, NULL,
						  false, 0);
	if (rc != SPI_OK_UPDATE_RETURNING && rc != SPI_OK_DELETE_RETURNING)
		elog(ERROR, "%s failed: %s", action, SPI_result_code_string(rc));
	if (SPI_processed == 0)
		outbox_explain_miss(tenant, id, action, true, (Datum) 0);
	topic = MemoryContextStrdup(callcontext,
								SPI_getvalue(SPI_tuptable->vals[0],
											 SPI_tuptable->tupdesc, 1));
	SPI_finish();
	return topic;
}

/*
 * outbox_requeue(tenant text, id bigint)
 *
 * Returns a dead letter to the queue: pending, attempts 0, due now (its
 * last_error is kept), and notifies idempotency_outbox on commit.  An
 * operator's action, revoked from PUBLIC.  Takes the row lock.
 */
static Datum
idem_outbox_requeue_body(PG_FUNCTION_ARGS)
{
	char	   *topic = outbox_dead_letter_change(fcinfo, &requeue_plan,
												  outbox_requeue_sql,
												  "outbox_requeue");

	if (idem_outbox_notify)
		outbox_notify_at_commit(topic);

	PG_RETURN_VOID();
}

/* As the owner of the function, search_path pinned (idem_owner_enter). */
Datum
idem_outbox_requeue(PG_FUNCTION_ARGS)
{
	return idem_call_as_owner(fcinfo, idem_outbox_requeue_body);
}

/*
 * outbox_discard(tenant text, id bigint)
 *
 * Deletes a dead letter that will not be delivered: the poison message of
 * an ordering key, whose successors it holds back, gives way to the next
 * row of the key (requeueing it would deliver it again).  An operator's
 * action, revoked from PUBLIC.
 */
static Datum
idem_outbox_discard_body(PG_FUNCTION_ARGS)
{
	(void) outbox_dead_letter_change(fcinfo, &discard_plan, outbox_discard_sql,
									 "outbox_discard");
	PG_RETURN_VOID();
}

/* As the owner of the function, search_path pinned (idem_owner_enter). */
Datum
idem_outbox_discard(PG_FUNCTION_ARGS)
{
	return idem_call_as_owner(fcinfo, idem_outbox_discard_body);
}

/*
 * outbox_extend(tenant text, id bigint, lease_token uuid, lease interval)
 *		RETURNS timestamptz
 *
 * Extends the lease of a row still leased under "lease_token" to now +
 * "lease" and returns the new lease_until: a heartbeat for deliveries that
 * outlast their lease.  Fenced like outbox_ack: the lease may have run out
 * as long as nobody claimed the row since.  Takes the row lock.  Errors,
 * nothing written: 22004 NULL argument, 22023 lease not positive, P0002
 * unknown row, 55000 row done or dead, 55006 stale lease token.
 */
static Datum
idem_outbox_extend_body(PG_FUNCTION_ARGS)
{
	char	   *tenant;
	int64		id;
	Oid			argtypes[4] = {TEXTOID, INT8OID, UUIDOID, INTERVALOID};
	Datum		values[4];
	SPIPlanPtr	plan;
	Datum		until;

	tenant = outbox_tenant_arg(fcinfo, 0);
	idem_require_arg(fcinfo, 1, "id");
	idem_require_arg(fcinfo, 2, "lease_token");
	idem_require_arg(fcinfo, 3, "lease");
	id = PG_GETARG_INT64(1);
	idem_check_interval(PG_GETARG_INTERVAL_P(3), "lease", false,
						"Pass how much longer the delivery needs from now, for example '30 seconds'.");

	values[0] = CStringGetTextDatum(tenant);
	values[1] = Int64GetDatum(id);
	values[2] = PG_GETARG_DATUM(2);
	values[3] = PG_GETARG_DATUM(3);

	idem_spi_connect();
	plan = outbox_plan(&extend_plan, outbox_extend_sql, 4, argtypes);
	/* a timestamptz is passed by value: safe after SPI_finish */
	until = outbox_fenced_returning(plan, values, NULL, tenant, id,
									"outbox_extend");
	SPI_finish();

	PG_RETURN_DATUM(until);
}

/* As the owner of the function, search_path pinned (idem_owner_enter). */
Datum
idem_outbox_extend(PG_FUNCTION_ARGS)
{
	return idem_call_as_owner(fcinfo, idem_outbox_extend_body);
}

/*
 * The ids and lease_tokens arguments of outbox_ack_many and outbox_nack_many
 * (arguments 1 and 2): not NULL, one dimension (or empty), the same number
 * of elements, no NULL element.  Returns the number of elements, and
 * sets values[1] and values[2] to the (detoasted) arrays.
 */
static int
outbox_batch_args(FunctionCallInfo fcinfo, Datum *values)
{
	ArrayType  *ids;
	ArrayType  *tokens;
	int			nids;
	int			ntokens;

	idem_require_arg(fcinfo, 1, "ids");
	idem_require_arg(fcinfo, 2, "lease_tokens");
	ids = PG_GETARG_ARRAYTYPE_P(1);
	tokens = PG_GETARG_ARRAYTYPE_P(2);
	if (ARR_NDIM(ids) > 1 || ARR_NDIM(tokens) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ids and lease_tokens must be one-dimensional arrays"),
				 errhint("Pass the id and the lease_token of each row, in the same order.")));
	nids = ArrayGetNItems(ARR_NDIM(ids), ARR_DIMS(ids));
	ntokens = ArrayGetNItems(ARR_NDIM(tokens), ARR_DIMS(tokens));
	if (nids != ntokens)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ids and lease_tokens must have the same number of elements"),
				 errdetail("ids has %d elements, lease_tokens %d.", nids, ntokens),
				 errhint("Pass the id and the lease_token of each row, in the same order.")));
	if (array_contains_nulls(ids) || array_contains_nulls(tokens))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("ids and lease_tokens must not contain NULL elements"),
				 errhint("Pass the id and the lease_token of each row, in the same order.")));
	values[1] = PointerGetDatum(ids);
	values[2] = PointerGetDatum(tokens);
	return nids;
}

/*
 * Return the rows of SPI_tuptable as the result set of a set-returning
 * function in materialize mode.  Called with SPI connected.
 */
static Datum
outbox_return_spi_rows(FunctionCallInfo fcinfo)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	uint64		i;

	/* the shape the caller expects, which the statement's result has */
	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	for (i = 0; i < SPI_processed; i++)
		tuplestore_puttuple(rsinfo->setResult, SPI_tuptable->vals[i]);
	return (Datum) 0;
}

/*
 * A batch on Citus (see outbox_ack_one_sql): "plan" once per element of
 * ids (values[1]) and lease_tokens (values[2]), with $1 the tenant, $2 and
 * $3 the element's id and token, and from $4 on the values after them; an
 * array among those ("per_row", or -1) gives each row its own element.
 * The rows each statement changed make the result, as
 * outbox_return_spi_rows would give them.
 */
static void
outbox_many_by_row(FunctionCallInfo fcinfo, SPIPlanPtr plan, int nparams,
				   Datum *values, char *nulls, int per_row, Oid per_row_type)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Datum	   *ids;
	Datum	   *tokens;
	Datum	   *own = NULL;
	bool	   *own_nulls = NULL;
	int			n;
	int			m;
	Datum		row[6];
	char		row_nulls[6];
	int16		typlen;
	bool		typbyval;
	char		typalign;

	Assert(nparams <= (int) lengthof(row));
	deconstruct_array(DatumGetArrayTypeP(values[1]), INT8OID, 8,
					  FLOAT8PASSBYVAL, TYPALIGN_DOUBLE, &ids, NULL, &n);
	deconstruct_array(DatumGetArrayTypeP(values[2]), UUIDOID, UUID_LEN,
					  false, TYPALIGN_CHAR, &tokens, NULL, &m);
	if (per_row >= 0 && nulls[per_row] != 'n')
	{
		get_typlenbyvalalign(per_row_type, &typlen, &typbyval, &typalign);
		deconstruct_array(DatumGetArrayTypeP(values[per_row]), per_row_type,
						  typlen, typbyval, typalign, &own, &own_nulls, &m);
	}
	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	for (int i = 0; i < n; i++)
	{
		int			rc;

		memcpy(row, values, sizeof(Datum) * nparams);
		memcpy(row_nulls, nulls, nparams);
		row[1] = ids[i];
		row[2] = tokens[i];
		if (per_row >= 0)
		{
			row[per_row] = own ? own[i] : (Datum) 0;
			row_nulls[per_row] = own && !own_nulls[i] ? ' ' : 'n';
		}
		rc = idem_spi_execute(plan, row, row_nulls, false, 0);
		if (rc != SPI_OK_UPDATE_RETURNING && rc != SPI_OK_DELETE_RETURNING)
			elog(ERROR, "outbox batch failed: %s", SPI_result_code_string(rc));
		for (uint64 r = 0; r < SPI_processed; r++)
			tuplestore_puttuple(rsinfo->setResult, SPI_tuptable->vals[r]);
	}
}

/*
 * outbox_ack_many(tenant text, ids bigint[], lease_tokens uuid[],
 *				   provider_refs text[]) RETURNS SETOF bigint
 *
 * outbox_ack for many rows of one tenant in one statement: ids[i] is
 * acknowledged with lease_tokens[i] and provider_refs[i] (NULL array: no
 * provider_ref; with idempotency.outbox_retention = 0 the rows are
 * deleted).  Returns the ids acknowledged, in no particular order; a
 * row whose fence fails (stale token, done, dead, unknown, another
 * tenant's) is left unchanged and out of the result.  Errors, nothing
 * written: 22004 NULL tenant, ids or lease_tokens or a NULL element, 22023
 * arrays of different lengths.
 */
static Datum
idem_outbox_ack_many_body(PG_FUNCTION_ARGS)
{
	char	   *tenant;
	int			n;
	Oid			argtypes[4] = {TEXTOID, INT8ARRAYOID, UUIDARRAYOID, TEXTARRAYOID};
	Datum		values[4];
	char		nulls[4] = {' ', ' ', ' ', 'n'};
	SPIPlanPtr	plan;
	int			rc;

	outbox_require_set_context(fcinfo, "outbox_ack_many");
	tenant = outbox_tenant_arg(fcinfo, 0);
	n = outbox_batch_args(fcinfo, values);
	if (!PG_ARGISNULL(3))
	{
		ArrayType  *refs = PG_GETARG_ARRAYTYPE_P(3);

		if (ARR_NDIM(refs) > 1)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("provider_refs must be a one-dimensional array"),
					 errdetail("provider_refs has %d dimensions.", ARR_NDIM(refs)),
					 errhint("Pass NULL for no provider_ref, or one element (possibly NULL) per id.")));
		if (ArrayGetNItems(ARR_NDIM(refs), ARR_DIMS(refs)) != n)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("provider_refs must have one element per id"),
					 errdetail("ids has %d elements, provider_refs %d.", n,
							   ArrayGetNItems(ARR_NDIM(refs), ARR_DIMS(refs))),
					 errhint("Pass NULL for no provider_ref, or one element (possibly NULL) per id.")));
		values[3] = PointerGetDatum(refs);
		nulls[3] = ' ';
	}

	values[0] = CStringGetTextDatum(tenant);

	idem_spi_connect();
	if (idem_citus_distributed())
	{
		Oid			one_types[4] = {TEXTOID, INT8OID, UUIDOID, TEXTOID};

		if (idem_outbox_retention == 0)
			outbox_many_by_row(fcinfo,
							   outbox_plan(&ack_one_delete_plan,
										   outbox_ack_one_delete_sql, 3, one_types),
							   3, values, nulls, -1, InvalidOid);
		else
			outbox_many_by_row(fcinfo,
							   outbox_plan(&ack_one_plan, outbox_ack_one_sql,
										   4, one_types),
							   4, values, nulls, 3, TEXTOID);
		SPI_finish();
		return (Datum) 0;
	}
	if (idem_outbox_retention == 0)
		plan = outbox_plan(&ack_many_delete_plan, outbox_ack_many_delete_sql,
						   4, argtypes);
	else
		plan = outbox_plan(&ack_many_plan, outbox_ack_many_sql, 4, argtypes);
	rc = idem_spi_execute(plan, values, nulls, false, 0);
	if (rc != SPI_OK_UPDATE_RETURNING && rc != SPI_OK_DELETE_RETURNING)
		elog(ERROR, "outbox ack failed: %s", SPI_result_code_string(rc));
	outbox_return_spi_rows(fcinfo);
	SPI_finish();

	return (Datum) 0;
}

/* As the owner of the function, search_path pinned (idem_owner_enter). */
Datum
idem_outbox_ack_many(PG_FUNCTION_ARGS)
{
	return idem_call_as_owner(fcinfo, idem_outbox_ack_many_body);
}

/*
 * outbox_nack_many(tenant text, ids bigint[], lease_tokens uuid[],
 *					error text, retry_in interval)
 *		RETURNS TABLE (id bigint, status idempotency.outbox_status)
 *
 * outbox_nack for many rows of one tenant in one statement, each with its
 * own jitter when retry_in is NULL.  Returns each row reported and its new
 * status (pending or dead), in no particular order; rows whose fence fails
 * are left out, as in outbox_ack_many.  Errors, nothing written: as
 * outbox_ack_many, plus 22023 for a negative retry_in.
 */
static Datum
idem_outbox_nack_many_body(PG_FUNCTION_ARGS)
{
	char	   *tenant;
	int			n;
	int			i;
	Oid			argtypes[6] = {TEXTOID, INT8ARRAYOID, UUIDARRAYOID, TEXTOID,
	INTERVALOID, FLOAT8ARRAYOID};
	Datum		values[6];
	char		nulls[6] = {' ', ' ', ' ', ' ', ' ', ' '};
	Datum	   *jitters;
	int16		typlen;
	bool		typbyval;
	char		typalign;
	SPIPlanPtr	plan;
	int			rc;

	outbox_require_set_context(fcinfo, "outbox_nack_many");
	tenant = outbox_tenant_arg(fcinfo, 0);
	n = outbox_batch_args(fcinfo, values);
	outbox_require_error(fcinfo);
	if (!PG_ARGISNULL(4))
		idem_check_interval(PG_GETARG_INTERVAL_P(4), "retry_in", true,
							"Pass '0' to retry at once, or NULL for exponential backoff.");

	/* one jitter per row, uniform in [0.5, 1.0), as outbox_nack's */
	jitters = palloc(sizeof(Datum) * Max(n, 1));
	for (i = 0; i < n; i++)
		jitters[i] = Float8GetDatum(0.5 + 0.5 * pg_prng_double(&pg_global_prng_state));

	values[0] = CStringGetTextDatum(tenant);
	values[3] = PG_ARGISNULL(3) ? (Datum) 0 : PG_GETARG_DATUM(3);
	nulls[3] = PG_ARGISNULL(3) ? 'n' : ' ';
	values[4] = PG_ARGISNULL(4) ? (Datum) 0 : PG_GETARG_DATUM(4);
	nulls[4] = PG_ARGISNULL(4) ? 'n' : ' ';
	get_typlenbyvalalign(FLOAT8OID, &typlen, &typbyval, &typalign);
	values[5] = PointerGetDatum(construct_array(jitters, n, FLOAT8OID,
												typlen, typbyval, typalign));

	idem_spi_connect();
	if (idem_citus_distributed())
	{
		Oid			one_types[6] = {TEXTOID, INT8OID, UUIDOID, TEXTOID,
		INTERVALOID, FLOAT8OID};

		outbox_many_by_row(fcinfo,
						   outbox_plan(&nack_one_plan, outbox_nack_one_sql,
									   6, one_types),
						   6, values, nulls, 5, FLOAT8OID);
		SPI_finish();
		return (Datum) 0;
	}
	plan = outbox_plan(&nack_many_plan, outbox_nack_many_sql, 6, argtypes);
	rc = idem_spi_execute(plan, values, nulls, false, 0);
	if (rc != SPI_OK_UPDATE_RETURNING)
		elog(ERROR, "outbox nack failed: %s", SPI_result_code_string(rc));
	outbox_return_spi_rows(fcinfo);
	SPI_finish();

	return (Datum) 0;
}

/* As the owner of the function, search_path pinned (idem_owner_enter). */
Datum
idem_outbox_nack_many(PG_FUNCTION_ARGS)
{
	return idem_call_as_owner(fcinfo, idem_outbox_nack_many_body);
}

/*
 * The symbols the SQL functions of version 1.0 name: still exported so
 * that a database keeps working between installing this library and ALTER
 * EXTENSION idempotency UPDATE, which points those functions at the
 * idem_ symbols above.
 */
PG_FUNCTION_INFO_V1(outbox_enqueue);
PG_FUNCTION_INFO_V1(outbox_claim);
PG_FUNCTION_INFO_V1(outbox_ack);
PG_FUNCTION_INFO_V1(outbox_nack);
PG_FUNCTION_INFO_V1(outbox_requeue);

Datum
outbox_enqueue(PG_FUNCTION_ARGS)
{
	return idem_outbox_enqueue(fcinfo);
}

Datum
outbox_claim(PG_FUNCTION_ARGS)
{
	return idem_outbox_claim(fcinfo);
}

Datum
outbox_ack(PG_FUNCTION_ARGS)
{
	return idem_outbox_ack(fcinfo);
}

Datum
outbox_nack(PG_FUNCTION_ARGS)
{
	return idem_outbox_nack(fcinfo);
}

Datum
outbox_requeue(PG_FUNCTION_ARGS)
{
	return idem_outbox_requeue(fcinfo);
}
