\set k random(1, 4000000000000000000)
BEGIN;
INSERT INTO key_rows (tenant_id, scope, idem_key, fingerprint, status, response_code, response_body, completed_at, expires_at) VALUES ('bench', 'orders', 'n-' || :client_id || '-' || :k, '\x8a5e6f0c1b2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b', 'succeeded', 201, '{"id": 1, "status": "paid"}', now(), now() + interval '1 day');
INSERT INTO orders (customer, amount) VALUES ('cus_42', 19.99);
INSERT INTO events (topic, payload) VALUES ('order.created', '{"customer": "cus_42", "amount": 19.99}');
SELECT 'n-' || :client_id || '-' || :k;
COMMIT;
