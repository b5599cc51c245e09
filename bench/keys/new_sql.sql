\set k random(1, 4000000000000000000)
BEGIN;
INSERT INTO naive_keys (tenant, scope, key, fingerprint, status, expires_at) VALUES ('bench', 'orders', 'n-' || :client_id || '-' || :k, digest('{"customer": "cus_42", "amount": 19.99, "currency": "EUR", "items": [{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}]}'::jsonb::text, 'sha256'), 'processing', now() + interval '1 day') ON CONFLICT DO NOTHING;
SELECT fingerprint, status, response_code, response_body FROM naive_keys WHERE tenant = 'bench' AND scope = 'orders' AND key = 'n-' || :client_id || '-' || :k;
INSERT INTO orders (customer, amount) VALUES ('cus_42', 19.99);
INSERT INTO events (topic, payload) VALUES ('order.created', '{"customer": "cus_42", "amount": 19.99}');
UPDATE naive_keys SET status = 'succeeded', response_code = 201, response_body = '{"id": 1, "status": "paid"}' WHERE tenant = 'bench' AND scope = 'orders' AND key = 'n-' || :client_id || '-' || :k;
COMMIT;
