-- Maintenance: the reaper, the stale sweeper, the health and stats views,
-- and scheduling it all with pg_cron.
\echo '== Keys live until expires_at (the scope ttl, or idempotency.default_ttl). Three answered requests have expired,'
\echo '== and one two-phase reservation was committed 20 minutes ago by a worker that then died:'
INSERT INTO idempotency.keys (tenant_id, scope, idem_key, fingerprint, status,
                              response_code, locked_at, completed_at, expires_at)
SELECT 'walk-maint', 'payments', 'pay-' || g, sha256(g::text::bytea), 'succeeded',
       201, now() - interval '2 days', now() - interval '2 days', now() - interval '1 day'
  FROM generate_series(1, 3) g;
INSERT INTO idempotency.keys (tenant_id, scope, idem_key, fingerprint, status,
                              lock_token, locked_at, expires_at)
VALUES ('walk-maint', 'payments', 'pay-stuck', sha256('stuck'::bytea), 'processing',
        gen_random_uuid(), now() - interval '20 minutes', now() + interval '1 day');

\echo '== idempotency.health is what an operator (or pg_monitor) watches:'
\x on
SELECT * FROM idempotency.health;
\x off

\echo '== idem_reap() deletes one batch of expired, finished keys (SKIP LOCKED: it never waits for a live request):'
SELECT idem_reap() AS reaped;
\echo '== idem_sweep() flags reservations older than their lock_timeout (default 5min) for reconciliation;'
\echo '== a retry of that key is now answered "stale" (409) until an operator settles it with idem_resolve():'
SELECT idem_sweep() AS swept;
SELECT idem_key, status, needs_reconciliation
  FROM idempotency.keys WHERE tenant_id = 'walk-maint' ORDER BY idem_key;

\echo '== CALL idem_maintain() does all of it (plus outbox leases and retention), committing between batches:'
CALL idem_maintain();

\echo '== idempotency.stats counts per tenant and scope, from shared memory:'
SELECT tenant, scope, reaped, swept FROM idempotency.stats WHERE tenant = 'walk-maint';

\echo '== Schedule it every minute. pg_cron lives in database "postgres" here (cron.database_name), so the'
\echo '== extension cannot schedule from "demo"; its error says exactly what to run, and where:'
\set ON_ERROR_STOP off
SELECT idem_schedule_maintenance();
\set ON_ERROR_STOP on

\echo '== So, in database postgres, as the hint says:'
\c postgres
SELECT cron.schedule_in_database('idempotency-maintenance-demo', '* * * * *',
                                 'CALL public.idem_maintain()', 'demo') > 0 AS scheduled;
SELECT jobname, schedule, command, database FROM cron.job
 WHERE jobname = 'idempotency-maintenance-demo';
\echo '== (in the pg_cron database itself, SELECT idem_schedule_maintenance() does this in one call)'
SELECT cron.unschedule('idempotency-maintenance-demo') AS unscheduled;
\c demo

\echo '== Cleaning up the example:'
DELETE FROM idempotency.keys WHERE tenant_id = 'walk-maint';
