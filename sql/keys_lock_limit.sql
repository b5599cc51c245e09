-- idempotency.max_keys_per_transaction: each key a transaction holds, and
-- each ordering key it enqueued under, takes a slot of the server's shared
-- lock table until it ends; one transaction may hold only so many (53400),
-- so that a batch cannot leave every other session "out of shared memory".
CREATE FUNCTION pg_temp.err(sql text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    st text;
    msg text;
    detail text;
    hint text;
BEGIN
    EXECUTE sql;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
                            detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
    RETURN st || ' ' || msg || E'\n      detail: ' || coalesce(detail, '(none)')
           || E'\n      hint: ' || coalesce(hint, '(none)');
END
$$;

-- the default: a quarter of the lock table, whose size the server knows
SHOW idempotency.max_keys_per_transaction;
SET idempotency.max_keys_per_transaction = 3;

-- three keys, then a fourth is refused before anything is written, and
-- the transaction's own keys are not counted twice
BEGIN;
SELECT outcome FROM idem_reserve('lk_a', 'orders', 'k1', fingerprint => sha256('1'));
SELECT outcome FROM idem_reserve('lk_a', 'orders', 'k2', fingerprint => sha256('2'));
SELECT outcome FROM idem_reserve('lk_a', 'orders', 'k3', fingerprint => sha256('3'));
SELECT outcome FROM idem_reserve('lk_a', 'orders', 'k1', fingerprint => sha256('1'));
SELECT pg_temp.err($$SELECT idem_reserve('lk_a', 'orders', 'k4', fingerprint => sha256('4'))$$);
-- the refused key's lock was given back: the transaction holds three
SELECT count(*) AS key_locks_held FROM pg_locks
 WHERE locktype = 'advisory' AND objsubid = 18756 AND pid = pg_backend_pid();
-- completing one of them takes no other slot
SELECT idem_complete('lk_a', 'orders', 'k1', 201, '{"id": 1}');
COMMIT;
SELECT idem_key, status FROM idempotency.keys WHERE tenant_id = 'lk_a' ORDER BY idem_key;

-- every transaction starts again from none
BEGIN;
SELECT outcome FROM idem_reserve('lk_a', 'orders', 'k5', fingerprint => sha256('5'));
SELECT outcome FROM idem_reserve('lk_a', 'orders', 'k6', fingerprint => sha256('6'));
SELECT outcome FROM idem_reserve('lk_a', 'orders', 'k7', fingerprint => sha256('7'));
ROLLBACK;

-- a key answered without being reserved (a replay) gives its lock back at
-- once: four replays in one transaction pass
BEGIN;
SELECT outcome FROM idem_reserve('lk_a', 'orders', 'k1', fingerprint => sha256('1'));
SELECT outcome FROM idem_reserve('lk_a', 'orders', 'k1', fingerprint => sha256('1'));
SELECT outcome FROM idem_reserve('lk_a', 'orders', 'k1', fingerprint => sha256('1'));
SELECT outcome FROM idem_reserve('lk_a', 'orders', 'k1', fingerprint => sha256('1'));
ROLLBACK;

-- subtransactions: a rolled-back savepoint's keys are given back, a
-- released one's stay counted
BEGIN;
SELECT outcome FROM idem_reserve('lk_b', 'orders', 's1', fingerprint => sha256('1'));
SAVEPOINT a;
SELECT outcome FROM idem_reserve('lk_b', 'orders', 's2', fingerprint => sha256('2'));
SELECT outcome FROM idem_reserve('lk_b', 'orders', 's3', fingerprint => sha256('3'));
ROLLBACK TO SAVEPOINT a;
SAVEPOINT b;
SELECT outcome FROM idem_reserve('lk_b', 'orders', 's4', fingerprint => sha256('4'));
RELEASE SAVEPOINT b;
SELECT outcome FROM idem_reserve('lk_b', 'orders', 's5', fingerprint => sha256('5'));
SELECT pg_temp.err($$SELECT idem_reserve('lk_b', 'orders', 's6', fingerprint => sha256('6'))$$);
COMMIT;
SELECT idem_key FROM idempotency.keys WHERE tenant_id = 'lk_b' ORDER BY idem_key;

-- ordering keys of outbox_enqueue count too (one per distinct key), and a
-- refused enqueue inserts nothing
BEGIN;
SELECT outcome FROM idem_reserve('lk_c', 'orders', 'o1', fingerprint => sha256('1'));
SELECT outbox_enqueue('lk_c', 'order.created', '{"n": 1}', ordering_key => 'cus_1') > 0 AS enqueued;
SELECT outbox_enqueue('lk_c', 'order.created', '{"n": 2}', ordering_key => 'cus_1') > 0 AS enqueued;
SELECT outbox_enqueue('lk_c', 'order.created', '{"n": 3}', ordering_key => 'cus_2') > 0 AS enqueued;
SELECT pg_temp.err($$SELECT outbox_enqueue('lk_c', 'order.created', '{"n": 4}', ordering_key => 'cus_3')$$);
COMMIT;
SELECT payload->>'n' AS n, ordering_key FROM idempotency.outbox WHERE tenant_id = 'lk_c' ORDER BY id;

-- a cursor's fetch reserves in the subtransaction it is fetched in,
-- whatever the cursor was opened in: a savepoint rolled back gives its
-- fetches' keys back, a released one keeps them, and a fetch that fails
-- (here on the limit) gives back only its own: the keys of the fetches
-- before it stay held and counted (its failure released them with the
-- cursor's resources: another session could reserve them again, and the
-- commit failed with 23505)
BEGIN;
DECLARE c CURSOR FOR
    SELECT g, r.outcome FROM generate_series(1, 10) g,
           LATERAL idem_reserve('lk_f', 'orders', 'c' || g, fingerprint => sha256(g::text::bytea)) r;
SAVEPOINT s;
FETCH 1 FROM c;
ROLLBACK TO SAVEPOINT s;
SELECT count(*) AS key_locks_held FROM pg_locks
 WHERE locktype = 'advisory' AND objsubid = 18756 AND pid = pg_backend_pid();
SAVEPOINT t;
FETCH 2 FROM c;
RELEASE SAVEPOINT t;
SAVEPOINT u;
FETCH 2 FROM c;
ROLLBACK TO SAVEPOINT u;
SELECT count(*) AS key_locks_held FROM pg_locks
 WHERE locktype = 'advisory' AND objsubid = 18756 AND pid = pg_backend_pid();
-- held: answered as the transaction's own
SELECT outcome FROM idem_reserve('lk_f', 'orders', 'c2', fingerprint => sha256('2'));
-- given back with savepoint s: new again
SELECT outcome FROM idem_reserve('lk_f', 'orders', 'c1', fingerprint => sha256('1'));
SELECT left(pg_temp.err($$SELECT idem_reserve('lk_f', 'orders', 'x', fingerprint => sha256('x'))$$), 5) AS sqlstate;
-- at the limit even a replay is refused: a key's row is read under its
-- lock, which the transaction would take
SELECT left(pg_temp.err($$SELECT idem_reserve('lk_a', 'orders', 'k1', fingerprint => sha256('1'))$$), 5) AS sqlstate;
-- but a key the transaction holds is answered
SELECT outcome FROM idem_reserve('lk_f', 'orders', 'c3', fingerprint => sha256('3'));
COMMIT;
SELECT idem_key, status FROM idempotency.keys WHERE tenant_id = 'lk_f' ORDER BY idem_key;

-- 0: no limit
SET idempotency.max_keys_per_transaction = 0;
BEGIN;
SELECT count(*) FROM generate_series(1, 10) g,
       LATERAL idem_reserve('lk_d', 'orders', 'n' || g, fingerprint => sha256(g::text::bytea)) r
 WHERE r.outcome = 'created';
ROLLBACK;
RESET idempotency.max_keys_per_transaction;

-- the default, a quarter of the lock table: max_locks_per_transaction
-- times the server's connection slots (about: background workers and
-- other processes are added by version), here with a batch twice as big
SELECT current_setting('max_locks_per_transaction')::int
       * (current_setting('max_connections')::int
          -- 18 sizes autovacuum by its worker slots
          + coalesce(current_setting('autovacuum_worker_slots', true),
                     current_setting('autovacuum_max_workers'))::int + 1
          + current_setting('max_worker_processes')::int
          + current_setting('max_wal_senders')::int
          + current_setting('max_prepared_transactions')::int) / 4 AS cap \gset
SELECT pg_temp.err(format($$SELECT count(*) FROM generate_series(1, %s) g,
           LATERAL idem_reserve('lk_e', 'orders', 'n' || g, fingerprint => sha256(g::text::bytea)) r$$,
           :cap * 2)) AS batch_err \gset
SELECT left(:'batch_err', 5) AS sqlstate,
       substring(:'batch_err' FROM 'It holds (\d+) keys')::int BETWEEN :cap * 0.95 AND :cap * 1.05
           AS a_quarter_of_the_lock_table,
       :'batch_err' LIKE '%(a quarter of the lock table)%' AS says_so;
SELECT count(*) AS written FROM idempotency.keys WHERE tenant_id = 'lk_e';

-- only a superuser may change it: a tenant's batch cannot lift the bound
CREATE ROLE lk_app;
GRANT idempotency_app TO lk_app;
SET ROLE lk_app;
SELECT pg_temp.err($$SET idempotency.max_keys_per_transaction = 0$$);
RESET ROLE;
DROP ROLE lk_app;

DELETE FROM idempotency.keys WHERE tenant_id LIKE 'lk\_%';
DELETE FROM idempotency.outbox WHERE tenant_id LIKE 'lk\_%';
