-- Every error of the key functions: its SQLSTATE, message and hint, and
-- that nothing was written before it was raised.
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

-- a completed key and a two-phase reservation to misuse
BEGIN;
SELECT outcome FROM idem_reserve('ke_a', 'orders', 'done', fingerprint => sha256('d'));
SELECT idem_complete('ke_a', 'orders', 'done', 200, '{}');
COMMIT;
SELECT lock_token AS tok FROM idem_reserve('ke_a', 'orders', 'held', fingerprint => sha256('h')) \gset
SELECT count(*) AS rows_before FROM idempotency.keys WHERE tenant_id = 'ke_a' \gset

-- missing arguments (22004) and a missing key (22004)
SELECT pg_temp.err($$SELECT idem_reserve(NULL, 'orders', 'k', fingerprint => sha256('x'))$$);
SELECT pg_temp.err($$SELECT idem_reserve('ke_a', NULL, 'k', fingerprint => sha256('x'))$$);
SELECT pg_temp.err($$SELECT idem_reserve('ke_a', 'orders', NULL, fingerprint => sha256('x'))$$);
SELECT pg_temp.err($$SELECT idem_reserve('ke_a', 'orders', '', '{}'::jsonb)$$);
SELECT pg_temp.err($$SELECT idem_reserve('ke_a', 'orders', 'k', NULL::jsonb)$$);
SELECT pg_temp.err($$SELECT idem_reserve('ke_a', 'orders', 'k', fingerprint => NULL::bytea)$$);
SELECT pg_temp.err($$SELECT idem_complete('ke_a', 'orders', 'held', NULL, '{}')$$);
SELECT pg_temp.err($$SELECT idem_checkpoint('ke_a', 'orders', 'held', NULL)$$);
SELECT pg_temp.err($$SELECT idem_release(NULL, 'orders', 'held')$$);
SELECT pg_temp.err($$SELECT * FROM idem_lookup('ke_a', 'orders', NULL)$$);
-- an empty tenant or scope (22004): a caller that lost its tenant must not
-- share one tenant's keys and replays with every other such caller
SELECT pg_temp.err($$SELECT idem_reserve('', 'orders', 'k', '{}'::jsonb)$$);
SELECT pg_temp.err($$SELECT idem_reserve('ke_a', '', 'k', '{}'::jsonb)$$);
SELECT pg_temp.err($$SELECT idem_complete('', 'orders', 'held', 200, '{}')$$);
SELECT pg_temp.err($$SELECT * FROM idem_lookup('ke_a', '', 'held')$$);
SELECT pg_temp.err($$SELECT outbox_enqueue('', 'payment.capture', '{}')$$);
SELECT pg_temp.err($$SELECT count(*) FROM outbox_claim('w', 1, tenant => '')$$);
-- a tenant or scope over 255 bytes (22001), before anything is written
SELECT pg_temp.err(format('SELECT idem_reserve(%L, %L, %L, fingerprint => sha256(%L))',
                          repeat('t', 256), 'orders', 'k', 'x'));
SELECT pg_temp.err(format('SELECT idem_reserve(%L, %L, %L, fingerprint => sha256(%L))',
                          'ke_a', repeat('s', 1048576), 'k', 'x'));
SELECT pg_temp.err(format('SELECT outbox_enqueue(%L, %L, %L)', repeat('t', 3000), 'topic', '{}'));
SELECT pg_temp.err(format('SELECT idem_complete(%L, %L, %L, 200, %L)', 'ke_a', repeat('s', 256), 'k', '{}'));
SELECT count(*) FROM idempotency.keys WHERE length(tenant_id) > 255 OR length(scope) > 255;
-- key too long (22001), not printable ASCII (22021)
SELECT pg_temp.err(format('SELECT idem_reserve(%L, %L, %L, fingerprint => sha256(%L))',
                          'ke_a', 'orders', repeat('k', 256), 'x'));
SELECT length(repeat('k', 255)) AS longest_key,
       (idem_reserve('ke_a', 'orders', repeat('k', 255), fingerprint => sha256('x'))).outcome;
SELECT pg_temp.err($$SELECT idem_reserve('ke_a', 'orders', E'tab\there', fingerprint => sha256('x'))$$);
SELECT pg_temp.err($$SELECT idem_reserve('ke_a', 'orders', 'café', fingerprint => sha256('x'))$$);
-- bad values (22023)
SELECT pg_temp.err($$SELECT idem_reserve('ke_a', 'orders', 'k', fingerprint => '\x0102'::bytea)$$);
SELECT pg_temp.err($$SELECT idem_reserve('ke_a', 'orders', 'k', ttl => '0', fingerprint => sha256('x'))$$);
SELECT pg_temp.err($$SELECT idem_reserve('ke_a', 'orders', 'k', wait => '-1 s', fingerprint => sha256('x'))$$);
-- NULL wait and ttl are the defaults (no wait; the scope's ttl), not errors
SELECT outcome FROM idem_reserve('ke_a', 'orders', 'k-null-wait', ttl => NULL, wait => NULL, fingerprint => sha256('x'));
SELECT pg_temp.err($$SELECT idem_complete('ke_a', 'orders', 'held', 99, '{}')$$);
SELECT pg_temp.err($$SELECT idem_complete('ke_a', 'orders', 'held', 600, '{}')$$);
SELECT pg_temp.err($$SELECT idem_complete('ke_a', 'orders', 'held', 200, '{}', '["x"]')$$);
-- request or response over the size GUCs (54000)
SET idempotency.max_request_size = 64;
SELECT pg_temp.err(format('SELECT idem_reserve(%L, %L, %L, %L::jsonb)', 'ke_a', 'orders',
                          'big', json_build_object('pad', repeat('x', 100))));
SELECT (idem_reserve('ke_a', 'orders', 'small', '{"a": 1}'::jsonb)).outcome;
-- the request limit counts the canonical JSON text (what is hashed), not
-- jsonb's binary form, which takes six times the text for an array of
-- small numbers: 400 numbers are 801 bytes of text and 4,804 as jsonb
SET idempotency.max_request_size = 1000;
CREATE TEMP TABLE digits (n int, j jsonb);
ALTER TABLE digits ALTER COLUMN j SET STORAGE EXTERNAL;
INSERT INTO digits SELECT n, (SELECT jsonb_agg(1) FROM generate_series(1, n))
  FROM (VALUES (400), (500), (2000)) v(n);
SELECT n, length(idem_canonical(j)) AS text_bytes, pg_column_size(j) AS jsonb_bytes FROM digits ORDER BY n;
SELECT (idem_reserve('ke_size', 'orders', 'digits', j)).outcome FROM digits WHERE n = 400;
-- over the limit as text (1,001 bytes), or over eight times it as jsonb
-- (refused before it is read): the detail says which
DO $$
DECLARE
    r record;
    st text;
    detail text;
BEGIN
    FOR r IN SELECT n, j FROM digits WHERE n > 400 ORDER BY n LOOP
        BEGIN
            PERFORM idem_reserve('ke_size', 'orders', 'digits-' || r.n, r.j);
            RAISE NOTICE '% numbers: no error', r.n;
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, detail = PG_EXCEPTION_DETAIL;
            RAISE NOTICE '% numbers: % %', r.n, st, detail;
        END;
    END LOOP;
END
$$;
SELECT idem_key FROM idempotency.keys WHERE tenant_id = 'ke_size';
RESET idempotency.max_request_size;
SET idempotency.max_response_size = 64;
SELECT pg_temp.err(format('SELECT idem_complete(%L, %L, %L, 200, %L::jsonb)', 'ke_a', 'orders',
                          'held', json_build_object('pad', repeat('x', 100))));
SELECT pg_temp.err(format('SELECT idem_complete(%L, %L, %L, 200, %L, %L::jsonb)', 'ke_a', 'orders',
                          'held', '{}', json_build_object('pad', repeat('x', 100))));
RESET idempotency.max_response_size;
-- the size limits are the DBA's: an application's session cannot lift them
CREATE ROLE ke_app IN ROLE idempotency_app;
SET ROLE ke_app;
SET idempotency.max_request_size = '1GB';
SET idempotency.max_response_size = '1GB';
SET idempotency.max_payload_size = '1GB';
SELECT set_config('idempotency.max_response_size', '1GB', true);
RESET ROLE;
DROP ROLE ke_app;
-- no reservation (P0002)
SELECT pg_temp.err($$SELECT idem_complete('ke_a', 'orders', 'never', 200, '{}')$$);
SELECT pg_temp.err($$SELECT idem_checkpoint('ke_a', 'orders', 'never', 'step')$$);
SELECT pg_temp.err($$SELECT idem_release('ke_a', 'orders', 'never')$$);
SELECT pg_temp.err($$SELECT idem_resolve('ke_a', 'orders', 'never', 200, '{}')$$);
-- already completed (55000): complete twice, checkpoint or release after
SELECT pg_temp.err($$SELECT idem_complete('ke_a', 'orders', 'done', 200, '{}')$$);
SELECT pg_temp.err($$SELECT idem_complete('ke_a', 'orders', 'done', 500, '{}')$$);
SELECT pg_temp.err($$SELECT idem_checkpoint('ke_a', 'orders', 'done', 'step')$$);
SELECT pg_temp.err($$SELECT idem_release('ke_a', 'orders', 'done')$$);
SELECT pg_temp.err($$SELECT idem_resolve('ke_a', 'orders', 'done', 200, '{}')$$);
-- fence mismatch (55006)
SELECT pg_temp.err($$SELECT idem_complete('ke_a', 'orders', 'held', 200, '{}', NULL,
                                          '00000000-0000-4000-8000-000000000000')$$);
SELECT pg_temp.err($$SELECT idem_complete('ke_a', 'orders', 'held', 503, '{}', NULL,
                                          '00000000-0000-4000-8000-000000000000')$$);
SELECT pg_temp.err($$SELECT idem_checkpoint('ke_a', 'orders', 'held', 'x',
                                            '00000000-0000-4000-8000-000000000000')$$);
SELECT pg_temp.err($$SELECT idem_release('ke_a', 'orders', 'held',
                                         '00000000-0000-4000-8000-000000000000')$$);
-- tenant mismatch (42501), checked in every function naming a tenant
SET idempotency.tenant = 'ke_other';
SELECT pg_temp.err($$SELECT idem_reserve('ke_a', 'orders', 'k', fingerprint => sha256('x'))$$);
SELECT pg_temp.err($$SELECT idem_reserve('ke_a', 'orders', 'k', '{}'::jsonb)$$);
SELECT pg_temp.err($$SELECT idem_complete('ke_a', 'orders', 'held', 200, '{}')$$);
SELECT pg_temp.err($$SELECT idem_checkpoint('ke_a', 'orders', 'held', 'x')$$);
SELECT pg_temp.err($$SELECT idem_release('ke_a', 'orders', 'held')$$);
SELECT pg_temp.err($$SELECT idem_resolve('ke_a', 'orders', 'held', 200, '{}')$$);
SELECT pg_temp.err($$SELECT * FROM idem_lookup('ke_a', 'orders', 'done')$$);
RESET idempotency.tenant;
-- scope options: unknown (42704), bad values (22023), NULL scope (22004)
SELECT pg_temp.err($$SELECT idem_configure_scope('ke_scope', '{"ttl": "1 day", "tll": 5}')$$);
SELECT pg_temp.err($$SELECT idem_configure_scope('ke_scope', '[]')$$);
SELECT pg_temp.err($$SELECT idem_configure_scope(NULL, '{}')$$);
SELECT pg_temp.err($$SELECT idem_configure_scope('ke_scope', '{"ttl": -5}')$$);
SELECT pg_temp.err($$SELECT idem_configure_scope('ke_scope', '{"lock_timeout": true}')$$);
SELECT pg_temp.err($$SELECT idem_configure_scope('ke_scope', '{"cache_server_errors": "yes"}')$$);
SELECT pg_temp.err($$SELECT idem_configure_scope('ke_scope', '{"stale_action": "retry"}')$$);
SELECT pg_temp.err($$SELECT idem_configure_scope('ke_scope', '{"fingerprint_ignore": ["ts"]}')$$);
SELECT pg_temp.err($$SELECT idem_configure_scope('ke_scope', '{"fingerprint_ignore": ["/a~2"]}')$$);
SELECT pg_temp.err($$SELECT idem_configure_scope('ke_scope', '{"fingerprint_ignore": [""]}')$$);
SELECT pg_temp.err($$SELECT idem_configure_scope('ke_scope', '{"fingerprint_ignore": [1]}')$$);
SELECT pg_temp.err(format('SELECT idem_configure_scope(%L, %L)', 'ke_scope',
       jsonb_build_object('fingerprint_ignore', (SELECT jsonb_agg('/m' || i) FROM generate_series(1, 101) i))));
SELECT count(*) FROM idem_configure_scope('ke_scope_100',
       jsonb_build_object('fingerprint_ignore', (SELECT jsonb_agg('/m' || i) FROM generate_series(1, 100) i)));
DELETE FROM idempotency.scopes WHERE scope = 'ke_scope_100';
-- NULL options (22004); intervals that do not parse, or whose expiry would
-- leave the timestamp range, are refused here, not at every later reserve
SELECT pg_temp.err($$SELECT idem_configure_scope('ke_scope', NULL)$$);
SELECT pg_temp.err($$SELECT idem_configure_scope('ke_scope', '{"ttl": "banana"}')$$);
SELECT pg_temp.err($$SELECT idem_configure_scope('ke_scope', '{"lock_timeout": "5 fortnights"}')$$);
SELECT pg_temp.err($$SELECT idem_configure_scope('ke_scope', '{"ttl": "300000 years"}')$$);
SELECT pg_temp.err($$SELECT idem_configure_scope('ke_scope', '{"lock_timeout": "1001 years"}')$$);
SELECT pg_temp.err($$SELECT idem_configure_scope('ke_scope', '{"ttl": 1e30}')$$);
SELECT pg_temp.err($$SELECT idem_configure_scope('ke_scope', '{"ttl": 1e400}')$$);
SELECT pg_temp.err($$SELECT idem_configure_scope('ke_scope', '{"ttl": -1e400}')$$);
-- a positive number too small for a double (or an interval) is no interval
SELECT pg_temp.err($$SELECT idem_configure_scope('ke_scope', '{"ttl": 1e-400}')$$);
SELECT pg_temp.err($$SELECT idem_configure_scope('ke_scope', '{"ttl": "-1 day"}')$$);
-- a negative part: positive with 30-day months, not in every month
SELECT pg_temp.err($$SELECT idem_configure_scope('ke_scope', '{"ttl": "-1 mon 30 days 23 hours"}')$$);
SELECT pg_temp.err($$SELECT idem_configure_scope('ke_scope', '{"lock_timeout": "1 day -1 hour"}')$$);
SELECT count(*) AS scopes_written FROM idempotency.scopes WHERE scope = 'ke_scope';

-- the limits themselves are accepted, and a key in such a scope expires in range
SELECT ttl, lock_timeout FROM idem_configure_scope('ke_scope_max', '{"ttl": "1000 years", "lock_timeout": 31104000000}');
SELECT outcome, expires_at > now() + interval '999 years' AS far FROM idem_reserve('ke_a', 'ke_scope_max', 'far', '{}');
DELETE FROM idempotency.keys WHERE tenant_id = 'ke_a' AND scope = 'ke_scope_max';
DELETE FROM idempotency.scopes WHERE scope = 'ke_scope_max';
-- whole numbers written with a fraction, as JSON encoders write floats
SELECT retryable_codes, new_keys_burst, max_live_keys
  FROM idem_configure_scope('ke_scope_float', '{"retryable_codes": [503.0, 429.00], "new_keys_per_second": 5.0, "new_keys_burst": 10.0, "max_live_keys": 100.0}');
DELETE FROM idempotency.scopes WHERE scope = 'ke_scope_float';

-- none of the failed calls wrote anything
SELECT count(*) - :rows_before AS new_rows FROM idempotency.keys
 WHERE tenant_id = 'ke_a' AND idem_key NOT IN (repeat('k', 255), 'small', 'k-null-wait');
SELECT idem_key, status, response_code, response_body, recovery_point, completed_at IS NULL AS open
  FROM idempotency.keys WHERE tenant_id = 'ke_a' AND idem_key IN ('done', 'held') ORDER BY 1;
SELECT lock_token = :'tok' AS held_by_same_token FROM idempotency.keys
 WHERE tenant_id = 'ke_a' AND scope = 'orders' AND idem_key = 'held';

-- the errors as psql shows them, with detail and hint
SELECT idem_reserve('ke_a', 'orders', '', fingerprint => sha256('x'));
SELECT idem_complete('ke_a', 'orders', 'done', 200, '{}');
SELECT idem_complete('ke_a', 'orders', 'held', 200, '{}', NULL, '00000000-0000-4000-8000-000000000000');

DELETE FROM idempotency.keys WHERE tenant_id IN ('ke_a', 'ke_size');
