-- deduplicated enqueue: per tenant and topic, while the row exists, a
-- second enqueue with the same dedup_key returns the first row's id and
-- inserts nothing (tenant obx_d; removed at the end)

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

SELECT outbox_enqueue('obx_d', 'obx.dedup', '{"n": 1}', dedup_key => 'order-1') AS id1 \gset
-- the same key again, with another payload: the first row's id, no new row
SELECT outbox_enqueue('obx_d', 'obx.dedup', '{"n": 2}', dedup_key => 'order-1') = :id1 AS same_id;
-- in one transaction, too
BEGIN;
SELECT outbox_enqueue('obx_d', 'obx.dedup', '{"n": 3}', dedup_key => 'order-3') AS id3 \gset
SELECT outbox_enqueue('obx_d', 'obx.dedup', '{"n": 4}', dedup_key => 'order-3') = :id3 AS same_id_in_xact;
COMMIT;
-- another topic, another tenant, or no dedup_key: other messages
SELECT outbox_enqueue('obx_d', 'obx.dedup.other', '{"n": 5}', dedup_key => 'order-1') <> :id1 AS other_topic;
SELECT outbox_enqueue('obx_d2', 'obx.dedup', '{"n": 6}', dedup_key => 'order-1') <> :id1 AS other_tenant;
SELECT outbox_enqueue('obx_d', 'obx.dedup', '{"n": 7}') <> outbox_enqueue('obx_d', 'obx.dedup', '{"n": 7}') AS no_dedup_key;
SELECT tenant_id, topic, payload, dedup_key FROM idempotency.outbox
 WHERE tenant_id IN ('obx_d', 'obx_d2') ORDER BY id;

-- deduplicated whatever the row's state: leased or done
SELECT lease_token AS tok FROM outbox_claim('w', 1, tenant => 'obx_d', topics => '{obx.dedup}') \gset
SELECT outbox_enqueue('obx_d', 'obx.dedup', '{}', dedup_key => 'order-1') = :id1 AS while_leased;
SELECT outbox_ack('obx_d', :id1, :'tok');
SELECT outbox_enqueue('obx_d', 'obx.dedup', '{}', dedup_key => 'order-1') = :id1 AS while_done;
-- until the row is gone (purged after idempotency.outbox_retention)
DELETE FROM idempotency.outbox WHERE id = :id1;
SELECT outbox_enqueue('obx_d', 'obx.dedup', '{"n": 8}', dedup_key => 'order-1') <> :id1 AS new_row_after_purge;

-- a rolled-back enqueue leaves the key free
BEGIN;
SELECT outbox_enqueue('obx_d', 'obx.dedup', '{"n": 9}', dedup_key => 'order-9') IS NOT NULL AS enqueued;
ROLLBACK;
SELECT count(*) AS rows_of_order_9 FROM idempotency.outbox WHERE dedup_key = 'order-9';
SELECT outbox_enqueue('obx_d', 'obx.dedup', '{"n": 9}', dedup_key => 'order-9') IS NOT NULL AS enqueued;

-- (that a deduplicated enqueue notifies nothing: see specs/outbox_dedup_race.spec)

-- bad input raises before anything is written
SELECT pg_temp.outbox_error('SELECT outbox_enqueue(''obx_d'', ''obx.dedup'', ''{}'', dedup_key => '''')');
SELECT pg_temp.outbox_error('SELECT outbox_enqueue(''obx_d'', ''obx.dedup'', ''{}'', dedup_key => repeat(''x'', 256))');
SELECT outbox_enqueue('obx_d', 'obx.dedup', '{}', dedup_key => repeat('x', 255)) IS NOT NULL AS longest_key;

DELETE FROM idempotency.outbox WHERE tenant_id IN ('obx_d', 'obx_d2');
