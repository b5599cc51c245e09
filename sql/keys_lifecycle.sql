-- Key lifecycle: every outcome of idem_reserve, every way to finish a key.
-- Columns that change from run to run are shown as booleans.
\set r 'outcome, http_status, response_code, response_body, response_headers, retry_after, recovery_point, lock_token IS NOT NULL AS has_token, expires_at IS NOT NULL AS has_expiry'

-- atomic use: reserve, work and complete in one transaction
BEGIN;
SELECT :r FROM idem_reserve('kl_a', 'orders', 'k-1', '{"amount": 10}'::jsonb);
SELECT idem_complete('kl_a', 'orders', 'k-1', 201, '{"id": 1}', '{"Location": "/orders/1"}');
COMMIT;
-- a retry gets the stored response
SELECT :r FROM idem_reserve('kl_a', 'orders', 'k-1', '{"amount": 10}'::jsonb);
-- same key, another request: mismatch
SELECT :r FROM idem_reserve('kl_a', 'orders', 'k-1', '{"amount": 11}'::jsonb);
-- the same key in another scope, or for another tenant, is another key
SELECT :r FROM idem_reserve('kl_a', 'refunds', 'k-1', '{"amount": 11}'::jsonb);
SELECT :r FROM idem_reserve('kl_b', 'orders', 'k-1', '{"amount": 11}'::jsonb);
SELECT tenant_id, scope, idem_key, status, response_code
  FROM idempotency.keys WHERE tenant_id IN ('kl_a', 'kl_b') ORDER BY 1, 2, 3;

-- a rolled-back attempt leaves nothing: the retry is created
BEGIN;
SELECT outcome FROM idem_reserve('kl_a', 'orders', 'k-rb', '{}'::jsonb);
ROLLBACK;
SELECT count(*) FROM idempotency.keys WHERE tenant_id = 'kl_a' AND idem_key = 'k-rb';
BEGIN;
SELECT outcome FROM idem_reserve('kl_a', 'orders', 'k-rb', '{}'::jsonb);
SELECT idem_complete('kl_a', 'orders', 'k-rb', 200, '{"ok": true}');
COMMIT;

-- 4xx: failed, stored and replayed
BEGIN;
SELECT outcome FROM idem_reserve('kl_a', 'orders', 'k-4xx', '{}'::jsonb);
SELECT idem_complete('kl_a', 'orders', 'k-4xx', 402, '{"error": "card_declined"}');
COMMIT;
SELECT :r FROM idem_reserve('kl_a', 'orders', 'k-4xx', '{}'::jsonb);
-- 3xx: succeeded
BEGIN;
SELECT outcome FROM idem_reserve('kl_a', 'orders', 'k-3xx', '{}'::jsonb);
SELECT idem_complete('kl_a', 'orders', 'k-3xx', 303, NULL, '{"Location": "/orders/9"}');
COMMIT;
SELECT :r FROM idem_reserve('kl_a', 'orders', 'k-3xx', '{}'::jsonb);

-- 5xx: released (NULL), nothing stored, the retry runs afresh
BEGIN;
SELECT outcome FROM idem_reserve('kl_a', 'orders', 'k-5xx', '{}'::jsonb);
SELECT idem_complete('kl_a', 'orders', 'k-5xx', 503, '{"error": "unavailable"}') IS NULL AS released;
COMMIT;
SELECT count(*) FROM idempotency.keys WHERE tenant_id = 'kl_a' AND idem_key = 'k-5xx';
SELECT :r FROM idem_reserve('kl_a', 'orders', 'k-5xx', '{}'::jsonb);
-- the reservation committed: releasing it takes its lock_token (fencing)
SELECT idem_release('kl_a', 'orders', 'k-5xx', (SELECT lock_token FROM idempotency.keys WHERE tenant_id = 'kl_a' AND scope = 'orders' AND idem_key = 'k-5xx'));

-- a scope that caches server errors stores and replays them
SELECT scope, cache_server_errors FROM idem_configure_scope('kl_cached', '{"cache_server_errors": true}');
BEGIN;
SELECT outcome FROM idem_reserve('kl_a', 'kl_cached', 'k-5xx', '{}'::jsonb);
SELECT idem_complete('kl_a', 'kl_cached', 'k-5xx', 500, '{"error": "boom"}');
COMMIT;
SELECT :r FROM idem_reserve('kl_a', 'kl_cached', 'k-5xx', '{}'::jsonb);

-- the precomputed-fingerprint overload
SELECT :r FROM idem_reserve('kl_a', 'orders', 'k-fp', fingerprint => sha256('body-1'));
SELECT idem_complete('kl_a', 'orders', 'k-fp', 200, '{"n": 1}', lock_token => (SELECT lock_token FROM idempotency.keys WHERE tenant_id = 'kl_a' AND scope = 'orders' AND idem_key = 'k-fp'));
SELECT :r FROM idem_reserve('kl_a', 'orders', 'k-fp', fingerprint => sha256('body-1'));
SELECT :r FROM idem_reserve('kl_a', 'orders', 'k-fp', fingerprint => sha256('body-2'));

-- two-phase: the reservation commits alone; a retry within lock_timeout
-- is in_progress with a Retry-After
SELECT lock_token AS tok1 FROM idem_reserve('kl_a', 'pay', 'tp-1', fingerprint => sha256('p')) \gset
SELECT :r FROM idem_reserve('kl_a', 'pay', 'tp-1', fingerprint => sha256('p'));
SELECT idem_checkpoint('kl_a', 'pay', 'tp-1', 'charged', :'tok1');
SELECT status, recovery_point, (SELECT lock_token FROM idempotency.keys WHERE tenant_id = 'kl_a' AND scope = 'pay' AND idem_key = 'tp-1') = :'tok1' AS same_token
  FROM idem_lookup('kl_a', 'pay', 'tp-1');
SELECT idem_complete('kl_a', 'pay', 'tp-1', 201, '{"charge": "ch_1"}', NULL, :'tok1');
SELECT :r FROM idem_reserve('kl_a', 'pay', 'tp-1', fingerprint => sha256('p'));

-- stale, stale_action = fail (the default): flagged for reconciliation
SELECT lock_token AS tok2 FROM idem_reserve('kl_a', 'pay', 'tp-2', fingerprint => sha256('p')) \gset
SELECT idem_checkpoint('kl_a', 'pay', 'tp-2', 'sent-to-bank', :'tok2');
UPDATE idempotency.keys SET locked_at = locked_at - interval '6 minutes'
 WHERE tenant_id = 'kl_a' AND idem_key = 'tp-2';
SELECT :r FROM idem_reserve('kl_a', 'pay', 'tp-2', fingerprint => sha256('p'));
SELECT status, needs_reconciliation FROM idem_lookup('kl_a', 'pay', 'tp-2');
-- still stale while flagged, even with a fresh lock
UPDATE idempotency.keys SET locked_at = now()
 WHERE tenant_id = 'kl_a' AND idem_key = 'tp-2';
SELECT :r FROM idem_reserve('kl_a', 'pay', 'tp-2', fingerprint => sha256('p'));
-- the operator resolves it; retries replay the verdict
SELECT idem_resolve('kl_a', 'pay', 'tp-2', 201, '{"charge": "ch_2"}');
SELECT status, needs_reconciliation FROM idem_lookup('kl_a', 'pay', 'tp-2');
SELECT :r FROM idem_reserve('kl_a', 'pay', 'tp-2', fingerprint => sha256('p'));
-- a late attempt of a flagged key may still finish it (its token is valid)
SELECT lock_token AS tok3 FROM idem_reserve('kl_a', 'pay', 'tp-3', fingerprint => sha256('p')) \gset
UPDATE idempotency.keys SET locked_at = locked_at - interval '6 minutes'
 WHERE tenant_id = 'kl_a' AND idem_key = 'tp-3';
SELECT outcome FROM idem_reserve('kl_a', 'pay', 'tp-3', fingerprint => sha256('p'));
SELECT idem_complete('kl_a', 'pay', 'tp-3', 200, '{}', NULL, :'tok3');
SELECT status, needs_reconciliation FROM idem_lookup('kl_a', 'pay', 'tp-3');
-- idem_resolve with a 5xx releases the key
SELECT outcome FROM idem_reserve('kl_a', 'pay', 'tp-4', fingerprint => sha256('p'));
SELECT idem_resolve('kl_a', 'pay', 'tp-4', 502, NULL) IS NULL AS released;
SELECT count(*) FROM idem_lookup('kl_a', 'pay', 'tp-4');

-- stale, stale_action = takeover: a new lock_token and the last recovery point
SELECT scope, lock_timeout, stale_action
  FROM idem_configure_scope('kl_saga', '{"lock_timeout": "30 seconds", "stale_action": "takeover"}');
SELECT lock_token AS old FROM idem_reserve('kl_a', 'kl_saga', 'ts-1', fingerprint => sha256('s')) \gset
SELECT idem_checkpoint('kl_a', 'kl_saga', 'ts-1', 'step-2', :'old');
SELECT :r FROM idem_reserve('kl_a', 'kl_saga', 'ts-1', fingerprint => sha256('s'));
UPDATE idempotency.keys SET locked_at = locked_at - interval '31 seconds'
 WHERE tenant_id = 'kl_a' AND idem_key = 'ts-1';
SELECT lock_token AS new, outcome, recovery_point, lock_token <> :'old' AS new_token
  FROM idem_reserve('kl_a', 'kl_saga', 'ts-1', fingerprint => sha256('s')) \gset
\echo :outcome :recovery_point :new_token
-- the new holder's lock is fresh: in_progress again
SELECT outcome, retry_after FROM idem_reserve('kl_a', 'kl_saga', 'ts-1', fingerprint => sha256('s'));
-- fencing: the old attempt can neither checkpoint, release nor complete
\set VERBOSITY terse
SELECT idem_checkpoint('kl_a', 'kl_saga', 'ts-1', 'step-3', :'old');
SELECT idem_release('kl_a', 'kl_saga', 'ts-1', :'old');
SELECT idem_complete('kl_a', 'kl_saga', 'ts-1', 200, '{"by": "old"}', NULL, :'old');
\set VERBOSITY default
SELECT status, recovery_point, response_body, (SELECT lock_token FROM idempotency.keys WHERE tenant_id = 'kl_a' AND scope = 'kl_saga' AND idem_key = 'ts-1') = :'new' AS new_holds
  FROM idem_lookup('kl_a', 'kl_saga', 'ts-1');
SELECT idem_complete('kl_a', 'kl_saga', 'ts-1', 200, '{"by": "new"}', NULL, :'new');
SELECT :r FROM idem_reserve('kl_a', 'kl_saga', 'ts-1', fingerprint => sha256('s'));

-- release with the right token gives the key up: the retry is created
SELECT lock_token AS rel FROM idem_reserve('kl_a', 'pay', 'tr-1', fingerprint => sha256('r')) \gset
SELECT idem_release('kl_a', 'pay', 'tr-1', :'rel');
SELECT outcome FROM idem_reserve('kl_a', 'pay', 'tr-1', fingerprint => sha256('r2'));

-- TTL: after expires_at the same key is a new request (even with another body)
BEGIN;
SELECT outcome FROM idem_reserve('kl_a', 'orders', 'k-ttl', '{"v": 1}'::jsonb);
SELECT idem_complete('kl_a', 'orders', 'k-ttl', 200, '{"v": 1}');
COMMIT;
UPDATE idempotency.keys SET expires_at = now() - interval '1 second'
 WHERE tenant_id = 'kl_a' AND idem_key = 'k-ttl';
SELECT :r FROM idem_reserve('kl_a', 'orders', 'k-ttl', '{"v": 2}'::jsonb);
SELECT status, response_code, needs_reconciliation, expires_at > now() AS renewed
  FROM idem_lookup('kl_a', 'orders', 'k-ttl');
-- a processing key is not renewed by expiry: the stale rules apply
UPDATE idempotency.keys SET expires_at = now() - interval '1 second'
 WHERE tenant_id = 'kl_a' AND idem_key = 'k-ttl';
SELECT outcome FROM idem_reserve('kl_a', 'orders', 'k-ttl', '{"v": 2}'::jsonb);

-- ttl: the argument, else the scope's ttl, else idempotency.default_ttl
SET idempotency.default_ttl = '2h';
SELECT outcome FROM idem_reserve('kl_a', 'orders', 'ttl-guc', fingerprint => sha256('t'));
SELECT outcome FROM idem_reserve('kl_a', 'orders', 'ttl-arg', ttl => '10 minutes', fingerprint => sha256('t'));
SELECT scope, ttl FROM idem_configure_scope('kl_ttl', '{"ttl": 3600}');
SELECT outcome FROM idem_reserve('kl_a', 'kl_ttl', 'ttl-scope', fingerprint => sha256('t'));
SELECT outcome FROM idem_reserve('kl_a', 'kl_ttl', 'ttl-both', ttl => '5 minutes', fingerprint => sha256('t'));
RESET idempotency.default_ttl;
SELECT idem_key, expires_at - created_at AS ttl
  FROM idempotency.keys WHERE tenant_id = 'kl_a' AND idem_key LIKE 'ttl-%' ORDER BY 1;

-- lock timeout: the scope's, else idempotency.default_lock_timeout
SET idempotency.default_lock_timeout = '20s';
SELECT outcome FROM idem_reserve('kl_a', 'orders', 'lt-1', fingerprint => sha256('l'));
UPDATE idempotency.keys SET locked_at = locked_at - interval '15 seconds'
 WHERE tenant_id = 'kl_a' AND idem_key = 'lt-1';
SELECT outcome, retry_after FROM idem_reserve('kl_a', 'orders', 'lt-1', fingerprint => sha256('l'));
UPDATE idempotency.keys SET locked_at = locked_at - interval '10 seconds'
 WHERE tenant_id = 'kl_a' AND idem_key = 'lt-1';
SELECT outcome FROM idem_reserve('kl_a', 'orders', 'lt-1', fingerprint => sha256('l'));
RESET idempotency.default_lock_timeout;

-- wait on a committed two-phase reservation gives up with in_progress
SELECT outcome FROM idem_reserve('kl_a', 'orders', 'w-1', fingerprint => sha256('w'));
SELECT outcome, retry_after FROM idem_reserve('kl_a', 'orders', 'w-1', wait => '50 milliseconds', fingerprint => sha256('w'));

-- a second reserve of a key the same transaction holds: in_progress
BEGIN;
SELECT outcome FROM idem_reserve('kl_a', 'orders', 'same-xact', fingerprint => sha256('x'));
SELECT outcome FROM idem_reserve('kl_a', 'orders', 'same-xact', fingerprint => sha256('x'));
-- ...at once with a wait too: the transaction cannot finish while it waits
SELECT clock_timestamp() AS t0 \gset
SELECT outcome FROM idem_reserve('kl_a', 'orders', 'same-xact', wait => '10 seconds', fingerprint => sha256('x'));
SELECT clock_timestamp() - :'t0' < interval '5 seconds' AS answered_without_waiting;
SELECT idem_complete('kl_a', 'orders', 'same-xact', 200, '{}');
COMMIT;
-- ...and once it is past its lock_timeout: still in_progress, the
-- transaction's own reservation neither taken over (a new token) nor
-- flagged, and the first token completes it
SELECT scope FROM idem_configure_scope('kl_short_take', '{"lock_timeout": "200 milliseconds", "stale_action": "takeover"}');
SELECT scope FROM idem_configure_scope('kl_short_fail', '{"lock_timeout": "200 milliseconds", "stale_action": "fail"}');
BEGIN;
SELECT lock_token AS own_take FROM idem_reserve('kl_a', 'kl_short_take', 'own-late', fingerprint => sha256('o')) \gset
SELECT lock_token AS own_fail FROM idem_reserve('kl_a', 'kl_short_fail', 'own-late', fingerprint => sha256('o')) \gset
SELECT pg_sleep(0.3);
SELECT v.scope, r.outcome, r.retry_after, r.lock_token IS NULL AS no_token
  FROM (VALUES ('kl_short_take'), ('kl_short_fail')) v(scope),
       LATERAL idem_reserve('kl_a', v.scope, 'own-late', fingerprint => sha256('o')) r;
SELECT scope, status, needs_reconciliation, lock_token IN (:'own_take', :'own_fail') AS first_token
  FROM idempotency.keys WHERE tenant_id = 'kl_a' AND idem_key = 'own-late' ORDER BY scope;
SELECT idem_complete('kl_a', 'kl_short_take', 'own-late', 200, '{}', lock_token => :'own_take');
SELECT idem_complete('kl_a', 'kl_short_fail', 'own-late', 200, '{}', lock_token => :'own_fail');
COMMIT;
DELETE FROM idempotency.scopes WHERE scope IN ('kl_short_take', 'kl_short_fail');

-- completion is a HOT update: no index covers what it changes
SELECT outcome FROM idem_reserve('kl_a', 'orders', 'hot-1', fingerprint => sha256('h'));
SELECT pg_stat_force_next_flush();
SELECT n_tup_upd AS upd0, n_tup_hot_upd AS hot0 FROM pg_stat_user_tables
 WHERE relid = 'idempotency.keys'::regclass \gset
SELECT idem_complete('kl_a', 'orders', 'hot-1', 200, '{}', lock_token => (SELECT lock_token FROM idempotency.keys WHERE tenant_id = 'kl_a' AND scope = 'orders' AND idem_key = 'hot-1'));
SELECT pg_stat_force_next_flush();
SELECT n_tup_upd - :upd0 AS updates, n_tup_hot_upd - :hot0 AS hot_updates
  FROM pg_stat_user_tables WHERE relid = 'idempotency.keys'::regclass;

-- idem_lookup of a missing key is empty
SELECT count(*) FROM idem_lookup('kl_a', 'orders', 'no-such-key');

DELETE FROM idempotency.keys WHERE tenant_id IN ('kl_a', 'kl_b');
DELETE FROM idempotency.scopes WHERE scope LIKE 'kl\_%';
