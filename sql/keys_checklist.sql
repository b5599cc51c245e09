-- The verification checklist, one check each (the concurrent cases run for
-- real in specs/keys_*.spec).
\set VERBOSITY terse

\echo 1. Concurrent identical POSTs create one resource and both get the same response
CREATE TABLE kc_orders (id serial PRIMARY KEY, amount int);
BEGIN;
SELECT outcome FROM idem_reserve('kc_t', 'orders', 'post-1', '{"amount": 5}'::jsonb);
INSERT INTO kc_orders (amount) VALUES (5);
SELECT idem_complete('kc_t', 'orders', 'post-1', 201, jsonb_build_object('id', currval('kc_orders_id_seq')));
COMMIT;
SELECT outcome, http_status, response_body FROM idem_reserve('kc_t', 'orders', 'post-1', '{"amount": 5}'::jsonb);
SELECT count(*) AS orders FROM kc_orders;

\echo 2. Same key, different request: 422
SELECT outcome, http_status FROM idem_reserve('kc_t', 'orders', 'post-1', '{"amount": 6}'::jsonb);

\echo 3. Tenants are isolated
SELECT outcome FROM idem_reserve('kc_u', 'orders', 'post-1', '{"amount": 6}'::jsonb);
SELECT tenant_id, status, response_body FROM idem_lookup('kc_u', 'orders', 'post-1');
BEGIN;
SET LOCAL idempotency.tenant = 'kc_u';
SELECT outcome FROM idem_reserve('kc_t', 'orders', 'post-1', '{"amount": 5}'::jsonb);
ROLLBACK;

\echo 4. A 409 carries Retry-After
SELECT outcome, http_status, retry_after > 0 AS has_retry_after
  FROM idem_reserve('kc_u', 'orders', 'post-1', '{"amount": 6}'::jsonb);

\echo 5. A missing key is rejected
SELECT outcome FROM idem_reserve('kc_t', 'orders', NULL, '{"amount": 5}'::jsonb);
SELECT outcome FROM idem_reserve('kc_t', 'orders', '', '{"amount": 5}'::jsonb);

\echo 6. A 500 is retried, not replayed
BEGIN;
SELECT outcome FROM idem_reserve('kc_t', 'orders', 'post-500', '{"amount": 7}'::jsonb);
SELECT idem_complete('kc_t', 'orders', 'post-500', 500, '{"error": "db down"}') AS status;
COMMIT;
SELECT outcome FROM idem_reserve('kc_t', 'orders', 'post-500', '{"amount": 7}'::jsonb);

\echo 7. A retry after the TTL is a new request
BEGIN;
SELECT outcome FROM idem_reserve('kc_t', 'orders', 'post-ttl', '{"amount": 8}'::jsonb, ttl => '1 hour');
SELECT idem_complete('kc_t', 'orders', 'post-ttl', 201, '{"id": 99}');
COMMIT;
UPDATE idempotency.keys SET expires_at = now() - interval '1 minute'
 WHERE tenant_id = 'kc_t' AND idem_key = 'post-ttl';
SELECT outcome FROM idem_reserve('kc_t', 'orders', 'post-ttl', '{"amount": 8}'::jsonb);

DROP TABLE kc_orders;
DELETE FROM idempotency.keys WHERE tenant_id IN ('kc_t', 'kc_u');
