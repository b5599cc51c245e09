\set t random(0, 9)
BEGIN;
INSERT INTO bench_orders (tenant_id, amount) VALUES ('t' || CAST(:t AS int), 4500) RETURNING order_no \gset
INSERT INTO plain_outbox (tenant_id, topic, payload, idem_scope, idem_key, max_attempts)
VALUES ('t' || CAST(:t AS int), 'payment.capture',
        jsonb_build_object('order', CAST(:order_no AS bigint), 'amount', 4500),
        'payments', 'order-' || CAST(:order_no AS bigint), 10)
RETURNING id;
COMMIT;
