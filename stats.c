/*-------------------------------------------------------------------------
 *
 * stats.c
 *	  Cumulative counters per (tenant, scope) in shared memory, behind the
 *	  idempotency.stats view.
 *
 * The hot path (idem_reserve, idem_complete, the reaper) calls
 * idem_stats_count() on every request, so counting must be cheap and must
 * never raise an error: a lookup under a shared LWLock and an atomic add.
 * Only the first count for a new (tenant, scope) pair takes the lock in
 * exclusive mode, to insert the entry.  The table holds at most
 * idempotency.stats_max_entries pairs; later pairs are counted under the
 * pre-created entry ("(other)", "(other)"), so memory stays bounded however
 * many tenants there are.
 *
 * Counters are not transactional (a reservation that is rolled back still
 * counted as created), like pg_stat_statements.  They survive a clean
 * shutdown: the postmaster writes them to pg_stat/idempotency.stat when it
 * exits and reads the file back (and removes it) at the next start.  Like
 * PostgreSQL's own cumulative statistics they are discarded after a crash:
 * a backend crash restarts shared memory without writing the file, and a
 * file written at an immediate shutdown is ignored because pg_control then
 * says the cluster was not shut down cleanly.
 *
 * Locking: idem_stats_state->lock (a named LWLock tranche) protects the hash
 * table's structure.  Shared mode suffices to find an entry and add to its
 * counters, which are atomics; exclusive mode inserts or removes entries.
 *
 * Shared memory exists only when the library is in shared_preload_libraries;
 * without it idem_stats_count() does nothing and the view raises an error
 * that says so.
 *
 * IDENTIFICATION
 *	  stats.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <unistd.h>

#include "access/htup_details.h"
#include "catalog/pg_control.h"
#include "common/controldata_utils.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "port/atomics.h"
#include "storage/fd.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "idempotency.h"

/*
 * Longest tenant or scope name kept, including the terminating zero.
 * Longer names are truncated (on a character boundary) for counting.
 */
#define IDEM_STATS_NAME_LEN 128

/* Name of the overflow entry, for both tenant and scope. */
#define IDEM_STATS_OTHER "(other)"

/* Where the counters are kept across a clean restart. */
#define IDEM_STATS_FILE PGSTAT_STAT_PERMANENT_DIRECTORY "/idempotency.stat"
#define IDEM_STATS_FILE_MAGIC 0x1de57a75
#define IDEM_STATS_FILE_VERSION 1

typedef struct IdemStatsKey
{
	Oid			dbid;			/* InvalidOid for the overflow entry */
	char		tenant[IDEM_STATS_NAME_LEN];
	char		scope[IDEM_STATS_NAME_LEN];
} IdemStatsKey;

typedef struct IdemStatsEntry
{
	IdemStatsKey key;			/* hash key: must be first */
	pg_atomic_uint64 counters[IDEM_STAT_NCOUNTERS];
} IdemStatsEntry;

typedef struct IdemStatsShared
{
	LWLock	   *lock;			/* protects the hash table's structure */
} IdemStatsShared;

/* On-disk form of one entry. */
typedef struct IdemStatsFileEntry
{
	IdemStatsKey key;
	uint64		counters[IDEM_STAT_NCOUNTERS];
} IdemStatsFileEntry;

/* Both NULL unless the library was preloaded. */
static IdemStatsShared *idem_stats_state = NULL;
static HTAB *idem_stats_hash = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static void idem_stats_shmem_request(void);
static void idem_stats_shmem_startup(void);
static void idem_stats_shmem_shutdown(int code, Datum arg);
static Size idem_stats_memsize(void);
static void idem_stats_make_key(IdemStatsKey *key, Oid dbid,
								const char *tenant, const char *scope);
static IdemStatsEntry *idem_stats_enter(const IdemStatsKey *key);
static bool idem_stats_clean_shutdown(void);
static void idem_stats_load(void);

PG_FUNCTION_INFO_V1(idem_stats);
PG_FUNCTION_INFO_V1(idem_stats_reset);

/*
 * idem_stats_init
 *		Called from _PG_init.  Installs the shared-memory hooks only when
 *		the library is being preloaded: a library loaded later cannot get
 *		shared memory, and the counters then stay off.
 */
void
idem_stats_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;

	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = idem_stats_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = idem_stats_shmem_startup;
}

static Size
idem_stats_memsize(void)
{
	return add_size(MAXALIGN(sizeof(IdemStatsShared)),
					hash_estimate_size(idem_stats_max_entries + 1,
									   sizeof(IdemStatsEntry)));
}

/*
 * idem_stats_shmem_request
 *		Reserve the shared memory and the LWLock the counters need.  On
 *		PostgreSQL 15 and later this runs from shmem_request_hook; before,
 *		straight from _PG_init.
 */
static void
idem_stats_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(idem_stats_memsize());
	RequestNamedLWLockTranche("idempotency", 1);
}

/*
 * idem_stats_shmem_startup
 *		Attach to (or create) the shared state.  The process that creates it
 *		(the postmaster) also creates the overflow entry, loads the counters
 *		saved at the last clean shutdown, and arranges to save them at exit.
 */
static void
idem_stats_shmem_startup(void)
{
	bool		found;
	HASHCTL		info;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	idem_stats_state = NULL;
	idem_stats_hash = NULL;

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);

	idem_stats_state = ShmemInitStruct("idempotency stats",
								 sizeof(IdemStatsShared), &found);
	if (!found)
		idem_stats_state->lock = &(GetNamedLWLockTranche("idempotency"))->lock;

	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(IdemStatsKey);
	info.entrysize = sizeof(IdemStatsEntry);
	idem_stats_hash = ShmemInitHash("idempotency stats hash",
									idem_stats_max_entries + 1,
									idem_stats_max_entries + 1,
									&info,
									HASH_ELEM | HASH_BLOBS);

	LWLockRelease(AddinShmemInitLock);

	if (!IsUnderPostmaster)
		on_shmem_exit(idem_stats_shmem_shutdown, (Datum) 0);

	if (found)
		return;

	/* only the postmaster gets here, before any backend exists */
	{
		IdemStatsKey other;

		idem_stats_make_key(&other, InvalidOid,
							IDEM_STATS_OTHER, IDEM_STATS_OTHER);
		(void) idem_stats_enter(&other);
	}
	idem_stats_load();
}

/*
 * idem_stats_make_key
 *		Build a zero-padded hash key (HASH_BLOBS hashes all of it), cutting
 *		long names on a character boundary.
 */
static void
idem_stats_make_key(IdemStatsKey *key, Oid dbid, const char *tenant,
					const char *scope)
{
	int			len;

	memset(key, 0, sizeof(IdemStatsKey));
	key->dbid = dbid;

	len = strlen(tenant);
	if (len >= IDEM_STATS_NAME_LEN)
		len = pg_mbcliplen(tenant, len, IDEM_STATS_NAME_LEN - 1);
	memcpy(key->tenant, tenant, len);

	len = strlen(scope);
	if (len >= IDEM_STATS_NAME_LEN)
		len = pg_mbcliplen(scope, len, IDEM_STATS_NAME_LEN - 1);
	memcpy(key->scope, scope, len);
}

/*
 * idem_stats_enter
 *		Find or insert the entry for "key".  Caller holds the lock
 *		exclusively.  When the table is full the overflow entry is returned;
 *		NULL only if even that is missing (it never is once started).
 */
static IdemStatsEntry *
idem_stats_enter(const IdemStatsKey *key)
{
	IdemStatsEntry *entry;
	bool		found;

	entry = hash_search(idem_stats_hash, key, HASH_FIND, NULL);
	if (entry != NULL)
		return entry;

	if (hash_get_num_entries(idem_stats_hash) >= idem_stats_max_entries + 1)
	{
		IdemStatsKey other;

		idem_stats_make_key(&other, InvalidOid,
							IDEM_STATS_OTHER, IDEM_STATS_OTHER);
		return hash_search(idem_stats_hash, &other, HASH_FIND, NULL);
	}

	/* HASH_ENTER_NULL: running out of shared memory must not raise */
	entry = hash_search(idem_stats_hash, key, HASH_ENTER_NULL, &found);
	if (entry != NULL && !found)
	{
		int			i;

		for (i = 0; i < IDEM_STAT_NCOUNTERS; i++)
			pg_atomic_init_u64(&entry->counters[i], 0);
	}
	return entry;
}

/*
 * idem_stats_count
 *		Add "n" to one counter of (tenant, scope).  Takes the stats lock in
 *		shared mode (exclusive only the first time a pair is seen).  Never
 *		raises: a no-op without shared memory or with NULL names.
 */
void
idem_stats_count(const char *tenant, const char *scope,
				 IdemCounter counter, int64 n)
{
	IdemStatsKey key;
	IdemStatsEntry *entry;

	if (idem_stats_state == NULL || idem_stats_hash == NULL ||
		tenant == NULL || scope == NULL ||
		counter < 0 || counter >= IDEM_STAT_NCOUNTERS || n == 0)
		return;

	idem_stats_make_key(&key, MyDatabaseId, tenant, scope);

	LWLockAcquire(idem_stats_state->lock, LW_SHARED);
	entry = hash_search(idem_stats_hash, &key, HASH_FIND, NULL);
	if (entry != NULL)
	{
		pg_atomic_fetch_add_u64(&entry->counters[counter], (uint64) n);
		LWLockRelease(idem_stats_state->lock);
		return;
	}
	LWLockRelease(idem_stats_state->lock);

	LWLockAcquire(idem_stats_state->lock, LW_EXCLUSIVE);
	entry = idem_stats_enter(&key);
	if (entry != NULL)
		pg_atomic_fetch_add_u64(&entry->counters[counter], (uint64) n);
	LWLockRelease(idem_stats_state->lock);
}

/*
 * idem_stats_clean_shutdown
 *		Did the server last stop cleanly?  After an immediate shutdown (or a
 *		crash of the whole server) pg_control still says "in production" and
 *		crash recovery follows: the counters are not to be trusted then.
 */
static bool
idem_stats_clean_shutdown(void)
{
	bool		crc_ok;
	ControlFileData *control = get_controlfile(DataDir, &crc_ok);
	bool		clean;

	clean = crc_ok && (control->state == DB_SHUTDOWNED ||
					   control->state == DB_SHUTDOWNED_IN_RECOVERY);
	pfree(control);
	return clean;
}

/*
 * idem_stats_load
 *		Read the counters saved at the last clean shutdown, then remove the
 *		file so that a crash later cannot bring back old values.  A file
 *		left by an unclean stop is removed unread.  Runs in the
 *		postmaster at start-up; a missing file is normal, a damaged one is
 *		logged and ignored.
 */
static void
idem_stats_load(void)
{
	FILE	   *file;
	uint32		header[3];
	int64		nentries;
	int64		i;

	if (!idem_stats_clean_shutdown())
	{
		unlink(IDEM_STATS_FILE);
		return;
	}

	file = AllocateFile(IDEM_STATS_FILE, PG_BINARY_R);
	if (file == NULL)
	{
		if (errno != ENOENT)
			ereport(LOG,
					(errcode_for_file_access(),
					 errmsg("could not read file \"%s\": %m", IDEM_STATS_FILE)));
		return;
	}

	if (fread(header, sizeof(header), 1, file) != 1 ||
		header[0] != IDEM_STATS_FILE_MAGIC ||
		header[1] != IDEM_STATS_FILE_VERSION ||
		header[2] != IDEM_STAT_NCOUNTERS ||
		fread(&nentries, sizeof(nentries), 1, file) != 1)
		goto bad_file;

	for (i = 0; i < nentries; i++)
	{
		IdemStatsFileEntry saved;
		IdemStatsEntry *entry;
		int			c;

		if (fread(&saved, sizeof(saved), 1, file) != 1)
			goto bad_file;
		/* never trust the file's strings to be terminated */
		saved.key.tenant[IDEM_STATS_NAME_LEN - 1] = '\0';
		saved.key.scope[IDEM_STATS_NAME_LEN - 1] = '\0';

		entry = idem_stats_enter(&saved.key);
		if (entry == NULL)
			break;
		for (c = 0; c < IDEM_STAT_NCOUNTERS; c++)
			pg_atomic_fetch_add_u64(&entry->counters[c], saved.counters[c]);
	}

	FreeFile(file);
	unlink(IDEM_STATS_FILE);
	return;

bad_file:
	ereport(LOG,
			(errcode(ERRCODE_DATA_CORRUPTED),
			 errmsg("ignoring invalid idempotency statistics file \"%s\"",
					IDEM_STATS_FILE)));
	FreeFile(file);
	unlink(IDEM_STATS_FILE);
}

/*
 * idem_stats_shmem_shutdown
 *		on_shmem_exit callback of the postmaster: save the counters, unless
 *		the server is going down abnormally (code != 0), in which case they
 *		are deliberately lost.  Writes a temporary file and renames it, so a
 *		crash half-way never leaves a torn file behind.
 */
static void
idem_stats_shmem_shutdown(int code, Datum arg pg_attribute_unused())
{
	FILE	   *file;
	uint32		header[3];
	int64		nentries;
	HASH_SEQ_STATUS hash_seq;
	IdemStatsEntry *entry;
	const char *tmpfile = IDEM_STATS_FILE ".tmp";

	if (code != 0 || idem_stats_state == NULL || idem_stats_hash == NULL)
		return;

	file = AllocateFile(tmpfile, PG_BINARY_W);
	if (file == NULL)
		goto error;

	header[0] = IDEM_STATS_FILE_MAGIC;
	header[1] = IDEM_STATS_FILE_VERSION;
	header[2] = IDEM_STAT_NCOUNTERS;
	nentries = hash_get_num_entries(idem_stats_hash);
	if (fwrite(header, sizeof(header), 1, file) != 1 ||
		fwrite(&nentries, sizeof(nentries), 1, file) != 1)
		goto error;

	hash_seq_init(&hash_seq, idem_stats_hash);
	while ((entry = hash_seq_search(&hash_seq)) != NULL)
	{
		IdemStatsFileEntry saved;
		int			c;

		/* no uninitialised padding in the file */
		memset(&saved, 0, sizeof(saved));
		memcpy(&saved.key, &entry->key, sizeof(IdemStatsKey));
		for (c = 0; c < IDEM_STAT_NCOUNTERS; c++)
			saved.counters[c] = pg_atomic_read_u64(&entry->counters[c]);
		if (fwrite(&saved, sizeof(saved), 1, file) != 1)
		{
			hash_seq_term(&hash_seq);
			goto error;
		}
	}

	if (FreeFile(file))
	{
		file = NULL;
		goto error;
	}
	(void) durable_rename(tmpfile, IDEM_STATS_FILE, LOG);
	return;

error:
	ereport(LOG,
			(errcode_for_file_access(),
			 errmsg("could not write file \"%s\": %m", tmpfile)));
	if (file)
		FreeFile(file);
	unlink(tmpfile);
}

/*
 * idem_stats_require_shmem
 *		The SQL-callable functions need the shared table; say how to get it.
 */
static void
idem_stats_require_shmem(void)
{
	if (idem_stats_state == NULL || idem_stats_hash == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idempotency statistics are not available"),
				 errdetail("The counters live in shared memory, which exists only when the library is loaded at server start."),
				 errhint("Add idempotency to shared_preload_libraries in postgresql.conf and restart the server.")));
}

/*
 * idem_stats
 *		SQL: idem_stats() RETURNS SETOF (tenant, scope, created, ...): one
 *		row per (tenant, scope) of this database, and the overflow row (all
 *		databases together) when it has counted something.  Takes the
 *		stats lock in shared mode while copying; the counters are read one
 *		by one, so a row may mix values from just before and just after a
 *		concurrent count.
 */
Datum
idem_stats(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	TupleDesc	tupdesc;
	Tuplestorestate *tupstore;
	MemoryContext oldcontext;
	HASH_SEQ_STATUS hash_seq;
	IdemStatsEntry *entry;

	idem_stats_require_shmem();

	if (rsinfo == NULL || !IsA(rsinfo, ReturnSetInfo) ||
		(rsinfo->allowedModes & SFRM_Materialize) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("set-valued function called in context that cannot accept a set"),
				 errhint("Call idem_stats() in the FROM clause, or read the idempotency.stats view.")));
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	oldcontext = MemoryContextSwitchTo(rsinfo->econtext->ecxt_per_query_memory);
	tupdesc = CreateTupleDescCopy(tupdesc);
	tupstore = tuplestore_begin_heap(true, false, work_mem);
	MemoryContextSwitchTo(oldcontext);

	rsinfo->returnMode = SFRM_Materialize;
	rsinfo->setResult = tupstore;
	rsinfo->setDesc = tupdesc;

	LWLockAcquire(idem_stats_state->lock, LW_SHARED);
	hash_seq_init(&hash_seq, idem_stats_hash);
	while ((entry = hash_seq_search(&hash_seq)) != NULL)
	{
		Datum		values[2 + IDEM_STAT_NCOUNTERS];
		bool		nulls[2 + IDEM_STAT_NCOUNTERS];
		uint64		total = 0;
		int			c;

		/* other databases' tenants are none of this database's business */
		if (entry->key.dbid != MyDatabaseId && OidIsValid(entry->key.dbid))
			continue;

		memset(nulls, 0, sizeof(nulls));
		for (c = 0; c < IDEM_STAT_NCOUNTERS; c++)
		{
			uint64		v = pg_atomic_read_u64(&entry->counters[c]);

			total += v;
			values[2 + c] = Int64GetDatum((int64) v);
		}
		if (total == 0 && !OidIsValid(entry->key.dbid))
			continue;

		values[0] = CStringGetTextDatum(entry->key.tenant);
		values[1] = CStringGetTextDatum(entry->key.scope);
		tuplestore_putvalues(tupstore, tupdesc, values, nulls);
	}
	LWLockRelease(idem_stats_state->lock);

	return (Datum) 0;
}

/*
 * idem_stats_reset
 *		SQL: idem_stats_reset() RETURNS void.  Drops every (tenant, scope)
 *		entry of this database and zeroes the overflow entry (which all
 *		databases share), under the stats lock in exclusive mode.  Admin
 *		only (EXECUTE revoked from PUBLIC).
 */
Datum
idem_stats_reset(PG_FUNCTION_ARGS)
{
	HASH_SEQ_STATUS hash_seq;
	IdemStatsEntry *entry;

	idem_stats_require_shmem();

	LWLockAcquire(idem_stats_state->lock, LW_EXCLUSIVE);
	hash_seq_init(&hash_seq, idem_stats_hash);
	while ((entry = hash_seq_search(&hash_seq)) != NULL)
	{
		if (!OidIsValid(entry->key.dbid))
		{
			int			c;

			for (c = 0; c < IDEM_STAT_NCOUNTERS; c++)
				pg_atomic_write_u64(&entry->counters[c], 0);
		}
		else if (entry->key.dbid == MyDatabaseId)
			hash_search(idem_stats_hash, &entry->key, HASH_REMOVE, NULL);
	}
	LWLockRelease(idem_stats_state->lock);

	PG_RETURN_VOID();
}
