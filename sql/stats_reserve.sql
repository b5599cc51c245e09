-- idempotency.stats counts what idem_reserve, idem_complete and idem_release
-- answer, per tenant and scope: a retry spike is visible from SQL.
-- Each statement below is its own transaction (two-phase use).
SELECT outcome FROM idem_reserve('stats-r', 'orders', 'k1', '{"amount": 1}'::jsonb);
SELECT idem_complete('stats-r', 'orders', 'k1', 201, '{"id": 1}', lock_token => (SELECT lock_token FROM idempotency.keys WHERE tenant_id = 'stats-r' AND scope = 'orders' AND idem_key = 'k1'));
-- a client retrying hard: three replays (spelling of the body aside)
SELECT outcome, http_status FROM idem_reserve('stats-r', 'orders', 'k1', '{"amount": 1}'::jsonb);
SELECT outcome, http_status FROM idem_reserve('stats-r', 'orders', 'k1', '{"amount":1}'::jsonb);
SELECT outcome, http_status FROM idem_reserve('stats-r', 'orders', 'k1', '{"amount": 1.0}'::jsonb);
-- the same key with another body
SELECT outcome, http_status FROM idem_reserve('stats-r', 'orders', 'k1', '{"amount": 2}'::jsonb);
-- a 5xx releases the key; so does idem_release
SELECT outcome FROM idem_reserve('stats-r', 'orders', 'k2', '{}'::jsonb);
SELECT idem_complete('stats-r', 'orders', 'k2', 503, '{}', lock_token => (SELECT lock_token FROM idempotency.keys WHERE tenant_id = 'stats-r' AND scope = 'orders' AND idem_key = 'k2')) IS NULL AS released;
SELECT outcome FROM idem_reserve('stats-r', 'orders', 'k3', '{}'::jsonb);
SELECT idem_release('stats-r', 'orders', 'k3', (SELECT lock_token FROM idempotency.keys WHERE tenant_id = 'stats-r' AND scope = 'orders' AND idem_key = 'k3'));
-- a reservation held by a live attempt, and one whose attempt vanished
SELECT outcome FROM idem_reserve('stats-r', 'refunds', 'k4', '{}'::jsonb);
SELECT outcome, http_status FROM idem_reserve('stats-r', 'refunds', 'k4', '{}'::jsonb);
UPDATE idempotency.keys SET locked_at = now() - interval '1 hour'
 WHERE tenant_id = 'stats-r' AND idem_key = 'k4';
SELECT outcome, http_status FROM idem_reserve('stats-r', 'refunds', 'k4', '{}'::jsonb);
-- and one the sweeper finds first
SELECT outcome FROM idem_reserve('stats-r', 'refunds', 'k5', '{}'::jsonb);
UPDATE idempotency.keys SET locked_at = now() - interval '1 hour'
 WHERE tenant_id = 'stats-r' AND idem_key = 'k5';
SELECT idem_sweep() AS swept;
-- the reaper: expire what is finished
UPDATE idempotency.keys SET expires_at = now() - interval '1 second'
 WHERE tenant_id = 'stats-r' AND status <> 'processing';
SELECT idem_reap() AS reaped;

SELECT * FROM idempotency.stats WHERE tenant = 'stats-r' ORDER BY scope;
-- the retry spike, as an operator would look for it
SELECT tenant, sum(replayed) AS replayed, sum(created) AS created
  FROM idempotency.stats WHERE tenant = 'stats-r' GROUP BY tenant;

DELETE FROM idempotency.keys WHERE tenant_id = 'stats-r';
