/*-------------------------------------------------------------------------
 *
 * stats.c
 *	  Cumulative counters per (tenant, scope) in shared memory, behind the
 *	  idempotency.stats view.
 *
 * The hot path (idem_reserve, idem_complete, the reaper) calls
 * idem_stats_count() on every request, so counting must be cheap and must
 * never raise an error: a lookup under a shared LWLock and an atomic add.
 * Only the first count for a pair that has no entry takes the lock in
 * exclusive mode, to insert one.
 *
 * The table holds at most idempotency.stats_max_entries pairs.  When it is
 * full, inserting a new pair first evicts the least used entries, as
 * pg_stat_statements' entry_dealloc does: every entry's usage is its
 * request counts, decayed by USAGE_DECAY_FACTOR at each eviction, and the
 * USAGE_DEALLOC_PERCENT least used entries go at once, so the cost of an
 * eviction (one pass over the table) is shared by that many inserts.  What
 * an evicted entry counted is added to the overflow row ("(other)",
 * "(other)"), so totals stay right; busy tenants keep their rows however
 * many tenants come and go.  The overflow counters live outside the hash
 * table and are atomics: adding to them needs only the shared lock.
 *
 * The reaper and the sweeper count keys that expired or went stale long
 * after their requests, usually for pairs that were evicted meanwhile.
 * Those counts never evict: a pair without an entry goes to "(other)" under
 * the shared lock unless the table has room, so a reap of thousands of
 * tenants' keys cannot flush the active tenants out of the table.
 *
 * Entries of a database are dropped when DROP DATABASE commits (an object
 * access hook notes the database, a transaction callback acts on commit),
 * so a dropped database holds no room in the table.
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
 * table's structure and each entry's usage.  Shared mode suffices to find
 * an entry and add to its counters, or to the overflow counters, all of
 * which are atomics; exclusive mode inserts, evicts or removes entries.
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
#include "access/xact.h"
#include "catalog/objectaccess.h"
#include "catalog/pg_control.h"
#include "catalog/pg_database.h"
#include "common/controldata_utils.h"
#include "common/hashfn.h"
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
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "idempotency.h"

/*
 * Room for a tenant or scope name in a key, including the terminating zero.
 * A name of up to IDEM_STATS_NAME_KEPT bytes is kept as it is; a longer one
 * (names go up to 255 bytes) is kept as its first IDEM_STATS_NAME_KEPT
 * bytes, cut on a character boundary (so at least IDEM_STATS_NAME_KEPT - 3
 * bytes), then '~' and 16 hex digits of a 64-bit hash of the whole name:
 * two names sharing a long prefix never share a row (a role bound to one
 * of them would see the other's counts), and no name kept as it is can
 * look like such a form, which is longer than IDEM_STATS_NAME_KEPT bytes.
 */
#define IDEM_STATS_NAME_LEN 128
#define IDEM_STATS_NAME_KEPT 110

/* Name of the overflow row, for both tenant and scope. */
#define IDEM_STATS_OTHER "(other)"

/*
 * Where the counters are kept across a clean restart.  Version 2 added each
 * entry's usage, version 3 the rate_limited counter, version 4 keys long
 * names by their short form (IDEM_STATS_NAME_KEPT); files of versions 1
 * (no usage) to 3 are still read.  The header gives the number of
 * counters per entry; counters are only ever appended, so an older file's
 * are a prefix of today's and the rest start at zero.
 */
#define IDEM_STATS_FILE PGSTAT_STAT_PERMANENT_DIRECTORY "/idempotency.stat"
#define IDEM_STATS_FILE_MAGIC 0x1de57a75
#define IDEM_STATS_FILE_VERSION 4

/*
 * Eviction, as in pg_stat_statements: a new entry starts at USAGE_INIT,
 * each request count adds 1, every eviction multiplies all usages by
 * USAGE_DECAY_FACTOR and removes the USAGE_DEALLOC_PERCENT least used
 * entries (at least USAGE_DEALLOC_MIN).
 */
#define USAGE_INIT				(1.0)
#define USAGE_DECAY_FACTOR		(0.99)
#define USAGE_DEALLOC_PERCENT	5
#define USAGE_DEALLOC_MIN		10

typedef struct IdemStatsKey
{
	Oid			dbid;
	char		tenant[IDEM_STATS_NAME_LEN];
	char		scope[IDEM_STATS_NAME_LEN];
} IdemStatsKey;

typedef struct IdemStatsEntry
{
	IdemStatsKey key;			/* hash key: must be first */
	/* usage: an eviction reads these two, next to each other */
	pg_atomic_uint64 calls;		/* requests counted since the last eviction */
	double		usage;			/* under the lock in exclusive mode only */
	pg_atomic_uint64 counters[IDEM_STAT_NCOUNTERS];
} IdemStatsEntry;

typedef struct IdemStatsShared
{
	LWLock	   *lock;			/* protects the hash table and usages */
	/* the overflow row: evicted entries, and counts that found no room */
	pg_atomic_uint64 other[IDEM_STAT_NCOUNTERS];
} IdemStatsShared;

/* On-disk form of one entry; dbid InvalidOid is the overflow row. */
typedef struct IdemStatsFileEntry
{
	IdemStatsKey key;
	double		usage;
	uint64		counters[IDEM_STAT_NCOUNTERS];
} IdemStatsFileEntry;

/* The same in a version 1 file: no usage. */
typedef struct IdemStatsFileEntryV1
{
	IdemStatsKey key;
	uint64		counters[IDEM_STAT_NCOUNTERS];
} IdemStatsFileEntryV1;

/*
 * An entry is its fixed part (up to the counters) and "ncounters" counters,
 * with no padding after them (they are 8-byte aligned).
 */
StaticAssertDecl(sizeof(IdemStatsFileEntry) ==
				 offsetof(IdemStatsFileEntry, counters) +
				 IDEM_STAT_NCOUNTERS * sizeof(uint64),
				 "stats file entries have no tail padding");

/* Both NULL unless the library was preloaded. */
static IdemStatsShared *idem_stats_state = NULL;
static HTAB *idem_stats_hash = NULL;

/*
 * Room for the victims of one eviction, allocated once per process on
 * first need (never while it could raise: see idem_stats_evict).
 */
static IdemStatsEntry **idem_stats_victims = NULL;

/* A database this backend's transaction is dropping; acted on at commit. */
static Oid	idem_stats_dropped_db = InvalidOid;
static bool idem_stats_xact_callback_registered = false;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;
static object_access_hook_type prev_object_access_hook = NULL;

static void idem_stats_shmem_request(void);
static void idem_stats_shmem_startup(void);
static void idem_stats_shmem_shutdown(int code, Datum arg);
static Size idem_stats_memsize(void);
static void idem_stats_make_key(IdemStatsKey *key, Oid dbid,
								const char *tenant, const char *scope);
static uint32 idem_stats_key_hash(const void *key, Size keysize);
static int	idem_stats_victim_count(long nentries);
static bool idem_stats_evict(void);
static IdemStatsEntry *idem_stats_enter(const IdemStatsKey *key,
										uint32 hashcode, bool may_evict);
static void idem_stats_object_access(ObjectAccessType access, Oid classId,
									 Oid objectId, int subId, void *arg);
static void idem_stats_xact_callback(XactEvent event, void *arg);
static void idem_stats_remove_database(Oid dbid);
static void idem_stats_forget_database(Oid dbid);
static bool idem_stats_clean_shutdown(void);
static void idem_stats_load(void);

int			idem_stats_max_entries = 1000;

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

	/*
	 * A PGC_POSTMASTER variable can only be created while the server starts
	 * (a backend loading the library later gets a FATAL error); it only sizes
	 * the shared memory that exists in that case anyway.
	 */
	DefineCustomIntVariable("idempotency.stats_max_entries",
							gettext_noop("Number of (tenant, scope) pairs whose counters are kept in shared memory."),
							gettext_noop("When the table is full, the least used pairs are evicted and their counts added to tenant and scope \"(other)\"."),
							&idem_stats_max_entries,
							1000, 16, 1000000,
							PGC_POSTMASTER,
							0,
							NULL, NULL, NULL);

	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = idem_stats_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = idem_stats_shmem_startup;
	prev_object_access_hook = object_access_hook;
	object_access_hook = idem_stats_object_access;
}

static Size
idem_stats_memsize(void)
{
	return add_size(MAXALIGN(sizeof(IdemStatsShared)),
					hash_estimate_size(idem_stats_max_entries,
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
 *		(the postmaster) also loads the counters saved at the last clean
 *		shutdown, and arranges to save them at exit.
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
	{
		int			c;

		idem_stats_state->lock = &(GetNamedLWLockTranche("idempotency"))->lock;
		for (c = 0; c < IDEM_STAT_NCOUNTERS; c++)
			pg_atomic_init_u64(&idem_stats_state->other[c], 0);
	}

	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(IdemStatsKey);
	info.entrysize = sizeof(IdemStatsEntry);
	info.hash = idem_stats_key_hash;
	idem_stats_hash = ShmemInitHash("idempotency stats hash",
									idem_stats_max_entries,
									idem_stats_max_entries,
									&info,
									HASH_ELEM | HASH_FUNCTION);

	LWLockRelease(AddinShmemInitLock);

	if (!IsUnderPostmaster)
		on_shmem_exit(idem_stats_shmem_shutdown, (Datum) 0);

	/* only the postmaster loads, before any backend exists */
	if (!found)
		idem_stats_load();
}

/* A name as a key keeps it (see IDEM_STATS_NAME_KEPT), into zeroed "dst". */
static void
idem_stats_key_name(char *dst, const char *name)
{
	int			len = strlen(name);
	int			cut;

	StaticAssertStmt(IDEM_STATS_NAME_KEPT + 1 + 16 < IDEM_STATS_NAME_LEN,
					 "a long name's form must fit a key");
	if (len <= IDEM_STATS_NAME_KEPT)
	{
		memcpy(dst, name, len);
		return;
	}
	cut = pg_mbcliplen(name, len, IDEM_STATS_NAME_KEPT);
	memcpy(dst, name, cut);
	snprintf(dst + cut, IDEM_STATS_NAME_LEN - cut, "~%016llx",
			 (unsigned long long) hash_bytes_extended((const unsigned char *) name,
													  len, 0));
}

/*
 * idem_stats_make_key
 *		Build a zero-padded hash key (keys are compared with memcmp), long
 *		names in their short form.
 */
static void
idem_stats_make_key(IdemStatsKey *key, Oid dbid, const char *tenant,
					const char *scope)
{
	memset(key, 0, sizeof(IdemStatsKey));
	key->dbid = dbid;
	idem_stats_key_name(key->tenant, tenant);
	idem_stats_key_name(key->scope, scope);
}

/*
 * idem_stats_key_hash
 *		Hash of the names and the database, not of the zero padding: for
 *		short names that is a tenth of the bytes HASH_BLOBS would hash, and
 *		a new pair's count hashes its key once per eviction candidate too.
 */
static uint32
idem_stats_key_hash(const void *key, Size keysize pg_attribute_unused())
{
	const IdemStatsKey *k = (const IdemStatsKey *) key;
	uint32		h;

	h = hash_bytes((const unsigned char *) k->tenant,
				   strnlen(k->tenant, IDEM_STATS_NAME_LEN));
	h = hash_combine(h, hash_bytes((const unsigned char *) k->scope,
								   strnlen(k->scope, IDEM_STATS_NAME_LEN)));
	return hash_combine(h, hash_bytes_uint32(k->dbid));
}

/*
 * Does this counter count a request?  Only those make an entry "used", and
 * only those may evict another entry to make room for a new pair.
 */
static inline bool
idem_stats_is_request(IdemCounter counter)
{
	return counter != IDEM_STAT_REAPED && counter != IDEM_STAT_SWEPT;
}

/* How many entries one eviction removes from a table of "nentries". */
static int
idem_stats_victim_count(long nentries)
{
	long		n = Max(USAGE_DEALLOC_MIN,
						nentries * USAGE_DEALLOC_PERCENT / 100);

	return (int) Min(n, nentries);
}

/*
 * The victims of an eviction are kept in a max-heap on usage: its root is
 * the most used of the least used entries seen so far, the one to replace
 * when a less used entry turns up.
 */
static void
idem_stats_victim_sift_down(IdemStatsEntry **heap, int n, int i)
{
	for (;;)
	{
		int			largest = i;
		int			left = 2 * i + 1;
		int			right = left + 1;
		IdemStatsEntry *tmp;

		if (left < n && heap[left]->usage > heap[largest]->usage)
			largest = left;
		if (right < n && heap[right]->usage > heap[largest]->usage)
			largest = right;
		if (largest == i)
			return;
		tmp = heap[i];
		heap[i] = heap[largest];
		heap[largest] = tmp;
		i = largest;
	}
}

static void
idem_stats_victim_sift_up(IdemStatsEntry **heap, int i)
{
	while (i > 0)
	{
		int			parent = (i - 1) / 2;
		IdemStatsEntry *tmp;

		if (heap[parent]->usage >= heap[i]->usage)
			return;
		tmp = heap[i];
		heap[i] = heap[parent];
		heap[parent] = tmp;
		i = parent;
	}
}

/*
 * idem_stats_evict
 *		Make room in a full table, like pg_stat_statements' entry_dealloc:
 *		bring every entry's usage up to date (plus the requests it counted
 *		since the last eviction, then decayed), and remove the least used
 *		USAGE_DEALLOC_PERCENT of the entries, adding their counters to the
 *		overflow row so that no count is lost.  One pass over the table
 *		with a heap of the victims: O(n log k), paid once per k inserts.
 *		Caller holds the lock exclusively.  Returns false only when the
 *		victims' array cannot be allocated (nothing is evicted then); never
 *		raises.
 */
static bool
idem_stats_evict(void)
{
	HASH_SEQ_STATUS hash_seq;
	IdemStatsEntry *entry;
	long		nentries;
	int			nvictims;
	int			nheap = 0;
	int			i;
	int			c;
	uint64		folded[IDEM_STAT_NCOUNTERS];

	if (idem_stats_victims == NULL)
	{
		Size		size = sizeof(IdemStatsEntry *) *
			idem_stats_victim_count(idem_stats_max_entries);

		idem_stats_victims = (IdemStatsEntry **)
			MemoryContextAllocExtended(TopMemoryContext, size,
									   MCXT_ALLOC_NO_OOM);
		if (idem_stats_victims == NULL)
			return false;
	}

	nentries = Min(hash_get_num_entries(idem_stats_hash),
				   idem_stats_max_entries);
	nvictims = idem_stats_victim_count(nentries);

	hash_seq_init(&hash_seq, idem_stats_hash);
	while ((entry = hash_seq_search(&hash_seq)) != NULL)
	{
		uint64		calls = pg_atomic_read_u64(&entry->calls);

		/* no one else holds the lock: plain reads and writes suffice */
		if (calls > 0)
		{
			entry->usage += (double) calls;
			pg_atomic_write_u64(&entry->calls, 0);
		}
		entry->usage *= USAGE_DECAY_FACTOR;

		if (nheap < nvictims)
		{
			idem_stats_victims[nheap] = entry;
			idem_stats_victim_sift_up(idem_stats_victims, nheap);
			nheap++;
		}
		else if (nvictims > 0 && entry->usage < idem_stats_victims[0]->usage)
		{
			idem_stats_victims[0] = entry;
			idem_stats_victim_sift_down(idem_stats_victims, nheap, 0);
		}
	}

	memset(folded, 0, sizeof(folded));
	for (i = 0; i < nheap; i++)
	{
		entry = idem_stats_victims[i];
		for (c = 0; c < IDEM_STAT_NCOUNTERS; c++)
			folded[c] += pg_atomic_read_u64(&entry->counters[c]);
		hash_search(idem_stats_hash, &entry->key, HASH_REMOVE, NULL);
	}
	for (c = 0; c < IDEM_STAT_NCOUNTERS; c++)
		pg_atomic_fetch_add_u64(&idem_stats_state->other[c], folded[c]);
	return true;
}

/*
 * idem_stats_enter
 *		Find or insert the entry for "key".  Caller holds the lock
 *		exclusively.  A full table makes room by evicting when "may_evict";
 *		NULL when there is no room (the caller counts under "(other)").
 */
static IdemStatsEntry *
idem_stats_enter(const IdemStatsKey *key, uint32 hashcode, bool may_evict)
{
	IdemStatsEntry *entry;
	bool		found;

	entry = hash_search_with_hash_value(idem_stats_hash, key, hashcode,
										HASH_FIND, NULL);
	if (entry != NULL)
		return entry;

	if (hash_get_num_entries(idem_stats_hash) >= idem_stats_max_entries &&
		(!may_evict || !idem_stats_evict()))
		return NULL;

	/* HASH_ENTER_NULL: running out of shared memory must not raise */
	entry = hash_search_with_hash_value(idem_stats_hash, key, hashcode,
										HASH_ENTER_NULL, &found);
	if (entry != NULL && !found)
	{
		int			c;

		entry->usage = USAGE_INIT;
		pg_atomic_init_u64(&entry->calls, 0);
		for (c = 0; c < IDEM_STAT_NCOUNTERS; c++)
			pg_atomic_init_u64(&entry->counters[c], 0);
	}
	return entry;
}

/*
 * idem_stats_count
 *		Add "n" to one counter of (tenant, scope).  Takes the stats lock in
 *		shared mode; in exclusive mode only to insert an entry for a request
 *		count of a new pair (evicting, amortised, when the table is full).
 *		Counts that get no entry go to "(other)" under the shared lock.
 *		Never raises: a no-op without shared memory or with NULL names.
 */
void
idem_stats_count(const char *tenant, const char *scope,
				 IdemCounter counter, int64 n)
{
	IdemStatsKey key;
	uint32		hashcode;
	IdemStatsEntry *entry;
	bool		request;

	if (idem_stats_state == NULL || idem_stats_hash == NULL ||
		tenant == NULL || scope == NULL ||
		counter < 0 || counter >= IDEM_STAT_NCOUNTERS || n == 0)
		return;

	request = idem_stats_is_request(counter);
	idem_stats_make_key(&key, MyDatabaseId, tenant, scope);
	hashcode = get_hash_value(idem_stats_hash, &key);

	LWLockAcquire(idem_stats_state->lock, LW_SHARED);
	entry = hash_search_with_hash_value(idem_stats_hash, &key, hashcode,
										HASH_FIND, NULL);
	if (entry != NULL)
	{
		pg_atomic_fetch_add_u64(&entry->counters[counter], (uint64) n);
		if (request)
			pg_atomic_fetch_add_u64(&entry->calls, 1);
		LWLockRelease(idem_stats_state->lock);
		return;
	}
	if (!request &&
		hash_get_num_entries(idem_stats_hash) >= idem_stats_max_entries)
	{
		/* the reaper's and sweeper's counts never evict */
		pg_atomic_fetch_add_u64(&idem_stats_state->other[counter], (uint64) n);
		LWLockRelease(idem_stats_state->lock);
		return;
	}
	LWLockRelease(idem_stats_state->lock);

	LWLockAcquire(idem_stats_state->lock, LW_EXCLUSIVE);
	entry = idem_stats_enter(&key, hashcode, request);
	if (entry != NULL)
	{
		pg_atomic_fetch_add_u64(&entry->counters[counter], (uint64) n);
		if (request)
			pg_atomic_fetch_add_u64(&entry->calls, 1);
	}
	else
		pg_atomic_fetch_add_u64(&idem_stats_state->other[counter], (uint64) n);
	LWLockRelease(idem_stats_state->lock);
}

/*
 * idem_stats_object_access
 *		object_access_hook: note a DROP DATABASE.  The hook runs before
 *		dropdb's last checks (connected users, template), which may still
 *		fail, so the entries are only removed once the drop commits.
 */
static void
idem_stats_object_access(ObjectAccessType access, Oid classId, Oid objectId,
						 int subId, void *arg)
{
	if (prev_object_access_hook)
		prev_object_access_hook(access, classId, objectId, subId, arg);

	if (access != OAT_DROP || classId != DatabaseRelationId ||
		idem_stats_hash == NULL)
		return;

	if (!idem_stats_xact_callback_registered)
	{
		RegisterXactCallback(idem_stats_xact_callback, NULL);
		idem_stats_xact_callback_registered = true;
	}
	idem_stats_dropped_db = objectId;
}

/*
 * idem_stats_xact_callback
 *		Remove the entries of a database whose DROP DATABASE just committed;
 *		forget it if the drop failed.
 */
static void
idem_stats_xact_callback(XactEvent event, void *arg pg_attribute_unused())
{
	Oid			dbid = idem_stats_dropped_db;

	if (!OidIsValid(dbid))
		return;

	switch (event)
	{
		case XACT_EVENT_COMMIT:
			idem_stats_dropped_db = InvalidOid;
			idem_stats_forget_database(dbid);
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			idem_stats_dropped_db = InvalidOid;
			break;
		default:
			break;
	}
}

/*
 * idem_stats_remove_database
 *		Remove every entry of "dbid".  Caller holds the lock exclusively.
 */
static void
idem_stats_remove_database(Oid dbid)
{
	HASH_SEQ_STATUS hash_seq;
	IdemStatsEntry *entry;

	hash_seq_init(&hash_seq, idem_stats_hash);
	while ((entry = hash_seq_search(&hash_seq)) != NULL)
	{
		if (entry->key.dbid == dbid)
			hash_search(idem_stats_hash, &entry->key, HASH_REMOVE, NULL);
	}
}

/*
 * idem_stats_forget_database
 *		Remove every entry of a dropped database, under the lock in
 *		exclusive mode.  Never raises (it runs after commit).
 */
static void
idem_stats_forget_database(Oid dbid)
{
	LWLockAcquire(idem_stats_state->lock, LW_EXCLUSIVE);
	idem_stats_remove_database(dbid);
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
 *		left by an unclean stop is removed unread.  Runs in the postmaster
 *		at start-up; a missing file is normal, a damaged one is logged and
 *		ignored.  Reads version 1 files (without usage) too.  A file with
 *		more pairs than now fit (stats_max_entries was lowered) evicts the
 *		least used of them into "(other)".
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
		header[1] < 1 || header[1] > IDEM_STATS_FILE_VERSION ||
		header[2] < 1 || header[2] > IDEM_STAT_NCOUNTERS ||
		(header[1] == IDEM_STATS_FILE_VERSION &&
		 header[2] != IDEM_STAT_NCOUNTERS) ||
		fread(&nentries, sizeof(nentries), 1, file) != 1)
		goto bad_file;

	for (i = 0; i < nentries; i++)
	{
		IdemStatsFileEntry saved;
		IdemStatsKey key;
		IdemStatsEntry *entry;
		size_t		counters_size = header[2] * sizeof(uint64);
		int			c;

		memset(&saved, 0, sizeof(saved));
		if (header[1] == 1)
		{
			IdemStatsFileEntryV1 v1;

			if (fread(&v1, offsetof(IdemStatsFileEntryV1, counters), 1,
					  file) != 1)
				goto bad_file;
			saved.key = v1.key;
			saved.usage = USAGE_INIT;
		}
		else if (fread(&saved, offsetof(IdemStatsFileEntry, counters), 1,
					   file) != 1)
			goto bad_file;
		if (fread(saved.counters, counters_size, 1, file) != 1)
			goto bad_file;
		/* never trust the file's strings to be terminated, nor padded */
		saved.key.tenant[IDEM_STATS_NAME_LEN - 1] = '\0';
		saved.key.scope[IDEM_STATS_NAME_LEN - 1] = '\0';
		key = saved.key;
		memset(&saved.key, 0, sizeof(IdemStatsKey));
		if (header[1] < 4 && (strlen(key.tenant) > IDEM_STATS_NAME_KEPT ||
							  strlen(key.scope) > IDEM_STATS_NAME_KEPT))
		{
			/*
			 * A long name an older version cut at 127 bytes: the whole name
			 * its short form hashes is lost (and the postmaster does not know
			 * the database's encoding to cut it again), so its counts go to
			 * "(other)" (an invalid database, below).
			 */
		}
		else
		{
			/* the names as saved: already keys (short forms included) */
			saved.key.dbid = key.dbid;
			memcpy(saved.key.tenant, key.tenant, strlen(key.tenant));
			memcpy(saved.key.scope, key.scope, strlen(key.scope));
		}

		if (!OidIsValid(saved.key.dbid))
		{
			for (c = 0; c < IDEM_STAT_NCOUNTERS; c++)
				pg_atomic_fetch_add_u64(&idem_stats_state->other[c],
										saved.counters[c]);
			continue;
		}

		entry = idem_stats_enter(&saved.key,
								 get_hash_value(idem_stats_hash, &saved.key),
								 true);
		if (entry == NULL)
		{
			for (c = 0; c < IDEM_STAT_NCOUNTERS; c++)
				pg_atomic_fetch_add_u64(&idem_stats_state->other[c],
										saved.counters[c]);
			continue;
		}
		for (c = 0; c < IDEM_STAT_NCOUNTERS; c++)
			pg_atomic_fetch_add_u64(&entry->counters[c], saved.counters[c]);
		entry->usage = saved.usage;
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
 *		crash half-way never leaves a torn file behind.  The overflow row
 *		goes first, as an entry of database InvalidOid.
 */
static void
idem_stats_shmem_shutdown(int code, Datum arg pg_attribute_unused())
{
	FILE	   *file;
	uint32		header[3];
	int64		nentries;
	HASH_SEQ_STATUS hash_seq;
	IdemStatsEntry *entry;
	IdemStatsFileEntry saved;
	int			c;
	const char *tmpfile = IDEM_STATS_FILE ".tmp";

	if (code != 0 || idem_stats_state == NULL || idem_stats_hash == NULL)
		return;

	file = AllocateFile(tmpfile, PG_BINARY_W);
	if (file == NULL)
		goto error;

	header[0] = IDEM_STATS_FILE_MAGIC;
	header[1] = IDEM_STATS_FILE_VERSION;
	header[2] = IDEM_STAT_NCOUNTERS;
	nentries = hash_get_num_entries(idem_stats_hash) + 1;
	if (fwrite(header, sizeof(header), 1, file) != 1 ||
		fwrite(&nentries, sizeof(nentries), 1, file) != 1)
		goto error;

	/* no uninitialised padding in the file */
	memset(&saved, 0, sizeof(saved));
	idem_stats_make_key(&saved.key, InvalidOid,
						IDEM_STATS_OTHER, IDEM_STATS_OTHER);
	for (c = 0; c < IDEM_STAT_NCOUNTERS; c++)
		saved.counters[c] = pg_atomic_read_u64(&idem_stats_state->other[c]);
	if (fwrite(&saved, sizeof(saved), 1, file) != 1)
		goto error;

	hash_seq_init(&hash_seq, idem_stats_hash);
	while ((entry = hash_seq_search(&hash_seq)) != NULL)
	{
		memset(&saved, 0, sizeof(saved));
		memcpy(&saved.key, &entry->key, sizeof(IdemStatsKey));
		/* requests not yet folded into usage count as they would have */
		saved.usage = entry->usage +
			(double) pg_atomic_read_u64(&entry->calls);
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
 * Append one row of the stats view: the names, then the counters.  Returns
 * the sum of the counters.
 */
static uint64
idem_stats_put_row(Tuplestorestate *tupstore, TupleDesc tupdesc,
				   const char *tenant, const char *scope,
				   pg_atomic_uint64 *counters, pg_atomic_uint64 *more,
				   bool skip_if_zero)
{
	Datum		values[2 + IDEM_STAT_NCOUNTERS];
	bool		nulls[2 + IDEM_STAT_NCOUNTERS];
	uint64		total = 0;
	int			ncounters;
	int			c;

	/*
	 * A database still at version 1.0 (before ALTER EXTENSION UPDATE)
	 * declares the counters of its time, which are a prefix of today's.
	 */
	ncounters = Min(tupdesc->natts - 2, IDEM_STAT_NCOUNTERS);
	memset(nulls, 0, sizeof(nulls));
	for (c = 0; c < ncounters; c++)
	{
		uint64		v = pg_atomic_read_u64(&counters[c]);

		if (more != NULL)
			v += pg_atomic_read_u64(&more[c]);
		total += v;
		values[2 + c] = Int64GetDatum((int64) v);
	}
	if (total == 0 && skip_if_zero)
		return 0;

	values[0] = CStringGetTextDatum(tenant);
	values[1] = CStringGetTextDatum(scope);
	tuplestore_putvalues(tupstore, tupdesc, values, nulls);
	return total;
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
	HASH_SEQ_STATUS hash_seq;
	IdemStatsEntry *entry;
	IdemStatsEntry *named_other = NULL;
	const char *bound;
	IdemStatsKey bound_key;

	idem_stats_require_shmem();

	/*
	 * A role bound to a tenant sees that tenant's rows only: those keyed by
	 * its name, or by its short form if it is long.
	 */
	bound = idem_bound_tenant();
	if (bound != NULL)
		idem_stats_make_key(&bound_key, MyDatabaseId, bound, "");
	InitMaterializedSRF(fcinfo, 0);
	tupstore = rsinfo->setResult;
	tupdesc = rsinfo->setDesc;

	LWLockAcquire(idem_stats_state->lock, LW_SHARED);
	hash_seq_init(&hash_seq, idem_stats_hash);
	while ((entry = hash_seq_search(&hash_seq)) != NULL)
	{
		/* other databases' tenants are none of this database's business */
		if (entry->key.dbid != MyDatabaseId)
			continue;
		if (bound != NULL && strcmp(entry->key.tenant, bound_key.tenant) != 0)
			continue;

		/*
		 * A tenant and scope an application named "(other)" count into the
		 * overflow row, which has their name: two rows with the same labels
		 * would be one pair to a reader, and break an exporter that keys its
		 * series by them.
		 */
		if (bound == NULL &&
			strcmp(entry->key.tenant, IDEM_STATS_OTHER) == 0 &&
			strcmp(entry->key.scope, IDEM_STATS_OTHER) == 0)
		{
			named_other = entry;
			continue;
		}
		(void) idem_stats_put_row(tupstore, tupdesc, entry->key.tenant,
								  entry->key.scope, entry->counters, NULL,
								  false);
	}
	if (bound == NULL)
		(void) idem_stats_put_row(tupstore, tupdesc, IDEM_STATS_OTHER,
								  IDEM_STATS_OTHER, idem_stats_state->other,
								  named_other != NULL ?
								  named_other->counters : NULL,
								  named_other == NULL);
	LWLockRelease(idem_stats_state->lock);

	return (Datum) 0;
}

/*
 * idem_stats_reset
 *		SQL: idem_stats_reset() RETURNS void.  Drops every (tenant, scope)
 *		entry of this database and zeroes the overflow row (which all
 *		databases share), under the stats lock in exclusive mode.  Admin
 *		only (EXECUTE revoked from PUBLIC).
 */
Datum
idem_stats_reset(PG_FUNCTION_ARGS)
{
	int			c;

	idem_stats_require_shmem();

	LWLockAcquire(idem_stats_state->lock, LW_EXCLUSIVE);
	idem_stats_remove_database(MyDatabaseId);
	for (c = 0; c < IDEM_STAT_NCOUNTERS; c++)
		pg_atomic_write_u64(&idem_stats_state->other[c], 0);
	LWLockRelease(idem_stats_state->lock);

	PG_RETURN_VOID();
}
