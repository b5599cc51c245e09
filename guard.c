/*-------------------------------------------------------------------------
 *
 * guard.c
 *	  The coverage guard: a trigger function that refuses writes to a
 *	  business table from a transaction holding no idempotency
 *	  reservation, and the administrators' logged bypass.
 *
 * Idempotency on some steps of a multi-step flow but not on others lets a
 * retried request duplicate the unprotected step.  Attached to a table,
 *
 *	  CREATE TRIGGER charges_need_key
 *		  BEFORE INSERT OR UPDATE OR DELETE ON charges
 *		  FOR EACH STATEMENT
 *		  EXECUTE FUNCTION idempotency.idem_require_reservation('charges');
 *
 * makes every such write fail (SQLSTATE ID001) unless the transaction
 * holds a reservation it created or took over in one of the scopes named
 * by the trigger's arguments (any scope when there are none), or proved it
 * holds one with its lock token (idem_checkpoint, idem_complete).  keys.c
 * remembers those per transaction, so the check reads no table.
 *
 * idem_guard_bypass(reason) lets the rest of the current transaction write
 * without a reservation (migrations, operators' repairs).  Only roles
 * granted it may call it (idempotency_admin); every bypass is written to
 * the server log with the roles and the reason.
 *
 * IDENTIFICATION
 *	  guard.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "commands/trigger.h"
#include "fmgr.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"

#include "idempotency.h"

PG_FUNCTION_INFO_V1(idem_require_reservation);
PG_FUNCTION_INFO_V1(idem_guard_bypass);

/*
 * The transaction that called idem_guard_bypass, if any: a 64-bit
 * transaction id never comes back, so the bypass ends with its transaction
 * without a callback.  Within it, the subtransaction that owns the bypass:
 * rolling it back (ROLLBACK TO SAVEPOINT) ends the bypass, as it drops the
 * reservations made in it; releasing it hands the bypass to its parent.
 */
static FullTransactionId guard_bypass_fxid = {0};
static SubTransactionId guard_bypass_subid = InvalidSubTransactionId;
static bool guard_callback_registered = false;

static void
guard_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					   SubTransactionId parentSubid,
					   void *arg pg_attribute_unused())
{
	if (!FullTransactionIdIsValid(guard_bypass_fxid) ||
		mySubid != guard_bypass_subid)
		return;
	if (event == SUBXACT_EVENT_ABORT_SUB)
		guard_bypass_fxid = InvalidFullTransactionId;
	else if (event == SUBXACT_EVENT_COMMIT_SUB)
		guard_bypass_subid = parentSubid;
}

/* The scopes a guard accepts, quoted and comma-separated, for messages. */
static char *
guard_scope_list(Trigger *trigger)
{
	StringInfoData buf;

	initStringInfo(&buf);
	for (int i = 0; i < trigger->tgnargs; i++)
	{
		if (i > 0)
			appendStringInfoString(&buf, ", ");
		appendStringInfo(&buf, "\"%s\"", trigger->tgargs[i]);
	}
	return buf.data;
}

/*
 * idem_require_reservation() RETURNS trigger
 *		The coverage guard.  Any event (INSERT, UPDATE, DELETE, TRUNCATE),
 *		BEFORE or AFTER, per statement or per row; its arguments are the
 *		scopes whose reservations let the write through.
 */
Datum
idem_require_reservation(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	Trigger    *trigger;
	Relation	rel;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("idem_require_reservation() must be called as a trigger"),
				 errhint("Attach it to a table with CREATE TRIGGER ... EXECUTE FUNCTION %s('scope').",
						 quote_qualified_identifier(get_namespace_name(get_func_namespace(fcinfo->flinfo->fn_oid)),
													"idem_require_reservation"))));

	trigger = trigdata->tg_trigger;
	rel = trigdata->tg_relation;

	/*
	 * An INSTEAD OF trigger that returns the row tells PostgreSQL the write
	 * was done: the view would take writes and keep none
	 */
	if (TRIGGER_FIRED_INSTEAD(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("idem_require_reservation() cannot be an INSTEAD OF trigger"),
				 errdetail("Trigger \"%s\" on %s would report writes to the view as done without making them.",
						   trigger->tgname,
						   quote_qualified_identifier(get_namespace_name(RelationGetNamespace(rel)),
													  RelationGetRelationName(rel))),
				 errhint("Create it BEFORE or AFTER on the tables the view writes to.")));

	if (!(FullTransactionIdIsValid(guard_bypass_fxid) &&
		  FullTransactionIdEquals(guard_bypass_fxid,
								  GetTopFullTransactionIdIfAny())) &&
		!idem_holds_reservation(trigger->tgargs, trigger->tgnargs))
	{
		const char *event;
		char	   *table = quote_qualified_identifier(get_namespace_name(RelationGetNamespace(rel)),
													   RelationGetRelationName(rel));

		if (TRIGGER_FIRED_BY_INSERT(trigdata->tg_event))
			event = "INSERT into";
		else if (TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event))
			event = "UPDATE of";
		else if (TRIGGER_FIRED_BY_DELETE(trigdata->tg_event))
			event = "DELETE from";
		else
			event = "TRUNCATE of";
		if (trigger->tgnargs == 0)
			ereport(ERROR,
					(errcode(MAKE_SQLSTATE('I', 'D', '0', '0', '1')),
					 errmsg("%s %s requires an idempotency reservation",
							event, table),
					 errdetail("Trigger \"%s\" accepts a reservation in any scope; this transaction holds none.",
							   trigger->tgname),
					 errhint("Call idem_reserve() for the request in this transaction before writing to %s; a two-phase attempt proves its reservation with idem_checkpoint() and its lock_token. Migrations run idem_guard_bypass(reason) as idempotency_admin.",
							 table)));
		ereport(ERROR,
				(errcode(MAKE_SQLSTATE('I', 'D', '0', '0', '1')),
				 errmsg("%s %s requires an idempotency reservation",
						event, table),
				 errdetail("Trigger \"%s\" accepts reservations in scopes %s; this transaction holds none.",
						   trigger->tgname, guard_scope_list(trigger)),
				 errhint("Call idem_reserve() for the request in one of those scopes in this transaction before writing to %s; a two-phase attempt proves its reservation with idem_checkpoint() and its lock_token. Migrations run idem_guard_bypass(reason) as idempotency_admin.",
						 table)));
	}

	if (TRIGGER_FIRED_FOR_STATEMENT(trigdata->tg_event) ||
		TRIGGER_FIRED_AFTER(trigdata->tg_event))
		return PointerGetDatum(NULL);
	if (TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event))
		return PointerGetDatum(trigdata->tg_newtuple);
	return PointerGetDatum(trigdata->tg_trigtuple);
}

/*
 * idem_guard_bypass(reason text) RETURNS void
 *		Let the rest of this transaction write to guarded tables without a
 *		reservation.  Granted to idempotency_admin only; logged.
 */
Datum
idem_guard_bypass(PG_FUNCTION_ARGS)
{
	char	   *reason;

	if (PG_ARGISNULL(0))
		idem_null_argument("reason");
	reason = text_to_cstring(PG_GETARG_TEXT_PP(0));
	if (reason[strspn(reason, " \t\n\r\f\v")] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a coverage guard bypass needs a reason"),
				 errhint("Say why the writes need no idempotency key, such as \"migration 0042: backfill charges\"; it goes to the server log.")));
	if (!IsTransactionBlock())
		ereport(ERROR,
				(errcode(ERRCODE_NO_ACTIVE_SQL_TRANSACTION),
				 errmsg("idem_guard_bypass() must be called inside a transaction block"),
				 errhint("BEGIN, call idem_guard_bypass(reason), write, then COMMIT: the bypass ends with the transaction.")));

	/* an xid ties the bypass to this transaction and no other */
	if (!guard_callback_registered)
	{
		RegisterSubXactCallback(guard_subxact_callback, NULL);
		guard_callback_registered = true;
	}
	/* a second bypass in the transaction keeps the first one's owner */
	if (!(FullTransactionIdIsValid(guard_bypass_fxid) &&
		  FullTransactionIdEquals(guard_bypass_fxid,
								  GetTopFullTransactionIdIfAny())))
	{
		guard_bypass_fxid = GetTopFullTransactionId();
		guard_bypass_subid = GetCurrentSubTransactionId();
	}

	ereport(LOG,
			(errmsg("idempotency coverage guard bypassed by role \"%s\" (session user \"%s\"): %s",
					GetUserNameFromId(GetUserId(), false),
					GetUserNameFromId(GetSessionUserId(), false), reason),
			 errhidestmt(true)));
	ereport(NOTICE,
			(errmsg("the coverage guard is off for the rest of this transaction"),
			 errdetail("The bypass and its reason were written to the server log.")));
	PG_RETURN_VOID();
}
