-- ordered delivery: rows of one tenant with the same ordering_key are
-- delivered one at a time, in enqueue order; a nacked or dead row holds
-- back its successors (tenants obx_o and obx_o2; removed at the end)

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

-- claim everything due for obx_o; show what was leased, by payload
CREATE FUNCTION pg_temp.claim() RETURNS text
LANGUAGE sql AS $$
    SELECT coalesce(string_agg(payload->>'m', ' ' ORDER BY id), '-')
      FROM outbox_claim('w', 100, '1 minute', tenant => 'obx_o')
$$;
-- ack a leased row by payload
CREATE FUNCTION pg_temp.ack(m text) RETURNS void
LANGUAGE sql AS $$
    SELECT outbox_ack(tenant_id, id, lease_token) FROM idempotency.outbox
     WHERE tenant_id = 'obx_o' AND payload->>'m' = m
$$;

SELECT count(outbox_enqueue('obx_o', 'obx.ord', jsonb_build_object('m', m), ordering_key => k))
  FROM (VALUES ('a1', 'A'), ('b1', 'B'), ('a2', 'A'), ('a3', 'A'), ('b2', 'B')) v(m, k);
SELECT outbox_enqueue('obx_o', 'obx.ord', '{"m": "u1"}') IS NOT NULL AS unordered;
-- the same key in another tenant is another sequence
SELECT outbox_enqueue('obx_o2', 'obx.ord', '{"m": "other"}', ordering_key => 'A') IS NOT NULL AS other_tenant;

-- one row per key at a time: the heads of A and B, and the unordered row
SELECT pg_temp.claim() AS first_claim;
SELECT pg_temp.claim() AS while_heads_leased;
SELECT count(*) AS other_tenant_claimed FROM outbox_claim('w', 10, tenant => 'obx_o2');
-- acking a head releases its successor
SELECT pg_temp.ack('a1');
SELECT pg_temp.claim() AS after_ack_a1;

-- a nacked row holds back its successors until it is delivered
SELECT outbox_nack(tenant_id, id, lease_token, 'HTTP 503', '1 hour') FROM idempotency.outbox
 WHERE tenant_id = 'obx_o' AND payload->>'m' = 'a2';
SELECT pg_temp.claim() AS while_a2_waits_for_retry;
UPDATE idempotency.outbox SET available_at = now() WHERE tenant_id = 'obx_o' AND payload->>'m' = 'a2';
SELECT pg_temp.claim() AS a2_retried;
SELECT pg_temp.ack('a2');
SELECT pg_temp.claim() AS after_ack_a2;

-- a lease that expires is reclaimed for the head, not passed to the next
SELECT outbox_enqueue('obx_o', 'obx.ord', '{"m": "a4"}', ordering_key => 'A') IS NOT NULL AS a4;
UPDATE idempotency.outbox SET available_at = now() - interval '1 second',
       lease_until = now() - interval '1 second'
 WHERE tenant_id = 'obx_o' AND payload->>'m' = 'a3';
SELECT pg_temp.claim() AS a3_reclaimed;
SELECT attempts FROM idempotency.outbox WHERE tenant_id = 'obx_o' AND payload->>'m' = 'a3';

-- a dead row holds back its successors until it is requeued and delivered
UPDATE idempotency.outbox SET max_attempts = attempts + 1 WHERE tenant_id = 'obx_o' AND payload->>'m' = 'a3';
SELECT outbox_nack(tenant_id, id, lease_token, 'HTTP 400') FROM idempotency.outbox
 WHERE tenant_id = 'obx_o' AND payload->>'m' = 'a3';
SELECT pg_temp.claim() AS while_a3_dead;
SELECT outbox_requeue('obx_o', id) FROM idempotency.outbox WHERE tenant_id = 'obx_o' AND payload->>'m' = 'a3';
SELECT pg_temp.claim() AS a3_requeued;
SELECT pg_temp.ack('a3');
SELECT pg_temp.claim() AS after_ack_a3;
-- ... or until an operator discards it (outbox_discard)
SELECT pg_temp.ack('b1');
SELECT outbox_enqueue('obx_o', 'obx.ord', '{"m": "b3"}', ordering_key => 'B') IS NOT NULL AS b3;
SELECT pg_temp.claim() AS b2;
UPDATE idempotency.outbox SET max_attempts = 1 WHERE tenant_id = 'obx_o' AND payload->>'m' = 'b2';
SELECT outbox_nack(tenant_id, id, lease_token, 'HTTP 400') FROM idempotency.outbox
 WHERE tenant_id = 'obx_o' AND payload->>'m' = 'b2';
SELECT pg_temp.claim() AS while_b2_dead;
SELECT outbox_discard('obx_o', id) FROM idempotency.outbox WHERE tenant_id = 'obx_o' AND payload->>'m' = 'b2';
SELECT pg_temp.claim() AS after_b2_discarded;

-- the order is the order of enqueue, not of deliver_after: a row due later
-- holds back the ones behind it
SELECT outbox_enqueue('obx_o', 'obx.ord', '{"m": "c1"}', ordering_key => 'C', deliver_after => '1 hour') IS NOT NULL AS c1;
SELECT outbox_enqueue('obx_o', 'obx.ord', '{"m": "c2"}', ordering_key => 'C') IS NOT NULL AS c2;
SELECT pg_temp.claim() AS while_c1_not_due;

SELECT payload->>'m' AS m, ordering_key, status FROM idempotency.outbox
 WHERE tenant_id IN ('obx_o', 'obx_o2') ORDER BY id;

-- the claim asks idempotency.outbox_ordering_head whether a row has an
-- unfinished predecessor: it probes outbox_ordering_idx, and reads the
-- statuses as the calling statement's snapshot sees them
SELECT o.payload->>'m' AS m, o.status,
       idempotency.outbox_ordering_head(o.tableoid, o.tenant_id, o.ordering_key, o.id) AS head
  FROM idempotency.outbox o
 WHERE o.tenant_id = 'obx_o' AND o.ordering_key = 'C' ORDER BY o.id;
SELECT idempotency.outbox_ordering_head('idempotency.outbox'::regclass, 'obx_o2', 'C', 9223372036854775807) AS other_tenant_head;
BEGIN;
SELECT idempotency.outbox_ordering_head('idempotency.outbox'::regclass, 'obx_o', 'C', 9223372036854775807) AS behind_c1_c2;
SELECT pg_stat_get_xact_blocks_fetched('idempotency.outbox_ordering_idx'::regclass) > 0 AS probed_the_index;
-- c1 done in this transaction: the next statement no longer counts it
UPDATE idempotency.outbox SET status = 'done', done_at = now()
 WHERE tenant_id = 'obx_o' AND payload->>'m' = 'c1';
SELECT payload->>'m' AS m,
       idempotency.outbox_ordering_head(tableoid, tenant_id, ordering_key, id) AS head
  FROM idempotency.outbox WHERE tenant_id = 'obx_o' AND ordering_key = 'C' ORDER BY id;
ROLLBACK;
-- no argument may be NULL (the claim calls it only for rows with a key)
SELECT idempotency.outbox_ordering_head('idempotency.outbox'::regclass, 'obx_o', NULL, 1) IS NULL AS null_key;
-- only an outbox: another table is refused
SELECT pg_temp.outbox_error('SELECT idempotency.outbox_ordering_head(''idempotency.keys''::regclass, ''obx_o'', ''C'', 1)');
-- and only the extension's owner calls it: no role is granted it
CREATE ROLE regress_obx_ord_worker IN ROLE idempotency_worker;
SET ROLE regress_obx_ord_worker;
SELECT pg_temp.outbox_error('SELECT idempotency.outbox_ordering_head(''idempotency.outbox''::regclass, ''obx_o'', ''C'', 1)');
RESET ROLE;
DROP ROLE regress_obx_ord_worker;

-- bad input raises before anything is written
SELECT pg_temp.outbox_error('SELECT outbox_enqueue(''obx_o'', ''obx.ord'', ''{}'', ordering_key => '''')');
SELECT pg_temp.outbox_error('SELECT outbox_enqueue(''obx_o'', ''obx.ord'', ''{}'', ordering_key => repeat(''x'', 256))');

-- A held head with a backlog behind it (leased here; dead, or waiting for
-- a retry, alike): every claim reads the backlog, and each row of it
-- asked outbox_ordering_idx for its key's head again, a read of the leaf
-- page of the key's entries each time (100,000 rows behind one leased
-- head cost every claim 4 s).  Now a claim probes each key once and
-- answers the rows behind its head from that: 300 rows behind the head,
-- a claim of one row (direct) and one of ten (the statements) probe the
-- index once each, where they probed it 299 times each.
SELECT count(outbox_enqueue('obx_o3', 'obx.ord', jsonb_build_object('n', g),
                            ordering_key => 'H'))
  FROM generate_series(1, 300) g;
SELECT payload->>'n' AS head_leased FROM outbox_claim('w', 1, '1 hour', tenant => 'obx_o3');
-- (the counts of index scans not yet reported: within a transaction block
-- nothing is reported, so their growth counts the probes)
BEGIN;
SELECT pg_stat_get_xact_numscans('idempotency.outbox_ordering_idx'::regclass) AS scans \gset
SELECT count(*) AS one_row_claim FROM outbox_claim('w', 1, '1 minute', tenant => 'obx_o3');
SELECT pg_stat_get_xact_numscans('idempotency.outbox_ordering_idx'::regclass) - :scans AS probes;
SELECT count(*) AS batch_claim FROM outbox_claim('w', 10, '1 minute', tenant => 'obx_o3');
SELECT pg_stat_get_xact_numscans('idempotency.outbox_ordering_idx'::regclass) - :scans AS probes;
COMMIT;
-- the memo is the claim's own: once the head is done, the next claims
-- take the rows behind it in order, one at a time
UPDATE idempotency.outbox SET status = 'done', done_at = now(), lease_until = NULL
 WHERE tenant_id = 'obx_o3' AND status = 'leased';
SELECT payload->>'n' AS next FROM outbox_claim('w', 1, '1 minute', tenant => 'obx_o3');
SELECT payload->>'n' AS then_nothing FROM outbox_claim('w', 10, '1 minute', tenant => 'obx_o3');
-- the same rows seen by the function directly in one statement: only the
-- first row not done heads the key, whatever order the rows are read in
SELECT count(*) FILTER (WHERE h) AS heads, count(*) FILTER (WHERE NOT h) AS behind,
       min(n) FILTER (WHERE h) AS head_n
  FROM (SELECT (payload->>'n')::int AS n,
               idempotency.outbox_ordering_head(tableoid, tenant_id, ordering_key, id) AS h
          FROM idempotency.outbox
         WHERE tenant_id = 'obx_o3' AND status <> 'done'
         ORDER BY id DESC) r;

DELETE FROM idempotency.outbox WHERE tenant_id IN ('obx_o', 'obx_o2', 'obx_o3');

-- the identifiers the outbox's indexes compare are compared byte for byte
-- (collation "C"), as the keys' tenants, scopes and keys are
SELECT a.attname, a.attcollation::regcollation AS collation
  FROM pg_attribute a
 WHERE a.attrelid = 'idempotency.outbox'::regclass
   AND a.attname IN ('tenant_id', 'topic', 'dedup_key', 'ordering_key')
 ORDER BY a.attnum;
