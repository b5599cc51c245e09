-- The roles the conformance clients log in as (run by a superuser, once per
-- cluster, after CREATE EXTENSION idempotency): an application role and a
-- worker role, each granted the extension's role for its job, as README.md
-- tells users to do.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'client_app') THEN
        CREATE ROLE client_app LOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'client_worker') THEN
        CREATE ROLE client_worker LOGIN;
    END IF;
END
$$;
GRANT idempotency_app TO client_app;
GRANT idempotency_worker TO client_worker;

-- A handler for idem_execute (README, From your language: how each driver
-- passes its name)
CREATE OR REPLACE FUNCTION public.conformance_order(tenant text, key text, request jsonb)
RETURNS idempotency.response
LANGUAGE sql
SET search_path = pg_catalog
AS $$
    SELECT ROW(201, pg_catalog.jsonb_build_object('order', key), NULL)::idempotency.response
$$;
REVOKE ALL ON FUNCTION public.conformance_order(text, text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION public.conformance_order(text, text, jsonb) TO client_app;
