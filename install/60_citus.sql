
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
    last_id pg_catalog.int8;
    failed pg_catalog.text;
    unsafe_triggers pg_catalog.text;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension
                    WHERE extname OPERATOR(pg_catalog.=) 'citus') THEN
        RAISE EXCEPTION 'Citus is not installed in this database'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'On the Citus coordinator, CREATE EXTENSION citus and add the worker nodes first (README, "Running on Citus").';
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_dist_local_group
                WHERE groupid OPERATOR(pg_catalog.<>) 0) THEN
        RAISE EXCEPTION 'idem_citus_distribute runs on the Citus coordinator, not on a worker'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Connect to the coordinator and run it there: it distributes the tables on every node.';
    END IF;
    IF shard_count IS NOT NULL AND shard_count OPERATOR(pg_catalog.<) 1 THEN
        RAISE EXCEPTION 'shard_count must be positive'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass the number of shards, or NULL for citus.shard_count.';
    END IF;

    -- Citus copies the statement triggers of scopes and tenant_bindings to
    -- their placements only with this on (they read no other table); the
    -- caller's value is given back below
    unsafe_triggers := pg_catalog.current_setting('citus.enable_unsafe_triggers', true);
    PERFORM pg_catalog.set_config('citus.enable_unsafe_triggers', 'on', true);
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition
                    WHERE logicalrelid OPERATOR(pg_catalog.=) 'idempotency.scopes'::pg_catalog.regclass) THEN
        PERFORM pg_catalog.create_reference_table('idempotency.scopes');
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition
                    WHERE logicalrelid OPERATOR(pg_catalog.=) 'idempotency.tenant_bindings'::pg_catalog.regclass) THEN
        PERFORM pg_catalog.create_reference_table('idempotency.tenant_bindings');
    END IF;
    PERFORM pg_catalog.set_config('citus.enable_unsafe_triggers',
                                  COALESCE(unsafe_triggers, 'off'), true);
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
        -- each node draws outbox ids from a sequence of its own, which
        -- starts at 1 on a worker: move every worker's past every id this
        -- node gave, those of the rows the shards take with them (or an
        -- enqueue would collide with them, 23505) and those of rows
        -- delivered and deleted (which relays have seen: an id never comes
        -- again).  The command carries one number, which this function
        -- computed.
        SELECT pg_catalog.max(o.id) INTO last_id FROM idempotency.outbox o;
        SELECT pg_catalog.max(v) INTO last_id
          FROM (VALUES (last_id),
                       -- the last id given; one below the next when the
                       -- sequence was restarted (none when never used)
                       ((SELECT NULLIF(CASE WHEN s.is_called THEN s.last_value
                                                       ELSE s.last_value OPERATOR(pg_catalog.-) 1 END, 0)
                           FROM idempotency.outbox_id_seq s))) AS ids(v);
        PERFORM pg_catalog.create_distributed_table('idempotency.outbox', 'tenant_id',
                                                    colocate_with => 'idempotency.keys');
        IF last_id IS NOT NULL THEN
            SELECT pg_catalog.string_agg(w.nodename OPERATOR(pg_catalog.||) ':'
                                         OPERATOR(pg_catalog.||) w.nodeport::pg_catalog.text
                                         OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||) w.result, ', ')
              INTO failed
              FROM pg_catalog.run_command_on_workers(pg_catalog.format(
                       'SELECT pg_catalog.setval(''idempotency.outbox_id_seq'', GREATEST(%s::pg_catalog.int8, '
                       '(SELECT s.last_value FROM idempotency.outbox_id_seq s)))', last_id)) w
             WHERE NOT w.success;
            IF failed IS NOT NULL THEN
                RAISE EXCEPTION 'could not move the outbox id sequence of every worker past %', last_id
                    USING ERRCODE = 'object_not_in_prerequisite_state',
                          DETAIL = failed,
                          HINT = 'Run SELECT setval(''idempotency.outbox_id_seq'', ' OPERATOR(pg_catalog.||)
                                 last_id::pg_catalog.text OPERATOR(pg_catalog.||)
                                 ') on the workers named, then idem_citus_distribute() again.';
            END IF;
        END IF;
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
