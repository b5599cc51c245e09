/*-------------------------------------------------------------------------
 *
 * idempotency.h
 *	  Declarations shared by the modules of the idempotency extension.
 *
 * The extension is split into one C file per area: module entry and GUCs
 * (idempotency.c), canonical request fingerprints (fingerprint.c), the key
 * lifecycle (keys.c), the transactional outbox (outbox.c), maintenance
 * (maintenance.c) and shared-memory counters (stats.c).  Only what crosses
 * a file boundary is declared here.
 *
 * IDENTIFICATION
 *	  idempotency.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_H
#define IDEMPOTENCY_H

#include "postgres.h"

#include "fmgr.h"
#include "datatype/timestamp.h"
#include "utils/array.h"
#include "utils/inval.h"
#include "utils/jsonb.h"

/* Length of a request fingerprint: SHA-256. */
#define IDEM_FINGERPRINT_LEN 32

/* Longest idempotency key accepted, in bytes (printable ASCII only). */
#define IDEM_MAX_KEY_LEN 255

/* Longest tenant or scope name, in bytes. */
#define IDEM_MAX_NAME_LEN 255

/* ----------------------------------------------------------------
 * idempotency.c: configuration (GUCs)
 * ----------------------------------------------------------------
 */
extern char *idem_session_tenant;	/* idempotency.tenant, "" when unset */
extern int	idem_default_ttl;	/* seconds */
extern int	idem_default_lock_timeout;	/* seconds */
extern int	idem_max_request_size;	/* bytes */
extern int	idem_max_response_size; /* bytes */
extern int	idem_max_keys_per_transaction;
extern int	idem_max_payload_size;	/* bytes */
extern int	idem_outbox_max_attempts;
extern int	idem_outbox_retention;	/* seconds */
extern int	idem_stats_max_entries; /* (tenant, scope) pairs in shared memory */

/* outbox.c: idempotency.outbox_notify, NOTIFY idempotency_outbox at commit */
extern bool idem_outbox_notify;

/* outbox.c: idempotency.outbox_emit_messages, logical decoding messages */
extern bool idem_outbox_emit_messages;

/* True while _PG_init runs from shared_preload_libraries. */
extern bool idem_loaded_at_startup;

/*
 * Refuse a call naming "tenant" when the calling role is bound to another
 * tenant (idem_bind_tenant) or the session set idempotency.tenant to
 * another one (SQLSTATE 42501).  "tenant" must not be NULL: callers check
 * that first (22004) so the message can name the argument.
 */
extern void idem_check_tenant(const char *tenant);

/* An interval of "seconds" (a GUC value), and the same palloc'd as a Datum. */
/*
 * Register "func" to run on every relcache invalidation of this backend.
 * The extension's caches share one slot of PostgreSQL's table of relcache
 * callbacks, which holds 10 per backend for everything loaded (Citus takes
 * five).
 */
extern void idem_register_relcache_callback(RelcacheCallbackFunction func);

extern Interval idem_seconds_interval(int seconds);
extern Datum idem_interval_datum(Interval iv);

/* 22001 when a tenant or scope name is over IDEM_MAX_NAME_LEN bytes. */
extern void idem_check_name_length(const char *what, const char *value);

/*
 * The longest interval argument (a ttl, lock_timeout, deliver_after, lease,
 * retry_in or older_than): longer ones would hold a row for good or
 * overflow the timestamp they are added to.
 */
#define IDEM_MAX_INTERVAL_YEARS 1000
extern void idem_check_interval(Interval *iv, const char *name, bool zero_ok,
								const char *hint);

/* The tenant the calling role is bound to, or NULL. */
extern const char *idem_bound_tenant(void);
extern void idem_require_role_confined(Oid role);

/*
 * The tenant a call that names none is confined to (binding, else
 * idempotency.tenant), or NULL for any.
 */
extern const char *idem_effective_tenant(void);

/*
 * The hot entry points (idem_reserve, idem_complete, outbox_enqueue,
 * outbox_claim, outbox_ack) are declared SECURITY INVOKER and do in C what
 * SECURITY DEFINER with SET search_path does for the others: call "body"
 * as the owner of the function called, with search_path pinned to
 * pg_catalog (and the session's temporary schema last), and restore both
 * on the way out.  An error restores both too: the (sub)transaction's abort
 * resets the user and pops the search path.
 */
extern Datum idem_call_as_owner(FunctionCallInfo fcinfo, PGFunction body);

/* one row of a select list calling a function once per column */
typedef struct IdemRowMark
{
	MemoryContext cxt;			/* the row's; NULL once reset or deleted */
	FmgrInfo   *site;			/* the call marked */
	uint64		calls;			/* entry point calls when it was marked */
} IdemRowMark;

extern void idem_entry_call(void);
extern void idem_row_mark(IdemRowMark *mark, FunctionCallInfo fcinfo,
						  MemoryContext cxt);
extern bool idem_row_repeat(IdemRowMark *mark, FunctionCallInfo fcinfo,
							MemoryContext cxt);
extern bool idem_complete_stores(FmgrInfo *flinfo, Datum scope, int32 code);
extern int	idem_pin_search_path(void);
extern void idem_unpin_search_path(int save_nestlevel);

/* SPI_connect and SPI_execute_plan with their results checked. */
struct _SPI_plan;
extern void idem_spi_connect(void);
extern int	idem_spi_execute(struct _SPI_plan *plan, Datum *values,
							 const char *nulls, bool read_only, long count);

/* A NULL argument "name" is an error (22004) with a hint. */
#if PG_VERSION_NUM >= 180000
pg_noreturn extern void idem_null_argument(const char *name);
#else
extern void idem_null_argument(const char *name) pg_attribute_noreturn();
#endif
extern void idem_require_writable(const char *what);

/* The hint of a serialization failure of the extension's functions. */
#define IDEM_SERIALIZATION_HINT \
	"Retry the whole transaction; under READ COMMITTED this does not happen."
extern void idem_require_arg(FunctionCallInfo fcinfo, int argno,
							 const char *name);

/*
 * An idempotency key: present (22004), at most IDEM_MAX_KEY_LEN bytes
 * (22001), printable ASCII (22021).  NULL counts as missing.
 */
extern void idem_check_key(text *key);

/*
 * The saved SPI plan of "sql" in *cache, prepared (with cursor_options,
 * e.g. CURSOR_OPT_GENERIC_PLAN) and kept on first use.  Between SPI_connect
 * and SPI_finish.
 */
extern struct _SPI_plan *idem_saved_plan(struct _SPI_plan **cache,
										 const char *sql, int nargs,
										 Oid *argtypes, int cursor_options);

/*
 * A fresh random token (a version 4 UUID from the strong random source),
 * for key locks and outbox leases.
 */
struct pg_uuid_t;
extern void idem_new_token(struct pg_uuid_t *token);

/* keys.c: the OID of an enum value of the extension's types */
extern Oid	idem_enum_label_oid(Oid typid, const char *label);

/* ----------------------------------------------------------------
 * keys.c: what the coverage guard (guard.c) asks
 * ----------------------------------------------------------------
 */

/*
 * Whether this transaction holds a reservation it created, took over or
 * proved with its lock token (idem_checkpoint, idem_complete), in one of
 * "scopes" (any scope when nscopes is 0).
 */
extern bool idem_holds_reservation(char **scopes, int nscopes);

/*
 * Take a key's or an ordering key's lock until the transaction ends,
 * counted against idempotency.max_keys_per_transaction (53400 beyond it).
 */
struct LOCKTAG;
extern void idem_lock_wait(const struct LOCKTAG *tag);

/* ----------------------------------------------------------------
 * ratelimit.c: rates and quotas of new keys per tenant, in shared memory
 * ----------------------------------------------------------------
 */
extern void idem_rate_init(void);
extern bool idem_rate_admit(const char *tenant, const char *scope,
							double per_second, int burst, int *retry_after_s);
extern void idem_rate_refund(const char *tenant, const char *scope,
							 double per_second, int burst);

/* max_live_keys: the answers of idem_quota_admit */
typedef enum IdemQuota
{
	IDEM_QUOTA_ADMITTED,		/* room for one more key: taken */
	IDEM_QUOTA_FULL,			/* at the quota: rate_limited */
	IDEM_QUOTA_RECOUNT			/* count the live keys, then decide */
} IdemQuota;

extern IdemQuota idem_quota_admit(const char *tenant, const char *scope,
								  int64 max_live, int *retry_after_s);
extern uint64 idem_quota_mark(const char *tenant, const char *scope);
extern bool idem_quota_recounted(const char *tenant, const char *scope,
								 int64 max_live, int64 live,
								 TimestampTz earliest_expiry, uint64 mark,
								 int *retry_after_s);

/* ----------------------------------------------------------------
 * fingerprint.c: RFC 8785 canonical JSON and SHA-256
 * ----------------------------------------------------------------
 */

/*
 * Compute the SHA-256 of the canonical form of "request" with the members
 * named by the JSON Pointers in "ignore" (a text[] or NULL) removed.
 * Errors: 22003 for a number outside the double range; for the pointers
 * (checked before the request is read) 22P02 when malformed, 22023 for ""
 * (the whole request), 22004 for a NULL element.  Frees what it allocates.
 * Returns the length of the canonical text hashed.
 */
extern Size idem_compute_fingerprint(Jsonb *request, ArrayType *ignore,
									 uint8 *result);

/* ----------------------------------------------------------------
 * stats.c: cumulative counters per (tenant, scope) in shared memory
 * ----------------------------------------------------------------
 */
typedef enum IdemCounter
{
	IDEM_STAT_CREATED,
	IDEM_STAT_REPLAYED,
	IDEM_STAT_IN_PROGRESS,
	IDEM_STAT_MISMATCHED,
	IDEM_STAT_STALE,
	IDEM_STAT_COMPLETED,
	IDEM_STAT_RELEASED,
	IDEM_STAT_REAPED,
	IDEM_STAT_SWEPT,
	IDEM_STAT_RATE_LIMITED,
	IDEM_STAT_NCOUNTERS
} IdemCounter;

/*
 * Add "n" to one counter of (tenant, scope).  Cheap, never errors, and a
 * no-op when the library was not preloaded (no shared memory).
 */
extern void idem_stats_count(const char *tenant, const char *scope,
							 IdemCounter counter, int64 n);

/* Module initialisation, called from _PG_init. */
extern void idem_stats_init(void);

/* Parameters of the other modules, defined by each from _PG_init. */
extern void idem_keys_init(void);
extern void idem_outbox_init(void);

/* ----------------------------------------------------------------
 * The outbox's rule for a lost lease, shared by outbox_claim (which meets
 * expired leases among due rows) and the maintenance's lease reclaim: a
 * lease that expired counts as a failed attempt, and the message is dead
 * once that attempt was its last.  SQL fragments over the outbox row "o".
 * ----------------------------------------------------------------
 */
#define IDEM_OUTBOX_LOST_LEASE_IS_LAST \
	"o.attempts OPERATOR(pg_catalog.+) 1 OPERATOR(pg_catalog.>=) o.max_attempts"
#define IDEM_OUTBOX_LOST_LEASE_ERROR \
	"'lease of worker \"' OPERATOR(pg_catalog.||) o.leased_by" \
	" OPERATOR(pg_catalog.||) '\" expired'"

/* Whether idempotency.outbox has outbox_lease_idx (1.1): outbox.c */
extern bool idem_outbox_has_lease_idx(void);
extern void idem_outbox_lock_for_update(void);

/* ----------------------------------------------------------------
 * citus.c: running on Citus (tables distributed by idem_citus_distribute)
 * ----------------------------------------------------------------
 */

/* The relation keys_fetch probes: keys_relid, or the tenant's local shard. */
extern Oid	idem_keys_probe_relid(Oid keys_relid, Datum tenant);

/* A reference table read directly: its placement on this node, or relid. */
extern Oid	idem_citus_local_relid(Oid relid);

/* The shell table a trigger on a shard of scopes or tenant_bindings stands for. */
struct RelationData;
extern Oid	idem_citus_changed_relid(struct RelationData *rel);

/*
 * Per-node statements (maintenance, outbox claims) run once per pass: one
 * pass on a plain server, one per local shard group on Citus.  Between
 * idem_citus_enter and idem_citus_leave, idem_saved_plan prepares the
 * statements on the pass's shards.
 */
extern int	idem_citus_passes(void);

/* Whether the keys table is distributed (this node's keys are in shards). */
extern bool idem_citus_distributed(void);
extern bool idem_citus_custom_plans(void);
extern void idem_citus_init(void);
extern int	idem_citus_first_pass(int npasses);
extern void idem_citus_enter(int pass);
extern void idem_citus_leave(void);
extern Oid	idem_citus_pass_keys_relid(int pass);
extern bool idem_citus_pass_active;
extern struct _SPI_plan *idem_citus_pass_plan(struct _SPI_plan **cache,
											  const char *sql, int nargs,
											  Oid *argtypes,
											  int cursor_options);

#endif							/* IDEMPOTENCY_H */
