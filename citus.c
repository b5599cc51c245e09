/*-------------------------------------------------------------------------
 *
 * citus.c
 *	  Running on Citus: the local shards of idempotency.keys and
 *	  idempotency.outbox.
 *
 * idem_citus_distribute() (install/60_citus.sql) distributes keys and
 * outbox by tenant_id, colocated, makes scopes and tenant_bindings
 * reference tables, and delegates every function whose first argument is
 * the tenant to the node holding the tenant's shard.  What runs there
 * reaches the tables in two ways:
 *
 * - Statements (SPI) name the distributed tables; Citus plans them on the
 *	 node and executes them on the local shard.
 * - The key functions' hot read probes the primary key directly, under
 *	 the planner: on Citus it must open the shard relation itself
 *	 (idempotency.keys_<shardid>), not the table's empty shell.
 *	 idem_keys_probe_relid() finds it from the tenant's hash, as Citus
 *	 does, in a per-backend copy of the shard metadata.  A tenant whose
 *	 shard is not on this node is an error: the key's lock lives where its
 *	 shard lives, and a key function running elsewhere could not see a
 *	 reservation held there.
 *
 * Maintenance and outbox claims run per node, on each local group of
 * colocated shards in turn ("passes"): a statement that spans shards
 * cannot lock rows FOR UPDATE SKIP LOCKED, so inside a pass the saved
 * statements are prepared once more with the shell tables' names replaced
 * by the local shards' (idem_citus_pass_plan, called by idem_saved_plan).
 *
 * On a server without Citus (or with the tables not distributed) the probe
 * opens idempotency.keys, there is one pass, and nothing is rewritten.
 * Whether the tables are distributed is looked up once per backend and
 * again only after a relcache invalidation of one of them, which Citus
 * sends whenever their shard metadata changes.
 *
 * IDENTIFICATION
 *	  citus.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "access/htup_details.h"
#include "catalog/pg_language.h"
#include "catalog/pg_proc.h"
#include "lib/stringinfo.h"
#include "nodes/nodeFuncs.h"
#include "nodes/params.h"
#include "optimizer/clauses.h"
#include "optimizer/optimizer.h"
#include "optimizer/planner.h"
#include "parser/parsetree.h"
#include "tcop/utility.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/syscache.h"

#include "idempotency.h"

/* One shard of keys, with its colocated outbox shard. */
typedef struct CitusShard
{
	int32		min;			/* hash range, inclusive */
	int32		max;
	int64		keys_shardid;
	Oid			keys_shard;		/* InvalidOid: not on this node */
	int64		outbox_shardid; /* 0: no colocated outbox shard */
	Oid			outbox_shard;
} CitusShard;

/* A saved plan of a statement rewritten for one pass. */
typedef struct PassPlanKey
{
	SPIPlanPtr *cache;			/* the caller's plan cache: the statement */
	int64		keys_shardid;	/* the pass */
} PassPlanKey;

typedef struct PassPlanEntry
{
	PassPlanKey key;
	SPIPlanPtr	plan;
} PassPlanEntry;

static MemoryContext citus_cxt = NULL;
static bool citus_valid = false;

/* citus_ensure is reading the catalogs (idem_citus_custom_plans) */
static bool citus_ensuring = false;
static bool citus_callback_registered = false;
static bool citus_distributed = false;
static Oid	citus_keys_relid = InvalidOid;
static Oid	citus_outbox_relid = InvalidOid;
static Oid	citus_scopes_relid = InvalidOid;
static Oid	citus_scopes_shard = InvalidOid;	/* local placement, or invalid */
static Oid	citus_bindings_relid = InvalidOid;
static Oid	citus_bindings_shard = InvalidOid;
static Oid	citus_tenant_collation = InvalidOid;
static int	citus_nshards = 0;
static CitusShard *citus_shards = NULL; /* by min */
static int	citus_npasses = 0;
static int *citus_passes = NULL;	/* indexes of local shards */
static HTAB *citus_pass_plans = NULL;

/* The pass being run, or -1; idem_saved_plan tests the flag. */
static int	citus_pass = -1;
bool		idem_citus_pass_active = false;
static int	citus_pass_guc_level = 0;
static SubTransactionId citus_pass_subid = InvalidSubTransactionId;
static int	citus_pass_rotor = 0;

static void
citus_relcache_callback(Datum arg, Oid relid)
{
	(void) arg;
	if (!citus_valid)
		return;
	if (relid == InvalidOid || relid == citus_keys_relid ||
		relid == citus_outbox_relid || relid == citus_scopes_relid ||
		relid == citus_bindings_relid ||
		(OidIsValid(citus_scopes_shard) && relid == citus_scopes_shard) ||
		(OidIsValid(citus_bindings_shard) && relid == citus_bindings_shard))
		citus_valid = false;
	else if (citus_distributed)
	{
		for (int i = 0; i < citus_nshards; i++)
			if (relid == citus_shards[i].keys_shard ||
				relid == citus_shards[i].outbox_shard)
			{
				citus_valid = false;
				break;
			}
	}
}

/* The shard relation "<relname>_<shardid>" in schema idempotency. */
static Oid
citus_shard_relid(Oid nsp, const char *relname, int64 shardid)
{
	char		name[NAMEDATALEN * 2];

	snprintf(name, sizeof(name), "%s_" INT64_FORMAT, relname, shardid);
	return get_relname_relid(name, nsp);
}

/*
 * Method and colocation of a Citus table ('\0' when it is not one), and,
 * for a reference table, its shard when this node holds a placement.
 */
static char
citus_table_method(Oid relid, int32 *colocation, Oid nsp, const char *relname,
				   Oid *local_shard)
{
	static SPIPlanPtr plan = NULL;
	Oid			argtypes[1] = {OIDOID};
	Datum		values[1];
	bool		isnull;
	char		method;

	idem_saved_plan(&plan,
					"SELECT p.partmethod, p.colocationid,"
					" (SELECT s.shardid FROM pg_catalog.pg_dist_shard s"
					"   JOIN pg_catalog.pg_dist_placement pl"
					"     ON pl.shardid OPERATOR(pg_catalog.=) s.shardid"
					"  WHERE s.logicalrelid OPERATOR(pg_catalog.=) p.logicalrelid"
					"    AND pl.groupid OPERATOR(pg_catalog.=)"
					"        (SELECT groupid FROM pg_catalog.pg_dist_local_group)"
					"  LIMIT 1)"
					" FROM pg_catalog.pg_dist_partition p"
					" WHERE p.logicalrelid OPERATOR(pg_catalog.=) $1",
					1, argtypes, 0);
	values[0] = ObjectIdGetDatum(relid);
	idem_spi_execute(plan, values, NULL, true, 1);
	if (local_shard != NULL)
		*local_shard = InvalidOid;
	if (SPI_processed == 0)
		return '\0';
	method = DatumGetChar(SPI_getbinval(SPI_tuptable->vals[0],
										SPI_tuptable->tupdesc, 1, &isnull));
	*colocation = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0],
											  SPI_tuptable->tupdesc, 2,
											  &isnull));
	if (local_shard != NULL && method == 'n')
	{
		Datum		d = SPI_getbinval(SPI_tuptable->vals[0],
									  SPI_tuptable->tupdesc, 3, &isnull);

		if (!isnull)
			*local_shard = citus_shard_relid(nsp, relname, DatumGetInt64(d));
	}
	return method;
}

/* Load the hash-distributed shards of keys, with outbox's beside them. */
static void
citus_load_shards(Oid nsp)
{
	static SPIPlanPtr plan = NULL;
	Oid			argtypes[2] = {OIDOID, OIDOID};
	Datum		values[2];
	MemoryContext oldcxt;
	uint64		n;

	idem_saved_plan(&plan,
					"SELECT k.shardid, k.shardminvalue::pg_catalog.int4,"
					" k.shardmaxvalue::pg_catalog.int4,"
					" EXISTS (SELECT FROM pg_catalog.pg_dist_placement pl"
					"  WHERE pl.shardid OPERATOR(pg_catalog.=) k.shardid"
					"    AND pl.groupid OPERATOR(pg_catalog.=)"
					"        (SELECT groupid FROM pg_catalog.pg_dist_local_group)),"
					" o.shardid"
					" FROM pg_catalog.pg_dist_shard k"
					" LEFT JOIN pg_catalog.pg_dist_shard o"
					"   ON o.logicalrelid OPERATOR(pg_catalog.=) $2"
					"  AND o.shardminvalue OPERATOR(pg_catalog.=) k.shardminvalue"
					" WHERE k.logicalrelid OPERATOR(pg_catalog.=) $1"
					" ORDER BY 2",
					2, argtypes, 0);
	values[0] = ObjectIdGetDatum(citus_keys_relid);
	values[1] = ObjectIdGetDatum(citus_outbox_relid);
	idem_spi_execute(plan, values, NULL, true, 0);
	n = SPI_processed;
	oldcxt = MemoryContextSwitchTo(citus_cxt);
	citus_shards = palloc0(sizeof(CitusShard) * Max(n, 1));
	citus_passes = palloc0(sizeof(int) * Max(n, 1));
	MemoryContextSwitchTo(oldcxt);
	citus_nshards = (int) n;
	citus_npasses = 0;
	for (uint64 i = 0; i < n; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		CitusShard *s = &citus_shards[i];
		bool		isnull;
		bool		local;
		Datum		d;

		s->keys_shardid = DatumGetInt64(SPI_getbinval(tup, desc, 1, &isnull));
		s->min = DatumGetInt32(SPI_getbinval(tup, desc, 2, &isnull));
		s->max = DatumGetInt32(SPI_getbinval(tup, desc, 3, &isnull));
		local = DatumGetBool(SPI_getbinval(tup, desc, 4, &isnull));
		d = SPI_getbinval(tup, desc, 5, &isnull);
		s->outbox_shardid = isnull ? 0 : DatumGetInt64(d);
		s->keys_shard = local ?
			citus_shard_relid(nsp, "keys", s->keys_shardid) : InvalidOid;
		s->outbox_shard = local && s->outbox_shardid != 0 ?
			citus_shard_relid(nsp, "outbox", s->outbox_shardid) : InvalidOid;
		if (OidIsValid(s->keys_shard))
			citus_passes[citus_npasses++] = (int) i;
	}
}

/*
 * Make sure the Citus metadata copy is current.  Cheap when it is: the
 * plain server's path costs one flag test.
 */
static void
citus_ensure(void)
{
	Oid			nsp;
	int32		keys_coloc = 0;
	int32		outbox_coloc = 0;
	int32		ignore;
	char		keys_method;
	char		outbox_method;

	if (citus_valid)
		return;
	citus_ensuring = true;
	if (!citus_callback_registered)
	{
		idem_register_relcache_callback(citus_relcache_callback);
		citus_callback_registered = true;
	}
	if (citus_pass_plans != NULL)
	{
		HASH_SEQ_STATUS seq;
		PassPlanEntry *entry;

		hash_seq_init(&seq, citus_pass_plans);
		while ((entry = hash_seq_search(&seq)) != NULL)
			if (entry->plan != NULL)
				SPI_freeplan(entry->plan);
	}
	if (citus_cxt == NULL)
		citus_cxt = AllocSetContextCreate(CacheMemoryContext,
										  "idempotency citus cache",
										  ALLOCSET_SMALL_SIZES);
	else
		MemoryContextReset(citus_cxt);
	citus_shards = NULL;
	citus_passes = NULL;
	citus_nshards = 0;
	citus_npasses = 0;
	citus_pass_plans = NULL;
	citus_distributed = false;
	citus_scopes_shard = InvalidOid;
	citus_bindings_shard = InvalidOid;

	nsp = get_namespace_oid("idempotency", false);
	citus_keys_relid = get_relname_relid("keys", nsp);
	citus_outbox_relid = get_relname_relid("outbox", nsp);
	citus_scopes_relid = get_relname_relid("scopes", nsp);
	citus_bindings_relid = get_relname_relid("tenant_bindings", nsp);
	if (OidIsValid(citus_keys_relid))
	{
		Oid			typid;
		int32		typmod;

		/* Citus hashes the distribution column with its collation */
		get_atttypetypmodcoll(citus_keys_relid,
							  get_attnum(citus_keys_relid, "tenant_id"),
							  &typid, &typmod, &citus_tenant_collation);
	}

	/* no Citus in this database: nothing is distributed */
	if (!OidIsValid(get_relname_relid("pg_dist_partition",
									  PG_CATALOG_NAMESPACE)) ||
		!OidIsValid(citus_keys_relid))
	{
		citus_valid = true;
		citus_ensuring = false;
		return;
	}

	idem_spi_connect();
	keys_method = citus_table_method(citus_keys_relid, &keys_coloc, nsp,
									 "keys", NULL);
	outbox_method = OidIsValid(citus_outbox_relid) ?
		citus_table_method(citus_outbox_relid, &outbox_coloc, nsp, "outbox",
						   NULL) : '\0';
	if (OidIsValid(citus_scopes_relid))
		(void) citus_table_method(citus_scopes_relid, &ignore, nsp, "scopes",
								  &citus_scopes_shard);
	if (OidIsValid(citus_bindings_relid))
		(void) citus_table_method(citus_bindings_relid, &ignore, nsp,
								  "tenant_bindings", &citus_bindings_shard);
	if (keys_method == 'h')
	{
		if (outbox_method != 'h' || outbox_coloc != keys_coloc)
		{
			SPI_finish();
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("idempotency.keys is distributed but idempotency.outbox is not colocated with it"),
					 errhint("Distribute the extension's tables with idem_citus_distribute().")));
		}
		citus_distributed = true;
		citus_load_shards(nsp);
	}
	else if (keys_method != '\0')
	{
		SPI_finish();
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idempotency.keys is a Citus table not distributed by hash"),
				 errhint("Undistribute it, then distribute the extension's tables with idem_citus_distribute().")));
	}
	SPI_finish();
	citus_valid = true;
	citus_ensuring = false;
}

/* The shard holding "tenant" (its hash range), or NULL. */
static CitusShard *
citus_find_shard(Datum tenant)
{
	int32		hash;
	int			lo = 0;
	int			hi = citus_nshards - 1;

	hash = DatumGetInt32(DirectFunctionCall1Coll(hashtext,
												 citus_tenant_collation,
												 tenant));
	while (lo <= hi)
	{
		int			mid = (lo + hi) / 2;

		if (hash < citus_shards[mid].min)
			hi = mid - 1;
		else if (hash > citus_shards[mid].max)
			lo = mid + 1;
		else
			return &citus_shards[mid];
	}
	return NULL;
}

/*
 * idem_keys_probe_relid
 *		The relation keys_fetch probes for "tenant": idempotency.keys
 *		("keys_relid") itself, or on Citus the tenant's shard on this node.
 */
Oid
idem_keys_probe_relid(Oid keys_relid, Datum tenant)
{
	CitusShard *shard;

	citus_ensure();
	if (!citus_distributed)
		return keys_relid;
	shard = citus_find_shard(tenant);
	if (shard == NULL)
		elog(ERROR, "no shard of idempotency.keys covers tenant \"%s\"",
			 TextDatumGetCString(tenant));
	if (!OidIsValid(shard->keys_shard))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the shard of tenant \"%s\" is not on this node",
						TextDatumGetCString(tenant)),
				 errdetail("idempotency.keys is distributed with Citus; the key functions run on the node holding the tenant's shard (shard " INT64_FORMAT ").",
						   shard->keys_shardid),
				 errhint("Call the function as a statement of its own with literals or parameters as arguments, SELECT idem_reserve($1, ...), not a volatile expression such as gen_random_uuid(), and with plan_cache_mode other than force_generic_plan (a generic plan is not delegated), so that Citus delegates it to that node; run idem_citus_distribute() once after CREATE EXTENSION citus.  In a transaction open while the tenant's shard was moved, retry the transaction.")));
	return shard->keys_shard;
}

/*
 * idem_citus_local_relid
 *		For a reference table of the extension (scopes, tenant_bindings)
 *		read directly, its placement on this node; otherwise "relid".
 */
Oid
idem_citus_local_relid(Oid relid)
{
	citus_ensure();
	if (relid == citus_bindings_relid && OidIsValid(citus_bindings_shard))
		return citus_bindings_shard;
	if (relid == citus_scopes_relid && OidIsValid(citus_scopes_shard))
		return citus_scopes_shard;
	return relid;
}

/*
 * idem_citus_changed_relid
 *		The relation whose relcache entry a change to "rel" must invalidate
 *		for the backends' caches: on Citus, a trigger of the extension's
 *		reference tables fires on the shard ("scopes_102040"), whose shell
 *		("scopes") is what the caches watch.  Looked up by name: the shard
 *		of a table is "<table>_<shardid>" in the table's schema.
 */
Oid
idem_citus_changed_relid(Relation rel)
{
	const char *name = RelationGetRelationName(rel);
	const char *us = strrchr(name, '_');
	char		base[NAMEDATALEN];
	Oid			relid;

	if (us == NULL || us == name || us[1] == '\0' ||
		strspn(us + 1, "0123456789") != strlen(us + 1))
		return InvalidOid;
	memcpy(base, name, us - name);
	base[us - name] = '\0';
	if (strcmp(base, "scopes") != 0 && strcmp(base, "tenant_bindings") != 0)
		return InvalidOid;
	relid = get_relname_relid(base, RelationGetNamespace(rel));
	return relid;
}

/* ----------------------------------------------------------------
 * Passes: one per local shard group
 * ----------------------------------------------------------------
 */

static void
citus_pass_xact_callback(XactEvent event, void *arg)
{
	(void) arg;
	if (event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT ||
		event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT ||
		event == XACT_EVENT_PREPARE)
	{
		citus_pass = -1;
		idem_citus_pass_active = false;
		citus_pass_guc_level = 0;
	}
}

static void
citus_pass_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
							SubTransactionId parentSubid, void *arg)
{
	(void) parentSubid;
	(void) arg;
	/* an error inside a pass ends it; the GUC level unwinds with it */
	if (event == SUBXACT_EVENT_ABORT_SUB && citus_pass >= 0 &&
		mySubid == citus_pass_subid)
	{
		citus_pass = -1;
		idem_citus_pass_active = false;
		citus_pass_guc_level = 0;
	}
}

/*
 * idem_citus_passes
 *		How many passes a per-node statement (maintenance, outbox claims)
 *		makes: 1 on a plain server, on Citus one per local shard group
 *		(0 on a node holding none, such as the coordinator).
 */
int
idem_citus_passes(void)
{
	static bool callbacks = false;

	citus_ensure();
	if (!citus_distributed)
		return 1;
	if (!callbacks)
	{
		RegisterXactCallback(citus_pass_xact_callback, NULL);
		RegisterSubXactCallback(citus_pass_subxact_callback, NULL);
		callbacks = true;
	}
	return citus_npasses;
}

/*
 * idem_citus_distributed
 *		Whether idempotency.keys is distributed: this node's keys then live
 *		in its shards, not in the (empty) table itself.
 */
bool
idem_citus_distributed(void)
{
	citus_ensure();
	return citus_distributed;
}

/*
 * idem_citus_custom_plans
 *		Whether idem_saved_plan should prepare for custom plans: when the
 *		tables are distributed, Citus's local execution keeps a copy of
 *		each run of a generic plan over a distributed table in the plan's
 *		memory.  The catalog reads of citus_ensure itself are not such
 *		statements (and must not call it again).
 */
bool
idem_citus_custom_plans(void)
{
	if (citus_ensuring)
		return false;
	citus_ensure();
	return citus_distributed;
}

/*
 * The first pass to run of "npasses": claims start on another shard each
 * time, so that no shard's rows wait for the others'.
 */
int
idem_citus_first_pass(int npasses)
{
	if (npasses <= 1)
		return 0;
	return (citus_pass_rotor++ & INT_MAX) % npasses;
}

/*
 * idem_citus_enter
 *		Start pass "pass": until idem_citus_leave, idem_saved_plan
 *		prepares statements on the pass's shards.  No-op on a plain server.
 */
void
idem_citus_enter(int pass)
{
	if (!citus_distributed)
		return;
	Assert(pass >= 0 && pass < citus_npasses);
	citus_pass = pass;
	citus_pass_subid = GetCurrentSubTransactionId();
	idem_citus_pass_active = true;
	/* Citus refuses writes to a shard by name unless this is on */
	citus_pass_guc_level = NewGUCNestLevel();
	(void) set_config_option("citus.enable_manual_changes_to_shards", "on",
							 PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE,
							 true, 0, false);
}

/*
 * idem_citus_pass_keys_relid
 *		The local shard of idempotency.keys that pass "pass" reads (only
 *		when the tables are distributed).
 */
Oid
idem_citus_pass_keys_relid(int pass)
{
	Assert(citus_distributed && pass >= 0 && pass < citus_npasses);
	return citus_shards[citus_passes[pass]].keys_shard;
}

void
idem_citus_leave(void)
{
	if (citus_pass < 0)
		return;
	citus_pass = -1;
	idem_citus_pass_active = false;
	AtEOXact_GUC(true, citus_pass_guc_level);
	citus_pass_guc_level = 0;
}

/*
 * Append "sql" to "buf" with idempotency.keys, idempotency.outbox and
 * idempotency.scopes (as whole names) replaced by their shards of the
 * current pass.
 */
static void
citus_rewrite(StringInfo buf, const char *sql, const CitusShard *shard)
{
	static const char *const names[] = {"keys", "outbox", "scopes"};
	const char *p = sql;

	while (*p != '\0')
	{
		bool		replaced = false;

		if (strncmp(p, "idempotency.", 12) == 0 &&
			(p == sql || !(isalnum((unsigned char) p[-1]) || p[-1] == '_')))
		{
			for (int i = 0; i < 3; i++)
			{
				size_t		len = strlen(names[i]);
				const char *end = p + 12 + len;
				Oid			shard_relid;

				if (strncmp(p + 12, names[i], len) != 0 ||
					isalnum((unsigned char) *end) || *end == '_')
					continue;
				shard_relid = i == 0 ? shard->keys_shard :
					i == 1 ? shard->outbox_shard : citus_scopes_shard;
				if (!OidIsValid(shard_relid))
					break;		/* scopes with no local placement: as is */
				appendStringInfo(buf, "idempotency.%s",
								 quote_identifier(get_rel_name(shard_relid)));
				p = end;
				replaced = true;
				break;
			}
		}
		if (!replaced)
			appendStringInfoChar(buf, *p++);
	}
}

/*
 * idem_citus_pass_plan
 *		idem_saved_plan inside a pass: the statement of "cache", prepared on
 *		the pass's shards and kept per pass.
 */
SPIPlanPtr
idem_citus_pass_plan(SPIPlanPtr *cache, const char *sql, int nargs,
					 Oid *argtypes, int cursor_options)
{
	const CitusShard *shard = &citus_shards[citus_passes[citus_pass]];
	PassPlanKey key;
	PassPlanEntry *entry;
	bool		found;
	StringInfoData buf;
	SPIPlanPtr	plan;

	if (citus_pass_plans == NULL)
	{
		HASHCTL		ctl;

		memset(&ctl, 0, sizeof(ctl));
		ctl.keysize = sizeof(PassPlanKey);
		ctl.entrysize = sizeof(PassPlanEntry);
		ctl.hcxt = citus_cxt;
		citus_pass_plans = hash_create("idempotency citus plans", 32, &ctl,
									   HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}
	memset(&key, 0, sizeof(key));
	key.cache = cache;
	key.keys_shardid = shard->keys_shardid;
	entry = hash_search(citus_pass_plans, &key, HASH_ENTER, &found);
	if (found && entry->plan != NULL)
		return entry->plan;
	entry->plan = NULL;

	initStringInfo(&buf);
	citus_rewrite(&buf, sql, shard);
	plan = SPI_prepare_cursor(buf.data, nargs, argtypes, cursor_options);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed: %s",
			 SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "SPI_keepplan failed");
	pfree(buf.data);
	entry->plan = plan;
	return plan;
}

/*
 * Tenant checks on the coordinator, before Citus delegates a call.
 *
 * Citus runs a delegated call on the tenant's worker as the current role,
 * in a session of its own: the worker sees neither the session user (so a
 * bound session that SET ROLEs to an unbound role would not be held to its
 * binding there) nor the session's idempotency.tenant.  Citus delegates
 * a statement that is one call, SELECT f(tenant, ...) or SELECT ... FROM
 * f(tenant, ...), when the tenant is known once the statement is planned
 * (a constant after folding, a parameter of a custom plan); this planner
 * hook, which runs before Citus's (Citus is first in
 * shared_preload_libraries, so its hook was installed first), checks every
 * such call here, where both are known, with the check every function
 * makes itself (idem_check_tenant).  A call Citus does not delegate runs
 * here and makes that check anyway.
 */
static planner_hook_type citus_prev_planner = NULL;

/* The functions Citus delegates by their first argument, the tenant. */
static const char *const citus_delegated_names[] = {
	"idem_reserve", "idem_complete", "idem_checkpoint", "idem_release",
	"idem_lookup", "idem_resolve", "idem_execute", "outbox_enqueue",
	"outbox_ack", "outbox_nack", "outbox_extend", "outbox_requeue",
	"outbox_discard", "outbox_ack_many", "outbox_nack_many"
};

/* Whether "funcid" is one of this library's functions Citus delegates. */
static bool
citus_is_delegated(Oid funcid)
{
	char	   *name = get_func_name(funcid);
	bool		ours = false;
	HeapTuple	tup;

	if (name == NULL)
		return false;
	for (int i = 0; i < (int) lengthof(citus_delegated_names); i++)
		if (strcmp(name, citus_delegated_names[i]) == 0)
			ours = true;
	pfree(name);
	if (!ours)
		return false;
	/* this library's function, not one of the same name */
	tup = SearchSysCache1(PROCOID, ObjectIdGetDatum(funcid));
	if (!HeapTupleIsValid(tup))
		return false;
	ours = false;
	if (((Form_pg_proc) GETSTRUCT(tup))->prolang == ClanguageId)
	{
		bool		isnull;
		Datum		bin = SysCacheGetAttr(PROCOID, tup, Anum_pg_proc_probin,
										  &isnull);

		ours = !isnull &&
			strcmp(TextDatumGetCString(bin), "$libdir/idempotency") == 0;
	}
	ReleaseSysCache(tup);
	return ours;
}

/*
 * The planner state eval_const_expressions and inline_set_returning_function
 * read: the parameters of a custom plan (a generic plan has none).
 */
static void
citus_fold_root(PlannerInfo *root, PlannerGlobal *glob, ParamListInfo params)
{
	memset(glob, 0, sizeof(*glob));
	glob->type = T_PlannerGlobal;
	glob->boundParams = params;
	memset(root, 0, sizeof(*root));
	root->type = T_PlannerInfo;
	root->glob = glob;
}

/*
 * The value of argument "argno" (from 0) of a call, when planning knows
 * it: a bound parameter, or an expression the planner folds to a constant
 * (with the parameters of a custom plan), which is the value Citus
 * delegates the call by, whatever its type (varchar from a driver) or
 * spelling (lower('ACME')).  False when it is not known.
 */
static bool
citus_arg_value(FuncExpr *fe, int argno, ParamListInfo params,
				bool *isnull, Datum *value, Oid *type)
{
	Node	   *arg = NULL;
	ListCell   *lc;

	foreach(lc, fe->args)
	{
		Node	   *a = (Node *) lfirst(lc);

		if (IsA(a, NamedArgExpr))
		{
			if (((NamedArgExpr *) a)->argnumber == argno)
				arg = (Node *) ((NamedArgExpr *) a)->arg;
		}
		else if (foreach_current_index(lc) == argno)
			arg = a;
	}
	while (arg != NULL && IsA(arg, RelabelType))
		arg = (Node *) ((RelabelType *) arg)->arg;
	if (arg == NULL)
		return false;
	if (IsA(arg, Param) && ((Param *) arg)->paramkind == PARAM_EXTERN)
	{
		int			id = ((Param *) arg)->paramid;
		ParamExternData storage;
		ParamExternData *prm;

		if (params == NULL || id <= 0 || id > params->numParams)
			return false;
		prm = params->paramFetch != NULL ?
			params->paramFetch(params, id, false, &storage) :
			&params->params[id - 1];
		if (prm == NULL || !OidIsValid(prm->ptype))
			return false;
		*isnull = prm->isnull;
		*value = prm->value;
		*type = prm->ptype;
	}
	else
	{
		PlannerGlobal glob;
		PlannerInfo root;
		Node	   *folded;

		citus_fold_root(&root, &glob, params);
		folded = eval_const_expressions(&root, copyObject(arg));
		if (!IsA(folded, Const))
			return false;
		*isnull = ((Const *) folded)->constisnull;
		*value = ((Const *) folded)->constvalue;
		*type = ((Const *) folded)->consttype;
	}
	return true;
}

/*
 * Check the tenant of a call of ours, when planning knows it.  A NULL
 * tenant is refused here (22004): Citus would hash it to find the shard.
 */
static void
citus_check_call(FuncExpr *fe, ParamListInfo params)
{
	bool		isnull;
	Datum		value;
	Oid			type;
	Oid			output;
	bool		varlena;

	if (!citus_arg_value(fe, 0, params, &isnull, &value, &type))
		return;
	if (isnull)
		idem_null_argument("tenant");
	getTypeOutputInfo(type, &output, &varlena);
	idem_check_tenant(OidOutputFunctionCall(output, value));
}

/*
 * A call with arguments of a function of the application's (not ours, not
 * in pg_catalog, where Citus keeps its own).
 */
static bool
citus_other_distributed(FuncExpr *fe)
{
	return !citus_is_delegated(fe->funcid) &&
		get_func_namespace(fe->funcid) != PG_CATALOG_NAMESPACE;
}

/*
 * A plain call of another function Citus distributes by an argument (an
 * application's handler): a NULL in that argument, which Citus 13.2 hashes
 * to find the shard (the backend crashes), is refused (22004).  A STRICT
 * function is left alone: the planner folds such a call to NULL first.
 */
static void
citus_check_distributed_call(FuncExpr *fe, ParamListInfo params)
{
	static SPIPlanPtr plan = NULL;
	Oid			argtypes[1] = {OIDOID};
	Datum		args[1];
	Bitmapset  *nulls = NULL;
	bool		isnull;
	Datum		value;
	Oid			type;
	HeapTuple	proc;
	int			index = -1;
	bool		force = false;
	int			rc;

	if (func_strict(fe->funcid))
		return;
	/* the arguments as the planner passes them: defaults filled in */
	proc = SearchSysCache1(PROCOID, ObjectIdGetDatum(fe->funcid));
	if (!HeapTupleIsValid(proc))
		return;
	fe = copyObject(fe);
	fe->args = expand_function_arguments(fe->args, false,
										 fe->funcresulttype, proc);
	ReleaseSysCache(proc);
	for (int i = 0; i < list_length(fe->args); i++)
		if (citus_arg_value(fe, i, params, &isnull, &value, &type) && isnull)
			nulls = bms_add_member(nulls, i);

	/*
	 * Only then is Citus asked: its own calls while it distributes the
	 * extension's tables must not load its metadata half-made.
	 */
	if (nulls == NULL || !OidIsValid(get_namespace_oid("idempotency", true)) ||
		!idem_citus_distributed())
		return;

	/* a NULL argument: is it the one Citus distributes the function by? */
	idem_spi_connect();
	args[0] = ObjectIdGetDatum(fe->funcid);
	rc = SPI_execute_plan(idem_saved_plan(&plan,
										  "SELECT d.distribution_argument_index, d.force_delegation"
										  "  FROM pg_catalog.pg_dist_object d"
										  " WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass"
										  "   AND d.objid OPERATOR(pg_catalog.=) $1"
										  "   AND d.objsubid OPERATOR(pg_catalog.=) 0",
										  1, argtypes, 0),
						  args, NULL, true, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "pg_dist_object lookup failed: %s",
			 SPI_result_code_string(rc));
	if (SPI_processed > 0)
	{
		Datum		d;

		d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1,
						  &isnull);
		if (!isnull)
			index = DatumGetInt32(d);
		d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2,
						  &isnull);
		force = !isnull && DatumGetBool(d);
	}
	SPI_finish();
	/* without force_delegation, Citus delegates no call in a block */
	if (index >= 0 && bms_is_member(index, nulls) &&
		(force || !IsTransactionBlock()))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("on Citus, the distribution argument of %s must not be null",
						get_func_name(fe->funcid)),
				 errdetail("Citus finds the node to run the call on by that argument."),
				 errhint("Pass a value, or declare the function STRICT.")));
}

/*
 * The calls Citus may delegate: a statement's one target, or its one
 * function in FROM (Citus delegates SELECT f(...) and SELECT ... FROM
 * f(...)).  A call of ours as the target of a query that reads a subquery
 * of no table (SELECT f(...) FROM (SELECT 1) x), which the planner turns
 * into SELECT f(...) and Citus then fails to deparse (the backend
 * crashes), is refused.
 */
static void
citus_check_query(Query *parse, ParamListInfo params)
{
	ListCell   *lc;

	if (parse->commandType != CMD_SELECT || parse->utilityStmt != NULL)
		return;
	if (list_length(parse->targetList) == 1)
	{
		TargetEntry *te = linitial_node(TargetEntry, parse->targetList);

		if (IsA(te->expr, FuncExpr) &&
			citus_is_delegated(((FuncExpr *) te->expr)->funcid) &&
			idem_citus_distributed())
		{
			if (parse->jointree != NULL &&
				list_length(parse->jointree->fromlist) == 1 &&
				IsA(linitial(parse->jointree->fromlist), RangeTblRef))
			{
				RangeTblEntry *rte =
					rt_fetch(linitial_node(RangeTblRef,
										   parse->jointree->fromlist)->rtindex,
							 parse->rtable);

				if ((rte->rtekind == RTE_VALUES &&
					 list_length(rte->values_lists) == 1) ||
					(rte->rtekind == RTE_SUBQUERY &&
					 rte->subquery->rtable == NIL))
					ereport(ERROR,
							(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
							 errmsg("on Citus, %s cannot be called over a subquery that reads no table",
									get_func_name(((FuncExpr *) te->expr)->funcid)),
							 errhint("Call it as SELECT f(...) or SELECT * FROM f(...).")));
			}
			citus_check_call((FuncExpr *) te->expr, params);
		}
		else if (IsA(te->expr, FuncExpr) && parse->rtable == NIL &&
				 citus_other_distributed((FuncExpr *) te->expr))
			citus_check_distributed_call((FuncExpr *) te->expr, params);
	}
	foreach(lc, parse->rtable)
	{
		RangeTblEntry *rte = (RangeTblEntry *) lfirst(lc);
		ListCell   *fc;

		if (rte->rtekind != RTE_FUNCTION)
			continue;
		foreach(fc, rte->functions)
		{
			Node	   *expr = ((RangeTblFunction *) lfirst(fc))->funcexpr;

			if (IsA(expr, FuncExpr) &&
				citus_is_delegated(((FuncExpr *) expr)->funcid) &&
				idem_citus_distributed())
				citus_check_call((FuncExpr *) expr, params);
			else if (IsA(expr, FuncExpr) && list_length(parse->rtable) == 1 &&
					 citus_other_distributed((FuncExpr *) expr))
				citus_check_distributed_call((FuncExpr *) expr, params);
		}
	}
}

/*
 * expression/query walker: whether a query calls one of our delegated
 * functions, or a SQL function of a schema other than pg_catalog (which
 * the planner may inline into such a call), anywhere.
 */
static bool
citus_candidate_func(Oid funcid, void *context)
{
	HeapTuple	tup;
	bool		sql = false;

	(void) context;
	if (citus_is_delegated(funcid))
		return true;
	tup = SearchSysCache1(PROCOID, ObjectIdGetDatum(funcid));
	if (HeapTupleIsValid(tup))
	{
		Form_pg_proc proc = (Form_pg_proc) GETSTRUCT(tup);

		sql = proc->prolang == SQLlanguageId &&
			proc->pronamespace != PG_CATALOG_NAMESPACE;
		ReleaseSysCache(tup);
	}
	return sql;
}

static bool
citus_calls_candidate(Node *node, void *context)
{
	if (node == NULL)
		return false;
	/* a function, or an operator or cast whose function the planner inlines */
	if (check_functions_in_node(node, citus_candidate_func, context))
		return true;
	if (IsA(node, Query))
		return query_tree_walker((Query *) node, citus_calls_candidate,
								 context, 0);
	return expression_tree_walker(node, citus_calls_candidate, context);
}

/*
 * Whether a query's FROM list reads a table, through its subqueries too.
 * A table read only in a sub-select of an expression (an initplan, which
 * Citus delegates a call with) or in a WITH query does not count: neither
 * keeps the planner from pulling a call up into the one Citus delegates.
 */
static bool
citus_from_reads_table(Query *q)
{
	ListCell   *lc;

	check_stack_depth();
	foreach(lc, q->rtable)
	{
		RangeTblEntry *rte = (RangeTblEntry *) lfirst(lc);

		/* a view's own entries (OLD and NEW, on 15) read nothing */
		if (rte->rtekind == RTE_RELATION && rte->relkind != RELKIND_VIEW)
			return true;
		if (rte->rtekind == RTE_SUBQUERY &&
			citus_from_reads_table(rte->subquery))
			return true;
	}
	return false;
}

/*
 * Whether a query's FROM list keeps an item that planning cannot remove:
 * a function not folded to a constant (unnest(...), now(); the fold has
 * inlined SETOF SQL functions into subqueries), a VALUES list of several
 * rows, a table function, in it or in its subqueries.  (A subquery, a
 * WITH query, one row of VALUES or a function folded to a constant may be
 * pulled up into nothing, leaving a bare call.)
 */
static bool
citus_from_stays(Query *q)
{
	ListCell   *lc;

	check_stack_depth();
	foreach(lc, q->rtable)
	{
		RangeTblEntry *rte = (RangeTblEntry *) lfirst(lc);

		if (rte->rtekind == RTE_VALUES && list_length(rte->values_lists) > 1)
			return true;
		if (rte->rtekind == RTE_TABLEFUNC)
			return true;
		/* pulled up or not, a subquery keeps what stays in it */
		if (rte->rtekind == RTE_SUBQUERY && citus_from_stays(rte->subquery))
			return true;
		if (rte->rtekind == RTE_FUNCTION)
		{
			Node	   *expr = linitial_node(RangeTblFunction, rte->functions)->funcexpr;

			/* (one over a LATERAL column may fold once that is pulled up) */
			if (list_length(rte->functions) > 1 || rte->funcordinality ||
				(!IsA(expr, Const) && !contain_var_clause(expr)))
				return true;
		}
	}
	return false;
}

/*
 * Fold the functions in FROM of a query, and of its subqueries and WITH
 * queries, and inline the SETOF SQL functions among them into subqueries,
 * as the planner does before it pulls subqueries up (a STABLE SETOF SQL
 * function over a call of ours becomes that call).
 */
static void
citus_inline_functions(PlannerInfo *root, Query *q)
{
	ListCell   *lc;

	check_stack_depth();
	foreach(lc, q->rtable)
	{
		RangeTblEntry *rte = (RangeTblEntry *) lfirst(lc);

		if (rte->rtekind == RTE_FUNCTION)
		{
			Query	   *inlined;

			rte->functions = (List *)
				eval_const_expressions(root, (Node *) rte->functions);
			inlined = inline_set_returning_function(root, rte);
			if (inlined != NULL)
			{
				rte->rtekind = RTE_SUBQUERY;
				rte->subquery = inlined;
				rte->functions = NIL;
				rte->funcordinality = false;
			}
		}
		if (rte->rtekind == RTE_SUBQUERY)
			citus_inline_functions(root, rte->subquery);
	}
	foreach(lc, q->cteList)
		citus_inline_functions(root,
							   (Query *) ((CommonTableExpr *) lfirst(lc))->ctequery);
}

/*
 * A copy of a statement with its top-level expressions folded as the
 * planner folds them (SQL functions and operators inlined, WHERE true OR
 * ... reduced) and its SETOF SQL functions in FROM inlined into
 * subqueries.  (Not planned: Citus's planner hooks expect their own
 * planner above them.)
 */
static Query *
citus_fold(Query *parse, ParamListInfo params)
{
	PlannerGlobal glob;
	PlannerInfo root;
	Query	   *copy = copyObject(parse);

	citus_fold_root(&root, &glob, params);
	root.parse = copy;
	copy->targetList = (List *) eval_const_expressions(&root, (Node *) copy->targetList);
	if (copy->jointree != NULL)
		copy->jointree->quals = eval_const_expressions(&root, copy->jointree->quals);
	copy->havingQual = eval_const_expressions(&root, copy->havingQual);
	citus_inline_functions(&root, copy);
	/* a WHERE folded to true is no WHERE */
	if (copy->jointree != NULL && copy->jointree->quals != NULL &&
		IsA(copy->jointree->quals, Const) &&
		!((Const *) copy->jointree->quals)->constisnull &&
		DatumGetBool(((Const *) copy->jointree->quals)->constvalue))
		copy->jointree->quals = NULL;
	return copy;
}

/* expression/query walker: whether a query calls one of ours anywhere. */
static bool
citus_calls_ours(Node *node, void *context)
{
	if (node == NULL)
		return false;
	if (IsA(node, FuncExpr) && citus_is_delegated(((FuncExpr *) node)->funcid))
		return true;
	if (IsA(node, Query))
		return query_tree_walker((Query *) node, citus_calls_ours, context, 0);
	return expression_tree_walker(node, citus_calls_ours, context);
}

/* expression walker: a call of ours outside any sub-select. */
static bool
citus_calls_ours_here(Node *node, void *context)
{
	if (node == NULL || IsA(node, SubLink))
		return false;
	if (IsA(node, FuncExpr) && citus_is_delegated(((FuncExpr *) node)->funcid))
		return true;
	return expression_tree_walker(node, citus_calls_ours_here, context);
}

/*
 * Whether planning may pull a call of ours up into the statement's one
 * call: one in its range table (a subquery, a view, a function in FROM) or
 * WITH queries, or in its target list over a FROM.  (A call in a
 * sub-select of an expression stays there: Citus delegates none.)
 */
static bool
citus_calls_ours_pullable(Query *q)
{
	ListCell   *lc;

	foreach(lc, q->rtable)
	{
		RangeTblEntry *rte = (RangeTblEntry *) lfirst(lc);

		/* a call in FROM beside items that may vanish (LATERAL) */
		if ((rte->rtekind == RTE_SUBQUERY &&
			 citus_calls_ours((Node *) rte->subquery, NULL)) ||
			(rte->rtekind == RTE_FUNCTION && list_length(q->rtable) > 1 &&
			 citus_calls_ours_here((Node *) rte->functions, NULL)))
			return true;
	}
	foreach(lc, q->cteList)
	{
		if (citus_calls_ours(((CommonTableExpr *) lfirst(lc))->ctequery, NULL))
			return true;
	}
	return q->rtable != NIL && !citus_from_stays(q) &&
		citus_calls_ours_here((Node *) q->targetList, NULL);
}

/* Whether a (folded) statement is one of the two plain forms of a call. */
static bool
citus_plain_call(Query *q)
{
	if (q->cteList != NIL || q->jointree == NULL || q->jointree->quals != NULL)
		return false;
	if (q->rtable == NIL)
		return list_length(q->targetList) == 1 &&
			IsA(linitial_node(TargetEntry, q->targetList)->expr, FuncExpr) &&
			citus_is_delegated(((FuncExpr *) linitial_node(TargetEntry, q->targetList)->expr)->funcid);
	if (list_length(q->rtable) == 1)
	{
		RangeTblEntry *only = linitial_node(RangeTblEntry, q->rtable);

		return only->rtekind == RTE_FUNCTION &&
			list_length(only->functions) == 1 &&
			IsA(linitial_node(RangeTblFunction, only->functions)->funcexpr, FuncExpr) &&
			citus_is_delegated(((FuncExpr *) linitial_node(RangeTblFunction, only->functions)->funcexpr)->funcid) &&
			!citus_calls_ours((Node *) q->targetList, NULL);
	}
	return false;
}

/*
 * Citus decides on the planned query, after SQL functions are inlined,
 * subqueries and views pulled up and clauses folded away, so a statement
 * that is not one of the two plain forms may become a delegated call only
 * there (SELECT w('acme') of a SQL function w that returns
 * idem_reserve(...); WHERE true OR EXISTS (...) folded away).  Planning a
 * copy here would run Citus's relation hooks without its planner above
 * them (the backend crashes), so a statement that calls one of ours, or a
 * SQL function outside pg_catalog (through an operator too), anywhere, is
 * folded (citus_fold), then: if it is a plain call now, or its FROM list
 * reads a table, its calls are checked (citus_check_query); if its FROM
 * list reads no table but it calls one of ours in another shape (in a
 * subquery, a view, a WITH query or a SETOF SQL function, or over one
 * that planning may remove), it is refused: the planner may pull it up
 * into a call Citus 13.2 fails to deparse (the backend crashes).
 */
static void
citus_check_planned(Query *parse, ParamListInfo params)
{
	Query	   *folded;

	if (parse->commandType != CMD_SELECT || parse->utilityStmt != NULL)
		return;
	/* plain forms are checked as they are (citus_check_query) */
	if (citus_plain_call(parse))
		return;
	if (!citus_calls_candidate((Node *) parse, NULL))
		return;
	if (!OidIsValid(get_namespace_oid("idempotency", true)) ||
		!idem_citus_distributed())
		return;
	folded = citus_fold(parse, params);
	if (!citus_plain_call(folded) && !citus_from_reads_table(folded) &&
		citus_calls_ours_pullable(folded))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("on Citus, a tenant function cannot be called in or over a subquery, view, WITH query or SETOF SQL function of a statement whose FROM list reads no table"),
				 errhint("Call it as SELECT f(...) or SELECT * FROM f(...).")));
	citus_check_query(folded, params);
}

static PlannedStmt *
citus_tenant_planner(Query *parse, const char *query_string,
					 int cursorOptions, ParamListInfo boundParams)
{
	citus_check_query(parse, boundParams);
	citus_check_planned(parse, boundParams);
	if (citus_prev_planner != NULL)
		return citus_prev_planner(parse, query_string, cursorOptions,
								  boundParams);
	return standard_planner(parse, query_string, cursorOptions, boundParams);
}

/*
 * A session whose session user is bound to a tenant runs nothing on a
 * Citus coordinator as a role not bound to that tenant
 * (idem_require_role_confined): Citus ships statements to the workers, and
 * calls of a procedure or function it distributes, as the current role
 * alone, where the binding is not seen.  That role is the one taken with
 * SET ROLE, or the owner of a SECURITY DEFINER function running (one that
 * may log in, as Citus connects as it; a superuser's functions, the
 * extension's own among them, are trusted).  Checked when a statement
 * starts to run (a plan cached before the SET ROLE included), each time a
 * portal runs (FETCH from a cursor declared before it), and for every
 * utility statement but settings, transaction control and those that run
 * through the executor (DDL, COPY and CALL, which Citus ships without it).
 * One comparison for every other session.
 */
static ExecutorStart_hook_type citus_prev_executor_start = NULL;
static ExecutorRun_hook_type citus_prev_executor_run = NULL;
static ProcessUtility_hook_type citus_prev_process_utility = NULL;
static bool citus_checking_role = false;

/* Whether "role" may log in (Citus connects to the workers as it). */
static bool
citus_role_can_login(Oid role)
{
	HeapTuple	tup = SearchSysCache1(AUTHOID, ObjectIdGetDatum(role));
	bool		login = false;

	if (HeapTupleIsValid(tup))
	{
		login = ((Form_pg_authid) GETSTRUCT(tup))->rolcanlogin;
		ReleaseSysCache(tup);
	}
	return login;
}

static void
citus_check_role(void)
{
	Oid			session = GetSessionUserId();
	Oid			outer = GetOuterUserId();
	Oid			current = GetUserId();
	bool		check_current;

	if ((outer == session && current == session) || citus_checking_role ||
		!IsTransactionState())
		return;
	check_current = current != session && current != outer &&
		!superuser_arg(current);
	if (outer == session && !check_current)
		return;
	/* the metadata it reads (SPI) starts statements of its own */
	citus_checking_role = true;
	PG_TRY();
	{
		if (OidIsValid(get_namespace_oid("idempotency", true)) &&
			idem_citus_distributed())
		{
			if (outer != session)
				idem_require_role_confined(outer);
			if (check_current && citus_role_can_login(current))
				idem_require_role_confined(current);
		}
	}
	PG_FINALLY();
	{
		citus_checking_role = false;
	}
	PG_END_TRY();
}

static void
citus_executor_start(QueryDesc *queryDesc, int eflags)
{
	citus_check_role();
	if (citus_prev_executor_start != NULL)
		citus_prev_executor_start(queryDesc, eflags);
	else
		standard_ExecutorStart(queryDesc, eflags);
}

#if PG_VERSION_NUM >= 180000
static void
citus_executor_run(QueryDesc *queryDesc, ScanDirection direction,
				   uint64 count)
{
	citus_check_role();
	if (citus_prev_executor_run != NULL)
		citus_prev_executor_run(queryDesc, direction, count);
	else
		standard_ExecutorRun(queryDesc, direction, count);
}
#else
static void
citus_executor_run(QueryDesc *queryDesc, ScanDirection direction,
				   uint64 count, bool execute_once)
{
	citus_check_role();
	if (citus_prev_executor_run != NULL)
		citus_prev_executor_run(queryDesc, direction, count, execute_once);
	else
		standard_ExecutorRun(queryDesc, direction, count, execute_once);
}
#endif

static void
citus_process_utility(PlannedStmt *pstmt, const char *queryString,
					  bool readOnlyTree, ProcessUtilityContext context,
					  ParamListInfo params, QueryEnvironment *queryEnv,
					  DestReceiver *dest, QueryCompletion *qc)
{
	switch (nodeTag(pstmt->utilityStmt))
	{
			/*
			 * settings (RESET ROLE), transactions, and what runs through the
			 * executor
			 */
		case T_VariableSetStmt:
		case T_VariableShowStmt:
		case T_TransactionStmt:
		case T_DiscardStmt:
		case T_DeallocateStmt:
		case T_ClosePortalStmt:
		case T_PrepareStmt:
		case T_ExecuteStmt:
		case T_DeclareCursorStmt:
		case T_FetchStmt:
		case T_ExplainStmt:
			break;
		default:
			/* DDL, COPY, CALL and the rest, which Citus ships as they are */
			citus_check_role();
			break;
	}
	if (citus_prev_process_utility != NULL)
		citus_prev_process_utility(pstmt, queryString, readOnlyTree, context,
								   params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context,
								params, queryEnv, dest, qc);
}

/*
 * _PG_init, when preloaded: install the hooks, on a server that preloads
 * Citus.  Citus refuses to load anywhere but first in
 * shared_preload_libraries (it insists that no hook was set before it), so
 * its parameters are defined by now if it is loaded at all, and it cannot
 * be loaded later; a server without it runs no hook of this file (the
 * checks would only find nothing distributed, at the cost of looking up
 * every function call a statement plans).
 */
void
idem_citus_init(void)
{
	if (GetConfigOption("citus.next_shard_id", true, false) == NULL)
		return;
	citus_prev_planner = planner_hook;
	planner_hook = citus_tenant_planner;
	citus_prev_executor_start = ExecutorStart_hook;
	ExecutorStart_hook = citus_executor_start;
	citus_prev_executor_run = ExecutorRun_hook;
	ExecutorRun_hook = citus_executor_run;
	citus_prev_process_utility = ProcessUtility_hook;
	ProcessUtility_hook = citus_process_utility;
}
