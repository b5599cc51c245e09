-- Reliability of the key functions (issue 10), in one session: a takeover
-- renews the key's ttl, ttl and wait are bounded, a ttl that lands in the
-- past is refused, locked_at is the time of the call and not the start of
-- its transaction, and a committed two-phase reservation is fenced by its
-- lock_token.  Columns that change from run to run are shown as booleans.
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
    RETURN st || ' ' || msg || coalesce(E'\n      detail: ' || nullif(detail, ''), '')
           || E'\n      hint: ' || coalesce(nullif(hint, ''), '(none)');
END
$$;
CREATE FUNCTION pg_temp.token(t text, s text, k text) RETURNS uuid
LANGUAGE sql AS $$
    SELECT lock_token FROM idempotency.keys
     WHERE tenant_id = t AND scope = s AND idem_key = k
$$;
\set r 'outcome, http_status, response_code, response_body, retry_after, recovery_point, lock_token IS NOT NULL AS has_token, expires_at IS NOT NULL AS has_expiry'

--
-- Time.  One wait of 2.1 seconds serves every check that needs time to
-- pass: the two-phase reservations below are made before it.
--
-- takeover scope: keys live 1 second, a reservation is stale after 2
SELECT scope, ttl, lock_timeout, stale_action
  FROM idem_configure_scope('kr_take', '{"ttl": "1 second", "lock_timeout": "2 seconds", "stale_action": "takeover"}');
-- a fail scope whose reservations are stale after 2 seconds
SELECT scope, lock_timeout, stale_action
  FROM idem_configure_scope('kr_short', '{"lock_timeout": "2 seconds"}');
-- two-phase reservations (each commits alone); their attempts vanish
SELECT lock_token AS tk1, expires_at AS tk1_exp
  FROM idem_reserve('kr_a', 'kr_take', 'tk-1', fingerprint => sha256('t1')) \gset
SELECT idem_checkpoint('kr_a', 'kr_take', 'tk-1', 'step-1', :'tk1');
SELECT lock_token AS tk2 FROM idem_reserve('kr_a', 'kr_take', 'tk-2', fingerprint => sha256('t2')) \gset
SELECT lock_token AS cp1 FROM idem_reserve('kr_a', 'kr_short', 'cp-1', fingerprint => sha256('c')) \gset

-- a long transaction: the reservation it makes late is locked at the time
-- of the call, not at the start of the transaction (now())
BEGIN;
SELECT pg_sleep(2.1);
SELECT :r FROM idem_reserve('kr_a', 'kr_short', 'late-1', ttl => '1 hour', fingerprint => sha256('l'));
SELECT locked_at >= now() + interval '2.1 seconds' AS locked_at_is_call_time,
       created_at = locked_at AS created_at_too,
       expires_at - locked_at AS ttl
  FROM idem_lookup('kr_a', 'kr_short', 'late-1');
-- a checkpoint renews the lock to the time of the call too
SELECT idem_checkpoint('kr_a', 'kr_short', 'cp-1', 'step-2', :'cp1');
SELECT recovery_point, locked_at >= now() + interval '2.1 seconds' AS locked_at_is_call_time
  FROM idem_lookup('kr_a', 'kr_short', 'cp-1');
COMMIT;
-- so a retry right after the commit finds both attempts alive, not stale
-- (a lock dated from the transaction's start would be 2.1 seconds old,
-- past the scope's lock_timeout)
SELECT outcome, http_status FROM idem_reserve('kr_a', 'kr_short', 'late-1', fingerprint => sha256('l'));
SELECT outcome, http_status FROM idem_reserve('kr_a', 'kr_short', 'cp-1', fingerprint => sha256('c'));
SELECT idem_key, status, needs_reconciliation FROM idem_lookup('kr_a', 'kr_short', 'late-1')
UNION ALL
SELECT idem_key, status, needs_reconciliation FROM idem_lookup('kr_a', 'kr_short', 'cp-1');

-- a takeover renews the ttl.  tk-1 is stale (2.1 s > lock_timeout) and
-- past its expires_at (ttl 1 s): the takeover gets a new token, the last
-- recovery point, and a new expires_at, the scope's ttl from now
SELECT :r, lock_token <> :'tk1' AS new_token, expires_at > :'tk1_exp' AS expiry_moved,
       expires_at > now() AS expiry_in_future
  FROM idem_reserve('kr_a', 'kr_take', 'tk-1', fingerprint => sha256('t1'));
SELECT status, recovery_point, needs_reconciliation, locked_at > :'tk1_exp' AS relocked,
       expires_at - locked_at AS ttl, expires_at > :'tk1_exp' AS expiry_moved
  FROM idem_lookup('kr_a', 'kr_take', 'tk-1');
-- tk-2: taken over with an explicit ttl, completed with the new token;
-- every retry replays it (a takeover that kept the old, past expires_at
-- left a finished key that had already expired: the retry was "created"
-- and the request ran twice)
SELECT lock_token AS tk2new, outcome, lock_token <> :'tk2' AS new_token
  FROM idem_reserve('kr_a', 'kr_take', 'tk-2', ttl => '1 hour', fingerprint => sha256('t2')) \gset
\echo :outcome :new_token
SELECT idem_complete('kr_a', 'kr_take', 'tk-2', 201, '{"charge": "ch_2"}', NULL, :'tk2new');
SELECT :r FROM idem_reserve('kr_a', 'kr_take', 'tk-2', fingerprint => sha256('t2'));
SELECT :r FROM idem_reserve('kr_a', 'kr_take', 'tk-2', fingerprint => sha256('t2'));
SELECT status, response_code, expires_at > now() + interval '59 minutes' AS kept_an_hour
  FROM idem_lookup('kr_a', 'kr_take', 'tk-2');
-- the superseded attempt is fenced out
SELECT pg_temp.err(format('SELECT idem_complete(%L, %L, %L, 200, %L, NULL, %L)',
                          'kr_a', 'kr_take', 'tk-2', '{}', :'tk2'));
-- tk-3: reserved 3 hours ago, taken over with a ttl of an hour, completed
-- two hours after the takeover (past its new expires_at): kept an hour from
-- its completion, the ttl counted from the takeover (from the first
-- reservation it was kept four)
SELECT outcome FROM idem_reserve('kr_a', 'kr_take', 'tk-3', fingerprint => sha256('t3'));
UPDATE idempotency.keys SET created_at = now() - interval '3 hours',
       locked_at = now() - interval '3 hours', expires_at = now() - interval '2 hours'
 WHERE tenant_id = 'kr_a' AND idem_key = 'tk-3';
SELECT lock_token AS tk3new, outcome
  FROM idem_reserve('kr_a', 'kr_take', 'tk-3', ttl => '1 hour', fingerprint => sha256('t3')) \gset
\echo :outcome
UPDATE idempotency.keys SET created_at = created_at - interval '2 hours',
       locked_at = locked_at - interval '2 hours', expires_at = expires_at - interval '2 hours'
 WHERE tenant_id = 'kr_a' AND idem_key = 'tk-3';
SELECT idem_complete('kr_a', 'kr_take', 'tk-3', 201, '{}', NULL, :'tk3new');
SELECT status, expires_at - completed_at BETWEEN interval '59 minutes' AND interval '61 minutes' AS kept_an_hour
  FROM idem_lookup('kr_a', 'kr_take', 'tk-3');
-- fl-1: flagged for reconciliation by a retry while its attempt seemed
-- gone, then checkpointed by that attempt: alive, so unflagged, and the
-- next retry is in_progress; the attempt completes it
SELECT scope FROM idem_configure_scope('kr_flag', '{"lock_timeout": "1 hour", "stale_action": "fail"}');
SELECT lock_token AS fl1 FROM idem_reserve('kr_a', 'kr_flag', 'fl-1', fingerprint => sha256('f')) \gset
UPDATE idempotency.keys SET locked_at = now() - interval '2 hours'
 WHERE tenant_id = 'kr_a' AND idem_key = 'fl-1';
SELECT outcome FROM idem_reserve('kr_a', 'kr_flag', 'fl-1', fingerprint => sha256('f'));
SELECT needs_reconciliation FROM idem_lookup('kr_a', 'kr_flag', 'fl-1');
SELECT idem_checkpoint('kr_a', 'kr_flag', 'fl-1', 'step-9', :'fl1');
SELECT needs_reconciliation, recovery_point FROM idem_lookup('kr_a', 'kr_flag', 'fl-1');
SELECT outcome FROM idem_reserve('kr_a', 'kr_flag', 'fl-1', fingerprint => sha256('f'));
SELECT idem_complete('kr_a', 'kr_flag', 'fl-1', 201, '{}', NULL, :'fl1');

--
-- Bounds on ttl and wait (22023, with a hint), checked before anything is
-- written.  The lengths are computed without overflowing: 100000000 years
-- used to wrap around to a negative length, 50000000 years to a positive
-- one (then accepted, or "timestamp out of range").
--
SELECT count(*) AS rows_before FROM idempotency.keys WHERE tenant_id = 'kr_a' \gset
-- (each call on a key of its own, and a statement_timeout: a wait accepted
-- by mistake on a key in progress would otherwise block for ever)
SET statement_timeout = '20s';
SELECT pg_temp.err($$SELECT idem_reserve('kr_a', 'orders', 'b-1', ttl => '100000000 years', fingerprint => sha256('b'))$$);
SELECT pg_temp.err($$SELECT idem_reserve('kr_a', 'orders', 'b-2', ttl => '50000000 years', fingerprint => sha256('b'))$$);
SELECT pg_temp.err($$SELECT idem_reserve('kr_a', 'orders', 'b-3', ttl => '-100000000 years', fingerprint => sha256('b'))$$);
SELECT pg_temp.err($$SELECT idem_reserve('kr_a', 'orders', 'b-4', ttl => '365001 days', fingerprint => sha256('b'))$$);
SELECT pg_temp.err($$SELECT idem_reserve('kr_a', 'orders', 'b-5', wait => '100000000 years', fingerprint => sha256('b'))$$);
SELECT pg_temp.err($$SELECT idem_reserve('kr_a', 'orders', 'b-6', wait => '50000000 years', fingerprint => sha256('b'))$$);
SELECT pg_temp.err($$SELECT idem_reserve('kr_a', 'orders', 'b-7', wait => '1 day 1 second', fingerprint => sha256('b'))$$);
-- a ttl positive when a month counts 30 days, that still ends in the past:
-- 100 years back is at least 36524 days, 36100 days forward
SELECT interval '-100 years 36100 days' > interval '0' AS looks_positive;
SELECT pg_temp.err($$SELECT idem_reserve('kr_a', 'orders', 'b-8', ttl => '-100 years 36100 days', fingerprint => sha256('b'))$$);
RESET statement_timeout;
SELECT count(*) - :rows_before AS new_rows FROM idempotency.keys WHERE tenant_id = 'kr_a';
-- the limits themselves are accepted; just past 1000 years is not
SELECT outcome, expires_at > now() + interval '1000 years' - interval '1 minute' AS far
  FROM idem_reserve('kr_a', 'orders', 'b-max', ttl => '1000 years', wait => '1 day', fingerprint => sha256('b'));
SELECT pg_temp.err($$SELECT idem_reserve('kr_a', 'orders', 'b-9', ttl => '1000 years 1 day', fingerprint => sha256('b'))$$);

--
-- Fencing: a two-phase reservation, committed by its own transaction, is
-- written only with its lock_token.
--
SELECT lock_token AS ft FROM idem_reserve('kr_a', 'orders', 'fence-1', fingerprint => sha256('f')) \gset
-- without the token: 55006 for every write, the 5xx release included
SELECT pg_temp.err($$SELECT idem_complete('kr_a', 'orders', 'fence-1', 200, '{"by": "intruder"}')$$);
SELECT pg_temp.err($$SELECT idem_complete('kr_a', 'orders', 'fence-1', 503, '{}')$$);
SELECT pg_temp.err($$SELECT idem_checkpoint('kr_a', 'orders', 'fence-1', 'intruder')$$);
SELECT pg_temp.err($$SELECT idem_release('kr_a', 'orders', 'fence-1')$$);
-- nor in a later transaction block of the same session
BEGIN;
SELECT pg_temp.err($$SELECT idem_complete('kr_a', 'orders', 'fence-1', 200, '{"by": "intruder"}')$$);
COMMIT;
-- the row is unchanged
SELECT status, recovery_point, response_code, response_body, needs_reconciliation,
       pg_temp.token('kr_a', 'orders', 'fence-1') = :'ft' AS same_token
  FROM idem_lookup('kr_a', 'orders', 'fence-1');
SELECT outcome FROM idem_reserve('kr_a', 'orders', 'fence-1', fingerprint => sha256('f'));
-- with the token: checkpoint and complete
SELECT idem_checkpoint('kr_a', 'orders', 'fence-1', 'charged', :'ft');
SELECT idem_complete('kr_a', 'orders', 'fence-1', 201, '{"by": "holder"}', NULL, :'ft');
SELECT :r FROM idem_reserve('kr_a', 'orders', 'fence-1', fingerprint => sha256('f'));

-- inside the reserving transaction no token is needed
BEGIN;
SELECT outcome FROM idem_reserve('kr_a', 'orders', 'fence-2', fingerprint => sha256('f'));
SELECT idem_checkpoint('kr_a', 'orders', 'fence-2', 'step-1');
SELECT idem_complete('kr_a', 'orders', 'fence-2', 200, '{"by": "holder"}');
COMMIT;
BEGIN;
SELECT outcome FROM idem_reserve('kr_a', 'orders', 'fence-3', fingerprint => sha256('f'));
SELECT idem_release('kr_a', 'orders', 'fence-3');
COMMIT;
-- nor for a reservation made in a savepoint that was released
BEGIN;
SAVEPOINT a;
SELECT outcome FROM idem_reserve('kr_a', 'orders', 'fence-4', fingerprint => sha256('f'));
RELEASE SAVEPOINT a;
SELECT idem_complete('kr_a', 'orders', 'fence-4', 200, '{"by": "holder"}');
COMMIT;
SELECT idem_key, status, response_body FROM idempotency.keys
 WHERE tenant_id = 'kr_a' AND idem_key IN ('fence-2', 'fence-3', 'fence-4') ORDER BY 1;

-- a reservation rolled back with its savepoint is gone: P0002, and the
-- key can be reserved again in the same transaction
BEGIN;
SAVEPOINT a;
SELECT outcome FROM idem_reserve('kr_a', 'orders', 'fence-5', fingerprint => sha256('f'));
ROLLBACK TO SAVEPOINT a;
SELECT count(*) FROM idem_lookup('kr_a', 'orders', 'fence-5');
SELECT pg_temp.err($$SELECT idem_complete('kr_a', 'orders', 'fence-5', 200, '{}')$$);
SELECT pg_temp.err($$SELECT idem_checkpoint('kr_a', 'orders', 'fence-5', 'x')$$);
SELECT pg_temp.err($$SELECT idem_release('kr_a', 'orders', 'fence-5')$$);
-- nested: a savepoint released inside one rolled back
SAVEPOINT b;
SAVEPOINT c;
SELECT outcome FROM idem_reserve('kr_a', 'orders', 'fence-6', fingerprint => sha256('f'));
RELEASE SAVEPOINT c;
ROLLBACK TO SAVEPOINT b;
SELECT pg_temp.err($$SELECT idem_complete('kr_a', 'orders', 'fence-6', 200, '{}')$$);
SELECT outcome FROM idem_reserve('kr_a', 'orders', 'fence-5', fingerprint => sha256('f'));
SELECT idem_complete('kr_a', 'orders', 'fence-5', 200, '{"by": "second"}');
COMMIT;
SELECT idem_key, status, response_body FROM idempotency.keys
 WHERE tenant_id = 'kr_a' AND idem_key IN ('fence-5', 'fence-6') ORDER BY 1;

--
-- A wait answers as of its end: a committed reservation that turns stale
-- while a retry waits for it is answered stale (fail) or taken over
-- (takeover) then, not in_progress with a retry_after already past; one
-- still at work is answered with retry_after counted from the answer.
--
SELECT scope FROM idem_configure_scope('kr_wfail', '{"lock_timeout": "1 second"}');
SELECT scope FROM idem_configure_scope('kr_wtake', '{"lock_timeout": "1 second", "stale_action": "takeover"}');
SELECT scope FROM idem_configure_scope('kr_wlong', '{"lock_timeout": "10 seconds"}');
SELECT outcome FROM idem_reserve('kr_a', 'kr_wfail', 'w-1', fingerprint => sha256('w'));
SELECT clock_timestamp() AS t0 \gset
SELECT outcome, http_status, clock_timestamp() - :'t0' < interval '3 seconds' AS before_the_wait_ran_out
  FROM idem_reserve('kr_a', 'kr_wfail', 'w-1', wait => '4 seconds', fingerprint => sha256('w'));
SELECT status, needs_reconciliation FROM idem_lookup('kr_a', 'kr_wfail', 'w-1');
SELECT lock_token AS w2 FROM idem_reserve('kr_a', 'kr_wtake', 'w-2', fingerprint => sha256('w')) \gset
SELECT outcome, lock_token <> :'w2' AS new_token
  FROM idem_reserve('kr_a', 'kr_wtake', 'w-2', wait => '4 seconds', fingerprint => sha256('w'));
SELECT outcome FROM idem_reserve('kr_a', 'kr_wlong', 'w-3', fingerprint => sha256('w'));
SELECT outcome, retry_after BETWEEN 1 AND 9 AS counted_from_the_answer
  FROM idem_reserve('kr_a', 'kr_wlong', 'w-3', wait => '1.5 seconds', fingerprint => sha256('w'));
-- a flagged key's own attempt may still end it: completing with its token
-- stores the response and clears the flag, releasing frees the key
SELECT lock_token AS w4 FROM idem_reserve('kr_a', 'kr_wfail', 'w-4', fingerprint => sha256('w')) \gset
SELECT lock_token AS w5 FROM idem_reserve('kr_a', 'kr_wfail', 'w-5', fingerprint => sha256('w')) \gset
SELECT pg_sleep(1.1);
SELECT outcome FROM idem_reserve('kr_a', 'kr_wfail', 'w-4', fingerprint => sha256('w'));
SELECT outcome FROM idem_reserve('kr_a', 'kr_wfail', 'w-5', fingerprint => sha256('w'));
SELECT idem_complete('kr_a', 'kr_wfail', 'w-4', 201, '{"id": 4}', lock_token => :'w4');
SELECT count(*) AS released FROM (SELECT idem_release('kr_a', 'kr_wfail', 'w-5', :'w5')) r;
SELECT idem_key, status, needs_reconciliation FROM idem_lookup('kr_a', 'kr_wfail', 'w-4');
SELECT count(*) AS w5_rows FROM idem_lookup('kr_a', 'kr_wfail', 'w-5');
SELECT outcome, response_code FROM idem_reserve('kr_a', 'kr_wfail', 'w-4', fingerprint => sha256('w'));

-- a transaction made read-only after its reservation: completing,
-- checkpointing or releasing that reservation writes, so each is 25006,
-- although the row is not in the table yet; the reservation itself, made
-- before READ ONLY, is written at commit, as a row inserted before it is
BEGIN;
SELECT outcome FROM idem_reserve('kr_a', 'kr_ro', 'ro-1', fingerprint => sha256('r'));
SET TRANSACTION READ ONLY;
SAVEPOINT s;
SELECT idem_complete('kr_a', 'kr_ro', 'ro-1', 201, '{"id": 1}');
ROLLBACK TO s;
SELECT idem_checkpoint('kr_a', 'kr_ro', 'ro-1', 'charged');
ROLLBACK TO s;
SELECT idem_release('kr_a', 'kr_ro', 'ro-1');
ROLLBACK TO s;
COMMIT;
SELECT status, recovery_point, response_code FROM idem_lookup('kr_a', 'kr_ro', 'ro-1');

-- a key finished after its ttl ran out is kept a ttl from when it
-- finished: stored expired, the reaper would delete it at once and the
-- client's retry would run the request again
SELECT scope FROM idem_configure_scope('kr_exp', '{"ttl": "1 second", "lock_timeout": "1 second"}');
-- two-phase, completed late with its token
SELECT lock_token AS e1 FROM idem_reserve('kr_a', 'kr_exp', 'e-1', fingerprint => sha256('e')) \gset
SELECT pg_sleep(1.2);
SELECT idem_complete('kr_a', 'kr_exp', 'e-1', 201, '{"charge": "ch_1"}', lock_token => :'e1');
SELECT idem_reap() >= 0 AS reap_ran;
SELECT outcome, response_body FROM idem_reserve('kr_a', 'kr_exp', 'e-1', fingerprint => sha256('e'));
-- atomic, in a transaction that outlasted the ttl
BEGIN;
SELECT outcome FROM idem_reserve('kr_a', 'kr_exp', 'e-2', fingerprint => sha256('e'));
SELECT pg_sleep(1.2);
SELECT idem_complete('kr_a', 'kr_exp', 'e-2', 201, '{"charge": "ch_2"}');
COMMIT;
SELECT idem_reap() >= 0 AS reap_ran;
SELECT outcome, response_body FROM idem_reserve('kr_a', 'kr_exp', 'e-2', fingerprint => sha256('e'));
-- flagged for reconciliation, resolved by an operator after the ttl
SELECT lock_token AS e3 FROM idem_reserve('kr_a', 'kr_exp', 'e-3', fingerprint => sha256('e')) \gset
SELECT pg_sleep(1.2);
SELECT outcome FROM idem_reserve('kr_a', 'kr_exp', 'e-3', fingerprint => sha256('e'));
SELECT idem_resolve('kr_a', 'kr_exp', 'e-3', 201, '{"charge": "ch_3"}');
SELECT idem_reap() >= 0 AS reap_ran;
SELECT outcome, response_body FROM idem_reserve('kr_a', 'kr_exp', 'e-3', fingerprint => sha256('e'));

-- a long transaction that reserves keys and rolls each back to a
-- savepoint, or rolls back subtransactions while topics wait for their
-- NOTIFY, keeps no memory for what it rolled back (about 190 bytes a key,
-- and a copy of the topics per abort, before)
CREATE FUNCTION pg_temp.xact_bytes() RETURNS bigint LANGUAGE sql AS $$
    SELECT sum(used_bytes)::bigint FROM pg_backend_memory_contexts
     WHERE name = 'TopTransactionContext' $$;
CREATE FUNCTION pg_temp.rolled_back_reserves(n int) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1..n LOOP
        BEGIN
            PERFORM idem_reserve('kr_a', 'kr_mem', 'm-' || i, '{"a": 1}'::jsonb);
            RAISE SQLSTATE 'P0001';
        EXCEPTION WHEN raise_exception THEN NULL;
        END;
    END LOOP;
END $$;
CREATE FUNCTION pg_temp.aborted_subxacts(n int) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1..n LOOP
        BEGIN
            PERFORM 1 / 0;
        EXCEPTION WHEN division_by_zero THEN NULL;
        END;
    END LOOP;
END $$;
BEGIN;
SELECT pg_temp.rolled_back_reserves(200);
SELECT pg_temp.xact_bytes() AS before \gset
SELECT pg_temp.rolled_back_reserves(3000);
SELECT pg_temp.xact_bytes() - :before < 65536 AS reserves_rolled_back_keep_no_memory;
SELECT count(outbox_enqueue('kr_a', 'kr-topic-' || g, '{}')) FROM generate_series(1, 20) g;
SELECT pg_temp.aborted_subxacts(200);
SELECT pg_temp.xact_bytes() AS before \gset
SELECT pg_temp.aborted_subxacts(3000);
SELECT pg_temp.xact_bytes() - :before < 65536 AS aborts_keep_no_memory;
ROLLBACK;

DELETE FROM idempotency.keys WHERE tenant_id = 'kr_a';
DELETE FROM idempotency.scopes WHERE scope LIKE 'kr\_%';
