/* idempotency--1.0--1.1.sql: upgrade from 1.0 to 1.1 */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.1'" to load this file. \quit

/*
 * The tables first, in the order the library takes them in a request (a
 * scope's policy, then the key, then the outbox): a request that arrives
 * while the update waits for a transaction holding a reservation queues
 * behind the update.  Taken as the statements below come to them (the
 * keys, later the scopes), the update deadlocked with such a request
 * (40P01), which had read its scope and waited for the keys.
 */
LOCK TABLE idempotency.scopes, idempotency.keys, idempotency.outbox
    IN ACCESS EXCLUSIVE MODE;

/*
 * Grants an administrator made on 1.0's objects belong to the database.
 * Those on the objects this update drops and creates again (the functions
 * whose signature changes, the views it rebuilds) are collected here and
 * made again at the end of the update; a role of theirs that may run
 * idem_maintain also gets what 1.1's idem_maintain needs of its caller:
 * USAGE on schema idempotency and EXECUTE on idempotency.maintain and the
 * functions it calls.  Grants to PUBLIC and to the extension's own roles
 * are the extension's business and are not carried over.
 */
SELECT pg_catalog.set_config('idempotency_update.grants',
       COALESCE(pg_catalog.string_agg(DISTINCT g.stmt, E'\n'), ''), true)
  FROM (SELECT pg_catalog.format('GRANT %s ON %s TO %I%s', a.privilege_type, o.target,
                                 r.rolname,
                                 CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END) AS stmt
          FROM (VALUES ('@extschema@.idem_reserve(text, text, text, jsonb, interval, interval)', 'FUNCTION @extschema@.idem_reserve'),
                       ('@extschema@.idem_reserve(text, text, text, bytea, interval, interval)', 'FUNCTION @extschema@.idem_reserve'),
                       ('@extschema@.idem_complete(text, text, text, int, jsonb, jsonb, uuid)', 'FUNCTION @extschema@.idem_complete'),
                       ('@extschema@.idem_lookup(text, text, text)', 'FUNCTION @extschema@.idem_lookup'),
                       ('@extschema@.outbox_enqueue(text, text, jsonb, text, text, jsonb, interval, int)', 'FUNCTION @extschema@.outbox_enqueue'),
                       ('@extschema@.idem_stats()', 'FUNCTION @extschema@.idem_stats'))
                 AS o(fn, target)
          JOIN pg_catalog.pg_proc p ON p.oid OPERATOR(pg_catalog.=) o.fn::pg_catalog.regprocedure
         CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) a
          JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) a.grantee
         WHERE a.grantee OPERATOR(pg_catalog.<>) p.proowner
           AND r.rolname OPERATOR(pg_catalog.<>) ALL (ARRAY['idempotency_app', 'idempotency_worker',
                                                            'idempotency_admin', 'pg_monitor']::pg_catalog.name[])
        UNION ALL
        SELECT pg_catalog.format('GRANT %s ON TABLE %s TO %I%s', a.privilege_type, o.target,
                                 r.rolname,
                                 CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END)
          FROM (VALUES ('idempotency.health'), ('idempotency.stats'), ('idempotency.dead_letters'))
                 AS o(target)
          JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) o.target::pg_catalog.regclass
         CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) a
          JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) a.grantee
         WHERE a.grantee OPERATOR(pg_catalog.<>) c.relowner
           AND r.rolname OPERATOR(pg_catalog.<>) ALL (ARRAY['idempotency_app', 'idempotency_worker',
                                                            'idempotency_admin', 'pg_monitor']::pg_catalog.name[])
        UNION ALL
        SELECT pg_catalog.format('GRANT %s TO %I', n.what, r.rolname)
          FROM pg_catalog.pg_proc p
         CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) a
          JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) a.grantee
         CROSS JOIN (VALUES ('USAGE ON SCHEMA idempotency'),
                            ('EXECUTE ON PROCEDURE idempotency.maintain(interval, int, interval)'),
                            ('EXECUTE ON FUNCTION idempotency.reap(int), idempotency.sweep(interval), idempotency.reclaim_leases(), idempotency.purge_outbox(int)'))
                 AS n(what)
         WHERE p.oid OPERATOR(pg_catalog.=) '@extschema@.idem_maintain(interval, int, interval)'::pg_catalog.regprocedure
           AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
           AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
           AND r.rolname OPERATOR(pg_catalog.<>) ALL (ARRAY['idempotency_app', 'idempotency_worker',
                                                            'idempotency_admin', 'pg_monitor']::pg_catalog.name[])
        UNION ALL
        -- column grants on the rebuilt views (a column 1.1 no longer has
        -- is skipped with a warning, see the end of the update)
        SELECT pg_catalog.format('GRANT %s (%I) ON TABLE %s TO %I%s', a.privilege_type,
                                 att.attname, o.target, r.rolname,
                                 CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END)
          FROM (VALUES ('idempotency.health'), ('idempotency.stats'), ('idempotency.dead_letters'))
                 AS o(target)
          JOIN pg_catalog.pg_attribute att
            ON att.attrelid OPERATOR(pg_catalog.=) o.target::pg_catalog.regclass
           AND att.attnum OPERATOR(pg_catalog.>) 0 AND NOT att.attisdropped
         CROSS JOIN LATERAL pg_catalog.aclexplode(att.attacl) a
          JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) a.grantee
         WHERE r.rolname OPERATOR(pg_catalog.<>) ALL (ARRAY['idempotency_app', 'idempotency_worker',
                                                            'idempotency_admin', 'pg_monitor']::pg_catalog.name[])
        UNION ALL
        -- 1.0 let PUBLIC use schema idempotency, 1.1 does not: a role
        -- granted anything on a table or view of the schema needs USAGE
        SELECT pg_catalog.format('GRANT USAGE ON SCHEMA idempotency TO %I', r.rolname)
          FROM pg_catalog.pg_class c
         CROSS JOIN LATERAL (SELECT c.relacl AS acl
                             UNION ALL
                             SELECT att.attacl FROM pg_catalog.pg_attribute att
                              WHERE att.attrelid OPERATOR(pg_catalog.=) c.oid) acls
         CROSS JOIN LATERAL pg_catalog.aclexplode(acls.acl) a
          JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) a.grantee
         WHERE c.relnamespace OPERATOR(pg_catalog.=) 'idempotency'::pg_catalog.regnamespace
           AND acls.acl IS NOT NULL
           AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
           AND r.rolname OPERATOR(pg_catalog.<>) ALL (ARRAY['idempotency_app', 'idempotency_worker',
                                                            'idempotency_admin', 'pg_monitor']::pg_catalog.name[])) g;

/*
 * The privileges an administrator added to 1.0's objects, one per line
 * ("classoid objoid objsubid grantee grantor privilege grantable"): what
 * each object's ACL holds beyond the extension's initial privileges (or,
 * where 1.0 recorded none, beyond the object's default ACL).  When this
 * update changes the privileges of an object it keeps (a table, a
 * function), PostgreSQL records its whole ACL, these included, as the
 * extension's initial privileges, which pg_dump leaves out; the end of the
 * update takes them out again.
 */
SELECT pg_catalog.set_config('idempotency_update.added_privs',
       COALESCE(pg_catalog.string_agg(pg_catalog.format('%s %s %s %s %s %s %s',
                                                        g.classoid::pg_catalog.oid, g.objoid,
                                                        g.objsubid, g.grantee, g.grantor,
                                                        pg_catalog.replace(g.privilege_type, ' ', '_'),
                                                        g.is_grantable),
                                      E'\n'), ''), true)
  FROM (WITH mem AS (
            SELECT d.classid, d.objid
              FROM pg_catalog.pg_depend d
              JOIN pg_catalog.pg_extension e
                ON e.oid OPERATOR(pg_catalog.=) d.refobjid
             WHERE d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
               AND d.deptype OPERATOR(pg_catalog.=) 'e'
               AND e.extname OPERATOR(pg_catalog.=) 'idempotency'),
        acls AS (
            SELECT 'pg_catalog.pg_class'::pg_catalog.regclass AS classoid, c.oid AS objoid,
                   0 AS objsubid, c.relacl AS acl,
                   pg_catalog.acldefault(CASE WHEN c.relkind OPERATOR(pg_catalog.=) 'S' THEN 's'
                                              ELSE 'r' END::pg_catalog."char", c.relowner) AS dflt
              FROM pg_catalog.pg_class c
              JOIN mem ON mem.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
                      AND mem.objid OPERATOR(pg_catalog.=) c.oid
            UNION ALL
            -- a column has no privileges by default (aclexplode of NULL: none)
            SELECT 'pg_catalog.pg_class'::pg_catalog.regclass, a.attrelid, a.attnum, a.attacl,
                   NULL::pg_catalog.aclitem[]
              FROM pg_catalog.pg_attribute a
              JOIN mem ON mem.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
                      AND mem.objid OPERATOR(pg_catalog.=) a.attrelid
             WHERE a.attnum OPERATOR(pg_catalog.>) 0
               AND a.attacl IS NOT NULL
            UNION ALL
            SELECT 'pg_catalog.pg_proc'::pg_catalog.regclass, p.oid, 0, p.proacl,
                   pg_catalog.acldefault('f', p.proowner)
              FROM pg_catalog.pg_proc p
              JOIN mem ON mem.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
                      AND mem.objid OPERATOR(pg_catalog.=) p.oid
            UNION ALL
            SELECT 'pg_catalog.pg_namespace'::pg_catalog.regclass, n.oid, 0, n.nspacl,
                   pg_catalog.acldefault('n', n.nspowner)
              FROM pg_catalog.pg_namespace n
              JOIN mem ON mem.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_namespace'::pg_catalog.regclass
                      AND mem.objid OPERATOR(pg_catalog.=) n.oid
            UNION ALL
            SELECT 'pg_catalog.pg_type'::pg_catalog.regclass, t.oid, 0, t.typacl,
                   pg_catalog.acldefault('T', t.typowner)
              FROM pg_catalog.pg_type t
              JOIN mem ON mem.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_type'::pg_catalog.regclass
                      AND mem.objid OPERATOR(pg_catalog.=) t.oid)
        SELECT a.classoid, a.objoid, a.objsubid, x.grantee, x.grantor, x.privilege_type,
               x.is_grantable
          FROM acls a
         CROSS JOIN LATERAL pg_catalog.aclexplode(COALESCE(a.acl, a.dflt)) x
        EXCEPT
        SELECT a.classoid, a.objoid, a.objsubid, y.grantee, y.grantor, y.privilege_type,
               y.is_grantable
          FROM acls a
         CROSS JOIN LATERAL pg_catalog.aclexplode(COALESCE(
                 (SELECT ip.initprivs FROM pg_catalog.pg_init_privs ip
                   WHERE ip.classoid OPERATOR(pg_catalog.=) a.classoid
                     AND ip.objoid OPERATOR(pg_catalog.=) a.objoid
                     AND ip.objsubid OPERATOR(pg_catalog.=) a.objsubid
                     AND ip.privtype OPERATOR(pg_catalog.=) 'e'),
                 a.dflt)) y) g;

/*
 * idem_reserve: one signature instead of the two overloads of 1.0, which an
 * untyped request (a psql literal, or a driver that sends parameters
 * untyped) matched both of (42725).  Exactly one of request and
 * fingerprint is given.
 *
 * Every function that takes a tenant (idem_reserve, idem_complete,
 * idem_checkpoint, idem_release, idem_lookup, idem_resolve and the outbox's)
 * becomes SECURITY INVOKER without a SET clause: the library runs it as its
 * owner with search_path pinned (idem_owner_enter), as SECURITY DEFINER
 * with SET search_path did, without the per-call cost of the SET; and it
 * sees the role calling it, whose tenant binding it enforces (the owner of
 * a SECURITY DEFINER function, or of a table being analyzed, calling
 * through its own code), where SECURITY DEFINER hid that role.
 */
DROP FUNCTION @extschema@.idem_reserve(text, text, text, jsonb, interval, interval);
DROP FUNCTION @extschema@.idem_reserve(text, text, text, bytea, interval, interval);

CREATE FUNCTION @extschema@.idem_reserve(tenant text, scope text, key text,
                             request jsonb DEFAULT NULL,
                             ttl interval DEFAULT NULL,
                             wait interval DEFAULT '0',
                             fingerprint bytea DEFAULT NULL)
RETURNS idempotency.reservation
AS 'MODULE_PATHNAME', 'idem_reserve'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.idem_reserve(text, text, text, jsonb, interval, interval, bytea) IS
'reserve an idempotency key for a request (or its SHA-256 fingerprint): created, replay, in_progress, mismatch or stale';

ALTER FUNCTION @extschema@.idem_checkpoint(text, text, text, text, uuid) SECURITY INVOKER RESET ALL;
ALTER FUNCTION @extschema@.idem_release(text, text, text, uuid) SECURITY INVOKER RESET ALL;
ALTER FUNCTION @extschema@.idem_resolve(text, text, text, int, jsonb) SECURITY INVOKER RESET ALL;

/* ---- Least privilege (see README, Security) ---- */

/*
 * Three roles carry the privileges, so that "GRANT idempotency_app TO
 * my_app" is the whole set-up of an application role.  Roles belong to the
 * cluster, not to a database: another database that installed the
 * extension may have created them already.  NOLOGIN: they are granted to
 * the roles that log in.
 */
-- Several databases may install (or update) the extension at the same
-- time: a role another one created meanwhile (it commits first, and this
-- CREATE ROLE then fails on the role's name) is taken as it is.
DO $roles$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles
                    WHERE rolname OPERATOR(pg_catalog.=) 'idempotency_app') THEN
        BEGIN
            CREATE ROLE idempotency_app NOLOGIN;
        EXCEPTION WHEN unique_violation OR duplicate_object THEN
            NULL;
        END;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles
                    WHERE rolname OPERATOR(pg_catalog.=) 'idempotency_worker') THEN
        BEGIN
            CREATE ROLE idempotency_worker NOLOGIN;
        EXCEPTION WHEN unique_violation OR duplicate_object THEN
            NULL;
        END;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles
                    WHERE rolname OPERATOR(pg_catalog.=) 'idempotency_admin') THEN
        BEGIN
            CREATE ROLE idempotency_admin NOLOGIN;
        EXCEPTION WHEN unique_violation OR duplicate_object THEN
            NULL;
        END;
    END IF;
END
$roles$;

REVOKE USAGE ON SCHEMA idempotency FROM PUBLIC;
GRANT USAGE ON SCHEMA idempotency
    TO idempotency_app, idempotency_worker, idempotency_admin, pg_monitor;


/* functions in the extension's schema: app, worker and admin, no PUBLIC */
REVOKE ALL ON FUNCTION @extschema@.idem_reserve(text, text, text, jsonb, interval, interval, bytea),
    @extschema@.idem_complete(text, text, text, int, jsonb, jsonb, uuid),
    @extschema@.idem_checkpoint(text, text, text, text, uuid),
    @extschema@.idem_release(text, text, text, uuid),
    @extschema@.idem_lookup(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.idem_reserve(text, text, text, jsonb, interval, interval, bytea),
    @extschema@.idem_complete(text, text, text, int, jsonb, jsonb, uuid),
    @extschema@.idem_checkpoint(text, text, text, text, uuid),
    @extschema@.idem_release(text, text, text, uuid),
    @extschema@.idem_lookup(text, text, text) TO idempotency_app;
GRANT EXECUTE ON FUNCTION @extschema@.idem_resolve(text, text, text, int, jsonb),
    @extschema@.idem_configure_scope(text, jsonb) TO idempotency_admin;
REVOKE ALL ON FUNCTION @extschema@.outbox_enqueue(text, text, jsonb, text, text, jsonb, interval, int),
    @extschema@.outbox_claim(text, int, interval, text[], text),
    @extschema@.outbox_ack(text, bigint, uuid, text),
    @extschema@.outbox_nack(text, bigint, uuid, text, interval),
    @extschema@.outbox_requeue(text, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.outbox_enqueue(text, text, jsonb, text, text, jsonb, interval, int)
    TO idempotency_app;
GRANT EXECUTE ON FUNCTION @extschema@.outbox_claim(text, int, interval, text[], text),
    @extschema@.outbox_ack(text, bigint, uuid, text),
    @extschema@.outbox_nack(text, bigint, uuid, text, interval) TO idempotency_worker;
GRANT EXECUTE ON FUNCTION @extschema@.outbox_requeue(text, bigint) TO idempotency_admin;
GRANT SELECT ON idempotency.dead_letters TO idempotency_admin;
GRANT EXECUTE ON FUNCTION @extschema@.idem_reap(int), @extschema@.idem_sweep(interval),
    @extschema@.idem_reclaim_leases(), @extschema@.idem_purge_outbox(int),
    @extschema@.idem_schedule_maintenance(text), @extschema@.idem_unschedule_maintenance()
    TO idempotency_admin;
GRANT EXECUTE ON PROCEDURE @extschema@.idem_maintain(interval, int, interval) TO idempotency_admin;
GRANT EXECUTE ON FUNCTION @extschema@.idem_stats() TO idempotency_admin;
GRANT EXECUTE ON FUNCTION @extschema@.idem_stats_reset() TO idempotency_admin;
GRANT SELECT ON idempotency.stats, idempotency.health TO idempotency_admin;
GRANT SELECT ON idempotency.keys, idempotency.scopes, idempotency.outbox
    TO idempotency_admin;

/*
 * idem_lookup no longer returns the lock token: whoever can look a key up
 * must not be able to complete another attempt's reservation with it.
 */
DROP FUNCTION @extschema@.idem_lookup(text, text, text);
CREATE FUNCTION @extschema@.idem_lookup(tenant text, scope text, key text)
RETURNS TABLE (tenant_id text, scope text, idem_key text, fingerprint bytea,
               status idempotency.status, locked_at timestamptz,
               recovery_point text, response_code int, response_body jsonb,
               response_headers jsonb, needs_reconciliation bool,
               created_at timestamptz, completed_at timestamptz,
               expires_at timestamptz)
AS 'MODULE_PATHNAME', 'idem_lookup'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 1;

COMMENT ON FUNCTION @extschema@.idem_lookup(text, text, text) IS
'the row of an idempotency key, without side effects and without its lock_token';

REVOKE ALL ON FUNCTION @extschema@.idem_lookup(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.idem_lookup(text, text, text) TO idempotency_app;

/* ---- Tenant binding ---- */

CREATE TABLE idempotency.tenant_bindings (
    role   regrole PRIMARY KEY,
    tenant text NOT NULL
);
REVOKE ALL ON idempotency.tenant_bindings FROM PUBLIC;
GRANT SELECT ON idempotency.tenant_bindings TO idempotency_admin;

/* Tenant binding (admin). */
CREATE FUNCTION @extschema@.idem_bind_tenant(role regrole, tenant text)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_bind_tenant'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION @extschema@.idem_bind_tenant(regrole, text) IS
'bind a role to one tenant: it can no longer act for any other';

CREATE FUNCTION @extschema@.idem_unbind_tenant(role regrole)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_unbind_tenant'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION @extschema@.idem_unbind_tenant(regrole) IS
'remove the tenant binding of a role';

REVOKE ALL ON FUNCTION @extschema@.idem_bind_tenant(regrole, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_unbind_tenant(regrole) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.idem_bind_tenant(regrole, text) TO idempotency_admin;
GRANT EXECUTE ON FUNCTION @extschema@.idem_unbind_tenant(regrole) TO idempotency_admin;

/* ---- pg_dump keeps scope policies, live keys and tenant bindings ---- */

SELECT pg_catalog.pg_extension_config_dump('idempotency.keys', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.scopes', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.tenant_bindings', '');

/* ---- Nothing planted in another schema runs: everything qualified ---- */

/*
 * What maintenance runs lives in schema idempotency, which the extension
 * creates and its owner owns: idempotency.maintain, the procedure the
 * pg_cron job calls (as the job's owner, a superuser), and the functions
 * it calls.  The extension's own schema is not safe to name there: a
 * database owner may rename it (on PostgreSQL 15, public belongs to
 * pg_database_owner) and create another schema of the same name, where a
 * name written into a procedure body or a job's command would find the
 * owner's objects.  No one but the extension's owner can rename schema
 * idempotency or create in it.  These four are idem_reap, idem_sweep,
 * idem_reclaim_leases and idem_purge_outbox under names in that schema,
 * granted to the same role.
 */
CREATE FUNCTION idempotency.reap(batch_size int)
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'idem_reap'
    LANGUAGE C VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp;
CREATE FUNCTION idempotency.sweep(older_than interval)
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'idem_sweep'
    LANGUAGE C VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp;
CREATE FUNCTION idempotency.reclaim_leases()
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'idem_reclaim_leases'
    LANGUAGE C VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp;
CREATE FUNCTION idempotency.purge_outbox(batch_size int)
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'idem_purge_outbox'
    LANGUAGE C VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION idempotency.reap(int), idempotency.sweep(interval),
    idempotency.reclaim_leases(), idempotency.purge_outbox(int) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempotency.reap(int), idempotency.sweep(interval),
    idempotency.reclaim_leases(), idempotency.purge_outbox(int) TO idempotency_admin;

/*
 * idempotency.maintain (what idem_maintain runs) is a procedure so it can
 * COMMIT between batches: every batch is its own short transaction, and
 * its row locks are released at once.  PostgreSQL does not allow
 * transaction control in a SECURITY DEFINER procedure, or in one with a
 * SET clause, so this one runs with the caller's rights and relies on the
 * SECURITY DEFINER functions above (which the caller must be allowed to
 * execute) and on naming everything schema-qualified.  Call it as a
 * statement of its own, not inside BEGIN.
 *
 * The defaults are gentle on purpose: small batches with a rest between
 * them leave CPU and WAL bandwidth to the requests while a backlog is
 * worked off, and still reap several hundred thousand keys per 50-second
 * run.
 */
CREATE PROCEDURE idempotency.maintain(time_budget interval DEFAULT '50 seconds',
                                      batch_size int DEFAULT 1000,
                                      batch_pause interval DEFAULT '100 milliseconds')
    LANGUAGE plpgsql
    AS $$
-- Runs with the caller's search_path (a procedure that commits can have no
-- SET clause): every operator, function and type is schema-qualified, so
-- nothing planted in another schema can run with the caller's rights.
DECLARE
    deadline  pg_catalog.timestamptz;
    n         pg_catalog.int8;
    swept     pg_catalog.int8;
    reclaimed pg_catalog.int8;
    reaped    pg_catalog.int8 := 0;
    purged    pg_catalog.int8 := 0;
    reap_done  pg_catalog.bool := false;
    purge_done pg_catalog.bool := false;
    started   pg_catalog.timestamptz;
    stmt_timeout pg_catalog.interval;
    batches   pg_catalog.int4 := 0;
BEGIN
    IF time_budget IS NULL THEN
        RAISE EXCEPTION 'time_budget must not be null'
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'Pass how long this run may take, such as ''50 seconds'' for a job that runs every minute.';
    END IF;
    IF time_budget OPERATOR(pg_catalog.<=) '0'::pg_catalog.interval THEN
        RAISE EXCEPTION 'time_budget must be a positive interval'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass how long this run may take, such as ''50 seconds'' for a job that runs every minute.';
    END IF;
    IF time_budget OPERATOR(pg_catalog.>) '1000 years'::pg_catalog.interval THEN
        RAISE EXCEPTION 'time_budget must be at most 1000 years'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass how long this run may take, such as ''50 seconds'' for a job that runs every minute.';
    END IF;
    -- mixed signs ('-1 year 360 days') compare as positive and may still
    -- come to a negative length on the calendar
    IF pg_catalog.statement_timestamp() OPERATOR(pg_catalog.+) time_budget
       OPERATOR(pg_catalog.<=) pg_catalog.statement_timestamp() THEN
        RAISE EXCEPTION 'time_budget must be a positive interval'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'Its months, days and time have different signs, and at the current date they come to a negative or zero length.',
                  HINT = 'Pass how long this run may take, such as ''50 seconds'' for a job that runs every minute.';
    END IF;
    IF batch_size IS NULL THEN
        RAISE EXCEPTION 'batch_size must not be null'
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'Use a batch of a few thousand rows so each transaction stays short.';
    END IF;
    IF batch_size OPERATOR(pg_catalog.<) 1
       OR batch_size OPERATOR(pg_catalog.>) 1000000 THEN
        RAISE EXCEPTION 'batch_size must be between 1 and 1000000'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use a batch of a few thousand rows so each transaction stays short.';
    END IF;
    IF batch_pause IS NULL THEN
        RAISE EXCEPTION 'batch_pause must not be null'
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'Pass how long to rest between batches, such as ''20 milliseconds'', or ''0''.';
    END IF;
    IF batch_pause OPERATOR(pg_catalog.>) '1000 years'::pg_catalog.interval THEN
        RAISE EXCEPTION 'batch_pause must be at most 1000 years'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass how long to rest between batches, such as ''20 milliseconds'', or ''0''.';
    END IF;
    IF batch_pause OPERATOR(pg_catalog.<) '0'::pg_catalog.interval
       OR pg_catalog.statement_timestamp() OPERATOR(pg_catalog.+) batch_pause
          OPERATOR(pg_catalog.<) pg_catalog.statement_timestamp() THEN
        RAISE EXCEPTION 'batch_pause must not be negative'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass how long to rest between batches, such as ''20 milliseconds'', or ''0''.';
    END IF;
    deadline := pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) time_budget;
    -- statement_timeout counts from the CALL's start across its COMMITs
    -- (the scheduled job inherits the database's and role's setting): stop
    -- starting batches at four fifths of it, so that the run ends rather
    -- than being canceled (57014) by a timeout shorter than the budget
    stmt_timeout := pg_catalog.current_setting('statement_timeout')::pg_catalog.interval;
    IF stmt_timeout OPERATOR(pg_catalog.>) '0'::pg_catalog.interval THEN
        deadline := LEAST(deadline, pg_catalog.statement_timestamp()
                          OPERATOR(pg_catalog.+)
                          (stmt_timeout OPERATOR(pg_catalog.*) 0.8::pg_catalog.float8));
    END IF;
    -- COMMIT works only in a procedure CALLed as a statement of its own:
    -- inside a transaction block or a function, fail (2D000) here, before
    -- the sweep writes, rather than at the first COMMIT after it
    COMMIT;

    -- first what is urgent and small: stuck reservations and lost leases,
    -- each committed on its own (under a statement_timeout the sweep stops
    -- at two fifths of it, the lease recovery at three)
    swept := idempotency.sweep(NULL::pg_catalog.interval);
    COMMIT;
    reclaimed := idempotency.reclaim_leases();
    COMMIT;

    -- then, taking turns, a batch of expired keys and a batch of delivered
    -- outbox rows: a reap backlog that outlasts the budget must not starve
    -- the purge (nor a purge backlog the reaper)
    LOOP
        started := pg_catalog.clock_timestamp();
        IF NOT reap_done
           AND pg_catalog.clock_timestamp() OPERATOR(pg_catalog.<) deadline THEN
            n := idempotency.reap(batch_size);
            reaped := reaped OPERATOR(pg_catalog.+) n;
            batches := batches OPERATOR(pg_catalog.+) 1;
            COMMIT;
            reap_done := n OPERATOR(pg_catalog.<) batch_size;
        END IF;
        IF NOT purge_done
           AND pg_catalog.clock_timestamp() OPERATOR(pg_catalog.<) deadline THEN
            n := idempotency.purge_outbox(batch_size);
            purged := purged OPERATOR(pg_catalog.+) n;
            batches := batches OPERATOR(pg_catalog.+) 1;
            COMMIT;
            purge_done := n OPERATOR(pg_catalog.<) batch_size;
        END IF;
        EXIT WHEN (reap_done AND purge_done)
               OR pg_catalog.clock_timestamp() OPERATOR(pg_catalog.>=) deadline;
        IF batch_pause OPERATOR(pg_catalog.>) '0'::pg_catalog.interval THEN
            -- rest at least batch_pause, and twice as long as the batches
            -- took: slow batches (a bloated table, a busy server) get
            -- longer rests, so maintenance never takes more than a third
            -- of the time it runs; but never past the deadline, and no
            -- batch starts after it
            PERFORM pg_catalog.pg_sleep_for(LEAST(GREATEST(batch_pause,
                (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) started)
                    OPERATOR(pg_catalog.*) 2::pg_catalog.float8),
                deadline OPERATOR(pg_catalog.-) pg_catalog.clock_timestamp()));
            EXIT WHEN pg_catalog.clock_timestamp() OPERATOR(pg_catalog.>=) deadline;
        END IF;
    END LOOP;

    -- a deadline already past after the sweep (a short statement_timeout):
    -- the run succeeds, but it reaps nothing, and will not next time
    IF batches OPERATOR(pg_catalog.=) 0 THEN
        RAISE WARNING 'idem_maintain: no time was left to reap expired keys or purge delivered outbox rows'
            USING DETAIL = 'The run stops starting batches at its time_budget or at four fifths of statement_timeout, whichever comes first; the sweep and the lease recovery before them used that time.',
                  HINT = 'Raise statement_timeout for the role that runs maintenance (ALTER ROLE ... SET statement_timeout), or time_budget.';
    END IF;
    RAISE DEBUG 'idem_maintain: swept %, reclaimed %, reaped %, purged %',
        swept, reclaimed, reaped, purged;
END
$$;
COMMENT ON PROCEDURE idempotency.maintain(interval, int, interval) IS
    'what idem_maintain and the scheduled maintenance job run';
REVOKE ALL ON PROCEDURE idempotency.maintain(interval, int, interval) FROM PUBLIC;
GRANT EXECUTE ON PROCEDURE idempotency.maintain(interval, int, interval) TO idempotency_admin;

/* the procedure users call: idempotency.maintain, named in its schema */
CREATE OR REPLACE PROCEDURE @extschema@.idem_maintain(time_budget interval DEFAULT '50 seconds',
                               batch_size int DEFAULT 1000,
                               batch_pause interval DEFAULT '100 milliseconds')
    LANGUAGE plpgsql
    AS $$
BEGIN
    CALL idempotency.maintain(time_budget, batch_size, batch_pause);
END
$$;

/*
 * Tenants, scopes and keys are compared byte for byte (collation "C"), and
 * the primary key orders the key before the scope, as in a fresh install:
 * the primary key is rebuilt once, under an exclusive lock for as long as
 * that takes.  The health view reads the columns, so it is dropped and
 * created again, with its comment and privileges.
 */
DROP VIEW idempotency.health;
ALTER TABLE idempotency.keys
    DROP CONSTRAINT keys_pkey,
    ALTER COLUMN tenant_id TYPE pg_catalog.text COLLATE pg_catalog."C",
    ALTER COLUMN scope TYPE pg_catalog.text COLLATE pg_catalog."C",
    ALTER COLUMN idem_key TYPE pg_catalog.text COLLATE pg_catalog."C",
    ADD CONSTRAINT keys_pkey PRIMARY KEY (tenant_id, idem_key, scope);

CREATE VIEW idempotency.health AS
SELECT k.processing,
       k.oldest_processing_age,
       k.stale_processing,
       k.needs_reconciliation,
       k.expired_keys,
       op.outbox_pending,
       oa.outbox_oldest_pending_age,
       ol.outbox_leased,
       od.outbox_dead,
       h.reservations_held,
       h.oldest_held_age,
       ol.outbox_expired_leases
  FROM (SELECT pg_catalog.count(*) FILTER (
                   WHERE k.status OPERATOR(pg_catalog.=) 'processing')
                   AS processing,
               pg_catalog.now() OPERATOR(pg_catalog.-)
                   pg_catalog.min(COALESCE(k.locked_at, k.created_at)) FILTER (
                   WHERE k.status OPERATOR(pg_catalog.=) 'processing')
                   AS oldest_processing_age,
               pg_catalog.count(*) FILTER (
                   WHERE k.status OPERATOR(pg_catalog.=) 'processing'
                     AND NOT k.needs_reconciliation
                     AND COALESCE(k.locked_at, k.created_at) OPERATOR(pg_catalog.<)
                         (pg_catalog.now() OPERATOR(pg_catalog.-) COALESCE(
                           s.lock_timeout,
                           pg_catalog.current_setting('idempotency.default_lock_timeout', true)::pg_catalog.interval,
                           '5 minutes'::pg_catalog.interval)))
                   AS stale_processing,
               pg_catalog.count(*) FILTER (WHERE k.needs_reconciliation)
                   AS needs_reconciliation,
               pg_catalog.count(*) FILTER (
                   WHERE k.expires_at OPERATOR(pg_catalog.<) pg_catalog.now()
                     AND k.status OPERATOR(pg_catalog.<>) 'processing'
                     AND NOT k.needs_reconciliation)
                   AS expired_keys
          FROM idempotency.keys k
          LEFT JOIN idempotency.scopes s ON s.scope OPERATOR(pg_catalog.=) k.scope) k,
       (SELECT pg_catalog.count(*) AS outbox_pending
          FROM idempotency.outbox o
         WHERE o.status OPERATOR(pg_catalog.=) 'pending') op,
       -- the oldest due row: a pending row since its available_at, or a
       -- lease that ran out since its end (its worker gone)
       (SELECT pg_catalog.now() OPERATOR(pg_catalog.-) LEAST(
                   (SELECT pg_catalog.min(o.available_at)
                      FROM idempotency.outbox o
                     WHERE o.status OPERATOR(pg_catalog.=) 'pending'
                       AND o.available_at OPERATOR(pg_catalog.<=) pg_catalog.now()),
                   (SELECT pg_catalog.min(o.lease_until)
                      FROM idempotency.outbox o
                     WHERE o.status OPERATOR(pg_catalog.=) 'leased'
                       AND o.lease_until OPERATOR(pg_catalog.<) pg_catalog.now()))
                   AS outbox_oldest_pending_age) oa,
       -- leases still running, and leases that ran out (their worker
       -- died or hung: due again, until a claim or idem_reclaim_leases
       -- takes them back)
       (SELECT pg_catalog.count(*) FILTER (
                   WHERE o.lease_until OPERATOR(pg_catalog.>=) pg_catalog.now())
                   AS outbox_leased,
               pg_catalog.count(*) FILTER (
                   WHERE o.lease_until OPERATOR(pg_catalog.<) pg_catalog.now())
                   AS outbox_expired_leases
          FROM idempotency.outbox o
         WHERE o.status OPERATOR(pg_catalog.=) 'leased'
           AND o.lease_until IS NOT NULL) ol,
       (SELECT pg_catalog.count(*) AS outbox_dead
          FROM idempotency.outbox o
         WHERE o.status OPERATOR(pg_catalog.=) 'dead') od,
       -- keys held by open and prepared transactions (a reservation in
       -- atomic use is written when it is completed or committed): the
       -- advisory locks whose fourth field is keys.c's IDEM_LOCKTAG_CLASS
       -- (0x4944), aged from the start of the transaction holding each
       -- (another role's shows to members of pg_read_all_stats) or from
       -- its PREPARE TRANSACTION (found through its xid's lock, which a
       -- prepared transaction holds without a pid).  Both are read from
       -- the functions behind pg_stat_activity and pg_prepared_xacts: those
       -- views join pg_authid, which Citus checks as the calling role.  The lock table is
       -- read once, and the prepared transactions are matched from the
       -- few rows of "prepared": a join back to pg_locks read the whole
       -- lock table again for every key held (a second for 6,000 keys).
       (WITH l AS MATERIALIZED (
             SELECT l.locktype, l.pid, l.virtualtransaction, l.transactionid
               FROM pg_catalog.pg_locks l
              WHERE (l.locktype OPERATOR(pg_catalog.=) 'advisory'
                     AND l.objsubid OPERATOR(pg_catalog.=) 18756
                     AND l.granted
                     AND l.database OPERATOR(pg_catalog.=)
                         (SELECT d.oid FROM pg_catalog.pg_database d
                           WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()))
                 OR (l.locktype OPERATOR(pg_catalog.=) 'transactionid'
                     AND l.pid IS NULL)),
             prepared AS MATERIALIZED (
             SELECT x.virtualtransaction, p.prepared
               FROM l x
               JOIN pg_catalog.pg_prepared_xact() p
                 ON p.transaction OPERATOR(pg_catalog.=) x.transactionid
              WHERE x.locktype OPERATOR(pg_catalog.=) 'transactionid')
        SELECT pg_catalog.count(*) AS reservations_held,
               pg_catalog.now() OPERATOR(pg_catalog.-)
                   pg_catalog.min(COALESCE(a.xact_start, p.prepared)) AS oldest_held_age
          FROM l
          LEFT JOIN pg_catalog.pg_stat_get_activity(NULL::pg_catalog.int4) a
                 ON a.pid OPERATOR(pg_catalog.=) l.pid
          LEFT JOIN prepared p
                 ON l.pid IS NULL
                AND p.virtualtransaction OPERATOR(pg_catalog.=) l.virtualtransaction
         WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory') h;
COMMENT ON VIEW idempotency.health IS
    'stuck reservations, reconciliation backlog, reap backlog and outbox depth';
REVOKE ALL ON idempotency.health FROM PUBLIC;
GRANT SELECT ON idempotency.health TO pg_monitor, idempotency_admin;

/*
 * The outbox's tenant is compared byte for byte too, as Citus needs to
 * colocate outbox and keys, and so is its topic, an identifier a claim by
 * topic compares in outbox_topic_claim_idx: its indexes are rebuilt, and
 * the dead letters view, which reads the columns, is created again with
 * its privileges.
 */
DROP VIEW idempotency.dead_letters;
ALTER TABLE idempotency.outbox
    ALTER COLUMN tenant_id TYPE pg_catalog.text COLLATE pg_catalog."C",
    ALTER COLUMN topic TYPE pg_catalog.text COLLATE pg_catalog."C";

CREATE VIEW idempotency.dead_letters AS
    SELECT tenant_id, id, topic, idem_scope, idem_key, attempts, max_attempts,
           last_error, leased_by AS last_worker, created_at, payload, headers
      FROM idempotency.outbox
     WHERE status OPERATOR(pg_catalog.=) 'dead';
REVOKE ALL ON idempotency.dead_letters FROM PUBLIC;
GRANT SELECT ON idempotency.dead_letters TO idempotency_admin;

/*
 * Retryable failures: idem_complete(..., retryable => true) releases the
 * key whatever the status code, and a scope may list status codes that are
 * never stored (retryable_codes).
 */
ALTER TABLE idempotency.scopes ADD COLUMN retryable_codes int[];

/*
 * Key spraying: a rate of new keys per tenant, and a quota of live keys per
 * tenant, answered rate_limited (429).
 */
ALTER TYPE idempotency.outcome ADD VALUE 'rate_limited';
ALTER TABLE idempotency.scopes ADD COLUMN new_keys_per_second float8,
    ADD COLUMN new_keys_burst int,
    ADD COLUMN max_live_keys int;

/*
 * Under logical replication (README, "Logical replication") the apply
 * worker runs with session_replication_role = replica and fires no
 * statement trigger for a replicated row: this row trigger, enabled for
 * replica only, sends the same invalidation there; the statement trigger
 * fires always, for a replicated TRUNCATE and the initial copy.
 */
CREATE TRIGGER scopes_replicated
    AFTER INSERT OR UPDATE OR DELETE ON idempotency.scopes
    FOR EACH ROW EXECUTE FUNCTION idempotency.scopes_changed();
ALTER TABLE idempotency.scopes
    ENABLE REPLICA TRIGGER scopes_replicated,
    ENABLE ALWAYS TRIGGER scopes_changed;

DROP FUNCTION @extschema@.idem_complete(text, text, text, int, jsonb, jsonb, uuid);
CREATE FUNCTION @extschema@.idem_complete(tenant text, scope text, key text,
                              response_code int, response_body jsonb,
                              response_headers jsonb DEFAULT NULL,
                              lock_token uuid DEFAULT NULL,
                              retryable bool DEFAULT false)
RETURNS idempotency.status
AS 'MODULE_PATHNAME', 'idem_complete'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.idem_complete(text, text, text, int, jsonb, jsonb, uuid, bool) IS
'store the response of a reservation (2xx/3xx succeeded, 4xx failed); release the key instead when retryable, for the scope''s retryable_codes, and for 5xx unless cached';

REVOKE ALL ON FUNCTION @extschema@.idem_complete(text, text, text, int, jsonb, jsonb, uuid, bool) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.idem_complete(text, text, text, int, jsonb, jsonb, uuid, bool)
    TO idempotency_app;

/*
 * The fingerprint function under a name in schema idempotency, for
 * idem_configure_scope, which runs as the extension owner and so never
 * names the extension's own schema (see idempotency.maintain below).
 */
CREATE FUNCTION idempotency.fingerprint(request jsonb, ignore text[])
RETURNS bytea
AS 'MODULE_PATHNAME', 'idem_fingerprint'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
REVOKE ALL ON FUNCTION idempotency.fingerprint(jsonb, text[]) FROM PUBLIC;

CREATE OR REPLACE FUNCTION @extschema@.idem_configure_scope(scope text, options jsonb)
RETURNS idempotency.scopes
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    valid constant text[] := ARRAY['ttl', 'lock_timeout', 'cache_server_errors',
                                   'stale_action', 'fingerprint_ignore',
                                   'retryable_codes', 'new_keys_per_second',
                                   'new_keys_burst', 'max_live_keys'];
    unknown text;
    opt text;
    v jsonb;
    iv interval;
    p_ttl interval;
    p_lock_timeout interval;
    p_cache bool := false;
    p_stale idempotency.stale_action := 'fail';
    p_ignore text[];
    p_retryable int[];
    p_rate float8;
    p_burst int;
    p_max_live int;
    cur_rate float8;
    msg text;
    det text;
    hnt text;
    result idempotency.scopes;
BEGIN
    IF scope IS NULL OR scope = '' THEN
        RAISE EXCEPTION 'scope must not be null or empty'
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'Pass the name of the scope to configure.';
    END IF;
    IF pg_catalog.octet_length(scope) > 255 THEN
        RAISE EXCEPTION 'scope is longer than 255 bytes'
            USING ERRCODE = 'string_data_right_truncation',
                  HINT = 'Use a shorter scope; tenants and scopes are names, such as "acme" or "POST /v1/charges".';
    END IF;
    IF options IS NULL THEN
        RAISE EXCEPTION 'scope options must not be null'
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'Pass an object such as {"ttl": "1 day"}; {} keeps every option as it is.';
    END IF;
    IF pg_catalog.jsonb_typeof(options) <> 'object' THEN
        RAISE EXCEPTION 'scope options must be a JSON object'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass an object such as {"ttl": "1 day", "stale_action": "takeover"}.';
    END IF;
    SELECT k INTO unknown
      FROM pg_catalog.jsonb_object_keys(options) AS k
     WHERE k <> ALL (valid)
     ORDER BY k LIMIT 1;
    IF unknown IS NOT NULL THEN
        RAISE EXCEPTION 'unknown scope option "%"', unknown
            USING ERRCODE = 'undefined_object',
                  HINT = 'Valid options are: ' || pg_catalog.array_to_string(valid, ', ') || '.';
    END IF;

    FOREACH opt IN ARRAY ARRAY['ttl', 'lock_timeout'] LOOP
        v := options -> opt;
        CONTINUE WHEN v IS NULL OR v = 'null';
        IF pg_catalog.jsonb_typeof(v) NOT IN ('string', 'number') THEN
            RAISE EXCEPTION 'scope option "%" must be an interval', opt
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Pass an interval as text, such as "1 day", or a number of seconds.';
        END IF;
        IF pg_catalog.jsonb_typeof(v) = 'number' THEN
            -- compared as numeric first: a number out of range is no error of
            -- the cast (and under a microsecond, which no interval holds, is none)
            IF (v #>> '{}')::numeric < 0.000001 THEN
                iv := interval '0';
            ELSIF (v #>> '{}')::numeric > 31104000000 THEN
                iv := NULL;
            ELSE
                iv := pg_catalog.make_interval(secs => (v #>> '{}')::float8);
            END IF;
        ELSE
            BEGIN
                iv := (v #>> '{}')::interval;
            EXCEPTION WHEN data_exception THEN
                RAISE EXCEPTION 'scope option "%" is not an interval: "%"', opt, v #>> '{}'
                    USING ERRCODE = 'invalid_parameter_value',
                          HINT = 'Pass an interval as text, such as "1 day" or "90 seconds", or a number of seconds.';
            END;
        END IF;
        IF iv <= interval '0' THEN
            RAISE EXCEPTION 'scope option "%" must be positive', opt
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Pass a positive interval, or null for the default.';
        END IF;
        -- a negative part makes the length depend on the date it is added
        -- to ('-1 mon 30 days 23 hours' is positive in some months only)
        IF extract(year FROM iv) * 12 + extract(month FROM iv) < 0
           OR extract(day FROM iv) < 0
           OR extract(hour FROM iv) * 3600 + extract(minute FROM iv) * 60
              + extract(second FROM iv) < 0 THEN
            RAISE EXCEPTION 'scope option "%" must have no negative part: "%"', opt, iv
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Pass the length without negative parts, such as "1 day" or "23 hours"; months and days vary in length.';
        END IF;
        -- expires_at and the staleness of a lock are timestamps: keep them in range
        IF iv IS NULL OR iv > interval '1000 years' THEN
            RAISE EXCEPTION 'scope option "%" must be at most 1000 years', opt
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Pass an interval such as "30 days", or null for the default.';
        END IF;
        IF opt = 'ttl' THEN
            p_ttl := iv;
        ELSE
            p_lock_timeout := iv;
        END IF;
    END LOOP;

    v := options -> 'cache_server_errors';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF pg_catalog.jsonb_typeof(v) <> 'boolean' THEN
            RAISE EXCEPTION 'scope option "cache_server_errors" must be a boolean'
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Pass true to store and replay 5xx responses, false to release the key on them.';
        END IF;
        p_cache := v::text::bool;
    END IF;

    v := options -> 'stale_action';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF pg_catalog.jsonb_typeof(v) <> 'string'
           OR (v #>> '{}') NOT IN ('fail', 'takeover') THEN
            RAISE EXCEPTION 'scope option "stale_action" must be "fail" or "takeover"'
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Use "fail" to flag stale reservations for reconciliation, "takeover" to hand them to the next attempt.';
        END IF;
        p_stale := (v #>> '{}')::idempotency.stale_action;
    END IF;

    v := options -> 'fingerprint_ignore';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF pg_catalog.jsonb_typeof(v) <> 'array'
           OR EXISTS (SELECT FROM pg_catalog.jsonb_array_elements(v) AS e
                       WHERE pg_catalog.jsonb_typeof(e) <> 'string') THEN
            RAISE EXCEPTION 'scope option "fingerprint_ignore" must be an array of JSON Pointers'
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Pass RFC 6901 pointers to the request members to leave out, such as ["/timestamp", "/meta/trace_id"].';
        END IF;
        -- every request of the scope compares its members with the list
        IF pg_catalog.jsonb_array_length(v) > 100 THEN
            RAISE EXCEPTION 'scope option "fingerprint_ignore" lists at most 100 pointers'
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Leave out the few members a retry may change, such as ["/timestamp", "/meta/trace_id"]; a pointer to an object leaves out everything under it.';
        END IF;
        SELECT pg_catalog.array_agg(e ORDER BY n) INTO p_ignore
          FROM pg_catalog.jsonb_array_elements_text(v) WITH ORDINALITY AS a(e, n);
        -- the fingerprint module's own checks of the pointers, before the
        -- write, raised as a wrong option value like every other
        BEGIN
            PERFORM idempotency.fingerprint('{}'::jsonb, p_ignore);
        EXCEPTION WHEN invalid_text_representation OR invalid_parameter_value THEN
            GET STACKED DIAGNOSTICS msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL,
                                    hnt = PG_EXCEPTION_HINT;
            RAISE EXCEPTION 'scope option "fingerprint_ignore": %', msg
                USING ERRCODE = 'invalid_parameter_value',
                      DETAIL = COALESCE(det, ''),
                      HINT = COALESCE(hnt, '');
        END;
    END IF;

    v := options -> 'retryable_codes';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF pg_catalog.jsonb_typeof(v) <> 'array'
           OR EXISTS (SELECT FROM pg_catalog.jsonb_array_elements(v) AS e
                       WHERE pg_catalog.jsonb_typeof(e) <> 'number'
                          OR (e #>> '{}')::numeric NOT BETWEEN 100 AND 599
                          OR (e #>> '{}')::numeric <> pg_catalog.trunc((e #>> '{}')::numeric)) THEN
            RAISE EXCEPTION 'scope option "retryable_codes" must be an array of status codes from 100 to 599'
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'List the codes whose responses are never stored, so that a retry runs afresh, such as [408, 429, 503].';
        END IF;
        SELECT pg_catalog.array_agg(DISTINCT (e #>> '{}')::numeric::int ORDER BY (e #>> '{}')::numeric::int) INTO p_retryable
          FROM pg_catalog.jsonb_array_elements(v) AS e;
    END IF;

    v := options -> 'new_keys_per_second';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF pg_catalog.jsonb_typeof(v) <> 'number'
           OR (v #>> '{}')::numeric < 0.000001 OR (v #>> '{}')::numeric > 1000000 THEN
            RAISE EXCEPTION 'scope option "new_keys_per_second" must be a number from 0.000001 to 1000000'
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Pass how many new keys a tenant may create per second in this scope, such as 50 or 0.5.';
        END IF;
        p_rate := (v #>> '{}')::float8;
    END IF;
    v := options -> 'new_keys_burst';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF pg_catalog.jsonb_typeof(v) <> 'number'
           OR (v #>> '{}')::numeric < 1 OR (v #>> '{}')::numeric > 1000000
           OR (v #>> '{}')::numeric <> pg_catalog.trunc((v #>> '{}')::numeric) THEN
            RAISE EXCEPTION 'scope option "new_keys_burst" must be an integer from 1 to 1000000'
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Pass how many new keys a tenant may create at once before the rate applies, such as 100.';
        END IF;
        p_burst := (v #>> '{}')::numeric::int;
    END IF;
    v := options -> 'max_live_keys';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF pg_catalog.jsonb_typeof(v) <> 'number'
           OR (v #>> '{}')::numeric < 1 OR (v #>> '{}')::numeric > 1000000000
           OR (v #>> '{}')::numeric <> pg_catalog.trunc((v #>> '{}')::numeric) THEN
            RAISE EXCEPTION 'scope option "max_live_keys" must be an integer from 1 to 1000000000'
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Pass how many unexpired keys a tenant may hold in this scope, such as 100000.';
        END IF;
        p_max_live := (v #>> '{}')::numeric::int;
    END IF;

    -- a burst is the depth of the rate's bucket: alone it limits nothing,
    -- and removing the rate removes it (below)
    IF p_burst IS NOT NULL THEN
        cur_rate := p_rate;
        IF NOT options ? 'new_keys_per_second' THEN
            SELECT s.new_keys_per_second INTO cur_rate
              FROM idempotency.scopes AS s
             WHERE s.scope = idem_configure_scope.scope;
        END IF;
        IF cur_rate IS NULL THEN
            RAISE EXCEPTION 'scope option "new_keys_burst" needs a rate'
                USING ERRCODE = 'invalid_parameter_value',
                      DETAIL = CASE WHEN options ? 'new_keys_per_second'
                                    THEN pg_catalog.format('This call removes the rate of scope "%s" and sets a burst of %s.', scope, p_burst)
                                    ELSE pg_catalog.format('Scope "%s" has no "new_keys_per_second": a burst of %s would limit nothing.', scope, p_burst) END,
                      HINT = 'Pass "new_keys_per_second" with it, such as {"new_keys_per_second": 10, "new_keys_burst": 100}: the burst is how many new keys a tenant may create at once before the rate applies.';
        END IF;
    END IF;

    -- the upsert would fail with a bare 25006: say where to send the call
    IF pg_catalog.current_setting('transaction_read_only')::pg_catalog.bool THEN
        RAISE EXCEPTION 'cannot execute idem_configure_scope() in a read-only transaction'
            USING ERRCODE = 'read_only_sql_transaction',
                  DETAIL = CASE WHEN pg_catalog.pg_is_in_recovery()
                                THEN 'This server is a standby: this call writes the extension''s tables.'
                                ELSE 'This transaction is read-only: this call writes the extension''s tables.' END,
                  HINT = 'Send the call to the primary, in a read-write transaction; a standby answers replays of finished keys and lookups.';
    END IF;

    INSERT INTO idempotency.scopes AS s
           (scope, ttl, lock_timeout, cache_server_errors, stale_action, fingerprint_ignore,
            retryable_codes, new_keys_per_second, new_keys_burst, max_live_keys)
    VALUES (idem_configure_scope.scope, p_ttl, p_lock_timeout, p_cache, p_stale, p_ignore,
            p_retryable, p_rate, p_burst, p_max_live)
    ON CONFLICT ON CONSTRAINT scopes_pkey DO UPDATE SET
        ttl = CASE WHEN options ? 'ttl' THEN EXCLUDED.ttl ELSE s.ttl END,
        lock_timeout = CASE WHEN options ? 'lock_timeout' THEN EXCLUDED.lock_timeout ELSE s.lock_timeout END,
        cache_server_errors = CASE WHEN options ? 'cache_server_errors' THEN EXCLUDED.cache_server_errors ELSE s.cache_server_errors END,
        stale_action = CASE WHEN options ? 'stale_action' THEN EXCLUDED.stale_action ELSE s.stale_action END,
        fingerprint_ignore = CASE WHEN options ? 'fingerprint_ignore' THEN EXCLUDED.fingerprint_ignore ELSE s.fingerprint_ignore END,
        retryable_codes = CASE WHEN options ? 'retryable_codes' THEN EXCLUDED.retryable_codes ELSE s.retryable_codes END,
        new_keys_per_second = CASE WHEN options ? 'new_keys_per_second' THEN EXCLUDED.new_keys_per_second ELSE s.new_keys_per_second END,
        new_keys_burst = CASE WHEN options ? 'new_keys_burst' THEN EXCLUDED.new_keys_burst
                              WHEN options ? 'new_keys_per_second' AND EXCLUDED.new_keys_per_second IS NULL THEN NULL
                              ELSE s.new_keys_burst END,
        max_live_keys = CASE WHEN options ? 'max_live_keys' THEN EXCLUDED.max_live_keys ELSE s.max_live_keys END
    RETURNING s.* INTO result;
    RETURN result;
END
$$;

COMMENT ON FUNCTION @extschema@.idem_configure_scope(text, jsonb) IS
'set the policy of a scope: ttl, lock_timeout, cache_server_errors, stale_action, fingerprint_ignore, retryable_codes, new_keys_per_second, new_keys_burst, max_live_keys';

/* ---- guard.c: the coverage guard ---- */

/*
 * Trigger function for business tables: a write from a transaction that
 * holds no reservation in one of the scopes given as trigger arguments
 * (any scope without arguments) fails with SQLSTATE ID001.  It reads no
 * table and can only run as a trigger.  EXECUTE is checked when a trigger
 * is created, not when it fires: application and admin roles may attach
 * it, and every writer of a guarded table is held to it.
 */
CREATE FUNCTION @extschema@.idem_require_reservation()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_require_reservation'
LANGUAGE C;

COMMENT ON FUNCTION @extschema@.idem_require_reservation() IS
'coverage guard: refuse writes to the table from transactions holding no idempotency reservation in the scopes given as arguments';

/* Admin: let the rest of this transaction write without a reservation; logged. */
CREATE FUNCTION @extschema@.idem_guard_bypass(reason text)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_guard_bypass'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.idem_guard_bypass(text) IS
'let the rest of this transaction write to guarded tables without a reservation (logged with the reason)';

REVOKE ALL ON FUNCTION @extschema@.idem_require_reservation() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.idem_require_reservation()
    TO idempotency_app, idempotency_admin;
REVOKE ALL ON FUNCTION @extschema@.idem_guard_bypass(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.idem_guard_bypass(text) TO idempotency_admin;

/*
 * Every table of the database outside the system and the extensions, with
 * the enabled guards on it: the checklist's "every state-changing path
 * enforces the key".  scopes is empty when a guard accepts any scope.
 */
CREATE VIEW idempotency.guard_coverage AS
SELECT c.oid::pg_catalog.regclass AS table_name,
       COALESCE(g.mask OPERATOR(pg_catalog.<>) 0, false) AS guarded,
       CASE WHEN g.mask OPERATOR(pg_catalog.<>) 0 THEN
           ARRAY(SELECT e.event FROM (VALUES (4, 'INSERT'), (16, 'UPDATE'),
                                            (8, 'DELETE'), (32, 'TRUNCATE'))
                                     AS e(bit, event)
                  WHERE (g.mask OPERATOR(pg_catalog.&) e.bit) OPERATOR(pg_catalog.<>) 0)
       END AS events,
       g.scopes,
       g.triggers,
       g.conditional_triggers
  FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
  LEFT JOIN LATERAL (
       SELECT pg_catalog.array_agg(DISTINCT t.tgname ORDER BY t.tgname)
                FILTER (WHERE x.bits OPERATOR(pg_catalog.<>) 0) AS triggers,
              pg_catalog.bit_or(x.bits) AS mask,
              CASE WHEN pg_catalog.bool_or(t.tgnargs OPERATOR(pg_catalog.=) 0)
                          FILTER (WHERE x.bits OPERATOR(pg_catalog.<>) 0)
                   THEN '{}'::pg_catalog.text[]
                   ELSE (SELECT pg_catalog.array_agg(DISTINCT s ORDER BY s)
                           FROM pg_catalog.unnest(pg_catalog.array_agg(a.args)
                                  FILTER (WHERE x.bits OPERATOR(pg_catalog.<>) 0)) AS s)
              END AS scopes,
              pg_catalog.array_agg(DISTINCT t.tgname ORDER BY t.tgname)
                FILTER (WHERE x.conditional) AS conditional_triggers
         FROM pg_catalog.pg_trigger t
        -- what a guard covers whatever the row: nothing with a WHEN
        -- condition, and UPDATE only without a column list (UPDATE OF)
        CROSS JOIN LATERAL (
              SELECT CASE WHEN t.tgqual IS NOT NULL THEN 0
                          ELSE t.tgtype::pg_catalog.int4 OPERATOR(pg_catalog.&)
                               CASE WHEN t.tgattr OPERATOR(pg_catalog.=) ''::pg_catalog.int2vector
                                    THEN 60 ELSE 44 END
                     END AS bits,
                     t.tgqual IS NOT NULL
                     OR t.tgattr OPERATOR(pg_catalog.<>) ''::pg_catalog.int2vector AS conditional) AS x
        CROSS JOIN LATERAL (
              SELECT pg_catalog.convert_from(
                         pg_catalog.substring(t.tgargs,
                                              z.prev OPERATOR(pg_catalog.+) 2,
                                              z.pos OPERATOR(pg_catalog.-) z.prev OPERATOR(pg_catalog.-) 1),
                         pg_catalog.getdatabaseencoding()) AS args
                FROM (SELECT i AS pos,
                             pg_catalog.lag(i, 1, -1) OVER (ORDER BY i) AS prev
                        FROM pg_catalog.generate_series(0, pg_catalog.length(t.tgargs) OPERATOR(pg_catalog.-) 1) AS i
                       WHERE pg_catalog.get_byte(t.tgargs, i) OPERATOR(pg_catalog.=) 0) AS z
               UNION ALL
              SELECT NULL WHERE t.tgnargs OPERATOR(pg_catalog.=) 0) AS a
        WHERE t.tgrelid OPERATOR(pg_catalog.=) c.oid
          AND t.tgfoid OPERATOR(pg_catalog.=) '@extschema@.idem_require_reservation()'::pg_catalog.regprocedure
          AND t.tgenabled OPERATOR(pg_catalog.=) ANY ('{O,A}'::pg_catalog."char"[])
       HAVING pg_catalog.count(*) OPERATOR(pg_catalog.>) 0) AS g ON true
 WHERE c.relkind OPERATOR(pg_catalog.=) ANY ('{r,p,f}'::pg_catalog."char"[])
   AND n.nspname OPERATOR(pg_catalog.<>) ALL ('{pg_catalog,information_schema,pg_toast,idempotency}'::pg_catalog.name[])
   AND NOT pg_catalog.starts_with(n.nspname::pg_catalog.text, 'pg_temp_')
   AND NOT pg_catalog.starts_with(n.nspname::pg_catalog.text, 'pg_toast_temp_')
   AND NOT EXISTS (SELECT FROM pg_catalog.pg_depend d
                    WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
                      AND d.objid OPERATOR(pg_catalog.=) c.oid
                      AND d.deptype OPERATOR(pg_catalog.=) 'e');

COMMENT ON VIEW idempotency.guard_coverage IS
'every table of the database (outside system schemas and extensions) and the coverage guards that protect it';

REVOKE ALL ON idempotency.guard_coverage FROM PUBLIC;
GRANT SELECT ON idempotency.guard_coverage TO idempotency_admin, pg_monitor;

/* ---- execute.c: a whole request in one statement ---- */

/* What a request handler returns: the response to store and replay. */
CREATE TYPE idempotency.response AS (
    status  int,
    body    jsonb,
    headers jsonb
);

/*
 * Reserve, call the handler (tenant text, key text, request jsonb) RETURNS
 * idempotency.response when the key is new, store its response, answer.
 * SECURITY INVOKER and no search_path of its own: the handler runs as the
 * caller, with the caller's search_path; the key functions it calls run
 * as their owner with search_path pinned (idem_owner_enter).
 */
CREATE FUNCTION @extschema@.idem_execute(tenant text, scope text, key text, request jsonb,
                             handler regproc,
                             ttl interval DEFAULT NULL,
                             wait interval DEFAULT '0')
RETURNS idempotency.reservation
AS 'MODULE_PATHNAME', 'idem_execute'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.idem_execute(text, text, text, jsonb, regproc, interval, interval) IS
'one idempotent request in one statement: reserve, call the handler when the key is new, store and return its response';

REVOKE ALL ON FUNCTION @extschema@.idem_execute(text, text, text, jsonb, regproc, interval, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.idem_execute(text, text, text, jsonb, regproc, interval, interval)
    TO idempotency_app;

/*
 * Every backend caches the binding of its roles; a change to the table
 * sends a relcache invalidation for it, so that a binding takes effect in
 * sessions already open (pooled connections) at their next call.
 */
CREATE FUNCTION idempotency.tenant_bindings_changed()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_scopes_changed'
LANGUAGE C;

REVOKE EXECUTE ON FUNCTION idempotency.tenant_bindings_changed() FROM PUBLIC;

CREATE TRIGGER tenant_bindings_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON idempotency.tenant_bindings
    FOR EACH STATEMENT EXECUTE FUNCTION idempotency.tenant_bindings_changed();

/*
 * Under logical replication (README, "Logical replication") the apply
 * worker runs with session_replication_role = replica and fires no
 * statement trigger for a replicated row: this row trigger, enabled for
 * replica only, sends the same invalidation there; the statement trigger
 * fires always, for a replicated TRUNCATE and the initial copy.
 */
CREATE TRIGGER tenant_bindings_replicated
    AFTER INSERT OR UPDATE OR DELETE ON idempotency.tenant_bindings
    FOR EACH ROW EXECUTE FUNCTION idempotency.tenant_bindings_changed();
ALTER TABLE idempotency.tenant_bindings
    ENABLE REPLICA TRIGGER tenant_bindings_replicated,
    ENABLE ALWAYS TRIGGER tenant_bindings_changed;
/* ---- Outbox: lease extension, batch acknowledgement, deduplicated enqueue,
 * ordered delivery ---- */

CREATE FUNCTION @extschema@.outbox_extend(tenant text, id bigint, lease_token uuid,
                              lease interval DEFAULT '30 seconds')
    RETURNS timestamptz
    AS 'MODULE_PATHNAME', 'idem_outbox_extend'
    LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.outbox_extend(text, bigint, uuid, interval) IS
    'heartbeat: extend the lease of a row still leased under lease_token to now + lease';

REVOKE ALL ON FUNCTION @extschema@.outbox_extend(text, bigint, uuid, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.outbox_extend(text, bigint, uuid, interval)
    TO idempotency_worker;

CREATE FUNCTION @extschema@.outbox_discard(tenant text, id bigint)
    RETURNS void
    AS 'MODULE_PATHNAME', 'idem_outbox_discard'
    LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.outbox_discard(text, bigint) IS
    'delete a dead letter that will not be delivered; the next row of its ordering key becomes its head (operators only)';

REVOKE ALL ON FUNCTION @extschema@.outbox_discard(text, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.outbox_discard(text, bigint) TO idempotency_admin;

CREATE FUNCTION @extschema@.outbox_ack_many(tenant text, ids bigint[], lease_tokens uuid[],
                                provider_refs text[] DEFAULT NULL)
    RETURNS SETOF bigint
    AS 'MODULE_PATHNAME', 'idem_outbox_ack_many'
    LANGUAGE C VOLATILE ROWS 100;

COMMENT ON FUNCTION @extschema@.outbox_ack_many(text, bigint[], uuid[], text[]) IS
    'outbox_ack for many rows in one statement; returns the ids acknowledged';

CREATE FUNCTION @extschema@.outbox_nack_many(tenant text, ids bigint[], lease_tokens uuid[],
                                 error text, retry_in interval DEFAULT NULL)
    RETURNS TABLE (id bigint, status idempotency.outbox_status)
    AS 'MODULE_PATHNAME', 'idem_outbox_nack_many'
    LANGUAGE C VOLATILE ROWS 100;

COMMENT ON FUNCTION @extschema@.outbox_nack_many(text, bigint[], uuid[], text, interval) IS
    'outbox_nack for many rows in one statement; returns each row reported and its new status';

REVOKE ALL ON FUNCTION @extschema@.outbox_ack_many(text, bigint[], uuid[], text[]),
    @extschema@.outbox_nack_many(text, bigint[], uuid[], text, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.outbox_ack_many(text, bigint[], uuid[], text[]),
    @extschema@.outbox_nack_many(text, bigint[], uuid[], text, interval) TO idempotency_worker;

/*
 * The lease token each claim writes, drawn from a pool of strong random
 * bytes (outbox.c).  Only the outbox's own functions call it.
 */
CREATE FUNCTION idempotency.new_lease_token()
    RETURNS uuid
    AS 'MODULE_PATHNAME', 'idem_new_lease_token'
    LANGUAGE C VOLATILE;

COMMENT ON FUNCTION idempotency.new_lease_token() IS
    'a fresh random lease token (version 4 UUID) for outbox_claim';

REVOKE ALL ON FUNCTION idempotency.new_lease_token() FROM PUBLIC;

/*
 * The claim's ordering condition for a row with an ordering key: true when
 * no earlier row of its tenant and key is pending, leased or dead, probed
 * through outbox_ordering_idx (outbox.c).  Only the outbox's own claims
 * call it.  Its cost is one index probe: priced so, a claim of one topic
 * keeps to outbox_topic_claim_idx when other topics have a backlog, rather
 * than filtering their due rows out of outbox_claim_idx.
 */
CREATE FUNCTION idempotency.outbox_ordering_head(outbox oid, tenant text,
                                                 ordering_key text, id bigint)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'idem_outbox_ordering_head'
    LANGUAGE C STABLE STRICT COST 1000;

COMMENT ON FUNCTION idempotency.outbox_ordering_head(oid, text, text, bigint) IS
    'whether an outbox row is the first undelivered row of its ordering key, for outbox_claim';

REVOKE ALL ON FUNCTION idempotency.outbox_ordering_head(oid, text, text, bigint) FROM PUBLIC;

/*
 * outbox_enqueue takes a dedup_key and an ordering_key: new columns go at
 * the end of the table, in the order of a fresh install, and the function
 * is replaced (one signature, so an untyped call matches exactly one).
 */
ALTER TABLE idempotency.outbox ADD COLUMN dedup_key text COLLATE pg_catalog."C";
ALTER TABLE idempotency.outbox ADD COLUMN ordering_key text COLLATE pg_catalog."C";

CREATE UNIQUE INDEX outbox_dedup_idx ON idempotency.outbox (tenant_id, topic, dedup_key)
    WHERE dedup_key IS NOT NULL;

/*
 * Ordered delivery: the rows of a tenant and ordering key not yet
 * finished, by a 64-bit hash of the two, then id (integers are cheaper to
 * compare than the two strings; outbox.c computes the same hash, and
 * passes over rows of another key that share it).  The claim asks it
 * whether a row has an unfinished predecessor; outbox.c repeats this
 * status list (as "= ANY" of the same statuses, which the planner proves
 * equal).
 */
CREATE INDEX outbox_ordering_idx ON idempotency.outbox
    ((pg_catalog.hashtextextended(ordering_key,
                                  pg_catalog.hashtextextended(tenant_id, 0::pg_catalog.int8))),
     id)
    WHERE status IN ('pending', 'leased', 'dead') AND ordering_key IS NOT NULL;

/*
 * Delivered rows kept for idempotency.outbox_retention, by the time they
 * were delivered: the purge (idem_purge_outbox, idem_maintain) deletes the
 * oldest through it, so a run reads what it deletes instead of the whole
 * table (which holds every row delivered within the retention, millions
 * on a busy outbox).  Only a done-marking ack enters it.
 */
CREATE INDEX outbox_done_idx ON idempotency.outbox (done_at)
    WHERE status = 'done';

/*
 * The claim path: pending rows only (1.0 also kept the leased rows here,
 * so that every lease wrote an entry into each claim index).  Leased rows
 * by the end of their lease are in outbox_lease_idx, where the claim takes
 * expired leases first and idem_reclaim_leases finds them without reading
 * the pending backlog (only a leased row has a lease_until; the predicate
 * names it, not the status, so that the statements that find a row by key
 * and status are not planned over this index).
 */
DROP INDEX idempotency.outbox_claim_idx;
CREATE INDEX outbox_claim_idx ON idempotency.outbox (available_at)
    WHERE status = 'pending';

CREATE INDEX outbox_lease_idx ON idempotency.outbox (lease_until)
    WHERE lease_until IS NOT NULL;

/*
 * The claim path of a worker that asks for one topic: that topic's pending
 * rows, oldest first, without reading the due rows of the others, so that
 * a backlog of one topic (its workers stopped) does not slow down the
 * workers of the rest.  Same predicate as outbox_claim_idx; outbox.c
 * names the topic as an equality for the planner to use it.
 */
CREATE INDEX outbox_topic_claim_idx ON idempotency.outbox (topic, available_at)
    WHERE status = 'pending';

/*
 * The claim path of a worker that claims for one tenant (a claim naming
 * it, or any claim by a role bound to it): that tenant's pending rows, oldest
 * first, without reading the due rows of the others, so that one tenant's
 * backlog does not slow down the workers of the rest.  Same predicate as
 * outbox_claim_idx; outbox.c names the tenant as an equality.
 */
CREATE INDEX outbox_tenant_claim_idx ON idempotency.outbox (tenant_id, available_at)
    WHERE status = 'pending';

DROP FUNCTION @extschema@.outbox_enqueue(text, text, jsonb, text, text, jsonb, interval, int);

CREATE FUNCTION @extschema@.outbox_enqueue(tenant text, topic text, payload jsonb,
                               key text DEFAULT NULL,
                               scope text DEFAULT NULL,
                               headers jsonb DEFAULT NULL,
                               deliver_after interval DEFAULT '0',
                               max_attempts int DEFAULT NULL,
                               dedup_key text DEFAULT NULL,
                               ordering_key text DEFAULT NULL)
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'idem_outbox_enqueue'
    LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.outbox_enqueue(text, text, jsonb, text, text, jsonb, interval, int, text, text) IS
    'queue a side effect in the current transaction; NOTIFY idempotency_outbox on commit';

REVOKE ALL ON FUNCTION @extschema@.outbox_enqueue(text, text, jsonb, text, text, jsonb, interval, int, text, text)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.outbox_enqueue(text, text, jsonb, text, text, jsonb, interval, int, text, text)
    TO idempotency_app;

/* ---- stats: a counter of rate_limited answers ---- */

/*
 * idem_stats gains a last column; the view over it is rebuilt with it.
 * The library reads the number of columns a database declares, so a
 * database still at 1.0 keeps working until it is updated.
 */
DROP VIEW idempotency.stats;
DROP FUNCTION @extschema@.idem_stats();
CREATE FUNCTION @extschema@.idem_stats(
    OUT tenant      text,
    OUT scope       text,
    OUT created     bigint,
    OUT replayed    bigint,
    OUT in_progress bigint,
    OUT mismatched  bigint,
    OUT stale       bigint,
    OUT completed   bigint,
    OUT released    bigint,
    OUT reaped      bigint,
    OUT swept       bigint,
    OUT rate_limited bigint)
    RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'idem_stats'
    LANGUAGE C VOLATILE STRICT;
COMMENT ON FUNCTION @extschema@.idem_stats() IS
    'cumulative idempotency counters per tenant and scope';
CREATE VIEW idempotency.stats AS
    SELECT * FROM @extschema@.idem_stats();
COMMENT ON VIEW idempotency.stats IS
    'cumulative idempotency counters per tenant and scope (needs shared_preload_libraries)';
REVOKE ALL ON FUNCTION @extschema@.idem_stats() FROM PUBLIC;
REVOKE ALL ON idempotency.stats FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.idem_stats() TO pg_monitor, idempotency_admin;
GRANT SELECT ON idempotency.stats TO pg_monitor, idempotency_admin;

/* ---- Outbox: the C symbols carry the idem_ prefix ---- */

/*
 * The outbox functions of 1.0 that this update does not recreate above,
 * pointed at the renamed symbols (the library keeps 1.0's names only for
 * databases not updated yet).  Signatures, defaults and options as
 * created (except that they become SECURITY INVOKER without a SET clause,
 * as said at the top); owner, privileges and
 * comments stay.
 */
CREATE OR REPLACE FUNCTION @extschema@.outbox_claim(worker text, batch int DEFAULT 10,
                             lease interval DEFAULT '30 seconds',
                             topics text[] DEFAULT NULL,
                             tenant text DEFAULT NULL)
    RETURNS SETOF idempotency.outbox
    AS 'MODULE_PATHNAME', 'idem_outbox_claim'
    LANGUAGE C VOLATILE ROWS 10;

CREATE OR REPLACE FUNCTION @extschema@.outbox_ack(tenant text, id bigint, lease_token uuid,
                           provider_ref text DEFAULT NULL)
    RETURNS void
    AS 'MODULE_PATHNAME', 'idem_outbox_ack'
    LANGUAGE C VOLATILE;

CREATE OR REPLACE FUNCTION @extschema@.outbox_nack(tenant text, id bigint, lease_token uuid,
                            error text, retry_in interval DEFAULT NULL)
    RETURNS idempotency.outbox_status
    AS 'MODULE_PATHNAME', 'idem_outbox_nack'
    LANGUAGE C VOLATILE;

CREATE OR REPLACE FUNCTION @extschema@.outbox_requeue(tenant text, id bigint)
    RETURNS void
    AS 'MODULE_PATHNAME', 'idem_outbox_requeue'
    LANGUAGE C VOLATILE;

/* ---- maintenance at scale: the sweeper reads one slice of the table per run ---- */

/*
 * Where the scheduled sweep (idem_sweep() without older_than, as
 * idem_maintain calls it) continues, and how many pages of the keys table
 * one run may read.  The sweeper has no index to go by (an index naming
 * status would make every completion a non-HOT update), so each run reads
 * one slice of the table by TID range and the next run carries on from
 * next_page: a run costs at most pages_per_run pages however large the table
 * grows, and the runs go round the whole table.  One row.
 */
CREATE TABLE idempotency.sweep_state (
    one_row       bool PRIMARY KEY DEFAULT true,
    next_page     bigint NOT NULL DEFAULT 0,
    pages_per_run int NOT NULL DEFAULT 16384,
    CONSTRAINT sweep_state_one_row CHECK (one_row),
    CONSTRAINT sweep_state_pages_positive CHECK (pages_per_run > 0)
);
INSERT INTO idempotency.sweep_state DEFAULT VALUES;
REVOKE ALL ON idempotency.sweep_state FROM PUBLIC;
GRANT SELECT, UPDATE (pages_per_run) ON idempotency.sweep_state TO idempotency_admin;

/*
 * A dump keeps the row (the budget an operator set): restoring it runs
 * CREATE EXTENSION, which makes the default row, and then loads the dumped
 * one, which this trigger merges into the row already there instead of
 * failing on the primary key.
 */
CREATE FUNCTION idempotency.sweep_state_merge()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE idempotency.sweep_state AS s
       SET next_page = NEW.next_page, pages_per_run = NEW.pages_per_run
     WHERE s.one_row;
    IF FOUND THEN
        RETURN NULL;
    END IF;
    RETURN NEW;
END
$$;

REVOKE EXECUTE ON FUNCTION idempotency.sweep_state_merge() FROM PUBLIC;

CREATE TRIGGER sweep_state_merge
    BEFORE INSERT ON idempotency.sweep_state
    FOR EACH ROW EXECUTE FUNCTION idempotency.sweep_state_merge();
-- always: also for the row the initial copy of a logical replication
-- subscription inserts, into a table that already has its row
ALTER TABLE idempotency.sweep_state ENABLE ALWAYS TRIGGER sweep_state_merge;

SELECT pg_catalog.pg_extension_config_dump('idempotency.sweep_state', '');

/* ---- Running on Citus: idem_citus_distribute ---- */

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
CREATE FUNCTION @extschema@.idem_citus_distribute(shard_count int DEFAULT NULL)
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

COMMENT ON FUNCTION @extschema@.idem_citus_distribute(int) IS
'on a Citus coordinator: distribute keys and outbox by tenant (colocated), make scopes and tenant_bindings reference tables, delegate the per-tenant functions';

REVOKE ALL ON FUNCTION @extschema@.idem_citus_distribute(int) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.idem_citus_distribute(int) TO idempotency_admin;

-- The grants collected at the start, made again on the objects of 1.1.
DO $$
DECLARE
    stmt pg_catalog.text;
BEGIN
    FOREACH stmt IN ARRAY pg_catalog.string_to_array(
            pg_catalog.current_setting('idempotency_update.grants'), E'\n') LOOP
        CONTINUE WHEN stmt OPERATOR(pg_catalog.=) '';
        BEGIN
            EXECUTE stmt;
        EXCEPTION WHEN undefined_column THEN
            RAISE WARNING 'idempotency: a grant of 1.0 names a column 1.1 does not have: %', stmt
                USING HINT = 'Grant what the role needs on the 1.1 view.';
        END;
    END LOOP;
END
$$;

-- Grants an administrator made on 1.0's objects before the update (such as
-- GRANT EXECUTE ON FUNCTION idem_reap(int) TO ops) belong to the database,
-- not to the extension.  But when an extension script changes an object's
-- privileges, PostgreSQL records the object's whole ACL as the extension's
-- initial privileges, and pg_dump leaves initial privileges out: after a
-- restore the operator could no longer run maintenance.  Keep in the
-- initial privileges only what the extension itself grants, as a fresh
-- install records them: entries of the owner, PUBLIC, its three roles and
-- pg_monitor, less the privileges the administrator had added to them
-- (collected at the start of the update: a SELECT on idempotency.scopes
-- granted to pg_monitor is the database's, and pg_dump keeps it).  An
-- entry that held both the extension's privileges and added ones is
-- written again with the extension's only.
WITH added AS (
    SELECT f[1]::pg_catalog.oid AS classoid, f[2]::pg_catalog.oid AS objoid,
           f[3]::pg_catalog.int4 AS objsubid, f[4]::pg_catalog.oid AS grantee,
           f[5]::pg_catalog.oid AS grantor,
           pg_catalog.replace(f[6], '_', ' ') AS privilege_type,
           f[7]::pg_catalog.bool AS is_grantable
      FROM pg_catalog.unnest(pg_catalog.string_to_array(
               pg_catalog.current_setting('idempotency_update.added_privs'), E'\n')) AS l(line)
     CROSS JOIN LATERAL pg_catalog.string_to_array(l.line, ' ') AS f
     WHERE l.line OPERATOR(pg_catalog.<>) '')
UPDATE pg_catalog.pg_init_privs ip
   SET initprivs = COALESCE(
         (SELECT pg_catalog.array_agg(k.item ORDER BY k.n)
            FROM (SELECT u.n,
                         CASE WHEN NOT EXISTS (
                                     SELECT FROM pg_catalog.aclexplode(ARRAY[u.item]) x
                                       JOIN added a
                                         ON a.classoid OPERATOR(pg_catalog.=) ip.classoid
                                        AND a.objoid OPERATOR(pg_catalog.=) ip.objoid
                                        AND a.objsubid OPERATOR(pg_catalog.=) ip.objsubid
                                        AND a.grantee OPERATOR(pg_catalog.=) x.grantee
                                        AND a.grantor OPERATOR(pg_catalog.=) x.grantor
                                        AND a.privilege_type OPERATOR(pg_catalog.=) x.privilege_type
                                        AND a.is_grantable OPERATOR(pg_catalog.=) x.is_grantable)
                              THEN u.item
                              ELSE (SELECT pg_catalog.format('%s=%s/%s',
                                             (SELECT '"' OPERATOR(pg_catalog.||)
                                                     pg_catalog.replace(r.rolname, '"', '""')
                                                     OPERATOR(pg_catalog.||) '"'
                                                FROM pg_catalog.pg_roles r
                                               WHERE r.oid OPERATOR(pg_catalog.=) pg_catalog.min(x.grantee)),
                                             pg_catalog.string_agg(
                                               CASE x.privilege_type
                                                 WHEN 'INSERT' THEN 'a' WHEN 'SELECT' THEN 'r'
                                                 WHEN 'UPDATE' THEN 'w' WHEN 'DELETE' THEN 'd'
                                                 WHEN 'TRUNCATE' THEN 'D' WHEN 'REFERENCES' THEN 'x'
                                                 WHEN 'TRIGGER' THEN 't' WHEN 'EXECUTE' THEN 'X'
                                                 WHEN 'USAGE' THEN 'U' WHEN 'CREATE' THEN 'C'
                                                 WHEN 'TEMPORARY' THEN 'T' WHEN 'CONNECT' THEN 'c'
                                                 WHEN 'SET' THEN 's' WHEN 'ALTER SYSTEM' THEN 'A'
                                                 WHEN 'MAINTAIN' THEN 'm' END
                                               OPERATOR(pg_catalog.||)
                                               CASE WHEN x.is_grantable THEN '*' ELSE '' END, ''),
                                             (SELECT '"' OPERATOR(pg_catalog.||)
                                                     pg_catalog.replace(r.rolname, '"', '""')
                                                     OPERATOR(pg_catalog.||) '"'
                                                FROM pg_catalog.pg_roles r
                                               WHERE r.oid OPERATOR(pg_catalog.=) pg_catalog.min(x.grantor)))::pg_catalog.aclitem
                                      FROM pg_catalog.aclexplode(ARRAY[u.item]) x
                                     WHERE NOT EXISTS (
                                             SELECT FROM added a
                                              WHERE a.classoid OPERATOR(pg_catalog.=) ip.classoid
                                                AND a.objoid OPERATOR(pg_catalog.=) ip.objoid
                                                AND a.objsubid OPERATOR(pg_catalog.=) ip.objsubid
                                                AND a.grantee OPERATOR(pg_catalog.=) x.grantee
                                                AND a.grantor OPERATOR(pg_catalog.=) x.grantor
                                                AND a.privilege_type OPERATOR(pg_catalog.=) x.privilege_type
                                                AND a.is_grantable OPERATOR(pg_catalog.=) x.is_grantable)
                                    HAVING pg_catalog.count(*) OPERATOR(pg_catalog.>) 0)
                         END AS item
                    FROM pg_catalog.unnest(ip.initprivs) WITH ORDINALITY AS u(item, n)
                   WHERE (SELECT x.grantee OPERATOR(pg_catalog.=) x.grantor
                                 OR x.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid
                                 OR x.grantee OPERATOR(pg_catalog.=) ANY (
                                      SELECT r.oid FROM pg_catalog.pg_roles r
                                       WHERE r.rolname OPERATOR(pg_catalog.=) ANY (
                                               ARRAY['idempotency_app', 'idempotency_worker',
                                                     'idempotency_admin', 'pg_monitor']::pg_catalog.name[]))
                            FROM pg_catalog.aclexplode(ARRAY[u.item]) x
                           LIMIT 1)) k
           WHERE k.item IS NOT NULL),
         '{}'::pg_catalog.aclitem[])
 WHERE ip.privtype OPERATOR(pg_catalog.=) 'e'
   AND EXISTS (SELECT FROM pg_catalog.pg_depend d
                 JOIN pg_catalog.pg_extension e
                   ON e.oid OPERATOR(pg_catalog.=) d.refobjid
                WHERE d.classid OPERATOR(pg_catalog.=) ip.classoid
                  AND d.objid OPERATOR(pg_catalog.=) ip.objoid
                  AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
                  AND d.deptype OPERATOR(pg_catalog.=) 'e'
                  AND e.extname OPERATOR(pg_catalog.=) 'idempotency');
-- a column grant carried over leaves an empty entry of its own: a fresh
-- install has none
DELETE FROM pg_catalog.pg_init_privs ip
 WHERE ip.privtype OPERATOR(pg_catalog.=) 'e'
   AND ip.objsubid OPERATOR(pg_catalog.<>) 0
   AND pg_catalog.cardinality(ip.initprivs) OPERATOR(pg_catalog.=) 0
   AND EXISTS (SELECT FROM pg_catalog.pg_depend d
                 JOIN pg_catalog.pg_extension e
                   ON e.oid OPERATOR(pg_catalog.=) d.refobjid
                WHERE d.classid OPERATOR(pg_catalog.=) ip.classoid
                  AND d.objid OPERATOR(pg_catalog.=) ip.objoid
                  AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
                  AND d.deptype OPERATOR(pg_catalog.=) 'e'
                  AND e.extname OPERATOR(pg_catalog.=) 'idempotency');

/*
 * A maintenance job version 1.0 scheduled calls its procedure through the
 * schema the functions were installed in, such as public, which the
 * database owner may own: run as the job's superuser, it would call
 * whatever that owner put in its place.  The job calls
 * idempotency.maintain from now on (same arguments, same schedule), where
 * pg_cron is in this database; elsewhere the statement to run in pg_cron's
 * database is given.
 */
DO $idem_job$
DECLARE
    j record;
    crondb pg_catalog.text := pg_catalog.current_setting('cron.database_name', true);
    old_call CONSTANT pg_catalog.text := '^CALL .*[.]idem_maintain[(]';
BEGIN
    IF pg_catalog.to_regclass('cron.job') IS NOT NULL THEN
        FOR j IN SELECT c.jobid, c.command FROM cron.job c
                  WHERE c.database OPERATOR(pg_catalog.=) pg_catalog.current_database()
                    AND c.command OPERATOR(pg_catalog.~) old_call
        LOOP
            PERFORM cron.alter_job(j.jobid,
                                   command => pg_catalog.regexp_replace(j.command, old_call,
                                                                        'CALL idempotency.maintain('));
        END LOOP;
    ELSIF crondb IS NOT NULL AND crondb OPERATOR(pg_catalog.<>) pg_catalog.current_database() THEN
        RAISE WARNING 'a maintenance job version 1.0 scheduled for database "%" must be changed in database "%"',
                      pg_catalog.current_database(), crondb
            USING DETAIL = 'Its command calls idem_maintain through a schema the database owner may control, as a superuser.',
                  HINT = 'If there is one, connect to database ' OPERATOR(pg_catalog.||)
                         pg_catalog.quote_ident(crondb) OPERATOR(pg_catalog.||)
                         ' as a superuser and run: SELECT cron.alter_job(jobid, command => regexp_replace(command, '
                         OPERATOR(pg_catalog.||) pg_catalog.quote_literal(old_call)
                         OPERATOR(pg_catalog.||) ', ''CALL idempotency.maintain('')) FROM cron.job WHERE database = '
                         OPERATOR(pg_catalog.||) pg_catalog.quote_literal(pg_catalog.current_database())
                         OPERATOR(pg_catalog.||) ' AND command ~ '
                         OPERATOR(pg_catalog.||) pg_catalog.quote_literal(old_call) OPERATOR(pg_catalog.||) ';';
    END IF;
END
$idem_job$;
