/* idempotency: idempotency keys, request fingerprints, outbox (install script) */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "CREATE EXTENSION idempotency" to load this file. \quit

/*
 * Tables, types and views live in schema "idempotency"; the functions users
 * call are created in the extension's schema (@extschema@, default public).
 * No table is readable by PUBLIC: the user-facing functions are SECURITY
 * DEFINER with a fixed search_path, and name every object schema-qualified.
 */
CREATE SCHEMA idempotency;
REVOKE ALL ON SCHEMA idempotency FROM PUBLIC;

/*
 * Three roles carry the privileges, so that "GRANT idempotency_app TO
 * my_app" is the whole set-up of an application role.  Roles belong to the
 * cluster, not to a database: another database that installed the
 * extension may have created them already.  NOLOGIN: they are granted to
 * the roles that log in.
 */
-- Several databases may install (or update) the extension at the same
-- time: a role another one created meanwhile (it commits first, and this
-- CREATE ROLE then fails on the role's name) is taken as it is.
DO $roles$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles
                    WHERE rolname OPERATOR(pg_catalog.=) 'idempotency_app') THEN
        BEGIN
            CREATE ROLE idempotency_app NOLOGIN;
        EXCEPTION WHEN unique_violation OR duplicate_object THEN
            NULL;
        END;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles
                    WHERE rolname OPERATOR(pg_catalog.=) 'idempotency_worker') THEN
        BEGIN
            CREATE ROLE idempotency_worker NOLOGIN;
        EXCEPTION WHEN unique_violation OR duplicate_object THEN
            NULL;
        END;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles
                    WHERE rolname OPERATOR(pg_catalog.=) 'idempotency_admin') THEN
        BEGIN
            CREATE ROLE idempotency_admin NOLOGIN;
        EXCEPTION WHEN unique_violation OR duplicate_object THEN
            NULL;
        END;
    END IF;
END
$roles$;

GRANT USAGE ON SCHEMA idempotency
    TO idempotency_app, idempotency_worker, idempotency_admin, pg_monitor;


/*
 * Roles bound to one tenant (idem_bind_tenant): whatever such a role SETs
 * or names, every function refuses to act for another tenant.
 */
CREATE TABLE idempotency.tenant_bindings (
    role   regrole PRIMARY KEY,
    tenant text NOT NULL
);

/*
 * Every backend caches the binding of its roles; a change to the table
 * sends a relcache invalidation for it, so that a binding takes effect in
 * sessions already open (pooled connections) at their next call.
 */
CREATE FUNCTION idempotency.tenant_bindings_changed()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_scopes_changed'
LANGUAGE C;

REVOKE EXECUTE ON FUNCTION idempotency.tenant_bindings_changed() FROM PUBLIC;

CREATE TRIGGER tenant_bindings_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON idempotency.tenant_bindings
    FOR EACH STATEMENT EXECUTE FUNCTION idempotency.tenant_bindings_changed();

/*
 * Under logical replication (README, "Logical replication") the apply
 * worker runs with session_replication_role = replica and fires no
 * statement trigger for a replicated row: this row trigger, enabled for
 * replica only, sends the same invalidation there; the statement trigger
 * fires always, for a replicated TRUNCATE and the initial copy.
 */
CREATE TRIGGER tenant_bindings_replicated
    AFTER INSERT OR UPDATE OR DELETE ON idempotency.tenant_bindings
    FOR EACH ROW EXECUTE FUNCTION idempotency.tenant_bindings_changed();
ALTER TABLE idempotency.tenant_bindings
    ENABLE REPLICA TRIGGER tenant_bindings_replicated,
    ENABLE ALWAYS TRIGGER tenant_bindings_changed;

REVOKE ALL ON idempotency.tenant_bindings FROM PUBLIC;
GRANT SELECT ON idempotency.tenant_bindings TO idempotency_admin;

/*
 * Tenant bindings, like scope policies and live keys (20_keys.sql), are
 * data a dump must keep.
 */
SELECT pg_catalog.pg_extension_config_dump('idempotency.tenant_bindings', '');

/* Tenant binding (admin). */
CREATE FUNCTION idem_bind_tenant(role regrole, tenant text)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_bind_tenant'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION idem_bind_tenant(regrole, text) IS
'bind a role to one tenant: it can no longer act for any other';

CREATE FUNCTION idem_unbind_tenant(role regrole)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_unbind_tenant'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION idem_unbind_tenant(regrole) IS
'remove the tenant binding of a role';

REVOKE ALL ON FUNCTION idem_bind_tenant(regrole, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_unbind_tenant(regrole) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idem_bind_tenant(regrole, text) TO idempotency_admin;
GRANT EXECUTE ON FUNCTION idem_unbind_tenant(regrole) TO idempotency_admin;
