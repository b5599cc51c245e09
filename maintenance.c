/*-------------------------------------------------------------------------
 *
 * maintenance.c
 *	  The reaper (expired keys), the sweeper (stale processing keys), outbox
 *	  lease recovery and purge, and pg_cron scheduling of all of it.
 *
 * Every function here is a short, single-statement piece of work that the
 * procedure idem_maintain (a PL/pgSQL procedure in the install script)
 * strings together with a COMMIT between pieces.  The procedure itself
 * cannot be SECURITY DEFINER (PostgreSQL forbids transaction control there),
 * so each piece is: it runs with the extension owner's rights, a fixed
 * search_path, and EXECUTE revoked from PUBLIC.
 *
 * Locking: each statement first selects its victims FOR UPDATE SKIP LOCKED,
 * then changes exactly those rows (by ctid, which cannot move while we hold
 * the row lock).  A row that a request is reserving, completing or
 * delivering right now is locked by that request and simply skipped: the
 * maintenance never waits for the hot path and the hot path never waits
 * for more than the rows of one batch.  The reaper selects through the
 * index on expires_at with a LIMIT, so one batch is cheap however large
 * the table is.  The sweeper cannot use an index: the only column that
 * identifies processing keys is status, and an index on it (or a partial
 * index whose predicate names it) would make every completion a non-HOT
 * update with an insertion into each index of the table.  Instead each
 * scheduled run reads one slice of the table's pages (a TID range scan,
 * idempotency.sweep_state.pages_per_run pages) and the next run continues
 * where it stopped, so its cost is bounded however large the table grows.
 *
 * No string is spliced into SQL: every statement is a saved plan with
 * parameters.  The pg_cron command text is a parameter value.
 *
 * IDENTIFICATION
 *	  maintenance.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/table.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "commands/extension.h"
#include "datatype/timestamp.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "storage/bufmgr.h"
#include "storage/itemptr.h"
#include "storage/proc.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "idempotency.h"

/* Largest batch accepted by idem_reap and idem_purge_outbox. */
#define IDEM_MAX_BATCH 1000000

/* Name prefix of the pg_cron job; the database name follows it. */
#define IDEM_CRON_JOB_PREFIX "idempotency-maintenance-"

PG_FUNCTION_INFO_V1(idem_reap);
PG_FUNCTION_INFO_V1(idem_sweep);
PG_FUNCTION_INFO_V1(idem_reclaim_leases);
PG_FUNCTION_INFO_V1(idem_purge_outbox);
PG_FUNCTION_INFO_V1(idem_schedule_maintenance);
PG_FUNCTION_INFO_V1(idem_unschedule_maintenance);

/*
 * The reaper: one batch of expired, finished keys, oldest first.  A key
 * flagged for reconciliation is kept until an operator resolves it, even
 * past expires_at: deleting it would lose the only record that an outcome
 * is unknown.  Returns the deleted count per (tenant, scope) for the stats.
 */
static const char *reap_sql =
"WITH batch AS ("
"    SELECT k.ctid AS row_id"
"      FROM idempotency.keys k"
"     WHERE k.expires_at OPERATOR(pg_catalog.<) pg_catalog.now()"
"       AND k.status OPERATOR(pg_catalog.<>) 'processing'"
"       AND NOT k.needs_reconciliation"
"     ORDER BY k.expires_at"
"     LIMIT $1"
"       FOR UPDATE SKIP LOCKED),"
" gone AS ("
"    DELETE FROM idempotency.keys k"
"     WHERE k.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT row_id FROM batch))"
" RETURNING k.tenant_id, k.scope)"
" SELECT tenant_id, scope, pg_catalog.count(*) FROM gone GROUP BY tenant_id, scope";

/*
 * The sweeper: committed processing keys whose lock is older than $1 when
 * given, else the scope's lock_timeout, else the GUC ($2).  Scopes with
 * stale_action = takeover keep their stale keys for the next attempt, which
 * takes them over; once such a key is also past expires_at nobody is coming
 * back for it, and it is flagged like the others (otherwise it would stay
 * processing, unflagged and unreapable, for ever).
 *
 * A flagged key stays "processing" with needs_reconciliation set, exactly
 * as idem_reserve leaves a stale key it meets first: idem_reserve answers
 * "stale" for it, the reaper never deletes it, and idem_resolve (which
 * finishes processing keys) ends the reconciliation.
 */
#define SWEEP_SQL(range) \
"WITH stale AS (" \
"    SELECT k.ctid AS row_id" \
"      FROM idempotency.keys k" \
"      LEFT JOIN idempotency.scopes s ON s.scope OPERATOR(pg_catalog.=) k.scope" \
"     WHERE k.status OPERATOR(pg_catalog.=) 'processing'" \
"       AND NOT k.needs_reconciliation" \
"       AND coalesce(k.locked_at, k.created_at)" \
"           OPERATOR(pg_catalog.<) (pg_catalog.now()" \
"               OPERATOR(pg_catalog.-) coalesce($1, s.lock_timeout, $2))" \
"       AND (coalesce(s.stale_action, 'fail') OPERATOR(pg_catalog.=) 'fail'" \
"            OR k.expires_at OPERATOR(pg_catalog.<) pg_catalog.now())" \
range \
"       FOR UPDATE OF k SKIP LOCKED)," \
" flagged AS (" \
"    UPDATE idempotency.keys k" \
"       SET needs_reconciliation = true" \
"     WHERE k.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT row_id FROM stale))" \
" RETURNING k.tenant_id, k.scope)" \
" SELECT tenant_id, scope, pg_catalog.count(*) FROM flagged GROUP BY tenant_id, scope"

/* The whole table: an operator's idem_sweep(older_than). */
static const char *sweep_sql = SWEEP_SQL("");

/* Pages $3 (inclusive) to $4 (exclusive): one scheduled run. */
static const char *sweep_slice_sql =
SWEEP_SQL("       AND k.ctid OPERATOR(pg_catalog.>=) $3"
		  "       AND k.ctid OPERATOR(pg_catalog.<) $4");

/*
 * Where the scheduled sweep continues, how many pages it may read, and how
 * many the table has now.
 */
static const char *sweep_state_sql =
"SELECT coalesce(s.next_page, 0), coalesce(s.pages_per_run, $1),"
"       pg_catalog.pg_relation_size('idempotency.keys'::pg_catalog.regclass)"
"  FROM (SELECT) AS one LEFT JOIN idempotency.sweep_state s ON true"
" LIMIT 1";

/*
 * Move the cursor.  A concurrent sweep holding the row moves it itself:
 * skip rather than wait.
 */
static const char *sweep_advance_sql =
"UPDATE idempotency.sweep_state s SET next_page = $1"
" WHERE s.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT t.ctid FROM idempotency.sweep_state t"
"                           FOR UPDATE SKIP LOCKED))";

/* Pages a scheduled sweep reads when sweep_state has no row. */
#define IDEM_SWEEP_DEFAULT_PAGES 16384

/*
 * A database still at 1.0 (no outbox_lease_idx): the due rows of the
 * outbox in available_at order, through outbox_claim_idx (pending rows,
 * and leased rows, whose available_at is their lease end), each with
 * whether its lease has expired.
 * idem_reclaim_leases reads them through a cursor, RECLAIM_FETCH at a time,
 * so that under a deadline it stops between two fetches even behind a
 * backlog of due pending rows, which sit among the leases in that index
 * (workers stopped: millions).  The cursor's snapshot does not see the
 * versions the reclaim writes, so each row is read once.
 */
static const char *reclaim_scan_sql =
"SELECT o.ctid,"
"       o.status OPERATOR(pg_catalog.=) 'leased'"
"       AND o.lease_until OPERATOR(pg_catalog.<) pg_catalog.now()"
"  FROM idempotency.outbox o"
" WHERE o.status OPERATOR(pg_catalog.=) ANY ('{pending,leased}'::idempotency.outbox_status[])"
"   AND o.available_at OPERATOR(pg_catalog.<) pg_catalog.now()"
" ORDER BY o.available_at";

/*
 * The same on 1.1, whose outbox_lease_idx holds the leased rows by the end
 * of their lease: the expired ones, longest expired first, without the
 * pending rows (a backlog of millions when workers stop).
 */
static const char *reclaim_scan_v11_sql =
"SELECT o.ctid, true"
"  FROM idempotency.outbox o"
" WHERE o.status OPERATOR(pg_catalog.=) 'leased'"
"   AND o.lease_until OPERATOR(pg_catalog.<) pg_catalog.now()"
" ORDER BY o.lease_until";

/*
 * Expired outbox leases: the worker died or hung.  As outbox_claim does when
 * it meets such a row, the lost lease counts as a failed attempt: the
 * message goes back to pending, or to the dead letters once that was its
 * last allowed attempt (a message that crashes its worker every time must
 * not circulate for ever).  The dead letter keeps leased_by, to say whose
 * lease it was.  $1: the rows reclaim_scan_sql found expired, checked
 * again on their current version (a worker may have acknowledged or
 * extended one since); rows a worker is acknowledging right now are
 * skipped.  Returns how many were reclaimed.
 */
static const char *reclaim_sql =
"WITH expired AS ("
"    SELECT o.ctid AS row_id"
"      FROM idempotency.outbox o"
"     WHERE o.ctid OPERATOR(pg_catalog.=) ANY ($1)"
"       AND o.status OPERATOR(pg_catalog.=) 'leased'"
"       AND o.lease_until OPERATOR(pg_catalog.<) pg_catalog.now()"
"       FOR UPDATE SKIP LOCKED)"
" UPDATE idempotency.outbox o"
"    SET status = CASE WHEN " IDEM_OUTBOX_LOST_LEASE_IS_LAST
"                      THEN 'dead' ELSE 'pending' END::idempotency.outbox_status,"
"        attempts = o.attempts OPERATOR(pg_catalog.+) 1,"
"        last_error = " IDEM_OUTBOX_LOST_LEASE_ERROR ","
"        leased_by = CASE WHEN " IDEM_OUTBOX_LOST_LEASE_IS_LAST
"                         THEN o.leased_by END,"
"        lease_token = NULL, lease_until = NULL"
"  WHERE o.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT row_id FROM expired))";

/*
 * One batch of delivered outbox rows older than the retention ($2), oldest
 * first, through outbox_done_idx: a batch reads the rows it deletes, not
 * the rows delivered within the retention.
 */
static const char *purge_sql =
"WITH old AS ("
"    SELECT o.ctid AS row_id"
"      FROM idempotency.outbox o"
"     WHERE o.status OPERATOR(pg_catalog.=) 'done'"
"       AND o.done_at OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.-) $2)"
"     ORDER BY o.done_at"
"     LIMIT $1"
"       FOR UPDATE SKIP LOCKED)"
" DELETE FROM idempotency.outbox o"
"  WHERE o.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT row_id FROM old))";

/* pg_cron upserts a job by (name, user): scheduling twice updates it. */
static const char *schedule_sql =
"SELECT cron.schedule_in_database($1, $2, $3, $4)";

static const char *unschedule_sql =
"SELECT cron.unschedule(j.jobid) FROM cron.job j"
" WHERE j.jobname OPERATOR(pg_catalog.=) $1"
" AND j.username OPERATOR(pg_catalog.=) current_user";

static SPIPlanPtr reap_plan = NULL;
static SPIPlanPtr sweep_plan = NULL;
static SPIPlanPtr sweep_slice_plan = NULL;
static SPIPlanPtr sweep_state_plan = NULL;
static SPIPlanPtr sweep_advance_plan = NULL;
static SPIPlanPtr reclaim_scan_plan = NULL;
static SPIPlanPtr reclaim_scan_v11_plan = NULL;
static SPIPlanPtr reclaim_plan = NULL;
static SPIPlanPtr purge_plan = NULL;
static SPIPlanPtr schedule_plan = NULL;
static SPIPlanPtr unschedule_plan = NULL;
static SPIPlanPtr cron_version_plan = NULL;

/* the pg_cron this server would create: its control file's version */
static const char *cron_version_sql =
"SELECT e.default_version FROM pg_catalog.pg_available_extensions e"
" WHERE e.name OPERATOR(pg_catalog.=) 'pg_cron'";

/*
 * maint_check_batch_size
 *		Bad input raises before any write.
 */
static int32
maint_check_batch_size(FunctionCallInfo fcinfo, const char *funcname)
{
	int32		batch_size;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("batch_size must not be null"),
				 errhint("Call %s() without arguments for the default batch of 5000.",
						 funcname)));
	batch_size = PG_GETARG_INT32(0);
	if (batch_size < 1 || batch_size > IDEM_MAX_BATCH)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch_size must be between 1 and %d", IDEM_MAX_BATCH),
				 errdetail("The value given was %d.", batch_size),
				 errhint("Use a batch of a few thousand rows so each transaction stays short.")));
	return batch_size;
}

/*
 * maint_count_into_stats
 *		Sum the (tenant, scope, count) rows of the last SPI statement and add
 *		each to the stats counter "counter".
 */
static int64
maint_count_into_stats(IdemCounter counter)
{
	int64		total = 0;
	uint64		i;

	for (i = 0; i < SPI_processed; i++)
	{
		HeapTuple	tuple = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		char	   *tenant = SPI_getvalue(tuple, desc, 1);
		char	   *scope = SPI_getvalue(tuple, desc, 2);
		bool		isnull;
		int64		n = DatumGetInt64(SPI_getbinval(tuple, desc, 3, &isnull));

		total += n;
		idem_stats_count(tenant, scope, counter, n);
	}
	return total;
}

/*
 * maint_run_passes
 *		Run one saved statement ("what", for errors) once per pass: one pass
 *		on a plain server, one per local shard group on Citus (citus.c),
 *		starting with another each time.  Each run must return "expected".
 *		With batch_size above 0 the statement's $1 is its limit, and the
 *		passes share it: each gets what the earlier ones left.  Counts what
 *		the statement returns as (tenant, scope, count) rows into the stats
 *		counter "counter", or, with counter IDEM_STAT_NCOUNTERS, the rows it
 *		processed.  Inside SPI; returns the total.
 */
static int64
maint_run_passes(SPIPlanPtr *cache, const char *sql, int nargs, Oid *argtypes,
				 Datum *values, const char *nulls, int32 batch_size,
				 int expected, IdemCounter counter, const char *what)
{
	int64		total = 0;
	int			npasses = idem_citus_passes();
	int			first = idem_citus_first_pass(npasses);
	int			pass;
	int			ret;

	for (pass = 0; pass < npasses; pass++)
	{
		if (batch_size > 0)
		{
			if (total >= batch_size)
				break;
			values[0] = Int32GetDatum(batch_size - (int32) total);
		}
		idem_citus_enter((first + pass) % npasses);
		ret = idem_spi_execute(idem_saved_plan(cache, sql, nargs, argtypes, 0),
							   values, nulls, false, 0);
		if (ret != expected)
			elog(ERROR, "%s failed: %s", what, SPI_result_code_string(ret));
		total += counter == IDEM_STAT_NCOUNTERS ? (int64) SPI_processed :
			maint_count_into_stats(counter);
		idem_citus_leave();
	}
	return total;
}

/*
 * idem_reap
 *		SQL: idem_reap(batch_size int DEFAULT 5000) RETURNS bigint
 *
 * Deletes at most batch_size keys that are expired, not processing and not
 * awaiting reconciliation, oldest expiry first, skipping rows locked by
 * others.  Row locks: the deleted rows only.  Counts "reaped" per (tenant,
 * scope).  Returns the number deleted; fewer than batch_size means the
 * backlog is (momentarily) done.
 */
Datum
idem_reap(PG_FUNCTION_ARGS)
{
	int32		batch_size = maint_check_batch_size(fcinfo, "idem_reap");
	Oid			argtypes[1] = {INT4OID};
	Datum		values[1];
	int64		total;

	values[0] = Int32GetDatum(batch_size);

	idem_spi_connect();
	total = maint_run_passes(&reap_plan, reap_sql, 1, argtypes, values, NULL,
							 batch_size, SPI_OK_SELECT, IDEM_STAT_REAPED,
							 "reaping keys");
	SPI_finish();

	PG_RETURN_INT64(total);
}

/*
 * maint_deadline
 *		Under a statement_timeout, the time "fifths" fifths of it after the
 *		statement started (for idem_maintain, the CALL, across its COMMITs):
 *		where the sweep (two fifths) and the lease recovery (three) stop
 *		starting work, so that the run ends instead of being canceled with
 *		its work rolled back; idem_maintain's batches stop at four.  Under a
 *		transaction_timeout (17 and later), which ends the session, the
 *		same fifths of it after the transaction started, when that comes
 *		first (each step of idem_maintain is a transaction of its own).  0
 *		when there is no timeout.
 */
static TimestampTz
maint_deadline(int fifths)
{
	TimestampTz deadline = 0;

	if (StatementTimeout > 0)
		deadline = GetCurrentStatementStartTimestamp() +
			(TimestampTz) StatementTimeout * 200 * fifths;
#if PG_VERSION_NUM >= 170000
	if (TransactionTimeout > 0)
	{
		TimestampTz xact_deadline = GetCurrentTransactionStartTimestamp() +
			(TimestampTz) TransactionTimeout * 200 * fifths;

		if (deadline == 0 || xact_deadline < deadline)
			deadline = xact_deadline;
	}
#endif
	return deadline;
}

/* The pages a sweep under a statement_timeout reads between two looks at the clock. */
#define SWEEP_CHUNK_PAGES 256

/* The expired leases one statement of idem_reclaim_leases returns. */
#define RECLAIM_BATCH 1000

/* The due rows idem_reclaim_leases reads between two looks at the clock. */
#define RECLAIM_FETCH 1000

/* A tid Datum for the first item of page "page" (clamped to a block number). */
static Datum
sweep_page_tid(int64 page)
{
	ItemPointer tid = (ItemPointer) palloc(sizeof(ItemPointerData));

	if (page > (int64) MaxBlockNumber)
		page = MaxBlockNumber;
	ItemPointerSet(tid, (BlockNumber) page, 0);
	return PointerGetDatum(tid);
}

/*
 * sweep_pages
 *		The pages a scheduled sweep goes round, into npages[pass], and their
 *		total: on a plain server the keys table's ("table_blocks"); on Citus
 *		those of this node's shards of it, one pass after the other, as if
 *		they were one table, so that a run reads at most pages_per_run
 *		pages however many shards the node holds.
 */
static int64
sweep_pages(int npasses, int64 *npages, int64 table_blocks)
{
	int64		total = 0;
	int			pass;

	if (!idem_citus_distributed())
	{
		npages[0] = table_blocks;
		return table_blocks;
	}
	for (pass = 0; pass < npasses; pass++)
	{
		Relation	rel = table_open(idem_citus_pass_keys_relid(pass),
									 AccessShareLock);

		npages[pass] = RelationGetNumberOfBlocks(rel);
		table_close(rel, NoLock);
		total += npages[pass];
	}
	return total;
}

/*
 * sweep_slices
 *		One scheduled sweep: from the cursor (back to page 0 when the pages
 *		have shrunk below it), at most pages_per_run pages, pass by pass
 *		(a slice can end one shard and start the next), and under a
 *		statement_timeout no longer than two fifths of it.  "values" and
 *		"nulls" are sweep_slice_sql's, whose page bounds ($3, $4) are set
 *		here.  Adds the flagged keys to *total and returns the cursor for
 *		the next run: 0 once the end of the pages is reached.
 */
static int64
sweep_slices(Oid *argtypes, Datum *values, char *nulls, int64 *total)
{
	Oid			statetypes[1] = {INT4OID};
	Datum		statevalues[1];
	HeapTuple	tuple;
	TupleDesc	desc;
	bool		isnull;
	int64		next;
	int64		left;
	int64		all;
	int64		offset = 0;
	int64	   *npages;
	int			npasses = idem_citus_passes();
	int			pass;
	int			ret;
	TimestampTz deadline = maint_deadline(2);
	bool		stopped = false;

	statevalues[0] = Int32GetDatum(IDEM_SWEEP_DEFAULT_PAGES);
	ret = idem_spi_execute(idem_saved_plan(&sweep_state_plan, sweep_state_sql,
										   1, statetypes, 0),
						   statevalues, NULL, true, 1);
	if (ret != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "reading the sweep state failed: %s",
			 SPI_result_code_string(ret));
	tuple = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	next = DatumGetInt64(SPI_getbinval(tuple, desc, 1, &isnull));
	left = DatumGetInt32(SPI_getbinval(tuple, desc, 2, &isnull));
	npages = (int64 *) palloc0(sizeof(int64) * Max(npasses, 1));
	all = sweep_pages(npasses, npages,
					  DatumGetInt64(SPI_getbinval(tuple, desc, 3, &isnull)) / BLCKSZ);

	if (next < 0 || next >= all)
		next = 0;

	/*
	 * Under a statement_timeout, read in chunks and stop starting them at the
	 * deadline (maint_deadline), so that the run ends and moves the cursor;
	 * the first chunk is always read, so every run advances.
	 */
	for (pass = 0; pass < npasses && left > 0 && next < all && !stopped; pass++)
	{
		int64		from;
		int64		to;

		if (next >= offset + npages[pass])
		{
			offset += npages[pass];
			continue;
		}
		from = next - offset;
		to = Min(npages[pass], from + left);
		while (from < to && !stopped)
		{
			int64		upto = deadline ? Min(to, from + SWEEP_CHUNK_PAGES) : to;

			values[2] = sweep_page_tid(from);
			values[3] = sweep_page_tid(upto);
			idem_citus_enter(pass);
			ret = idem_spi_execute(idem_saved_plan(&sweep_slice_plan, sweep_slice_sql,
												   4, argtypes, 0),
								   values, nulls, false, 0);
			if (ret != SPI_OK_SELECT)
				elog(ERROR, "sweeping keys failed: %s", SPI_result_code_string(ret));
			*total += maint_count_into_stats(IDEM_STAT_SWEPT);
			idem_citus_leave();
			left -= upto - from;
			next = offset + upto;
			from = upto;
			stopped = deadline && GetCurrentTimestamp() >= deadline;
		}
		offset += npages[pass];
	}
	pfree(npages);
	return next >= all ? 0 : next;
}

/*
 * idem_sweep
 *		SQL: idem_sweep(older_than interval DEFAULT NULL) RETURNS bigint
 *
 * Flags stale processing keys (see sweep_sql) needs_reconciliation, for
 * an operator to settle with idem_resolve; they stay processing.
 * older_than, when given, replaces every scope's lock_timeout and the
 * whole table is read.  Without it (the scheduled run of idem_maintain),
 * at most idempotency.sweep_state.pages_per_run pages are read, from where
 * the last such run stopped, and the cursor moves on: a run costs the same
 * however large the table is, and the runs go round the whole table.  Under
 * a statement_timeout a run also stops at two fifths of it (after at least
 * one chunk of SWEEP_CHUNK_PAGES pages), where the next run goes on.  Row
 * locks: the flagged rows (and the cursor row) only; rows locked by a live
 * request are skipped.  Counts "swept" per (tenant, scope) and returns the
 * number flagged.
 */
Datum
idem_sweep(PG_FUNCTION_ARGS)
{
	Oid			argtypes[4] = {INTERVALOID, INTERVALOID, TIDOID, TIDOID};
	Datum		values[4];
	char		nulls[4] = {' ', ' ', ' ', ' '};
	bool		sliced;
	int64		next = 0;
	int			ret;
	int64		total;

	/*
	 * Without older_than, one slice of the table; a 1.0 catalog, served by
	 * this library until ALTER EXTENSION UPDATE, has no sweep_state: there
	 * the whole table is read, as 1.0 did.
	 */
	sliced = PG_ARGISNULL(0) &&
		OidIsValid(get_relname_relid("sweep_state",
									 get_namespace_oid("idempotency", false)));
	if (PG_ARGISNULL(0))
	{
		values[0] = (Datum) 0;
		nulls[0] = 'n';
	}
	else
	{
		Interval   *older_than = PG_GETARG_INTERVAL_P(0);

		idem_check_interval(older_than, "older_than", false,
							"Pass the age after which a processing key counts as stale, such as '10 minutes', or NULL for each scope's lock_timeout.");
		values[0] = IntervalPGetDatum(older_than);
	}
	values[1] = idem_interval_datum(idem_seconds_interval(idem_default_lock_timeout));

	idem_spi_connect();
	if (sliced)
	{
		Oid			advtypes[1] = {INT8OID};
		Datum		advvalues[1];

		total = 0;
		next = sweep_slices(argtypes, values, nulls, &total);
		advvalues[0] = Int64GetDatum(next);
		ret = idem_spi_execute(idem_saved_plan(&sweep_advance_plan,
											   sweep_advance_sql, 1, advtypes, 0),
							   advvalues, NULL, false, 0);
		if (ret != SPI_OK_UPDATE)
			elog(ERROR, "moving the sweep cursor failed: %s",
				 SPI_result_code_string(ret));
	}
	else
		total = maint_run_passes(&sweep_plan, sweep_sql, 2, argtypes, values,
								 nulls, 0, SPI_OK_SELECT, IDEM_STAT_SWEPT,
								 "sweeping keys");
	SPI_finish();

	PG_RETURN_INT64(total);
}

/*
 * Reclaim the expired leases at "tids" (reclaim_sql); returns how many.
 */
static int64
reclaim_batch(ItemPointerData *tids, int ntids)
{
	Oid			argtypes[1] = {TIDARRAYOID};
	Datum		values[1];
	Datum	   *elems = (Datum *) palloc(sizeof(Datum) * ntids);
	int			ret;

	for (int i = 0; i < ntids; i++)
		elems[i] = PointerGetDatum(&tids[i]);
	values[0] = PointerGetDatum(construct_array(elems, ntids, TIDOID,
												sizeof(ItemPointerData),
												false, TYPALIGN_SHORT));
	ret = idem_spi_execute(idem_saved_plan(&reclaim_plan, reclaim_sql,
										   1, argtypes, 0),
						   values, NULL, false, 0);
	if (ret != SPI_OK_UPDATE)
		elog(ERROR, "reclaiming outbox leases failed: %s",
			 SPI_result_code_string(ret));
	pfree(DatumGetPointer(values[0]));
	pfree(elems);
	return (int64) SPI_processed;
}

/*
 * idem_reclaim_leases
 *		SQL: idem_reclaim_leases() RETURNS bigint
 *
 * Returns outbox rows whose lease has expired to pending, counting the
 * lost attempt (dead when that was the last one), and clears the lease, in
 * batches of RECLAIM_BATCH rows, the longest expired first.  The expired
 * leases are read through a cursor (reclaim_scan_v11_sql, through
 * outbox_lease_idx; on 1.0 reclaim_scan_sql, the due rows among which
 * they are), RECLAIM_FETCH at a time: under a statement_timeout the call
 * stops fetching at three fifths of it (maint_deadline), after one fetch
 * at least, and reclaims what it found.  Row locks: those
 * rows; rows a worker is acknowledging right now are skipped.
 */
Datum
idem_reclaim_leases(PG_FUNCTION_ARGS)
{
	TimestampTz deadline = maint_deadline(3);
	int64		total = 0;
	int			npasses = idem_citus_passes();
	int			first = idem_citus_first_pass(npasses);
	bool		stopped = false;
	ItemPointerData *expired;

	/* it writes only what it finds: refused on a standby all the same */
	idem_require_writable("idem_reclaim_leases()");
	/* it reads the expired leases, then updates them: see there */
	idem_outbox_lock_for_update();
	expired = (ItemPointerData *) palloc(sizeof(ItemPointerData) * RECLAIM_BATCH);
	idem_spi_connect();
	for (int pass = 0; pass < npasses && !stopped; pass++)
	{
		Portal		cursor;
		SPIPlanPtr	plan;
		int			nexpired = 0;
		bool		done = false;

		idem_citus_enter((first + pass) % npasses);
		if (idem_outbox_has_lease_idx())
			plan = idem_saved_plan(&reclaim_scan_v11_plan, reclaim_scan_v11_sql,
								   0, NULL,
								   CURSOR_OPT_FAST_PLAN | CURSOR_OPT_NO_SCROLL);
		else
			plan = idem_saved_plan(&reclaim_scan_plan, reclaim_scan_sql, 0,
								   NULL,
								   CURSOR_OPT_FAST_PLAN | CURSOR_OPT_NO_SCROLL);
		cursor = SPI_cursor_open(NULL, plan, NULL, NULL, false);
		while (!done)
		{
			SPITupleTable *fetched;
			uint64		nfetched;

			SPI_cursor_fetch(cursor, true, RECLAIM_FETCH);
			fetched = SPI_tuptable;
			nfetched = SPI_processed;
			done = nfetched < RECLAIM_FETCH;
			for (uint64 i = 0; i < nfetched; i++)
			{
				bool		isnull;
				Datum		lapsed = SPI_getbinval(fetched->vals[i],
												   fetched->tupdesc, 2,
												   &isnull);

				Datum		tid;

				if (isnull || !DatumGetBool(lapsed))
					continue;
				tid = SPI_getbinval(fetched->vals[i], fetched->tupdesc, 1,
									&isnull);
				expired[nexpired++] = *(ItemPointer) DatumGetPointer(tid);
				if (nexpired == RECLAIM_BATCH)
				{
					total += reclaim_batch(expired, nexpired);
					nexpired = 0;
				}
			}
			SPI_freetuptable(fetched);
			if (!done && deadline && GetCurrentTimestamp() >= deadline)
			{
				stopped = true;
				done = true;
			}
		}
		if (nexpired > 0)
			total += reclaim_batch(expired, nexpired);
		SPI_cursor_close(cursor);
		idem_citus_leave();
	}
	SPI_finish();
	pfree(expired);

	PG_RETURN_INT64(total);
}

/*
 * idem_purge_outbox
 *		SQL: idem_purge_outbox(batch_size int DEFAULT 5000) RETURNS bigint
 *
 * Deletes at most batch_size delivered (done) outbox rows whose done_at is
 * older than idempotency.outbox_retention.  Pending, leased and dead rows
 * are never touched.  Row locks: the deleted rows.
 */
Datum
idem_purge_outbox(PG_FUNCTION_ARGS)
{
	int32		batch_size = maint_check_batch_size(fcinfo, "idem_purge_outbox");
	Oid			argtypes[2] = {INT4OID, INTERVALOID};
	Datum		values[2];
	int64		total;

	values[0] = Int32GetDatum(batch_size);
	values[1] = idem_interval_datum(idem_seconds_interval(idem_outbox_retention));

	idem_spi_connect();
	total = maint_run_passes(&purge_plan, purge_sql, 2, argtypes, values, NULL,
							 batch_size, SPI_OK_DELETE, IDEM_STAT_NCOUNTERS,
							 "purging the outbox");
	SPI_finish();

	PG_RETURN_INT64(total);
}

/* Name of this database's maintenance job, palloc'd. */
static char *
maint_cron_job_name(void)
{
	return psprintf("%s%s", IDEM_CRON_JOB_PREFIX,
					get_database_name(MyDatabaseId));
}

/*
 * The job's command: CALL idempotency.maintain with every argument given
 * and typed.  It names schema idempotency, which only the extension's
 * owner can rename or create in, never the extension's own schema: a
 * database owner may rename that one and create another of its name, and
 * the job, which runs as a superuser, would then call what they put there
 * (see install/40_maintenance.sql).
 */
#define MAINT_JOB_ARGS \
	"('50 seconds'::pg_catalog.interval," \
	" 1000::pg_catalog.int4, '100 milliseconds'::pg_catalog.interval)"

static char *
maint_job_command(void)
{
	Oid			argtypes[3] = {INTERVALOID, INT4OID, INTERVALOID};
	Oid			nspid = get_namespace_oid("idempotency", false);

	if (SearchSysCacheExists3(PROCNAMEARGSNSP, CStringGetDatum("maintain"),
							  PointerGetDatum(buildoidvector(argtypes, 3)),
							  ObjectIdGetDatum(nspid)))
		return pstrdup("CALL idempotency.maintain" MAINT_JOB_ARGS);

	/*
	 * A 1.0 catalog (before ALTER EXTENSION UPDATE) has no
	 * idempotency.maintain, and its own procedure is in the schema the
	 * functions were installed in, such as public, which the database owner
	 * may own: a job calling it there as a superuser would run whatever that
	 * owner puts in its place.
	 */
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("the idempotency extension in this database is at version 1.0"),
			 errdetail("Version 1.0's maintenance procedure is in a schema the database owner may control; the job must call idempotency.maintain, which the update creates."),
			 errhint("Run ALTER EXTENSION idempotency UPDATE, then call idem_schedule_maintenance() again.")));
	return NULL;				/* keep compiler quiet */
}

/*
 * maint_require_pg_cron
 *		pg_cron's functions exist only in the one database named by
 *		cron.database_name.  Anywhere else, say exactly what to run there
 *		instead ("sql_there", already a complete statement).
 */
static void
maint_require_pg_cron(const char *sql_there)
{
	const char *crondb;

	if (OidIsValid(get_extension_oid("pg_cron", true)))
		return;

	crondb = GetConfigOption("cron.database_name", true, false);
	if (crondb == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pg_cron is not loaded on this server"),
				 errdetail("Scheduled maintenance needs pg_cron in shared_preload_libraries."),
				 errhint("Add pg_cron to shared_preload_libraries, restart, run CREATE EXTENSION pg_cron in the database named by cron.database_name, and there run: %s",
						 sql_there)));

	if (strcmp(crondb, get_database_name(MyDatabaseId)) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pg_cron is not installed in database \"%s\"",
						crondb),
				 errdetail("This is the database named by cron.database_name, but CREATE EXTENSION pg_cron has not been run in it."),
				 errhint("Run CREATE EXTENSION pg_cron in this database as a superuser, then call this function again.")));

	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("pg_cron is not installed in database \"%s\"",
					get_database_name(MyDatabaseId)),
			 errdetail("pg_cron's functions exist only in the database named by cron.database_name (\"%s\").",
					   crondb),
			 errhint("Connect to database \"%s\" as a superuser and run: %s",
					 crondb, sql_there)));
}

/* The hint for a schedule pg_cron cannot take. */
#define SCHEDULE_HINT "Pass a cron schedule of five fields, such as '* * * * *' (every minute) or '*/5 * * * *'; pg_cron runs a job at most once a minute."

/*
 * A schedule as an error message shows it: no longer than a schedule can
 * be (a long text is cut, and said to be), on one line.
 */
static char *
maint_schedule_shown(const char *schedule)
{
	int			len = strlen(schedule);
	int			clip = pg_mbcliplen(schedule, len, 64);
	StringInfoData buf;
	int			i;

	initStringInfo(&buf);
	for (i = 0; i < clip; i++)
		appendStringInfoChar(&buf, (unsigned char) schedule[i] < ' ' ? ' ' : schedule[i]);
	if (clip < len)
		appendStringInfo(&buf, "... (%d bytes)", len);
	return buf.data;
}

/*
 * Whether "schedule" has the shape of a pg_cron schedule: five fields, one
 * of its @macros (@hourly, @daily ...) or 1 to 59 seconds ("30 seconds",
 * which pg_cron 1.5 and later take).
 * pg_cron checks the fields themselves; this catches, before the hint of
 * another database passes one on, a schedule that cannot be one at all,
 * such as "every minute".
 */
static bool
maint_schedule_shaped(const char *schedule, bool *in_seconds)
{
	const char *p = schedule;
	int			fields = 0;
	char		first[32] = "";
	char		second[32] = "";

	*in_seconds = false;
	while (*p)
	{
		const char *start;

		while (*p == ' ' || *p == '\t')
			p++;
		if (*p == '\0')
			break;
		start = p;
		while (*p && *p != ' ' && *p != '\t')
			p++;
		if (fields < 2)
			strlcpy(fields == 0 ? first : second, start,
					Min((size_t) (p - start) + 1, sizeof(first)));
		fields++;
	}
	if (fields == 5)
		return true;
	if (fields == 1)
		return strcmp(first, "@yearly") == 0 || strcmp(first, "@annually") == 0 ||
			strcmp(first, "@monthly") == 0 || strcmp(first, "@weekly") == 0 ||
			strcmp(first, "@daily") == 0 || strcmp(first, "@hourly") == 0 ||
			strcmp(first, "@reboot") == 0;
	/* pg_cron 1.5 and later: 1 to 59 seconds */
	*in_seconds = fields == 2 && first[0] != '\0' &&
		strspn(first, "0123456789") == strlen(first) && strlen(first) <= 2 &&
		atoi(first) >= 1 && atoi(first) <= 59 &&
		(strcmp(second, "second") == 0 || strcmp(second, "seconds") == 0);
	return *in_seconds;
}

/*
 * Outside pg_cron's database, refuse a schedule in seconds when the pg_cron
 * installed on this server is older than 1.5, which takes none: the hint
 * would otherwise hand out a statement that pg_cron refuses.  (In pg_cron's
 * database pg_cron answers for itself.)  Unknown versions pass.
 */
static void
maint_check_seconds_schedule(const char *schedule)
{
	char	   *version = NULL;
	int			major = 0;
	int			minor = 0;
	MemoryContext cxt = CurrentMemoryContext;

	if (OidIsValid(get_extension_oid("pg_cron", true)))
		return;
	idem_spi_connect();
	if (idem_spi_execute(idem_saved_plan(&cron_version_plan,
										 cron_version_sql, 0, NULL, 0),
						 NULL, NULL, true, 1) == SPI_OK_SELECT &&
		SPI_processed == 1)
	{
		char	   *v = SPI_getvalue(SPI_tuptable->vals[0],
									 SPI_tuptable->tupdesc, 1);

		if (v != NULL)
			version = MemoryContextStrdup(cxt, v);
	}
	SPI_finish();
	if (version == NULL || sscanf(version, "%d.%d", &major, &minor) != 2)
		return;
	if (major > 1 || (major == 1 && minor >= 5))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("invalid schedule: %s", maint_schedule_shown(schedule)),
			 errdetail("pg_cron %s, installed on this server, takes no schedule in seconds (1.5 and later do).",
					   version),
			 errhint(SCHEDULE_HINT)));
}

/*
 * idem_schedule_maintenance
 *		SQL: idem_schedule_maintenance(schedule text DEFAULT '* * * * *')
 *			 RETURNS bigint
 *
 * Registers, or updates, the pg_cron job "idempotency-maintenance-<db>"
 * that runs CALL idempotency.maintain() in this database, as the
 * extension owner.  Returns the job id.  Without pg_cron in this database,
 * raises 55000 with the cron.schedule_in_database call to run in pg_cron's
 * database.  Writes: one row of cron.job.
 */
Datum
idem_schedule_maintenance(PG_FUNCTION_ARGS)
{
	Oid			argtypes[4] = {TEXTOID, TEXTOID, TEXTOID, TEXTOID};
	Datum		values[4];
	char	   *schedule;
	char	   *jobname;
	const char *command;
	char	   *dbname;
	volatile int ret = 0;
	bool		isnull;
	int64		jobid;
	bool		in_seconds;
	MemoryContext callcxt;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("schedule must not be null"),
				 errhint("Pass a cron schedule such as '* * * * *' (every minute), or no argument for that default.")));

	schedule = text_to_cstring(PG_GETARG_TEXT_PP(0));
	if (!maint_schedule_shaped(schedule, &in_seconds))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid schedule: %s", maint_schedule_shown(schedule)),
				 errhint(SCHEDULE_HINT)));
	if (in_seconds)
		maint_check_seconds_schedule(schedule);
	jobname = maint_cron_job_name();
	command = maint_job_command();
	dbname = get_database_name(MyDatabaseId);

	maint_require_pg_cron(psprintf("SELECT cron.schedule_in_database(%s, %s, %s, %s);",
								   quote_literal_cstr(jobname),
								   quote_literal_cstr(schedule),
								   quote_literal_cstr(command),
								   quote_literal_cstr(dbname)));

	values[0] = CStringGetTextDatum(jobname);
	values[1] = CStringGetTextDatum(schedule);
	values[2] = CStringGetTextDatum(command);
	values[3] = CStringGetTextDatum(dbname);

	idem_spi_connect();
	callcxt = CurrentMemoryContext;
	PG_TRY();
	{
		ret = idem_spi_execute(idem_saved_plan(&schedule_plan, schedule_sql,
											   4, argtypes, 0),
							   values, NULL, false, 1);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		/* pg_cron refuses a schedule it cannot parse with a message alone */
		MemoryContextSwitchTo(callcxt);
		edata = CopyErrorData();
		if (edata->sqlerrcode != ERRCODE_INVALID_PARAMETER_VALUE ||
			edata->hint != NULL)
			PG_RE_THROW();
		FlushErrorState();
		edata->hint = pstrdup(SCHEDULE_HINT);
		ReThrowError(edata);
	}
	PG_END_TRY();
	if (ret != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "scheduling the maintenance job failed: %s",
			 SPI_result_code_string(ret));
	jobid = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
										SPI_tuptable->tupdesc, 1, &isnull));
	SPI_finish();

	PG_RETURN_INT64(jobid);
}

/*
 * idem_unschedule_maintenance
 *		SQL: idem_unschedule_maintenance() RETURNS boolean
 *
 * Removes this database's maintenance job; true if there was one, false if
 * not (removing twice is not an error).  Without pg_cron in this database,
 * raises 55000 with the statement to run in pg_cron's database.
 */
Datum
idem_unschedule_maintenance(PG_FUNCTION_ARGS)
{
	Oid			argtypes[1] = {TEXTOID};
	Datum		values[1];
	char	   *jobname = maint_cron_job_name();
	int			ret;
	bool		removed;

	/* cron.unschedule deletes the job whatever the transaction */
	idem_require_writable("idem_unschedule_maintenance()");
	maint_require_pg_cron(psprintf("SELECT cron.unschedule(%s);",
								   quote_literal_cstr(jobname)));

	values[0] = CStringGetTextDatum(jobname);

	idem_spi_connect();
	ret = idem_spi_execute(idem_saved_plan(&unschedule_plan, unschedule_sql,
										   1, argtypes, 0),
						   values, NULL, false, 0);
	if (ret != SPI_OK_SELECT)
		elog(ERROR, "unscheduling the maintenance job failed: %s",
			 SPI_result_code_string(ret));
	removed = SPI_processed > 0;
	SPI_finish();

	PG_RETURN_BOOL(removed);
}
