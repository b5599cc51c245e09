-- The example payments service's own tables.  Run by the database owner (a
-- DBA), once; the idempotency extension must already exist in the database
-- (CREATE EXTENSION idempotency).  roles.sql then grants each program only
-- what it uses, and scope.sql (run as the operations role) sets the
-- policy of the "charges" scope.
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

-- Every charge is written under an idempotency key: a code path that
-- inserts a charge without reserving a key of the "charges" scope in its
-- transaction fails (SQLSTATE ID001) instead of charging twice on a retry.
-- The worker only updates charges, so the guard covers INSERT.
CREATE OR REPLACE TRIGGER charges_need_key
    BEFORE INSERT ON payments.charges
    FOR EACH STATEMENT EXECUTE FUNCTION idem_require_reservation('charges');
