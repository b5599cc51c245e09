-- outbox_extend: a heartbeat that moves the end of a lease, fenced like ack
-- (tenant obx_l, topics obx.*; everything is removed at the end)

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

SELECT outbox_enqueue('obx_l', 'obx.lease', '{"n": 1}') AS id1 \gset
SELECT id, lease_token AS tok1 FROM outbox_claim('w1', 1, '10 seconds', tenant => 'obx_l') \gset

-- the holder extends: lease_until and available_at move to now + lease,
-- and the row stays leased to it with the same token
SELECT outbox_extend('obx_l', :id1, :'tok1', '1 hour') AS until \gset
SELECT status, leased_by, lease_token = :'tok1' AS same_token,
       lease_until = :'until' AS until_returned,
       available_at = lease_until AS available_at_follows,
       lease_until BETWEEN now() + interval '59 minutes' AND now() + interval '61 minutes' AS one_hour
  FROM idempotency.outbox WHERE tenant_id = 'obx_l' AND id = :id1;
-- the default lease is 30 seconds; a shorter extension shortens the lease
SELECT outbox_extend('obx_l', :id1, :'tok1') - now() AS default_lease;
-- an extended row is not due: nobody else can claim it
SELECT count(*) AS claimed_by_other FROM outbox_claim('w2', 10, tenant => 'obx_l');

-- a lease that ran out but was not claimed again can still be extended
UPDATE idempotency.outbox SET lease_until = now() - interval '1 second',
       available_at = now() - interval '1 second'
 WHERE tenant_id = 'obx_l' AND id = :id1;
SELECT outbox_extend('obx_l', :id1, :'tok1', '1 minute') > now() AS extended_after_expiry;

-- once maintenance reclaimed an expired lease (idem_maintain runs
-- idem_reclaim_leases), its token neither extends nor acks (55006): the
-- row is pending, to be delivered again
SELECT outbox_enqueue('obx_l', 'obx.lease', '{"n": 9}') AS id9 \gset
SELECT lease_token AS tok9 FROM outbox_claim('w1', 1, '10 seconds', tenant => 'obx_l') \gset
UPDATE idempotency.outbox SET lease_until = now() - interval '1 second',
       available_at = now() - interval '1 second'
 WHERE tenant_id = 'obx_l' AND id = :id9;
SELECT idem_reclaim_leases() >= 1 AS reclaimed;
SELECT pg_temp.outbox_error(format('SELECT outbox_extend(%L, %s, %L)', 'obx_l', :id9, :'tok9'));
SELECT pg_temp.outbox_error(format('SELECT outbox_ack(%L, %s, %L)', 'obx_l', :id9, :'tok9'));
SELECT status, attempts FROM idempotency.outbox WHERE tenant_id = 'obx_l' AND id = :id9;
DELETE FROM idempotency.outbox WHERE tenant_id = 'obx_l' AND id = :id9;

-- fencing: once the lease expired and another worker claimed the row, the
-- old token extends nothing (55006), and the new holder's lease is intact
UPDATE idempotency.outbox SET lease_until = now() - interval '1 second',
       available_at = now() - interval '1 second'
 WHERE tenant_id = 'obx_l' AND id = :id1;
SELECT lease_token AS tok2 FROM outbox_claim('w2', 1, '5 minutes', tenant => 'obx_l') \gset
SELECT pg_temp.outbox_error(format('SELECT outbox_extend(%L, %s, %L, %L)', 'obx_l', :id1, :'tok1', '1 hour'));
SELECT leased_by, lease_token = :'tok2' AS new_token,
       lease_until < now() + interval '6 minutes' AS new_lease_kept
  FROM idempotency.outbox WHERE tenant_id = 'obx_l' AND id = :id1;

-- done and dead rows cannot be extended (55000), unknown rows and other
-- tenants' rows are missing (P0002)
SELECT outbox_ack('obx_l', :id1, :'tok2');
SELECT pg_temp.outbox_error(format('SELECT outbox_extend(%L, %s, %L)', 'obx_l', :id1, :'tok2'));
SELECT outbox_enqueue('obx_l', 'obx.lease', '{"n": 2}', max_attempts => 1) AS id2 \gset
SELECT lease_token AS tok3 FROM outbox_claim('w1', 1, tenant => 'obx_l') \gset
SELECT outbox_nack('obx_l', :id2, :'tok3', 'failed');
SELECT pg_temp.outbox_error(format('SELECT outbox_extend(%L, %s, %L)', 'obx_l', :id2, :'tok3'));
SELECT pg_temp.outbox_error(format('SELECT outbox_extend(%L, %s, %L)', 'obx_other', :id2, :'tok3'));
SELECT pg_temp.outbox_error(format('SELECT outbox_extend(%L, %s, %L)', 'obx_l', -1, :'tok3'));

-- bad input raises before anything is written
SELECT pg_temp.outbox_error('SELECT outbox_extend(NULL, 1, gen_random_uuid())');
SELECT pg_temp.outbox_error('SELECT outbox_extend(''obx_l'', NULL, gen_random_uuid())');
SELECT pg_temp.outbox_error('SELECT outbox_extend(''obx_l'', 1, NULL)');
SELECT pg_temp.outbox_error('SELECT outbox_extend(''obx_l'', 1, gen_random_uuid(), NULL)');
SELECT pg_temp.outbox_error('SELECT outbox_extend(''obx_l'', 1, gen_random_uuid(), ''0 seconds'')');
SELECT pg_temp.outbox_error('SELECT outbox_extend(''obx_l'', 1, gen_random_uuid(), ''-1 minute'')');
SELECT pg_temp.outbox_error('SELECT outbox_extend(''obx_l'', 1, gen_random_uuid(), ''100000 years'')');

DELETE FROM idempotency.outbox WHERE tenant_id = 'obx_l';

-- A worker written as a procedure that loops with COMMIT runs every round
-- inside one statement, its CALL: leases count from the start of the
-- round's transaction when that is later than the CALL's, so a lease
-- taken or extended after the procedure has run longer than it does not
-- end in the past (it did: the row went back to another claimer at once).
SELECT outbox_enqueue('obx_proc', 'proc.topic', '{"n": 1}') IS NOT NULL AS enqueued;
CREATE PROCEDURE pg_temp.proc_worker(INOUT claimed_lease_ahead bool DEFAULT NULL,
                                     INOUT extended_lease_ahead bool DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE
    r idempotency.outbox;
BEGIN
    PERFORM pg_sleep(1.5);       -- rounds before this one
    COMMIT;
    SELECT * INTO r FROM outbox_claim('proc-w', 1, '1 second', tenant => 'obx_proc');
    claimed_lease_ahead := r.lease_until > clock_timestamp();
    COMMIT;
    extended_lease_ahead :=
        outbox_extend('obx_proc', r.id, r.lease_token, '1 second') > clock_timestamp();
    COMMIT;
END
$$;
CALL pg_temp.proc_worker();
DELETE FROM idempotency.outbox WHERE tenant_id = 'obx_proc';

-- Expired leases are claimed first, longest expired first (through
-- outbox_lease_idx), then pending rows, oldest available_at first (the
-- claim indexes, which hold pending rows only: a lease writes no entry
-- into them).  A pending row due an hour ago comes after leases that ran
-- out a minute ago; a running lease is not due.  Each expired lease
-- counts its lost attempt.  (Before, leases and pending rows were read
-- together in available_at order, the pending row first.)
INSERT INTO idempotency.outbox (tenant_id, topic, payload, status, attempts,
                                max_attempts, available_at, lease_until,
                                lease_token, leased_by)
VALUES ('obx_first', 'first.topic', '{"n": "pending, due 1 h ago"}', 'pending', 0, 5,
        now() - interval '1 hour', NULL, NULL, NULL),
       ('obx_first', 'first.topic', '{"n": "lease ran out 1 min ago"}', 'leased', 0, 5,
        now() - interval '1 minute', now() - interval '1 minute', gen_random_uuid(), 'gone'),
       ('obx_first', 'first.topic', '{"n": "lease ran out 2 min ago"}', 'leased', 1, 5,
        now() - interval '2 minutes', now() - interval '2 minutes', gen_random_uuid(), 'gone'),
       ('obx_first', 'first.topic', '{"n": "lease running"}', 'leased', 0, 5,
        now() + interval '1 hour', now() + interval '1 hour', gen_random_uuid(), 'alive');
SELECT payload->>'n' AS claimed, attempts, last_error
  FROM outbox_claim('w', 10, '1 minute', tenant => 'obx_first');
DELETE FROM idempotency.outbox WHERE tenant_id = 'obx_first';
-- a claim of one row likewise (the row is leased without the executor
-- only when no expired lease its filters take is left)
INSERT INTO idempotency.outbox (tenant_id, topic, payload, status, attempts,
                                max_attempts, available_at, lease_until,
                                lease_token, leased_by)
VALUES ('obx_first', 'first.topic', '{"n": "pending"}', 'pending', 0, 5,
        now() - interval '1 hour', NULL, NULL, NULL),
       ('obx_first', 'first.topic', '{"n": "expired"}', 'leased', 0, 5,
        now() - interval '1 minute', now() - interval '1 minute', gen_random_uuid(), 'gone'),
       ('obx_first2', 'first.topic', '{"n": "another tenant, expired"}', 'leased', 0, 5,
        now() - interval '1 minute', now() - interval '1 minute', gen_random_uuid(), 'gone');
SELECT payload->>'n' AS first, attempts FROM outbox_claim('w', 1, '1 minute', tenant => 'obx_first');
SELECT payload->>'n' AS second, attempts FROM outbox_claim('w', 1, '1 minute', tenant => 'obx_first');
SELECT count(*) AS third FROM outbox_claim('w', 1, '1 minute', tenant => 'obx_first');
SELECT payload->>'n' AS by_topic, attempts FROM outbox_claim('w', 1, '1 minute', topics => '{first.topic}');
DELETE FROM idempotency.outbox WHERE tenant_id IN ('obx_first', 'obx_first2');
-- an interval whose parts have different signs compares as positive (a
-- month counts as 30 days) but may come to a negative length on the
-- calendar: '-1 year 360 days 1 hour' is five days back on any date.  Each
-- is refused before anything is written; one that moves forward on every
-- date is taken
SELECT outbox_enqueue('obx_mixed', 'mixed.topic', '{}', deliver_after => '-1 year 360 days 1 hour');
SELECT count(*) FROM outbox_claim('w', 1, '-1 year 360 days 1 hour');
SELECT outbox_extend('obx_mixed', 1, gen_random_uuid(), '-1 year 360 days 1 hour');
SELECT outbox_nack('obx_mixed', 1, gen_random_uuid(), 'HTTP 503', '-1 year 360 days 1 hour');
SELECT * FROM outbox_nack_many('obx_mixed', '{1}', ARRAY[gen_random_uuid()], 'HTTP 503', '-1 year 360 days 1 hour');
-- ...and one whose parts are each too long for the bound is refused as
-- over 1000 years (not with a bare "timestamp out of range")
SELECT outbox_enqueue('obx_mixed', 'mixed.topic', '{}', deliver_after => '300000 years -1 day');
SELECT count(*) FROM outbox_claim('w', 1, '300000 years -1 day');
SELECT count(*) AS outbox_rows FROM idempotency.outbox WHERE tenant_id = 'obx_mixed';
SELECT outbox_enqueue('obx_mixed', 'mixed.topic', '{}') AS mixed_id \gset
SELECT lease_until > now() + interval '26 days' AS lease_ahead
  FROM outbox_claim('w', 1, '1 mon -1 day', topics => '{mixed.topic}');
DELETE FROM idempotency.outbox WHERE tenant_id = 'obx_mixed';
-- a nack's error that is blank (spaces, tabs, line breaks, \v, \f) is refused
SELECT outbox_nack('obx_mixed', 1, gen_random_uuid(), E' \f\t\n\r\x0b ');
