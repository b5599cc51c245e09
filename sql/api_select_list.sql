-- Functions read column by column in a select list.  PostgreSQL calls a
-- function returning a composite once for each column read from it:
-- SELECT (idem_reserve(...)).* makes nine calls for one row.  They are one
-- request, and the row is the first call's answer, whole.
SELECT idem_stats_reset();

-- in autocommit: created, with its lock_token, and no http_status of 409
SELECT (idem_reserve('sl_a', 'sl', 'k-star', '{"amount": 1}')).*
\gset star_
-- (\gset leaves the variables of NULL columns unset)
SELECT :'star_outcome' AS outcome, :{?star_http_status} AS http_status_set,
       :{?star_retry_after} AS retry_after_set, :'star_lock_token' <> '' AS has_token;
-- the reservation committed with that token, which completes it
SELECT status, lock_token = :'star_lock_token' AS same_token
  FROM idempotency.keys WHERE tenant_id = 'sl_a' AND idem_key = 'k-star';
SELECT idem_complete('sl_a', 'sl', 'k-star', 201, '{"id": 1}', lock_token => :'star_lock_token');
SELECT outcome, response_code FROM idem_reserve('sl_a', 'sl', 'k-star', '{"amount": 1}');
-- one request counted: created once, then the replay above
SELECT created, in_progress, replayed FROM idempotency.stats
 WHERE tenant = 'sl_a' AND scope = 'sl';

-- the same in a transaction (atomic use), through named columns
BEGIN;
SELECT (idem_reserve('sl_a', 'sl', 'k-cols', '{}')).outcome,
       (idem_reserve('sl_a', 'sl', 'k-cols', '{}')).http_status,
       (idem_reserve('sl_a', 'sl', 'k-cols', '{}')).lock_token IS NOT NULL AS has_token;
-- a second statement is another call of the key this transaction holds:
-- in_progress, as documented, without a token
SELECT outcome, lock_token IS NULL AS no_token FROM idem_reserve('sl_a', 'sl', 'k-cols', '{}');
SELECT idem_complete('sl_a', 'sl', 'k-cols', 200, '{"ok": true}');
COMMIT;
SELECT outcome, response_code FROM idem_reserve('sl_a', 'sl', 'k-cols', '{}');

-- two keys in one row, each whole
BEGIN;
SELECT (idem_reserve('sl_a', 'sl', 'k-two-1', '{}')).outcome AS first,
       (idem_reserve('sl_a', 'sl', 'k-two-1', '{}')).lock_token IS NOT NULL AS first_token,
       (idem_reserve('sl_a', 'sl', 'k-two-2', '{}')).outcome AS second,
       (idem_reserve('sl_a', 'sl', 'k-two-2', '{}')).lock_token IS NOT NULL AS second_token;
ROLLBACK;

-- the same key on several rows of one query: the first row holds it, the
-- others are other requests and answer in_progress (each row whole)
BEGIN;
SELECT g, (idem_reserve('sl_a', 'sl', 'k-rows', '{}')).outcome,
       (idem_reserve('sl_a', 'sl', 'k-rows', '{}')).lock_token IS NOT NULL AS has_token
  FROM generate_series(1, 3) AS g;
ROLLBACK;
BEGIN;
SELECT g, r.outcome, r.lock_token IS NOT NULL AS has_token
  FROM generate_series(1, 3) AS g,
       LATERAL idem_reserve('sl_a', 'sl', 'k-lateral-' || (g / 2), '{}') AS r
 ORDER BY g;
ROLLBACK;

-- another request body for the same key in the same row: a mismatch
BEGIN;
SELECT (idem_reserve('sl_a', 'sl', 'k-body', '{"a": 1}')).outcome AS first,
       (idem_reserve('sl_a', 'sl', 'k-body', '{"a": 2}')).outcome AS second;
ROLLBACK;

-- another call of the extension between the columns ends the request:
-- the later columns are a second call, in_progress
BEGIN;
SELECT (idem_reserve('sl_a', 'sl', 'k-between', '{}')).outcome AS first,
       outbox_enqueue('sl_a', 'sl.topic', '{}') > 0 AS enqueued,
       (idem_reserve('sl_a', 'sl', 'k-between', '{}')).outcome AS after;
ROLLBACK;

-- released in the same row: the later column is a new reservation
BEGIN;
SELECT (idem_reserve('sl_a', 'sl', 'k-released', '{}')).outcome AS first,
       idem_release('sl_a', 'sl', 'k-released') IS NULL AS released,
       (idem_reserve('sl_a', 'sl', 'k-released', '{}')).outcome AS after;
ROLLBACK;

-- from PL/pgSQL: SELECT (...).* INTO a row variable
CREATE FUNCTION pg_temp.sl_reserve(k text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    r idempotency.reservation;
BEGIN
    SELECT (idem_reserve('sl_a', 'sl', k, '{}')).* INTO r;
    RETURN r.outcome || ' ' || (r.lock_token IS NOT NULL) || ' ' || coalesce(r.http_status::text, '-');
END
$$;
BEGIN;
SELECT pg_temp.sl_reserve('k-plpgsql');
-- the next call is another request
SELECT pg_temp.sl_reserve('k-plpgsql');
ROLLBACK;

-- a replay, a mismatch and an in_progress read column by column: one
-- answer each; the in_progress counted once, the replay and the mismatch,
-- read from the row, by each call
SELECT idem_stats_reset();
SELECT (idem_reserve('sl_a', 'sl', 'k-cols', '{}')).outcome,
       (idem_reserve('sl_a', 'sl', 'k-cols', '{}')).response_code;
SELECT (idem_reserve('sl_a', 'sl', 'k-cols', '{"x": 1}')).outcome,
       (idem_reserve('sl_a', 'sl', 'k-cols', '{"x": 1}')).http_status;
SELECT outcome FROM idem_reserve('sl_a', 'sl', 'k-held', '{}');
SELECT (idem_reserve('sl_a', 'sl', 'k-held', '{}')).outcome,
       (idem_reserve('sl_a', 'sl', 'k-held', '{}')).http_status,
       (idem_reserve('sl_a', 'sl', 'k-held', '{}')).retry_after > 0 AS retry_after;
SELECT created, in_progress, mismatched, replayed FROM idempotency.stats
 WHERE tenant = 'sl_a' AND scope = 'sl';
DELETE FROM idempotency.keys WHERE tenant_id = 'sl_a';

-- a set-returning function is called once for a row however many of its
-- columns are read (PostgreSQL computes equal ones once): outbox_claim read
-- column by column claims one row, whole
SELECT outbox_enqueue('sl_a', 'sl.claim', jsonb_build_object('n', g)) > 0 AS enqueued
  FROM generate_series(1, 3) AS g;
SELECT (outbox_claim('sl-worker', 1, topics => '{sl.claim}')).id IS NOT NULL AS id,
       (outbox_claim('sl-worker', 1, topics => '{sl.claim}')).lease_token IS NOT NULL AS token;
SELECT status, count(*) FROM idempotency.outbox WHERE topic = 'sl.claim' GROUP BY 1;
-- one call in the select list, or in FROM, claims as usual
SELECT (c).status, (c).lease_token IS NOT NULL AS token
  FROM (SELECT outbox_claim('sl-worker', 1, topics => '{sl.claim}') AS c) AS s;
SELECT count(*) AS claimed FROM outbox_claim('sl-worker', 5, topics => '{sl.claim}');
DELETE FROM idempotency.outbox WHERE topic = 'sl.claim';

-- idem_execute in the same row as a reservation of its key is another
-- request: in_progress, its handler not run
CREATE TABLE pg_temp.sl_effects (k text);
CREATE FUNCTION pg_temp.sl_pay(tenant text, key text, request jsonb)
RETURNS idempotency.response LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO pg_temp.sl_effects VALUES (key);
    RETURN ROW(201, '{"paid": true}', NULL)::idempotency.response;
END
$$;
BEGIN;
SELECT (idem_reserve('sl_a', 'sl', 'k-exec', '{}')).outcome AS reserved,
       (idem_reserve('sl_a', 'sl', 'k-exec', '{}')).lock_token IS NOT NULL AS token,
       (idem_execute('sl_a', 'sl', 'k-exec', '{}', 'pg_temp.sl_pay')).outcome AS executed;
SELECT count(*) AS handler_runs FROM pg_temp.sl_effects;
ROLLBACK;
