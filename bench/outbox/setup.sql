-- bench/outbox: the extension's outbox against a hand-written SQL queue on a
-- table of the same shape (same columns, keys, indexes and fillfactor).
CREATE EXTENSION IF NOT EXISTS idempotency;

-- the business row a new request writes
CREATE TABLE bench_orders (
    tenant_id text NOT NULL,
    order_no  bigint GENERATED ALWAYS AS IDENTITY,
    amount    int NOT NULL,
    PRIMARY KEY (tenant_id, order_no)
);

CREATE TABLE plain_outbox (LIKE idempotency.outbox INCLUDING ALL)
    WITH (fillfactor = 80);
