-- Key spraying: a scope's rate of new keys per tenant.  Over it,
-- idem_reserve answers rate_limited (429, retry_after) and writes nothing;
-- other tenants, replays and keys already held are not affected.
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

-- one new key per 1000 seconds, bursts of 3
SELECT scope, new_keys_per_second, new_keys_burst
  FROM idem_configure_scope('rl_scope', '{"new_keys_per_second": 0.001, "new_keys_burst": 3}');

-- tenant A sprays 6 keys: 3 created, then rate_limited with nothing written
SELECT k, outcome, http_status, retry_after BETWEEN 900 AND 1000 AS retry_after_about_1000s
  FROM generate_series(1, 6) AS k,
       LATERAL idem_reserve('rl_a', 'rl_scope', 'spray-' || k, jsonb_build_object('k', k));
SELECT count(*) AS keys_of_a FROM idempotency.keys WHERE tenant_id = 'rl_a';
-- idempotency.stats counts the refusals
SELECT tenant, scope, created, rate_limited FROM idempotency.stats
 WHERE tenant = 'rl_a' AND scope = 'rl_scope';
-- its existing keys still answer: a replay or in_progress is not a new key
SELECT outcome FROM idem_reserve('rl_a', 'rl_scope', 'spray-1', '{"k": 1}');
-- another tenant has its own rate
SELECT k, outcome FROM generate_series(1, 3) AS k,
       LATERAL idem_reserve('rl_b', 'rl_scope', 'b-' || k, jsonb_build_object('k', k));
-- another scope of the same tenant is not limited
SELECT count(*) AS created FROM generate_series(1, 10) AS k,
       LATERAL idem_reserve('rl_a', 'rl_other', 'o-' || k, jsonb_build_object('k', k))
 WHERE outcome = 'created';

-- a rate of 10 a second with a burst of 1: a key within 100 ms of the
-- last one waits (retry_after rounds up to 1 s)
SELECT scope, new_keys_per_second, new_keys_burst
  FROM idem_configure_scope('rl_fast', '{"new_keys_per_second": 10}');
SELECT count(*) FILTER (WHERE outcome = 'created') > 0 AS some_created,
       count(*) FILTER (WHERE outcome = 'rate_limited') > 0 AS some_limited,
       bool_and(outcome <> 'rate_limited' OR retry_after = 1) AS retry_after_1
  FROM generate_series(1, 2000) AS k,
       LATERAL idem_reserve('rl_a', 'rl_fast', 'f-' || k, fingerprint => sha256(k::text::bytea));

-- bad values are refused (22023) and change nothing
SELECT pg_temp.err($$SELECT idem_configure_scope('rl_scope', '{"new_keys_per_second": 0}')$$);
-- below one key in about 12 days the limiter's arithmetic would overflow
-- (1e-13 never limited, 1e-12 with a burst of 11 refused every key)
SELECT pg_temp.err($$SELECT idem_configure_scope('rl_scope', '{"new_keys_per_second": 1e-13, "new_keys_burst": 2}')$$);
SELECT pg_temp.err($$SELECT idem_configure_scope('rl_scope', '{"new_keys_per_second": "10"}')$$);
SELECT pg_temp.err($$SELECT idem_configure_scope('rl_scope', '{"new_keys_burst": 1.5}')$$);
SELECT pg_temp.err($$SELECT idem_configure_scope('rl_scope', '{"new_keys_burst": 0}')$$);
SELECT scope, new_keys_per_second, new_keys_burst FROM idempotency.scopes WHERE scope = 'rl_scope';
-- a changed rate starts the pair over with a full burst under it, so a
-- raised rate lifts a limit in force at once: tenant A, limited for 1000
-- seconds at one key per 1000 s, gets 100 keys in a burst of 1000
SELECT outcome, retry_after BETWEEN 900 AND 1000 AS retry_after_about_1000s
  FROM idem_reserve('rl_a', 'rl_scope', 'before-raise', '{}');
SELECT scope FROM idem_configure_scope('rl_scope', '{"new_keys_per_second": 1000, "new_keys_burst": 1000}');
SELECT count(*) FILTER (WHERE outcome = 'created') AS created
  FROM generate_series(1, 100) AS k,
       LATERAL idem_reserve('rl_a', 'rl_scope', 'raised-' || k, jsonb_build_object('k', k));
-- and a rate lowered again applies from here: a burst of 3, then limited
SELECT scope FROM idem_configure_scope('rl_scope', '{"new_keys_per_second": 0.001, "new_keys_burst": 3}');
SELECT k, outcome, retry_after BETWEEN 900 AND 1000 AS retry_after_about_1000s
  FROM generate_series(1, 4) AS k,
       LATERAL idem_reserve('rl_a', 'rl_scope', 'lowered-' || k, jsonb_build_object('k', k));
-- a burst alone changes the burst of the rate in force
SELECT scope, new_keys_per_second, new_keys_burst FROM idem_configure_scope('rl_scope', '{"new_keys_burst": 5}');
-- a burst without a rate would limit nothing: refused (22023), nothing written
SELECT pg_temp.err($$SELECT idem_configure_scope('rl_norate', '{"new_keys_burst": 5}')$$);
SELECT pg_temp.err($$SELECT idem_configure_scope('rl_scope', '{"new_keys_per_second": null, "new_keys_burst": 5}')$$);
SELECT count(*) AS rl_norate_rows FROM idempotency.scopes WHERE scope = 'rl_norate';
SELECT scope, new_keys_per_second, new_keys_burst FROM idempotency.scopes WHERE scope = 'rl_scope';
-- null lifts the limit, and takes the burst with it
SELECT scope, new_keys_per_second, new_keys_burst FROM idem_configure_scope('rl_scope', '{"new_keys_per_second": null}');
SELECT outcome FROM idem_reserve('rl_a', 'rl_scope', 'after-lift', '{}');

-- the state is soft: past 8,192 limited pairs the table starts over, and
-- every tenant gets its burst again (never fewer keys, at most a burst more)
SELECT scope FROM idem_configure_scope('rl_full', '{"new_keys_per_second": 0.001, "new_keys_burst": 1}');
SELECT k, outcome FROM generate_series(1, 2) AS k,
       LATERAL idem_reserve('rl_first', 'rl_full', 'k' || k, fingerprint => sha256(k::text::bytea));
-- (one transaction per key: each holds its key's lock until it ends)
CREATE TEMP TABLE rl_full_answers (outcome text);
DO $$
BEGIN
    FOR t IN 1..8300 LOOP
        INSERT INTO rl_full_answers
        SELECT outcome FROM idem_reserve('rl_t' || t, 'rl_full', 'k', fingerprint => sha256('k'));
        COMMIT;
    END LOOP;
END
$$;
SELECT count(*) FILTER (WHERE outcome = 'created') AS created_by_others
  FROM rl_full_answers;
SELECT outcome FROM idem_reserve('rl_first', 'rl_full', 'k3', fingerprint => sha256('3'));

-- a quota of live keys: at most 3 unexpired keys per tenant in the scope
SELECT scope, max_live_keys
  FROM idem_configure_scope('q_scope', '{"max_live_keys": 3, "ttl": "1 hour"}');
CREATE TEMP TABLE q_answers AS
SELECT k, r.*
  FROM generate_series(1, 5) AS k,
       LATERAL idem_reserve('q_a', 'q_scope', 'q-' || k, jsonb_build_object('k', k)) AS r;
SELECT k, outcome, http_status, retry_after FROM q_answers ORDER BY k;
SELECT count(*) AS keys_of_q_a FROM idempotency.keys WHERE tenant_id = 'q_a';
-- retries of its keys still answer; another tenant has its own quota
SELECT outcome FROM idem_reserve('q_a', 'q_scope', 'q-1', '{"k": 1}');
SELECT k, outcome FROM generate_series(1, 3) AS k,
       LATERAL idem_reserve('q_b', 'q_scope', 'b-' || k, jsonb_build_object('k', k));
-- completed keys stay live until they expire: retry_after is until the
-- earliest of them expires (the ttl, one hour)
SELECT idem_complete('q_a', 'q_scope', 'q-' || k, 201, '{}', lock_token => lock_token)
  FROM q_answers WHERE k IN (1, 3);
SELECT pg_sleep(1.1);
SELECT outcome, retry_after BETWEEN 3500 AND 3600 AS retry_after_about_1h
  FROM idem_reserve('q_a', 'q_scope', 'q-6', '{"k": 6}');
-- a released key gives its room back (counted again at most once a second)
SELECT idem_release('q_a', 'q_scope', 'q-2', lock_token) FROM q_answers WHERE k = 2;
SELECT pg_sleep(1.1);
SELECT outcome FROM idem_reserve('q_a', 'q_scope', 'q-7', '{"k": 7}');
SELECT outcome FROM idem_reserve('q_a', 'q_scope', 'q-8', '{"k": 8}');
-- an expired key is not live
UPDATE idempotency.keys SET expires_at = now() - interval '1 second'
 WHERE tenant_id = 'q_a' AND idem_key = 'q-1';
SELECT pg_sleep(1.1);
SELECT outcome FROM idem_reserve('q_a', 'q_scope', 'q-9', '{"k": 9}');
SELECT tenant, created, rate_limited FROM idempotency.stats
 WHERE scope = 'q_scope' ORDER BY tenant;
-- bad values are refused (22023) and change nothing; null lifts the quota
SELECT pg_temp.err($$SELECT idem_configure_scope('q_scope', '{"max_live_keys": 0}')$$);
SELECT pg_temp.err($$SELECT idem_configure_scope('q_scope', '{"max_live_keys": 2.5}')$$);
SELECT pg_temp.err($$SELECT idem_configure_scope('q_scope', '{"max_live_keys": "10"}')$$);
SELECT pg_temp.err($$SELECT idem_configure_scope('q_scope', '{"max_live_keys": 1000000001}')$$);
SELECT max_live_keys FROM idempotency.scopes WHERE scope = 'q_scope';
SELECT max_live_keys FROM idem_configure_scope('q_scope', '{"max_live_keys": null}');
SELECT outcome FROM idem_reserve('q_a', 'q_scope', 'q-10', '{"k": 10}');

-- a key the quota refuses uses none of the rate: with a burst of 3 at one
-- key per 100 s and a quota of 1, two refusals at the quota, then the key
-- released: the next key is created (the second of the burst)
SELECT scope FROM idem_configure_scope('q_rated', '{"new_keys_per_second": 0.01, "new_keys_burst": 3, "max_live_keys": 1}');
SELECT k, outcome, retry_after FROM generate_series(1, 3) k,
       LATERAL idem_reserve('q_c', 'q_rated', 'qr-' || k, '{}');
SELECT idem_release('q_c', 'q_rated', 'qr-1', lock_token)
  FROM idempotency.keys WHERE tenant_id = 'q_c' AND idem_key = 'qr-1';
SELECT pg_sleep(1.1);
SELECT outcome FROM idem_reserve('q_c', 'q_rated', 'qr-4', '{}');
SELECT created, rate_limited FROM idempotency.stats WHERE scope = 'q_rated';

-- a new key in a read-only transaction is refused (25006) before it takes
-- the rate: with a burst of 1, the first key in a read-write transaction
-- is then created
SELECT scope FROM idem_configure_scope('q_ro', '{"new_keys_per_second": 0.001, "new_keys_burst": 1}');
BEGIN READ ONLY;
SELECT pg_temp.err($$SELECT idem_reserve('q_d', 'q_ro', 'ro-1', '{}')$$);
ROLLBACK;
SELECT outcome FROM idem_reserve('q_d', 'q_ro', 'ro-2', '{}');
SELECT created, rate_limited FROM idempotency.stats WHERE scope = 'q_ro';

-- values written into idempotency.scopes around idem_configure_scope,
-- outside what it accepts, are refused by the key functions (22023), not
-- computed with (a NaN rate, a burst of 0, a negative quota); nothing is
-- created; set again through the function, the scope works
SELECT scope FROM idem_configure_scope('q_raw', '{"new_keys_per_second": 5}');
UPDATE idempotency.scopes SET new_keys_per_second = 'NaN' WHERE scope = 'q_raw';
SELECT pg_temp.err($$SELECT idem_reserve('q_d', 'q_raw', 'raw-1', '{}')$$);
UPDATE idempotency.scopes SET new_keys_per_second = 5, new_keys_burst = 0 WHERE scope = 'q_raw';
SELECT pg_temp.err($$SELECT idem_reserve('q_d', 'q_raw', 'raw-1', '{}')$$);
UPDATE idempotency.scopes SET new_keys_per_second = NULL, new_keys_burst = NULL, max_live_keys = -1
 WHERE scope = 'q_raw';
SELECT pg_temp.err($$SELECT idem_reserve('q_d', 'q_raw', 'raw-1', '{}')$$);
SELECT count(*) AS raw_keys FROM idempotency.keys WHERE tenant_id = 'q_d' AND scope = 'q_raw';
SELECT scope FROM idem_configure_scope('q_raw', '{"max_live_keys": 10}');
SELECT outcome FROM idem_reserve('q_d', 'q_raw', 'raw-1', '{}');

DELETE FROM idempotency.keys WHERE tenant_id IN ('rl_a', 'rl_b', 'rl_first', 'q_a', 'q_b', 'q_c', 'q_d') OR tenant_id LIKE 'rl\_t%';
DELETE FROM idempotency.scopes WHERE scope IN ('rl_scope', 'rl_fast', 'rl_full', 'q_scope', 'q_rated', 'q_ro', 'q_raw');
