-- outbox_claim returns rows of idempotency.outbox's row type.  It must keep
-- working in a backend whose plans are already prepared after a column is
-- added to the table and after one is dropped: the row type keeps a slot
-- for a dropped column, which RETURNING o.* leaves out.

-- warm up: claim and ack prepare their plans in this backend
SELECT outbox_enqueue('obx_cols', 'obx.cols', '{"n": 1}', 'cols-1') AS id1 \gset
SELECT id = :id1 AS same_row, outbox_ack(tenant_id, id, lease_token)
  FROM outbox_claim('worker-c', 10, '1 minute', tenant => 'obx_cols');

-- an added column comes back with the row
ALTER TABLE idempotency.outbox ADD COLUMN x int DEFAULT 7;
SELECT outbox_enqueue('obx_cols', 'obx.cols', '{"n": 2}', 'cols-2') AS id2 \gset
SELECT id = :id2 AS same_row, tenant_id, topic, payload, idem_key, status,
       leased_by, attempts, lease_token IS NOT NULL AS has_token, x
  FROM outbox_claim('worker-c', 10, '1 minute', tenant => 'obx_cols');
SELECT outbox_ack('obx_cols', :id2, lease_token, 'ref-2')
  FROM idempotency.outbox WHERE id = :id2;

-- and once dropped, claim, ack and nack still work
ALTER TABLE idempotency.outbox DROP COLUMN x;
SELECT outbox_enqueue('obx_cols', 'obx.cols', '{"n": 3}', 'cols-3') AS id3 \gset
SELECT outbox_enqueue('obx_cols', 'obx.cols', '{"n": 4}', 'cols-4') AS id4 \gset
SELECT id IN (:id3, :id4) AS new_row, tenant_id, topic, payload, idem_key,
       status, leased_by, attempts, lease_token IS NOT NULL AS has_token
  FROM outbox_claim('worker-c', 10, '1 minute', tenant => 'obx_cols')
 ORDER BY id;
SELECT outbox_ack('obx_cols', :id3, lease_token, 'ref-3')
  FROM idempotency.outbox WHERE id = :id3;
SELECT outbox_nack('obx_cols', :id4, lease_token, 'HTTP 503', '0')
  FROM idempotency.outbox WHERE id = :id4;
-- the whole row, in the row type's column order, from a function call
SELECT (c).id = :id4 AS same_row, (c).status, (c).attempts, (c).last_error
  FROM (SELECT outbox_claim('worker-c', 10, '1 minute', tenant => 'obx_cols') AS c) s;
SELECT id = :id1 AS first, id = :id2 AS second, status, provider_ref
  FROM idempotency.outbox WHERE tenant_id = 'obx_cols' ORDER BY id;

DELETE FROM idempotency.outbox WHERE tenant_id = 'obx_cols';
