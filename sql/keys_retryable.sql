-- Retryable failures: idem_complete(..., retryable => true) and the scope
-- option retryable_codes release the key (nothing stored, the retry runs
-- afresh); permanent failures are stored and replayed.
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

-- a declined card (402) is permanent: stored, replayed
BEGIN;
SELECT outcome FROM idem_reserve('rt_a', 'charges', 'declined', '{"amount": 5}'::jsonb);
SELECT idem_complete('rt_a', 'charges', 'declined', 402, '{"error": "card_declined"}');
COMMIT;
SELECT outcome, response_code, response_body
  FROM idem_reserve('rt_a', 'charges', 'declined', '{"amount": 5}'::jsonb);

-- the provider timed out (a 4xx the application knows to be transient):
-- retryable => true releases the key whatever the code
BEGIN;
SELECT outcome FROM idem_reserve('rt_a', 'charges', 'timeout', '{"amount": 5}'::jsonb);
SELECT idem_complete('rt_a', 'charges', 'timeout', 408, '{"error": "provider_timeout"}',
                     retryable => true) IS NULL AS released;
COMMIT;
SELECT count(*) AS rows_left FROM idempotency.keys WHERE tenant_id = 'rt_a' AND idem_key = 'timeout';
-- the retry runs afresh
SELECT outcome FROM idem_reserve('rt_a', 'charges', 'timeout', '{"amount": 5}'::jsonb);
-- even a 2xx is released when the caller says so (nothing stored)
BEGIN;
SELECT outcome FROM idem_reserve('rt_a', 'charges', 'ok-but-retry', '{"amount": 1}'::jsonb);
SELECT idem_complete('rt_a', 'charges', 'ok-but-retry', 200, '{}', NULL, NULL, true) IS NULL AS released;
COMMIT;
SELECT count(*) AS rows_left FROM idempotency.keys WHERE tenant_id = 'rt_a' AND idem_key = 'ok-but-retry';
-- retryable => false is the default: stored
BEGIN;
SELECT outcome FROM idem_reserve('rt_a', 'charges', 'kept', '{"amount": 1}'::jsonb);
SELECT idem_complete('rt_a', 'charges', 'kept', 409, '{}', retryable => false);
COMMIT;
-- NULL is refused before anything is written
BEGIN;
SELECT outcome FROM idem_reserve('rt_a', 'charges', 'null-retry', '{"amount": 1}'::jsonb);
SELECT pg_temp.err($$SELECT idem_complete('rt_a', 'charges', 'null-retry', 408, '{}', retryable => NULL)$$);
SELECT status FROM idem_lookup('rt_a', 'charges', 'null-retry');
ROLLBACK;
-- two-phase: the fenced release with the token
SELECT lock_token AS tok FROM idem_reserve('rt_a', 'charges', 'two-phase', '{"amount": 2}'::jsonb) \gset
SELECT pg_temp.err($$SELECT idem_complete('rt_a', 'charges', 'two-phase', 503, '{}', retryable => true)$$);
SELECT idem_complete('rt_a', 'charges', 'two-phase', 503, '{}', lock_token => :'tok', retryable => true) IS NULL AS released;
SELECT count(*) AS rows_left FROM idempotency.keys WHERE tenant_id = 'rt_a' AND idem_key = 'two-phase';

-- a scope lists codes that are never stored
SELECT scope, retryable_codes FROM idem_configure_scope('rt_scope', '{"retryable_codes": [429, 408, 429]}');
BEGIN;
SELECT outcome FROM idem_reserve('rt_a', 'rt_scope', 'busy', '{"n": 1}'::jsonb);
SELECT idem_complete('rt_a', 'rt_scope', 'busy', 429, '{"error": "rate_limited"}') IS NULL AS released;
COMMIT;
BEGIN;
SELECT outcome FROM idem_reserve('rt_a', 'rt_scope', 'busy', '{"n": 1}'::jsonb);
SELECT idem_complete('rt_a', 'rt_scope', 'busy', 422, '{"error": "invalid"}') AS other_codes_are_stored;
COMMIT;
-- the list wins over cache_server_errors; the other 5xx are cached
SELECT scope, cache_server_errors, retryable_codes
  FROM idem_configure_scope('rt_scope', '{"cache_server_errors": true, "retryable_codes": [503]}');
BEGIN;
SELECT outcome FROM idem_reserve('rt_a', 'rt_scope', 's503', '{"n": 2}'::jsonb);
SELECT idem_complete('rt_a', 'rt_scope', 's503', 503, '{}') IS NULL AS released;
SELECT outcome FROM idem_reserve('rt_a', 'rt_scope', 's500', '{"n": 2}'::jsonb);
SELECT idem_complete('rt_a', 'rt_scope', 's500', 500, '{}') AS cached;
COMMIT;
-- null restores the default (nothing released but 5xx when not cached)
SELECT scope, retryable_codes FROM idem_configure_scope('rt_scope', '{"retryable_codes": null}');
BEGIN;
SELECT outcome FROM idem_reserve('rt_a', 'rt_scope', 's503b', '{"n": 3}'::jsonb);
SELECT idem_complete('rt_a', 'rt_scope', 's503b', 503, '{}') AS cached_again;
COMMIT;
-- bad values are refused (22023) and change nothing
SELECT pg_temp.err($$SELECT idem_configure_scope('rt_scope', '{"retryable_codes": [99]}')$$);
SELECT pg_temp.err($$SELECT idem_configure_scope('rt_scope', '{"retryable_codes": [600]}')$$);
SELECT pg_temp.err($$SELECT idem_configure_scope('rt_scope', '{"retryable_codes": [408.5]}')$$);
SELECT pg_temp.err($$SELECT idem_configure_scope('rt_scope', '{"retryable_codes": ["408"]}')$$);
SELECT pg_temp.err($$SELECT idem_configure_scope('rt_scope', '{"retryable_codes": 408}')$$);
SELECT scope, cache_server_errors, retryable_codes FROM idempotency.scopes WHERE scope = 'rt_scope';
-- a scope name over 255 bytes is refused before the write (22023)
SELECT pg_temp.err(format('SELECT idem_configure_scope(%L, %L)', repeat('s', 256), '{"ttl": "1 day"}'));
SELECT pg_temp.err(format('SELECT idem_configure_scope(%L, %L)', repeat('s', 1048576), '{"ttl": "1 day"}'));
SELECT count(*) FROM idempotency.scopes WHERE length(scope) > 255;

-- what was counted: released for every key given up
SELECT released FROM idem_stats() WHERE tenant = 'rt_a' AND scope = 'charges';

DELETE FROM idempotency.keys WHERE tenant_id = 'rt_a';
DELETE FROM idempotency.scopes WHERE scope = 'rt_scope';
