-- Bodies for the fingerprint benchmark: a payment/order request as an API
-- receives it, with strings (some non-ASCII), integers, decimals and
-- nesting.  "lines" sets its size: 3 lines is about 1 KiB of JSON text,
-- 580 lines about 100 KiB.
CREATE FUNCTION bench_order(lines int) RETURNS jsonb
LANGUAGE sql AS $$
SELECT jsonb_build_object(
    'amount', 1299.50, 'currency', 'EUR', 'capture', true,
    'description', 'Commande n° 48213 — livraison express',
    'customer', jsonb_build_object(
        'id', 'cus_9s8d7f6g5h', 'email', 'jane.doe@example.com',
        'name', 'Jane Doe', 'phone', '+33 6 12 34 56 78',
        'address', jsonb_build_object('line1', '12 rue de la Paix', 'city', 'Paris',
                                      'postal_code', '75002', 'country', 'FR')),
    'metadata', jsonb_build_object('sent_at', '2024-05-01T12:34:56.789Z',
                                   'client', 'ios/17.4.1', 'retry', 0,
                                   'risk_score', 0.0125),
    'lines', (SELECT jsonb_agg(jsonb_build_object(
                  'sku', 'SKU-' || lpad(i::text, 6, '0'),
                  'name', 'Café crème ' || i,
                  'qty', 1 + i % 5,
                  'unit_price', 3.50 + (i % 40) * 1.25,
                  'tax_rate', 0.055,
                  'discount', jsonb_build_object('code', NULL, 'pct', 0.10),
                  'tags', jsonb_build_array('food', 'hot', i % 3 = 0)))
                FROM generate_series(1, lines) AS i))
$$;

CREATE TABLE bench_body (id int PRIMARY KEY, body jsonb NOT NULL);
-- no compression: measure the functions, not pglz
ALTER TABLE bench_body ALTER COLUMN body SET STORAGE EXTERNAL;
INSERT INTO bench_body VALUES (1, bench_order(3)), (2, bench_order(580));
SELECT id, octet_length(body::text) AS text_bytes,
       octet_length(idem_canonical(body)) AS canonical_bytes
  FROM bench_body ORDER BY id;

-- the function-only loop: the body is held in a PL/pgSQL variable
-- (detoasted once), each iteration evaluates one call
CREATE FUNCTION bench_loop(which text, body_id int, n int) RETURNS float8
LANGUAGE plpgsql AS $$
DECLARE
    b jsonb;
    t0 timestamptz;
BEGIN
    SELECT body INTO b FROM bench_body WHERE id = body_id;
    t0 := clock_timestamp();
    IF which = 'fingerprint' THEN
        FOR i IN 1 .. n LOOP
            PERFORM idem_fingerprint(b);
        END LOOP;
    ELSE
        FOR i IN 1 .. n LOOP
            PERFORM digest(b::text, 'sha256');
        END LOOP;
    END IF;
    RETURN n / extract(epoch FROM clock_timestamp() - t0);
END $$;
