/*-------------------------------------------------------------------------
 *
 * idempotency.c
 *	  Module entry point of the idempotency extension: the module magic,
 *	  _PG_init and the configuration parameters (GUCs) every other file
 *	  reads.
 *
 * Shared memory for the statistics counters is requested by stats.c, which
 * is initialised from here; it exists only when the library is listed in
 * shared_preload_libraries.
 *
 * IDENTIFICATION
 *	  idempotency.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/namespace.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/fmgroids.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "idempotency.h"

PG_MODULE_MAGIC;

char	   *idem_session_tenant = NULL;
bool		idem_loaded_at_startup = false;

void		_PG_init(void);

PG_FUNCTION_INFO_V1(idem_bind_tenant);
PG_FUNCTION_INFO_V1(idem_unbind_tenant);

/*
 * idem_saved_plan
 *		Every statement the extension runs is prepared once per backend with
 *		its parameters and kept (SPI_keepplan): no string is ever built into
 *		SQL, and no call re-parses or re-plans from scratch.
 */
SPIPlanPtr
idem_saved_plan(SPIPlanPtr *cache, const char *sql, int nargs, Oid *argtypes,
				int cursor_options)
{
	SPIPlanPtr	plan;

	if (idem_citus_pass_active)
		return idem_citus_pass_plan(cache, sql, nargs, argtypes,
									cursor_options);
	if (*cache != NULL)
		return *cache;

	/*
	 * On Citus a statement over a distributed table runs through Citus's
	 * local execution on the node holding the shard, which keeps a copy of
	 * each run in a generic plan's memory for the life of the plan (tens of
	 * kilobytes per call, without bound); a custom plan is freed after each
	 * run.
	 */
	if (idem_citus_custom_plans())
		cursor_options |= CURSOR_OPT_CUSTOM_PLAN;
	plan = SPI_prepare_cursor(sql, nargs, argtypes, cursor_options);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed: %s",
			 SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "SPI_keepplan failed");
	*cache = plan;
	return plan;
}

/*
 * idem_new_token
 *		A version 4 UUID for a lock token or a lease token.
 *
 *		Tokens come from the strong random source, drawn TOKEN_BATCH at a
 *		time: each draw has a fixed cost (OpenSSL checks for a fork) that was
 *		a tenth of a new reservation's, and more than a lease's other work.
 *		The bytes of a draw are handed out once and never kept past it.  The
 *		buffer is filled in the backend, never before a fork.
 */
#define TOKEN_BATCH 32

void
idem_new_token(pg_uuid_t *token)
{
	static uint8 pool[TOKEN_BATCH * UUID_LEN];
	static int	pool_next = TOKEN_BATCH;

	if (pool_next >= TOKEN_BATCH)
	{
		if (!pg_strong_random(pool, sizeof(pool)))
			ereport(ERROR,
					(errcode(ERRCODE_INTERNAL_ERROR),
					 errmsg("could not generate a random token")));
		pool_next = 0;
	}
	memcpy(token->data, pool + pool_next * UUID_LEN, UUID_LEN);
	explicit_bzero(pool + pool_next * UUID_LEN, UUID_LEN);
	pool_next++;
	/* version 4, variant RFC 4122, as gen_random_uuid() */
	token->data[6] = (token->data[6] & 0x0f) | 0x40;
	token->data[8] = (token->data[8] & 0x3f) | 0x80;
}

/*
 * idempotency.new_lease_token() RETURNS uuid
 *		idem_new_token for SQL: the token each outbox lease writes.
 */
PG_FUNCTION_INFO_V1(idem_new_lease_token);

Datum
idem_new_lease_token(PG_FUNCTION_ARGS)
{
	pg_uuid_t  *token = palloc(sizeof(pg_uuid_t));

	idem_new_token(token);
	PG_RETURN_UUID_P(token);
}

/* ----------------------------------------------------------------
 * Tenant binding
 *
 * idempotency.tenant_bindings binds a role to one tenant.  The roles that
 * count are the session user, the current role outside any SECURITY
 * DEFINER function (what SET ROLE sets), and the role that calls the
 * function (the owner of a SECURITY DEFINER function the call is made
 * from, or of a table whose index functions ANALYZE or autovacuum run):
 * neither SET, RESET, naming another tenant nor code of its own run by
 * another login gets a bound role past it.  The binding of the three is
 * cached per backend and dropped when the table changes (relcache
 * invalidation) or one of them does.
 * ----------------------------------------------------------------
 */
static bool binding_valid = false;
static bool binding_loading = false;	/* a load began and did not finish */
static bool binding_callback_registered = false;
static Oid	binding_relid = InvalidOid;
static Oid	binding_session_user = InvalidOid;
static Oid	binding_outer_user = InvalidOid;
static char *binding_tenant = NULL; /* in TopMemoryContext; NULL: unbound */
static char *binding_role = NULL;	/* the bound role's name, for messages */
static bool binding_conflict = false;	/* two bindings to different tenants */
static bool binding_outer_confined = true;	/* see idem_require_role_confined */
static char *binding_session_tenant = NULL; /* the session user's, or NULL */
static Oid	binding_caller = InvalidOid;
static bool binding_caller_conflict = false;	/* the caller's and another's */
static bool binding_caller_shared = false;	/* idempotency_app's code, etc. */

/*
 * The entry points running now as their owner (idem_owner_enter), the
 * innermost last: the role each was called by, the owner it runs as, and
 * the (sub)transaction nesting level it was entered at.  An error unwinds
 * them without idem_owner_leave: the abort of a subtransaction drops those
 * entered in it, that of the transaction all (owner_scope_xact_callback).
 */
typedef struct OwnerScopeFrame
{
	Oid			caller;
	Oid			owner;
	int			nest_level;
} OwnerScopeFrame;

static OwnerScopeFrame *owner_scope_frames = NULL;	/* in TopMemoryContext */
static int	owner_scope_depth = 0;
static int	owner_scope_size = 0;

/*
 * The role whose rights the call was made with: inside an entry point
 * running as its owner, the current user before the switch; elsewhere
 * the current user.
 */
static Oid
binding_calling_user(void)
{
	Oid			current = GetUserId();

	if (owner_scope_depth > 0 &&
		current == owner_scope_frames[owner_scope_depth - 1].owner)
		return owner_scope_frames[owner_scope_depth - 1].caller;
	return current;
}

static void
binding_relcache_callback(Datum arg, Oid relid)
{
	(void) arg;
	if (relid == InvalidOid || relid == binding_relid)
		binding_valid = false;
}

/* ----------------------------------------------------------------
 * One relcache callback for the whole extension
 *
 * PostgreSQL keeps 10 relcache callbacks per backend (MAX_RELCACHE_CALLBACKS
 * in inval.c) for the server and every library loaded, and a backend that
 * registers one more dies (FATAL).  Citus takes five, so the extension's
 * caches (bindings, keys, outbox, Citus metadata) share one slot.
 * ----------------------------------------------------------------
 */
#define IDEM_RELCACHE_CALLBACKS 8

static RelcacheCallbackFunction idem_relcache_funcs[IDEM_RELCACHE_CALLBACKS];
static int	idem_relcache_nfuncs = 0;

static void
idem_relcache_dispatch(Datum arg, Oid relid)
{
	int			i;

	for (i = 0; i < idem_relcache_nfuncs; i++)
		idem_relcache_funcs[i] (arg, relid);
}

void
idem_register_relcache_callback(RelcacheCallbackFunction func)
{
	if (idem_relcache_nfuncs >= IDEM_RELCACHE_CALLBACKS)
		elog(ERROR, "idempotency: out of relcache callback slots");
	if (idem_relcache_nfuncs == 0)
		CacheRegisterRelcacheCallback(idem_relcache_dispatch, (Datum) 0);
	idem_relcache_funcs[idem_relcache_nfuncs++] = func;
}

/*
 * The tenant "role" is bound to, palloc'd, or NULL.  Read through the
 * primary key like a catalog, without the caller's privileges: every
 * function checks bindings, including those (the stats) that do not run
 * with the extension owner's rights.
 */
static char *
binding_of(Oid role, Oid indexid)
{
	Relation	rel;
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tuple;
	char	   *tenant = NULL;

	/* on Citus, this node's placement of the reference table */
	rel = table_open(idem_citus_local_relid(binding_relid), AccessShareLock);
	if (RelationGetRelid(rel) != binding_relid)
#if PG_VERSION_NUM >= 180000
		indexid = RelationGetPrimaryKeyIndex(rel, false);
#else
		indexid = RelationGetPrimaryKeyIndex(rel);
#endif
	ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(role));
	scan = systable_beginscan(rel, indexid, true, NULL, 1, &key);
	tuple = systable_getnext(scan);
	if (HeapTupleIsValid(tuple))
	{
		bool		isnull;
		Datum		d = heap_getattr(tuple, 2, RelationGetDescr(rel), &isnull);

		if (!isnull)
			tenant = TextDatumGetCString(d);
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return tenant;
}

/* Load the binding of the current session user, outer user and caller. */
static void
binding_load(void)
{
	Oid			session_user = GetSessionUserId();
	Oid			outer_user = GetOuterUserId();
	Oid			caller = binding_calling_user();
	Oid			nsp;
	Oid			indexid;
	char	   *tenant = NULL;
	char	   *role = NULL;
	bool		conflict = false;
	bool		caller_conflict = false;
	bool		caller_shared = false;
	bool		confined = true;

	/* a binding committed by another session since this call began */
	AcceptInvalidationMessages();
	if (binding_valid && !binding_loading &&
		session_user == binding_session_user &&
		outer_user == binding_outer_user &&
		caller == binding_caller)
		return;

	if (!binding_callback_registered)
	{
		idem_register_relcache_callback(binding_relcache_callback);
		binding_callback_registered = true;
	}
	nsp = get_namespace_oid("idempotency", false);
	binding_relid = get_relname_relid("tenant_bindings", nsp);
	indexid = get_relname_relid("tenant_bindings_pkey", nsp);
	if (!OidIsValid(binding_relid) || !OidIsValid(indexid))
	{
		/*
		 * Version 1.0 of the SQL objects: no bindings yet.  Not cached: no
		 * invalidation would reach this backend when ALTER EXTENSION UPDATE
		 * creates the table and a binding follows, and the role would stay
		 * unbound in this session.
		 */
		binding_valid = false;
		if (binding_tenant)
			pfree(binding_tenant);
		binding_tenant = NULL;
		binding_conflict = false;
		binding_caller_conflict = false;
		binding_caller_shared = false;
		binding_outer_confined = true;
		return;
	}

	/*
	 * Valid from before the read, so that an invalidation arriving while the
	 * table is read clears it; and loading until the read finished, so that a
	 * read that fails (a lock timeout or a cancel while the table is locked)
	 * is done again at the next call instead of leaving the binding cached
	 * before the change whose invalidation it consumed.
	 */
	binding_loading = true;
	binding_valid = true;

	tenant = binding_of(session_user, indexid);
	if (binding_session_tenant)
		pfree(binding_session_tenant);
	binding_session_tenant = tenant ?
		MemoryContextStrdup(TopMemoryContext, tenant) : NULL;
	if (tenant != NULL)
		role = GetUserNameFromId(session_user, false);
	if (outer_user != session_user)
	{
		char	   *outer_tenant = binding_of(outer_user, indexid);

		/* the current role alone holds the session to its binding */
		confined = tenant == NULL ||
			(outer_tenant != NULL && strcmp(tenant, outer_tenant) == 0);
		if (outer_tenant != NULL)
		{
			if (tenant != NULL && strcmp(tenant, outer_tenant) != 0)
				conflict = true;
			if (tenant == NULL)
				role = GetUserNameFromId(outer_user, false);
			tenant = outer_tenant;
		}
	}
	if (caller != session_user && caller != outer_user)
	{
		char	   *caller_tenant = binding_of(caller, indexid);

		/*
		 * Code owned by idempotency_app or idempotency_worker: every bound
		 * service is a member of one, and may give its code to it (ALTER ...
		 * OWNER TO), to run bound to no tenant in another login.
		 */
		caller_shared = caller == get_role_oid("idempotency_app", true) ||
			caller == get_role_oid("idempotency_worker", true);

		if (caller_tenant != NULL)
		{
			if (tenant == NULL)
			{
				role = GetUserNameFromId(caller, false);
				tenant = caller_tenant;
			}
			else if (strcmp(tenant, caller_tenant) != 0)
				caller_conflict = true;
		}
	}

	if (binding_tenant)
		pfree(binding_tenant);
	if (binding_role)
		pfree(binding_role);
	binding_tenant = tenant ? MemoryContextStrdup(TopMemoryContext, tenant) : NULL;
	binding_role = role ? MemoryContextStrdup(TopMemoryContext, role) : NULL;
	binding_conflict = conflict;
	binding_caller_conflict = caller_conflict;
	binding_caller_shared = caller_shared;
	binding_outer_confined = confined;
	binding_session_user = session_user;
	binding_outer_user = outer_user;
	binding_caller = caller;
	binding_loading = false;
}

/*
 * idem_require_role_confined
 *		Refuse (42501) when the session user is bound to a tenant and
 *		"role" (the current role taken with SET ROLE, or the owner of a
 *		SECURITY DEFINER function running) is not bound to the same tenant.
 *		On one node every function holds such a session to its binding; a
 *		node that sees only the current role (a Citus worker, running what
 *		the coordinator ships it as that role) cannot, so on Citus the
 *		coordinator runs no statement of such a session as that role.
 */
void
idem_require_role_confined(Oid role)
{
	bool		confined;

	binding_load();
	if (binding_session_tenant == NULL || role == GetSessionUserId())
		return;
	if (role == GetOuterUserId())
		confined = binding_outer_confined;
	else
	{
		char	   *tenant = binding_of(role,
										get_relname_relid("tenant_bindings_pkey",
														  get_namespace_oid("idempotency", false)));

		confined = tenant != NULL &&
			strcmp(tenant, binding_session_tenant) == 0;
	}
	if (!confined)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("role \"%s\" is bound to tenant \"%s\": on Citus its session cannot run statements as role \"%s\"",
						GetUserNameFromId(GetSessionUserId(), false),
						binding_session_tenant,
						GetUserNameFromId(role, false)),
				 errdetail("Citus runs statements on the workers as the current role alone, where the session's binding is not seen."),
				 errhint("RESET ROLE, or act as a role bound to tenant \"%s\" (SET ROLE, or the owner of a SECURITY DEFINER function).",
						 binding_session_tenant)));
}

/*
 * idem_bound_tenant
 *		The tenant the calling roles are bound to, or NULL.  A session whose
 *		session user and current role are bound to different tenants may
 *		act for neither (42501), nor may a call made by a role bound to
 *		another tenant than theirs.
 */
const char *
idem_bound_tenant(void)
{
	binding_load();
	if (binding_conflict)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("the session user and the current role are bound to different tenants"),
				 errhint("Connect as, or SET ROLE to, a role bound to the tenant to act for.")));
	if (binding_caller_shared)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("the call is made with the rights of role \"%s\"",
						GetUserNameFromId(binding_caller, false)),
				 errdetail("Role \"%s\" owns the SECURITY DEFINER function, or the table, the call comes from: a member bound to a tenant could give it code to run bound to none.",
						   GetUserNameFromId(binding_caller, false)),
				 errhint("The extension's roles own nothing: ALTER FUNCTION ... OWNER TO (or ALTER TABLE) the role of the service the code belongs to.")));
	if (binding_caller_conflict)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("role \"%s\" is bound to tenant \"%s\", and this session to tenant \"%s\"",
						GetUserNameFromId(binding_caller, false),
						binding_of(binding_caller,
								   get_relname_relid("tenant_bindings_pkey",
													 get_namespace_oid("idempotency", false))),
						binding_tenant),
				 errdetail("The call was made with the rights of role \"%s\" (the owner of a SECURITY DEFINER function, or of a table whose index functions run).",
						   GetUserNameFromId(binding_caller, false)),
				 errhint("Make the call from code owned by a role bound to the same tenant as the session, or by a role bound to none.")));
	return binding_tenant;
}

/*
 * idem_effective_tenant
 *		The tenant a call that names none is confined to: the binding, else
 *		idempotency.tenant, else NULL (any).  A bound role whose session
 *		sets idempotency.tenant to another tenant acts for neither (42501),
 *		as when it names one of them.
 */
const char *
idem_effective_tenant(void)
{
	const char *bound = idem_bound_tenant();

	if (bound != NULL)
	{
		idem_check_tenant(bound);
		return bound;
	}
	if (idem_session_tenant != NULL && idem_session_tenant[0] != '\0')
		return idem_session_tenant;
	return NULL;
}

/* An interval of "seconds" (a GUC value): no months or days. */
Interval
idem_seconds_interval(int seconds)
{
	Interval	iv;

	iv.time = (int64) seconds * USECS_PER_SEC;
	iv.day = 0;
	iv.month = 0;
	return iv;
}

/* "iv" as a Datum, palloc'd in the current context. */
Datum
idem_interval_datum(Interval iv)
{
	Interval   *result = (Interval *) palloc(sizeof(Interval));

	*result = iv;
	return IntervalPGetDatum(result);
}

/*
 * idem_check_interval
 *		Check the interval argument "name": not negative (nor zero unless
 * "zero_ok"), and at most IDEM_MAX_INTERVAL_YEARS, compared as
 * PostgreSQL compares intervals.  A longer one would hold a row (and its
 * ordering key) for good, or overflow the timestamp it is added to once
 * the statement runs; both are refused here, before anything is written,
 * with 22023 and "hint".  An interval whose months, days and time have
 * different signs ('-1 year 360 days 1 hour') compares as positive (a
 * month counts as 30 days) and may still come to a negative length on a
 * calendar: it is refused unless, added to the current time and taken
 * from it, it moves forward and back (or not at all, when "zero_ok").
 */
void
idem_check_interval(Interval *iv, const char *name, bool zero_ok,
					const char *hint)
{
	Interval	bound;
	int			sign;

	memset(&bound, 0, sizeof(bound));
	sign = DatumGetInt32(DirectFunctionCall2(interval_cmp,
											 IntervalPGetDatum(iv),
											 IntervalPGetDatum(&bound)));
	if (sign < 0 || (sign == 0 && !zero_ok))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 zero_ok ? errmsg("%s must not be negative", name) :
				 errmsg("%s must be positive", name),
				 errhint("%s", hint)));
	bound.month = IDEM_MAX_INTERVAL_YEARS * MONTHS_PER_YEAR;
	if (DatumGetInt32(DirectFunctionCall2(interval_cmp,
										  IntervalPGetDatum(iv),
										  IntervalPGetDatum(&bound))) > 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be at most %d years", name,
						IDEM_MAX_INTERVAL_YEARS),
				 errhint("%s", hint)));
	if ((iv->month < 0 || iv->day < 0 || iv->time < 0) &&
		(iv->month > 0 || iv->day > 0 || iv->time > 0))
	{
		TimestampTz now = GetCurrentStatementStartTimestamp();
		TimestampTz later;
		TimestampTz earlier;
		int32		max_months = IDEM_MAX_INTERVAL_YEARS * MONTHS_PER_YEAR;
		int32		max_days = IDEM_MAX_INTERVAL_YEARS * 366;
		int64		max_time = (int64) max_days * USECS_PER_DAY;

		/* each part within the bound too, so that the sums below fit */
		if (iv->month > max_months || iv->month < -max_months ||
			iv->day > max_days || iv->day < -max_days ||
			iv->time > max_time || iv->time < -max_time)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s must be at most %d years", name,
							IDEM_MAX_INTERVAL_YEARS),
					 errdetail("Its months, days and time have different signs, and one of them alone is longer."),
					 errhint("%s", hint)));

		later = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
														TimestampTzGetDatum(now),
														IntervalPGetDatum(iv)));
		earlier = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_mi_interval,
														  TimestampTzGetDatum(now),
														  IntervalPGetDatum(iv)));
		if (later < now || earlier > now ||
			(!zero_ok && (later == now || earlier == now)))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 zero_ok ? errmsg("%s must not be negative", name) :
					 errmsg("%s must be positive", name),
					 errdetail("Its months, days and time have different signs, and at the current date they come to a %s length.",
							   zero_ok ? "negative" : "negative or zero"),
					 errhint("%s", hint)));
	}
}

/*
 * idem_check_name_length
 *		A tenant or scope name is part of the keys' primary key: refuse one
 *		over IDEM_MAX_NAME_LEN bytes (22001) before anything is written,
 *		rather than let the index refuse the row after the write began.  An
 *		empty name is refused too (22004), as an empty key is: it is what a
 *		caller passes when it lost the tenant (a missing header or claim),
 *		and every such call would share one tenant's keys and replays.
 */
void
idem_check_name_length(const char *what, const char *value)
{
	if (value[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be empty", what),
				 errhint("Pass the %s the call is made for, such as \"%s\".",
						 what, strcmp(what, "scope") == 0 ?
						 "POST /v1/charges" : "acme")));
	if (strlen(value) > IDEM_MAX_NAME_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("%s is longer than %d bytes", what, IDEM_MAX_NAME_LEN),
				 errhint("Use a shorter %s; tenants and scopes are names, such as \"acme\" or \"POST /v1/charges\".",
						 what)));
}

/*
 * idem_check_tenant
 *		Every function that takes a tenant calls this before touching a
 *		table.  A role bound to a tenant (idem_bind_tenant) acts for that
 *		tenant only: a security boundary.  idempotency.tenant, set with SET
 *		LOCAL by applications that derive the tenant from an authentication
 *		token, is defence in depth against bugs: the session can change it.
 */
void
idem_check_tenant(const char *tenant)
{
	const char *bound;

	idem_check_name_length("tenant", tenant);
	bound = idem_bound_tenant();

	if (bound != NULL && strcmp(tenant, bound) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("role \"%s\" is bound to tenant \"%s\"",
						binding_role, bound),
				 errdetail("The call names tenant \"%s\".", tenant),
				 errhint("Pass the tenant the role is bound to; an administrator changes bindings with idem_bind_tenant().")));
	if (idem_session_tenant == NULL || idem_session_tenant[0] == '\0')
		return;
	if (strcmp(tenant, idem_session_tenant) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("tenant \"%s\" does not match idempotency.tenant", tenant),
				 errdetail("This session sets idempotency.tenant to \"%s\".",
						   idem_session_tenant),
				 errhint("Pass the tenant the session was authenticated for, or reset idempotency.tenant.")));
}

/*
 * A binding confines what a role does through the functions that take a
 * tenant.  A superuser, or a role that has or can take the privileges of
 * idempotency_admin (a member, even NOINHERIT; one with its ADMIN OPTION;
 * before PostgreSQL 16, one with CREATEROLE), also reads every tenant's
 * rows in the tables and changes bindings, its own included: say so when
 * such a role is bound (the binding is stored all the same; the role may
 * lose the privilege later).
 */
static void
bind_warn_unconfined(Oid role)
{
	Oid			admin = get_role_oid("idempotency_admin", true);
	const char *what;

	if (superuser_arg(role))
		what = "is a superuser";
	else if (OidIsValid(admin) && is_member_of_role(role, admin))
		what = "is a member of idempotency_admin";
	else if (OidIsValid(admin) && is_admin_of_role(role, admin))
		what = "may grant itself idempotency_admin";
#if PG_VERSION_NUM < 160000
	else if (has_createrole_privilege(role))
		what = "has CREATEROLE, which may grant it idempotency_admin";
#endif
	else
		return;
	ereport(WARNING,
			(errcode(ERRCODE_WARNING),
			 errmsg("role \"%s\" %s: the binding does not confine it",
					GetUserNameFromId(role, false), what),
			 errdetail("The functions that take a tenant refuse another one, but this role reads every tenant's rows in the extension's tables and can change bindings, its own included."),
			 errhint("Bind the roles services log in as; grant idempotency_admin to people.")));
}

/*
 * idem_bind_tenant(role regrole, tenant text) RETURNS void
 *		Bind "role" to "tenant" (replacing an earlier binding).  Writes one
 *		row of idempotency.tenant_bindings.
 */
Datum
idem_bind_tenant(PG_FUNCTION_ARGS)
{
	/* regrole: see idem_unbind_tenant */
	Oid			argtypes[2] = {REGROLEOID, TEXTOID};
	Datum		values[2];
	static SPIPlanPtr plan = NULL;

	idem_require_arg(fcinfo, 0, "role");
	idem_require_arg(fcinfo, 1, "tenant");
	if (!OidIsValid(PG_GETARG_OID(0)))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("role must name a role"),
				 errhint("Pass the role's name, such as 'app_acme'; '-' names no role.")));
	/* an OID cast to regrole need not name a role */
	if (!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(PG_GETARG_OID(0))))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("role %u does not exist", PG_GETARG_OID(0)),
				 errhint("Pass the role's name, such as 'app_acme'.")));
	if (VARSIZE_ANY_EXHDR(PG_GETARG_TEXT_PP(1)) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("tenant must not be empty"),
				 errhint("Pass the tenant the role acts for.")));
	/* a tenant no function accepts would leave the role no tenant at all */
	idem_check_name_length("tenant", text_to_cstring(PG_GETARG_TEXT_PP(1)));
	idem_spi_connect();
	idem_saved_plan(&plan,
					"INSERT INTO idempotency.tenant_bindings AS b (role, tenant)"
					" VALUES ($1, $2)"
					" ON CONFLICT (role) DO UPDATE SET tenant = EXCLUDED.tenant",
					2, argtypes, 0);
	values[0] = PG_GETARG_DATUM(0);
	values[1] = PG_GETARG_DATUM(1);
	idem_spi_execute(plan, values, NULL, false, 0);
	SPI_finish();
	bind_warn_unconfined(PG_GETARG_OID(0));
	PG_RETURN_VOID();
}

/*
 * idem_unbind_tenant(role regrole) RETURNS boolean
 *		Remove the binding of "role"; false when it had none.
 */
Datum
idem_unbind_tenant(PG_FUNCTION_ARGS)
{
	/*
	 * regrole, not oid: on Citus the statement is sent to the workers of the
	 * reference table with its parameter as text, and a role's OID differs
	 * from node to node while its name does not
	 */
	Oid			argtypes[1] = {REGROLEOID};
	Datum		values[1];
	static SPIPlanPtr plan = NULL;
	bool		removed;

	idem_require_arg(fcinfo, 0, "role");
	idem_spi_connect();
	idem_saved_plan(&plan,
					"DELETE FROM idempotency.tenant_bindings"
					" WHERE role OPERATOR(pg_catalog.=) $1",
					1, argtypes, 0);
	values[0] = PG_GETARG_DATUM(0);
	idem_spi_execute(plan, values, NULL, false, 0);
	removed = SPI_processed > 0;
	SPI_finish();
	PG_RETURN_BOOL(removed);
}

/* ----------------------------------------------------------------
 * Helpers every module uses
 * ----------------------------------------------------------------
 */

/*
 * The owner of function "fn", cached until a pg_proc change reaches this
 * backend (ALTER FUNCTION ... OWNER TO, REASSIGN OWNED).
 */
#define OWNER_CACHE_SIZE 8
static struct
{
	Oid			fn;
	Oid			owner;
}			owner_cache[OWNER_CACHE_SIZE];
static int	owner_cache_used = 0;
static bool owner_callback_registered = false;

static void
owner_cache_callback(Datum arg, int cacheid, uint32 hashvalue)
{
	(void) arg;
	(void) cacheid;
	(void) hashvalue;
	owner_cache_used = 0;
}

static Oid
function_owner(Oid fn)
{
	HeapTuple	tuple;
	Oid			owner;
	int			i;

	for (i = 0; i < owner_cache_used; i++)
		if (owner_cache[i].fn == fn)
			return owner_cache[i].owner;
	if (!owner_callback_registered)
	{
		CacheRegisterSyscacheCallback(PROCOID, owner_cache_callback, (Datum) 0);
		owner_callback_registered = true;
	}
	tuple = SearchSysCache1(PROCOID, ObjectIdGetDatum(fn));
	if (!HeapTupleIsValid(tuple))
		elog(ERROR, "cache lookup failed for function %u", fn);
	owner = ((Form_pg_proc) GETSTRUCT(tuple))->proowner;
	ReleaseSysCache(tuple);
	if (owner_cache_used < OWNER_CACHE_SIZE)
	{
		owner_cache[owner_cache_used].fn = fn;
		owner_cache[owner_cache_used].owner = owner;
		owner_cache_used++;
	}
	return owner;
}

/* What idem_owner_enter saves for idem_owner_leave. */
typedef struct IdemOwnerScope
{
	Oid			save_userid;
	int			save_sec_context;
	int			save_nestlevel;
	int			save_depth;
} IdemOwnerScope;

static bool owner_scope_callbacks_registered = false;

/* Calls of the entry points in this backend (idem_entry_call). */
static uint64 idem_entry_calls = 0;

static void
owner_scope_xact_callback(XactEvent event, void *arg)
{
	(void) arg;
	if (event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT)
		owner_scope_depth = 0;
}

static void
owner_scope_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
							 SubTransactionId parentSubid, void *arg)
{
	int			level = GetCurrentTransactionNestLevel();

	(void) mySubid;
	(void) parentSubid;
	(void) arg;
	if (event != SUBXACT_EVENT_ABORT_SUB)
		return;
	while (owner_scope_depth > 0 &&
		   owner_scope_frames[owner_scope_depth - 1].nest_level >= level)
		owner_scope_depth--;
}

/*
 * Run as the owner of the function being called, with search_path
 * pg_catalog, pg_temp: what SECURITY DEFINER SET search_path = pg_catalog,
 * pg_temp gives, for the entry points declared SECURITY INVOKER to spare
 * the per-call cost of a function-level SET (on 15 and 16, setting and
 * restoring the GUC walks every setting); see idem_pin_search_path.
 * idem_owner_leave is called at the same transaction nesting level.
 */
static void
idem_owner_enter(FunctionCallInfo fcinfo, IdemOwnerScope *scope)
{
	Oid			owner;

	if (fcinfo->flinfo == NULL || !OidIsValid(fcinfo->flinfo->fn_oid))
		elog(ERROR, "idempotency: entry point called without a function OID");
	owner = function_owner(fcinfo->flinfo->fn_oid);
	idem_entry_call();

	GetUserIdAndSecContext(&scope->save_userid, &scope->save_sec_context);
	if (!owner_scope_callbacks_registered)
	{
		RegisterXactCallback(owner_scope_xact_callback, NULL);
		RegisterSubXactCallback(owner_scope_subxact_callback, NULL);
		owner_scope_callbacks_registered = true;
	}
	/* the role whose tenant binding the call is held to (binding_load) */
	if (owner_scope_depth == owner_scope_size)
	{
		int			size = Max(8, owner_scope_size * 2);

		owner_scope_frames = owner_scope_frames == NULL ?
			MemoryContextAlloc(TopMemoryContext, size * sizeof(OwnerScopeFrame)) :
			repalloc(owner_scope_frames, size * sizeof(OwnerScopeFrame));
		owner_scope_size = size;
	}
	owner_scope_frames[owner_scope_depth].caller = binding_calling_user();
	owner_scope_frames[owner_scope_depth].owner = owner;
	owner_scope_frames[owner_scope_depth].nest_level = GetCurrentTransactionNestLevel();
	scope->save_depth = owner_scope_depth;
	owner_scope_depth++;
	SetUserIdAndSecContext(owner,
						   scope->save_sec_context | SECURITY_LOCAL_USERID_CHANGE);
	scope->save_nestlevel = idem_pin_search_path();
}

static void
idem_owner_leave(IdemOwnerScope *scope)
{
	idem_unpin_search_path(scope->save_nestlevel);
	SetUserIdAndSecContext(scope->save_userid, scope->save_sec_context);
	owner_scope_depth = scope->save_depth;
}

/*
 * Calls for one row of a select list.  PostgreSQL evaluates a function
 * returning a composite once for each column read from it:
 * SELECT (f(...)).* calls f once per column, each call from its own
 * expression (its own FmgrInfo), all in the memory context of the row
 * being evaluated.  idem_row_mark records a call; idem_row_repeat tells
 * whether the current call is another column of the one marked: made from
 * another place in the expression, in the same memory context, not reset
 * or deleted since (a reset callback clears the mark), and with no other
 * call of the extension's entry points in between.  A call from the same
 * place (another row of the query, a loop) is never a repeat.
 */
typedef struct RowMarkCallback
{
	MemoryContextCallback cb;
	IdemRowMark *mark;
	MemoryContext cxt;
} RowMarkCallback;

static void
row_mark_reset(void *arg)
{
	RowMarkCallback *rc = (RowMarkCallback *) arg;

	if (rc->mark->cxt == rc->cxt)
		rc->mark->cxt = NULL;
}

/*
 * A call of an entry point that changes or answers for keys: the entry
 * points that run as their owner (idem_owner_enter), and idem_execute.
 */
void
idem_entry_call(void)
{
	idem_entry_calls++;
}

void
idem_row_mark(IdemRowMark *mark, FunctionCallInfo fcinfo, MemoryContext cxt)
{
	if (mark->cxt != cxt)
	{
		RowMarkCallback *rc = MemoryContextAlloc(cxt, sizeof(RowMarkCallback));

		rc->cb.func = row_mark_reset;
		rc->cb.arg = rc;
		rc->mark = mark;
		rc->cxt = cxt;
		MemoryContextRegisterResetCallback(cxt, &rc->cb);
		mark->cxt = cxt;
	}
	mark->site = fcinfo->flinfo;
	mark->calls = idem_entry_calls;
}

bool
idem_row_repeat(IdemRowMark *mark, FunctionCallInfo fcinfo, MemoryContext cxt)
{
	if (mark->cxt == NULL || mark->cxt != cxt || mark->site == fcinfo->flinfo ||
		mark->calls + 1 != idem_entry_calls)
		return false;
	mark->calls = idem_entry_calls;
	return true;
}

/* "body"(fcinfo) between idem_owner_enter and idem_owner_leave. */
Datum
idem_call_as_owner(FunctionCallInfo fcinfo, PGFunction body)
{
	IdemOwnerScope scope;
	Datum		result;

	idem_owner_enter(fcinfo, &scope);
	result = body(fcinfo);
	idem_owner_leave(&scope);
	return result;
}

/*
 * Pin search_path to pg_catalog, pg_temp until idem_unpin_search_path
 * (called at the same transaction nesting level, with what this returned)
 * or until the (sub)transaction aborts.  On 15 and 16 an override of the
 * search path, a list copy; later versions set the GUC at a new nest level,
 * which they restore cheaply (15 and 16 walk every setting to restore one).
 */
int
idem_pin_search_path(void)
{
#if PG_VERSION_NUM < 170000
	OverrideSearchPath path;
	Oid			temp_nsp;
	Oid			temp_toast_nsp;

	/* the same list as the GUC "pg_catalog, pg_temp" gives */
	GetTempNamespaceState(&temp_nsp, &temp_toast_nsp);
	path.schemas = list_make1_oid(PG_CATALOG_NAMESPACE);
	if (OidIsValid(temp_nsp))
		path.schemas = lappend_oid(path.schemas, temp_nsp);
	path.addCatalog = false;
	path.addTemp = false;
	path.generation = 0;
	PushOverrideSearchPath(&path);
	list_free(path.schemas);
	return 0;
#else
	int			save_nestlevel = NewGUCNestLevel();

	(void) set_config_option("search_path", "pg_catalog, pg_temp",
							 PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	return save_nestlevel;
#endif
}

void
idem_unpin_search_path(int save_nestlevel)
{
#if PG_VERSION_NUM < 170000
	(void) save_nestlevel;
	PopOverrideSearchPath();
#else
	AtEOXact_GUC(true, save_nestlevel);
#endif
}

/* SPI_connect, with its result checked. */
void
idem_spi_connect(void)
{
	int			rc = SPI_connect();

	if (rc != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed: %s", SPI_result_code_string(rc));
}

/* The detail and hint of a write refused in a read-only transaction. */
#define IDEM_READ_ONLY_DETAIL_STANDBY \
	"This server is a standby: this call writes the extension's tables."
#define IDEM_READ_ONLY_DETAIL \
	"This transaction is read-only: this call writes the extension's tables."
#define IDEM_READ_ONLY_HINT \
	"Send the call to the primary, in a read-write transaction; a standby answers replays of finished keys and lookups."

/*
 * Re-raise the error being handled, adding a detail and a hint to two
 * errors PostgreSQL raises with a message alone inside the extension's
 * statements: a serialization failure (under REPEATABLE READ or
 * SERIALIZABLE, a row of the extension's that another transaction changed
 * after this transaction's snapshot was taken), and a write in a read-only
 * transaction (a standby, or default_transaction_read_only).  "cxt" is the
 * memory context of the caller's PG_TRY.
 */
static void
idem_rethrow_with_hint(MemoryContext cxt)
{
	ErrorData  *edata;

	MemoryContextSwitchTo(cxt);
	edata = CopyErrorData();
	if ((edata->sqlerrcode != ERRCODE_T_R_SERIALIZATION_FAILURE &&
		 edata->sqlerrcode != ERRCODE_READ_ONLY_SQL_TRANSACTION) ||
		edata->hint != NULL)
	{
		FreeErrorData(edata);
		PG_RE_THROW();
	}
	FlushErrorState();
	if (edata->sqlerrcode == ERRCODE_T_R_SERIALIZATION_FAILURE)
	{
		if (edata->detail == NULL)
			edata->detail = pstrdup("Another transaction changed this row of the extension's tables after this transaction's snapshot was taken.");
		edata->hint = pstrdup(IDEM_SERIALIZATION_HINT);
	}
	else
	{
		if (edata->detail == NULL)
			edata->detail = pstrdup(RecoveryInProgress() ?
									IDEM_READ_ONLY_DETAIL_STANDBY :
									IDEM_READ_ONLY_DETAIL);
		edata->hint = pstrdup(IDEM_READ_ONLY_HINT);
	}
	ReThrowError(edata);
}

/*
 * Refuse a call that is about to write in a read-only transaction (25006),
 * before it changes shared state that a rollback would not undo (a
 * tenant's rate).  Its error is the one the write itself would raise.
 */
void
idem_require_writable(const char *what)
{
	if (XactReadOnly)
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot execute %s in a read-only transaction", what),
				 errdetail(RecoveryInProgress() ?
						   IDEM_READ_ONLY_DETAIL_STANDBY :
						   IDEM_READ_ONLY_DETAIL),
				 errhint(IDEM_READ_ONLY_HINT)));
}

/*
 * SPI_execute_plan, with its result checked; returns the SPI result code.
 * A serialization failure or a write in a read-only transaction that
 * PostgreSQL raises with no hint gets one.
 */
int
idem_spi_execute(SPIPlanPtr plan, Datum *values, const char *nulls,
				 bool read_only, long count)
{
	MemoryContext cxt = CurrentMemoryContext;
	volatile int rc = 0;

	PG_TRY();
	{
		rc = SPI_execute_plan(plan, values, nulls, read_only, count);
	}
	PG_CATCH();
	{
		idem_rethrow_with_hint(cxt);
	}
	PG_END_TRY();

	if (rc < 0)
		elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
	return rc;
}

/*
 * A NULL argument is 22004, naming it: functions are not STRICT, so that a
 * NULL is an error with a hint instead of a silent NULL.
 */
void
idem_null_argument(const char *name)
{
	ereport(ERROR,
			(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
			 errmsg("%s must not be null", name),
			 errhint("Pass a non-null %s.", name)));
}

void
idem_require_arg(FunctionCallInfo fcinfo, int argno, const char *name)
{
	if (PG_ARGISNULL(argno))
		idem_null_argument(name);
}

/*
 * idem_check_key
 *		An idempotency key is present (22004), at most IDEM_MAX_KEY_LEN bytes
 *		(22001) and printable ASCII (22021): the one rule for every function
 *		that takes a key.
 */
void
idem_check_key(text *key)
{
	const char *p;
	int			len;
	int			i;

	if (key == NULL || VARSIZE_ANY_EXHDR(key) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("idempotency key is missing"),
				 errhint("Send an idempotency key with every request that must not run twice, and answer requests without one with HTTP 400.")));
	p = VARDATA_ANY(key);
	len = VARSIZE_ANY_EXHDR(key);
	if (len > IDEM_MAX_KEY_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("idempotency key is too long"),
				 errdetail("The key is %d bytes long; at most %d are allowed.",
						   len, IDEM_MAX_KEY_LEN),
				 errhint("Use a UUID or another identifier of at most %d printable ASCII characters.",
						 IDEM_MAX_KEY_LEN)));
	for (i = 0; i < len; i++)
	{
		unsigned char c = (unsigned char) p[i];

		if (c < 0x20 || c > 0x7e)
			ereport(ERROR,
					(errcode(ERRCODE_CHARACTER_NOT_IN_REPERTOIRE),
					 errmsg("idempotency key contains a non-printable character"),
					 errdetail("Byte %d of the key is 0x%02x; only printable ASCII (0x20 to 0x7E) is allowed.",
							   i + 1, c),
					 errhint("Use a UUID or another identifier made of printable ASCII characters.")));
	}
}

void
_PG_init(void)
{
	idem_loaded_at_startup = process_shared_preload_libraries_in_progress;

	DefineCustomStringVariable("idempotency.tenant",
							   gettext_noop("Tenant this session acts for; calls naming another tenant are refused."),
							   gettext_noop("Empty means no check.  Set it with SET LOCAL from the tenant the application authenticated."),
							   &idem_session_tenant,
							   "",
							   PGC_USERSET,
							   0,
							   NULL, NULL, NULL);

	/* each module defines its own parameters and shared memory */
	idem_keys_init();
	idem_outbox_init();
	idem_stats_init();
	idem_rate_init();
	if (process_shared_preload_libraries_in_progress)
		idem_citus_init();

	MarkGUCPrefixReserved("idempotency");
}
