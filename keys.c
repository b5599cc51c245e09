/*-------------------------------------------------------------------------
 *
 * keys.c
 *	  The key lifecycle: idem_reserve, idem_complete, idem_checkpoint,
 *	  idem_release, idem_resolve and idem_lookup.
 *
 * A key is one row of idempotency.keys, identified by (tenant, scope, key).
 * idem_reserve decides in one step whether a request is new ("created"), a
 * retry of a finished one ("replay"), a concurrent duplicate
 * ("in_progress"), a misuse of the key ("mismatch") or the retry of an
 * attempt that vanished after committing its reservation ("stale").
 *
 * Locking: every function that writes a key first takes a heavyweight lock
 * on it in the extension's own advisory lock space (an advisory LOCKTAG
 * whose fourth field, IDEM_LOCKTAG_CLASS, no user advisory lock uses; the
 * first three carry the database and a 64-bit hash of tenant, scope and
 * key).  The lock is transaction-scoped.  idem_reserve asks for it without
 * waiting, so a duplicate that arrives while the first attempt's
 * transaction is still open is answered "in_progress" at once instead of
 * queueing on the primary key's unique index; with "wait" it polls for the
 * lock until the deadline.  The lock is given back early when the call
 * wrote nothing, so a duplicate answered from a committed row never blocks
 * the holder's later idem_complete.  idem_complete, idem_checkpoint,
 * idem_release and idem_resolve wait for the lock normally (deadlock
 * detection and lock_timeout apply).  A hash collision between two keys
 * can only make one of them answer "in_progress" spuriously.
 *
 * Every write is a saved SPI plan with parameters.  The one read every
 * call makes, the key's row by primary key, probes the index directly (see
 * keys_fetch): on a replay it is the whole cost of the call.  Under READ
 * COMMITTED each statement sees what has committed when it starts; under
 * REPEATABLE READ and SERIALIZABLE a key committed after the transaction's
 * snapshot cannot be replayed from it and the call raises a serialization
 * failure instead of answering from a stale view.
 *
 * Scope policies (idempotency.scopes) are cached per backend.  A statement
 * trigger on the table sends a relcache invalidation for it, which reaches
 * every backend; the callback registered here drops the cache.
 *
 * IDENTIFICATION
 *	  keys.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>
#include <math.h>

#include "access/detoast.h"
#include "access/genam.h"
#include "access/heapam.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/twophase.h"
#include "access/htup_details.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/index.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_class.h"
#include "catalog/pg_index.h"
#include "catalog/pg_enum.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "common/hashfn.h"
#include "common/int.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/relcache.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/typcache.h"
#include "utils/uuid.h"

#include "idempotency.h"

/* Fourth field of the advisory LOCKTAG; user advisory locks use 1 and 2. */
#define IDEM_LOCKTAG_CLASS	0x4944

/* Scopes at least this long are not cached (looked up on every call). */
#define SCOPE_CACHE_KEYLEN	128
/* The cache is dropped rather than grown past this many scopes. */
#define SCOPE_CACHE_MAX		1024

/* Retry-After bounds, in seconds, for "in_progress". */
#define RETRY_AFTER_MAX		60

/* Longest ttl and wait accepted. */
#define MAX_TTL_USECS	((int64) IDEM_MAX_INTERVAL_YEARS * MONTHS_PER_YEAR * DAYS_PER_MONTH * USECS_PER_DAY)
#define MAX_WAIT_USECS	((int64) USECS_PER_DAY)

/* Attempts before giving up when a conflicting row vanishes under us. */
#define RESERVE_ATTEMPTS	3

/* Outcomes, in the order of the idempotency.outcome enum. */
typedef enum ReserveOutcome
{
	OUTCOME_CREATED,
	OUTCOME_REPLAY,
	OUTCOME_IN_PROGRESS,
	OUTCOME_MISMATCH,
	OUTCOME_STALE,
	OUTCOME_RATE_LIMITED,		/* version 1.1 */
	OUTCOME_COUNT
} ReserveOutcome;

static const char *const outcome_labels[OUTCOME_COUNT] = {
	"created", "replay", "in_progress", "mismatch", "stale", "rate_limited"
};

/* Statuses, in the order of the idempotency.status enum. */
typedef enum KeyStatus
{
	STATUS_PROCESSING,
	STATUS_SUCCEEDED,
	STATUS_FAILED,
	STATUS_COUNT
} KeyStatus;

static const char *const status_labels[STATUS_COUNT] = {
	"processing", "succeeded", "failed"
};

/* A scope's policy, with "has_" flags where the GUC default applies. */
typedef struct ScopePolicy
{
	bool		has_ttl;
	Interval	ttl;
	bool		has_lock_timeout;
	Interval	lock_timeout;
	bool		cache_server_errors;
	bool		takeover;
	ArrayType  *ignore;			/* fingerprint_ignore, or NULL */
	uint64		retryable[8];	/* retryable_codes: bit (code - 100) */
	double		new_keys_per_second;	/* 0: no limit */
	int32		new_keys_burst;
	int64		max_live_keys;	/* 0: no quota */
} ScopePolicy;

#define RETRYABLE_BIT(code) ((uint64) 1 << (((code) - 100) % 64))
#define RETRYABLE_WORD(code) (((code) - 100) / 64)

typedef struct ScopeCacheEntry
{
	char		scope[SCOPE_CACHE_KEYLEN];	/* hash key */
	ScopePolicy policy;
} ScopeCacheEntry;

/* The identity of a key as SPI parameters $1, $2, $3, plus C strings. */
typedef struct KeyIdent
{
	Datum		values[3];		/* tenant, scope, key as text */
	char	   *tenant;
	char	   *scope;
	char	   *key;
} KeyIdent;

/* One row of idempotency.keys as the hot path reads it. */
typedef struct KeyRow
{
	bytea	   *fingerprint;
	Oid			status;
	bool		has_token;
	pg_uuid_t	token;
	bool		has_locked_at;
	TimestampTz locked_at;
	bool		has_recovery_point;
	Datum		recovery_point;
	bool		has_response_code;
	int32		response_code;
	bool		has_body;
	Datum		body;
	bool		has_headers;
	Datum		headers;
	bool		needs_reconciliation;
	TimestampTz expires_at;
} KeyRow;

/* What idem_reserve answers, before it becomes a reservation tuple. */
typedef struct ReserveAnswer
{
	ReserveOutcome outcome;
	int32		http_status;	/* 0 for NULL */
	bool		has_response_code;
	int32		response_code;
	bool		has_body;
	Datum		body;
	bool		has_headers;
	Datum		headers;
	int32		retry_after;	/* 0 for NULL */
	bool		has_recovery_point;
	Datum		recovery_point;
	bool		has_token;
	pg_uuid_t	token;
	bool		has_expires_at;
	TimestampTz expires_at;
	bool		held;			/* kept pending: held_keys has it already */
} ReserveAnswer;

/*
 * Backend-local catalog cache: OIDs, the reservation tuple descriptor and
 * the scope policies.  Rebuilt when the relcache callback reports a change
 * of idempotency.scopes (or a full reset, or the extension being dropped,
 * which drops that table too).
 */
static MemoryContext keys_cache_cxt = NULL;
static bool keys_cache_valid = false;
static bool keys_callback_registered = false;
static uint64 keys_inval_count = 0;
static Oid	scopes_relid = InvalidOid;
static bool scopes_have_retryable = false;	/* false until the 1.1 update */
static Oid	outcome_oids[OUTCOME_COUNT];
static Oid	status_oids[STATUS_COUNT];
static TupleDesc reservation_desc = NULL;
static Oid	keys_relid = InvalidOid;
static Oid	keys_pkey_relid = InvalidOid;

/* Columns of idempotency.keys the hot read needs, by name. */
typedef enum KeysAtt
{
	KEYS_ATT_FINGERPRINT,
	KEYS_ATT_STATUS,
	KEYS_ATT_LOCK_TOKEN,
	KEYS_ATT_LOCKED_AT,
	KEYS_ATT_RECOVERY_POINT,
	KEYS_ATT_RESPONSE_CODE,
	KEYS_ATT_RESPONSE_BODY,
	KEYS_ATT_RESPONSE_HEADERS,
	KEYS_ATT_NEEDS_RECONCILIATION,
	KEYS_ATT_EXPIRES_AT,
	/* the rest, for keys_insert_row */
	KEYS_ATT_TENANT_ID,
	KEYS_ATT_SCOPE,
	KEYS_ATT_IDEM_KEY,
	KEYS_ATT_CREATED_AT,
	KEYS_ATT_COMPLETED_AT,
	KEYS_ATT_COUNT
} KeysAtt;

static const char *const keys_att_names[KEYS_ATT_COUNT] = {
	"fingerprint", "status", "lock_token", "locked_at", "recovery_point",
	"response_code", "response_body", "response_headers",
	"needs_reconciliation", "expires_at",
	"tenant_id", "scope", "idem_key", "created_at", "completed_at"
};
static AttrNumber keys_attnum[KEYS_ATT_COUNT];

/*
 * Their types as the extension creates them (InvalidOid: idempotency.status).
 * The functions read the columns by these types, and keys_insert_row
 * forms rows of them: a column of another type sends new rows through an
 * INSERT (which converts and checks the values), and one that is not
 * stored as this type is refused.
 */
static const Oid keys_att_types[KEYS_ATT_COUNT] = {
	BYTEAOID, InvalidOid, UUIDOID, TIMESTAMPTZOID, TEXTOID,
	INT4OID, JSONBOID, JSONBOID,
	BOOLOID, TIMESTAMPTZOID,
	TEXTOID, TEXTOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID
};
static Oid	keys_status_type = InvalidOid;	/* idempotency.status */
static Oid	reservation_relid = InvalidOid;

/*
 * The reservations this transaction created or took over, by the 64-bit
 * hash of (tenant, scope, key), with their lock tokens: the transaction
 * that reserved a key may complete, checkpoint or release it without
 * passing the token; any other needs it (fencing).  A hash collision can
 * only hand over the token of another key, which the fenced write then
 * rejects.  Lives in TopTransactionContext; entries of an aborted
 * subtransaction are dropped with it.
 */
typedef struct HeldKey
{
	uint64		hash;			/* hash key: the key's and its table's */
	Oid			relid;			/* the keys table it belongs to */
	SubTransactionId subid;
	pg_uuid_t	token;
	char	   *scope;			/* in TopTransactionContext; for the guard */

	/*
	 * A new key's row is written once: reserving it only takes the key's lock
	 * and records the row here ("pending"); completing it inserts the
	 * finished row, releasing it drops the record, and a reservation still
	 * pending at commit (or PREPARE) is inserted then, as "processing". Any
	 * other access to the key inserts it first.  The lock, held to the end of
	 * the transaction, answers other sessions as the uncommitted row did.
	 */
	bool		pending;
	Datum		ident[3];		/* tenant, scope, key as text */
	bytea	   *fingerprint;
	TimestampTz locked_at;
	TimestampTz expires_at;
	Oid			owner;			/* the role that writes it: the functions' */

	/*
	 * The transaction gave the reservation up (released it, or completed it
	 * with a code that releases): the guard no longer counts it.
	 */
	bool		released;

	/*
	 * What a subtransaction changed (pending, released, token), undone if it
	 * aborts: the state before the first change each subtransaction made,
	 * newest first (HeldUndo).
	 */
	struct HeldUndo *undo;
} HeldKey;

/* see keys_pending_row_plain */
static int	keys_pending_plain = -1;

/*
 * keys_open_plain found every column of idempotency.keys where the row
 * puts it, of its own type, and nothing has changed the table since: any
 * change (an ALTER TABLE of this transaction too, at its next command)
 * invalidates its relcache entry, which clears this.
 */
static bool keys_columns_checked = false;

/*
 * The state of a HeldKey before subtransaction "subid" first changed it.
 * Subtransaction IDs grow in start order, and while a subtransaction runs
 * only it and the ones it starts change anything: so the records of the
 * subtransactions an abort undoes are the ones on top of the stack with
 * an ID at least the aborted one's, and the state to go back to is the
 * deepest of them.
 */
typedef struct HeldUndo
{
	SubTransactionId subid;
	bool		pending;
	bool		released;
	pg_uuid_t	token;
	struct HeldUndo *next;
} HeldUndo;

static HTAB *held_keys = NULL;

/*
 * Each reservation belongs to the keys table it was made in (HeldKey.relid,
 * part of its hash key): after DROP EXTENSION and CREATE EXTENSION in the
 * same transaction, the new table's calls never see the old table's
 * reservations, and a rollback to a savepoint before the DROP, which
 * brings the old table back, brings them back with it.
 */
static bool held_callbacks_registered = false;
static HTAB *scope_cache = NULL;

/* Saved plans, prepared on first use. */
static SPIPlanPtr plan_insert = NULL;
static SPIPlanPtr plan_insert_done = NULL;
static SPIPlanPtr plan_renew = NULL;
static SPIPlanPtr plan_takeover = NULL;
static SPIPlanPtr plan_flag = NULL;
static SPIPlanPtr plan_complete = NULL;
static SPIPlanPtr plan_set_expiry = NULL;
static SPIPlanPtr plan_delete = NULL;
static SPIPlanPtr plan_checkpoint = NULL;
static SPIPlanPtr plan_scope = NULL;
static SPIPlanPtr plan_scope_10 = NULL; /* before ALTER EXTENSION UPDATE */
static SPIPlanPtr plan_lookup = NULL;
static SPIPlanPtr plan_count_live = NULL;

int			idem_default_ttl = 24 * 60 * 60;
int			idem_default_lock_timeout = 5 * 60;
int			idem_max_request_size = 1024 * 1024;
int			idem_max_response_size = 1024 * 1024;

PG_FUNCTION_INFO_V1(idem_reserve);
PG_FUNCTION_INFO_V1(idem_reserve_request);
PG_FUNCTION_INFO_V1(idem_reserve_fingerprint);
PG_FUNCTION_INFO_V1(idem_complete);
PG_FUNCTION_INFO_V1(idem_checkpoint);
PG_FUNCTION_INFO_V1(idem_release);
PG_FUNCTION_INFO_V1(idem_resolve);
PG_FUNCTION_INFO_V1(idem_lookup);
PG_FUNCTION_INFO_V1(idem_scopes_changed);

/*
 * idem_keys_init
 *		Called from _PG_init: the parameters of the key lifecycle.
 */
void
idem_keys_init(void)
{
	DefineCustomIntVariable("idempotency.default_ttl",
							gettext_noop("How long a key is kept when its scope sets no ttl."),
							NULL,
							&idem_default_ttl,
							24 * 60 * 60, 1, INT_MAX,
							PGC_USERSET,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.default_lock_timeout",
							gettext_noop("Age after which a processing reservation is stale when its scope sets no lock_timeout."),
							NULL,
							&idem_default_lock_timeout,
							5 * 60, 1, INT_MAX,

	/*
	 * the caller's value judges other attempts' reservations: a session that
	 * could lower it would take them over
	 */
							PGC_SUSET,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	/*
	 * The size limits are the DBA's: a session of a tenant (bound or not)
	 * must not lift them for itself.  Superuser, or GRANT SET ON PARAMETER.
	 */
	DefineCustomIntVariable("idempotency.max_request_size",
							gettext_noop("Largest request idem_reserve accepts, as canonical JSON text."),
							NULL,
							&idem_max_request_size,
							1024 * 1024, 1, INT_MAX,
							PGC_SUSET,
							GUC_UNIT_BYTE,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.max_response_size",
							gettext_noop("Largest response (body plus headers, as stored in jsonb) idem_complete accepts."),
							NULL,
							&idem_max_response_size,
							1024 * 1024, 1, INT_MAX,
							PGC_SUSET,
							GUC_UNIT_BYTE,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.max_keys_per_transaction",
							gettext_noop("Most idempotency keys and ordering keys one transaction may hold at once."),
							gettext_noop("-1 means a quarter of the server's lock table, 0 no limit.  Each holds a slot of the shared lock table, which every session needs, until the transaction ends."),
							&idem_max_keys_per_transaction,
							-1, -1, INT_MAX,
	/* a bound one tenant's batch must not lift */
							PGC_SUSET,
							0,
							NULL, NULL, NULL);
}


/* ----------------------------------------------------------------
 * Catalog cache
 * ----------------------------------------------------------------
 */

/*
 * Relcache invalidation callback: runs inside invalidation processing, so
 * it only flags the cache; keys_ensure_cache rebuilds it at the next call.
 */
static void
keys_relcache_callback(Datum arg, Oid relid)
{
	(void) arg;

	/*
	 * The table, its primary key (REINDEX CONCURRENTLY gives it a new OID;
	 * DROP and CREATE EXTENSION new OIDs for everything), the scopes table
	 * and the reservation type: when any of them changes, look everything up
	 * again.
	 */
	if (relid == InvalidOid || relid == keys_relid)
	{
		keys_pending_plain = -1;
		keys_columns_checked = false;
	}
	if (relid == InvalidOid || relid == scopes_relid || relid == keys_relid ||
		relid == keys_pkey_relid || relid == reservation_relid)
	{
		keys_cache_valid = false;
		keys_inval_count++;
	}
}

/* The OID of enum value "label" of type "typid" (the outbox's too). */
Oid
idem_enum_label_oid(Oid typid, const char *label)
{
	Oid			oid;

	oid = GetSysCacheOid2(ENUMTYPOIDNAME, Anum_pg_enum_oid,
						  ObjectIdGetDatum(typid), CStringGetDatum(label));
	if (!OidIsValid(oid))
		elog(ERROR, "enum label \"%s\" of type %u not found", label, typid);
	return oid;
}

/*
 * The types of the columns of idempotency.keys (keys_att_types; "status"
 * the type idempotency.status): an error when one is not stored as its
 * type (a domain over it, or varchar for text, is: the functions read it
 * alike).  keys_open_plain checks that each is its own type.
 */
static void
keys_check_column_types(Oid status_type)
{
	keys_status_type = status_type;
	for (int i = 0; i < KEYS_ATT_COUNT; i++)
	{
		Oid			expected = OidIsValid(keys_att_types[i]) ?
			keys_att_types[i] : status_type;
		Oid			typid;
		int32		typmod;
		Oid			collid;
		Oid			base;

		get_atttypetypmodcoll(keys_relid, keys_attnum[i], &typid, &typmod,
							  &collid);
		base = getBaseType(typid);
		if (base != expected && !(expected == TEXTOID && base == VARCHAROID))
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("column \"%s\" of table idempotency.keys has type %s, not %s",
							keys_att_names[i], format_type_be(typid),
							format_type_be(expected)),
					 errdetail("The extension's functions read and write the column as %s.",
							   format_type_be(expected)),
					 errhint("Change it back: ALTER TABLE idempotency.keys ALTER COLUMN %s TYPE %s.",
							 quote_identifier(keys_att_names[i]),
							 format_type_be_qualified(expected))));
	}
}

static Oid
keys_type_oid(Oid nsp, const char *name)
{
	Oid			typid;

	typid = GetSysCacheOid2(TYPENAMENSP, Anum_pg_type_oid,
							CStringGetDatum(name), ObjectIdGetDatum(nsp));
	if (!OidIsValid(typid))
		elog(ERROR, "type idempotency.%s not found", name);
	return typid;
}

/*
 * reserve_answer_datum fills idempotency.reservation by position: check
 * once, when the cache loads, that the type has these columns in this
 * order.
 */
static void
keys_check_reservation_type(TupleDesc desc)
{
	static const char *const names[] = {
		"outcome", "http_status", "response_code", "response_body",
		"response_headers", "retry_after", "recovery_point", "lock_token",
		"expires_at"
	};
	int			i;

	if (desc->natts != lengthof(names))
		elog(ERROR, "type idempotency.reservation has %d columns, expected %d",
			 desc->natts, (int) lengthof(names));
	for (i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (att->attisdropped || strcmp(NameStr(att->attname), names[i]) != 0)
			elog(ERROR, "column %d of type idempotency.reservation is not \"%s\"",
				 i + 1, names[i]);
	}
}

/*
 * Make sure the catalog cache is loaded.  Catalog lookups may themselves
 * process invalidations; if one arrives while loading, load again.
 */
static void
keys_ensure_cache(void)
{
	int			passes = 0;

	/*
	 * A transaction applies invalidations only when it starts and when it
	 * locks a relation: apply those that arrived since (a scope changed, an
	 * index rebuilt) before trusting the cache.
	 */
	AcceptInvalidationMessages();
	while (!keys_cache_valid)
	{
		uint64		start = keys_inval_count;
		MemoryContext oldcxt;
		Oid			nsp;
		Oid			typid;
		int			i;
		HASHCTL		ctl;

		if (!keys_callback_registered)
		{
			idem_register_relcache_callback(keys_relcache_callback);
			keys_callback_registered = true;
		}
		if (keys_cache_cxt == NULL)
			keys_cache_cxt = AllocSetContextCreate(CacheMemoryContext,
												   "idempotency keys cache",
												   ALLOCSET_SMALL_SIZES);
		else
			MemoryContextReset(keys_cache_cxt);
		keys_columns_checked = false;
		scope_cache = NULL;
		reservation_desc = NULL;

		nsp = get_namespace_oid("idempotency", false);
		scopes_relid = get_relname_relid("scopes", nsp);
		keys_relid = get_relname_relid("keys", nsp);
		keys_pkey_relid = get_relname_relid("keys_pkey", nsp);
		if (!OidIsValid(scopes_relid) || !OidIsValid(keys_relid) ||
			!OidIsValid(keys_pkey_relid))
			elog(ERROR, "tables of the idempotency extension not found");
		scopes_have_retryable =
			get_attnum(scopes_relid, "retryable_codes") != InvalidAttrNumber;
		for (i = 0; i < KEYS_ATT_COUNT; i++)
		{
			keys_attnum[i] = get_attnum(keys_relid, keys_att_names[i]);
			if (keys_attnum[i] == InvalidAttrNumber)
				elog(ERROR, "column idempotency.keys.%s not found",
					 keys_att_names[i]);
		}

		typid = keys_type_oid(nsp, "outcome");
		for (i = 0; i < OUTCOME_COUNT; i++)
			outcome_oids[i] = i == OUTCOME_RATE_LIMITED ?
			/* absent until ALTER EXTENSION UPDATE; never answered then */
				GetSysCacheOid2(ENUMTYPOIDNAME, Anum_pg_enum_oid,
								ObjectIdGetDatum(typid),
								CStringGetDatum(outcome_labels[i])) :
				idem_enum_label_oid(typid, outcome_labels[i]);
		typid = keys_type_oid(nsp, "status");
		for (i = 0; i < STATUS_COUNT; i++)
			status_oids[i] = idem_enum_label_oid(typid, status_labels[i]);
		keys_check_column_types(typid);

		typid = keys_type_oid(nsp, "reservation");
		reservation_relid = get_typ_typrelid(typid);
		oldcxt = MemoryContextSwitchTo(keys_cache_cxt);
		reservation_desc = lookup_rowtype_tupdesc_copy(typid, -1);
		MemoryContextSwitchTo(oldcxt);
		keys_check_reservation_type(reservation_desc);

		memset(&ctl, 0, sizeof(ctl));
		ctl.keysize = SCOPE_CACHE_KEYLEN;
		ctl.entrysize = sizeof(ScopeCacheEntry);
		ctl.hcxt = keys_cache_cxt;
		scope_cache = hash_create("idempotency scope policies", 64, &ctl,
								  HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);

		/* the table may be another one: its plainness is looked at anew */
		keys_pending_plain = -1;
		if (keys_inval_count == start)
			keys_cache_valid = true;

		/*
		 * Invalidations on every pass (debug_discard_caches discards the
		 * caches at each catalog access): this call uses the last pass's
		 * lookups, which were current when made, and the next call loads
		 * again.
		 */
		else if (++passes >= 3)
			break;
	}
}

/* ----------------------------------------------------------------
 * SPI helpers
 * ----------------------------------------------------------------
 */

#define KEY_WHERE \
	" WHERE tenant_id OPERATOR(pg_catalog.=) $1"\
	" AND scope OPERATOR(pg_catalog.=) $2"\
	" AND idem_key OPERATOR(pg_catalog.=) $3"

/* ----------------------------------------------------------------
 * Argument checks (all run before anything is written)
 * ----------------------------------------------------------------
 */

/*
 * Check and collect tenant ($1), scope ($2) and key ($3) of a call whose
 * first three arguments they are.  The tenant check follows the NULL check
 * so the message can name the argument.
 */
static void
keys_ident_from_args(FunctionCallInfo fcinfo, KeyIdent *id)
{
	text	   *key;

	if (PG_ARGISNULL(0))
		idem_null_argument("tenant");
	id->tenant = text_to_cstring(PG_GETARG_TEXT_PP(0));
	idem_check_tenant(id->tenant);
	if (PG_ARGISNULL(1))
		idem_null_argument("scope");
	key = PG_ARGISNULL(2) ? NULL : PG_GETARG_TEXT_PP(2);
	idem_check_key(key);

	id->scope = text_to_cstring(PG_GETARG_TEXT_PP(1));
	idem_check_name_length("scope", id->scope);
	id->key = text_to_cstring(key);
	id->values[0] = PG_GETARG_DATUM(0);
	id->values[1] = PG_GETARG_DATUM(1);
	id->values[2] = PointerGetDatum(key);
}

/*
 * Approximate length of an interval in microseconds (a month is 30 days),
 * saturated at the int64 limits instead of overflowing.
 */
static int64
keys_interval_usecs(const Interval *iv)
{
	int64		days;
	int64		usecs;
	int64		result;

	days = (int64) iv->month * DAYS_PER_MONTH + iv->day;	/* cannot overflow */
	if (pg_mul_s64_overflow(days, USECS_PER_DAY, &usecs) ||
		pg_add_s64_overflow(usecs, iv->time, &result))
		return days < 0 ? PG_INT64_MIN : PG_INT64_MAX;
	return result;
}

static TimestampTz
keys_add_interval(TimestampTz ts, Interval *iv)
{
	return DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
												   TimestampTzGetDatum(ts),
												   IntervalPGetDatum(iv)));
}

/* Size of a stored value as the size GUCs count it: uncompressed bytes. */
static Size
keys_datum_size(FunctionCallInfo fcinfo, int argno)
{
	if (PG_ARGISNULL(argno))
		return 0;
	return toast_raw_datum_size(PG_GETARG_DATUM(argno)) - VARHDRSZ;
}

static void
keys_check_response(FunctionCallInfo fcinfo, int code_arg, int body_arg,
					int headers_arg)
{
	int32		code;
	Size		size;

	if (PG_ARGISNULL(code_arg))
		idem_null_argument("response_code");
	code = PG_GETARG_INT32(code_arg);
	if (code < 100 || code > 599)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("response_code %d is not an HTTP status code", code),
				 errhint("Pass the HTTP status code of the response, from 100 to 599.")));
	if (headers_arg >= 0 && !PG_ARGISNULL(headers_arg))
	{
		Jsonb	   *headers = PG_GETARG_JSONB_P(headers_arg);

		if (!JB_ROOT_IS_OBJECT(headers) || JB_ROOT_IS_SCALAR(headers))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("response_headers must be a JSON object"),
					 errhint("Pass the headers to replay as an object of names and values, for example {\"Location\": \"/orders/42\"}.")));
	}
	size = keys_datum_size(fcinfo, body_arg);
	if (headers_arg >= 0)
		size += keys_datum_size(fcinfo, headers_arg);
	if (size > (Size) idem_max_response_size)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("response is too large to store"),
				 errdetail("The response body and headers take %zu bytes; idempotency.max_response_size is %d bytes.",
						   size, idem_max_response_size),
				 errhint("Store a smaller response (for example a reference to the resource), or raise idempotency.max_response_size.")));
}

/* ----------------------------------------------------------------
 * Locks
 * ----------------------------------------------------------------
 */

/* 64-bit hash of (tenant, scope, key). */
static uint64
keys_hash(KeyIdent *id)
{
	uint64		h = 0;
	int			i;

	for (i = 0; i < 3; i++)
	{
		text	   *t = DatumGetTextPP(id->values[i]);

		uint64		part;

		part = hash_bytes_extended((const unsigned char *) VARDATA_ANY(t),
								   VARSIZE_ANY_EXHDR(t), i);
		h = hash_combine64(h, part);
	}
	return h;
}

/* keys_hash of the key whose lock is "tag" */
#define KEYS_TAG_HASH(tag) \
	(((uint64) (tag).locktag_field2 << 32) | (uint64) (tag).locktag_field3)

static void
keys_lock_tag(LOCKTAG *tag, KeyIdent *id)
{
	uint64		h = keys_hash(id);

	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32) (h >> 32), (uint32) h,
						 IDEM_LOCKTAG_CLASS);
}

/* ----------------------------------------------------------------
 * Locks held per transaction
 *
 * Each key a transaction holds, and each ordering key it enqueued under,
 * is a lock in the server's shared lock table until the transaction ends.
 * That table has max_locks_per_transaction * (max_connections + ...)
 * slots, which every session shares: a batch holding thousands of keys
 * would leave the other sessions, whatever their tenant, and new
 * connections "out of shared memory".  idempotency.max_keys_per_transaction
 * bounds what one transaction holds (53400), by default to a quarter of
 * the table.
 *
 * The locks counted are the ones this transaction took (LOCKACQUIRE_OK),
 * by tag.  A subtransaction that aborts releases what its resource owners
 * took, but not what a cursor opened before it fetched meanwhile: so at
 * the limit the tags no longer held (LockHeldByMe) are forgotten, rather
 * than guessing at each abort what it released.
 * ----------------------------------------------------------------
 */
int			idem_max_keys_per_transaction = -1;

/*
 * The tags this transaction took, in TopMemoryContext, in the order taken
 * (a tag taken again after an aborted subtransaction released it appears
 * twice until the next prune).  Appending is all the hot path does.
 */
static LOCKTAG *locks_taken = NULL;
static int	locks_taken_len = 0;
static int	locks_taken_size = 0;
static bool lock_callbacks_registered = false;

static bool
keys_lock_held(const LOCKTAG *tag)
{
#if PG_VERSION_NUM >= 170000
	return LockHeldByMe(tag, ExclusiveLock, false);
#else
	return LockHeldByMe(tag, ExclusiveLock);
#endif
}

/* tags are compared as bytes: every byte is a field */
StaticAssertDecl(sizeof(LOCKTAG) == 3 * sizeof(uint32) + sizeof(uint16) + 2 * sizeof(uint8),
				 "LOCKTAG has padding");

static int
locktag_cmp(const void *a, const void *b)
{
	return memcmp(a, b, sizeof(LOCKTAG));
}

/* Keep each tag once, and only those still held. */
static void
locks_taken_prune(void)
{
	int			n = 0;

	qsort(locks_taken, locks_taken_len, sizeof(LOCKTAG), locktag_cmp);
	for (int i = 0; i < locks_taken_len; i++)
	{
		if (n > 0 && locktag_cmp(&locks_taken[n - 1], &locks_taken[i]) == 0)
			continue;
		if (keys_lock_held(&locks_taken[i]))
			locks_taken[n++] = locks_taken[i];
	}
	locks_taken_len = n;
}

static void
lock_count_xact_callback(XactEvent event, void *arg)
{
	(void) arg;
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			locks_taken_len = 0;
			/* a big batch's array is not kept for the session's life */
			if (locks_taken_size > 1024)
			{
				pfree(locks_taken);
				locks_taken = NULL;
				locks_taken_size = 0;
			}
			break;
		default:
			break;
	}
}

/* The most locks one transaction may hold; 0: no limit. */
static int
keys_lock_limit(void)
{
	if (idem_max_keys_per_transaction >= 0)
		return idem_max_keys_per_transaction;
	return (int) Min((int64) INT_MAX,
					 (int64) max_locks_per_xact *
					 (MaxBackends + max_prepared_xacts) / 4);
}

/*
 * Before this transaction takes "tag" (a key's or an ordering key's lock,
 * in ExclusiveLock): 53400 when it holds as many as it may and not this
 * one already.  Raised before the lock is taken or waited for, so before
 * the key's row is read: a replay is refused too.
 */
static void
keys_lock_check(const LOCKTAG *tag)
{
	int			limit = keys_lock_limit();

	if (limit <= 0 || locks_taken_len < limit || keys_lock_held(tag))
		return;
	/* at the limit: forget the locks aborted subtransactions released */
	locks_taken_prune();
	if (locks_taken_len < limit)
		return;
	ereport(ERROR,
			(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
			 errmsg("transaction holds too many idempotency keys"),
			 errdetail("It holds %d keys and ordering keys, the most idempotency.max_keys_per_transaction allows%s.  Each takes a slot of the server's shared lock table, which every session needs, until the transaction ends.",
					   locks_taken_len,
					   idem_max_keys_per_transaction < 0 ?
					   " (a quarter of the lock table)" : ""),
			 errhint("Commit every few hundred keys; for a batch that must hold more, a superuser can raise idempotency.max_keys_per_transaction for its role (ALTER ROLE ... SET), with max_locks_per_transaction.")));
}

/* This transaction just took "tag", which it did not hold: count it. */
static void
keys_lock_taken(const LOCKTAG *tag)
{
	if (!lock_callbacks_registered)
	{
		RegisterXactCallback(lock_count_xact_callback, NULL);
		lock_callbacks_registered = true;
	}
	if (locks_taken_len >= locks_taken_size)
	{
		int			size = Max(64, locks_taken_size * 2);

		locks_taken = locks_taken == NULL ?
			MemoryContextAlloc(TopMemoryContext, size * sizeof(LOCKTAG)) :
			repalloc(locks_taken, size * sizeof(LOCKTAG));
		locks_taken_size = size;
	}
	locks_taken[locks_taken_len++] = *tag;
}

/*
 * The lock "tag" that the same call took was released: the last one
 * taken.
 */
static void
keys_lock_given_back(const LOCKTAG *tag)
{
	if (locks_taken_len > 0 &&
		locktag_cmp(&locks_taken[locks_taken_len - 1], tag) == 0)
		locks_taken_len--;
}

/*
 * Key and ordering-key locks belong to the (sub)transaction that takes
 * them, as its writes do, not to the portal running the statement: a
 * cursor opened before a savepoint and fetched in it would otherwise keep
 * the locks of a savepoint rolled back, and a fetch that fails would take
 * with the cursor's resources the locks of every fetch before it, leaving
 * their reservations unguarded.  On an error the abort resets
 * CurrentResourceOwner.
 */
static LockAcquireResult
keys_lock_acquire(const LOCKTAG *tag, bool dontWait)
{
	ResourceOwner save = CurrentResourceOwner;
	LockAcquireResult res;

	CurrentResourceOwner = CurTransactionResourceOwner;
	res = LockAcquire(tag, ExclusiveLock, false, dontWait);
	CurrentResourceOwner = save;
	return res;
}

/* Give back early a lock keys_lock_acquire took in this subtransaction. */
static void
keys_lock_release(const LOCKTAG *tag)
{
	ResourceOwner save = CurrentResourceOwner;

	CurrentResourceOwner = CurTransactionResourceOwner;
	LockRelease(tag, ExclusiveLock, false);
	CurrentResourceOwner = save;
}

/*
 * idem_lock_wait
 *		Take "tag" (a key's or an ordering key's lock) in ExclusiveLock
 *		until the transaction ends, waiting like any lock (lock_timeout and
 *		the deadlock check apply), within idempotency.max_keys_per_transaction.
 */
void
idem_lock_wait(const LOCKTAG *tag)
{
	keys_lock_check(tag);
	if (keys_lock_acquire(tag, false) == LOCKACQUIRE_OK)
		keys_lock_taken(tag);
}

/* ----------------------------------------------------------------
 * Reservations held by this transaction
 * ----------------------------------------------------------------
 */

static bool held_flushing = false;	/* held_flush_all is walking the keys */
static void held_free_undo(HeldUndo *u, HeldUndo *stop);
static void held_flush_all(void);
static bool held_flush_key(KeyIdent *id);
static HeldKey *held_find(KeyIdent *id);

static void
held_xact_callback(XactEvent event, void *arg)
{
	(void) arg;
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
		case XACT_EVENT_PRE_PREPARE:
			held_flush_all();
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			/* the memory goes with TopTransactionContext */
			held_keys = NULL;
			held_flushing = false;
			break;
		default:
			break;
	}
}

static void
held_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					  SubTransactionId parentSubid, void *arg)
{
	HASH_SEQ_STATUS status;
	HeldKey    *entry;

	(void) parentSubid;
	(void) arg;
	if (event != SUBXACT_EVENT_ABORT_SUB || held_keys == NULL)
		return;

	/*
	 * Subtransactions started since the aborted one began are its
	 * descendants, so every entry with a subid at least mySubid goes.
	 */
	hash_seq_init(&status, held_keys);
	while ((entry = (HeldKey *) hash_seq_search(&status)) != NULL)
	{
		if (entry->subid >= mySubid)
		{
			/*
			 * What the entry holds goes with it: a loop of reservations
			 * rolled back to savepoints would grow the transaction.
			 */
			held_free_undo(entry->undo, NULL);
			for (int i = 0; i < 3; i++)
				if (entry->ident[i] != (Datum) 0)
					pfree(DatumGetPointer(entry->ident[i]));
			if (entry->fingerprint != NULL)
				pfree(entry->fingerprint);
			if (entry->scope != NULL)
				pfree(entry->scope);
			(void) hash_search(held_keys, &entry->hash, HASH_REMOVE, NULL);
		}
		else
		{
			HeldUndo   *u = entry->undo;
			HeldUndo   *oldest = NULL;

			/*
			 * What the aborted subtransaction and its descendants changed
			 * (writing or dropping the pending row, giving the reservation
			 * up, making it again with another token) is undone.
			 */
			while (u != NULL && u->subid >= mySubid)
			{
				oldest = u;
				u = u->next;
			}
			if (oldest != NULL)
			{
				entry->pending = oldest->pending;
				entry->released = oldest->released;
				entry->token = oldest->token;
			}
			held_free_undo(entry->undo, u);
			entry->undo = u;
		}
	}
}

/* Free the undo records from "u" up to "stop" (not included). */
static void
held_free_undo(HeldUndo *u, HeldUndo *stop)
{
	while (u != NULL && u != stop)
	{
		HeldUndo   *next = u->next;

		pfree(u);
		u = next;
	}
}

/* The hash key of "id"'s reservation in the current keys table. */
static inline uint64
held_hash(KeyIdent *id)
{
	return hash_combine64(keys_hash(id), (uint64) keys_relid);
}

/*
 * Before "entry" changes: record its state for the current subtransaction
 * (HeldUndo), once per subtransaction.  An entry made in this
 * subtransaction or one of its committed children goes whole if it aborts.
 */
static void
held_save(HeldKey *entry)
{
	SubTransactionId cur = GetCurrentSubTransactionId();
	HeldUndo   *u;

	if (cur <= entry->subid ||
		(entry->undo != NULL && entry->undo->subid == cur))
		return;
	u = MemoryContextAlloc(TopTransactionContext, sizeof(HeldUndo));
	u->subid = cur;
	u->pending = entry->pending;
	u->released = entry->released;
	u->token = entry->token;
	u->next = entry->undo;
	entry->undo = u;
}

/*
 * The key's entry in this transaction's reservations, made (not pending,
 * token unset) when *found comes back false.
 */
static HeldKey *
held_enter(KeyIdent *id, bool *found)
{
	uint64		hash = held_hash(id);
	HeldKey    *entry;

	if (!held_callbacks_registered)
	{
		RegisterXactCallback(held_xact_callback, NULL);
		RegisterSubXactCallback(held_subxact_callback, NULL);
		held_callbacks_registered = true;
	}
	if (held_keys == NULL)
	{
		HASHCTL		ctl;

		memset(&ctl, 0, sizeof(ctl));
		ctl.keysize = sizeof(uint64);
		ctl.entrysize = sizeof(HeldKey);
		ctl.hcxt = TopTransactionContext;
		held_keys = hash_create("idempotency reservations of this transaction",
								16, &ctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}
	entry = (HeldKey *) hash_search(held_keys, &hash, HASH_ENTER, found);
	if (!*found)
	{
		/* a later proof of the same key keeps the first (outermost) subid */
		entry->relid = keys_relid;
		entry->subid = GetCurrentSubTransactionId();
		entry->scope = MemoryContextStrdup(TopTransactionContext, id->scope);
		entry->pending = false;
		entry->ident[0] = entry->ident[1] = entry->ident[2] = (Datum) 0;
		entry->fingerprint = NULL;
		entry->undo = NULL;
		entry->released = false;
	}
	else
	{
		/* the caller may set the token too */
		held_save(entry);
		entry->released = false;
	}
	return entry;
}

/* Remember that this transaction holds the key's reservation with "token". */
static void
held_remember(KeyIdent *id, const pg_uuid_t *token)
{
	bool		found;

	held_enter(id, &found)->token = *token;
}

/*
 * The transaction gave the key's reservation up: the guard stops counting
 * it (see HeldKey).
 */
static void
held_forget(KeyIdent *id)
{
	HeldKey    *entry = held_find(id);

	if (entry == NULL)
		return;
	held_save(entry);
	entry->released = true;
}

/*
 * idem_holds_reservation
 *		Whether this transaction holds a reservation it created, took over
 *		or proved with its lock token, in one of "scopes" (any scope when
 *		nscopes is 0).  The coverage guard's test: one hash walk over the
 *		few keys a transaction reserves, no table access.
 */
bool
idem_holds_reservation(char **scopes, int nscopes)
{
	HASH_SEQ_STATUS status;
	HeldKey    *entry;

	if (held_keys == NULL)
		return false;
	/* only the current table's (see held_hash) */
	keys_ensure_cache();
	hash_seq_init(&status, held_keys);
	while ((entry = (HeldKey *) hash_seq_search(&status)) != NULL)
	{
		if (entry->released || entry->relid != keys_relid)
			continue;
		if (nscopes == 0)
		{
			hash_seq_term(&status);
			return true;
		}
		for (int i = 0; i < nscopes; i++)
		{
			if (strcmp(entry->scope, scopes[i]) == 0)
			{
				hash_seq_term(&status);
				return true;
			}
		}
	}
	return false;
}

/* The key's entry in this transaction's reservations, or NULL. */
static HeldKey *
held_find(KeyIdent *id)
{
	uint64		hash;

	if (held_keys == NULL)
		return NULL;
	hash = held_hash(id);
	return (HeldKey *) hash_search(held_keys, &hash, HASH_FIND, NULL);
}

/* The token of a reservation this transaction holds, or NULL. */
static pg_uuid_t *
held_token(KeyIdent *id)
{
	HeldKey    *entry = held_find(id);

	return entry ? &entry->token : NULL;
}

/*
 * Wait up to "timeout_ms" for the key's lock as an ordinary lock waiter
 * (visible in pg_locks, part of deadlock detection), by running the
 * acquisition in a subtransaction with lock_timeout set.  Returns false if
 * the timeout expired; any other error (cancel, deadlock) is rethrown.
 */
static bool
reserve_wait_lock(LOCKTAG *tag, int timeout_ms)
{
	MemoryContext oldcxt = CurrentMemoryContext;
	ResourceOwner oldowner = CurrentResourceOwner;
	ResourceOwner xactowner = CurTransactionResourceOwner;
	int			save_lock_timeout = LockTimeout;
	volatile bool got = false;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(oldcxt);
	PG_TRY();
	{
		ResourceOwner subowner;

		LockTimeout = timeout_ms;
		(void) LockAcquire(tag, ExclusiveLock, false, false);
		LockTimeout = save_lock_timeout;

		/*
		 * Hand the lock to the caller's subtransaction, as if taken there
		 * (keys_lock_acquire), so that the caller can give it back early with
		 * keys_lock_release.
		 */
		subowner = CurrentResourceOwner;
		CurrentResourceOwner = xactowner;
		(void) LockAcquire(tag, ExclusiveLock, false, true);
		CurrentResourceOwner = subowner;
		LockRelease(tag, ExclusiveLock, false);
		ReleaseCurrentSubTransaction();
		got = true;
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		LockTimeout = save_lock_timeout;
		MemoryContextSwitchTo(oldcxt);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcxt);
		CurrentResourceOwner = oldowner;
		if (edata->sqlerrcode == ERRCODE_T_R_DEADLOCK_DETECTED)
			edata->hint = pstrdup("Retry the transaction.  A transaction that reserves several keys with wait should reserve them in one order, such as sorted, so that two of them never wait for each other.");
		if (edata->sqlerrcode != ERRCODE_LOCK_NOT_AVAILABLE)
			ReThrowError(edata);
		FreeErrorData(edata);
	}
	PG_END_TRY();
	MemoryContextSwitchTo(oldcxt);
	CurrentResourceOwner = oldowner;
	return got;
}

/*
 * Take the key's lock without queueing.  When it is busy and "deadline" is
 * set, wait for it until the deadline.  Returns false if the lock could not
 * be had in time.
 */
static bool
reserve_claim_lock(LOCKTAG *tag, TimestampTz deadline, bool *mine)
{
	TimestampTz now;
	int64		remaining_ms;
	LockAcquireResult res;

	keys_lock_check(tag);
	res = keys_lock_acquire(tag, true);

	/* this transaction holds the key already: nothing to wait for */
	*mine = res == LOCKACQUIRE_ALREADY_HELD || res == LOCKACQUIRE_ALREADY_CLEAR;
	if (res == LOCKACQUIRE_OK)
		keys_lock_taken(tag);
	if (res != LOCKACQUIRE_NOT_AVAIL)
		return true;
	if (deadline == 0)
		return false;
	now = GetCurrentTimestamp();
	if (now >= deadline)
		return false;
	remaining_ms = (deadline - now + 999) / 1000;
	if (!reserve_wait_lock(tag, (int) Min(remaining_ms, INT_MAX)))
		return false;
	keys_lock_taken(tag);
	return true;
}

/* Sleep a little while waiting for a committed reservation to finish. */
static void
reserve_sleep(TimestampTz deadline, long *sleep_ms)
{
	TimestampTz now = GetCurrentTimestamp();
	long		remaining_ms = (long) ((deadline - now + 999) / 1000);

	if (remaining_ms <= 0)
		return;
	(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
					 Min(*sleep_ms, remaining_ms), PG_WAIT_EXTENSION);
	ResetLatch(MyLatch);
	CHECK_FOR_INTERRUPTS();
	*sleep_ms = Min(*sleep_ms * 2, 100);
}

/* ----------------------------------------------------------------
 * Scope policies
 * ----------------------------------------------------------------
 */

/* The bits of a scope's retryable_codes (an int[]) in *bits. */
static void
keys_retryable_bits(ArrayType *codes, uint64 *bits)
{
	Datum	   *elems;
	bool	   *nulls;
	int			n;

	deconstruct_array(codes, INT4OID, sizeof(int32), true, TYPALIGN_INT,
					  &elems, &nulls, &n);
	for (int i = 0; i < n; i++)
	{
		int32		code = nulls[i] ? 0 : DatumGetInt32(elems[i]);

		/* idem_configure_scope admits 100 to 599 only */
		if (code >= 100 && code <= 599)
			bits[RETRYABLE_WORD(code)] |= RETRYABLE_BIT(code);
	}
}

/*
 * A scope's option in idempotency.scopes outside what idem_configure_scope
 * accepts (written around it): "value" is its text, "example" an options
 * object that sets it.
 */
static void
keys_scope_out_of_range(const char *scope, const char *option,
						const char *value, const char *example,
						const char *range)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("scope \"%s\" has %s %s in idempotency.scopes, outside what idem_configure_scope accepts",
					scope, option, value),
			 errdetail("It must be %s.", range),
			 errhint("Set it with idem_configure_scope('%s', '%s').",
					 scope, example)));
}

/*
 * Read the policy of "scope" into *policy, from the cache or from
 * idempotency.scopes.  The table is read with the latest snapshot, not the
 * transaction's: what is cached must not depend on an old snapshot, since
 * the invalidation for a later change may already have been processed.
 * Must be called inside SPI; policy->ignore is allocated in the current
 * context.  A policy found in the cache comes without it (NULL) unless
 * "with_ignore": idem_complete only needs the rest.
 */
static void
keys_scope_policy(const char *scope, ScopePolicy *policy, bool with_ignore)
{
	bool		cacheable = strlen(scope) < SCOPE_CACHE_KEYLEN;
	ScopeCacheEntry *entry;
	SPIPlanPtr	plan;
	Oid			argtypes[1] = {TEXTOID};
	Datum		values[1];
	bool		isnull;
	MemoryContext oldcxt;
	int			rc;

	if (cacheable)
	{
		entry = hash_search(scope_cache, scope, HASH_FIND, NULL);
		if (entry != NULL)
		{
			*policy = entry->policy;
			/* a copy: the cache may be rebuilt while the caller uses it */
			policy->ignore = policy->ignore != NULL && with_ignore ?
				DatumGetArrayTypePCopy(PointerGetDatum(entry->policy.ignore)) :
				NULL;
			return;
		}
	}

	memset(policy, 0, sizeof(*policy));
	if (scopes_have_retryable)
		plan = idem_saved_plan(&plan_scope,
							   "SELECT ttl, lock_timeout, cache_server_errors,"
							   " stale_action OPERATOR(pg_catalog.=) 'takeover',"
							   " fingerprint_ignore, retryable_codes,"
							   " new_keys_per_second, new_keys_burst,"
							   " max_live_keys"
							   " FROM idempotency.scopes WHERE scope OPERATOR(pg_catalog.=) $1",
							   1, argtypes, 0);
	else
		plan = idem_saved_plan(&plan_scope_10,
							   "SELECT ttl, lock_timeout, cache_server_errors,"
							   " stale_action OPERATOR(pg_catalog.=) 'takeover',"
							   " fingerprint_ignore, NULL::pg_catalog.int4[],"
							   " NULL::pg_catalog.float8, NULL::pg_catalog.int4,"
							   " NULL::pg_catalog.int4"
							   " FROM idempotency.scopes WHERE scope OPERATOR(pg_catalog.=) $1",
							   1, argtypes, 0);
	values[0] = CStringGetTextDatum(scope);
	rc = SPI_execute_snapshot(plan, values, NULL, GetLatestSnapshot(),
							  InvalidSnapshot, true, false, 1);
	if (rc < 0)
		elog(ERROR, "SPI_execute_snapshot failed: %s", SPI_result_code_string(rc));
	if (SPI_processed > 0)
	{
		HeapTuple	tup = SPI_tuptable->vals[0];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		Datum		d;

		d = SPI_getbinval(tup, desc, 1, &isnull);
		if (!isnull)
		{
			policy->has_ttl = true;
			policy->ttl = *DatumGetIntervalP(d);
		}
		d = SPI_getbinval(tup, desc, 2, &isnull);
		if (!isnull)
		{
			policy->has_lock_timeout = true;
			policy->lock_timeout = *DatumGetIntervalP(d);
		}
		d = SPI_getbinval(tup, desc, 3, &isnull);
		policy->cache_server_errors = !isnull && DatumGetBool(d);
		d = SPI_getbinval(tup, desc, 4, &isnull);
		policy->takeover = !isnull && DatumGetBool(d);
		d = SPI_getbinval(tup, desc, 5, &isnull);
		if (!isnull)
			policy->ignore = DatumGetArrayTypePCopy(d);
		d = SPI_getbinval(tup, desc, 6, &isnull);
		if (!isnull)
			keys_retryable_bits(DatumGetArrayTypeP(d), policy->retryable);

		/*
		 * Rates and quotas: idem_configure_scope keeps them in range; values
		 * written around it (NaN, a burst of 0) are refused, not computed
		 * with
		 */
		d = SPI_getbinval(tup, desc, 7, &isnull);
		if (!isnull && OidIsValid(outcome_oids[OUTCOME_RATE_LIMITED]))
		{
			policy->new_keys_per_second = DatumGetFloat8(d);
			if (!(policy->new_keys_per_second >= 0.000001 &&
				  policy->new_keys_per_second <= 1000000))
				keys_scope_out_of_range(scope, "new_keys_per_second",
										psprintf("%g", policy->new_keys_per_second),
										"{\"new_keys_per_second\": 10}",
										"a number from 0.000001 to 1000000");
			d = SPI_getbinval(tup, desc, 8, &isnull);
			policy->new_keys_burst = isnull ?
				(int32) Max(1.0, ceil(policy->new_keys_per_second)) :
				DatumGetInt32(d);
			if (policy->new_keys_burst < 1 || policy->new_keys_burst > 1000000)
				keys_scope_out_of_range(scope, "new_keys_burst",
										psprintf("%d", policy->new_keys_burst),
										"{\"new_keys_burst\": 10}",
										"an integer from 1 to 1000000");
		}
		d = SPI_getbinval(tup, desc, 9, &isnull);
		if (!isnull && OidIsValid(outcome_oids[OUTCOME_RATE_LIMITED]))
		{
			policy->max_live_keys = DatumGetInt32(d);
			if (policy->max_live_keys < 1 || policy->max_live_keys > 1000000000)
				keys_scope_out_of_range(scope, "max_live_keys",
										psprintf("%lld", (long long) policy->max_live_keys),
										"{\"max_live_keys\": 100000}",
										"an integer from 1 to 1000000000");
		}
	}

	if (!cacheable)
		return;
	if (hash_get_num_entries(scope_cache) >= SCOPE_CACHE_MAX)
	{
		/* many scopes: start over rather than grow without bound */
		keys_cache_valid = false;
		return;
	}
	entry = hash_search(scope_cache, scope, HASH_ENTER, NULL);
	entry->policy = *policy;
	if (policy->ignore != NULL)
	{
		oldcxt = MemoryContextSwitchTo(keys_cache_cxt);
		entry->policy.ignore =
			DatumGetArrayTypePCopy(PointerGetDatum(policy->ignore));
		MemoryContextSwitchTo(oldcxt);
	}
}

/*
 * idem_scopes_changed
 *		Statement trigger on idempotency.scopes and tenant_bindings (and a
 *		row trigger that fires under logical replication only): sends a relcache
 *		invalidation for the table so that every backend drops its cached
 *		policies once this transaction commits (and this backend at its
 *		next command).
 */
Datum
idem_scopes_changed(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	Oid			table;

	if (!CALLED_AS_TRIGGER(fcinfo))
		elog(ERROR, "idem_scopes_changed: not called by trigger manager");
	CacheInvalidateRelcacheByRelid(RelationGetRelid(trigdata->tg_relation));
	/* on Citus the trigger fires on a shard: invalidate its table too */
	table = idem_citus_changed_relid(trigdata->tg_relation);
	if (OidIsValid(table))
		CacheInvalidateRelcacheByRelid(table);
	PG_RETURN_POINTER(NULL);
}

/* ----------------------------------------------------------------
 * Reading and writing keys
 * ----------------------------------------------------------------
 */

/*
 * Which of the key's three parts (KeyIdent values: tenant, scope, key) the
 * primary key's column "column" holds.  The probe follows the index's own
 * column order.
 */
static int
keys_pkey_ident(Relation index, int column)
{
	AttrNumber	attnum;

	if (index->rd_index->indnkeyatts != 3)
		elog(ERROR, "primary key of idempotency.keys has %d columns, expected 3",
			 index->rd_index->indnkeyatts);
	attnum = index->rd_index->indkey.values[column];
	if (attnum == keys_attnum[KEYS_ATT_TENANT_ID])
		return 0;
	if (attnum == keys_attnum[KEYS_ATT_SCOPE])
		return 1;
	if (attnum == keys_attnum[KEYS_ATT_IDEM_KEY])
		return 2;
	elog(ERROR, "primary key of idempotency.keys has an unexpected column %d",
		 attnum);
	return 0;					/* keep compiler quiet */
}

/*
 * Fetch the key's row into *row (palloc'd in the current context).
 *
 * This is the hot read of every call, so it probes keys_pkey directly, as
 * catalog lookups do, instead of running a saved SELECT: executor start-up
 * would cost more than the probe.  The snapshot is the one a statement
 * would get (a fresh one under READ COMMITTED, the transaction's under
 * REPEATABLE READ), after a command-counter increment so that the calling
 * transaction's own earlier writes are seen; with "latest", the latest
 * snapshot, used under REPEATABLE READ to tell "no such key" from
 * "committed after my snapshot".  Predicate locks for SERIALIZABLE are
 * taken by the access methods as for any index scan.  The locks on the
 * table (RowExclusiveLock unless the transaction is read-only) and the
 * index (AccessShareLock) are kept to the end of the transaction.
 */
static bool
keys_fetch(KeyIdent *id, bool latest, KeyRow *row)
{
	Relation	heap;
	Relation	index;
	ScanKeyData skey[3];
	IndexScanDesc scan;
	TupleTableSlot *slot;
	Snapshot	snapshot;
	bool		found;
	int			i;

	/* this transaction's own new reservation is read from its row */
	if (held_keys != NULL)
		held_flush_key(id);
	CommandCounterIncrement();
	snapshot = RegisterSnapshot(latest ? GetLatestSnapshot() :
								GetTransactionSnapshot());

	/*
	 * On Citus, the tenant's shard (citus.c).  In a transaction that may
	 * write, the table is locked as the write will lock it, before the index
	 * is: a REINDEX (which holds the table, then waits for each index) then
	 * waits for this transaction, or this one for it, instead of the two
	 * deadlocking when the write asks for the table after the probe.  Both
	 * modes take the fast path and block no other request.
	 */
	heap = table_open(idem_keys_probe_relid(keys_relid, id->values[0]),
					  XactReadOnly || RecoveryInProgress() ?
					  AccessShareLock : RowExclusiveLock);

	/*
	 * The primary key as the relcache knows it once the table is locked:
	 * locking processed the invalidations, so an index that REINDEX
	 * CONCURRENTLY just replaced is not opened by its old OID.
	 */
#if PG_VERSION_NUM >= 180000
	index = index_open(RelationGetPrimaryKeyIndex(heap, false), AccessShareLock);
#else
	index = index_open(RelationGetPrimaryKeyIndex(heap), AccessShareLock);
#endif
	for (i = 0; i < 3; i++)
		ScanKeyEntryInitialize(&skey[i], 0, i + 1, BTEqualStrategyNumber,
							   InvalidOid, index->rd_indcollation[i],
							   F_TEXTEQ,
							   id->values[keys_pkey_ident(index, i)]);
	slot = table_slot_create(heap, NULL);
#if PG_VERSION_NUM >= 180000
	scan = index_beginscan(heap, index, snapshot, NULL, 3, 0);
#else
	scan = index_beginscan(heap, index, snapshot, 3, 0);
#endif
	index_rescan(scan, skey, 3, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, slot);
	if (found)
	{
		/* copy out of the buffer: the values outlive the scan */
		HeapTuple	tuple = ExecCopySlotHeapTuple(slot);
		TupleDesc	desc = RelationGetDescr(heap);
		Datum	   *values = palloc(desc->natts * sizeof(Datum));
		bool	   *nulls = palloc(desc->natts * sizeof(bool));

#define KEYS_VALUE(a)	values[keys_attnum[a] - 1]
#define KEYS_NULL(a)	nulls[keys_attnum[a] - 1]
		heap_deform_tuple(tuple, desc, values, nulls);
		row->fingerprint = DatumGetByteaPP(KEYS_VALUE(KEYS_ATT_FINGERPRINT));
		row->status = DatumGetObjectId(KEYS_VALUE(KEYS_ATT_STATUS));
		row->has_token = !KEYS_NULL(KEYS_ATT_LOCK_TOKEN);
		if (row->has_token)
			row->token = *DatumGetUUIDP(KEYS_VALUE(KEYS_ATT_LOCK_TOKEN));
		row->has_locked_at = !KEYS_NULL(KEYS_ATT_LOCKED_AT);
		row->locked_at = row->has_locked_at ?
			DatumGetTimestampTz(KEYS_VALUE(KEYS_ATT_LOCKED_AT)) : 0;
		row->has_recovery_point = !KEYS_NULL(KEYS_ATT_RECOVERY_POINT);
		row->recovery_point = KEYS_VALUE(KEYS_ATT_RECOVERY_POINT);
		row->has_response_code = !KEYS_NULL(KEYS_ATT_RESPONSE_CODE);
		row->response_code = row->has_response_code ?
			DatumGetInt32(KEYS_VALUE(KEYS_ATT_RESPONSE_CODE)) : 0;
		row->has_body = !KEYS_NULL(KEYS_ATT_RESPONSE_BODY);
		row->body = KEYS_VALUE(KEYS_ATT_RESPONSE_BODY);
		row->has_headers = !KEYS_NULL(KEYS_ATT_RESPONSE_HEADERS);
		row->headers = KEYS_VALUE(KEYS_ATT_RESPONSE_HEADERS);
		row->needs_reconciliation = !KEYS_NULL(KEYS_ATT_NEEDS_RECONCILIATION) &&
			DatumGetBool(KEYS_VALUE(KEYS_ATT_NEEDS_RECONCILIATION));
		row->expires_at = DatumGetTimestampTz(KEYS_VALUE(KEYS_ATT_EXPIRES_AT));
#undef KEYS_VALUE
#undef KEYS_NULL
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	index_close(index, NoLock);
	table_close(heap, NoLock);
	UnregisterSnapshot(snapshot);
	return found;
}

/* The SQL of a new reservation and of the reuse of an expired key. */
#define RESERVE_ARGTYPES \
	{TEXTOID, TEXTOID, TEXTOID, BYTEAOID, UUIDOID, TIMESTAMPTZOID, \
	 TIMESTAMPTZOID}

/*
 * Insert a new reservation.  A plain INSERT, without ON CONFLICT: the
 * caller holds the key's lock and has just seen no row with a fresh
 * snapshot, so only a writer that bypasses the key functions could collide
 * (and would get the unique violation it deserves); the speculative
 * insertion's extra index probe is not worth paying on every new request.
 */
static void
reserve_insert(Datum *values)
{
	Oid			argtypes[7] = RESERVE_ARGTYPES;

	idem_saved_plan(&plan_insert,
					"INSERT INTO idempotency.keys"
					" (tenant_id, scope, idem_key, fingerprint, lock_token, locked_at,"
					" created_at, expires_at)"
					" VALUES ($1, $2, $3, $4, $5, $6, $6, $7)",
					7, argtypes, 0);
	idem_spi_execute(plan_insert, values, NULL, false, 0);
}

/*
 * Open the keys table and, when it is plain for a row whose null columns
 * are "colnulls" (see keys_insert_row), its indexes: returns whether it
 * is, and the indexes opened in *rels (none when it is not).  The caller
 * closes them and the table.
 */
static bool
keys_open_plain(LOCKMODE lockmode, bool *colnulls, Relation *heap_out,
				Relation **rels_out, int *nindexes_out)
{
	Relation	heap;
	TupleDesc	desc;
	List	   *indexes;
	ListCell   *lc;
	Relation   *rels;
	int			nindexes;
	bool		plain = true;
	int			natts = 0;
	int			i;

	heap = table_open(keys_relid, lockmode);
	*heap_out = heap;
	*rels_out = NULL;
	*nindexes_out = 0;
	desc = RelationGetDescr(heap);
	for (i = 0; i < desc->natts; i++)
		if (!TupleDescAttr(desc, i)->attisdropped)
			natts++;
	if (natts != KEYS_ATT_COUNT ||
		heap->rd_rel->relkind != RELKIND_RELATION ||
		heap->rd_rel->relam != HEAP_TABLE_AM_OID ||
		heap->rd_rel->relrowsecurity ||
		heap->trigdesc != NULL ||
	/* not relhasrules: it stays set after the last rule is dropped */
		heap->rd_rules != NULL ||
		(desc->constr != NULL &&
		 (desc->constr->num_check > 0 || desc->constr->has_generated_stored)))
		return false;

	/*
	 * Each column where the row puts it, of its own type (no domain, no type
	 * modifier), as the table is now: at commit the row may have been formed
	 * before an ALTER TABLE of this transaction.  Checked again after any
	 * change to the table (keys_columns_checked).
	 */
	for (i = 0; !keys_columns_checked && i < KEYS_ATT_COUNT; i++)
	{
		Form_pg_attribute att;
		Oid			expected = OidIsValid(keys_att_types[i]) ?
			keys_att_types[i] : keys_status_type;

		if (keys_attnum[i] < 1 || keys_attnum[i] > desc->natts)
			return false;
		att = TupleDescAttr(desc, keys_attnum[i] - 1);
		if (att->attisdropped ||
			strcmp(NameStr(att->attname), keys_att_names[i]) != 0 ||
			att->atttypid != expected || att->atttypmod != -1)
			return false;
	}
	keys_columns_checked = true;
	indexes = RelationGetIndexList(heap);
	nindexes = list_length(indexes);
	rels = palloc(nindexes * sizeof(Relation));
	i = 0;
	foreach(lc, indexes)
	{
		Relation	index = index_open(lfirst_oid(lc), lockmode);
		Form_pg_index ix = index->rd_index;

		rels[i++] = index;
		if (!ix->indimmediate || ix->indisexclusion ||
			!heap_attisnull(index->rd_indextuple, Anum_pg_index_indexprs, NULL) ||
			!heap_attisnull(index->rd_indextuple, Anum_pg_index_indpred, NULL))
			plain = false;
	}
	list_free(indexes);
	*rels_out = rels;
	*nindexes_out = nindexes;

	/*
	 * A NOT NULL or a default added to a column the row leaves null: the
	 * INSERT refuses the null or applies the default
	 */
	for (i = 0; plain && i < KEYS_ATT_COUNT; i++)
		if (colnulls[i] &&
			(TupleDescAttr(desc, keys_attnum[i] - 1)->attnotnull ||
			 TupleDescAttr(desc, keys_attnum[i] - 1)->atthasdef))
			plain = false;
	return plain;
}

/*
 * Insert a row of idempotency.keys given by column (KeysAtt), without the
 * executor: the heap insert and one insert per index, as catalog rows are
 * written.  This is the one write of a new key, so its cost is the cost
 * of a request; an INSERT through SPI spends as much again starting the
 * executor.  Only for the table as the extension creates it, or with
 * more plain indexes: a column, trigger, rule, CHECK constraint, NOT NULL or
 * default on a column the row leaves null, row security
 * policy or an index with expressions, a predicate, an exclusion or a
 * deferred uniqueness that it does not know makes it return false, and the
 * caller inserts through SPI.  The unique index is checked as any insert
 * checks it; the caller holds the key's lock and has found no row.
 */
static bool
keys_insert_row(Datum *colvalues, bool *colnulls)
{
	Relation	heap;
	TupleDesc	desc;
	Datum	   *values = NULL;
	bool	   *nulls = NULL;
	HeapTuple	tuple = NULL;
	Relation   *rels;
	int			nindexes;
	bool		plain;
	int			i;

	if (idem_citus_distributed())
		return false;
	plain = keys_open_plain(RowExclusiveLock, colnulls, &heap, &rels, &nindexes);
	desc = RelationGetDescr(heap);
	if (plain)
	{
		values = palloc0(desc->natts * sizeof(Datum));
		nulls = palloc(desc->natts * sizeof(bool));
		memset(nulls, true, desc->natts * sizeof(bool));
		for (i = 0; i < KEYS_ATT_COUNT; i++)
		{
			values[keys_attnum[i] - 1] = colvalues[i];
			nulls[keys_attnum[i] - 1] = colnulls[i];
		}
		tuple = heap_form_tuple(desc, values, nulls);
		simple_heap_insert(heap, tuple);
	}
	for (int n = 0; n < nindexes; n++)
	{
		Relation	index = rels[n];

		if (plain)
		{
			IndexInfo  *info = BuildIndexInfo(index);
			Datum		ivalues[INDEX_MAX_KEYS];
			bool		inulls[INDEX_MAX_KEYS];

			/* an index being built concurrently takes rows once ready */
			if (info->ii_ReadyForInserts)
			{
				for (i = 0; i < info->ii_NumIndexAttrs; i++)
				{
					AttrNumber	attnum = info->ii_IndexAttrNumbers[i];

					ivalues[i] = values[attnum - 1];
					inulls[i] = nulls[attnum - 1];
				}
				(void) index_insert(index, ivalues, inulls, &tuple->t_self,
									heap, index->rd_index->indisunique ?
									UNIQUE_CHECK_YES : UNIQUE_CHECK_NO,
									false, info);
			}
		}
		index_close(index, NoLock);
	}
	table_close(heap, NoLock);
	return plain;
}

/*
 * Whether a pending reservation's row would be inserted directly into the
 * keys table (keys_insert_row), cached until the table's next relcache
 * invalidation: -1 not known.  When it would not (a trigger, a rule, a
 * deferrable constraint, a CHECK ... that a DBA added), a new key's row is
 * written when it is reserved, as an ordinary INSERT in the reserving
 * statement: written at commit, it would run their code after the
 * transaction's deferred triggers and cursors are done with, in a
 * security-restricted operation (a deferred trigger may not fire there,
 * a cursor opened there would outlive the transaction's resources).
 */
static void held_row(HeldKey *entry, Datum *values, bool *nulls);

static bool
keys_pending_row_plain(void)
{
	if (keys_pending_plain < 0)
	{
		HeldKey		dummy;
		Datum		cols[KEYS_ATT_COUNT];
		bool		colnulls[KEYS_ATT_COUNT];
		Relation	heap;
		Relation   *rels;
		int			nindexes;
		bool		plain;

		memset(&dummy, 0, sizeof(dummy));
		held_row(&dummy, cols, colnulls);
		plain = keys_open_plain(AccessShareLock, colnulls, &heap, &rels, &nindexes);
		for (int n = 0; n < nindexes; n++)
			index_close(rels[n], NoLock);
		table_close(heap, NoLock);
		keys_pending_plain = plain ? 1 : 0;
	}
	return keys_pending_plain == 1;
}

/*
 * Keep a new reservation pending (HeldKey); "values" are reserve_insert's.
 * Returns false, recording nothing, when it must be inserted now: where
 * the insert must fail now (a read-only transaction, a standby), on Citus
 * (the shard's write belongs to the statement), when the row would not be
 * inserted directly (keys_pending_row_plain), and for a key this transaction
 * already held in any way.
 */
static bool
held_defer(KeyIdent *id, Datum *values)
{
	MemoryContext oldcxt;
	HeldKey    *entry;
	bool		found;
	int			i;

	/*
	 * Nor while the pending rows are written at commit (code a trigger added
	 * later in the transaction runs may reserve a key): a key entered during
	 * the walk might not be visited.
	 */
	if (XactReadOnly || RecoveryInProgress() || idem_citus_distributed() ||
		held_flushing)
		return false;

	/*
	 * The lock the insert takes, taken now as when the row was inserted here:
	 * a REINDEX (which locks the table, then each index) waits for this
	 * transaction rather than holding the table when the row comes.
	 */
	LockRelationOid(keys_relid, RowExclusiveLock);
	if (!keys_pending_row_plain())
		return false;
	entry = held_enter(id, &found);
	if (found)
		return false;
	entry->token = *DatumGetUUIDP(values[4]);
	oldcxt = MemoryContextSwitchTo(TopTransactionContext);
	for (i = 0; i < 3; i++)
		entry->ident[i] = PointerGetDatum(DatumGetTextPCopy(values[i]));
	entry->fingerprint = DatumGetByteaPCopy(values[3]);
	MemoryContextSwitchTo(oldcxt);
	entry->locked_at = DatumGetTimestampTz(values[5]);
	entry->expires_at = DatumGetTimestampTz(values[6]);
	entry->owner = GetUserId();
	entry->pending = true;
	return true;
}

/* The key's pending reservation in this transaction, or NULL. */
static HeldKey *
held_pending(KeyIdent *id)
{
	HeldKey    *entry = held_find(id);

	return entry != NULL && entry->pending ? entry : NULL;
}

/* The pending row has been written or dropped in this subtransaction. */
static void
held_consume(HeldKey *entry)
{
	held_save(entry);
	entry->pending = false;
}

/*
 * The columns of a pending reservation's row, for keys_insert_row: as
 * reserve_insert writes it, "processing".
 */
static void
held_row(HeldKey *entry, Datum *values, bool *nulls)
{
	int			i;

	for (i = 0; i < KEYS_ATT_COUNT; i++)
	{
		values[i] = (Datum) 0;
		nulls[i] = true;
	}
#define HELD_SET(a, v) (values[a] = (v), nulls[a] = false)
	HELD_SET(KEYS_ATT_TENANT_ID, entry->ident[0]);
	HELD_SET(KEYS_ATT_SCOPE, entry->ident[1]);
	HELD_SET(KEYS_ATT_IDEM_KEY, entry->ident[2]);
	HELD_SET(KEYS_ATT_FINGERPRINT, PointerGetDatum(entry->fingerprint));
	HELD_SET(KEYS_ATT_STATUS, ObjectIdGetDatum(status_oids[STATUS_PROCESSING]));
	HELD_SET(KEYS_ATT_LOCK_TOKEN, UUIDPGetDatum(&entry->token));
	HELD_SET(KEYS_ATT_LOCKED_AT, TimestampTzGetDatum(entry->locked_at));
	HELD_SET(KEYS_ATT_NEEDS_RECONCILIATION, BoolGetDatum(false));
	HELD_SET(KEYS_ATT_CREATED_AT, TimestampTzGetDatum(entry->locked_at));
	HELD_SET(KEYS_ATT_EXPIRES_AT, TimestampTzGetDatum(entry->expires_at));
#undef HELD_SET
}

/* Insert a pending reservation as the "processing" row it stands for. */
static void
held_flush(HeldKey *entry)
{
	Datum		cols[KEYS_ATT_COUNT];
	bool		colnulls[KEYS_ATT_COUNT];

	held_row(entry, cols, colnulls);
	if (!keys_insert_row(cols, colnulls))
	{
		Datum		values[7];

		memcpy(values, entry->ident, sizeof(entry->ident));
		values[3] = PointerGetDatum(entry->fingerprint);
		values[4] = UUIDPGetDatum(&entry->token);
		values[5] = TimestampTzGetDatum(entry->locked_at);
		values[6] = TimestampTzGetDatum(entry->expires_at);
		reserve_insert(values);
	}
	held_consume(entry);
}

/*
 * Write the key's row now if this transaction keeps it pending; returns
 * whether it did (a read-only statement's snapshot would not see it).
 */
static bool
held_flush_key(KeyIdent *id)
{
	HeldKey    *entry = held_pending(id);

	if (entry == NULL)
		return false;
	held_flush(entry);
	return true;
}

/* At commit or PREPARE: write every reservation still pending. */
static void
held_flush_all(void)
{
	HASH_SEQ_STATUS status;
	HeldKey    *entry;
	bool		connected = false;
	Oid			save_userid;
	int			save_sec_context;
	int			save_nestlevel = 0;

	if (held_keys == NULL)
		return;
	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	held_flushing = true;
	hash_seq_init(&status, held_keys);
	while ((entry = (HeldKey *) hash_seq_search(&status)) != NULL)
	{
		if (!entry->pending)
			continue;

		/*
		 * The table went with a DROP EXTENSION in this transaction, and the
		 * reservation with it.  A table that is there is the current one (one
		 * name in one schema): the cache reads it again if a rollback to a
		 * savepoint brought it back.
		 */
		if (!SearchSysCacheExists1(RELOID, ObjectIdGetDatum(entry->relid)))
			continue;
		if (entry->relid != keys_relid)
			keys_ensure_cache();
		if (entry->relid != keys_relid)
			continue;
		if (!connected)
		{
			Relation	rel = RelationIdGetRelation(keys_relid);
			bool		runs_code = RelationIsValid(rel) &&
				(rel->trigdesc != NULL || rel->rd_rules != NULL);

			if (RelationIsValid(rel))
				RelationClose(rel);

			/*
			 * A trigger or rule added in this transaction after the key was
			 * reserved (keys_pending_row_plain keeps new keys from waiting
			 * when there is one): it cannot run here, after the transaction's
			 * cursors and deferred triggers are done with.
			 */
			if (runs_code)
			{
				hash_seq_term(&status);
				held_flushing = false;
				ereport(ERROR,
						(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
						 errmsg("a trigger or rule was added to idempotency.keys in the transaction that reserved idempotency key \"%s\"",
								TextDatumGetCString(entry->ident[2])),
						 errdetail("The key's row is written as the transaction commits, where a trigger or rule cannot run."),
						 errhint("Add triggers and rules to idempotency.keys in a transaction of their own; keys reserved after it commits are written when they are reserved.")));
			}

			/*
			 * As the key functions run: with their search_path, in a snapshot
			 * of ours (the portals are closed).  An error aborts the
			 * transaction, which restores the role and the search path.
			 */
			save_nestlevel = idem_pin_search_path();
			PushActiveSnapshot(GetTransactionSnapshot());
			idem_spi_connect();
			connected = true;
		}
		/* as the role that reserved it, the owner of the key functions */
		SetUserIdAndSecContext(entry->owner,
							   save_sec_context | SECURITY_LOCAL_USERID_CHANGE |
							   SECURITY_RESTRICTED_OPERATION);
		held_flush(entry);
		SetUserIdAndSecContext(save_userid, save_sec_context);
	}
	held_flushing = false;
	if (connected)
	{
		SPI_finish();
		PopActiveSnapshot();
		idem_unpin_search_path(save_nestlevel);
	}
}

/*
 * Overwrite an expired, finished key: the retry is a new request.  Returns
 * false if the row was deleted (by the reaper) since it was read.
 */
static bool
reserve_renew(Datum *values)
{
	Oid			argtypes[7] = RESERVE_ARGTYPES;

	idem_saved_plan(&plan_renew,
					"UPDATE idempotency.keys SET fingerprint = $4,"
					" status = 'processing', lock_token = $5, locked_at = $6,"
					" recovery_point = NULL, response_code = NULL,"
					" response_body = NULL, response_headers = NULL,"
					" needs_reconciliation = false, created_at = $6,"
					" completed_at = NULL, expires_at = $7" KEY_WHERE,
					7, argtypes, 0);
	idem_spi_execute(plan_renew, values, NULL, false, 0);
	return SPI_processed == 1;
}

/*
 * Hand a stale reservation to a new attempt: a new lock token, and a new
 * ttl from now, so that the response the new attempt stores is kept as
 * long as any other (created_at moves with it: a completion past
 * expires_at keeps the key expires_at - created_at from then, see
 * KEYS_EXPIRY_AT_COMPLETION).  Only the row as it was read matches (still
 * processing, not flagged for reconciliation, the same token): if the
 * sweeper flagged it or another attempt finished it meanwhile, returns
 * false and the caller reads the row again.
 */
static bool
reserve_takeover(KeyIdent *id, const KeyRow *row, Datum *newvalues)
{
	Oid			argtypes[7] = {TEXTOID, TEXTOID, TEXTOID, UUIDOID,
	TIMESTAMPTZOID, TIMESTAMPTZOID, UUIDOID};
	Datum		values[7];
	char		nulls[7] = "       ";

	idem_saved_plan(&plan_takeover,
					"UPDATE idempotency.keys SET lock_token = $4, locked_at = $5,"
					" created_at = $5, expires_at = $6" KEY_WHERE
					" AND status OPERATOR(pg_catalog.=) 'processing'"
					" AND NOT needs_reconciliation"
					" AND (lock_token OPERATOR(pg_catalog.=) $7"
					" OR (lock_token IS NULL AND $7 IS NULL))",
					7, argtypes, 0);
	memcpy(values, id->values, sizeof(id->values));
	values[3] = newvalues[4];
	values[4] = newvalues[5];
	values[5] = newvalues[6];
	values[6] = UUIDPGetDatum(&row->token);
	nulls[6] = row->has_token ? ' ' : 'n';
	idem_spi_execute(plan_takeover, values, nulls, false, 0);
	return SPI_processed == 1;
}

static void
reserve_flag_stale(KeyIdent *id)
{
	Oid			argtypes[3] = {TEXTOID, TEXTOID, TEXTOID};

	idem_saved_plan(&plan_flag,
					"UPDATE idempotency.keys SET needs_reconciliation = true"
					KEY_WHERE,
					3, argtypes, 0);
	idem_spi_execute(plan_flag, id->values, NULL, false, 0);
}

/* The statement of keys_count_live, prepared once. */
static SPIPlanPtr
keys_count_plan(void)
{
	Oid			argtypes[3] = {TEXTOID, TEXTOID, TIMESTAMPTZOID};

	return idem_saved_plan(&plan_count_live,
						   "SELECT pg_catalog.count(*),"
						   " pg_catalog.min(expires_at) FILTER"
						   " (WHERE status OPERATOR(pg_catalog.<>) 'processing')"
						   " FROM idempotency.keys"
						   " WHERE tenant_id OPERATOR(pg_catalog.=) $1 AND scope OPERATOR(pg_catalog.=) $2"
						   " AND (status OPERATOR(pg_catalog.=) 'processing'"
						   " OR expires_at OPERATOR(pg_catalog.>) $3)",
						   3, argtypes, 0);
}

/*
 * Count the live keys of the key's tenant and scope: in flight, or not yet
 * expired at "now".  Sets *earliest_expiry to the earliest expiry of the
 * finished ones (0 when there are none), and *mark to the pair's
 * admissions (idem_quota_mark) read just before the count's snapshot.
 * The primary key (tenant_id, idem_key, scope) serves it: the tenant's
 * range, with the scope checked in the index entries.
 */
static int64
keys_count_live(KeyIdent *id, TimestampTz now, TimestampTz *earliest_expiry,
				uint64 *mark)
{
	Datum		values[3];
	bool		isnull;
	Datum		d;
	int64		live;
	int			rc;

	keys_count_plan();
	values[0] = id->values[0];
	values[1] = id->values[1];
	values[2] = TimestampTzGetDatum(now);

	/*
	 * The mark and the snapshot are taken one right after the other, once the
	 * plan is ready: a key admitted after the mark is counted twice only if
	 * it commits between the two, not while the count is planned or waits for
	 * the CPU.  The snapshot is the latest, not the transaction's: under
	 * REPEATABLE READ the transaction's snapshot would miss the keys
	 * committed since it began, and the tenant would pass its quota.  Not
	 * read-only: the transaction's own new keys count.
	 */
	*mark = idem_quota_mark(id->tenant, id->scope);
	rc = SPI_execute_snapshot(plan_count_live, values, NULL,
							  GetLatestSnapshot(), InvalidSnapshot, false,
							  false, 1);
	if (rc < 0)
		elog(ERROR, "SPI_execute_snapshot failed: %s",
			 SPI_result_code_string(rc));
	live = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
									   SPI_tuptable->tupdesc, 1, &isnull));
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2,
					  &isnull);
	*earliest_expiry = isnull ? 0 : DatumGetTimestampTz(d);
	return live;
}

/*
 * Do, where a cancel can still end a wait, what the count of
 * keys_count_live waits for besides reading the keys (see
 * reserve_quota_admit): take the locks it takes, the table's (held
 * already) and every index's (the planner opens them all), and plan it,
 * which reads the table's statistics again after an ANALYZE (a DBA's
 * VACUUM FULL of pg_statistic, or an ALTER INDEX, would otherwise be
 * waited for where no cancel or timeout ends the wait).  The generic plan
 * built here leaves the catalog caches warm for a custom plan.
 */
static void
keys_prepare_count(void)
{
	Relation	rel = table_open(keys_relid, AccessShareLock);
	List	   *indexes = RelationGetIndexList(rel);
	ListCell   *lc;
	SPIPlanPtr	plan;

	foreach(lc, indexes)
		LockRelationOid(lfirst_oid(lc), AccessShareLock);
	list_free(indexes);
	table_close(rel, NoLock);

	plan = keys_count_plan();
	if (!idem_citus_pass_active)
	{
		CachedPlan *cplan = SPI_plan_get_cached_plan(plan);

		if (cplan != NULL)
			ReleaseCachedPlan(cplan, CurrentResourceOwner);
	}
}

/*
 * Room for one more live key under the scope's max_live_keys: shared
 * memory answers, and the keys are counted only when it says the tenant
 * is at its quota (at most once a second per tenant and scope).
 */
static bool
reserve_quota_admit(KeyIdent *id, const ScopePolicy *policy, TimestampTz now,
					int *retry_after)
{
	TimestampTz earliest_expiry;
	int64		live;
	uint64		mark;
	bool		admitted;

	switch (idem_quota_admit(id->tenant, id->scope, policy->max_live_keys,
							 retry_after))
	{
		case IDEM_QUOTA_ADMITTED:
			return true;
		case IDEM_QUOTA_FULL:
			return false;
		case IDEM_QUOTA_RECOUNT:
			break;
	}

	/*
	 * A big tenant's count can take longer than a request's
	 * statement_timeout.  Canceled, it would never land: the next new key
	 * would count again under the same timeout, and the tenant would get no
	 * new key at all.  So a query cancel (statement_timeout, a client's
	 * cancel, pg_cancel_backend) waits until the count is recorded and then
	 * ends this request (57014); the tenant's next new keys are admitted from
	 * the count.  pg_terminate_backend is not held back, and an error ends
	 * the hold (errfinish resets it).
	 */
	keys_prepare_count();
	HOLD_CANCEL_INTERRUPTS();
	live = keys_count_live(id, now, &earliest_expiry, &mark);
	admitted = idem_quota_recounted(id->tenant, id->scope,
									policy->max_live_keys, live,
									earliest_expiry, mark, retry_after);
	RESUME_CANCEL_INTERRUPTS();
	CHECK_FOR_INTERRUPTS();
	return admitted;
}

/*
 * A scope that limits new keys per tenant (a rate, a quota of live keys):
 * when this one would go over, answer rate_limited (429, retry_after) and
 * write nothing.  A key the quota refuses gives its rate back.  *admitted:
 * the key was admitted already in this call (its row vanished under a
 * renewal and was read again), not to be counted twice.
 */
static bool
reserve_rate_limited(KeyIdent *id, const ScopePolicy *policy,
					 TimestampTz now, ReserveAnswer *ans, bool *admitted)
{
	int			retry_after = 0;
	bool		rated = policy->new_keys_per_second > 0;

	if (*admitted)
		return false;
	/* a read-only transaction would fail at the insert, after the rate */
	if (rated || policy->max_live_keys > 0)
		idem_require_writable("idem_reserve()");
	if (!rated ||
		idem_rate_admit(id->tenant, id->scope, policy->new_keys_per_second,
						policy->new_keys_burst, &retry_after))
	{
		if (policy->max_live_keys <= 0 ||
			reserve_quota_admit(id, policy, now, &retry_after))
		{
			*admitted = true;
			return false;
		}
		if (rated)
			idem_rate_refund(id->tenant, id->scope,
							 policy->new_keys_per_second,
							 policy->new_keys_burst);
	}
	ans->outcome = OUTCOME_RATE_LIMITED;
	ans->http_status = 429;
	ans->retry_after = retry_after;
	return true;
}

/*
 * Whether "row", a reservation at work, is the one this transaction holds
 * (made, taken over or made again here, and not given up).
 */
static bool
reserve_held_here(KeyIdent *id, const KeyRow *row)
{
	HeldKey    *entry = held_find(id);

	return entry != NULL && !entry->released && row->has_token &&
		memcmp(&entry->token, &row->token, sizeof(pg_uuid_t)) == 0;
}

/* What reserve_decide did with a key whose row exists. */
typedef enum ReserveDecision
{
	DECIDED_READ,				/* answered from the row, nothing written */
	DECIDED_WROTE,				/* wrote the row: the key's lock is kept */
	DECIDED_READ_AGAIN			/* the row changed under us: read it again */
} ReserveDecision;

/*
 * Decide the answer for a key whose row exists, into *ans (unless the row
 * must be read again).  "newvalues" is the row a write would store; a
 * finished row that has not expired is only read, and may pass NULL (for
 * "admitted" too: see reserve_rate_limited).
 */
static ReserveDecision
reserve_decide(KeyIdent *id, KeyRow *row, const uint8 *fingerprint,
			   Datum *newvalues, Interval *lock_timeout,
			   const ScopePolicy *policy, TimestampTz now,
			   ReserveAnswer *ans, bool *admitted)
{
	TimestampTz stale_at;

	if (row->status != status_oids[STATUS_PROCESSING] && row->expires_at <= now)
	{
		/* expired: the same key is a new request */
		if (reserve_rate_limited(id, policy, now, ans, admitted))
			return DECIDED_READ;
		idem_new_token(DatumGetUUIDP(newvalues[4]));
		if (!reserve_renew(newvalues))
			return DECIDED_READ_AGAIN;	/* vanished */
		ans->outcome = OUTCOME_CREATED;
		ans->has_token = true;
		ans->token = *DatumGetUUIDP(newvalues[4]);
		ans->has_expires_at = true;
		ans->expires_at = DatumGetTimestampTz(newvalues[6]);
		return DECIDED_WROTE;
	}

	ans->has_expires_at = true;
	ans->expires_at = row->expires_at;

	if (VARSIZE_ANY_EXHDR(row->fingerprint) != IDEM_FINGERPRINT_LEN ||
		memcmp(VARDATA_ANY(row->fingerprint), fingerprint,
			   IDEM_FINGERPRINT_LEN) != 0)
	{
		ans->outcome = OUTCOME_MISMATCH;
		ans->http_status = 422;
		ans->has_expires_at = false;
		return DECIDED_READ;
	}

	if (row->status != status_oids[STATUS_PROCESSING])
	{
		ans->outcome = OUTCOME_REPLAY;
		ans->http_status = row->response_code;
		ans->has_response_code = row->has_response_code;
		ans->response_code = row->response_code;
		ans->has_body = row->has_body;
		ans->body = row->body;
		ans->has_headers = row->has_headers;
		ans->headers = row->headers;
		return DECIDED_READ;
	}

	if (row->needs_reconciliation)
	{
		ans->outcome = OUTCOME_STALE;
		ans->http_status = 409;
		ans->has_recovery_point = row->has_recovery_point;
		ans->recovery_point = row->recovery_point;
		return DECIDED_READ;
	}

	/*
	 * In progress until it turns stale; and this transaction's own
	 * reservation for as long as the transaction lasts: it is at work (the
	 * caller is that attempt), so neither taken over nor flagged.
	 */
	stale_at = row->has_locked_at ?
		keys_add_interval(row->locked_at, lock_timeout) : 0;
	if (stale_at > now || reserve_held_here(id, row))
	{
		int64		secs = stale_at > now ?
			(stale_at - now + USECS_PER_SEC - 1) / USECS_PER_SEC : 1;

		ans->outcome = OUTCOME_IN_PROGRESS;
		ans->http_status = 409;
		ans->retry_after = (int32) Max(1, Min(secs, RETRY_AFTER_MAX));
		return DECIDED_READ;
	}

	if (policy->takeover)
	{
		pg_uuid_t  *token = DatumGetUUIDP(newvalues[4]);

		idem_new_token(token);
		if (!reserve_takeover(id, row, newvalues))
			return DECIDED_READ_AGAIN;	/* changed under us */
		ans->outcome = OUTCOME_CREATED;
		ans->has_token = true;
		ans->token = *token;
		ans->has_recovery_point = row->has_recovery_point;
		ans->recovery_point = row->recovery_point;
		ans->has_expires_at = true;
		ans->expires_at = DatumGetTimestampTz(newvalues[6]);
		return DECIDED_WROTE;
	}

	reserve_flag_stale(id);
	ans->outcome = OUTCOME_STALE;
	ans->http_status = 409;
	ans->has_recovery_point = row->has_recovery_point;
	ans->recovery_point = row->recovery_point;
	return DECIDED_WROTE;
}

/*
 * A committed reservation flagged for reconciliation: whoever holds the
 * key's lock (another retry, the late completion, an operator resolving
 * it, the attempt checkpointing or releasing it) leaves it flagged or
 * finishes it, so "stale" is the answer the caller would have had a moment
 * earlier.  (One past its lock_timeout but not yet flagged may be held by
 * the attempt checkpointing it, alive again, or releasing it, free: left
 * to the in_progress answer.)  Under REPEATABLE READ the snapshot's row
 * may be outdated: left to the in_progress answer too.  Returns false,
 * with *ans untouched, for any other row.
 */
static bool
reserve_answer_stale(const KeyRow *row, const uint8 *fingerprint,
					 ReserveAnswer *ans)
{
	if (IsolationUsesXactSnapshot() || !row->needs_reconciliation ||
		VARSIZE_ANY_EXHDR(row->fingerprint) != IDEM_FINGERPRINT_LEN ||
		memcmp(VARDATA_ANY(row->fingerprint), fingerprint,
			   IDEM_FINGERPRINT_LEN) != 0)
		return false;
	ans->outcome = OUTCOME_STALE;
	ans->http_status = 409;
	ans->has_recovery_point = row->has_recovery_point;
	ans->recovery_point = row->recovery_point;
	ans->has_expires_at = true;
	ans->expires_at = row->expires_at;
	return true;
}

/*
 * Answer from the key's row, without the key's lock, if the key is finished
 * and has not expired: nothing writes such a row (a renewal needs it
 * expired, a takeover needs it processing), so its answer, a replay or a
 * mismatch, is the one the lock's holder would get; or if it is a flagged
 * reservation (reserve_answer_stale).  Returns false, with *ans untouched,
 * for any other row or none.
 */
static bool
reserve_answer_finished(KeyIdent *id, const uint8 *fingerprint,
						Interval *lock_timeout, const ScopePolicy *policy,
						TimestampTz now, ReserveAnswer *ans)
{
	KeyRow		row;

	if (!keys_fetch(id, false, &row))
		return false;
	if (row.status == status_oids[STATUS_PROCESSING])
		return reserve_answer_stale(&row, fingerprint, ans);
	if (row.expires_at <= now)
		return false;
	if (reserve_decide(id, &row, fingerprint, NULL, lock_timeout, policy, now,
					   ans, NULL) != DECIDED_READ)
		elog(ERROR, "a finished key's row was not answered by reading it");
	return true;
}

/*
 * Under REPEATABLE READ, a reservation at work in the snapshot ("row") must
 * still be the latest version of the key: one completed, released or taken
 * over since would be answered in_progress from the snapshot, where a retry
 * of the transaction gets its true answer.  Raises 40001 in that case.
 */
static void
reserve_check_latest(KeyIdent *id, const KeyRow *row)
{
	KeyRow		latest;

	if (keys_fetch(id, true, &latest) && latest.status == row->status &&
		latest.has_token == row->has_token &&
		(!row->has_token ||
		 memcmp(&latest.token, &row->token, sizeof(pg_uuid_t)) == 0))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("could not serialize access to idempotency key \"%s\"",
					id->key),
			 errdetail("The key's reservation was completed, released or taken over by a transaction that committed after this transaction's snapshot was taken."),
			 errhint("Retry the whole transaction: the retry will see the key and get its answer.")));
}

/*
 * One attempt at reserving, with the key's lock held.  The row is read
 * first, with one direct probe: a replay costs only that, a new key that
 * and a plain INSERT.  Under REPEATABLE READ a key not visible to the
 * snapshot is looked up again with the latest snapshot, so that a key
 * committed after the snapshot is reported with a hint instead of as a
 * unique violation.  An expired row the reaper deletes under us is read
 * again (at most RESERVE_ATTEMPTS times).
 */
static bool
reserve_attempt(KeyIdent *id, const uint8 *fingerprint, Interval *ttl,
				Interval *lock_timeout, const ScopePolicy *policy,
				TimestampTz now, ReserveAnswer *ans)
{
	bool		xact_snapshot = IsolationUsesXactSnapshot();
	Datum		newvalues[7];
	bytea	   *fp;
	pg_uuid_t  *token;
	TimestampTz expires_at;
	int			attempt;
	bool		admitted = false;	/* by the scope's rate and quota */

	fp = (bytea *) palloc(VARHDRSZ + IDEM_FINGERPRINT_LEN);
	SET_VARSIZE(fp, VARHDRSZ + IDEM_FINGERPRINT_LEN);
	memcpy(VARDATA(fp), fingerprint, IDEM_FINGERPRINT_LEN);
	/* the token is drawn only when a row is written (not for a replay) */
	token = (pg_uuid_t *) palloc0(sizeof(pg_uuid_t));
	expires_at = keys_add_interval(now, ttl);
	if (expires_at <= now)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ttl must be positive"),
				 errdetail("Added to the current time, the ttl gives a time that is not in the future."),
				 errhint("Pass how long the key must be kept without negative parts, for example interval '1 day'.")));

	memcpy(newvalues, id->values, sizeof(id->values));
	newvalues[3] = PointerGetDatum(fp);
	newvalues[4] = UUIDPGetDatum(token);
	newvalues[5] = TimestampTzGetDatum(now);
	newvalues[6] = TimestampTzGetDatum(expires_at);

	for (attempt = 0; attempt < RESERVE_ATTEMPTS; attempt++)
	{
		KeyRow		row;
		bool		found;

		found = keys_fetch(id, false, &row);
		if (!found && xact_snapshot)
		{
			if (keys_fetch(id, true, &row))
				ereport(ERROR,
						(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
						 errmsg("could not serialize access to idempotency key \"%s\"",
								id->key),
						 errdetail("The key was reserved by a transaction that committed after this transaction's snapshot was taken."),
						 errhint("Retry the whole transaction: the retry will see the key and get its answer.")));
		}
		if (found && xact_snapshot &&
			row.status == status_oids[STATUS_PROCESSING])
			reserve_check_latest(id, &row);
		if (!found)
		{
			if (reserve_rate_limited(id, policy, now, ans, &admitted))
				return false;
			idem_new_token(token);
			if (held_defer(id, newvalues))
				ans->held = true;
			else
				reserve_insert(newvalues);
			ans->outcome = OUTCOME_CREATED;
			ans->has_token = true;
			ans->token = *token;
			ans->has_expires_at = true;
			ans->expires_at = expires_at;
			return true;
		}
		switch (reserve_decide(id, &row, fingerprint, newvalues,
							   lock_timeout, policy, now, ans, &admitted))
		{
			case DECIDED_READ:
				return false;
			case DECIDED_WROTE:
				return true;
			case DECIDED_READ_AGAIN:
				memset(ans, 0, sizeof(*ans));
				break;
		}
	}
	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("could not reserve idempotency key \"%s\"", id->key),
			 errdetail("The key was deleted concurrently %d times while being renewed.",
					   RESERVE_ATTEMPTS),
			 errhint("Retry the transaction.")));
	return false;				/* keep compiler quiet */
}

/*
 * The answer as an idempotency.reservation, by position (the order is
 * checked when the cache loads: keys_check_reservation_type).
 */
static Datum
reserve_answer_datum(ReserveAnswer *ans)
{
	Datum		values[9];
	bool		nulls[9];
	HeapTuple	tuple;

	memset(nulls, 0, sizeof(nulls));
	values[0] = ObjectIdGetDatum(outcome_oids[ans->outcome]);
	values[1] = Int32GetDatum(ans->http_status);
	nulls[1] = ans->http_status == 0;
	values[2] = Int32GetDatum(ans->response_code);
	nulls[2] = !ans->has_response_code;
	values[3] = ans->body;
	nulls[3] = !ans->has_body;
	values[4] = ans->headers;
	nulls[4] = !ans->has_headers;
	values[5] = Int32GetDatum(ans->retry_after);
	nulls[5] = ans->retry_after == 0;
	values[6] = ans->recovery_point;
	nulls[6] = !ans->has_recovery_point;
	values[7] = UUIDPGetDatum(&ans->token);
	nulls[7] = !ans->has_token;
	values[8] = TimestampTzGetDatum(ans->expires_at);
	nulls[8] = !ans->has_expires_at;
	tuple = heap_form_tuple(reservation_desc, values, nulls);
	return HeapTupleGetDatum(tuple);
}

static void
reserve_count(KeyIdent *id, ReserveOutcome outcome)
{
	static const IdemCounter counters[OUTCOME_COUNT] = {
		IDEM_STAT_CREATED, IDEM_STAT_REPLAYED, IDEM_STAT_IN_PROGRESS,
		IDEM_STAT_MISMATCHED, IDEM_STAT_STALE, IDEM_STAT_RATE_LIMITED
	};

	idem_stats_count(id->tenant, id->scope, counters[outcome], 1);
}

/*
 * The checks of idem_reserve's arguments after the key's identity, all
 * before anything is read or written: exactly one of request and
 * fingerprint, their sizes, ttl and wait.  Sets *from_request, copies a
 * given fingerprint into "fingerprint", and returns ttl (NULL when not
 * given) and wait.
 */
static void
reserve_check_args(FunctionCallInfo fcinfo, int request_arg,
				   int fingerprint_arg, bool *from_request,
				   uint8 *fingerprint, Interval **ttl_arg, int64 *wait_usecs)
{
	*ttl_arg = NULL;
	*wait_usecs = 0;
	*from_request = request_arg >= 0 && !PG_ARGISNULL(request_arg);
	if (*from_request == (fingerprint_arg >= 0 && !PG_ARGISNULL(fingerprint_arg)))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg(*from_request ?
						"request and fingerprint must not both be given" :
						"request or fingerprint must be given"),
				 errhint("Pass the request body as request, or its SHA-256 as fingerprint => idem_fingerprint(body), not both.")));
	if (*from_request)
	{
		/*
		 * idempotency.max_request_size counts the canonical text, known once
		 * the fingerprint is computed (in reserve_common).  A jsonb takes a
		 * few times its text at most (four to six for an array of small
		 * numbers), so one over eight times the limit is refused without
		 * being read.
		 */
		Size		size = keys_datum_size(fcinfo, request_arg);

		if (size / 8 > (Size) idem_max_request_size)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("request is too large to fingerprint"),
					 errdetail("The request takes %zu bytes as jsonb, more than eight times idempotency.max_request_size (%d bytes).",
							   size, idem_max_request_size),
					 errhint("Send a smaller request, or raise idempotency.max_request_size.")));
	}
	else
	{
		bytea	   *fp = PG_GETARG_BYTEA_PP(fingerprint_arg);

		if (VARSIZE_ANY_EXHDR(fp) != IDEM_FINGERPRINT_LEN)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("fingerprint must be %d bytes long", IDEM_FINGERPRINT_LEN),
					 errdetail("The fingerprint is %d bytes long.",
							   (int) VARSIZE_ANY_EXHDR(fp)),
					 errhint("Pass a SHA-256 digest, for example idem_fingerprint(request).")));
		memcpy(fingerprint, VARDATA_ANY(fp), IDEM_FINGERPRINT_LEN);
	}
	if (!PG_ARGISNULL(4))
	{
		int64		ttl_usecs;

		*ttl_arg = PG_GETARG_INTERVAL_P(4);
		ttl_usecs = keys_interval_usecs(*ttl_arg);
		if (ttl_usecs <= 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("ttl must be positive"),
					 errhint("Pass how long the key must be kept, for example interval '1 day', or NULL for the scope's default.")));
		if (ttl_usecs > MAX_TTL_USECS)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("ttl must be at most 1000 years"),
					 errhint("Pass how long the key must be kept, for example interval '1 day', or NULL for the scope's default.")));
	}
	if (!PG_ARGISNULL(5))
	{
		*wait_usecs = keys_interval_usecs(PG_GETARG_INTERVAL_P(5));
		if (*wait_usecs < 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("wait must not be negative"),
					 errhint("Pass how long to wait for a concurrent attempt, for example interval '2 seconds', or 0 not to wait.")));
		if (*wait_usecs > MAX_WAIT_USECS)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("wait must be at most 1 day"),
					 errhint("Pass how long to wait for a concurrent attempt, for example interval '2 seconds'; use statement_timeout to bound the whole statement.")));
	}
}

/*
 * The last answer of idem_reserve, kept while the row it was made for is
 * evaluated.  SELECT (idem_reserve(...)).* calls it nine times for one
 * row (idem_row_repeat).  After a "created", every later call would find
 * the key held by this transaction and answer in_progress, and the row
 * would mix the two answers (created, 409, no lock_token); after a
 * rate_limited, a later call could be admitted; each would wait its "wait"
 * again.  A repeat for the same key and fingerprint is the same request:
 * it gets the same answer, and counts nothing.  Replays and mismatches,
 * read from the key's row, are not kept: each call reads the same answer
 * again (and counts it), and the replay path stays as short as it was.
 */
typedef struct RowAnswer
{
	IdemRowMark mark;			/* mark.cxt holds "answer" */
	uint64		hash;			/* the key's (keys_hash) */
	uint8		fingerprint[IDEM_FINGERPRINT_LEN];
	bool		created;		/* the answer holds the key with "token" */
	pg_uuid_t	token;
	Datum		answer;
} RowAnswer;

static RowAnswer row_answer;

/* Keep "answer" (from "ans"), made in "callcxt", the call's context. */
static void
row_answer_keep(FunctionCallInfo fcinfo, MemoryContext callcxt, uint64 hash,
				const uint8 *fingerprint, const ReserveAnswer *ans,
				Datum answer)
{
	/* answered by reading a row: every call gives the same answer */
	if (ans->outcome == OUTCOME_REPLAY || ans->outcome == OUTCOME_MISMATCH)
		return;
	idem_row_mark(&row_answer.mark, fcinfo, callcxt);
	row_answer.hash = hash;
	memcpy(row_answer.fingerprint, fingerprint, IDEM_FINGERPRINT_LEN);
	row_answer.created = ans->outcome == OUTCOME_CREATED;
	row_answer.token = ans->token;
	row_answer.answer = answer;
}

/*
 * The kept answer, copied, if this call is another column of the same
 * request (see RowAnswer) and, after a "created", the transaction still
 * holds the key.
 */
static bool
row_answer_again(FunctionCallInfo fcinfo, MemoryContext callcxt, uint64 hash,
				 KeyIdent *id, const uint8 *fingerprint, Datum *answer)
{
	HeldKey    *entry;
	MemoryContext oldcxt;

	if (row_answer.mark.cxt != callcxt || row_answer.hash != hash ||
		memcmp(row_answer.fingerprint, fingerprint, IDEM_FINGERPRINT_LEN) != 0)
		return false;
	if (row_answer.created)
	{
		entry = held_find(id);
		if (entry == NULL || entry->released ||
			memcmp(&entry->token, &row_answer.token, sizeof(pg_uuid_t)) != 0)
			return false;
	}
	if (!idem_row_repeat(&row_answer.mark, fcinfo, callcxt))
		return false;
	oldcxt = MemoryContextSwitchTo(callcxt);
	*answer = datumCopy(row_answer.answer, false, -1);
	MemoryContextSwitchTo(oldcxt);
	return true;
}

/*
 * Shared body of idem_reserve and of the entry points of version 1.0.
 * Arguments: tenant, scope, key, then the request (jsonb) at request_arg
 * and the fingerprint (bytea) at fingerprint_arg (-1 where the signature
 * has none; exactly one of them must be non-null), ttl at 4 and wait at 5.
 * Takes the key's lock (kept to the end of the transaction only when the
 * call wrote); writes the key's row for "created" and for a stale
 * reservation.  "row_answers": answer the calls of one row of a select list
 * as one (RowAnswer); not for the entry points of 1.0, which do not run
 * through idem_owner_enter and so are not counted as calls.
 */
static Datum
reserve_common(FunctionCallInfo fcinfo, int request_arg, int fingerprint_arg,
			   bool row_answers)
{
	KeyIdent	id;
	uint8		fingerprint[IDEM_FINGERPRINT_LEN];
	bool		from_request;
	Interval   *ttl_arg;
	Interval	ttl;
	Interval	lock_timeout;
	int64		wait_usecs;
	ScopePolicy policy;
	LOCKTAG		tag;
	TimestampTz now;
	TimestampTz deadline = 0;
	ReserveAnswer ans;
	MemoryContext callcxt = CurrentMemoryContext;
	MemoryContext spicxt;
	MemoryContext trycxt = NULL;
	Datum		result;
	long		sleep_ms = 10;

	keys_ident_from_args(fcinfo, &id);
	reserve_check_args(fcinfo, request_arg, fingerprint_arg, &from_request,
					   fingerprint, &ttl_arg, &wait_usecs);

	keys_ensure_cache();
	idem_spi_connect();
	spicxt = CurrentMemoryContext;

	keys_scope_policy(id.scope, &policy, true);
	if (from_request)
	{
		Size		text_len;

		text_len = idem_compute_fingerprint(PG_GETARG_JSONB_P(request_arg),
											policy.ignore, fingerprint);
		if (text_len > (Size) idem_max_request_size)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("request is too large to fingerprint"),
					 errdetail("The request's canonical JSON text takes %zu bytes; idempotency.max_request_size is %d bytes.",
							   text_len, idem_max_request_size),
					 errhint("Send a smaller request, or raise idempotency.max_request_size.")));
	}
	if (ttl_arg != NULL)
		ttl = *ttl_arg;
	else if (policy.has_ttl)
		ttl = policy.ttl;
	else
		ttl = idem_seconds_interval(idem_default_ttl);
	if (policy.has_lock_timeout)
		lock_timeout = policy.lock_timeout;
	else
		lock_timeout = idem_seconds_interval(idem_default_lock_timeout);

	keys_lock_tag(&tag, &id);
	if (row_answers &&
		row_answer_again(fcinfo, callcxt, KEYS_TAG_HASH(tag), &id,
						 fingerprint, &result))
	{
		SPI_finish();
		PG_RETURN_DATUM(result);
	}
	if (wait_usecs > 0)
		deadline = GetCurrentTimestamp() + wait_usecs;

	for (;;)
	{
		bool		locked;
		bool		wrote;
		bool		mine;

		memset(&ans, 0, sizeof(ans));
		locked = reserve_claim_lock(&tag, deadline, &mine);

		/*
		 * As of now: after a wait, a reservation may have turned stale, and
		 * retry_after counts from here.
		 */
		now = GetCurrentTimestamp();
		if (!locked)
		{
			/*
			 * The lock is busy.  A finished or flagged key is answered from
			 * its row all the same (the holder may be another retry being
			 * answered); otherwise the holder's transaction is still open.
			 * (Waiting for the lock of a key turning stale, most likely held
			 * for an instant by another retry flagging it, would put this
			 * call in the lock graph: a session it waits for that waits for
			 * this transaction would fail with 40P01.)
			 */
			if (reserve_answer_finished(&id, fingerprint, &lock_timeout,
										&policy, now, &ans))
				break;
			ans.outcome = OUTCOME_IN_PROGRESS;
			ans.http_status = 409;
			ans.retry_after = 1;
			break;
		}
		wrote = reserve_attempt(&id, fingerprint, &ttl, &lock_timeout,
								&policy, now, &ans);
		if (!wrote)
		{
			keys_lock_release(&tag);
			if (!mine)
				keys_lock_given_back(&tag);
		}

		/*
		 * A committed reservation still at work: with time left to wait, look
		 * again (each statement sees newly committed rows only under READ
		 * COMMITTED).  Not one this transaction holds: it cannot finish while
		 * this call waits.
		 */
		if (ans.outcome == OUTCOME_IN_PROGRESS && deadline != 0 && !mine &&
			!IsolationUsesXactSnapshot() && GetCurrentTimestamp() < deadline)
		{
			reserve_sleep(deadline, &sleep_ms);

			/*
			 * Each further look in a memory context of its own, emptied
			 * before the next: a wait may last a day, some ten looks a
			 * second.  The last look's answer stays in it until SPI_finish.
			 */
			if (trycxt == NULL)
				trycxt = AllocSetContextCreate(spicxt, "idempotency reserve wait",
											   ALLOCSET_SMALL_SIZES);
			else
				MemoryContextReset(trycxt);
			MemoryContextSwitchTo(trycxt);
			continue;
		}
		break;
	}
	MemoryContextSwitchTo(spicxt);

	reserve_count(&id, ans.outcome);
	if (ans.outcome == OUTCOME_CREATED && !ans.held)
		held_remember(&id, &ans.token);

	MemoryContextSwitchTo(callcxt);
	result = reserve_answer_datum(&ans);
	if (row_answers)
		row_answer_keep(fcinfo, callcxt, KEYS_TAG_HASH(tag), fingerprint,
						&ans, result);
	SPI_finish();
	PG_RETURN_DATUM(result);
}

/*
 * idem_reserve(tenant, scope, key, request jsonb, ttl, wait, fingerprint bytea)
 *		Reserve a key for a request.  The fingerprint is computed from the
 *		request minus the scope's fingerprint_ignore members, or given by
 *		the application (32 bytes) instead of the request.
 */
static Datum
idem_reserve_body(FunctionCallInfo fcinfo)
{
	return reserve_common(fcinfo, 3, 6, true);
}

/* As the owner of the function, search_path pinned (idem_owner_enter). */
Datum
idem_reserve(PG_FUNCTION_ARGS)
{
	return idem_call_as_owner(fcinfo, idem_reserve_body);
}

/*
 * The two overloads of version 1.0, (..., request jsonb, ttl, wait) and
 * (..., fingerprint bytea, ttl, wait): still exported so that a database
 * keeps working between installing this library and ALTER EXTENSION
 * idempotency UPDATE.
 */
Datum
idem_reserve_request(PG_FUNCTION_ARGS)
{
	return reserve_common(fcinfo, 3, -1, false);
}

Datum
idem_reserve_fingerprint(PG_FUNCTION_ARGS)
{
	return reserve_common(fcinfo, -1, 3, false);
}

/* ----------------------------------------------------------------
 * Completing, checkpointing and releasing
 * ----------------------------------------------------------------
 */

/*
 * Explain why a fenced write on the key matched no row: no reservation
 * (P0002), another attempt's lock token (55006; checked before the status,
 * since a superseded attempt must learn that it was superseded even when
 * the new holder has already finished), or already completed (55000).
 * Always raises.
 */
static void
keys_explain_no_match(KeyIdent *id, pg_uuid_t *token, const char *action)
{
	KeyRow		row;
	int			i;

	if (!keys_fetch(id, false, &row) && IsolationUsesXactSnapshot() &&
		keys_fetch(id, true, &row))
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not serialize access to idempotency key \"%s\"",
						id->key),
				 errdetail("The key was reserved by a transaction that committed after this transaction's snapshot was taken."),
				 errhint("Retry the whole transaction.")));
	if (!keys_fetch(id, false, &row))
		ereport(ERROR,
				(errcode(ERRCODE_NO_DATA_FOUND),
				 errmsg("idempotency key \"%s\" has no reservation to %s",
						id->key, action),
				 errdetail("No key \"%s\" exists in scope \"%s\" for this tenant.",
						   id->key, id->scope),
				 strcmp(action, "resolve") == 0 ?
				 errhint("Check the tenant, scope and key: idempotency.keys lists the keys flagged needs_reconciliation; this one may have been released, or reaped once it expired.") :
				 errhint("Call idem_reserve() first and do the work only when it answers \"created\"; the reservation may also have been released or have expired.")));
	if (token != NULL &&
		(!row.has_token || memcmp(row.token.data, token->data, UUID_LEN) != 0))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_IN_USE),
				 errmsg("lock_token does not match the reservation of idempotency key \"%s\"",
						id->key),
				 errdetail("The reservation holds another lock_token: a later attempt took it over after its lock timed out, or this token is not the one idem_reserve() gave for this key."),
				 errhint("Pass the lock_token that idem_reserve() returned for this key; an attempt that was taken over must stop without storing its result, since the attempt holding the new lock_token finishes the key.")));
	if (row.status != status_oids[STATUS_PROCESSING])
	{
		const char *label = "completed";

		for (i = 0; i < STATUS_COUNT; i++)
			if (row.status == status_oids[i])
				label = status_labels[i];
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idempotency key \"%s\" is already completed", id->key),
				 errdetail("Its status is \"%s\" and its response is stored.",
						   label),
				 errhint("A key is completed once; a retry gets the stored response from idem_reserve().")));
	}
	elog(ERROR, "idempotency key \"%s\" matched no reservation to %s", id->key, action);
}

/*
 * The lock token a fenced write on the key must match: the one passed, or,
 * when none was, the one of the reservation this transaction made itself.
 * A reservation that committed in another transaction cannot be written
 * without its token (55006); no reservation at all is P0002, a finished
 * one 55000.  Call with the key's lock held.
 */
static pg_uuid_t *
keys_fence_token(KeyIdent *id, pg_uuid_t *token, const char *action)
{
	KeyRow		row;

	if (token != NULL)
		return token;
	token = held_token(id);
	if (token != NULL)
		return token;
	if (keys_fetch(id, false, &row) &&
		row.status == status_oids[STATUS_PROCESSING])
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_IN_USE),
				 errmsg("lock_token is required to %s idempotency key \"%s\"",
						action, id->key),
				 errdetail("The key was reserved by another transaction, which committed its reservation."),
				 errhint("Pass the lock_token that idem_reserve() returned to the attempt holding the key.")));
	keys_explain_no_match(id, NULL, action);
	return NULL;				/* keep compiler quiet */
}

/* Lock a key for a write, waiting for a concurrent holder like any lock. */
static void
keys_lock_wait(KeyIdent *id)
{
	LOCKTAG		tag;

	keys_lock_tag(&tag, id);
	idem_lock_wait(&tag);
}

/*
 * Delete the processing reservation of a key (fenced by "token" when set)
 * and count the release; a miss raises what keys_explain_no_match says.
 */
static void
keys_delete_reservation(KeyIdent *id, pg_uuid_t *token, const char *action)
{
	Oid			argtypes[4] = {TEXTOID, TEXTOID, TEXTOID, UUIDOID};
	Datum		values[4];
	char		nulls[4] = "    ";
	HeldKey    *pending = held_pending(id);

	if (pending != NULL)
	{
		/* this transaction's pending reservation: nothing was written */
		if (token == NULL ||
			memcmp(token->data, pending->token.data, UUID_LEN) == 0)
		{
			held_consume(pending);
			held_forget(id);
			idem_stats_count(id->tenant, id->scope, IDEM_STAT_RELEASED, 1);
			return;
		}
		held_flush(pending);
	}
	idem_saved_plan(&plan_delete,
					"DELETE FROM idempotency.keys" KEY_WHERE
					" AND status OPERATOR(pg_catalog.=) 'processing'"
					" AND ($4::pg_catalog.uuid IS NULL OR lock_token OPERATOR(pg_catalog.=) $4)",
					4, argtypes, 0);
	memcpy(values, id->values, sizeof(id->values));
	values[3] = UUIDPGetDatum(token);
	nulls[3] = token == NULL ? 'n' : ' ';
	idem_spi_execute(plan_delete, values, nulls, false, 0);
	if (SPI_processed == 0)
		keys_explain_no_match(id, token, action);
	held_forget(id);
	idem_stats_count(id->tenant, id->scope, IDEM_STAT_RELEASED, 1);
}

/*
 * Complete this transaction's pending reservation: its row is inserted
 * once, finished, as the UPDATE of keys_store_or_release would leave it.
 */
static void
keys_insert_finished(HeldKey *pending, bool succeeded, int32 code,
					 Datum body, bool body_null, Datum headers,
					 bool headers_null)
{
	Oid			argtypes[12] = {TEXTOID, TEXTOID, TEXTOID, BYTEAOID, BOOLOID,
		UUIDOID, TIMESTAMPTZOID, INT4OID, JSONBOID, JSONBOID, TIMESTAMPTZOID,
	TIMESTAMPTZOID};
	Datum		values[12];
	char		nulls[12];
	Datum		cols[KEYS_ATT_COUNT];
	bool		colnulls[KEYS_ATT_COUNT];
	TimestampTz completed_at = GetCurrentTimestamp();
	TimestampTz expires_at = pending->expires_at;

	held_row(pending, cols, colnulls);
	cols[KEYS_ATT_STATUS] =
		ObjectIdGetDatum(status_oids[succeeded ? STATUS_SUCCEEDED : STATUS_FAILED]);
	cols[KEYS_ATT_RESPONSE_CODE] = Int32GetDatum(code);
	colnulls[KEYS_ATT_RESPONSE_CODE] = false;
	cols[KEYS_ATT_RESPONSE_BODY] = body;
	colnulls[KEYS_ATT_RESPONSE_BODY] = body_null;
	cols[KEYS_ATT_RESPONSE_HEADERS] = headers;
	colnulls[KEYS_ATT_RESPONSE_HEADERS] = headers_null;
	cols[KEYS_ATT_COMPLETED_AT] = TimestampTzGetDatum(completed_at);
	colnulls[KEYS_ATT_COMPLETED_AT] = false;
	/* KEYS_EXPIRY_AT_COMPLETION: a transaction that outlasted the ttl */
	if (expires_at <= completed_at)
		expires_at = completed_at + (pending->expires_at - pending->locked_at);
	cols[KEYS_ATT_EXPIRES_AT] = TimestampTzGetDatum(expires_at);
	if (keys_insert_row(cols, colnulls))
	{
		held_consume(pending);
		return;
	}

	idem_saved_plan(&plan_insert_done,
					"INSERT INTO idempotency.keys"
					" (tenant_id, scope, idem_key, fingerprint, status,"
					" lock_token, locked_at, created_at, response_code,"
					" response_body, response_headers, completed_at, expires_at)"
					" VALUES ($1, $2, $3, $4, CASE WHEN $5"
					" THEN 'succeeded'::idempotency.status"
					" ELSE 'failed'::idempotency.status END,"
					" $6, $7, $7, $8, $9, $10, $11, $12)",
					12, argtypes, 0);
	memset(nulls, ' ', sizeof(nulls));
	memcpy(values, pending->ident, sizeof(pending->ident));
	values[3] = PointerGetDatum(pending->fingerprint);
	values[4] = BoolGetDatum(succeeded);
	values[5] = UUIDPGetDatum(&pending->token);
	values[6] = TimestampTzGetDatum(pending->locked_at);
	values[7] = Int32GetDatum(code);
	values[8] = body;
	nulls[8] = body_null ? 'n' : ' ';
	values[9] = headers;
	nulls[9] = headers_null ? 'n' : ' ';
	values[10] = TimestampTzGetDatum(completed_at);
	values[11] = TimestampTzGetDatum(expires_at);
	idem_spi_execute(plan_insert_done, values, nulls, false, 0);
	held_consume(pending);
}

/*
 * KEYS_EXPIRY_AT_COMPLETION: a key finished (completed, or resolved by an
 * operator) at or after its expires_at would be stored expired, reaped at
 * the next run and answered "created" to the client's retry, which would
 * run the request again: its expires_at moves to the time it finished plus
 * its ttl (expires_at - created_at).  A key finished in time keeps its
 * expires_at, so a two-phase completion stays a HOT update.  After the
 * completing UPDATE, whose RETURNING row is in SPI_tuptable: the new time
 * is computed here and written by a second UPDATE, only when it is needed
 * (Citus refuses a STABLE function of a column in an UPDATE).
 */
static void
keys_expiry_at_completion(KeyIdent *id, TimestampTz completed_at)
{
	Oid			argtypes[4] = {TEXTOID, TEXTOID, TEXTOID, TIMESTAMPTZOID};
	Datum		values[4];
	bool		expires_null;
	bool		created_null;
	TimestampTz expires_at;
	TimestampTz created_at;

	if (SPI_processed != 1)
		return;
	expires_at = DatumGetTimestampTz(SPI_getbinval(SPI_tuptable->vals[0],
												   SPI_tuptable->tupdesc, 1,
												   &expires_null));
	created_at = DatumGetTimestampTz(SPI_getbinval(SPI_tuptable->vals[0],
												   SPI_tuptable->tupdesc, 2,
												   &created_null));
	if (expires_null || created_null || expires_at > completed_at)
		return;
	idem_saved_plan(&plan_set_expiry,
					"UPDATE idempotency.keys SET expires_at = $4" KEY_WHERE,
					4, argtypes, 0);
	memcpy(values, id->values, sizeof(id->values));
	values[3] = TimestampTzGetDatum(completed_at + (expires_at - created_at));
	idem_spi_execute(plan_set_expiry, values, NULL, false, 0);
}

/*
 * Whether a response with status "code" releases a key of a scope with
 * "policy" instead of being stored: a code the scope lists in
 * retryable_codes, or a 5xx the scope does not cache.
 */
static bool
keys_policy_releases(const ScopePolicy *policy, int32 code)
{
	Assert(code >= 100 && code <= 599);
	return (policy->retryable[RETRYABLE_WORD(code)] &
			RETRYABLE_BIT(code)) != 0 ||
		(code >= 500 && !policy->cache_server_errors);
}

/* (scope text, code int4) → bool: see idem_complete_stores. */
static Datum
keys_complete_stores_body(FunctionCallInfo fcinfo)
{
	char	   *scope = text_to_cstring(PG_GETARG_TEXT_PP(0));
	ScopePolicy policy;

	keys_ensure_cache();
	idem_spi_connect();
	keys_scope_policy(scope, &policy, false);
	SPI_finish();
	PG_RETURN_BOOL(!keys_policy_releases(&policy, PG_GETARG_INT32(1)));
}

/*
 * Whether idem_complete stores a response with status "code" for a key of
 * "scope" (a text datum), false when it releases the key.  For
 * idem_execute, which passes its own FmgrInfo: the scope's policy is read
 * as the owner of that function, the extension's owner.  A code outside
 * 100-599 counts as stored: idem_complete refuses it.
 */
bool
idem_complete_stores(FmgrInfo *flinfo, Datum scope, int32 code)
{
	LOCAL_FCINFO(call, 2);

	if (code < 100 || code > 599)
		return true;
	InitFunctionCallInfoData(*call, flinfo, 2, InvalidOid, NULL, NULL);
	call->args[0].value = scope;
	call->args[0].isnull = false;
	call->args[1].value = Int32GetDatum(code);
	call->args[1].isnull = false;
	return DatumGetBool(idem_call_as_owner(call, keys_complete_stores_body));
}

/*
 * Store the response of a processing key, or delete the reservation: when
 * the caller says the failure is retryable, for a status code the scope
 * lists in retryable_codes, and for a 5xx the scope does not cache.  With
 * "token" set, only the reservation holding that lock token matches
 * (fencing).  Returns the new status, or InvalidOid when the reservation
 * was released.
 */
static Oid
keys_store_or_release(KeyIdent *id, int32 code, Datum body, bool body_null,
					  Datum headers, bool headers_null, bool retryable,
					  pg_uuid_t *token, const char *action)
{
	Datum		values[9];
	char		nulls[9];
	ScopePolicy policy;

	memcpy(values, id->values, sizeof(id->values));
	memset(nulls, ' ', sizeof(nulls));

	/* completing needs no fingerprint_ignore: no copy of it */
	keys_scope_policy(id->scope, &policy, false);
	if (!retryable)
		retryable = keys_policy_releases(&policy, code);
	if (retryable)
	{
		keys_delete_reservation(id, token, action);
		return InvalidOid;
	}

	{
		Oid			argtypes[9] = {TEXTOID, TEXTOID, TEXTOID, BOOLOID, INT4OID,
		JSONBOID, JSONBOID, TIMESTAMPTZOID, UUIDOID};
		bool		succeeded = code < 400;
		HeldKey    *pending = held_pending(id);
		TimestampTz completed_at;

		if (pending != NULL &&
			(token == NULL ||
			 memcmp(token->data, pending->token.data, UUID_LEN) == 0))
		{
			keys_insert_finished(pending, succeeded, code, body, body_null,
								 headers, headers_null);
			idem_stats_count(id->tenant, id->scope, IDEM_STAT_COMPLETED, 1);
			return status_oids[succeeded ? STATUS_SUCCEEDED : STATUS_FAILED];
		}
		if (pending != NULL)
			held_flush(pending);
		idem_saved_plan(&plan_complete,
						"UPDATE idempotency.keys SET"
						" status = CASE WHEN $4 THEN 'succeeded'::idempotency.status"
						" ELSE 'failed'::idempotency.status END,"
						" response_code = $5, response_body = $6,"
						" response_headers = $7, completed_at = $8,"
						" needs_reconciliation = false" KEY_WHERE
						" AND status OPERATOR(pg_catalog.=) 'processing'"
						" AND ($9::pg_catalog.uuid IS NULL OR lock_token OPERATOR(pg_catalog.=) $9)"
						" RETURNING expires_at, created_at",
						9, argtypes, 0);
		values[3] = BoolGetDatum(succeeded);
		values[4] = Int32GetDatum(code);
		values[5] = body;
		nulls[5] = body_null ? 'n' : ' ';
		values[6] = headers;
		nulls[6] = headers_null ? 'n' : ' ';
		completed_at = GetCurrentTimestamp();
		values[7] = TimestampTzGetDatum(completed_at);
		values[8] = UUIDPGetDatum(token);
		nulls[8] = token == NULL ? 'n' : ' ';
		idem_spi_execute(plan_complete, values, nulls, false, 0);
		if (SPI_processed == 0)
			keys_explain_no_match(id, token, action);
		keys_expiry_at_completion(id, completed_at);
		idem_stats_count(id->tenant, id->scope, IDEM_STAT_COMPLETED, 1);
		return status_oids[succeeded ? STATUS_SUCCEEDED : STATUS_FAILED];
	}
}

/*
 * idem_complete(tenant, scope, key, response_code, response_body,
 *				 response_headers, lock_token, retryable)
 *		RETURNS idempotency.status
 *		Store the response of a reservation: 2xx/3xx succeeded, 4xx failed;
 *		released (NULL) when "retryable" is true, for a code the scope lists
 *		in retryable_codes, and for a 5xx unless the scope caches server
 *		errors.  Waits for the key's lock; writes the key's row.  The 1.0
 *		declaration has no "retryable" argument.
 */
static Datum
idem_complete_body(FunctionCallInfo fcinfo)
{
	KeyIdent	id;
	pg_uuid_t  *token = PG_ARGISNULL(6) ? NULL : PG_GETARG_UUID_P(6);
	bool		retryable = false;
	Oid			status;

	keys_ident_from_args(fcinfo, &id);
	keys_check_response(fcinfo, 3, 4, 5);
	if (PG_NARGS() > 7)
	{
		if (PG_ARGISNULL(7))
			idem_null_argument("retryable");
		retryable = PG_GETARG_BOOL(7);
	}

	/*
	 * complete, checkpoint and release write the key's row: in a read-only
	 * transaction they fail as their UPDATE or DELETE would, also when the
	 * row is still this transaction's pending reservation (nothing written
	 * yet).  A reservation made before SET TRANSACTION READ ONLY is still
	 * written at commit, as a row inserted before it would be.
	 */
	idem_require_writable("idem_complete()");

	keys_ensure_cache();
	idem_spi_connect();
	keys_lock_wait(&id);
	token = keys_fence_token(&id, token, "complete");
	status = keys_store_or_release(&id, PG_GETARG_INT32(3),
								   PG_GETARG_DATUM(4), PG_ARGISNULL(4),
								   PG_GETARG_DATUM(5), PG_ARGISNULL(5),
								   retryable, token, "complete");
	/* the transaction proved it holds the key: the guard lets it write */
	if (OidIsValid(status))
		held_remember(&id, token);
	SPI_finish();
	if (!OidIsValid(status))
		PG_RETURN_NULL();
	PG_RETURN_OID(status);
}

/* As the owner of the function, search_path pinned (idem_owner_enter). */
Datum
idem_complete(PG_FUNCTION_ARGS)
{
	return idem_call_as_owner(fcinfo, idem_complete_body);
}

/*
 * idem_resolve(tenant, scope, key, response_code, response_body)
 *		Operator's end of a reconciliation: store the outcome found for a
 *		processing key, whoever holds it, as idem_complete would, and clear
 *		needs_reconciliation.  Waits for the key's lock; writes its row.
 */
static Datum
idem_resolve_body(PG_FUNCTION_ARGS)
{
	KeyIdent	id;
	Oid			status;

	keys_ident_from_args(fcinfo, &id);
	keys_check_response(fcinfo, 3, 4, -1);

	keys_ensure_cache();
	idem_spi_connect();
	keys_lock_wait(&id);
	status = keys_store_or_release(&id, PG_GETARG_INT32(3),
								   PG_GETARG_DATUM(4), PG_ARGISNULL(4),
								   (Datum) 0, true, false, NULL, "resolve");
	SPI_finish();
	if (!OidIsValid(status))
		PG_RETURN_NULL();
	PG_RETURN_OID(status);
}

/* As the owner of the function, search_path pinned (idem_owner_enter). */
Datum
idem_resolve(PG_FUNCTION_ARGS)
{
	return idem_call_as_owner(fcinfo, idem_resolve_body);
}

/*
 * idem_checkpoint(tenant, scope, key, recovery_point, lock_token)
 *		Record how far a two-phase attempt has got, and renew its lock
 *		(locked_at): an attempt that checkpoints is alive.  Waits for the
 *		key's lock; writes its row.
 */
static Datum
idem_checkpoint_body(PG_FUNCTION_ARGS)
{
	KeyIdent	id;
	Oid			argtypes[6] = {TEXTOID, TEXTOID, TEXTOID, TEXTOID,
	TIMESTAMPTZOID, UUIDOID};
	Datum		values[6];
	char		nulls[6] = "      ";
	pg_uuid_t  *token;

	keys_ident_from_args(fcinfo, &id);
	if (PG_ARGISNULL(3))
		idem_null_argument("recovery_point");
	token = PG_ARGISNULL(4) ? NULL : PG_GETARG_UUID_P(4);
	idem_require_writable("idem_checkpoint()");

	keys_ensure_cache();
	idem_spi_connect();
	keys_lock_wait(&id);
	held_flush_key(&id);
	token = keys_fence_token(&id, token, "checkpoint");
	idem_saved_plan(&plan_checkpoint,
					"UPDATE idempotency.keys SET recovery_point = $4, locked_at = $5,"
					" needs_reconciliation = false" KEY_WHERE " AND status OPERATOR(pg_catalog.=) 'processing'"
					" AND ($6::pg_catalog.uuid IS NULL OR lock_token OPERATOR(pg_catalog.=) $6)",
					6, argtypes, 0);
	memcpy(values, id.values, sizeof(id.values));
	values[3] = PG_GETARG_DATUM(3);

	/*
	 * The attempt is alive now, however long its transaction has run: a flag
	 * for reconciliation set while it seemed gone is cleared.
	 */
	values[4] = TimestampTzGetDatum(GetCurrentTimestamp());
	values[5] = UUIDPGetDatum(token);
	nulls[5] = ' ';
	idem_spi_execute(plan_checkpoint, values, nulls, false, 0);
	if (SPI_processed == 0)
		keys_explain_no_match(&id, token, "checkpoint");
	/* the transaction proved it holds the key: the guard lets it write */
	held_remember(&id, token);
	SPI_finish();
	PG_RETURN_VOID();
}

/* As the owner of the function, search_path pinned (idem_owner_enter). */
Datum
idem_checkpoint(PG_FUNCTION_ARGS)
{
	return idem_call_as_owner(fcinfo, idem_checkpoint_body);
}

/*
 * idem_release(tenant, scope, key, lock_token)
 *		Give a reservation up without caching anything: the row is deleted
 *		and a retry runs afresh.  Waits for the key's lock; deletes its row.
 */
static Datum
idem_release_body(PG_FUNCTION_ARGS)
{
	KeyIdent	id;
	pg_uuid_t  *token;

	keys_ident_from_args(fcinfo, &id);
	token = PG_ARGISNULL(3) ? NULL : PG_GETARG_UUID_P(3);
	idem_require_writable("idem_release()");

	keys_ensure_cache();
	idem_spi_connect();
	keys_lock_wait(&id);
	token = keys_fence_token(&id, token, "release");
	keys_delete_reservation(&id, token, "release");
	SPI_finish();
	PG_RETURN_VOID();
}

/* As the owner of the function, search_path pinned (idem_owner_enter). */
Datum
idem_release(PG_FUNCTION_ARGS)
{
	return idem_call_as_owner(fcinfo, idem_release_body);
}

/*
 * idem_lookup(tenant, scope, key) RETURNS TABLE (...)
 *		The key's row, if any, as it is now; no lock, no write.  The columns
 *		are those of the function's result, by name; lock_token is never
 *		returned (whoever may look a key up must not be able to complete
 *		another attempt's reservation with it).
 */
static Datum
idem_lookup_body(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	KeyIdent	id;
	Oid			argtypes[3] = {TEXTOID, TEXTOID, TEXTOID};
	bool		flushed;

	keys_ident_from_args(fcinfo, &id);
	InitMaterializedSRF(fcinfo, 0);

	/*
	 * The cache first: a reservation held in a keys table dropped since (the
	 * extension dropped and created again in this transaction) belongs to
	 * that table, and is not written into it or into the new one
	 */
	keys_ensure_cache();
	idem_spi_connect();
	flushed = held_flush_key(&id);
	idem_saved_plan(&plan_lookup,
					"SELECT * FROM idempotency.keys" KEY_WHERE,
					3, argtypes, 0);
	/* a row this call wrote needs a snapshot of its own to be seen */
	idem_spi_execute(plan_lookup, id.values, NULL, !flushed, 0);
	if (SPI_processed > 0)
	{
		TupleDesc	outdesc = rsinfo->setDesc;
		Datum	   *values = palloc(outdesc->natts * sizeof(Datum));
		bool	   *nulls = palloc(outdesc->natts * sizeof(bool));
		int			i;

		for (i = 0; i < outdesc->natts; i++)
		{
			Form_pg_attribute att = TupleDescAttr(outdesc, i);
			int			col = SPI_fnumber(SPI_tuptable->tupdesc,
										  NameStr(att->attname));

			if (att->attisdropped || col <= 0 ||
				strcmp(NameStr(att->attname), "lock_token") == 0)
			{
				values[i] = (Datum) 0;
				nulls[i] = true;
				continue;
			}
			values[i] = SPI_getbinval(SPI_tuptable->vals[0],
									  SPI_tuptable->tupdesc, col, &nulls[i]);
		}
		tuplestore_putvalues(rsinfo->setResult, outdesc, values, nulls);
	}
	SPI_finish();
	return (Datum) 0;
}

/* As the owner of the function, search_path pinned (idem_owner_enter). */
Datum
idem_lookup(PG_FUNCTION_ARGS)
{
	return idem_call_as_owner(fcinfo, idem_lookup_body);
}
