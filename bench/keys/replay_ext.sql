\set k random(1, 10000)
SELECT outcome, response_code, response_body FROM idem_reserve('bench', 'orders', 'r-' || :k, '{"customer": "cus_42", "amount": 19.99, "currency": "EUR", "items": [{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}]}'::jsonb);
