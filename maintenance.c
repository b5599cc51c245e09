/*-------------------------------------------------------------------------
 *
 * maintenance.c
 *
 * IDENTIFICATION
 *	  maintenance.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "idempotency.h"
