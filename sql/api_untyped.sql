-- Every function resolves to exactly one candidate when every argument is an
-- untyped literal, as psql sends literals and as drivers that send their
-- parameters untyped (node-postgres, psycopg, pgx, JDBC with
-- stringtype=unspecified) do: no call here may fail with 42725.
SELECT idem_canonical('{"b": 1, "a": [1.50, "x"]}');
SELECT idem_canonical('{"b": 1, "a": 2}', '{/b}');
SELECT encode(idem_fingerprint('{"amount": 1}'), 'hex');
SELECT encode(idem_fingerprint('{"amount": 1, "t": 2}', '{/t}'), 'hex');
SELECT scope, ttl, retryable_codes FROM idem_configure_scope('untyped', '{"ttl": "1 day", "retryable_codes": [429]}');

BEGIN;
SELECT outcome FROM idem_reserve('ut', 'untyped', 'k1', '{"amount": 1}');
SELECT outbox_enqueue('ut', 'topic', '{"amount": 1}', 'k1', 'untyped', '{"h": 1}', '0', '3', 'dedup-1', 'ord-1') IS NOT NULL AS enqueued;
SELECT idem_complete('ut', 'untyped', 'k1', '201', '{"id": 1}', '{"Location": "/1"}');
COMMIT;
SELECT outcome, response_code FROM idem_reserve('ut', 'untyped', 'k1', '{"amount": 1}', '1 day', '0');
SELECT outcome FROM idem_reserve('ut', 'untyped', 'k2',
    fingerprint => '\x000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f');
SELECT lock_token AS tok FROM idem_reserve('ut', 'untyped', 'k3', '{}') \gset
SELECT idem_checkpoint('ut', 'untyped', 'k3', 'step-1', :'tok');
SELECT idem_release('ut', 'untyped', 'k3', :'tok');
SELECT status FROM idem_lookup('ut', 'untyped', 'k1');
SELECT outcome FROM idem_reserve('ut', 'untyped', 'k4', '{}');
SELECT idem_resolve('ut', 'untyped', 'k4', '200', '{}');
BEGIN;
SELECT outcome FROM idem_reserve('ut', 'untyped', 'k5', '{}');
SELECT idem_complete('ut', 'untyped', 'k5', '503', '{}', '{}', NULL, 'true') IS NULL AS released;
SELECT idem_guard_bypass('untyped literals');
COMMIT;
CREATE FUNCTION pg_temp.ut_handler(tenant text, key text, request jsonb)
RETURNS idempotency.response LANGUAGE sql
AS $$ SELECT ROW(201, request, NULL::jsonb)::idempotency.response $$;
SELECT outcome, response_code FROM idem_execute('ut', 'untyped', 'k6', '{"a": 1}', 'pg_temp.ut_handler', '1 day', '0');
SELECT id AS id1, lease_token AS t1 FROM outbox_claim('w', '1', '1 minute', '{topic}', 'ut') \gset
SELECT outbox_nack('ut', :'id1', :'t1', 'failed', '0');
SELECT id AS id2, lease_token AS t2 FROM outbox_claim('w', '1', '1 minute') \gset
SELECT outbox_extend('ut', :'id2', :'t2', '1 minute') > now() AS extended;
SELECT outbox_ack('ut', :'id2', :'t2', 'ref');
SELECT count(*) FROM outbox_ack_many('ut', '{1,2}', '{00000000-0000-0000-0000-000000000000,00000000-0000-0000-0000-000000000001}', '{a,b}');
SELECT count(*) FROM outbox_nack_many('ut', '{1}', '{00000000-0000-0000-0000-000000000000}', 'failed', '1 minute');
SELECT outbox_enqueue('ut', 'poison', '{}', max_attempts => '1') AS id3 \gset
SELECT lease_token AS t3 FROM outbox_claim('w', '1', '1 minute', '{poison}', 'ut') \gset
SELECT outbox_nack('ut', :'id3', :'t3', 'rejected');
SELECT outbox_requeue('ut', :'id3');
SELECT lease_token AS t4 FROM outbox_claim('w', '1', '1 minute', '{poison}', 'ut') \gset
SELECT outbox_nack('ut', :'id3', :'t4', 'rejected');
SELECT outbox_discard('ut', :'id3');
SELECT idem_reap('10') >= 0 AS reaped, idem_sweep('1 hour') >= 0 AS swept,
       idem_reclaim_leases() >= 0 AS reclaimed, idem_purge_outbox('10') >= 0 AS purged;
CREATE ROLE untyped_role;
SELECT idem_bind_tenant('untyped_role', 'ut');
SELECT idem_unbind_tenant('untyped_role');
DROP ROLE untyped_role;
CALL idem_maintain('1 second', '10', '0');

-- no two functions of the extension share a name and an argument count
-- that untyped arguments could not tell apart
SELECT p.proname, count(*) AS overloads
  FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.classid = 'pg_proc'::regclass
  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency'
 WHERE d.deptype = 'e'
 GROUP BY p.proname HAVING count(*) > 1;

DELETE FROM idempotency.keys WHERE tenant_id = 'ut';
DELETE FROM idempotency.outbox WHERE tenant_id = 'ut';
DELETE FROM idempotency.scopes WHERE scope = 'untyped';
