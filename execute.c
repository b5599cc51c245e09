/*-------------------------------------------------------------------------
 *
 * execute.c
 *	  idem_execute: a whole idempotent request in one statement, for
 *	  handlers that live in the database.
 *
 *	  SELECT * FROM idem_execute('acme', 'POST /v1/orders', 'key-1',
 *								 '{"sku": "A-1"}', 'shop.create_order');
 *
 * reserves the key (idem_reserve), and only when the answer is "created"
 * calls the handler, a function (tenant text, key text, request jsonb)
 * RETURNS idempotency.response, stores what it returned (idem_complete)
 * and answers the reservation with the response filled in.  Every other
 * outcome (replay, in_progress, mismatch, stale) is answered without
 * calling the handler.  An error in the handler fails the statement, and
 * with it the reservation and whatever the handler wrote, like any
 * statement: in autocommit nothing remains, and a retry runs afresh.  A
 * response that idem_complete does not store (it releases the key) rolls
 * back what the handler wrote: the handler runs in a subtransaction.
 *
 * idem_execute is SECURITY INVOKER without a search_path of its own, so
 * the handler runs as the caller, with the caller's search_path and
 * privileges.  The key functions are called through the function manager
 * and run as their owner with search_path pinned, as for any caller
 * (idem_owner_enter); this file runs no SQL of its own.
 *
 * IDENTIFICATION
 *	  execute.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "parser/parse_func.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/regproc.h"
#include "utils/resowner.h"
#include "utils/syscache.h"

#include "idempotency.h"

PG_FUNCTION_INFO_V1(idem_execute);

/* Arguments of idem_execute. */
#define EXEC_TENANT		0
#define EXEC_SCOPE		1
#define EXEC_KEY		2
#define EXEC_REQUEST	3
#define EXEC_HANDLER	4
#define EXEC_TTL		5
#define EXEC_WAIT		6

/* Columns of idempotency.reservation that idem_execute fills in. */
typedef enum ExecColumn
{
	COL_OUTCOME,
	COL_HTTP_STATUS,
	COL_RESPONSE_CODE,
	COL_RESPONSE_BODY,
	COL_RESPONSE_HEADERS,
	COL_LOCK_TOKEN,
	COL_EXPIRES_AT,
	COL_COUNT
} ExecColumn;

static const char *const exec_column_names[COL_COUNT] = {
	"outcome", "http_status", "response_code", "response_body",
	"response_headers", "lock_token", "expires_at"
};

/*
 * What one call site keeps between calls (fn_extra): the key functions it
 * calls, the last handler and the result's layout.
 */
typedef struct ExecCache
{
	FmgrInfo	reserve;
	FmgrInfo	complete;
	Oid			response_type;	/* idempotency.response */
	Oid			handler;		/* InvalidOid until the first call */
	FmgrInfo	handler_fn;
	TupleDesc	result_desc;
	int			col[COL_COUNT]; /* attribute index (0-based) of each */
} ExecCache;

/*
 * The answer of the last call that ran its handler, kept for the other
 * calls of the same row: PostgreSQL evaluates SELECT (idem_execute(...)).*
 * once per column, and each later call would otherwise find the key
 * finished (a replay, counted again) or, when the response was not stored,
 * free: the handler ran once per column.  A later call is the same row's
 * when idem_row_repeat says so and its arguments are the same.
 */
static struct
{
	IdemRowMark mark;			/* mark.cxt holds args and answer */
	Datum		args[EXEC_HANDLER]; /* tenant, scope, key, request */
	Oid			handler;
	Datum		answer;
}			exec_row;

static bool
exec_row_same(FunctionCallInfo fcinfo, Oid handler)
{
	if (exec_row.handler != handler)
		return false;
	for (int i = 0; i < EXEC_HANDLER; i++)
		if (PG_ARGISNULL(i) ||
			!datumIsEqual(exec_row.args[i], PG_GETARG_DATUM(i), false, -1))
			return false;
	return true;
}

/* The extension function "name" with "nargs" arguments of "argtypes". */
static Oid
exec_lookup(Oid nsp, const char *name, int nargs, const Oid *argtypes)
{
	List	   *names = list_make2(makeString(get_namespace_name(nsp)),
								   makeString(pstrdup(name)));

	return LookupFuncName(names, nargs, argtypes, false);
}

static ExecCache *
exec_cache(FunctionCallInfo fcinfo)
{
	ExecCache  *cache = (ExecCache *) fcinfo->flinfo->fn_extra;
	MemoryContext oldcxt;
	Oid			nsp;
	Oid			reserve_args[7] = {TEXTOID, TEXTOID, TEXTOID, JSONBOID,
	INTERVALOID, INTERVALOID, BYTEAOID};
	Oid			complete_args[8] = {TEXTOID, TEXTOID, TEXTOID, INT4OID,
	JSONBOID, JSONBOID, UUIDOID, BOOLOID};
	TupleDesc	desc;

	if (cache != NULL)
		return cache;

	oldcxt = MemoryContextSwitchTo(fcinfo->flinfo->fn_mcxt);
	cache = palloc0(sizeof(ExecCache));
	nsp = get_func_namespace(fcinfo->flinfo->fn_oid);
	fmgr_info_cxt(exec_lookup(nsp, "idem_reserve", 7, reserve_args),
				  &cache->reserve, fcinfo->flinfo->fn_mcxt);
	fmgr_info_cxt(exec_lookup(nsp, "idem_complete", 8, complete_args),
				  &cache->complete, fcinfo->flinfo->fn_mcxt);
	cache->response_type =
		GetSysCacheOid2(TYPENAMENSP, Anum_pg_type_oid,
						CStringGetDatum("response"),
						ObjectIdGetDatum(get_namespace_oid("idempotency", false)));
	if (!OidIsValid(cache->response_type))
		elog(ERROR, "type idempotency.response not found");

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "idem_execute must return idempotency.reservation");
	cache->result_desc = CreateTupleDescCopy(desc);
	for (int c = 0; c < COL_COUNT; c++)
	{
		cache->col[c] = -1;
		for (int i = 0; i < desc->natts; i++)
		{
			Form_pg_attribute att = TupleDescAttr(desc, i);

			if (!att->attisdropped &&
				strcmp(NameStr(att->attname), exec_column_names[c]) == 0)
				cache->col[c] = i;
		}
		if (cache->col[c] < 0)
			elog(ERROR, "column \"%s\" of idempotency.reservation not found",
				 exec_column_names[c]);
	}
	MemoryContextSwitchTo(oldcxt);
	fcinfo->flinfo->fn_extra = cache;
	return cache;
}

/*
 * Check that "handler" is a function (text, text, jsonb) RETURNS
 * idempotency.response that the caller may execute, before anything is
 * written; keep its FmgrInfo for the next calls.
 */
static void
exec_check_handler(ExecCache *cache, Oid handler, MemoryContext cxt)
{
	HeapTuple	tup;
	Form_pg_proc proc;
	AclResult	aclresult;
	Oid			nsp;
	bool		ok;

	tup = SearchSysCache1(PROCOID, ObjectIdGetDatum(handler));
	if (!HeapTupleIsValid(tup))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("handler function with OID %u does not exist", handler),
				 errdetail("The function was dropped after the handler's name was resolved to it."),
				 errhint("A prepared statement resolves the name when it is prepared: prepare it again (DEALLOCATE, or a new connection), or replace a handler with CREATE OR REPLACE FUNCTION.")));
	proc = (Form_pg_proc) GETSTRUCT(tup);
	ok = proc->prokind == PROKIND_FUNCTION && !proc->proretset &&
		proc->pronargs == 3 &&
		proc->proargtypes.values[0] == TEXTOID &&
		proc->proargtypes.values[1] == TEXTOID &&
		proc->proargtypes.values[2] == JSONBOID &&
		proc->prorettype == cache->response_type;
	ReleaseSysCache(tup);
	if (!ok)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_FUNCTION_DEFINITION),
				 errmsg("%s is not an idempotent request handler",
						format_procedure(handler)),
				 errdetail("A handler is a function (tenant text, key text, request jsonb) RETURNS idempotency.response, not a procedure and not set-returning."),
				 errhint("Declare it as CREATE FUNCTION name(tenant text, key text, request jsonb) RETURNS idempotency.response.")));

#if PG_VERSION_NUM >= 160000
	aclresult = object_aclcheck(ProcedureRelationId, handler, GetUserId(),
								ACL_EXECUTE);
#else
	aclresult = pg_proc_aclcheck(handler, GetUserId(), ACL_EXECUTE);
#endif
	if (aclresult != ACLCHECK_OK)
		aclcheck_error(aclresult, OBJECT_FUNCTION, get_func_name(handler));

	/*
	 * and USAGE on its schema, as naming it would need: an OID passed as the
	 * handler does not reach into a schema closed to the caller
	 */
	nsp = get_func_namespace(handler);
#if PG_VERSION_NUM >= 160000
	aclresult = object_aclcheck(NamespaceRelationId, nsp, GetUserId(),
								ACL_USAGE);
#else
	aclresult = pg_namespace_aclcheck(nsp, GetUserId(), ACL_USAGE);
#endif
	if (aclresult != ACLCHECK_OK)
		aclcheck_error(aclresult, OBJECT_SCHEMA, get_namespace_name(nsp));

	fmgr_info_cxt(handler, &cache->handler_fn, cxt);
	cache->handler = handler;
}

/* idem_reserve(tenant, scope, key, request, ttl, wait, NULL), as declared */
static Datum
exec_reserve(ExecCache *cache, FunctionCallInfo fcinfo)
{
	LOCAL_FCINFO(call, 7);
	Datum		reservation;

	InitFunctionCallInfoData(*call, &cache->reserve, 7, InvalidOid, NULL, NULL);
	for (int i = 0; i < 4; i++)
	{
		call->args[i].value = PG_GETARG_DATUM(i);
		call->args[i].isnull = PG_ARGISNULL(i);
	}
	call->args[4].value = PG_GETARG_DATUM(EXEC_TTL);
	call->args[4].isnull = PG_ARGISNULL(EXEC_TTL);
	call->args[5].value = PG_GETARG_DATUM(EXEC_WAIT);
	call->args[5].isnull = PG_ARGISNULL(EXEC_WAIT);
	call->args[6].value = (Datum) 0;
	call->args[6].isnull = true;
	reservation = FunctionCallInvoke(call);
	if (call->isnull)
		elog(ERROR, "idem_reserve returned NULL");
	return reservation;
}

/*
 * idem_complete(tenant, scope, key, status, body, headers, NULL, release),
 * as declared: the reservation is this transaction's own, so no token.
 * "release" (idem_complete's "retryable") releases the key whatever the
 * scope's policy says.  True when the response was stored.
 */
static bool
exec_complete(ExecCache *cache, FunctionCallInfo fcinfo, Datum status,
			  Datum body, bool body_null, Datum headers, bool headers_null,
			  bool release)
{
	LOCAL_FCINFO(call, 8);

	InitFunctionCallInfoData(*call, &cache->complete, 8, InvalidOid, NULL, NULL);
	for (int i = 0; i < 3; i++)
	{
		call->args[i].value = PG_GETARG_DATUM(i);
		call->args[i].isnull = false;
	}
	call->args[3].value = status;
	call->args[3].isnull = false;
	call->args[4].value = body;
	call->args[4].isnull = body_null;
	call->args[5].value = headers;
	call->args[5].isnull = headers_null;
	call->args[6].value = (Datum) 0;
	call->args[6].isnull = true;
	call->args[7].value = BoolGetDatum(release);
	call->args[7].isnull = false;
	(void) FunctionCallInvoke(call);
	return !call->isnull;
}

/* What a handler answered, copied out of its subtransaction. */
typedef struct ExecResponse
{
	Datum		status;
	Datum		body;
	bool		body_null;
	Datum		headers;
	bool		headers_null;
} ExecResponse;

/*
 * Call the handler, as the caller, with the caller's search_path, and take
 * its response apart.  The values are copied into the memory context that
 * was current when idem_execute was called (oldcxt of the caller), so they
 * outlive a rolled-back subtransaction.
 */
static void
exec_call_handler(ExecCache *cache, FunctionCallInfo fcinfo, Oid handler,
				  MemoryContext cxt, ExecResponse *resp)
{
	LOCAL_FCINFO(call, 3);
	Datum		response;
	HeapTupleHeader th = NULL;
	bool		isnull = true;
	MemoryContext old;

	InitFunctionCallInfoData(*call, &cache->handler_fn, 3, InvalidOid, NULL, NULL);
	call->args[0].value = PG_GETARG_DATUM(EXEC_TENANT);
	call->args[0].isnull = false;
	call->args[1].value = PG_GETARG_DATUM(EXEC_KEY);
	call->args[1].isnull = false;
	call->args[2].value = PG_GETARG_DATUM(EXEC_REQUEST);
	call->args[2].isnull = false;
	response = FunctionCallInvoke(call);
	resp->status = (Datum) 0;
	if (!call->isnull)
	{
		th = DatumGetHeapTupleHeader(response);
		resp->status = GetAttributeByNum(th, 1, &isnull);
	}
	if (isnull)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("handler %s returned no status", format_procedure(handler)),
				 errhint("Return ROW(status, body, headers)::idempotency.response with an HTTP status from 100 to 599.")));
	old = MemoryContextSwitchTo(cxt);
	resp->body = GetAttributeByNum(th, 2, &resp->body_null);
	if (!resp->body_null)
		resp->body = PointerGetDatum(PG_DETOAST_DATUM_COPY(resp->body));
	resp->headers = GetAttributeByNum(th, 3, &resp->headers_null);
	if (!resp->headers_null)
		resp->headers = PointerGetDatum(PG_DETOAST_DATUM_COPY(resp->headers));
	MemoryContextSwitchTo(old);
}

/*
 * Call the handler in a subtransaction (see idem_execute), and keep what it
 * wrote when idem_complete will store its response; true then.
 */
static bool
exec_handle(ExecCache *cache, FunctionCallInfo fcinfo, Oid handler,
			ExecResponse *resp)
{
	MemoryContext oldcxt = CurrentMemoryContext;
	ResourceOwner oldowner = CurrentResourceOwner;
	volatile bool stored = false;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(oldcxt);
	PG_TRY();
	{
		exec_call_handler(cache, fcinfo, handler, oldcxt, resp);
		stored = idem_complete_stores(fcinfo->flinfo,
									  PG_GETARG_DATUM(EXEC_SCOPE),
									  DatumGetInt32(resp->status));
		if (stored)
			ReleaseCurrentSubTransaction();
		else
			RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcxt);
		CurrentResourceOwner = oldowner;
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(oldcxt);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcxt);
		CurrentResourceOwner = oldowner;
		ReThrowError(edata);
	}
	PG_END_TRY();
	return stored;
}

/*
 * idem_execute(tenant, scope, key, request jsonb, handler regproc,
 *				ttl interval, wait interval) RETURNS idempotency.reservation
 *		Reserve, call the handler on "created", store its response, answer.
 */
Datum
idem_execute(PG_FUNCTION_ARGS)
{
	ExecCache  *cache;
	Oid			handler;
	Datum		reservation;
	HeapTupleHeader th;
	HeapTupleData tuple;
	Datum		values[64];
	bool		nulls[64];
	char	   *outcome;
	ExecResponse resp;
	bool		stored;
	MemoryContext callcxt = CurrentMemoryContext;
	MemoryContext oldcxt;
	Datum		answer;

	/* another request than a reservation before it in the row */
	idem_entry_call();
	/* the key functions check the rest; these are idem_execute's own */
	if (PG_ARGISNULL(EXEC_HANDLER))
		idem_null_argument("handler");
	if (PG_ARGISNULL(EXEC_REQUEST))
		idem_null_argument("request");
	cache = exec_cache(fcinfo);
	if (cache->result_desc->natts > (int) lengthof(values))
		elog(ERROR, "idempotency.reservation has too many columns");
	handler = PG_GETARG_OID(EXEC_HANDLER);
	if (!OidIsValid(handler))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("handler must name a function"),
				 errhint("Pass the handler's name, such as 'shop.create_order'; '-' names no function.")));
	/* another column of the row whose first column ran the handler */
	if (idem_row_repeat(&exec_row.mark, fcinfo, callcxt) &&
		exec_row_same(fcinfo, handler))
		PG_RETURN_DATUM(datumCopy(exec_row.answer, false, -1));
	if (handler != cache->handler)
		exec_check_handler(cache, handler, fcinfo->flinfo->fn_mcxt);

	reservation = exec_reserve(cache, fcinfo);

	th = DatumGetHeapTupleHeader(reservation);
	tuple.t_len = HeapTupleHeaderGetDatumLength(th);
	ItemPointerSetInvalid(&tuple.t_self);
	tuple.t_tableOid = InvalidOid;
	tuple.t_data = th;
	heap_deform_tuple(&tuple, cache->result_desc, values, nulls);

	outcome = DatumGetCString(DirectFunctionCall1(enum_out,
												  values[cache->col[COL_OUTCOME]]));
	if (strcmp(outcome, "created") != 0)
		PG_RETURN_DATUM(reservation);

	/*
	 * The handler and the completion run in a subtransaction of their own.
	 * When the response is stored it is released into the statement's
	 * transaction.  When idem_complete releases the key instead, the
	 * subtransaction is rolled back with everything the handler wrote, and
	 * the key is released again in the statement's transaction: a response
	 * that is not stored leaves nothing behind, so the retry it invites runs
	 * the handler on a clean slate.  An error rolls the subtransaction back
	 * and goes on to fail the statement.
	 */
	stored = exec_handle(cache, fcinfo, handler, &resp);

	/*
	 * The completion does what was decided when the handler's writes were
	 * kept or rolled back: a response not stored releases the key whatever
	 * the policy says now.  A response to store that the completion released
	 * (the scope's policy changed in between, committed by another session)
	 * would leave the handler's writes behind a free key, for a retry to run
	 * the handler again: the statement fails instead, and keeps nothing.
	 */
	if (!exec_complete(cache, fcinfo, resp.status, resp.body,
					   resp.body_null, resp.headers, resp.headers_null,
					   !stored) && stored)
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("the policy of scope \"%s\" changed while handler %s ran",
						TextDatumGetCString(PG_GETARG_DATUM(EXEC_SCOPE)),
						format_procedure(handler)),
				 errdetail("Its response with status %d was to be stored, and the completion released the key instead.",
						   DatumGetInt32(resp.status)),
				 errhint("Retry the request: nothing of it was kept.")));

	/*
	 * "created", with the response the handler gave; the key is finished, or
	 * released (no expires_at then: nothing is kept)
	 */
	values[cache->col[COL_HTTP_STATUS]] = resp.status;
	nulls[cache->col[COL_HTTP_STATUS]] = false;
	values[cache->col[COL_RESPONSE_CODE]] = resp.status;
	nulls[cache->col[COL_RESPONSE_CODE]] = false;
	values[cache->col[COL_RESPONSE_BODY]] = resp.body;
	nulls[cache->col[COL_RESPONSE_BODY]] = resp.body_null;
	values[cache->col[COL_RESPONSE_HEADERS]] = resp.headers;
	nulls[cache->col[COL_RESPONSE_HEADERS]] = resp.headers_null;
	nulls[cache->col[COL_LOCK_TOKEN]] = true;
	if (!stored)
		nulls[cache->col[COL_EXPIRES_AT]] = true;
	oldcxt = MemoryContextSwitchTo(callcxt);
	answer = HeapTupleGetDatum(heap_form_tuple(cache->result_desc,
											   values, nulls));

	/* for the other columns of this row, after the calls this one made */
	idem_row_mark(&exec_row.mark, fcinfo, callcxt);
	for (int i = 0; i < EXEC_HANDLER; i++)
		exec_row.args[i] = datumCopy(PG_GETARG_DATUM(i), false, -1);
	exec_row.handler = handler;
	exec_row.answer = answer;
	MemoryContextSwitchTo(oldcxt);
	PG_RETURN_DATUM(answer);
}
