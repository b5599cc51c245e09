-- Maintenance: the reaper, the stale sweeper, the health and stats views,
-- and scheduling it all with pg_cron.
SET ROLE shop_ops;
\echo '== The operator sets a scope with short timings, so the example needs no waiting: keys kept 2 seconds, reservations stale after 1.'
SELECT scope, ttl, lock_timeout, stale_action
  FROM idem_configure_scope('walk-refunds', '{"ttl": "2 seconds", "lock_timeout": "1 second"}');

\echo '== The application answers and completes three refunds; a fourth is reserved (two-phase: the'
\echo '== reservation commits alone) by a worker that then dies before completing it:'
SET ROLE shop_app;
BEGIN;
SELECT g AS request, r.outcome
  FROM generate_series(1, 3) g,
       LATERAL idem_reserve('walk-maint', 'walk-refunds', 'refund-' || g,
                            jsonb_build_object('amount', g)) r;
SELECT count(idem_complete('walk-maint', 'walk-refunds', 'refund-' || g, 201,
                           jsonb_build_object('refund', g))) AS completed
  FROM generate_series(1, 3) g;
COMMIT;
SELECT outcome FROM idem_reserve('walk-maint', 'walk-refunds', 'refund-stuck', '{"amount": 9}'::jsonb);
SELECT pg_sleep(2.5);

\echo '== idempotency.health is what an operator (or pg_monitor) watches:'
SET ROLE shop_ops;
\x on
SELECT * FROM idempotency.health;
\x off

\echo '== idem_reap() deletes one batch of expired, finished keys (SKIP LOCKED: it never waits for a live request):'
SELECT idem_reap() AS reaped;
\echo '== idem_sweep() flags reservations older than their lock_timeout for reconciliation;'
\echo '== a retry of that key is now answered "stale" (409) until an operator settles it with idem_resolve():'
SELECT idem_sweep() AS swept;
SELECT idem_key, status, needs_reconciliation
  FROM idempotency.keys WHERE tenant_id = 'walk-maint' ORDER BY idem_key;
SET ROLE shop_app;
SELECT outcome, http_status FROM idem_reserve('walk-maint', 'walk-refunds', 'refund-stuck', '{"amount": 9}'::jsonb);
SET ROLE shop_ops;

\echo '== CALL idem_maintain() does all of it (plus outbox leases and retention), committing between batches:'
CALL idem_maintain();

\echo '== idempotency.stats counts per tenant and scope, from shared memory:'
SELECT tenant, scope, created, completed, stale, reaped, swept
  FROM idempotency.stats WHERE tenant = 'walk-maint';

\echo '== The operator asks the payment provider, learns the refund went through, and settles the key:'
SELECT idem_resolve('walk-maint', 'walk-refunds', 'refund-stuck', 201, '{"refund": 9}') AS resolved;
SELECT needs_reconciliation FROM idempotency.health;

\echo '== Schedule it every minute. pg_cron lives in database "postgres" here (cron.database_name), so the'
\echo '== extension cannot schedule from "demo"; its error says exactly what to run, and where:'
\set ON_ERROR_STOP off
SELECT idem_schedule_maintenance();
\set ON_ERROR_STOP on

\echo '== So, in database postgres, as the hint says (as the superuser who installed pg_cron):'
\c postgres
SELECT cron.schedule_in_database('idempotency-maintenance-demo', '* * * * *',
                                 'CALL idempotency.maintain()', 'demo') > 0 AS scheduled;
SELECT jobname, schedule, command, database FROM cron.job
 WHERE jobname = 'idempotency-maintenance-demo';
\echo '== (in the pg_cron database itself, SELECT idem_schedule_maintenance() does this in one call)'
SELECT cron.unschedule('idempotency-maintenance-demo') AS unscheduled;
\c demo

\echo '== Cleaning up the example (as the database owner: no role of the extension may delete keys):'
DELETE FROM idempotency.keys WHERE tenant_id = 'walk-maint';
DELETE FROM idempotency.scopes WHERE scope = 'walk-refunds';
