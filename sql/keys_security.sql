-- A role granted idempotency_app can call the user-facing functions but
-- cannot read the tables; the admin functions are refused to it.
CREATE ROLE keys_app_role NOLOGIN;
GRANT idempotency_app TO keys_app_role;
-- a function only the caller's search_path finds
CREATE FUNCTION public.ks_probe() RETURNS text LANGUAGE sql
    AS $$ SELECT 'found on the caller''s path'::text $$;
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
-- idem_reserve and idem_complete are SECURITY INVOKER and switch to their
-- owner and a pinned search_path in C: the caller's role and search_path
-- are back after a call, and after an error caught in the same transaction
BEGIN;
SELECT outcome FROM idem_reserve('ks_a', 'orders', 'sec-3', '{"x": 3}'::jsonb);
SELECT current_user, ks_probe();
DO $$
BEGIN
    PERFORM idem_complete('ks_a', 'orders', 'sec-3', 99, '{}');
EXCEPTION WHEN invalid_parameter_value THEN
    RAISE NOTICE 'caught %: %', SQLSTATE, SQLERRM;
END
$$;
SELECT current_user, ks_probe();
SELECT idem_complete('ks_a', 'orders', 'sec-3', 201, '{}');
SELECT current_user, ks_probe();
ROLLBACK;
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
-- they run as the owner of the function, as SECURITY DEFINER would: owned
-- by a role without rights on the extension's tables, idem_reserve fails
-- to read a scope's policy; given back, it works again (in the same
-- session)
CREATE ROLE keys_no_rights NOLOGIN;
SELECT proowner::regrole AS reserve_owner FROM pg_proc
 WHERE oid = 'idem_reserve(text, text, text, jsonb, interval, interval, bytea)'::regprocedure \gset
ALTER FUNCTION idem_reserve(text, text, text, jsonb, interval, interval, bytea) OWNER TO keys_no_rights;
SET ROLE keys_app_role;
SELECT outcome FROM idem_reserve('ks_a', 'ks_owner', 'sec-4', '{}'::jsonb);
RESET ROLE;
ALTER FUNCTION idem_reserve(text, text, text, jsonb, interval, interval, bytea) OWNER TO :"reserve_owner";
SET ROLE keys_app_role;
SELECT outcome FROM idem_reserve('ks_a', 'ks_owner', 'sec-4', '{}'::jsonb);
RESET ROLE;
DROP ROLE keys_no_rights;
DROP FUNCTION public.ks_probe();
DROP ROLE keys_app_role;
DELETE FROM idempotency.keys WHERE tenant_id = 'ks_a';
