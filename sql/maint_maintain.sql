-- idem_maintain: reap in batches, sweep, reclaim outbox leases, purge
-- delivered outbox rows; and the pg_cron helpers without pg_cron here.
\set SHOW_CONTEXT never
CREATE FUNCTION pg_temp.sqlstate_of(stmt text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE stmt;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END
$$;
-- the SQLSTATE and the statement the error's hint says to run
CREATE FUNCTION pg_temp.hinted_statement(stmt text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    hint text;
BEGIN
    EXECUTE stmt;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS hint = PG_EXCEPTION_HINT;
    RETURN SQLSTATE || ': ' || substring(hint FROM ' run: (.*)$');
END
$$;
INSERT INTO idempotency.keys (tenant_id, scope, idem_key, fingerprint, status,
                              locked_at, expires_at)
SELECT 'maint-m', 'orders', 'k' || g, sha256(g::text::bytea), 'succeeded',
       now() - interval '2 hours', now() - interval '1 hour'
  FROM generate_series(1, 2500) g;
INSERT INTO idempotency.keys (tenant_id, scope, idem_key, fingerprint, status,
                              locked_at, expires_at)
VALUES ('maint-m', 'orders', 'stuck', sha256('stuck'::bytea), 'processing',
        now() - interval '1 hour', now() + interval '1 day'),
       ('maint-m', 'orders', 'live', sha256('live'::bytea), 'succeeded',
        now(), now() + interval '1 day');

-- outbox: an expired lease, one on its last attempt, a live lease, old and
-- recent deliveries, a dead letter
INSERT INTO idempotency.outbox (tenant_id, topic, payload, status, attempts,
                                max_attempts, lease_token, leased_by,
                                lease_until, done_at, last_error)
VALUES ('maint-m', 'expired-lease', '{}', 'leased', 1, 5, gen_random_uuid(),
        'w1', now() - interval '1 minute', NULL, NULL),
       ('maint-m', 'last-attempt', '{}', 'leased', 4, 5, gen_random_uuid(),
        'w1', now() - interval '1 minute', NULL, 'timeout'),
       ('maint-m', 'live-lease', '{}', 'leased', 1, 5, gen_random_uuid(),
        'w2', now() + interval '1 minute', NULL, NULL),
       ('maint-m', 'old-done', '{}', 'done', 1, 5, NULL, NULL, NULL,
        now() - interval '8 days', NULL),
       ('maint-m', 'recent-done', '{}', 'done', 1, 5, NULL, NULL, NULL,
        now() - interval '6 days', NULL),
       ('maint-m', 'dead', '{}', 'dead', 5, 5, NULL, NULL, NULL,
        NULL, 'gave up');

-- a small batch makes several transactions
CALL idem_maintain('1 minute', 1000);

SELECT idem_key, status, needs_reconciliation
  FROM idempotency.keys WHERE tenant_id = 'maint-m' ORDER BY 1;
SELECT topic, status, attempts, leased_by, lease_until IS NULL AS lease_cleared,
       last_error
  FROM idempotency.outbox WHERE tenant_id = 'maint-m' ORDER BY topic;

-- retention is a superuser setting; 0 purges every delivered row
SET idempotency.outbox_retention = 0;
CALL idem_maintain();
RESET idempotency.outbox_retention;
SELECT topic, status FROM idempotency.outbox WHERE tenant_id = 'maint-m' ORDER BY topic;

-- the batches committed: each COMMIT ended a transaction of its own, so the
-- procedure refuses to run inside an explicit transaction block
BEGIN;
CALL idem_maintain();
ROLLBACK;
-- and it refuses before it writes anything, although there is a lease to
-- reclaim: the transaction's tuple counters do not move
INSERT INTO idempotency.outbox (tenant_id, topic, payload, status, attempts,
                                max_attempts, lease_token, leased_by, lease_until)
VALUES ('maint-m', 'in-block', '{}', 'leased', 1, 5, gen_random_uuid(), 'w1',
        now() - interval '1 minute');
BEGIN;
SELECT pg_stat_get_xact_tuples_inserted('idempotency.outbox'::regclass)
       + pg_stat_get_xact_tuples_updated('idempotency.outbox'::regclass)
       + pg_stat_get_xact_tuples_updated('idempotency.keys'::regclass) AS writes_before \gset
SAVEPOINT s;
CALL idem_maintain();
ROLLBACK TO SAVEPOINT s;
SELECT pg_stat_get_xact_tuples_inserted('idempotency.outbox'::regclass)
       + pg_stat_get_xact_tuples_updated('idempotency.outbox'::regclass)
       + pg_stat_get_xact_tuples_updated('idempotency.keys'::regclass)
       = :writes_before AS nothing_written;
ROLLBACK;
DELETE FROM idempotency.outbox WHERE tenant_id = 'maint-m' AND topic = 'in-block';

-- a purge reads the rows it deletes (outbox_done_idx), not the delivered
-- rows kept within the retention
INSERT INTO idempotency.outbox (tenant_id, topic, payload, status, attempts,
                                max_attempts, done_at)
SELECT 'maint-p', 'recent', '{"padding": "0123456789012345678901234567890123456789"}',
       'done', 1, 5, now() - interval '1 day'
  FROM generate_series(1, 20000);
INSERT INTO idempotency.outbox (tenant_id, topic, payload, status, attempts,
                                max_attempts, done_at)
SELECT 'maint-p', 'old', '{}', 'done', 1, 5, now() - interval '8 days' - g * interval '1 hour'
  FROM generate_series(1, 3) g;
VACUUM ANALYZE idempotency.outbox;
SELECT pg_stat_force_next_flush();
BEGIN;
SELECT idem_purge_outbox(1000) AS purged;
SELECT pg_relation_size('idempotency.outbox') / current_setting('block_size')::int > 100
           AS many_pages,
       pg_stat_get_xact_blocks_fetched('idempotency.outbox'::regclass) <= 40
           AS reads_what_it_deletes;
COMMIT;
SELECT topic, count(*) FROM idempotency.outbox WHERE tenant_id = 'maint-p'
 GROUP BY topic ORDER BY topic;
DELETE FROM idempotency.outbox WHERE tenant_id = 'maint-p';

-- the time budget holds: a rest between batches ends at the deadline, and
-- no batch starts after it (a run of 1 second with 5-second rests ran 5
-- seconds and reaped a second batch)
INSERT INTO idempotency.keys (tenant_id, scope, idem_key, fingerprint, status,
                              locked_at, expires_at)
SELECT 'maint-b', 'orders', 'k' || g, sha256(g::text::bytea), 'succeeded',
       now() - interval '2 hours', now() - interval '1 hour'
  FROM generate_series(1, 3) g;
SELECT count(*) AS expired_before FROM idempotency.keys WHERE expires_at < now() \gset
SELECT clock_timestamp() AS t0 \gset
CALL idem_maintain('1 second', 1, '5 seconds');
SELECT clock_timestamp() - :'t0' < interval '3 seconds' AS within_budget,
       :expired_before - count(*) AS reaped_one_batch
  FROM idempotency.keys WHERE expires_at < now();
DELETE FROM idempotency.keys WHERE tenant_id = 'maint-b';

-- a statement_timeout shorter than the budget (a database's or role's
-- setting, which the scheduled job inherits) ends the run at four fifths
-- of it instead of canceling it (57014): batches of one key with rests of
-- 300 ms, a budget of a minute, a timeout of a second
INSERT INTO idempotency.keys (tenant_id, scope, idem_key, fingerprint, status,
                              locked_at, expires_at)
SELECT 'maint-s', 'orders', 'k' || g, sha256(g::text::bytea), 'succeeded',
       now() - interval '2 hours', now() - interval '1 hour'
  FROM generate_series(1, 30) g;
SET statement_timeout = '1s';
CALL idem_maintain('1 minute', 1, '300 milliseconds');
RESET statement_timeout;
SELECT count(*) BETWEEN 1 AND 29 AS reaped_some_not_all
  FROM idempotency.keys WHERE tenant_id = 'maint-s';
DELETE FROM idempotency.keys WHERE tenant_id = 'maint-s';
-- a deadline past before the first batch (here a budget of a
-- microsecond; in practice a statement_timeout that the sweep used up):
-- the run succeeds and says it had no time to reap
CALL idem_maintain('1 microsecond');

-- a reap backlog that outlasts the budget does not starve the purge: the
-- two take turns (this run reaps 10 keys a round for about 5 rounds, so
-- expired keys remain, and still purges delivered rows)
INSERT INTO idempotency.keys (tenant_id, scope, idem_key, fingerprint, status,
                              locked_at, expires_at)
SELECT 'maint-t', 'orders', 'k' || g, sha256(g::text::bytea), 'succeeded',
       now() - interval '2 hours', now() - interval '1 hour'
  FROM generate_series(1, 300) g;
INSERT INTO idempotency.outbox (tenant_id, topic, payload, status, attempts,
                                max_attempts, done_at)
SELECT 'maint-t', 'old', '{}', 'done', 1, 5, now() - interval '8 days'
  FROM generate_series(1, 30);
CALL idem_maintain('1 second', 10, '200 milliseconds');
SELECT (SELECT count(*) FROM idempotency.keys WHERE tenant_id = 'maint-t') > 0 AS keys_left_to_reap,
       (SELECT count(*) FROM idempotency.outbox WHERE tenant_id = 'maint-t') < 30 AS purged_meanwhile;
DELETE FROM idempotency.keys WHERE tenant_id = 'maint-t';
DELETE FROM idempotency.outbox WHERE tenant_id = 'maint-t';

-- errors, before anything is done
CALL idem_maintain('0 seconds');
CALL idem_maintain(NULL);
CALL idem_maintain('1 minute', NULL);
CALL idem_maintain('1 minute', 0);
CALL idem_maintain(batch_pause => '-1 second');
CALL idem_maintain(batch_pause => NULL);
SELECT idem_purge_outbox(-1);

-- pg_cron is not installed in this database: the error's hint is the
-- statement to run where it is.  The wording around it depends on whether
-- the server preloads pg_cron (t/050_maint_cron.pl and
-- t/052_stats_restart.pl check both), the statement does not.
SELECT pg_temp.hinted_statement('SELECT idem_schedule_maintenance()');
SELECT pg_temp.hinted_statement($$SELECT idem_schedule_maintenance('*/5 * * * *')$$);
-- a schedule that cannot be one is refused here, before the hint would
-- pass it on to pg_cron's database; the other shapes pg_cron takes pass
SELECT s, pg_temp.sqlstate_of(format('SELECT idem_schedule_maintenance(%L)', s))
  FROM unnest(ARRAY['every minute', '* * * *', '* * * * * *', '', 'soon seconds',
                    '@sometimes', '0 seconds', '60 seconds',
                    '@hourly', ' 0  3 * * 1 ']) AS s;
-- a schedule in seconds passes when pg_cron is 1.5 or later (or not
-- installed for this server: the hint then says to install it), and is
-- refused with 22023 when the server's pg_cron is older
SELECT pg_temp.sqlstate_of($$SELECT idem_schedule_maintenance('30 seconds')$$)
       = CASE WHEN (SELECT (regexp_match(default_version, '^(\d+)\.(\d+)'))::int[] < '{1,5}'
                      FROM pg_available_extensions WHERE name = 'pg_cron')
              THEN '22023' ELSE '55000' END AS seconds_as_the_version_says;
SELECT pg_temp.hinted_statement('SELECT idem_unschedule_maintenance()');
SELECT idem_schedule_maintenance(NULL);
SELECT stmt, pg_temp.sqlstate_of(stmt) FROM (VALUES
    ('CALL idem_maintain(''0 seconds'')'),
    ('CALL idem_maintain(NULL)'),
    ('CALL idem_maintain(''1 minute'', NULL)'),
    ('CALL idem_maintain(''1 minute'', 0)'),
    ('CALL idem_maintain(batch_pause => NULL)'),
    ('SELECT idem_purge_outbox(-1)'),
    ('SELECT idem_schedule_maintenance()'),
    ('SELECT idem_unschedule_maintenance()'),
    ('SELECT idem_schedule_maintenance(NULL)')) AS t(stmt);

DELETE FROM idempotency.keys WHERE tenant_id = 'maint-m';
DELETE FROM idempotency.outbox WHERE tenant_id = 'maint-m';

-- an operator role of its own, with README's grants and no
-- idempotency_admin, runs maintenance; without the schema's USAGE it
-- cannot (idem_maintain calls idempotency.maintain)
CREATE ROLE maint_ops;
GRANT EXECUTE ON PROCEDURE idem_maintain(interval, int, interval),
    idempotency.maintain(interval, int, interval) TO maint_ops;
GRANT EXECUTE ON FUNCTION idempotency.reap(int), idempotency.sweep(interval),
    idempotency.reclaim_leases(), idempotency.purge_outbox(int) TO maint_ops;
SET ROLE maint_ops;
\set VERBOSITY terse
CALL idem_maintain('1 second', 10, '0');
\set VERBOSITY default
RESET ROLE;
GRANT USAGE ON SCHEMA idempotency TO maint_ops;
SET ROLE maint_ops;
CALL idem_maintain('1 second', 10, '0');
RESET ROLE;
REVOKE ALL ON SCHEMA idempotency FROM maint_ops;
REVOKE ALL ON PROCEDURE idem_maintain(interval, int, interval),
    idempotency.maintain(interval, int, interval) FROM maint_ops;
REVOKE ALL ON FUNCTION idempotency.reap(int), idempotency.sweep(interval),
    idempotency.reclaim_leases(), idempotency.purge_outbox(int) FROM maint_ops;
DROP ROLE maint_ops;
-- intervals whose parts have different signs, five days back on any date:
-- refused (22023) before anything runs, as a time_budget over 1000 years is
CALL idem_maintain('-1 year 360 days 1 hour');
CALL idem_maintain('1 second', 10, '-1 year 360 days 1 hour');
CALL idem_maintain('300000 years');
CALL idem_maintain('1 second', 10, '300000 years');
SELECT idem_sweep('300000 years -1 day');
SELECT idem_sweep('-1 year 360 days 1 hour');
-- a schedule that cannot be one is shown cut in the error
SELECT idem_schedule_maintenance(repeat('x', 100000));
