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
DO $roles$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles
                    WHERE rolname OPERATOR(pg_catalog.=) 'idempotency_app') THEN
        CREATE ROLE idempotency_app NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles
                    WHERE rolname OPERATOR(pg_catalog.=) 'idempotency_worker') THEN
        CREATE ROLE idempotency_worker NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles
                    WHERE rolname OPERATOR(pg_catalog.=) 'idempotency_admin') THEN
        CREATE ROLE idempotency_admin NOLOGIN;
    END IF;
END
$roles$;

GRANT USAGE ON SCHEMA idempotency
    TO idempotency_app, idempotency_worker, idempotency_admin, pg_monitor;

CREATE TYPE idempotency.status AS ENUM ('processing', 'succeeded', 'failed');

CREATE TYPE idempotency.outcome AS ENUM
    ('created', 'replay', 'in_progress', 'mismatch', 'stale', 'rate_limited');

CREATE TYPE idempotency.stale_action AS ENUM ('fail', 'takeover');

CREATE TYPE idempotency.outbox_status AS ENUM ('pending', 'leased', 'done', 'dead');

/*
 * What idem_reserve answers.  http_status is what the application should
 * answer its client with (NULL for "created": go ahead); retry_after is in
 * whole seconds, for the Retry-After header of a 409.
 */
CREATE TYPE idempotency.reservation AS (
    outcome          idempotency.outcome,
    http_status      int,
    response_code    int,
    response_body    jsonb,
    response_headers jsonb,
    retry_after      int,
    recovery_point   text,
    lock_token       uuid,
    expires_at       timestamptz
);

/*
 * One row per idempotency key.  The primary key starts with the tenant so
 * the table can be distributed by tenant.  No index covers a column that
 * changes when a key is completed, so completion is a HOT update; the
 * fillfactor leaves room on the page for it.  expires_at is fixed when the
 * key is reserved, so the reaper's index on it does not break HOT either.
 */
CREATE TABLE idempotency.keys (
    tenant_id            text NOT NULL,
    scope                text NOT NULL,
    idem_key             text NOT NULL,
    fingerprint          bytea NOT NULL,
    status               idempotency.status NOT NULL DEFAULT 'processing',
    lock_token           uuid,
    locked_at            timestamptz,
    recovery_point       text,
    response_code        int,
    response_body        jsonb,
    response_headers     jsonb,
    needs_reconciliation bool NOT NULL DEFAULT false,
    created_at           timestamptz NOT NULL DEFAULT pg_catalog.now(),
    completed_at         timestamptz,
    expires_at           timestamptz NOT NULL,
    CONSTRAINT keys_pkey PRIMARY KEY (tenant_id, scope, idem_key)
    -- No CHECK constraints: the executor re-reads them at the start of every
    -- INSERT and UPDATE (about 30% of the server time of a new request), and
    -- the key functions, the only writers, already refuse a key outside 1 to
    -- 255 printable ASCII bytes and a fingerprint other than 32 bytes.
) WITH (fillfactor = 70,
        autovacuum_vacuum_scale_factor = 0.02,
        autovacuum_vacuum_insert_scale_factor = 0.05,
        autovacuum_analyze_scale_factor = 0.05);

CREATE INDEX keys_expires_at_idx ON idempotency.keys (expires_at);

/*
 * Per-scope policy.  A scope with no row here uses the GUC defaults
 * (idempotency.default_ttl, idempotency.default_lock_timeout).
 */
CREATE TABLE idempotency.scopes (
    scope               text PRIMARY KEY,
    ttl                 interval,
    lock_timeout        interval,
    cache_server_errors bool NOT NULL DEFAULT false,
    stale_action        idempotency.stale_action NOT NULL DEFAULT 'fail',
    fingerprint_ignore  text[],
    retryable_codes     int[],
    new_keys_per_second float8,
    new_keys_burst      int,
    max_live_keys       int,
    CONSTRAINT scopes_ttl_positive CHECK (ttl > interval '0'),
    CONSTRAINT scopes_lock_timeout_positive CHECK (lock_timeout > interval '0')
);

/*
 * Transactional outbox: intents written in the same transaction as the
 * key and the business rows, delivered by workers outside the database.
 */
CREATE TABLE idempotency.outbox (
    tenant_id    text NOT NULL,
    id           bigint GENERATED ALWAYS AS IDENTITY,
    topic        text NOT NULL,
    payload      jsonb NOT NULL,
    headers      jsonb,
    idem_scope   text,
    idem_key     text,
    status       idempotency.outbox_status NOT NULL DEFAULT 'pending',
    attempts     int NOT NULL DEFAULT 0,
    max_attempts int NOT NULL,
    available_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    lease_token  uuid,
    leased_by    text,
    lease_until  timestamptz,
    last_error   text,
    provider_ref text,
    created_at   timestamptz NOT NULL DEFAULT pg_catalog.now(),
    done_at      timestamptz,
    dedup_key    text,
    ordering_key text,
    CONSTRAINT outbox_pkey PRIMARY KEY (tenant_id, id),
    CONSTRAINT outbox_max_attempts_positive CHECK (max_attempts > 0)
) WITH (fillfactor = 80,
        autovacuum_vacuum_scale_factor = 0.02,
        autovacuum_analyze_scale_factor = 0.05);

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

REVOKE ALL ON ALL TABLES IN SCHEMA idempotency FROM PUBLIC;
GRANT SELECT ON idempotency.keys, idempotency.scopes, idempotency.outbox,
    idempotency.tenant_bindings TO idempotency_admin;

/*
 * Scope policies, live keys and tenant bindings are data a dump must keep:
 * a restored database that forgot its keys would run retries again, and
 * one that forgot fingerprint_ignore would refuse honest retries.
 */
SELECT pg_catalog.pg_extension_config_dump('idempotency.keys', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.scopes', '');
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
