-- Least privilege for the example: three LOGIN roles, none of them a
-- superuser, each granted one of the extension's roles plus exactly what it
-- needs on the payments tables.  Run once, after schema.sql, by a role that
-- may create roles and owns the payments schema.  Passwords (or another
-- authentication method) are the deployment's business:
--     ALTER ROLE payments_service PASSWORD '...';
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['payments_service', 'payments_worker', 'payments_ops'] LOOP
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = r) THEN
            EXECUTE format('CREATE ROLE %I LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE', r);
        END IF;
    END LOOP;
END
$$;

-- The HTTP service (service.py): reserve, complete, enqueue; insert charges,
-- with the id it took from the charges' sequence, and read back what it
-- wrote.
GRANT idempotency_app TO payments_service;
GRANT USAGE ON SCHEMA payments TO payments_service;
GRANT INSERT (id, tenant_id, idem_key, amount, currency, customer, created_at),
      SELECT (id, created_at)
   ON payments.charges TO payments_service;
GRANT USAGE ON SEQUENCE payments.charges_id_seq TO payments_service;

-- The outbox worker (worker.py): claim, ack, nack; mark a charge captured.
GRANT idempotency_worker TO payments_worker;
GRANT USAGE ON SCHEMA payments TO payments_worker;
GRANT SELECT (id, tenant_id), UPDATE (status, provider_ref)
   ON payments.charges TO payments_worker;

-- Operations: scope policy, maintenance, health, stats, reconciliation of
-- flagged keys (reconcile.py), dead letters.
GRANT idempotency_admin TO payments_ops;
GRANT USAGE ON SCHEMA payments TO payments_ops;
GRANT SELECT ON payments.charges TO payments_ops;
-- The reconciliation job (reconcile.py) resolves a flagged key the provider
-- proves captured: it marks that charge captured, as the worker would have,
-- in the transaction that calls idem_resolve.  It inserts and deletes
-- nothing.
GRANT UPDATE (status, provider_ref) ON payments.charges TO payments_ops;
-- What the job leaves to the operator: recording a charge the provider
-- captured with nothing recorded (in a transaction that calls
-- idem_guard_bypass), deleting the charge of an attempt that never reached
-- the provider (with idem_resolve of its key).
GRANT INSERT (tenant_id, idem_key, amount, currency, customer, status), DELETE
   ON payments.charges TO payments_ops;
GRANT USAGE ON SEQUENCE payments.charges_id_seq TO payments_ops;
