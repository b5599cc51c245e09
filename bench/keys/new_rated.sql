\set k random(1, 4000000000000000000)
BEGIN;
SELECT outcome FROM idem_reserve('bench', 'orders_rated', 'n-' || :client_id || '-' || :k, '{"customer": "cus_42", "amount": 19.99, "currency": "EUR", "items": [{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}]}'::jsonb);
INSERT INTO orders (customer, amount) VALUES ('cus_42', 19.99);
INSERT INTO events (topic, payload) VALUES ('order.created', '{"customer": "cus_42", "amount": 19.99}');
SELECT idem_complete('bench', 'orders_rated', 'n-' || :client_id || '-' || :k, 201, '{"id": 1, "status": "paid"}');
COMMIT;
