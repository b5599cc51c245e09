\set k random(1, 10000)
SELECT status, response_code, response_body, response_headers FROM idempotency.keys WHERE tenant_id = 'bench' AND scope = 'orders' AND idem_key = 'r-' || :k;
