-- idem_execute: a whole idempotent request in one statement, for handlers
-- that live in the database.
CREATE FUNCTION pg_temp.err(sql text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    st text;
    msg text;
    hint text;
BEGIN
    EXECUTE sql;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
                            hint = PG_EXCEPTION_HINT;
    RETURN st || ' ' || msg || E'\n      hint: ' || coalesce(hint, '(none)');
END
$$;

CREATE SCHEMA ex;
CREATE TABLE ex.orders (id serial PRIMARY KEY, tenant text, idem_key text, sku text, qty int);
CREATE TABLE ex.calls (n serial, tenant text, idem_key text);
-- the handler: writes the order, answers 201 with it (402 when qty is 0,
-- an error when the sku is unknown)
CREATE FUNCTION ex.create_order(tenant text, key text, request jsonb)
RETURNS idempotency.response LANGUAGE plpgsql AS $$
DECLARE
    o ex.orders;
BEGIN
    INSERT INTO ex.calls (tenant, idem_key) VALUES (tenant, key);
    IF request ->> 'sku' = 'nope' THEN
        RAISE EXCEPTION 'unknown sku' USING ERRCODE = 'P0001';
    END IF;
    IF (request ->> 'qty')::int = 0 THEN
        RETURN ROW(402, '{"error": "nothing to order"}', NULL)::idempotency.response;
    END IF;
    INSERT INTO ex.orders (tenant, idem_key, sku, qty)
    VALUES (tenant, key, request ->> 'sku', (request ->> 'qty')::int) RETURNING * INTO o;
    RETURN ROW(201, jsonb_build_object('order', o.id, 'sku', o.sku),
               jsonb_build_object('Location', '/orders/' || o.id))::idempotency.response;
END
$$;
\set r 'outcome, http_status, response_code, response_body, response_headers, retry_after, lock_token IS NULL AS no_token'

-- new key: the handler runs once, its response is stored and returned
SELECT :r FROM idem_execute('ex_a', 'POST /orders', 'k-1', '{"sku": "A-1", "qty": 2}', 'ex.create_order');
-- the retry replays without calling the handler
SELECT :r FROM idem_execute('ex_a', 'POST /orders', 'k-1', '{"sku": "A-1", "qty": 2}', 'ex.create_order');
-- same key, another body: mismatch, no call
SELECT :r FROM idem_execute('ex_a', 'POST /orders', 'k-1', '{"sku": "A-1", "qty": 3}', 'ex.create_order');
SELECT count(*) AS handler_calls FROM ex.calls WHERE idem_key = 'k-1';
SELECT count(*) AS orders FROM ex.orders WHERE idem_key = 'k-1';
SELECT status, response_code FROM idem_lookup('ex_a', 'POST /orders', 'k-1');
-- a 4xx from the handler is stored and replayed
SELECT :r FROM idem_execute('ex_a', 'POST /orders', 'k-2', '{"sku": "A-1", "qty": 0}', 'ex.create_order');
SELECT :r FROM idem_execute('ex_a', 'POST /orders', 'k-2', '{"sku": "A-1", "qty": 0}', 'ex.create_order');
-- an error in the handler fails the statement: nothing remains, the retry
-- runs afresh
SELECT pg_temp.err($$SELECT idem_execute('ex_a', 'POST /orders', 'k-3', '{"sku": "nope", "qty": 1}', 'ex.create_order')$$);
SELECT count(*) AS keys FROM idempotency.keys WHERE idem_key = 'k-3';
SELECT count(*) AS calls_kept FROM ex.calls WHERE idem_key = 'k-3';
SELECT outcome, response_code FROM idem_execute('ex_a', 'POST /orders', 'k-3', '{"sku": "nope2", "qty": 1}', 'ex.create_order');

-- in a transaction: another transaction's key held open is in_progress
BEGIN;
SELECT outcome FROM idem_reserve('ex_a', 'POST /orders', 'k-4', '{"sku": "B", "qty": 1}'::jsonb);
SELECT idem_release('ex_a', 'POST /orders', 'k-4');
COMMIT;

-- a 5xx the scope does not cache: answered, not stored
CREATE FUNCTION ex.unavailable(tenant text, key text, request jsonb)
RETURNS idempotency.response LANGUAGE sql
AS $$ SELECT ROW(503, '{"error": "try later"}'::jsonb, NULL::jsonb)::idempotency.response $$;
SELECT :r FROM idem_execute('ex_a', 'POST /orders', 'k-5', '{}', 'ex.unavailable');
SELECT count(*) AS keys FROM idempotency.keys WHERE idem_key = 'k-5';

-- a handler that wrote, then answered a status that is not stored (a 5xx
-- the scope does not cache, one of its retryable_codes): what it wrote is
-- rolled back with the released key, so the retry it invites writes once
CREATE FUNCTION ex.charge(tenant text, key text, request jsonb)
RETURNS idempotency.response LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ex.orders (tenant, idem_key, sku, qty) VALUES (tenant, key, 'charge', 1);
    RETURN ROW((request ->> 'status')::int, '{}'::jsonb, NULL::jsonb)::idempotency.response;
END
$$;
-- (no expires_at for a response that is not kept)
SELECT outcome, response_code, expires_at IS NOT NULL AS expires FROM idem_execute('ex_a', 'POST /charges', 'c-1', '{"status": 503}', 'ex.charge');
SELECT count(*) AS orders, (SELECT count(*) FROM idem_lookup('ex_a', 'POST /charges', 'c-1')) AS keys
  FROM ex.orders WHERE idem_key = 'c-1';
SELECT outcome, response_code FROM idem_execute('ex_a', 'POST /charges', 'c-1', '{"status": 201}', 'ex.charge');
SELECT count(*) AS orders FROM ex.orders WHERE idem_key = 'c-1';
SELECT (idem_configure_scope('POST /charges-cached', '{"cache_server_errors": true}')).scope;
SELECT (idem_configure_scope('POST /charges-409', '{"retryable_codes": [409]}')).scope;
-- stored: a cached 5xx, an ordinary 4xx; released: a retryable 409
SELECT outcome, response_code, expires_at IS NOT NULL AS expires FROM idem_execute('ex_a', 'POST /charges-cached', 'c-2', '{"status": 503}', 'ex.charge');
SELECT outcome, response_code, expires_at IS NOT NULL AS expires FROM idem_execute('ex_a', 'POST /charges-409', 'c-3', '{"status": 422}', 'ex.charge');
SELECT outcome, response_code, expires_at IS NOT NULL AS expires FROM idem_execute('ex_a', 'POST /charges-409', 'c-4', '{"status": 409}', 'ex.charge');
SELECT idem_key, count(*) AS orders FROM ex.orders WHERE idem_key IN ('c-2', 'c-3', 'c-4')
 GROUP BY idem_key ORDER BY idem_key;
SELECT idem_key, status, response_code FROM idempotency.keys
 WHERE scope LIKE 'POST /charges%' ORDER BY idem_key;
-- inside a transaction and a caller's savepoint: the released key and its
-- rolled-back writes leave the caller's own work and savepoints intact
BEGIN;
INSERT INTO ex.calls (tenant, idem_key) VALUES ('ex_a', 'c-5-before');
SAVEPOINT s1;
SELECT outcome, response_code FROM idem_execute('ex_a', 'POST /charges', 'c-5', '{"status": 500}', 'ex.charge');
SELECT pg_temp.err($$SELECT idem_execute('ex_a', 'POST /orders', 'c-6', '{"sku": "nope", "qty": 1}', 'ex.create_order')$$);
SELECT outcome, response_code FROM idem_execute('ex_a', 'POST /charges', 'c-7', '{"status": 201}', 'ex.charge');
ROLLBACK TO SAVEPOINT s1;
SELECT outcome, response_code FROM idem_execute('ex_a', 'POST /charges', 'c-8', '{"status": 201}', 'ex.charge');
COMMIT;
SELECT idem_key, count(*) FROM ex.orders WHERE idem_key IN ('c-5', 'c-6', 'c-7', 'c-8')
 GROUP BY idem_key ORDER BY idem_key;
SELECT count(*) AS before_kept FROM ex.calls WHERE idem_key = 'c-5-before';
SELECT idem_key, status FROM idempotency.keys WHERE idem_key IN ('c-5', 'c-6', 'c-7', 'c-8') ORDER BY idem_key;

-- a prepared statement keeps the handler it resolved when it was prepared:
-- dropped and created again, the handler is a new function (42883 with
-- the way out); replaced in place, it is the same one
CREATE FUNCTION ex.tmp(tenant text, key text, request jsonb)
RETURNS idempotency.response LANGUAGE sql
AS $$ SELECT ROW(200, '{"v": 1}'::jsonb, NULL::jsonb)::idempotency.response $$;
PREPARE ex_call(text) AS
SELECT outcome, response_body FROM idem_execute('ex_a', 'POST /tmp', $1, '{}', 'ex.tmp');
EXECUTE ex_call('t-1');
CREATE OR REPLACE FUNCTION ex.tmp(tenant text, key text, request jsonb)
RETURNS idempotency.response LANGUAGE sql
AS $$ SELECT ROW(200, '{"v": 2}'::jsonb, NULL::jsonb)::idempotency.response $$;
EXECUTE ex_call('t-2');
DROP FUNCTION ex.tmp(text, text, jsonb);
CREATE FUNCTION ex.tmp(tenant text, key text, request jsonb)
RETURNS idempotency.response LANGUAGE sql
AS $$ SELECT ROW(200, '{"v": 3}'::jsonb, NULL::jsonb)::idempotency.response $$;
SELECT regexp_replace(pg_temp.err($$EXECUTE ex_call('t-3')$$), 'OID [0-9]+', 'OID n');
SELECT count(*) AS keys FROM idempotency.keys WHERE idem_key = 't-3';
DEALLOCATE ex_call;
PREPARE ex_call(text) AS
SELECT outcome, response_body FROM idem_execute('ex_a', 'POST /tmp', $1, '{}', 'ex.tmp');
EXECUTE ex_call('t-3');
DEALLOCATE ex_call;

-- bad handlers are refused before anything is written
CREATE FUNCTION ex.wrong_args(request jsonb) RETURNS idempotency.response
LANGUAGE sql AS $$ SELECT ROW(200, NULL::jsonb, NULL::jsonb)::idempotency.response $$;
CREATE FUNCTION ex.wrong_result(tenant text, key text, request jsonb) RETURNS jsonb
LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
CREATE FUNCTION ex.no_status(tenant text, key text, request jsonb) RETURNS idempotency.response
LANGUAGE sql AS $$ SELECT ROW(NULL, NULL::jsonb, NULL::jsonb)::idempotency.response $$;
CREATE FUNCTION ex.null_row(tenant text, key text, request jsonb) RETURNS idempotency.response
LANGUAGE sql AS $$ SELECT NULL::idempotency.response $$;
CREATE FUNCTION ex.bad_status(tenant text, key text, request jsonb) RETURNS idempotency.response
LANGUAGE sql AS $$ SELECT ROW(700, NULL::jsonb, NULL::jsonb)::idempotency.response $$;
SELECT pg_temp.err($$SELECT idem_execute('ex_a', 'POST /orders', 'k-6', '{}', 'ex.wrong_args')$$);
SELECT pg_temp.err($$SELECT idem_execute('ex_a', 'POST /orders', 'k-6', '{}', 'ex.wrong_result')$$);
SELECT pg_temp.err($$SELECT idem_execute('ex_a', 'POST /orders', 'k-6', '{}', 'ex.no_status')$$);
SELECT pg_temp.err($$SELECT idem_execute('ex_a', 'POST /orders', 'k-6', '{}', 'ex.null_row')$$);
SELECT pg_temp.err($$SELECT idem_execute('ex_a', 'POST /orders', 'k-6', '{}', 'ex.bad_status')$$);
SELECT pg_temp.err($$SELECT idem_execute('ex_a', 'POST /orders', 'k-6', '{}', 'ex.missing')$$);
-- a schema that does not exist: 3F000 on 15, 42883 from 16 on (PostgreSQL's)
SELECT left(e, 5) = CASE WHEN current_setting('server_version_num')::int < 160000
                         THEN '3F000' ELSE '42883' END AS expected_sqlstate
  FROM pg_temp.err($$SELECT idem_execute('ex_a', 'POST /orders', 'k-6', '{}', 'ex_no_such_schema.create_order')$$) AS e;
SELECT pg_temp.err($$SELECT idem_execute('ex_a', 'POST /orders', 'k-6', '{}', NULL)$$);
SELECT pg_temp.err($$SELECT idem_execute('ex_a', 'POST /orders', 'k-6', '{}', '-')$$);
SELECT pg_temp.err($$SELECT idem_execute('ex_a', 'POST /orders', 'k-6', '{}', 0::regproc)$$);
SELECT pg_temp.err($$SELECT idem_execute('ex_a', 'POST /orders', 'k-6', NULL, 'ex.create_order')$$);
SELECT pg_temp.err($$SELECT idem_execute('ex_a', 'POST /orders', '', '{}', 'ex.create_order')$$);
SELECT count(*) AS keys FROM idempotency.keys WHERE idem_key = 'k-6';

-- a handler whose name is overloaded is ambiguous by name (42725, before
-- anything is written); its signature, cast to regprocedure, names it
CREATE FUNCTION ex.ov(tenant text, key text, request jsonb) RETURNS idempotency.response
LANGUAGE sql AS $$ SELECT ROW(201, '{"ov": 3}'::jsonb, NULL::jsonb)::idempotency.response $$;
CREATE FUNCTION ex.ov(request jsonb) RETURNS idempotency.response
LANGUAGE sql AS $$ SELECT ROW(201, '{"ov": 1}'::jsonb, NULL::jsonb)::idempotency.response $$;
SELECT pg_temp.err($$SELECT idem_execute('ex_a', 'POST /orders', 'k-ov', '{}', 'ex.ov')$$);
SELECT count(*) AS keys FROM idempotency.keys WHERE idem_key = 'k-ov';
SELECT outcome, response_code, response_body
  FROM idem_execute('ex_a', 'POST /orders', 'k-ov', '{}', 'ex.ov(text, text, jsonb)'::regprocedure);

-- the handler runs as the caller: an application role needs EXECUTE on it
-- and the privileges its body uses; the key table stays out of its reach
CREATE ROLE ex_app IN ROLE idempotency_app;
GRANT USAGE ON SCHEMA ex TO ex_app;
REVOKE EXECUTE ON FUNCTION ex.create_order(text, text, jsonb) FROM PUBLIC;
SET ROLE ex_app;
SELECT pg_temp.err($$SELECT idem_execute('ex_a', 'POST /orders', 'k-7', '{"sku": "C", "qty": 1}', 'ex.create_order')$$);
RESET ROLE;
GRANT EXECUTE ON FUNCTION ex.create_order(text, text, jsonb) TO ex_app;
SET ROLE ex_app;
SELECT pg_temp.err($$SELECT idem_execute('ex_a', 'POST /orders', 'k-7', '{"sku": "C", "qty": 1}', 'ex.create_order')$$);
RESET ROLE;
GRANT INSERT, SELECT ON ex.orders, ex.calls TO ex_app;
GRANT USAGE ON ALL SEQUENCES IN SCHEMA ex TO ex_app;
SET ROLE ex_app;
SELECT outcome, response_code, current_user FROM idem_execute('ex_a', 'POST /orders', 'k-7', '{"sku": "C", "qty": 1}', 'ex.create_order');
SELECT outcome, response_code FROM idem_execute('ex_a', 'POST /orders', 'k-7', '{"sku": "C", "qty": 1}', 'ex.create_order');
-- the handler sees the caller's search_path
SET search_path = ex, public;
SELECT outcome FROM idem_execute('ex_a', 'POST /orders', 'k-8', '{"sku": "D", "qty": 1}', 'create_order');
RESET search_path;
-- a role bound to another tenant is refused before the handler runs
RESET ROLE;
SELECT idem_bind_tenant('ex_app', 'ex_b');
SET ROLE ex_app;
SELECT pg_temp.err($$SELECT idem_reserve('ex_a', 'POST /orders', 'k-9', '{"sku": "E", "qty": 1}')$$);
SELECT pg_temp.err($$SELECT idem_execute('ex_a', 'POST /orders', 'k-9', '{"sku": "E", "qty": 1}', 'ex.create_order')$$);
RESET ROLE;
SELECT idem_unbind_tenant('ex_app');
SELECT count(*) AS calls_k9 FROM ex.calls WHERE idem_key = 'k-9';
-- a handler passed by OID needs USAGE on its schema too, as its name
-- would: nothing runs in a schema closed to the caller
CREATE SCHEMA ex_hidden;
CREATE FUNCTION ex_hidden.h(tenant text, key text, request jsonb) RETURNS idempotency.response
LANGUAGE sql AS $$ SELECT ROW(201, '{"hidden": 1}'::jsonb, NULL::jsonb)::idempotency.response $$;
GRANT EXECUTE ON FUNCTION ex_hidden.h(text, text, jsonb) TO ex_app;
SELECT 'ex_hidden.h(text, text, jsonb)'::regprocedure::oid AS hidden_oid \gset
SET ROLE ex_app;
SELECT pg_temp.err($$SELECT idem_execute('ex_a', 'POST /orders', 'k-h', '{}', $$ || :hidden_oid || $$::regproc)$$);
RESET ROLE;
SELECT count(*) AS keys_kh FROM idempotency.keys WHERE idem_key = 'k-h';
DROP SCHEMA ex_hidden CASCADE;

-- SELECT (idem_execute(...)).*: PostgreSQL calls the function once per
-- column; the calls of one row are one request, whose handler runs once
-- (it ran once per column: a released 503 nine times, its row mixing
-- their answers; a 201 once, with eight replays counted)
-- (a sequence counts the handler's runs: a released response's writes
-- are rolled back, its nextval is not)
CREATE SEQUENCE ex.runs;
CREATE FUNCTION ex.counted(tenant text, key text, request jsonb)
RETURNS idempotency.response LANGUAGE plpgsql AS $$
BEGIN
    RETURN ROW((request ->> 'status')::int,
               jsonb_build_object('run', nextval('ex.runs')), NULL::jsonb)::idempotency.response;
END
$$;
SELECT idem_stats_reset();
SELECT (idem_execute('ex_a', 'POST /charges', 'sl-1', '{"status": 503}', 'ex.counted')).*;
SELECT last_value AS runs, is_called FROM ex.runs;
SELECT (idem_execute('ex_a', 'POST /charges', 'sl-2', '{"status": 201}', 'ex.counted')).outcome,
       (idem_execute('ex_a', 'POST /charges', 'sl-2', '{"status": 201}', 'ex.counted')).response_body;
SELECT last_value AS runs FROM ex.runs;
SELECT created, replayed, released, completed FROM idempotency.stats
 WHERE tenant = 'ex_a' AND scope = 'POST /charges';
-- two rows are two requests
SELECT (idem_execute('ex_a', 'POST /charges', 'sl-3', '{"status": 503}', 'ex.counted')).outcome
  FROM generate_series(1, 2);
SELECT last_value AS runs FROM ex.runs;

-- the completion does what was decided when the handler's writes were
-- kept or rolled back: a handler that turns its scope's caching of server
-- errors off (in its subtransaction, rolled back with the response) and
-- answers 503 is released, its write gone, nothing stored (the key was
-- stored as "failed 503" by the policy of before, for a retry to replay a
-- response whose work was rolled back)
CREATE FUNCTION ex.reconfigure(tenant text, key text, request jsonb)
RETURNS idempotency.response LANGUAGE plpgsql AS $$
BEGIN
    PERFORM idem_configure_scope('POST /charges-cached', '{"cache_server_errors": false}');
    INSERT INTO ex.orders (tenant, idem_key, sku, qty) VALUES (tenant, key, 'reconfigure', 1);
    RETURN ROW(503, '{}'::jsonb, NULL::jsonb)::idempotency.response;
END
$$;
SELECT outcome, response_code, expires_at IS NOT NULL AS expires
  FROM idem_execute('ex_a', 'POST /charges-cached', 'rc-1', '{}', 'ex.reconfigure');
SELECT count(*) AS keys FROM idempotency.keys WHERE idem_key = 'rc-1';
SELECT count(*) AS orders FROM ex.orders WHERE idem_key = 'rc-1';
SELECT cache_server_errors FROM idempotency.scopes WHERE scope = 'POST /charges-cached';

DROP SCHEMA ex CASCADE;
DROP ROLE ex_app;
DELETE FROM idempotency.keys WHERE tenant_id = 'ex_a';
