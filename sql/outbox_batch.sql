-- outbox_ack_many and outbox_nack_many: many rows in one statement, each
-- fenced by its own lease token (tenant obx_m; removed at the end)

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

SELECT count(outbox_enqueue('obx_m', 'obx.batch', jsonb_build_object('n', g)))
  FROM generate_series(1, 6) g;
CREATE TEMP TABLE lease AS
    SELECT id, lease_token, payload->>'n' AS n FROM outbox_claim('w', 6, tenant => 'obx_m');
SELECT count(*) AS leased FROM lease;

-- ack rows 1 to 3 in one call, with provider refs; the result is the ids acked
SELECT array_agg(a ORDER BY a) = (SELECT array_agg(id ORDER BY id) FROM lease WHERE n::int <= 3) AS acked_1_to_3
  FROM outbox_ack_many('obx_m',
                       (SELECT array_agg(id ORDER BY id) FROM lease WHERE n::int <= 3),
                       (SELECT array_agg(lease_token ORDER BY id) FROM lease WHERE n::int <= 3),
                       (SELECT array_agg('ref-' || n ORDER BY id) FROM lease WHERE n::int <= 3)) a;
SELECT o.payload->>'n' AS n, o.status, o.provider_ref, o.done_at IS NOT NULL AS done_at,
       o.lease_until IS NULL AS lease_released
  FROM idempotency.outbox o WHERE tenant_id = 'obx_m' ORDER BY id;

-- a batch with a stale token, a done row, an unknown id and a row of
-- another tenant: only the rows that pass their fence are acked, the others
-- are left out of the result and unchanged
SELECT outbox_enqueue('obx_m2', 'obx.batch', '{"n": 0}') AS other_id \gset
SELECT lease_token AS other_token FROM outbox_claim('w', 1, tenant => 'obx_m2') \gset
SELECT array_agg(a ORDER BY a) = ARRAY[(SELECT id FROM lease WHERE n = '5')] AS only_row_5
  FROM outbox_ack_many('obx_m',
                       ARRAY[(SELECT id FROM lease WHERE n = '4'),
                             (SELECT id FROM lease WHERE n = '5'),
                             (SELECT id FROM lease WHERE n = '1'),
                             -1, :other_id],
                       ARRAY[gen_random_uuid(),
                             (SELECT lease_token FROM lease WHERE n = '5'),
                             (SELECT lease_token FROM lease WHERE n = '1'),
                             gen_random_uuid(), :'other_token'::uuid]) a;
SELECT o.payload->>'n' AS n, o.status, o.provider_ref
  FROM idempotency.outbox o WHERE tenant_id IN ('obx_m', 'obx_m2') ORDER BY id;
-- an empty batch acks nothing
SELECT count(*) AS acked FROM outbox_ack_many('obx_m', '{}', '{}');

-- nack rows 4 and 6 in one call: each gets its own backoff; row 6 has a
-- retry_in of its own call
UPDATE idempotency.outbox SET max_attempts = 1 WHERE tenant_id = 'obx_m' AND payload->>'n' = '6';
-- (the backoff counts from the nack's statement, which starts after t0)
SELECT clock_timestamp() AS t0 \gset
SELECT n.status, l.n
  FROM outbox_nack_many('obx_m',
                        (SELECT array_agg(id ORDER BY id) FROM lease WHERE n IN ('4', '6')),
                        (SELECT array_agg(lease_token ORDER BY id) FROM lease WHERE n IN ('4', '6')),
                        'HTTP 503') n
  JOIN lease l USING (id) ORDER BY l.n;
SELECT o.payload->>'n' AS n, o.status, o.attempts, o.last_error, o.lease_token IS NULL AS released,
       o.status <> 'pending' OR o.available_at - :'t0'::timestamptz BETWEEN interval '2.5 seconds' AND interval '6 seconds' AS backoff
  FROM idempotency.outbox o WHERE tenant_id = 'obx_m' AND payload->>'n' IN ('4', '6') ORDER BY id;
-- the same tokens again: released, so nothing is reported
SELECT count(*) AS reported
  FROM outbox_nack_many('obx_m',
                        (SELECT array_agg(id ORDER BY id) FROM lease WHERE n IN ('4', '6')),
                        (SELECT array_agg(lease_token ORDER BY id) FROM lease WHERE n IN ('4', '6')),
                        'again');
-- retry_in applies to every row of the batch
UPDATE idempotency.outbox SET available_at = now() WHERE tenant_id = 'obx_m' AND payload->>'n' = '4';
SELECT id AS id4, lease_token AS tok4 FROM outbox_claim('w', 1, tenant => 'obx_m') \gset
SELECT status FROM outbox_nack_many('obx_m', ARRAY[:id4]::bigint[], ARRAY[:'tok4']::uuid[], 'later', '1 hour');
SELECT available_at - now() BETWEEN interval '59 minutes' AND interval '1 hour' AS retry_in_1_hour FROM idempotency.outbox WHERE id = :id4;

-- bad input raises before anything is written
SELECT pg_temp.outbox_error('SELECT * FROM outbox_ack_many(NULL, ''{1}'', ARRAY[gen_random_uuid()])');
SELECT pg_temp.outbox_error('SELECT * FROM outbox_ack_many(''obx_m'', NULL, ARRAY[gen_random_uuid()])');
SELECT pg_temp.outbox_error('SELECT * FROM outbox_ack_many(''obx_m'', ''{1}'', NULL)');
SELECT pg_temp.outbox_error('SELECT * FROM outbox_ack_many(''obx_m'', ''{1,2}'', ARRAY[gen_random_uuid()])');
SELECT pg_temp.outbox_error('SELECT * FROM outbox_ack_many(''obx_m'', ''{1,NULL}'', ARRAY[gen_random_uuid(), gen_random_uuid()])');
SELECT pg_temp.outbox_error('SELECT * FROM outbox_ack_many(''obx_m'', ''{1}'', ARRAY[NULL::uuid])');
SELECT pg_temp.outbox_error('SELECT * FROM outbox_ack_many(''obx_m'', ''{{1}}'', ARRAY[ARRAY[gen_random_uuid()]])');
SELECT pg_temp.outbox_error('SELECT * FROM outbox_ack_many(''obx_m'', ''{1}'', ARRAY[gen_random_uuid()], ''{a,b}'')');
SELECT pg_temp.outbox_error('SELECT * FROM outbox_ack_many(''obx_m'', ''{1}'', ARRAY[gen_random_uuid()], ''{{a}}'')');
SELECT pg_temp.outbox_error('SELECT * FROM outbox_nack_many(''obx_m'', ''{1}'', ARRAY[gen_random_uuid()], ''e'', ''-1 second'')');
SELECT pg_temp.outbox_error('SELECT * FROM outbox_nack_many(''obx_m'', ''{1}'', ''{}'', ''e'')');
SELECT pg_temp.outbox_error('SELECT * FROM outbox_nack_many(''obx_m'', NULL, ''{}'', ''e'')');
SELECT count(*) AS unchanged FROM idempotency.outbox WHERE tenant_id = 'obx_m' AND status = 'leased';

DROP TABLE lease;
DELETE FROM idempotency.outbox WHERE tenant_id IN ('obx_m', 'obx_m2');
