-- Least privilege: who may call what.  Every function of the extension
-- under a plain role, an application role (idempotency_app), a worker
-- (idempotency_worker), an operator (idempotency_admin) and a role bound to
-- one tenant.
CREATE ROLE sec_plain;
CREATE ROLE sec_app IN ROLE idempotency_app;
CREATE ROLE sec_worker IN ROLE idempotency_worker;
CREATE ROLE sec_admin IN ROLE idempotency_admin;
CREATE ROLE sec_bound IN ROLE idempotency_app, idempotency_worker;
CREATE ROLE sec_other IN ROLE idempotency_app;

-- the grants, from the catalog: only the pure functions are PUBLIC's
SELECT p.oid::regprocedure AS routine,
       has_function_privilege('sec_plain', p.oid, 'EXECUTE') AS plain,
       has_function_privilege('sec_app', p.oid, 'EXECUTE') AS app,
       has_function_privilege('sec_worker', p.oid, 'EXECUTE') AS worker,
       has_function_privilege('sec_admin', p.oid, 'EXECUTE') AS admin
  FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.classid = 'pg_proc'::regclass
  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency'
 WHERE d.deptype = 'e'
 ORDER BY p.oid::regprocedure::text COLLATE "C";
SELECT c.oid::regclass AS relation,
       has_table_privilege('sec_plain', c.oid, 'SELECT') AS plain,
       has_table_privilege('sec_app', c.oid, 'SELECT') AS app,
       has_table_privilege('sec_worker', c.oid, 'SELECT') AS worker,
       has_table_privilege('sec_admin', c.oid, 'SELECT') AS admin,
       has_table_privilege('pg_monitor', c.oid, 'SELECT') AS monitor
  FROM pg_class c WHERE c.relnamespace = 'idempotency'::regnamespace
   AND c.relkind IN ('r', 'v')
 ORDER BY c.oid::regclass::text COLLATE "C";
SELECT r AS role, has_schema_privilege(r, 'idempotency', 'USAGE') AS schema_usage
  FROM unnest(ARRAY['sec_plain', 'sec_app', 'sec_worker', 'sec_admin', 'pg_monitor']) AS r;

-- the calls themselves: 'ok' or the SQLSTATE; whatever a call did is undone
CREATE FUNCTION pg_temp.try_as(r text, stmt text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('role', r, true);
    EXECUTE stmt;
    RAISE EXCEPTION 'ok: undo';
EXCEPTION WHEN OTHERS THEN
    RETURN CASE WHEN SQLERRM = 'ok: undo' THEN 'ok' ELSE SQLSTATE END;
END
$$;
-- a two-phase reservation and an outbox row to act on
SELECT lock_token AS tok FROM idem_reserve('sec_t', 'orders', 'held', '{}') \gset
SELECT outbox_enqueue('sec_t', 'topic', '{}') AS row_id \gset
-- (:tok and :row_id in a call stand for the reservation's token and the row)
SELECT call, string_agg(r || '=' || pg_temp.try_as(r,
           replace(replace(call, ':tok', quote_literal(:'tok')), ':row_id', :'row_id')),
           ' ' ORDER BY n) AS results
  FROM unnest(ARRAY['sec_plain', 'sec_app', 'sec_worker', 'sec_admin']) WITH ORDINALITY AS roles(r, n),
       (VALUES ($$SELECT idem_reserve('sec_t', 'orders', 'new', '{}')$$),
               ($$SELECT idem_complete('sec_t', 'orders', 'held', 200, '{}', lock_token => :tok)$$),
               ($$SELECT idem_checkpoint('sec_t', 'orders', 'held', 'p', :tok)$$),
               ($$SELECT idem_release('sec_t', 'orders', 'held', :tok)$$),
               ($$SELECT * FROM idem_lookup('sec_t', 'orders', 'held')$$),
               ($$SELECT outbox_enqueue('sec_t', 'topic', '{}')$$),
               ($$SELECT * FROM outbox_claim('w', 1)$$),
               ($$SELECT outbox_ack('sec_t', :row_id, gen_random_uuid())$$),
               ($$SELECT outbox_nack('sec_t', :row_id, gen_random_uuid(), 'e')$$),
               ($$SELECT outbox_requeue('sec_t', :row_id)$$),
               ($$SELECT outbox_discard('sec_t', :row_id)$$),
               ($$SELECT outbox_extend('sec_t', :row_id, gen_random_uuid())$$),
               ($$SELECT * FROM outbox_ack_many('sec_t', ARRAY[:row_id]::bigint[], ARRAY[gen_random_uuid()])$$),
               ($$SELECT * FROM outbox_nack_many('sec_t', ARRAY[:row_id]::bigint[], ARRAY[gen_random_uuid()], 'e')$$),
               ($$SELECT idem_resolve('sec_t', 'orders', 'held', 200, '{}')$$),
               ($$SELECT idem_configure_scope('sec_scope', '{"ttl": 60}')$$),
               ($$SELECT idem_reap()$$),
               ($$SELECT idem_sweep()$$),
               ($$SELECT idem_reclaim_leases()$$),
               ($$SELECT idem_purge_outbox()$$),
               ($$SELECT idem_bind_tenant('sec_other', 'x')$$),
               ($$SELECT idem_unbind_tenant('sec_other')$$),
               ($$SELECT idem_stats_reset()$$),
               ($$SELECT count(*) FROM idempotency.stats$$),
               ($$SELECT count(*) FROM idempotency.health$$),
               ($$SELECT count(*) FROM idempotency.dead_letters$$),
               ($$SELECT count(*) FROM idempotency.keys$$),
               ($$SELECT idem_canonical('{"b": 1, "a": 2}')$$),
               ($$SELECT idem_fingerprint('{}')$$)) AS calls(call)
 GROUP BY call ORDER BY call;
-- (idem_maintain is a procedure that commits: see stats_health for the
-- CALL as an operator and as a plain role)

-- idem_lookup never returns a lock token
SELECT count(*) AS lookup_columns_named_lock_token
  FROM pg_proc p, unnest(p.proargnames) AS a
 WHERE p.oid = 'idem_lookup(text, text, text)'::regprocedure AND a = 'lock_token';
SET ROLE sec_app;
SELECT tenant_id, scope, idem_key, status, response_code
  FROM idem_lookup('sec_t', 'orders', 'held');
-- fencing: the reservation committed, so another transaction needs its token
SELECT idem_complete('sec_t', 'orders', 'held', 200, '{"forged": true}');
SELECT idem_checkpoint('sec_t', 'orders', 'held', 'p');
SELECT idem_release('sec_t', 'orders', 'held');
-- ...nor can it make the reservation stale by lowering the lock timeout it
-- is judged by (a takeover would run the request twice)
SET idempotency.default_lock_timeout = '1s';
RESET ROLE;
SELECT status, response_body, recovery_point FROM idempotency.keys
 WHERE tenant_id = 'sec_t' AND idem_key = 'held';

-- a role bound to a tenant acts for that tenant only, whatever it SETs
-- a tenant no function would accept is refused (22001), before anything is written
SELECT pg_temp.try_as('sec_admin', format('SELECT idem_bind_tenant(%L, %L)', 'sec_bound', repeat('t', 256)));
SELECT count(*) AS bindings FROM idempotency.tenant_bindings WHERE role = 'sec_bound'::regrole;
SELECT idem_bind_tenant('sec_bound', 'acme');
SELECT role, tenant FROM idempotency.tenant_bindings ORDER BY role::text COLLATE "C";
SELECT outbox_enqueue('sec_t', 'topic', '{"tenant": "sec_t"}') IS NOT NULL AS other_row;
SELECT outbox_enqueue('acme', 'topic', '{"tenant": "acme"}') IS NOT NULL AS acme_row;
SET ROLE sec_bound;
SELECT outcome FROM idem_reserve('acme', 'orders', 'b-1', '{}');
SELECT outcome FROM idem_reserve('sec_t', 'orders', 'b-1', '{}');
SET idempotency.tenant = 'sec_t';
SELECT outcome FROM idem_reserve('sec_t', 'orders', 'b-1', '{}');
RESET idempotency.tenant;
SELECT * FROM idem_lookup('sec_t', 'orders', 'held');
SELECT idem_complete('sec_t', 'orders', 'held', 200, '{}', lock_token => :'tok');
SELECT outbox_enqueue('sec_t', 'topic', '{}');
-- a claim naming no tenant takes only the bound tenant's rows
-- ...and, with idempotency.tenant naming another tenant, none: a claim that
-- leased the bound tenant's rows could not ack them in this session
SET idempotency.tenant = 'sec_t';
SELECT * FROM outbox_claim('bound-worker', 10, topics => '{topic}');
RESET idempotency.tenant;
SELECT tenant_id, payload FROM outbox_claim('bound-worker', 10, topics => '{topic}');
SELECT * FROM outbox_claim('bound-worker', 10, tenant => 'sec_t');
SELECT outbox_ack('sec_t', :row_id, gen_random_uuid());
RESET ROLE;
-- granted pg_monitor, a bound role reads the statistics of its tenant only
GRANT pg_monitor TO sec_bound;
SELECT outcome FROM idem_reserve('globex', 'orders', 'stats-1', '{}');
SELECT DISTINCT tenant FROM idempotency.stats ORDER BY 1;
SET ROLE sec_bound;
SELECT DISTINCT tenant FROM idempotency.stats ORDER BY 1;
RESET ROLE;
-- code a bound role owns runs with its rights, and so with its binding,
-- whoever runs it: a SECURITY DEFINER function of sec_bound called by an
-- unbound role, and an index function of sec_bound's table run by ANALYZE
-- (which runs it as the table's owner)
CREATE SCHEMA sec_code AUTHORIZATION sec_bound;
SET ROLE sec_bound;
CREATE FUNCTION sec_code.reserve(t text) RETURNS text
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_catalog
AS $$ SELECT outcome::text FROM idem_reserve(t, 'orders', 'code-1', '{}') $$;
CREATE FUNCTION sec_code.lookup(t text) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_catalog
AS $$ SELECT count(*) FROM idem_lookup(t, 'orders', 'held') $$;
CREATE FUNCTION sec_code.probe(x int) RETURNS int
LANGUAGE plpgsql IMMUTABLE SET search_path = public, pg_catalog
AS $$ BEGIN PERFORM idem_lookup('sec_t', 'orders', 'held'); RETURN x; END $$;
CREATE TABLE sec_code.t (x int);
CREATE INDEX ON sec_code.t (sec_code.probe(x));
GRANT USAGE ON SCHEMA sec_code TO sec_app, sec_other;
RESET ROLE;
SET ROLE sec_app;
SELECT sec_code.reserve('sec_t');
SELECT sec_code.lookup('sec_t');
SELECT sec_code.reserve('acme');
RESET ROLE;
SELECT tenant_id, idem_key FROM idempotency.keys WHERE idem_key = 'code-1';
-- rows inserted by a superuser (the index function runs as the inserter);
-- ANALYZE runs it as sec_bound
INSERT INTO sec_code.t SELECT generate_series(1, 10);
ANALYZE sec_code.t;
-- an error caught in sec_bound's code leaves nothing of its binding behind
SET ROLE sec_bound;
CREATE FUNCTION sec_code.catch() RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_catalog
AS $$
BEGIN
    PERFORM idem_complete('acme', 'orders', 'no-such-key', 200, '{}');
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END $$;
RESET ROLE;
SELECT sec_code.catch();
SELECT outcome FROM idem_reserve('globex', 'orders', 'after-catch', '{}');
BEGIN;
SELECT sec_code.catch();
SELECT outcome FROM idem_reserve('globex', 'orders', 'after-catch-2', '{}');
COMMIT;
-- code given to idempotency_app (of which every bound service is a member)
-- runs bound to no tenant in another login: a call made with its rights is
-- refused
ALTER FUNCTION sec_code.reserve(text) OWNER TO idempotency_app;
SET ROLE sec_app;
SELECT sec_code.reserve('globex');
RESET ROLE;
-- a call made by a role bound to another tenant than the session's: neither
SELECT idem_bind_tenant('sec_other', 'globex');
ALTER FUNCTION sec_code.reserve(text) OWNER TO sec_bound;
SET ROLE sec_other;
SELECT sec_code.reserve('globex');
SELECT sec_code.reserve('acme');
RESET ROLE;
SELECT idem_unbind_tenant('sec_other');
DROP SCHEMA sec_code CASCADE;
-- long tenant names (up to 255 bytes) keep rows of their own: one of 127
-- bytes and one of 200 sharing those 127, each bound to a role that reads
-- its own counts only (a long name shows as its first 110 bytes, '~' and a
-- hash of the whole name)
CREATE ROLE sec_long_a IN ROLE idempotency_app, pg_monitor;
CREATE ROLE sec_long_b IN ROLE idempotency_app, pg_monitor;
SELECT idem_bind_tenant('sec_long_a', repeat('a', 127));
SELECT idem_bind_tenant('sec_long_b', repeat('a', 200));
SET ROLE sec_long_b;
SELECT count(*) FROM generate_series(1, 3) g, idem_reserve(repeat('a', 200), 'orders', 'long-' || g, '{}');
SELECT length(tenant), substr(tenant, 111, 1) AS mark, created FROM idempotency.stats;
RESET ROLE;
SET ROLE sec_long_a;
SELECT outcome FROM idem_reserve(repeat('a', 127), 'orders', 'long-a', '{}');
SELECT length(tenant), substr(tenant, 111, 1) AS mark, created FROM idempotency.stats;
RESET ROLE;
SELECT length(tenant), created FROM idempotency.stats WHERE tenant LIKE 'aaa%' ORDER BY created;
SELECT idem_unbind_tenant('sec_long_a'), idem_unbind_tenant('sec_long_b');
DROP ROLE sec_long_a, sec_long_b;
DELETE FROM idempotency.keys WHERE tenant_id LIKE 'aaa%';
-- SET ROLE to another bound role: both bindings apply, so neither tenant
GRANT sec_bound TO sec_other;
SELECT idem_bind_tenant('sec_other', 'globex');
SET SESSION AUTHORIZATION sec_other;
SELECT outcome FROM idem_reserve('globex', 'orders', 'b-2', '{}');
SET ROLE sec_bound;
SELECT outcome FROM idem_reserve('acme', 'orders', 'b-2', '{}');
RESET ROLE;
RESET SESSION AUTHORIZATION;
SELECT idem_unbind_tenant('sec_other') AS unbound, idem_unbind_tenant('sec_other') AS again;
SELECT pg_temp.try_as('sec_plain', $$SELECT idem_bind_tenant('sec_plain', 'x')$$) AS plain_binds;
SELECT idem_bind_tenant('sec_bound', '');
SELECT idem_bind_tenant(NULL, 'x');
SELECT idem_bind_tenant('-', 'x');
-- an OID that names no role (a role dropped, or never made)
SELECT idem_bind_tenant(4242424242::oid::regrole, 'x');
SELECT count(*) AS bindings_of_no_role FROM idempotency.tenant_bindings
 WHERE role = 0 OR role = 4242424242::oid::regrole;
-- binding a role the binding cannot confine (idempotency_admin, directly or
-- through another role, or a superuser) warns, and binds all the same
GRANT sec_admin TO sec_other;
SELECT idem_bind_tenant('sec_other', 'globex');
CREATE ROLE sec_noinherit NOINHERIT IN ROLE idempotency_admin;
SELECT idem_bind_tenant('sec_noinherit', 'globex');
SELECT idem_unbind_tenant('sec_noinherit');
DROP ROLE sec_noinherit;
CREATE ROLE sec_super SUPERUSER;
SELECT idem_bind_tenant('sec_super', 'globex');
SELECT idem_unbind_tenant('sec_super');
DROP ROLE sec_super;
SELECT idem_bind_tenant('sec_bound', 'acme');
SELECT role, tenant FROM idempotency.tenant_bindings ORDER BY role::text COLLATE "C";

DELETE FROM idempotency.keys WHERE tenant_id IN ('sec_t', 'acme', 'globex');
DELETE FROM idempotency.outbox WHERE tenant_id IN ('sec_t', 'acme');
DELETE FROM idempotency.tenant_bindings;
DROP ROLE sec_plain, sec_app, sec_worker, sec_admin, sec_bound, sec_other;
