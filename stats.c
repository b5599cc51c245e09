/*-------------------------------------------------------------------------
 *
 * stats.c
 *
 * IDENTIFICATION
 *	  stats.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "idempotency.h"

void
idem_stats_init(void)
{
}

void
idem_stats_count(const char *tenant, const char *scope,
				 IdemCounter counter, int64 n)
{
	(void) tenant;
	(void) scope;
	(void) counter;
	(void) n;
}
