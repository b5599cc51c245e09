-- The example payments service's own tables.  The idempotency extension
-- must already exist in the database (CREATE EXTENSION idempotency).
CREATE SCHEMA IF NOT EXISTS payments;

CREATE TABLE IF NOT EXISTS payments.charges (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id    text NOT NULL,
    idem_key     text NOT NULL,
    amount       numeric(12, 2) NOT NULL CHECK (amount > 0),
    currency     text NOT NULL,
    customer     text NOT NULL,
    status       text NOT NULL DEFAULT 'pending',   -- pending -> captured
    provider_ref text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, idem_key)
);

-- Charges whose scope keeps keys for a day, and whose stale reservations
-- (none in the atomic flow this service uses) are flagged for an operator.
INSERT INTO idempotency.scopes (scope, ttl, lock_timeout, stale_action)
VALUES ('charges', interval '24 hours', interval '30 seconds', 'fail')
ON CONFLICT (scope) DO NOTHING;
