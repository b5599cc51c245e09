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

#include "fmgr.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/guc.h"

#include "idempotency.h"

PG_MODULE_MAGIC;

char	   *idem_session_tenant = NULL;
int			idem_default_ttl = 24 * 60 * 60;
int			idem_default_lock_timeout = 5 * 60;
int			idem_max_request_size = 1024 * 1024;
int			idem_max_response_size = 1024 * 1024;
int			idem_max_payload_size = 1024 * 1024;
int			idem_outbox_max_attempts = 10;
int			idem_outbox_retention = 7 * 24 * 60 * 60;
int			idem_stats_max_entries = 1000;
bool		idem_outbox_notify = true;
bool		idem_loaded_at_startup = false;

void		_PG_init(void);

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

	if (*cache != NULL)
		return *cache;

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
 * idem_check_tenant
 *		Defence in depth for applications that derive the tenant from an
 *		authentication token and SET LOCAL idempotency.tenant: every function
 *		that takes a tenant calls this before touching a table.
 */
void
idem_check_tenant(const char *tenant)
{
	if (idem_session_tenant == NULL || idem_session_tenant[0] == '\0')
		return;
	if (strcmp(tenant, idem_session_tenant) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("tenant \"%s\" does not match idempotency.tenant", tenant),
				 errdetail("This session is bound to tenant \"%s\".",
						   idem_session_tenant),
				 errhint("Pass the tenant the session was authenticated for, or reset idempotency.tenant.")));
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
							PGC_USERSET,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.max_request_size",
							gettext_noop("Largest request body idem_reserve accepts."),
							NULL,
							&idem_max_request_size,
							1024 * 1024, 1, INT_MAX,
							PGC_USERSET,
							GUC_UNIT_BYTE,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.max_response_size",
							gettext_noop("Largest stored response (body plus headers) idem_complete accepts."),
							NULL,
							&idem_max_response_size,
							1024 * 1024, 1, INT_MAX,
							PGC_USERSET,
							GUC_UNIT_BYTE,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.max_payload_size",
							gettext_noop("Largest outbox payload (plus headers) outbox_enqueue accepts."),
							NULL,
							&idem_max_payload_size,
							1024 * 1024, 1, INT_MAX,
							PGC_USERSET,
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
							NULL,
							&idem_outbox_retention,
							7 * 24 * 60 * 60, 0, INT_MAX,
							PGC_SUSET,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	/* outbox.c */
	DefineCustomBoolVariable("idempotency.outbox_notify",
							 gettext_noop("Whether outbox_enqueue and outbox_requeue send NOTIFY idempotency_outbox at commit."),
							 gettext_noop("Turn it off when workers only poll: PostgreSQL serializes the commits of transactions that notify."),
							 &idem_outbox_notify,
							 true,
							 PGC_USERSET,
							 0,
							 NULL, NULL, NULL);

	/*
	 * A PGC_POSTMASTER variable can only be created while the server starts
	 * (a backend loading the library later gets a FATAL error); it only
	 * sizes the shared memory that exists in that case anyway.
	 */
	if (process_shared_preload_libraries_in_progress)
		DefineCustomIntVariable("idempotency.stats_max_entries",
								gettext_noop("Number of (tenant, scope) pairs whose counters are kept in shared memory."),
								gettext_noop("When the table is full, the least used pairs are evicted and their counts added to tenant and scope \"(other)\"."),
								&idem_stats_max_entries,
								1000, 16, 1000000,
								PGC_POSTMASTER,
								0,
								NULL, NULL, NULL);

	MarkGUCPrefixReserved("idempotency");

	idem_stats_init();
}
