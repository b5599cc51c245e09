--
-- Running on Citus (README, "Running on Citus"): without Citus in the
-- database, idem_citus_distribute() says so and changes nothing; the key
-- functions keep reading idempotency.keys itself.
--
SELECT idem_citus_distribute();
SELECT idem_citus_distribute(4);
SELECT count(*) AS citus_tables FROM pg_catalog.pg_class
 WHERE relname IN ('pg_dist_partition', 'pg_dist_shard');
BEGIN;
SELECT (idem_reserve('citus_t', 'citus', 'k1', '{"a": 1}')).outcome;
SELECT idem_complete('citus_t', 'citus', 'k1', 201, '{"ok": true}');
COMMIT;
SELECT (idem_reserve('citus_t', 'citus', 'k1', '{"a": 1}')).outcome;
-- admins only
SELECT has_function_privilege('idempotency_admin', 'idem_citus_distribute(int)', 'EXECUTE') AS admin,
       has_function_privilege('idempotency_app', 'idem_citus_distribute(int)', 'EXECUTE') AS app;
-- leave no keys behind for the suites that follow
DELETE FROM idempotency.keys WHERE tenant_id = 'citus_t';
