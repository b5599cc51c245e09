-- A key reserved and completed in one transaction is written once: the
-- reservation is the key's lock until idem_complete inserts the finished
-- row.  A reservation the transaction does not finish is written as
-- "processing" when something needs its row and at the latest when the
-- transaction commits or prepares, so the two-phase flow sees what it
-- always did.  Subtransactions that wrote the row and roll back leave the
-- reservation unwritten again.
CREATE FUNCTION pg_temp.err(sql text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    st text;
    msg text;
BEGIN
    EXECUTE sql;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
    RETURN st || ' ' || msg;
END
$$;
-- the writes this transaction made to idempotency.keys so far
CREATE FUNCTION pg_temp.key_writes(OUT inserted bigint, OUT updated bigint)
LANGUAGE sql AS $$
    SELECT n_tup_ins, n_tup_upd FROM pg_catalog.pg_stat_xact_user_tables
     WHERE relid = 'idempotency.keys'::pg_catalog.regclass
$$;
CREATE FUNCTION pg_temp.row_of(k text) RETURNS text
LANGUAGE sql AS $$
    SELECT status || ' ' || coalesce(response_code::text, '-') || ' '
           || coalesce(recovery_point, '-')
      FROM idempotency.keys WHERE tenant_id = 'wo' AND scope = 'orders' AND idem_key = k
$$;

-- atomic use: one INSERT, no UPDATE
BEGIN;
SELECT outcome FROM idem_reserve('wo', 'orders', 'atomic', '{"n": 1}'::jsonb);
SELECT * FROM pg_temp.key_writes();
SELECT idem_complete('wo', 'orders', 'atomic', 201, '{"id": 1}', '{"Location": "/o/1"}');
SELECT * FROM pg_temp.key_writes();
COMMIT;
SELECT pg_temp.row_of('atomic');
SELECT outcome, response_code, response_body, response_headers
  FROM idem_reserve('wo', 'orders', 'atomic', '{"n": 1}'::jsonb);
-- the finished row has what a reservation completed in two steps has
SELECT lock_token IS NOT NULL AS token, locked_at = created_at AS locked_at,
       completed_at >= created_at AS completed_at, expires_at > now() AS expires_at,
       needs_reconciliation, fingerprint = idem_fingerprint('{"n": 1}') AS fingerprint
  FROM idempotency.keys WHERE tenant_id = 'wo' AND idem_key = 'atomic';

-- two-phase: the reservation commits as processing, with the token it returned
SELECT lock_token AS tok FROM idem_reserve('wo', 'orders', 'two-phase', '{"n": 2}'::jsonb) \gset
SELECT pg_temp.row_of('two-phase'), lock_token = :'tok' AS same_token
  FROM idempotency.keys WHERE tenant_id = 'wo' AND idem_key = 'two-phase';
SELECT idem_complete('wo', 'orders', 'two-phase', 200, '{}', lock_token => :'tok');

-- a completion rolled back to a savepoint: the reservation commits processing
BEGIN;
SELECT outcome FROM idem_reserve('wo', 'orders', 'savepoint', '{"n": 3}'::jsonb);
SAVEPOINT s1;
SELECT idem_complete('wo', 'orders', 'savepoint', 201, '{}');
ROLLBACK TO SAVEPOINT s1;
COMMIT;
SELECT pg_temp.row_of('savepoint');
-- the same in a nested savepoint released into an outer one rolled back
BEGIN;
SELECT outcome FROM idem_reserve('wo', 'orders', 'nested', '{"n": 4}'::jsonb);
SAVEPOINT outer_sp;
SAVEPOINT inner_sp;
SELECT idem_complete('wo', 'orders', 'nested', 201, '{}');
RELEASE SAVEPOINT inner_sp;
ROLLBACK TO SAVEPOINT outer_sp;
SELECT idem_complete('wo', 'orders', 'nested', 409, '{"error": "conflict"}');
COMMIT;
SELECT pg_temp.row_of('nested');
-- a release (5xx) rolled back to a savepoint keeps the reservation
BEGIN;
SELECT outcome FROM idem_reserve('wo', 'orders', 'released', '{"n": 5}'::jsonb);
SAVEPOINT s1;
SELECT idem_complete('wo', 'orders', 'released', 503, '{}') IS NULL AS released;
SELECT count(*) AS rows_after_release FROM idempotency.keys WHERE tenant_id = 'wo' AND idem_key = 'released';
ROLLBACK TO SAVEPOINT s1;
COMMIT;
SELECT pg_temp.row_of('released');
-- a reservation made in a savepoint rolled back is gone, lock and all
BEGIN;
SAVEPOINT s1;
SELECT outcome FROM idem_reserve('wo', 'orders', 'gone', '{"n": 6}'::jsonb);
ROLLBACK TO SAVEPOINT s1;
COMMIT;
SELECT count(*) AS rows_gone FROM idempotency.keys WHERE tenant_id = 'wo' AND idem_key = 'gone';

-- the transaction's own reservation, read back before it is finished
BEGIN;
SELECT outcome FROM idem_reserve('wo', 'orders', 'own', '{"n": 7}'::jsonb);
SELECT status FROM idem_lookup('wo', 'orders', 'own');
SELECT outcome, http_status FROM idem_reserve('wo', 'orders', 'own', '{"n": 7}'::jsonb);
SELECT idem_checkpoint('wo', 'orders', 'own', 'step-1');
SELECT idem_complete('wo', 'orders', 'own', 201, '{}');
COMMIT;
SELECT pg_temp.row_of('own');
-- checkpointed, then committed unfinished
BEGIN;
SELECT outcome FROM idem_reserve('wo', 'orders', 'checkpointed', '{"n": 8}'::jsonb);
SELECT idem_checkpoint('wo', 'orders', 'checkpointed', 'charge-sent');
COMMIT;
SELECT pg_temp.row_of('checkpointed');
-- released without a response in the reserving transaction: nothing left
BEGIN;
SELECT outcome FROM idem_reserve('wo', 'orders', 'given-up', '{"n": 9}'::jsonb);
SELECT idem_release('wo', 'orders', 'given-up');
COMMIT;
SELECT count(*) AS rows_given_up FROM idempotency.keys WHERE tenant_id = 'wo' AND idem_key = 'given-up';
-- a wrong token is refused as ever, before anything is written
BEGIN;
SELECT outcome FROM idem_reserve('wo', 'orders', 'fenced', '{"n": 10}'::jsonb);
SELECT pg_temp.err($$SELECT idem_complete('wo', 'orders', 'fenced', 201, '{}', lock_token => '00000000-0000-4000-8000-000000000000')$$);
ROLLBACK;

-- a procedure that commits inside: the reservation is written at that commit
CREATE PROCEDURE pg_temp.reserve_and_commit() LANGUAGE plpgsql AS $$
BEGIN
    PERFORM idem_reserve('wo', 'orders', 'in-procedure', '{"n": 11}'::jsonb);
    COMMIT;
    PERFORM idem_reserve('wo', 'orders', 'in-procedure-2', '{"n": 12}'::jsonb);
    PERFORM idem_complete('wo', 'orders', 'in-procedure-2', 201, '{}');
END
$$;
CALL pg_temp.reserve_and_commit();
SELECT pg_temp.row_of('in-procedure'), pg_temp.row_of('in-procedure-2');

-- a read-only transaction cannot reserve a new key, as when the row was
-- written at once (and a replay needs no write)
BEGIN TRANSACTION READ ONLY;
SELECT pg_temp.err($$SELECT idem_reserve('wo', 'orders', 'read-only', '{"n": 13}'::jsonb)$$);
SELECT outcome FROM idem_reserve('wo', 'orders', 'atomic', '{"n": 1}'::jsonb);
COMMIT;

-- stats count each completion once
SELECT created, replayed, completed, released FROM idempotency.stats
 WHERE tenant = 'wo' AND scope = 'orders';
