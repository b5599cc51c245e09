/*-------------------------------------------------------------------------
 *
 * fingerprint.c
 *
 * IDENTIFICATION
 *	  fingerprint.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "idempotency.h"
