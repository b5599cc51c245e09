-- idempotency.stats (shared-memory counters) and idempotency.health.
-- Counters are cluster-wide: look only at this file's tenants.
CREATE FUNCTION pg_temp.sqlstate_of(stmt text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE stmt;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END
$$;

SELECT idem_stats_reset();
SELECT count(*) AS entries_after_reset FROM idempotency.stats;

-- the reaper and the sweeper count per (tenant, scope)
INSERT INTO idempotency.keys (tenant_id, scope, idem_key, fingerprint, status,
                              locked_at, expires_at)
SELECT 'stats-' || t, s, 'k' || g, sha256(g::text::bytea), 'succeeded',
       now() - interval '2 hours', now() - interval '1 hour'
  FROM generate_series(1, 3) g, (VALUES ('a'), ('b')) AS t(t),
       (VALUES ('orders'), ('refunds')) AS s(s)
 WHERE t <> 'b' OR s = 'orders';
INSERT INTO idempotency.keys (tenant_id, scope, idem_key, fingerprint, status,
                              locked_at, expires_at)
VALUES ('stats-a', 'orders', 'stuck', sha256('stuck'::bytea), 'processing',
        now() - interval '1 hour', now() + interval '1 day');
SELECT idem_reap() AS reaped;
SELECT idem_sweep() AS swept;
SELECT * FROM idempotency.stats WHERE tenant LIKE 'stats-%' ORDER BY 1, 2;
-- counters accumulate
INSERT INTO idempotency.keys (tenant_id, scope, idem_key, fingerprint, status,
                              locked_at, expires_at)
VALUES ('stats-b', 'orders', 'again', sha256('again'::bytea), 'failed',
        now(), now() - interval '1 second');
SELECT idem_reap() AS reaped;
SELECT tenant, scope, reaped FROM idempotency.stats
 WHERE tenant LIKE 'stats-%' ORDER BY 1, 2;

-- health: one stuck reservation flagged for reconciliation, a live one,
-- outbox depth and dead letters
INSERT INTO idempotency.keys (tenant_id, scope, idem_key, fingerprint, status,
                              locked_at, expires_at)
VALUES ('stats-a', 'orders', 'working', sha256('working'::bytea), 'processing',
        now() - interval '10 seconds', now() + interval '1 day'),
       ('stats-a', 'orders', 'hung', sha256('hung'::bytea), 'processing',
        now() - interval '1 hour', now() + interval '1 day'),
       ('stats-a', 'orders', 'old', sha256('old'::bytea), 'succeeded',
        now() - interval '1 hour', now() - interval '1 minute');
INSERT INTO idempotency.outbox (tenant_id, topic, payload, status, attempts,
                                max_attempts, available_at, lease_until)
VALUES ('stats-a', 'mail', '{}', 'pending', 0, 5, now() - interval '90 seconds', NULL),
       ('stats-a', 'mail', '{}', 'pending', 0, 5, now() - interval '10 seconds', NULL),
       ('stats-a', 'mail', '{}', 'pending', 0, 5, now() + interval '1 hour', NULL),
       ('stats-a', 'mail', '{}', 'leased', 1, 5, now(), now() + interval '30 seconds'),
       ('stats-a', 'mail', '{}', 'dead', 5, 5, now(), NULL);
-- this file's rows are the only ones in the tables
SELECT count(*) FROM idempotency.keys WHERE tenant_id NOT LIKE 'stats-%';
SELECT count(*) FROM idempotency.outbox WHERE tenant_id NOT LIKE 'stats-%';
SELECT processing,
       oldest_processing_age >= interval '1 hour' AS oldest_processing_hour,
       stale_processing,
       needs_reconciliation,
       expired_keys,
       outbox_pending,
       outbox_oldest_pending_age BETWEEN interval '90 seconds' AND interval '1 hour'
           AS oldest_pending_90s,
       outbox_leased,
       outbox_dead
  FROM idempotency.health;
-- a reservation in atomic use writes its row when it is completed or its
-- transaction commits: until then health shows it by its key lock, aged
-- from the start of the transaction holding it (now() here)
SELECT reservations_held, oldest_held_age IS NULL AS none_held FROM idempotency.health;
BEGIN;
SELECT outcome FROM idem_reserve('stats-h', 'orders', 'held-1', '{"n": 1}');
SELECT outcome FROM idem_reserve('stats-h', 'orders', 'held-2', '{"n": 2}');
SELECT processing, reservations_held, oldest_held_age = interval '0' AS held_since_xact_start
  FROM idempotency.health;
SELECT idem_complete('stats-h', 'orders', 'held-2', 201, '{}');
-- a completed key's lock is held to the end of its transaction too
SELECT reservations_held FROM idempotency.health;
ROLLBACK;
SELECT reservations_held FROM idempotency.health;
-- many keys held: the lock table is read once, not again for every key
-- held (a join back to pg_locks, rescanned per key, took a second for
-- 6,000 keys); the plan reads pg_lock_status() in one scan, run once
BEGIN;
SELECT count(*) AS reserved
  FROM generate_series(1, 200) g,
       idem_reserve('stats-h', 'orders', 'many-' || g, '{}') r
 WHERE r.outcome = 'created';
CREATE FUNCTION pg_temp.lock_scans(OUT scans int, OUT runs int) LANGUAGE plpgsql AS $$
DECLARE
    plan jsonb;
BEGIN
    EXECUTE 'EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF, FORMAT JSON)'
            ' SELECT * FROM idempotency.health' INTO plan;
    SELECT count(*), sum((n ->> 'Actual Loops')::int)
      INTO scans, runs
      FROM jsonb_path_query(plan, 'strict $.**') n
     WHERE jsonb_typeof(n) = 'object'
       AND n ->> 'Function Name' = 'pg_lock_status';
END
$$;
SELECT * FROM pg_temp.lock_scans();
SELECT reservations_held FROM idempotency.health;
ROLLBACK;
-- a holder that does not report its activity is counted without an age
SET track_activities = off;
BEGIN;
SELECT outcome FROM idem_reserve('stats-h', 'orders', 'held-3', '{"n": 3}');
SELECT reservations_held, oldest_held_age IS NULL AS no_age FROM idempotency.health;
ROLLBACK;
RESET track_activities;
-- a row whose lease ran out two hours ago (its worker died) is due again:
-- its wait counts from the end of the lease
INSERT INTO idempotency.outbox (tenant_id, topic, payload, status, attempts,
                                max_attempts, available_at, lease_until, lease_token)
VALUES ('stats-a', 'abandoned', '{}', 'leased', 1, 5, now() - interval '2 hours',
        now() - interval '2 hours', gen_random_uuid());
SELECT outbox_oldest_pending_age >= interval '2 hours' AS abandoned_lease_counts
  FROM idempotency.health;
-- and it is an expired lease, not a row leased by a live worker (the
-- running lease of the setup is)
SELECT outbox_leased, outbox_expired_leases FROM idempotency.health;
DELETE FROM idempotency.outbox WHERE tenant_id = 'stats-a' AND topic = 'abandoned';

-- the outbox's figures come from its partial indexes: they cost what the
-- backlog holds, not the delivered rows kept for outbox_retention
INSERT INTO idempotency.outbox (tenant_id, topic, payload, status, attempts,
                                max_attempts, available_at, done_at)
SELECT 'stats-a', 'mail', '{"padding": "0123456789012345678901234567890123456789"}',
       'done', 1, 5, now() - interval '1 hour', now() - interval '1 hour'
  FROM generate_series(1, 20000);
VACUUM ANALYZE idempotency.outbox;
SELECT pg_stat_force_next_flush();
BEGIN;
SELECT outbox_pending, outbox_leased, outbox_dead FROM idempotency.health;
SELECT pg_relation_size('idempotency.outbox') / current_setting('block_size')::int > 100
           AS many_pages,
       pg_stat_get_xact_blocks_fetched('idempotency.outbox'::regclass) <= 40
           AS backlog_only;
COMMIT;
DELETE FROM idempotency.outbox WHERE tenant_id = 'stats-a' AND status = 'done';

-- privileges: tables, stats and health are closed to PUBLIC, admin functions
-- are not executable by PUBLIC; pg_monitor may read stats and health
CREATE ROLE stats_plain;
CREATE ROLE stats_monitor IN ROLE pg_monitor;
CREATE ROLE stats_ops IN ROLE idempotency_admin;
-- run a statement as a role and undo whatever it did: 'ok' or the SQLSTATE
CREATE FUNCTION pg_temp.try_as(r text, stmt text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('role', r, true);
    EXECUTE stmt;
    RAISE EXCEPTION 'ok: undo';
EXCEPTION WHEN OTHERS THEN
    RETURN CASE WHEN SQLERRM = 'ok: undo' THEN 'ok' ELSE SQLSTATE END;
END
$$;
-- (stats_ops gets 2D000 for CALL here only because try_as is a function:
-- CALL idem_maintain() must be a statement of its own, as below)
SELECT r AS role, f AS call, pg_temp.try_as(r, f) AS result
  FROM (VALUES ('stats_plain'), ('stats_monitor'), ('stats_ops')) AS roles(r),
       (VALUES ('SELECT idem_reap()'),
               ('SELECT idem_sweep()'),
               ('SELECT idem_reclaim_leases()'),
               ('SELECT idem_purge_outbox()'),
               ('SELECT idem_schedule_maintenance()'),
               ('SELECT idem_unschedule_maintenance()'),
               ('SELECT idem_stats_reset()'),
               ('SELECT count(*) FROM idempotency.stats'),
               ('SELECT count(*) FROM idempotency.health'),
               ('SELECT count(*) FROM idempotency.keys'),
               ('CALL idem_maintain()')) AS calls(f)
 ORDER BY 1, 2;
-- each call's role ended with it
SELECT current_user = session_user AS own_role_again;
-- a granted operator really runs the procedure (it needs no SECURITY
-- DEFINER itself: the functions it calls are)
SET ROLE stats_ops;
CALL idem_maintain();
RESET ROLE;
SELECT count(*) AS expired_left FROM idempotency.keys
 WHERE tenant_id LIKE 'stats-%' AND expires_at < now();
SET ROLE stats_plain;
CALL idem_maintain();
SELECT * FROM idempotency.stats;
RESET ROLE;
SELECT has_function_privilege('public', 'idem_maintain(interval, int, interval)', 'EXECUTE')
    AS public_may_maintain;

-- reset zeroes everything
SELECT idem_stats_reset();
SELECT count(*) AS entries_after_reset FROM idempotency.stats;

DELETE FROM idempotency.keys WHERE tenant_id LIKE 'stats-%';
DELETE FROM idempotency.outbox WHERE tenant_id LIKE 'stats-%';
DROP ROLE stats_plain, stats_monitor, stats_ops;
