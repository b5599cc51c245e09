-- The roles the conformance clients log in as (run by a superuser, once per
-- cluster): an application role and a worker role, each granted the
-- extension's role for its job, as README.md tells users to do.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'client_app') THEN
        CREATE ROLE client_app LOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'client_worker') THEN
        CREATE ROLE client_worker LOGIN;
    END IF;
    -- granted when the installed version of the extension has these roles
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'idempotency_app') THEN
        GRANT idempotency_app TO client_app;
        GRANT idempotency_worker TO client_worker;
    END IF;
END
$$;
