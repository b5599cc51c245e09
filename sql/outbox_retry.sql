-- outbox: nack with backoff, expired leases, dead letters and requeue
-- (tenant obx_r, topics obx.*; everything is removed at the end)

CREATE FUNCTION pg_temp.outbox_error(q text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    st text; msg text; hint text;
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
                            hint = PG_EXCEPTION_HINT;
    RETURN st || ': ' || msg || ' / hint: ' || hint;
END $$;

-- make a row due now (tests only: skips the wait of a backoff)
CREATE FUNCTION pg_temp.make_due(row_id bigint) RETURNS void
LANGUAGE sql AS $$
    UPDATE idempotency.outbox SET available_at = now() - interval '1 second'
     WHERE id = row_id
$$;

-- nack with an explicit retry_in: pending again exactly that much later,
-- attempts + 1, the error kept, the lease gone
SELECT outbox_enqueue('obx_r', 'obx.retry', '{}', 'k-retry', 'payments', max_attempts => 3) AS id \gset
SELECT lease_token AS token FROM outbox_claim('w1', 1, '1 minute', tenant => 'obx_r') \gset
SELECT outbox_nack('obx_r', :id, :'token', 'HTTP 503', '90 seconds') AS status,
       statement_timestamp() AS nack_at \gset
SELECT :'status' AS status, attempts, available_at - :'nack_at'::timestamptz AS retry_in,
       last_error, lease_token, lease_until, leased_by
  FROM idempotency.outbox WHERE id = :id;
-- the row is not due before then
SELECT count(*) FROM outbox_claim('w1', 1, '1 minute', tenant => 'obx_r');
-- the released token is stale now
SELECT pg_temp.outbox_error(format('SELECT outbox_nack(%L, %s, %L, %L)', 'obx_r', :id, :'token', 'again'));
SELECT pg_temp.outbox_error(format('SELECT outbox_ack(%L, %s, %L)', 'obx_r', :id, :'token'));
SELECT attempts, status FROM idempotency.outbox WHERE id = :id;

-- without retry_in: min(1 hour, 5 s * 2^(attempts - 1)) * jitter in [0.5, 1)
SELECT pg_temp.make_due(:id);
SELECT lease_token AS token FROM outbox_claim('w1', 1, '1 minute', tenant => 'obx_r') \gset
SELECT outbox_nack('obx_r', :id, :'token', 'timeout') AS status, statement_timestamp() AS nack_at \gset
SELECT :'status' AS status, attempts,
       available_at - :'nack_at'::timestamptz >= interval '5 seconds' AS at_least_half,
       available_at - :'nack_at'::timestamptz < interval '10 seconds' AS below_full
  FROM idempotency.outbox WHERE id = :id;

-- the last allowed attempt fails: dead letter, not claimable
SELECT pg_temp.make_due(:id);
SELECT lease_token AS token FROM outbox_claim('w1', 1, '1 minute', tenant => 'obx_r') \gset
SELECT outbox_nack('obx_r', :id, :'token', 'HTTP 400: card declined') AS status;
SELECT pg_temp.make_due(:id);
SELECT count(*) FROM outbox_claim('w1', 10, '1 minute', tenant => 'obx_r');
SELECT id = :id AS same_row, tenant_id, topic, idem_scope, idem_key, attempts, max_attempts,
       last_error, last_worker
  FROM idempotency.dead_letters WHERE tenant_id = 'obx_r';
-- finishing a dead row is refused
SELECT pg_temp.outbox_error(format('SELECT outbox_ack(%L, %s, %L)', 'obx_r', :id, :'token'));
SELECT pg_temp.outbox_error(format('SELECT outbox_nack(%L, %s, %L, %L)', 'obx_r', :id, :'token', 'x'));

-- requeue: pending again, attempts reset, due now, the last error kept
SELECT outbox_requeue('obx_r', :id);
SELECT status, attempts, available_at <= now() AS due, last_error
  FROM idempotency.outbox WHERE id = :id;
SELECT count(*) FROM idempotency.dead_letters WHERE tenant_id = 'obx_r';
-- only a dead row can be requeued; unknown rows and other tenants' rows do
-- not exist; the session's tenant binding applies
SELECT pg_temp.outbox_error(format('SELECT outbox_requeue(%L, %s)', 'obx_r', :id));
SELECT pg_temp.outbox_error(format('SELECT outbox_requeue(%L, %s)', 'obx_other', :id));
SELECT pg_temp.outbox_error('SELECT outbox_requeue(NULL, 1)');
SELECT pg_temp.outbox_error('SELECT outbox_requeue(''obx_r'', NULL)');
SET idempotency.tenant = 'obx_other';
SELECT pg_temp.outbox_error(format('SELECT outbox_requeue(%L, %s)', 'obx_r', :id));
SELECT pg_temp.outbox_error(format('SELECT outbox_nack(%L, %s, %L, %L)', 'obx_r', :id, :'token', 'x'));
RESET idempotency.tenant;
-- the requeued row is delivered like any other
SELECT lease_token AS token FROM outbox_claim('w2', 1, '1 minute', tenant => 'obx_r') \gset
SELECT outbox_ack('obx_r', :id, :'token', 'ref-after-requeue');
SELECT status, attempts, provider_ref FROM idempotency.outbox WHERE id = :id;

-- discard: only a dead letter is deleted; a delivered row, an unknown row,
-- another tenant's row and NULLs are refused, nothing deleted
SELECT pg_temp.outbox_error(format('SELECT outbox_discard(%L, %s)', 'obx_r', :id));
SELECT pg_temp.outbox_error(format('SELECT outbox_discard(%L, %s)', 'obx_other', :id));
SELECT pg_temp.outbox_error('SELECT outbox_discard(NULL, 1)');
SELECT pg_temp.outbox_error('SELECT outbox_discard(''obx_r'', NULL)');
SET idempotency.tenant = 'obx_other';
SELECT pg_temp.outbox_error(format('SELECT outbox_discard(%L, %s)', 'obx_r', :id));
RESET idempotency.tenant;
SELECT count(*) AS kept FROM idempotency.outbox WHERE id = :id;
SELECT outbox_enqueue('obx_r', 'obx.poison', '{"n": 1}', max_attempts => 1) AS poison \gset
SELECT lease_token AS token FROM outbox_claim('w3', 1, '1 minute', topics => '{obx.poison}') \gset
SELECT outbox_nack('obx_r', :poison, :'token', 'HTTP 400: rejected');
SELECT count(*) AS dead_before FROM idempotency.dead_letters WHERE tenant_id = 'obx_r';
SELECT outbox_discard('obx_r', :poison);
SELECT count(*) AS dead_after, (SELECT count(*) FROM idempotency.outbox WHERE id = :poison) AS row_left
  FROM idempotency.dead_letters WHERE tenant_id = 'obx_r';
SELECT pg_temp.outbox_error(format('SELECT outbox_discard(%L, %s)', 'obx_r', :poison));
DELETE FROM idempotency.outbox WHERE tenant_id = 'obx_r';

-- backoff bounds per attempt, for 20 rows failing together: each delay in
-- [0.5, 1) of the nominal one, and the jitter spreads them
SELECT count(outbox_enqueue('obx_r', 'obx.backoff', jsonb_build_object('n', n), max_attempts => 100))
  FROM generate_series(1, 20) n;
CREATE TEMP TABLE delays (attempt int, delay interval);
DO $$
DECLARE
    r record;
BEGIN
    FOR a IN 1..4 LOOP
        PERFORM pg_temp.make_due(id) FROM idempotency.outbox WHERE tenant_id = 'obx_r';
        FOR r IN SELECT * FROM outbox_claim('w', 100, '1 minute', tenant => 'obx_r') LOOP
            PERFORM outbox_nack(r.tenant_id, r.id, r.lease_token, 'fail');
            INSERT INTO delays
                SELECT o.attempts, o.available_at - statement_timestamp()
                  FROM idempotency.outbox o WHERE o.tenant_id = r.tenant_id AND o.id = r.id;
        END LOOP;
    END LOOP;
END $$;
SELECT attempt, count(*) AS nacks,
       bool_and(delay >= interval '5 seconds' * 2 ^ (attempt - 1) * 0.5) AS at_least_half,
       bool_and(delay < interval '5 seconds' * 2 ^ (attempt - 1)) AS below_full,
       count(DISTINCT delay) > 10 AS spread
  FROM delays GROUP BY attempt ORDER BY attempt;
-- the delay stops growing at one hour
UPDATE idempotency.outbox SET attempts = 40, available_at = now() - interval '1 second'
 WHERE tenant_id = 'obx_r';
TRUNCATE delays;
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT * FROM outbox_claim('w', 100, '1 minute', tenant => 'obx_r') LOOP
        PERFORM outbox_nack(r.tenant_id, r.id, r.lease_token, 'fail');
        INSERT INTO delays
            SELECT o.attempts, o.available_at - statement_timestamp()
              FROM idempotency.outbox o WHERE o.tenant_id = r.tenant_id AND o.id = r.id;
    END LOOP;
END $$;
SELECT count(*) AS nacks, min(delay) >= interval '30 minutes' AS at_least_half,
       max(delay) < interval '1 hour' AS below_cap
  FROM delays;
-- retry_in must not be negative; '0' retries at once; the error is
-- required (it is what the dead letter keeps), in a batch too
SELECT pg_temp.make_due(id) FROM idempotency.outbox WHERE tenant_id = 'obx_r' LIMIT 1;
SELECT id, lease_token AS token FROM outbox_claim('w', 1, '1 minute', tenant => 'obx_r') \gset
SELECT pg_temp.outbox_error(format('SELECT outbox_nack(%L, %s, %L, %L, %L)', 'obx_r', :id, :'token', 'x', '-1 second'));
SELECT pg_temp.outbox_error(format('SELECT outbox_nack(%L, %s, %L, %L, %L)', 'obx_r', :id, :'token', 'x', '178000000 years'));
SELECT pg_temp.outbox_error(format('SELECT * FROM outbox_nack_many(%L, ARRAY[%s], ARRAY[%L]::uuid[], %L, %L)', 'obx_r', :id, :'token', 'x', '1001 years'));
SELECT pg_temp.outbox_error(format('SELECT outbox_nack(%L, %s, %L, NULL, %L)', 'obx_r', :id, :'token', '0'));
SELECT pg_temp.outbox_error(format('SELECT * FROM outbox_nack_many(%L, ARRAY[%s], ARRAY[%L]::uuid[], NULL)', 'obx_r', :id, :'token'));
SELECT pg_temp.outbox_error(format('SELECT outbox_nack(%L, %s, %L, %L)', 'obx_r', :id, :'token', ' '));
SELECT pg_temp.outbox_error(format('SELECT * FROM outbox_nack_many(%L, ARRAY[%s], ARRAY[%L]::uuid[], %L)', 'obx_r', :id, :'token', ''));
SELECT outbox_nack('obx_r', :id, :'token', 'HTTP 503', '0');
SELECT status, last_error, available_at <= now() AS due FROM idempotency.outbox WHERE id = :id;
SELECT pg_temp.outbox_error(format('SELECT outbox_nack(%L, %s, %L, %L)', 'obx_r', -1, gen_random_uuid(), 'x'));
SELECT pg_temp.outbox_error('SELECT outbox_nack(''obx_r'', 1, NULL, ''x'')');
DELETE FROM idempotency.outbox WHERE tenant_id = 'obx_r';

-- an expired lease makes the row claimable again; the reclaim counts the
-- lost attempt, and the first worker's late ack or nack is refused
SELECT outbox_enqueue('obx_r', 'obx.lease', '{}', 'k-lease', 'payments') AS id \gset
SELECT lease_token AS old_token FROM outbox_claim('w-slow', 1, '10 milliseconds', tenant => 'obx_r') \gset
SELECT pg_sleep(0.05);
SELECT leased_by, attempts, last_error, lease_token <> :'old_token' AS new_token, idem_key
  FROM outbox_claim('w-fast', 1, '1 minute', tenant => 'obx_r');
SELECT pg_temp.outbox_error(format('SELECT outbox_ack(%L, %s, %L)', 'obx_r', :id, :'old_token'));
SELECT pg_temp.outbox_error(format('SELECT outbox_nack(%L, %s, %L, %L)', 'obx_r', :id, :'old_token', 'late'));
SELECT status, leased_by, attempts FROM idempotency.outbox WHERE id = :id;
SELECT lease_token AS new_token FROM idempotency.outbox WHERE id = :id \gset
SELECT outbox_ack('obx_r', :id, :'new_token', 'ref-fast');
SELECT status, leased_by, provider_ref FROM idempotency.outbox WHERE id = :id;

-- a worker whose lease ran out may still ack while nobody else took the row
SELECT outbox_enqueue('obx_r', 'obx.lease', '{}') AS id \gset
SELECT lease_token AS token FROM outbox_claim('w-slow', 1, '10 milliseconds', tenant => 'obx_r') \gset
SELECT pg_sleep(0.05);
SELECT outbox_ack('obx_r', :id, :'token');
SELECT status, attempts FROM idempotency.outbox WHERE id = :id;

-- a lease that expires on the last allowed attempt dead-letters the row
-- instead of handing it out again
SELECT outbox_enqueue('obx_r', 'obx.lease', '{}', max_attempts => 1) AS id \gset
SELECT count(*) FROM outbox_claim('w-crash', 1, '10 milliseconds', tenant => 'obx_r');
SELECT pg_sleep(0.05);
SELECT count(*) FROM outbox_claim('w-next', 1, '1 minute', tenant => 'obx_r');
SELECT o.status, o.attempts, o.last_error, d.last_worker FROM idempotency.outbox o
  JOIN idempotency.dead_letters d USING (tenant_id, id) WHERE o.id = :id;
-- rows the claim dead-letters do not take the places of due rows: with three
-- expired last attempts ahead of two pending rows, a claim of two returns
-- the two pending rows, and a claim of one behind such a row returns the
-- pending row behind it; an empty claim means nothing is due
DELETE FROM idempotency.outbox WHERE tenant_id = 'obx_r';
SELECT outbox_enqueue('obx_r', 'obx.dl', '{"n": 1}', max_attempts => 1) IS NOT NULL AS e1,
       outbox_enqueue('obx_r', 'obx.dl', '{"n": 2}', max_attempts => 1) IS NOT NULL AS e2,
       outbox_enqueue('obx_r', 'obx.dl', '{"n": 3}', max_attempts => 1) IS NOT NULL AS e3;
SELECT count(*) FROM outbox_claim('w-crash', 3, '10 milliseconds', tenant => 'obx_r');
SELECT pg_sleep(0.05);
SELECT outbox_enqueue('obx_r', 'obx.dl', '{"n": 4}') IS NOT NULL AS e4,
       outbox_enqueue('obx_r', 'obx.dl', '{"n": 5}') IS NOT NULL AS e5;
SELECT payload FROM outbox_claim('w-next', 2, '1 minute', tenant => 'obx_r') ORDER BY id;
SELECT payload FROM outbox_claim('w-next', 1, '1 minute', tenant => 'obx_r');
SELECT payload->>'n' AS n, status FROM idempotency.outbox WHERE tenant_id = 'obx_r' ORDER BY id;
DELETE FROM idempotency.outbox WHERE tenant_id = 'obx_r';
SELECT outbox_enqueue('obx_r', 'obx.dl', '{"n": 6}', max_attempts => 1) IS NOT NULL AS e6;
SELECT count(*) FROM outbox_claim('w-crash', 1, '10 milliseconds', tenant => 'obx_r');
SELECT pg_sleep(0.05);
SELECT outbox_enqueue('obx_r', 'obx.dl', '{"n": 7}') IS NOT NULL AS e7;
SELECT payload FROM outbox_claim('w-next', 1, '1 minute', tenant => 'obx_r');
DELETE FROM idempotency.outbox WHERE tenant_id = 'obx_r';
