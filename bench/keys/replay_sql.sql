\set k random(1, 10000)
BEGIN;
INSERT INTO naive_keys (tenant, scope, key, fingerprint, status, expires_at) VALUES ('bench', 'orders', 'r-' || :k, digest('{"customer": "cus_42", "amount": 19.99, "currency": "EUR", "items": [{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}]}'::jsonb::text, 'sha256'), 'processing', now() + interval '1 day') ON CONFLICT DO NOTHING;
SELECT fingerprint, status, response_code, response_body FROM naive_keys WHERE tenant = 'bench' AND scope = 'orders' AND key = 'r-' || :k;
COMMIT;
