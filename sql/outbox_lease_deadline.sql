-- The lease recovery under a statement_timeout: idem_reclaim_leases stops
-- starting batches at three fifths of the statement's timeout.  These
-- checks count on a batch finishing within the time left, so make
-- check-valgrind (a server some 30 times slower) leaves them out; the rest
-- of the lease recovery is in outbox_lease.

-- idem_reclaim_leases returns expired leases in batches of 1,000, the
-- longest expired first, until none is left; under a statement_timeout it
-- stops starting batches at three fifths of it, after one batch at least,
-- so that idem_maintain ends instead of being canceled with every run by a
-- backlog of expired leases.  Here the statement spends 2.5 s of its 4
-- asleep (its deadline is 2.4 s) before it reclaims.
INSERT INTO idempotency.outbox (tenant_id, topic, payload, status, attempts,
                                max_attempts, available_at, lease_until,
                                lease_token, leased_by)
SELECT 'obx_rcl', 'rcl.topic', jsonb_build_object('n', g), 'leased', 0, 10,
       timestamptz '2000-01-01' + g * interval '1 second',
       timestamptz '2000-01-01' + g * interval '1 second',
       gen_random_uuid(), 'gone-worker'
  FROM generate_series(1, 2500) g;
SET statement_timeout = '4s';
SELECT pg_sleep(2.5) IS NOT NULL AS slept, idem_reclaim_leases() AS reclaimed;
RESET statement_timeout;
SELECT status, count(*), min((payload ->> 'n')::int) AS first_n
  FROM idempotency.outbox WHERE tenant_id = 'obx_rcl' GROUP BY status ORDER BY 1;
-- without a timeout, the batches go on until none is left
SELECT idem_reclaim_leases() >= 1500 AS reclaimed_the_rest;
SELECT status, count(*), max(attempts) AS attempts, max(last_error) AS last_error
  FROM idempotency.outbox WHERE tenant_id = 'obx_rcl' GROUP BY status ORDER BY 1;
DELETE FROM idempotency.outbox WHERE tenant_id = 'obx_rcl';

-- The lease recovery reads the expired leases through outbox_lease_idx,
-- which holds the leased rows only: a backlog of due pending rows
-- (workers stopped: millions) is not read.  Before, the leases were found
-- in outbox_claim_idx among the due pending rows, in available_at order:
-- behind such a backlog every call, and every run of idem_maintain, read
-- it all, and under a short timeout either was canceled (57014) or, read
-- through a cursor that stops in time, ended before it reached a lease.
-- Here 3,000 due pending rows come before 20 expired leases, and the
-- statement spends 2.5 s of its 4 asleep (its deadline is 2.4 s, one
-- fetch of 1,000 rows at least): the 20 are reclaimed (none before).
INSERT INTO idempotency.outbox (tenant_id, topic, payload, status, attempts,
                                max_attempts, available_at)
SELECT 'obx_bkl', 'bkl.topic', jsonb_build_object('n', g), 'pending', 0, 10,
       timestamptz '1990-01-01' + g * interval '1 second'
  FROM generate_series(1, 3000) g;
INSERT INTO idempotency.outbox (tenant_id, topic, payload, status, attempts,
                                max_attempts, available_at, lease_until,
                                lease_token, leased_by)
SELECT 'obx_bkl', 'bkl.topic', jsonb_build_object('n', g), 'leased', 0, 10,
       timestamptz '2000-01-01' + g * interval '1 second',
       timestamptz '2000-01-01' + g * interval '1 second',
       gen_random_uuid(), 'gone-worker'
  FROM generate_series(1, 20) g;
SET statement_timeout = '4s';
SELECT pg_sleep(2.5) IS NOT NULL AS slept, idem_reclaim_leases() AS reclaimed;
RESET statement_timeout;
SELECT status, count(*) FROM idempotency.outbox
 WHERE tenant_id = 'obx_bkl' GROUP BY status ORDER BY 1;
-- nothing left for the next call
SELECT idem_reclaim_leases() AS reclaimed;
SELECT status, count(*), max(attempts) AS attempts FROM idempotency.outbox
 WHERE tenant_id = 'obx_bkl' GROUP BY status ORDER BY 1;
DELETE FROM idempotency.outbox WHERE tenant_id = 'obx_bkl';
