-- idempotency.outbox_retention = 0: delivered rows are not kept, outbox_ack
-- and outbox_ack_many delete them under the same fence; and claims of one
-- row, which run as one statement (tenant obx_r; removed at the end)

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

-- only a superuser sets it (workers cannot decide what the DBA keeps)
CREATE ROLE obx_r_worker;
GRANT idempotency_worker TO obx_r_worker;
SET ROLE obx_r_worker;
SELECT pg_temp.outbox_error($$SET idempotency.outbox_retention = 0$$);
RESET ROLE;

SET idempotency.outbox_retention = 0;
SELECT count(outbox_enqueue('obx_r', 'obx.ret', jsonb_build_object('n', g)))
  FROM generate_series(1, 6) g;

-- one row at a time: the claim returns the oldest row, ack deletes it
SELECT id, lease_token, payload->>'n' AS n FROM outbox_claim('w', 1, tenant => 'obx_r') \gset
SELECT :'n' AS claimed_first;
SELECT outbox_ack('obx_r', :id, :'lease_token', 'ref-1');
SELECT count(*) AS row_left FROM idempotency.outbox WHERE tenant_id = 'obx_r' AND id = :id;
-- acking it again: the row is gone, so P0002 (not 55000 as for a done row)
SELECT pg_temp.outbox_error(format('SELECT outbox_ack(%L, %s, %L)', 'obx_r', :id, :'lease_token'));

-- a stale token deletes nothing: 55006, and the row is still leased
SELECT id, lease_token, payload->>'n' AS n FROM outbox_claim('w', 1, tenant => 'obx_r') \gset
SELECT :'n' AS claimed_second;
SELECT pg_temp.outbox_error(format('SELECT outbox_ack(%L, %s, %L)', 'obx_r', :id,
                                   '00000000-0000-4000-8000-000000000000'));
SELECT status FROM idempotency.outbox WHERE tenant_id = 'obx_r' AND id = :id;
SELECT outbox_ack('obx_r', :id, :'lease_token');

-- outbox_ack_many: the rows that pass their fence are deleted and returned,
-- the others stay as they are
CREATE TEMP TABLE lease AS
    SELECT id, lease_token, payload->>'n' AS n FROM outbox_claim('w', 3, tenant => 'obx_r');
SELECT string_agg(n, ',' ORDER BY n) AS leased FROM lease;
SELECT array_agg(a ORDER BY a) = (SELECT array_agg(id ORDER BY id) FROM lease WHERE n <> '5') AS acked_3_and_4
  FROM outbox_ack_many('obx_r',
                       (SELECT array_agg(id ORDER BY id) FROM lease),
                       (SELECT array_agg(CASE WHEN n = '5' THEN gen_random_uuid() ELSE lease_token END
                                         ORDER BY id) FROM lease)) a;
SELECT payload->>'n' AS n, status FROM idempotency.outbox WHERE tenant_id = 'obx_r' ORDER BY id;

-- with retention back at its default, ack keeps the row, done
RESET idempotency.outbox_retention;
SELECT outbox_ack('obx_r', id, lease_token, 'ref-5') FROM lease WHERE n = '5';
SELECT payload->>'n' AS n, status, provider_ref FROM idempotency.outbox
 WHERE tenant_id = 'obx_r' ORDER BY id;

-- claims of one row honour the filters: topics and tenant
SELECT outbox_enqueue('obx_r', 'obx.other', '{"n": 7}') IS NOT NULL AS queued;
SELECT outbox_enqueue('obx_r2', 'obx.ret', '{"n": 8}') IS NOT NULL AS queued;
SELECT tenant_id, topic, payload->>'n' AS n
  FROM outbox_claim('w', 1, topics => ARRAY['obx.other'], tenant => 'obx_r');
SELECT tenant_id, topic, payload->>'n' AS n
  FROM outbox_claim('w', 1, topics => ARRAY['obx.ret'], tenant => 'obx_r2');
SELECT count(*) AS nothing_due FROM outbox_claim('w', 1, topics => ARRAY['obx.none']);

-- a claim of one row counts an expired lease as a lost attempt, and
-- dead-letters the row when that was its last (returning nothing)
SELECT outbox_enqueue('obx_r3', 'obx.ret', '{"n": 9}', max_attempts => 1) AS dl_id \gset
SELECT count(*) AS leased FROM outbox_claim('w', 1, '10 milliseconds', tenant => 'obx_r3');
SELECT pg_sleep(0.05);
SELECT count(*) AS claimed_after_expiry FROM outbox_claim('w2', 1, tenant => 'obx_r3');
SELECT status, attempts, last_error, lease_token IS NULL AS no_token
  FROM idempotency.outbox WHERE id = :dl_id;

-- the one-row claim keeps delivering an ordering key's rows in order
SELECT outbox_enqueue('obx_r4', 'obx.ret', jsonb_build_object('n', g), ordering_key => 'k')
  IS NOT NULL AS queued FROM generate_series(1, 3) g;
SET idempotency.outbox_retention = 0;
SELECT id, lease_token, payload->>'n' AS n FROM outbox_claim('w', 1, tenant => 'obx_r4') \gset
SELECT :'n' AS first_of_k;
SELECT count(*) AS held_back FROM outbox_claim('w', 1, tenant => 'obx_r4');
SELECT outbox_ack('obx_r4', :id, :'lease_token');
SELECT payload->>'n' AS next_of_k FROM outbox_claim('w', 1, tenant => 'obx_r4');
RESET idempotency.outbox_retention;

DELETE FROM idempotency.outbox WHERE tenant_id IN ('obx_r', 'obx_r2', 'obx_r3', 'obx_r4');
DROP ROLE obx_r_worker;
