-- Reaper and sweeper: what they delete, what they flag, and what they must
-- never touch.  Rows are inserted directly, as idem_reserve would leave them.
CREATE FUNCTION pg_temp.sqlstate_of(stmt text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE stmt;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END
$$;

-- the reaper works across all tenants: start from a table without expired keys
SELECT count(*) AS expired_before
  FROM idempotency.keys
 WHERE expires_at < now() AND status <> 'processing';

-- 7 expired finished keys, and the keys the reaper must keep
INSERT INTO idempotency.keys (tenant_id, scope, idem_key, fingerprint, status,
                              lock_token, locked_at, needs_reconciliation, expires_at)
SELECT tenant, scope, key, sha256(key::bytea), status::idempotency.status,
       gen_random_uuid(), now() - locked_ago::interval, reconcile,
       now() + expires_in::interval
  FROM (VALUES
    -- done-1 expired first, done-5 last
    ('maint-a', 'orders', 'done-1', 'succeeded', '-65 minutes', '2 hours', false),
    ('maint-a', 'orders', 'done-2', 'succeeded', '-64 minutes', '2 hours', false),
    ('maint-a', 'orders', 'done-3', 'succeeded', '-63 minutes', '2 hours', false),
    ('maint-a', 'orders', 'done-4', 'succeeded', '-62 minutes', '2 hours', false),
    ('maint-a', 'orders', 'done-5', 'succeeded', '-61 minutes', '2 hours', false),
    ('maint-b', 'refunds', 'failed-1', 'failed', '-1 minute', '2 hours', false),
    ('maint-b', 'refunds', 'failed-2', 'failed', '-1 minute', '2 hours', false),
    ('maint-a', 'orders', 'live', 'succeeded', '1 hour', '1 minute', false),
    ('maint-a', 'orders', 'expired-processing', 'processing', '-1 hour', '2 hours', false),
    ('maint-a', 'orders', 'expired-reconcile', 'failed', '-1 hour', '2 hours', true)
  ) AS v(tenant, scope, key, status, expires_in, locked_ago, reconcile);

-- one batch at most: oldest expiry first
SELECT idem_reap(3) AS reaped;
SELECT idem_key FROM idempotency.keys WHERE tenant_id = 'maint-a' ORDER BY 1;
SELECT idem_reap() AS reaped;
SELECT idem_reap() AS reaped;
-- unexpired, processing and reconciliation keys are all still there
SELECT tenant_id, idem_key, status FROM idempotency.keys
 WHERE tenant_id LIKE 'maint-%' ORDER BY 1, 2;

-- errors: nothing happens on bad input
SELECT idem_reap(0);
SELECT idem_reap(NULL);
SELECT idem_reap(1000001);

-- Sweeper.  Scope policies: fail (default), takeover, and a short timeout.
INSERT INTO idempotency.scopes (scope, lock_timeout, stale_action) VALUES
    ('maint-fail', '10 minutes', 'fail'),
    ('maint-takeover', '10 minutes', 'takeover');
DELETE FROM idempotency.keys WHERE tenant_id LIKE 'maint-%';
-- (lock age, expiry): maint-unset has no scope row, so
-- idempotency.default_lock_timeout (5min by default) applies
INSERT INTO idempotency.keys (tenant_id, scope, idem_key, fingerprint, status,
                              lock_token, locked_at, expires_at)
SELECT 'maint-a', scope, key, sha256(key::bytea), status::idempotency.status,
       gen_random_uuid(), now() - locked_ago::interval, now() + expires_in::interval
  FROM (VALUES
    ('maint-fail', 'stuck', 'processing', '11 minutes', '1 day'),
    ('maint-fail', 'busy', 'processing', '9 minutes', '1 day'),
    ('maint-fail', 'finished', 'succeeded', '1 hour', '1 day'),
    ('maint-takeover', 'stuck', 'processing', '11 minutes', '1 day'),
    ('maint-takeover', 'abandoned', 'processing', '2 days', '-1 minute'),
    ('maint-unset', 'stuck', 'processing', '6 minutes', '1 day'),
    ('maint-unset', 'busy', 'processing', '4 minutes', '1 day')
  ) AS v(scope, key, status, locked_ago, expires_in);

SELECT idem_sweep() AS swept;
SELECT scope, idem_key, status, needs_reconciliation
  FROM idempotency.keys WHERE tenant_id = 'maint-a' ORDER BY 1, 2;
-- a second sweep finds nothing new
SELECT idem_sweep() AS swept;

-- the GUC default applies to scopes without their own lock_timeout
SET idempotency.default_lock_timeout = '3min';
SELECT idem_sweep() AS swept;
RESET idempotency.default_lock_timeout;
SELECT idem_key, status, needs_reconciliation
  FROM idempotency.keys WHERE tenant_id = 'maint-a' AND scope = 'maint-unset' ORDER BY 1;

-- older_than overrides every scope's lock_timeout (takeover scopes included
-- only once expired: the live one stays for the next attempt)
SELECT idem_sweep('5 minutes') AS swept;
SELECT scope, idem_key, status, needs_reconciliation
  FROM idempotency.keys WHERE tenant_id = 'maint-a' ORDER BY 1, 2;

-- flagged keys wait for an operator: the reaper keeps them past expiry
UPDATE idempotency.keys SET expires_at = now() - interval '1 second'
 WHERE tenant_id = 'maint-a';
SELECT idem_reap() AS reaped;
SELECT scope, idem_key, status, needs_reconciliation
  FROM idempotency.keys WHERE tenant_id = 'maint-a' ORDER BY 1, 2;

-- errors
SELECT idem_sweep('0 seconds');
SELECT idem_sweep('-5 minutes');
SELECT idem_sweep('1000000 years');
SELECT stmt, pg_temp.sqlstate_of(stmt) FROM (VALUES
    ('SELECT idem_reap(0)'),
    ('SELECT idem_reap(NULL)'),
    ('SELECT idem_sweep(''-5 minutes'')'),
    ('SELECT idem_sweep(''1000 years 1 day'')')) AS t(stmt);

DELETE FROM idempotency.keys WHERE tenant_id LIKE 'maint-%';
DELETE FROM idempotency.scopes WHERE scope LIKE 'maint-%';
