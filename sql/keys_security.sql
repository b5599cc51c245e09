-- A role granted idempotency_app can call the user-facing functions but
-- cannot read the tables; the admin functions are refused to it.
CREATE ROLE keys_app_role NOLOGIN;
GRANT idempotency_app TO keys_app_role;
SET ROLE keys_app_role;
SELECT current_user;
-- the functions run with the owner's rights and a fixed search_path
SET search_path = pg_temp, public;
BEGIN;
SELECT outcome FROM idem_reserve('ks_a', 'orders', 'sec-1', '{"x": 1}'::jsonb);
SELECT idem_complete('ks_a', 'orders', 'sec-1', 201, '{"id": 7}');
COMMIT;
SELECT outcome, response_body FROM idem_reserve('ks_a', 'orders', 'sec-1', '{"x": 1}'::jsonb);
SELECT status, response_code FROM idem_lookup('ks_a', 'orders', 'sec-1');
SELECT lock_token AS sec2, lock_token IS NOT NULL AS has_token FROM idem_reserve('ks_a', 'orders', 'sec-2', fingerprint => sha256('y')) \gset
SELECT :'has_token' AS has_token;
SELECT idem_checkpoint('ks_a', 'orders', 'sec-2', 'step', :'sec2');
SELECT idem_release('ks_a', 'orders', 'sec-2', :'sec2');
RESET search_path;
-- no direct access to the tables
SELECT count(*) FROM idempotency.keys;
SELECT count(*) FROM idempotency.scopes;
UPDATE idempotency.keys SET response_code = 200;
-- admin functions are refused
SELECT idem_resolve('ks_a', 'orders', 'sec-1', 200, '{}');
SELECT idem_configure_scope('ks_scope', '{"ttl": "1 hour"}');
RESET ROLE;
SELECT p.proname, has_function_privilege('keys_app_role', p.oid, 'EXECUTE') AS app_can_execute,
       p.prosecdef AS security_definer, p.proconfig
  FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.classid = 'pg_proc'::regclass
  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency'
 WHERE p.proname IN ('idem_reserve', 'idem_complete', 'idem_checkpoint', 'idem_release',
                     'idem_lookup', 'idem_resolve', 'idem_configure_scope', 'scopes_changed')
 ORDER BY 1, 2;
DROP ROLE keys_app_role;
DELETE FROM idempotency.keys WHERE tenant_id = 'ks_a';
