-- The key lifecycle: created, replay, mismatch, a 5xx released, and the
-- two-phase flow with in_progress, a checkpoint, a takeover and fencing.
\pset footer off
SET ROLE shop_app;

\echo '== 1. A client POSTs an order with Idempotency-Key: order-1001.'
\echo '==    Reserve the key first thing in the transaction: "created" means go ahead.'
BEGIN;
SELECT outcome FROM idem_reserve('acme', 'orders', 'order-1001',
                                 '{"item": "book", "amount": 12.50}'::jsonb);
\echo '==    Do the work, then store the response in the same transaction.'
SELECT idem_complete('acme', 'orders', 'order-1001', 201,
                     '{"order_id": 1001}', '{"Location": "/orders/1001"}');
COMMIT;

\echo '== 2. The client timed out and retries: the stored response is replayed.'
\echo '==    Key order and number spelling do not matter to the fingerprint.'
SELECT outcome, http_status, response_body, response_headers
  FROM idem_reserve('acme', 'orders', 'order-1001',
                    '{"amount": 12.5, "item": "book"}'::jsonb);

\echo '== 3. The same key with another body is a client bug: answer 422.'
SELECT outcome, http_status
  FROM idem_reserve('acme', 'orders', 'order-1001',
                    '{"item": "pen", "amount": 2}'::jsonb);

\echo '== 4. A 5xx is not cached: the reservation is released and a retry runs afresh.'
BEGIN;
SELECT outcome FROM idem_reserve('acme', 'orders', 'order-1002', '{"item": "lamp"}'::jsonb);
SELECT idem_complete('acme', 'orders', 'order-1002', 503, '{"error": "try again"}') AS status;
COMMIT;
\echo '==    (That retry committed its reservation on its own: giving it up takes its lock_token.)'
SELECT outcome, lock_token AS retry_token
  FROM idem_reserve('acme', 'orders', 'order-1002', '{"item": "lamp"}'::jsonb) \gset
\echo outcome: :outcome
SELECT idem_release('acme', 'orders', 'order-1002', :'retry_token');

\echo '== 5. Two-phase, for work that calls the outside world.  The operator sets the'
\echo '==    scope to hand a stale reservation to the next attempt (after 2 seconds'
\echo '==    here, so that the walkthrough need not wait long):'
SET ROLE shop_ops;
SELECT scope, lock_timeout, stale_action
  FROM idem_configure_scope('payments', '{"lock_timeout": "2 seconds", "stale_action": "takeover"}');
SET ROLE shop_app;
\echo '==    The reservation commits on its own and carries a lock_token.'
SELECT outcome, lock_token AS first_token
  FROM idem_reserve('acme', 'payments', 'pay-2001', '{"amount": 40}'::jsonb) \gset
\echo outcome: :outcome
SELECT idem_checkpoint('acme', 'payments', 'pay-2001', 'charge-requested', :'first_token');
\echo '==    A retry while the first attempt works: 409 with Retry-After.'
SELECT outcome, http_status, retry_after
  FROM idem_reserve('acme', 'payments', 'pay-2001', '{"amount": 40}'::jsonb);

\echo '==    The first worker dies, and its reservation grows stale.'
SELECT pg_sleep(2.2);
\echo '==    The next retry takes over, with a new lock_token and the last recovery point.'
SELECT outcome, recovery_point, lock_token AS second_token
  FROM idem_reserve('acme', 'payments', 'pay-2001', '{"amount": 40}'::jsonb) \gset
\echo outcome: :outcome, resume from: :recovery_point

\echo '==    The first worker wakes up late: its lock_token is fenced out.'
SELECT set_config('walkthrough.first_token', :'first_token', false) IS NOT NULL AS saved;
DO $$
BEGIN
    PERFORM idem_complete('acme', 'payments', 'pay-2001', 201, '{"charge": "late"}', NULL,
                          current_setting('walkthrough.first_token')::uuid);
EXCEPTION WHEN object_in_use THEN
    RAISE NOTICE 'refused: %', SQLERRM;
END
$$;

\echo '==    The new holder finishes; retries replay its response.'
SELECT idem_complete('acme', 'payments', 'pay-2001', 201, '{"charge": "ch_2001"}', NULL, :'second_token');
SELECT outcome, http_status, response_body
  FROM idem_reserve('acme', 'payments', 'pay-2001', '{"amount": 40}'::jsonb);
