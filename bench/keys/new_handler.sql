\set k random(1, 4000000000000000000)
SELECT status FROM create_order('bench', 'n-' || :client_id || '-' || :k, '{"customer": "cus_42", "amount": 19.99, "currency": "EUR", "items": [{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}]}'::jsonb);
