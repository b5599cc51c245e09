\set t random(1, :ntenants)
\set k random(1, 4000000000000000000)
SELECT outcome FROM idem_reserve('tenant-' || :t, 'orders', 'k-' || :client_id || '-' || :k, '{"customer": "cus_42", "amount": 19.99}'::jsonb);
