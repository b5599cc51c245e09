\set t random(0, 9)
BEGIN;
INSERT INTO bench_orders (tenant_id, amount) VALUES ('t' || CAST(:t AS int), 4500) RETURNING order_no \gset
SELECT outbox_enqueue('t' || CAST(:t AS int), 'payment.capture',
                      jsonb_build_object('order', CAST(:order_no AS bigint), 'amount', 4500),
                      'order-' || CAST(:order_no AS bigint), 'payments');
COMMIT;
