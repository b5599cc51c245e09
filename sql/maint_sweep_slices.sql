-- The scheduled sweep (idem_sweep() without older_than) reads at most
-- sweep_state.pages_per_run pages of the keys table per run, continuing
-- where the last run stopped: its cost does not grow with the table, and
-- the runs still reach every stale key.  Block counts, not time.
SELECT one_row, next_page, pages_per_run FROM idempotency.sweep_state;

UPDATE idempotency.sweep_state SET pages_per_run = 4, next_page = 0;

-- a stale key, 3,000 finished keys, another stale key
INSERT INTO idempotency.keys (tenant_id, scope, idem_key, fingerprint, status,
                              locked_at, expires_at)
VALUES ('msl', 'orders', 'stale-first', sha256('a'), 'processing',
        now() - interval '1 hour', now() + interval '1 day');
INSERT INTO idempotency.keys (tenant_id, scope, idem_key, fingerprint, status,
                              locked_at, completed_at, expires_at,
                              response_code, response_body)
SELECT 'msl', 'orders', 'done-' || g, sha256(g::text::bytea), 'succeeded',
       now() - interval '1 hour', now() - interval '1 hour',
       now() + interval '1 day', 201, '{"ok": true, "padding": "0123456789012345678901234567890123456789"}'
  FROM generate_series(1, 3000) g;
INSERT INTO idempotency.keys (tenant_id, scope, idem_key, fingerprint, status,
                              locked_at, expires_at)
VALUES ('msl', 'orders', 'stale-last', sha256('b'), 'processing',
        now() - interval '1 hour', now() + interval '1 day');
SELECT pg_relation_size('idempotency.keys') / current_setting('block_size')::int > 40
       AS table_has_many_pages;

-- one scheduled run reads a few pages, not the table, and moves the cursor
SELECT pg_stat_force_next_flush();
BEGIN;
SELECT idem_sweep() >= 0 AS ran;
SELECT pg_stat_get_xact_blocks_fetched('idempotency.keys'::regclass) <= 12 AS bounded;
COMMIT;
SELECT next_page FROM idempotency.sweep_state;
SELECT pg_stat_force_next_flush();
BEGIN;
SELECT idem_sweep() >= 0 AS ran;
SELECT pg_stat_get_xact_blocks_fetched('idempotency.keys'::regclass) <= 12 AS bounded;
COMMIT;
SELECT next_page FROM idempotency.sweep_state;

-- the runs go round the whole table: both stale keys are flagged, each once
DO $$
DECLARE
    runs int := pg_catalog.pg_relation_size('idempotency.keys')
                / pg_catalog.current_setting('block_size')::int / 4 + 2;
BEGIN
    FOR i IN 1 .. runs LOOP
        PERFORM idem_sweep();
    END LOOP;
END
$$;
SELECT idem_key, status, needs_reconciliation FROM idempotency.keys
 WHERE tenant_id = 'msl' AND idem_key LIKE 'stale-%' ORDER BY 1;
SELECT count(*) AS flagged FROM idempotency.keys
 WHERE tenant_id = 'msl' AND needs_reconciliation;

-- the cursor goes back to page 0 at the end of the table
SELECT next_page < pg_relation_size('idempotency.keys') / current_setting('block_size')::int
       AS within_table
  FROM idempotency.sweep_state;

-- an operator's idem_sweep(older_than) still reads the whole table
UPDATE idempotency.keys SET needs_reconciliation = false
 WHERE tenant_id = 'msl' AND idem_key LIKE 'stale-%';
SELECT pg_stat_force_next_flush();
BEGIN;
SELECT idem_sweep('10 minutes') AS swept;
SELECT pg_stat_get_xact_blocks_fetched('idempotency.keys'::regclass) > 40 AS whole_table;
COMMIT;

-- idempotency_admin may tune pages_per_run, nothing else
SET ROLE idempotency_admin;
UPDATE idempotency.sweep_state SET pages_per_run = 8;
SELECT pages_per_run FROM idempotency.sweep_state;
UPDATE idempotency.sweep_state SET next_page = 3;
-- (terse: the failing row's cursor depends on what earlier tests left)
\set VERBOSITY terse
UPDATE idempotency.sweep_state SET pages_per_run = 0;
UPDATE idempotency.sweep_state SET pages_per_run = NULL;
\set VERBOSITY default
RESET ROLE;

-- Under a statement_timeout a run stops at two fifths of it (counted from
-- the statement's start, the CALL's for idem_maintain), once it has read
-- one chunk of 256 pages, and moves the cursor to where it stopped:
-- without that, a sweep longer than the timeout was canceled, its flags
-- rolled back and the cursor left where it was, run after run.  Here the
-- statement spends 1.7 s of its 4 asleep before it sweeps (its deadline
-- is 1.6 s), leaving ample time for one chunk, under valgrind too.
INSERT INTO idempotency.keys (tenant_id, scope, idem_key, fingerprint, status,
                              locked_at, completed_at, expires_at,
                              response_code, response_body)
SELECT 'msl', 'orders', 'more-' || g, sha256(g::text::bytea), 'succeeded',
       now() - interval '1 hour', now() - interval '1 hour',
       now() + interval '1 day', 201, '{"ok": true, "padding": "0123456789012345678901234567890123456789"}'
  FROM generate_series(1, 6000) g;
SELECT pg_relation_size('idempotency.keys') / current_setting('block_size')::int > 300
       AS more_than_a_chunk;
UPDATE idempotency.sweep_state SET pages_per_run = 1000000, next_page = 0;
SET statement_timeout = '4s';
SELECT pg_sleep(1.7) IS NOT NULL AS slept, idem_sweep() >= 0 AS ran;
RESET statement_timeout;
SELECT next_page AS one_chunk FROM idempotency.sweep_state;
-- the next run, without a timeout, reads on to the end of the table
SELECT idem_sweep() >= 0 AS ran;
SELECT next_page AS wrapped FROM idempotency.sweep_state;

-- Under a transaction_timeout (17 and later), which ends the session, the
-- same, counted from the transaction's start (before 17 this repeats the
-- statement_timeout case); the code before read the whole slice and
-- moved the cursor back to 0.
UPDATE idempotency.sweep_state SET next_page = 0;
SELECT set_config(CASE WHEN current_setting('server_version_num')::int >= 170000
                       THEN 'transaction_timeout' ELSE 'statement_timeout' END,
                  '4s', false) AS timeout;
SELECT pg_sleep(1.7) IS NOT NULL AS slept, idem_sweep() >= 0 AS ran;
SELECT set_config(CASE WHEN current_setting('server_version_num')::int >= 170000
                       THEN 'transaction_timeout' ELSE 'statement_timeout' END,
                  '0', false) AS timeout;
SELECT next_page AS one_chunk FROM idempotency.sweep_state;

DELETE FROM idempotency.keys WHERE tenant_id = 'msl';
UPDATE idempotency.sweep_state SET pages_per_run = DEFAULT, next_page = 0;
