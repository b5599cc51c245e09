-- Tables and baselines for bench/keys.  The business transaction writes an
-- order and an outbox-like row; the naive baseline is the PL/pgSQL a
-- tutorial writes: INSERT ... ON CONFLICT DO NOTHING, SELECT, UPDATE, and
-- digest(body::text) from pgcrypto.
DROP DATABASE IF EXISTS bench_keys;
CREATE DATABASE bench_keys;
\c bench_keys
CREATE EXTENSION idempotency;
CREATE EXTENSION pgcrypto;

CREATE TABLE orders (
    id bigserial PRIMARY KEY,
    customer text NOT NULL,
    amount numeric NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE events (
    id bigserial PRIMARY KEY,
    topic text NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE naive_keys (
    tenant text NOT NULL,
    scope text NOT NULL,
    key text NOT NULL,
    fingerprint bytea NOT NULL,
    status text NOT NULL,
    response_code int,
    response_body jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (tenant, scope, key)
);

CREATE FUNCTION naive_reserve(p_tenant text, p_scope text, p_key text, p_body jsonb,
                              OUT outcome text, OUT response_code int, OUT response_body jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    fp bytea := digest(p_body::text, 'sha256');
    r naive_keys;
BEGIN
    INSERT INTO naive_keys (tenant, scope, key, fingerprint, status, expires_at)
    VALUES (p_tenant, p_scope, p_key, fp, 'processing', now() + interval '1 day')
    ON CONFLICT DO NOTHING;
    IF FOUND THEN
        outcome := 'created';
        RETURN;
    END IF;
    SELECT * INTO r FROM naive_keys
     WHERE tenant = p_tenant AND scope = p_scope AND key = p_key;
    IF r.fingerprint <> fp THEN
        outcome := 'mismatch';
    ELSIF r.status = 'processing' THEN
        outcome := 'in_progress';
    ELSE
        outcome := 'replay';
        response_code := r.response_code;
        response_body := r.response_body;
    END IF;
END
$$;

CREATE FUNCTION naive_complete(p_tenant text, p_scope text, p_key text, p_code int, p_body jsonb)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE naive_keys
       SET status = CASE WHEN p_code < 400 THEN 'succeeded' ELSE 'failed' END,
           response_code = p_code, response_body = p_body
     WHERE tenant = p_tenant AND scope = p_scope AND key = p_key;
END
$$;

-- The key row alone: idempotency.keys' columns, primary key, index and
-- storage, written by one plain INSERT of the finished row (no probe, no
-- lock, no fingerprint computed).  The floor plus this insert
-- (new_keyrow.sql) is what persisting a key costs at the least: no
-- implementation that stores the key durably can do less.
CREATE TABLE key_rows (LIKE idempotency.keys INCLUDING DEFAULTS INCLUDING INDEXES INCLUDING STORAGE)
    WITH (fillfactor = 70);

-- completed keys to replay, the same for every variant
DO $$
DECLARE
    body jsonb := '{"customer": "cus_42", "amount": 19.99, "currency": "EUR", "items": [{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}]}';
BEGIN
    FOR i IN 1..10000 LOOP
        PERFORM idem_reserve('bench', 'orders', 'r-' || i, body);
        PERFORM idem_complete('bench', 'orders', 'r-' || i, 201, jsonb_build_object('id', i, 'status', 'paid'));
        PERFORM naive_reserve('bench', 'orders', 'r-' || i, body);
        PERFORM naive_complete('bench', 'orders', 'r-' || i, 201, jsonb_build_object('id', i, 'status', 'paid'));
        -- a transaction holds each key it reserves until it ends, and at
        -- most idempotency.max_keys_per_transaction of them (53400)
        IF i % 500 = 0 THEN
            COMMIT;
        END IF;
    END LOOP;
    -- the same 10,000 finished keys in key_rows
    INSERT INTO key_rows SELECT * FROM idempotency.keys;
END
$$;
VACUUM ANALYZE;

-- The same business transaction as a handler for idem_execute: one
-- statement in autocommit is the whole idempotent request.
CREATE FUNCTION create_order(tenant text, key text, request jsonb)
RETURNS idempotency.response LANGUAGE plpgsql AS $$
DECLARE
    order_id bigint;
BEGIN
    INSERT INTO orders (customer, amount)
    VALUES (request ->> 'customer', (request ->> 'amount')::numeric) RETURNING id INTO order_id;
    INSERT INTO events (topic, payload)
    VALUES ('order.created', jsonb_build_object('customer', request ->> 'customer', 'amount', request -> 'amount'));
    RETURN ROW(201, jsonb_build_object('id', order_id, 'status', 'paid'), NULL)::idempotency.response;
END
$$;

-- A scope with a rate of new keys and a quota of live keys per tenant far
-- above what the bench reaches: the cost of the checks, never a refusal.
SELECT scope FROM idem_configure_scope('orders_rated',
    '{"new_keys_per_second": 1000000, "new_keys_burst": 1000000,
      "max_live_keys": 1000000000}');
