/*-------------------------------------------------------------------------
 *
 * ratelimit.c
 *	  Rates and quotas of new keys per tenant, in shared memory: a scope
 *	  that sets new_keys_per_second answers "rate_limited" to a tenant that
 *	  creates keys faster than that, and one that sets max_live_keys to a
 *	  tenant that holds that many unexpired keys, without writing anything.
 *
 * Each (database, tenant, scope) has one 64-bit word, the "theoretical
 * arrival time" of the generic cell rate algorithm (GCRA, a token bucket
 * in one number): a new key at time "now" is admitted when
 *
 *	  max(tat, now) - now <= (burst - 1) * interval
 *
 * and moves tat to max(tat, now) + interval, where interval is one second
 * divided by the rate.  Admission is a compare-and-swap on that word under
 * the table's lock in shared mode, so tenants never wait on each other;
 * only the first key of a pair takes the lock in exclusive mode, to add
 * its entry.  The table holds RATE_MAX_ENTRIES pairs; when it is full it
 * is emptied (every pair starts again with a full burst), which only ever
 * lets a little more through, never less.
 *
 * A quota keeps, in the same entry, the pair's live keys as last counted
 * plus the keys admitted since.  Below the quota a new key costs one atomic
 * add.  At the quota the caller counts again (a query over the pair's keys,
 * which sees the keys that expired or were released since), at most once a
 * second per pair; between counts the answer is rate_limited, with
 * retry_after until the earliest of the pair's keys expires.  The keys
 * admitted while a count runs are added to it (its snapshot cannot see
 * them), so a tenant can go over its quota only by the keys in flight when
 * a count starts (one per other connection), however slow the count, and
 * a sprayer at its quota costs one count a second.
 *
 * A new entry (after a restart, or once the full table was emptied) knows
 * nothing of the pair's keys, so its first new key must count them whatever
 * the quota.  One backend claims that count, as at the quota (the same
 * compare-and-swap on recount_at); the pair's other new keys wait for it on
 * a condition variable rather than each count the same keys (a big tenant's
 * count takes a while, and a burst of its requests would run as many at
 * once), then take their key from it as usual.  They wait a few
 * milliseconds at a time, without the lock, finding the entry again each
 * time (it may have been emptied meanwhile).  A count that never lands (its
 * backend failed or was canceled) holds its claim until recount_at, after
 * which the next waiter claims the count itself: nobody waits longer than
 * about a second and one count.
 *
 * The state is soft: it is lost at a restart.  It needs the library in
 * shared_preload_libraries; a scope that sets a rate without it is an
 * error (55000) rather than a limit silently not applied.
 *
 * IDENTIFICATION
 *	  ratelimit.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/hashfn.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/condition_variable.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "idempotency.h"

#define RATE_MAX_ENTRIES 8192

typedef struct RateKey
{
	Oid			dbid;
	uint64		pair;			/* hash of tenant and scope */
} RateKey;

/* an entry's live count before the first count of its keys */
#define LIVE_UNKNOWN PG_INT64_MAX

/* no more than one count of a pair's keys per RECOUNT_INTERVAL */
#define RECOUNT_INTERVAL USECS_PER_SEC

typedef struct RateEntry
{
	RateKey		key;			/* hash key: must be first */
	pg_atomic_uint64 tat;		/* theoretical arrival time, microseconds */
	pg_atomic_uint64 rate;		/* a hash of the interval and burst tat was
								 * set under (idem_rate_admit), or 0 */
	pg_atomic_uint64 live;		/* live keys: last count + admitted since */
	pg_atomic_uint64 recount_at;	/* no count before (claimed until),
									 * microseconds */
	pg_atomic_uint64 expiry;	/* earliest expiry at the last count, or 0 */
	pg_atomic_uint64 admitted;	/* keys admitted under the quota, ever */
} RateEntry;

/* a new key of a pair whose count runs waits this long at a time */
#define COUNT_WAIT_MS 10

typedef struct RateShared
{
	LWLock	   *lock;
	ConditionVariable counted;	/* a count of some pair's keys landed */
} RateShared;

static RateShared *rate_state = NULL;
static HTAB *rate_hash = NULL;
static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static void
rate_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(add_size(MAXALIGN(sizeof(RateShared)),
									hash_estimate_size(RATE_MAX_ENTRIES,
													   sizeof(RateEntry))));
	RequestNamedLWLockTranche("idempotency rate limits", 1);
}

static void
rate_shmem_startup(void)
{
	bool		found;
	HASHCTL		info;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	rate_state = ShmemInitStruct("idempotency rate limits",
								 sizeof(RateShared), &found);
	if (!found)
	{
		rate_state->lock =
			&(GetNamedLWLockTranche("idempotency rate limits"))->lock;
		ConditionVariableInit(&rate_state->counted);
	}
	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(RateKey);
	info.entrysize = sizeof(RateEntry);
	rate_hash = ShmemInitHash("idempotency rate limits hash",
							  RATE_MAX_ENTRIES, RATE_MAX_ENTRIES, &info,
							  HASH_ELEM | HASH_BLOBS);
	LWLockRelease(AddinShmemInitLock);
}

/*
 * idem_rate_init
 *		Called from _PG_init: shared memory exists only when the library is
 *		preloaded.
 */
void
idem_rate_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = rate_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = rate_shmem_startup;
}

/* One GCRA step on "entry"; true when admitted, else *wait_us is set. */
static bool
rate_step(RateEntry *entry, int64 now, int64 interval, int64 tolerance,
		  int64 *wait_us)
{
	uint64		old = pg_atomic_read_u64(&entry->tat);

	for (;;)
	{
		int64		tat = Max((int64) old, now);

		if (tat - now > tolerance)
		{
			*wait_us = tat - now - tolerance;
			return false;
		}
		if (pg_atomic_compare_exchange_u64(&entry->tat, &old,
										   (uint64) (tat + interval)))
			return true;
		/* "old" now holds the value another backend wrote: try again */
	}
}

/*
 * The entry of (tenant, scope) in this database, created when missing, with
 * the table's lock held (in shared mode, or exclusive when it created the
 * entry): the caller releases it.  Raises 55000 when the library was not
 * preloaded, naming "option" as what needs it.
 */
static RateEntry *
rate_entry_locked(const char *tenant, const char *scope, const char *option)
{
	RateKey		key;
	RateEntry  *entry;
	uint32		hashcode;
	bool		found;

	if (rate_state == NULL || rate_hash == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("scope \"%s\" limits new keys, which needs idempotency in shared_preload_libraries",
						scope),
				 errdetail("The scope sets %s; a rate and a quota both need it.",
						   option),
				 errhint("Add idempotency to shared_preload_libraries and restart, or lift both limits: SELECT idem_configure_scope(%s, '{\"new_keys_per_second\": null, \"max_live_keys\": null}');",
						 quote_literal_cstr(scope))));

	memset(&key, 0, sizeof(key));
	key.dbid = MyDatabaseId;
	key.pair = hash_combine64(hash_bytes_extended((const unsigned char *) tenant,
												  strlen(tenant), 0),
							  hash_bytes_extended((const unsigned char *) scope,
												  strlen(scope), 1));
	hashcode = get_hash_value(rate_hash, &key);

	LWLockAcquire(rate_state->lock, LW_SHARED);
	entry = hash_search_with_hash_value(rate_hash, &key, hashcode,
										HASH_FIND, NULL);
	if (entry != NULL)
		return entry;

	LWLockRelease(rate_state->lock);
	LWLockAcquire(rate_state->lock, LW_EXCLUSIVE);
	entry = hash_search_with_hash_value(rate_hash, &key, hashcode,
										HASH_FIND, NULL);
	if (entry == NULL &&
		hash_get_num_entries(rate_hash) >= RATE_MAX_ENTRIES)
	{
		/*
		 * Full: start every pair over rather than refuse to track or take
		 * shared memory that was sized for others.
		 */
		HASH_SEQ_STATUS status;
		RateEntry  *e;

		hash_seq_init(&status, rate_hash);
		while ((e = hash_seq_search(&status)) != NULL)
			(void) hash_search(rate_hash, &e->key, HASH_REMOVE, NULL);
	}
	entry = hash_search_with_hash_value(rate_hash, &key, hashcode,
										HASH_ENTER, &found);
	if (!found)
	{
		pg_atomic_init_u64(&entry->tat, 0);
		pg_atomic_init_u64(&entry->rate, 0);
		pg_atomic_init_u64(&entry->live, (uint64) LIVE_UNKNOWN);
		pg_atomic_init_u64(&entry->recount_at, 0);
		pg_atomic_init_u64(&entry->expiry, 0);
		pg_atomic_init_u64(&entry->admitted, 0);
	}
	return entry;
}

/* Whole seconds from "wait_us" microseconds, from 1 to a day. */
static int
rate_seconds(int64 wait_us)
{
	int64		secs = (wait_us + USECS_PER_SEC - 1) / USECS_PER_SEC;

	return (int) Max(1, Min(secs, (int64) 86400));
}

/*
 * The GCRA parameters of a rate: the interval between keys and the
 * tolerance a burst gives, in microseconds; returns the signature an entry
 * records of them.  idem_configure_scope keeps the rate from 0.000001 (an
 * interval of 10^12 us) and the burst to 10^6, so the tolerance stays far
 * below int64's range; a row written by hand is clamped the same way.
 */
static uint64
rate_params(double per_second, int burst, int64 *interval, int64 *tolerance)
{
	*interval = (int64) (USECS_PER_SEC / Max(per_second, 0.000001));
	if (*interval < 1)
		*interval = 1;
	*tolerance = *interval * (int64) (Min(Max(burst, 1), 1000000) - 1);
	return hash_combine64((uint64) *interval, (uint64) *tolerance) | 1;
}

/*
 * idem_rate_admit
 *		Admit one new key of (tenant, scope) at "per_second" keys a second
 *		with bursts of "burst", or return false and set *retry_after_s
 *		(whole seconds, at least 1).  Raises 55000 when the library was not
 *		preloaded.
 */
bool
idem_rate_admit(const char *tenant, const char *scope, double per_second,
				int burst, int *retry_after_s)
{
	RateEntry  *entry;
	int64		now = (int64) GetCurrentTimestamp();
	int64		interval;
	int64		tolerance;
	int64		wait_us = 0;
	uint64		signature;
	bool		admitted;

	signature = rate_params(per_second, burst, &interval, &tolerance);
	entry = rate_entry_locked(tenant, scope, "new_keys_per_second");

	/*
	 * tat was set under the scope's rate and burst as they were: after
	 * idem_configure_scope changed either, the pair starts over with a full
	 * burst under the new ones (as when the table is emptied), so that a
	 * raised rate lifts a limit in force at once, instead of the tenant
	 * waiting out what it owed under the old rate.  Backends that still hold
	 * the old policy (until their next command) may reset it again: at most a
	 * few bursts more, never fewer keys.
	 */
	if (pg_atomic_read_u64(&entry->rate) != signature)
	{
		if (pg_atomic_exchange_u64(&entry->rate, signature) != 0)
			pg_atomic_write_u64(&entry->tat, 0);
	}
	admitted = rate_step(entry, now, interval, tolerance, &wait_us);
	LWLockRelease(rate_state->lock);

	if (!admitted)
		*retry_after_s = rate_seconds(wait_us);
	return admitted;
}

/*
 * idem_rate_refund
 *		Give back the key idem_rate_admit admitted under the same rate and
 *		burst, when the key is not made after all (the quota refused it):
 *		a refusal uses none of the tenant's rate.  Nothing when the pair
 *		started over under another policy meanwhile.
 */
void
idem_rate_refund(const char *tenant, const char *scope, double per_second,
				 int burst)
{
	RateEntry  *entry;
	int64		interval;
	int64		tolerance;
	uint64		signature;
	uint64		old;

	signature = rate_params(per_second, burst, &interval, &tolerance);
	entry = rate_entry_locked(tenant, scope, "new_keys_per_second");
	if (pg_atomic_read_u64(&entry->rate) == signature)
	{
		old = pg_atomic_read_u64(&entry->tat);
		while (!pg_atomic_compare_exchange_u64(&entry->tat, &old,
											   old > (uint64) interval ?
											   old - (uint64) interval : 0))
			;
	}
	LWLockRelease(rate_state->lock);
}

/* retry_after for a pair at its quota: until its earliest key expires */
static int
quota_retry_after(RateEntry *entry, int64 now)
{
	int64		expiry = (int64) pg_atomic_read_u64(&entry->expiry);

	return expiry > now ? rate_seconds(expiry - now) : 1;
}

/*
 * Claim the next count of the pair's keys for this backend: true at most
 * once per RECOUNT_INTERVAL, however many backends ask at once.
 */
static bool
quota_claim_count(RateEntry *entry, int64 now)
{
	uint64		recount_at = pg_atomic_read_u64(&entry->recount_at);

	return now >= (int64) recount_at &&
		pg_atomic_compare_exchange_u64(&entry->recount_at, &recount_at,
									   (uint64) (now + RECOUNT_INTERVAL));
}

/*
 * Take one key from the room left under "max_live"; when none is left,
 * the answer is QUOTA_RECOUNT if this backend may count now (it claims the
 * count), else QUOTA_FULL.
 */
static IdemQuota
quota_take(RateEntry *entry, int64 max_live, int64 now, int *retry_after_s)
{
	/* admitted first, then live: see idem_quota_recounted */
	(void) pg_atomic_fetch_add_u64(&entry->admitted, 1);
	if ((int64) pg_atomic_fetch_add_u64(&entry->live, 1) < max_live)
		return IDEM_QUOTA_ADMITTED;
	(void) pg_atomic_fetch_sub_u64(&entry->live, 1);
	(void) pg_atomic_fetch_sub_u64(&entry->admitted, 1);

	if (quota_claim_count(entry, now))
		return IDEM_QUOTA_RECOUNT;
	*retry_after_s = quota_retry_after(entry, now);
	return IDEM_QUOTA_FULL;
}

/* What a new key waiting for its pair's count shows in pg_stat_activity */
static uint32
quota_wait_event(void)
{
#if PG_VERSION_NUM >= 170000
	static uint32 wait_event = 0;

	if (wait_event == 0)
		wait_event = WaitEventExtensionNew("IdempotencyQuotaCount");
	return wait_event;
#else
	return PG_WAIT_EXTENSION;
#endif
}

/*
 * idem_quota_admit
 *		Admit one new key of (tenant, scope) under a quota of "max_live"
 *		live keys: IDEM_QUOTA_ADMITTED, IDEM_QUOTA_FULL (with
 *		*retry_after_s set), or IDEM_QUOTA_RECOUNT: the caller counts the
 *		pair's live keys and passes the count and the idem_quota_mark read
 *		just before it to idem_quota_recounted, which decides.  While the
 *		pair's live keys are unknown, one caller counts them and the others
 *		wait for its count (see the top of the file).  Raises 55000 when the
 *		library was not preloaded.
 */
IdemQuota
idem_quota_admit(const char *tenant, const char *scope, int64 max_live,
				 int *retry_after_s)
{
	IdemQuota	answer;
	bool		waited = false;

	for (;;)
	{
		RateEntry  *entry;
		int64		now = (int64) GetCurrentTimestamp();

		/* found again after each wait: the table may have been emptied */
		entry = rate_entry_locked(tenant, scope, "max_live_keys");
		if ((int64) pg_atomic_read_u64(&entry->live) != LIVE_UNKNOWN)
		{
			answer = quota_take(entry, max_live, now, retry_after_s);
			break;
		}

		/*
		 * Unknown: the first to come counts, and so does the next once that
		 * claim has passed (its count did not land).
		 */
		if (quota_claim_count(entry, now))
		{
			answer = IDEM_QUOTA_RECOUNT;
			break;
		}
		LWLockRelease(rate_state->lock);

		/*
		 * Another backend counts: wait for its idem_quota_recounted.  The
		 * first call only puts this backend on the wait list and returns, and
		 * the timeout covers a count that fails; interrupts are served.
		 */
		(void) ConditionVariableTimedSleep(&rate_state->counted,
										   COUNT_WAIT_MS,
										   quota_wait_event());
		waited = true;
	}
	LWLockRelease(rate_state->lock);
	if (waited)
		(void) ConditionVariableCancelSleep();
	return answer;
}

/*
 * idem_quota_mark
 *		How many keys (tenant, scope) has admitted so far: read just before
 *		the count that follows IDEM_QUOTA_RECOUNT, and passed to
 *		idem_quota_recounted.
 */
uint64
idem_quota_mark(const char *tenant, const char *scope)
{
	RateEntry  *entry;
	uint64		mark;

	entry = rate_entry_locked(tenant, scope, "max_live_keys");
	mark = pg_atomic_read_u64(&entry->admitted);
	LWLockRelease(rate_state->lock);
	return mark;
}

/*
 * idem_quota_recounted
 *		The pair has "live" live keys (counted after idem_quota_admit said
 *		IDEM_QUOTA_RECOUNT), the earliest of which expires at
 *		"earliest_expiry" (0 when unknown): remember both, and admit one
 *		new key if there is room (else false, with *retry_after_s set).
 */
bool
idem_quota_recounted(const char *tenant, const char *scope, int64 max_live,
					 int64 live, TimestampTz earliest_expiry, uint64 mark,
					 int *retry_after_s)
{
	RateEntry  *entry;
	int64		now = (int64) GetCurrentTimestamp();
	uint64		seen;
	bool		admitted;

	entry = rate_entry_locked(tenant, scope, "max_live_keys");
	pg_atomic_write_u64(&entry->expiry, (uint64) Max(earliest_expiry, 0));
	pg_atomic_write_u64(&entry->recount_at, (uint64) (now + RECOUNT_INTERVAL));

	/*
	 * The count cannot see the keys admitted while it ran (their transactions
	 * had not committed): add the admissions since "mark", so that a slow
	 * count does not hand their room out again.  A key admitted concurrently
	 * with this write adds to "admitted" before it adds to "live", so it is
	 * either in "seen" or makes the loop write again.  A key that committed
	 * before the count's snapshot is counted twice, which errs on the side of
	 * the quota until the next count.
	 */
	do
	{
		seen = pg_atomic_read_u64(&entry->admitted);
		pg_atomic_write_u64(&entry->live, (uint64) (live + (int64) (seen - mark)));
	} while (pg_atomic_read_u64(&entry->admitted) != seen);

	(void) pg_atomic_fetch_add_u64(&entry->admitted, 1);
	admitted = (int64) pg_atomic_fetch_add_u64(&entry->live, 1) < max_live;
	if (!admitted)
	{
		(void) pg_atomic_fetch_sub_u64(&entry->live, 1);
		(void) pg_atomic_fetch_sub_u64(&entry->admitted, 1);
		*retry_after_s = quota_retry_after(entry, now);
	}
	LWLockRelease(rate_state->lock);

	/* the new keys waiting for this count take theirs from it */
	ConditionVariableBroadcast(&rate_state->counted);
	return admitted;
}
