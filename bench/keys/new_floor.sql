\set k random(1, 4000000000000000000)
BEGIN;
SELECT 'n-' || :client_id || '-' || :k;
INSERT INTO orders (customer, amount) VALUES ('cus_42', 19.99);
INSERT INTO events (topic, payload) VALUES ('order.created', '{"customer": "cus_42", "amount": 19.99}');
SELECT 'n-' || :client_id || '-' || :k;
COMMIT;
