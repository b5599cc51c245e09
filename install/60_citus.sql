
/* ---- citus.c: running on Citus ---- */

/*
 * Admin, on the Citus coordinator, once after CREATE EXTENSION citus and
 * CREATE EXTENSION idempotency (README, "Running on Citus"): keys and
 * outbox distributed by tenant_id and colocated; scopes and
 * tenant_bindings reference tables, on every node (their statement
 * triggers, which invalidate the backends' caches, go to every placement);
 * and every function whose first argument is the tenant delegated to the
 * node holding that tenant's shard, inside transaction blocks too
 * (force_delegation), so that a request is one single-shard transaction on
 * one worker.  Running it again finishes what is missing.
 */
CREATE FUNCTION idem_citus_distribute(shard_count int DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    fn pg_catalog.regprocedure;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension
                    WHERE extname OPERATOR(pg_catalog.=) 'citus') THEN
        RAISE EXCEPTION 'Citus is not installed in this database'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'On the Citus coordinator, CREATE EXTENSION citus and add the worker nodes first (README, "Running on Citus").';
    END IF;
    IF shard_count IS NOT NULL AND shard_count OPERATOR(pg_catalog.<) 1 THEN
        RAISE EXCEPTION 'shard_count must be positive'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass the number of shards, or NULL for citus.shard_count.';
    END IF;

    -- Citus copies the statement triggers of scopes and tenant_bindings to
    -- their placements only with this on; they read no other table
    PERFORM pg_catalog.set_config('citus.enable_unsafe_triggers', 'on', true);
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition
                    WHERE logicalrelid OPERATOR(pg_catalog.=) 'idempotency.scopes'::pg_catalog.regclass) THEN
        PERFORM pg_catalog.create_reference_table('idempotency.scopes');
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition
                    WHERE logicalrelid OPERATOR(pg_catalog.=) 'idempotency.tenant_bindings'::pg_catalog.regclass) THEN
        PERFORM pg_catalog.create_reference_table('idempotency.tenant_bindings');
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition
                    WHERE logicalrelid OPERATOR(pg_catalog.=) 'idempotency.keys'::pg_catalog.regclass) THEN
        IF shard_count IS NULL THEN
            PERFORM pg_catalog.create_distributed_table('idempotency.keys', 'tenant_id');
        ELSE
            PERFORM pg_catalog.create_distributed_table('idempotency.keys', 'tenant_id',
                                                        shard_count => shard_count);
        END IF;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition
                    WHERE logicalrelid OPERATOR(pg_catalog.=) 'idempotency.outbox'::pg_catalog.regclass) THEN
        PERFORM pg_catalog.create_distributed_table('idempotency.outbox', 'tenant_id',
                                                    colocate_with => 'idempotency.keys');
    END IF;

    -- the extension's functions whose first argument is the tenant
    FOR fn IN
        SELECT p.oid::pg_catalog.regprocedure
          FROM pg_catalog.pg_proc p
          JOIN pg_catalog.pg_depend d
            ON d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
           AND d.objid OPERATOR(pg_catalog.=) p.oid
           AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
           AND d.deptype OPERATOR(pg_catalog.=) 'e'
          JOIN pg_catalog.pg_extension e
            ON e.oid OPERATOR(pg_catalog.=) d.refobjid
           AND e.extname OPERATOR(pg_catalog.=) 'idempotency'
         WHERE p.prokind OPERATOR(pg_catalog.=) 'f'
           AND p.proargnames[1] OPERATOR(pg_catalog.=) 'tenant'
           AND p.proargtypes[0] OPERATOR(pg_catalog.=) 'pg_catalog.text'::pg_catalog.regtype
         ORDER BY p.oid
    LOOP
        PERFORM pg_catalog.create_distributed_function(fn, 'tenant',
                                                       colocate_with => 'idempotency.keys',
                                                       force_delegation => true);
    END LOOP;
END
$$;

COMMENT ON FUNCTION idem_citus_distribute(int) IS
'on a Citus coordinator: distribute keys and outbox by tenant (colocated), make scopes and tenant_bindings reference tables, delegate the per-tenant functions';

REVOKE ALL ON FUNCTION idem_citus_distribute(int) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idem_citus_distribute(int) TO idempotency_admin;
