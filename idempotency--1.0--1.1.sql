/* idempotency--1.0--1.1.sql: upgrade from 1.0 to 1.1 */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.1'" to load this file. \quit

/*
 * idem_reserve: one signature instead of the two overloads of 1.0, which an
 * untyped request (a psql literal, or a driver that sends parameters
 * untyped) matched both of (42725).  Exactly one of request and
 * fingerprint is given.
 */
DROP FUNCTION @extschema@.idem_reserve(text, text, text, jsonb, interval, interval);
DROP FUNCTION @extschema@.idem_reserve(text, text, text, bytea, interval, interval);

CREATE FUNCTION @extschema@.idem_reserve(tenant text, scope text, key text,
                             request jsonb DEFAULT NULL,
                             ttl interval DEFAULT NULL,
                             wait interval DEFAULT '0',
                             fingerprint bytea DEFAULT NULL)
RETURNS idempotency.reservation
AS 'MODULE_PATHNAME', 'idem_reserve'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION @extschema@.idem_reserve(text, text, text, jsonb, interval, interval, bytea) IS
'reserve an idempotency key for a request (or its SHA-256 fingerprint): created, replay, in_progress, mismatch or stale';

/* ---- Least privilege (see README, Security) ---- */

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

REVOKE USAGE ON SCHEMA idempotency FROM PUBLIC;
GRANT USAGE ON SCHEMA idempotency
    TO idempotency_app, idempotency_worker, idempotency_admin, pg_monitor;

/* functions in the extension's schema: app, worker and admin, no PUBLIC */
REVOKE ALL ON FUNCTION @extschema@.idem_reserve(text, text, text, jsonb, interval, interval, bytea),
    @extschema@.idem_complete(text, text, text, int, jsonb, jsonb, uuid),
    @extschema@.idem_checkpoint(text, text, text, text, uuid),
    @extschema@.idem_release(text, text, text, uuid),
    @extschema@.idem_lookup(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.idem_reserve(text, text, text, jsonb, interval, interval, bytea),
    @extschema@.idem_complete(text, text, text, int, jsonb, jsonb, uuid),
    @extschema@.idem_checkpoint(text, text, text, text, uuid),
    @extschema@.idem_release(text, text, text, uuid),
    @extschema@.idem_lookup(text, text, text) TO idempotency_app;
GRANT EXECUTE ON FUNCTION @extschema@.idem_resolve(text, text, text, int, jsonb),
    @extschema@.idem_configure_scope(text, jsonb) TO idempotency_admin;
REVOKE ALL ON FUNCTION @extschema@.outbox_enqueue(text, text, jsonb, text, text, jsonb, interval, int),
    @extschema@.outbox_claim(text, int, interval, text[], text),
    @extschema@.outbox_ack(text, bigint, uuid, text),
    @extschema@.outbox_nack(text, bigint, uuid, text, interval),
    @extschema@.outbox_requeue(text, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.outbox_enqueue(text, text, jsonb, text, text, jsonb, interval, int)
    TO idempotency_app;
GRANT EXECUTE ON FUNCTION @extschema@.outbox_claim(text, int, interval, text[], text),
    @extschema@.outbox_ack(text, bigint, uuid, text),
    @extschema@.outbox_nack(text, bigint, uuid, text, interval) TO idempotency_worker;
GRANT EXECUTE ON FUNCTION @extschema@.outbox_requeue(text, bigint) TO idempotency_admin;
GRANT SELECT ON idempotency.dead_letters TO idempotency_admin;
GRANT EXECUTE ON FUNCTION @extschema@.idem_reap(int), @extschema@.idem_sweep(interval),
    @extschema@.idem_reclaim_leases(), @extschema@.idem_purge_outbox(int),
    @extschema@.idem_schedule_maintenance(text), @extschema@.idem_unschedule_maintenance()
    TO idempotency_admin;
GRANT EXECUTE ON PROCEDURE @extschema@.idem_maintain(interval, int, interval) TO idempotency_admin;
GRANT EXECUTE ON FUNCTION @extschema@.idem_stats() TO idempotency_admin;
GRANT EXECUTE ON FUNCTION @extschema@.idem_stats_reset() TO idempotency_admin;
GRANT SELECT ON idempotency.stats, idempotency.health TO idempotency_admin;
GRANT SELECT ON idempotency.keys, idempotency.scopes, idempotency.outbox
    TO idempotency_admin;

/*
 * idem_lookup no longer returns the lock token: whoever can look a key up
 * must not be able to complete another attempt's reservation with it.
 */
DROP FUNCTION @extschema@.idem_lookup(text, text, text);
CREATE FUNCTION @extschema@.idem_lookup(tenant text, scope text, key text)
RETURNS TABLE (tenant_id text, scope text, idem_key text, fingerprint bytea,
               status idempotency.status, locked_at timestamptz,
               recovery_point text, response_code int, response_body jsonb,
               response_headers jsonb, needs_reconciliation bool,
               created_at timestamptz, completed_at timestamptz,
               expires_at timestamptz)
AS 'MODULE_PATHNAME', 'idem_lookup'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER ROWS 1
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION @extschema@.idem_lookup(text, text, text) IS
'the row of an idempotency key, without side effects and without its lock_token';

REVOKE ALL ON FUNCTION @extschema@.idem_lookup(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.idem_lookup(text, text, text) TO idempotency_app;

/* ---- Tenant binding ---- */

CREATE TABLE idempotency.tenant_bindings (
    role   regrole PRIMARY KEY,
    tenant text NOT NULL
);
REVOKE ALL ON idempotency.tenant_bindings FROM PUBLIC;
GRANT SELECT ON idempotency.tenant_bindings TO idempotency_admin;

/* Tenant binding (admin). */
CREATE FUNCTION @extschema@.idem_bind_tenant(role regrole, tenant text)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_bind_tenant'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION @extschema@.idem_bind_tenant(regrole, text) IS
'bind a role to one tenant: it can no longer act for any other';

CREATE FUNCTION @extschema@.idem_unbind_tenant(role regrole)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_unbind_tenant'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION @extschema@.idem_unbind_tenant(regrole) IS
'remove the tenant binding of a role';

REVOKE ALL ON FUNCTION @extschema@.idem_bind_tenant(regrole, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_unbind_tenant(regrole) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.idem_bind_tenant(regrole, text) TO idempotency_admin;
GRANT EXECUTE ON FUNCTION @extschema@.idem_unbind_tenant(regrole) TO idempotency_admin;

/* ---- pg_dump keeps scope policies, live keys and tenant bindings ---- */

SELECT pg_catalog.pg_extension_config_dump('idempotency.keys', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.scopes', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.tenant_bindings', '');

/* ---- Nothing planted in another schema runs: everything qualified ---- */

CREATE OR REPLACE PROCEDURE @extschema@.idem_maintain(time_budget interval DEFAULT '50 seconds',
                               batch_size int DEFAULT 1000,
                               batch_pause interval DEFAULT '100 milliseconds')
    LANGUAGE plpgsql
    AS $$
-- Runs with the caller's search_path (a procedure that commits can have no
-- SET clause): every operator, function and type is schema-qualified, so
-- nothing planted in another schema can run with the caller's rights.
DECLARE
    deadline  pg_catalog.timestamptz;
    n         pg_catalog.int8;
    swept     pg_catalog.int8;
    reclaimed pg_catalog.int8;
    reaped    pg_catalog.int8 := 0;
    purged    pg_catalog.int8 := 0;
    started   pg_catalog.timestamptz;
BEGIN
    IF time_budget IS NULL
       OR time_budget OPERATOR(pg_catalog.<=) '0'::pg_catalog.interval THEN
        RAISE EXCEPTION 'time_budget must be a positive interval'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass how long this run may take, such as ''50 seconds'' for a job that runs every minute.';
    END IF;
    IF batch_size IS NULL OR batch_size OPERATOR(pg_catalog.<) 1
       OR batch_size OPERATOR(pg_catalog.>) 1000000 THEN
        RAISE EXCEPTION 'batch_size must be between 1 and 1000000'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use a batch of a few thousand rows so each transaction stays short.';
    END IF;
    IF batch_pause IS NULL
       OR batch_pause OPERATOR(pg_catalog.<) '0'::pg_catalog.interval THEN
        RAISE EXCEPTION 'batch_pause must not be negative'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass how long to rest between batches, such as ''20 milliseconds'', or ''0''.';
    END IF;
    deadline := pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) time_budget;
    -- COMMIT works only in a procedure CALLed as a statement of its own:
    -- inside a transaction block or a function, fail (2D000) here, before
    -- the sweep writes, rather than at the first COMMIT after it
    COMMIT;

    -- first what is urgent and small: stuck reservations and lost leases
    swept := @extschema@.idem_sweep(NULL::pg_catalog.interval);
    reclaimed := @extschema@.idem_reclaim_leases();
    COMMIT;

    LOOP
        started := pg_catalog.clock_timestamp();
        n := @extschema@.idem_reap(batch_size);
        reaped := reaped OPERATOR(pg_catalog.+) n;
        COMMIT;
        EXIT WHEN n OPERATOR(pg_catalog.<) batch_size
               OR pg_catalog.clock_timestamp() OPERATOR(pg_catalog.>=) deadline;
        IF batch_pause OPERATOR(pg_catalog.>) '0'::pg_catalog.interval THEN
            -- rest at least batch_pause, and twice as long as the batch
            -- took: slow batches (a bloated table, a busy server) get
            -- longer rests, so the reaper never takes more than a third of
            -- the time it runs
            PERFORM pg_catalog.pg_sleep_for(GREATEST(batch_pause,
                (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) started)
                    OPERATOR(pg_catalog.*) 2::pg_catalog.float8));
        END IF;
    END LOOP;

    WHILE pg_catalog.clock_timestamp() OPERATOR(pg_catalog.<) deadline LOOP
        n := @extschema@.idem_purge_outbox(batch_size);
        purged := purged OPERATOR(pg_catalog.+) n;
        COMMIT;
        EXIT WHEN n OPERATOR(pg_catalog.<) batch_size;
        IF batch_pause OPERATOR(pg_catalog.>) '0'::pg_catalog.interval THEN
            PERFORM pg_catalog.pg_sleep_for(batch_pause);
        END IF;
    END LOOP;

    RAISE DEBUG 'idem_maintain: swept %, reclaimed %, reaped %, purged %',
        swept, reclaimed, reaped, purged;
END
$$;

CREATE OR REPLACE VIEW idempotency.health AS
SELECT k.processing,
       k.oldest_processing_age,
       k.stale_processing,
       k.needs_reconciliation,
       k.expired_keys,
       o.outbox_pending,
       o.outbox_oldest_pending_age,
       o.outbox_leased,
       o.outbox_dead
  FROM (SELECT pg_catalog.count(*) FILTER (
                   WHERE k.status OPERATOR(pg_catalog.=) 'processing')
                   AS processing,
               pg_catalog.now() OPERATOR(pg_catalog.-)
                   pg_catalog.min(COALESCE(k.locked_at, k.created_at)) FILTER (
                   WHERE k.status OPERATOR(pg_catalog.=) 'processing')
                   AS oldest_processing_age,
               pg_catalog.count(*) FILTER (
                   WHERE k.status OPERATOR(pg_catalog.=) 'processing'
                     AND NOT k.needs_reconciliation
                     AND COALESCE(k.locked_at, k.created_at) OPERATOR(pg_catalog.<)
                         (pg_catalog.now() OPERATOR(pg_catalog.-) COALESCE(
                           s.lock_timeout,
                           pg_catalog.current_setting('idempotency.default_lock_timeout', true)::pg_catalog.interval,
                           '5 minutes'::pg_catalog.interval)))
                   AS stale_processing,
               pg_catalog.count(*) FILTER (WHERE k.needs_reconciliation)
                   AS needs_reconciliation,
               pg_catalog.count(*) FILTER (
                   WHERE k.expires_at OPERATOR(pg_catalog.<) pg_catalog.now()
                     AND k.status OPERATOR(pg_catalog.<>) 'processing'
                     AND NOT k.needs_reconciliation)
                   AS expired_keys
          FROM idempotency.keys k
          LEFT JOIN idempotency.scopes s ON s.scope OPERATOR(pg_catalog.=) k.scope) k,
       (SELECT pg_catalog.count(*) FILTER (WHERE o.status OPERATOR(pg_catalog.=) 'pending')
                   AS outbox_pending,
               pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.min(o.available_at) FILTER (
                   WHERE o.status OPERATOR(pg_catalog.=) 'pending'
                     AND o.available_at OPERATOR(pg_catalog.<=) pg_catalog.now())
                   AS outbox_oldest_pending_age,
               pg_catalog.count(*) FILTER (WHERE o.status OPERATOR(pg_catalog.=) 'leased')
                   AS outbox_leased,
               pg_catalog.count(*) FILTER (WHERE o.status OPERATOR(pg_catalog.=) 'dead')
                   AS outbox_dead
          FROM idempotency.outbox o) o;

CREATE OR REPLACE VIEW idempotency.dead_letters AS
    SELECT tenant_id, id, topic, idem_scope, idem_key, attempts, max_attempts,
           last_error, leased_by AS last_worker, created_at, payload, headers
      FROM idempotency.outbox
     WHERE status OPERATOR(pg_catalog.=) 'dead';

/* ---- Outbox: lease extension, batch acknowledgement, deduplicated enqueue,
 * ordered delivery ---- */

CREATE FUNCTION @extschema@.outbox_extend(tenant text, id bigint, lease_token uuid,
                              lease interval DEFAULT '30 seconds')
    RETURNS timestamptz
    AS 'MODULE_PATHNAME', 'outbox_extend'
    LANGUAGE C VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION @extschema@.outbox_extend(text, bigint, uuid, interval) IS
    'heartbeat: extend the lease of a row still leased under lease_token to now + lease';

REVOKE ALL ON FUNCTION @extschema@.outbox_extend(text, bigint, uuid, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.outbox_extend(text, bigint, uuid, interval)
    TO idempotency_worker;

CREATE FUNCTION @extschema@.outbox_ack_many(tenant text, ids bigint[], lease_tokens uuid[],
                                provider_refs text[] DEFAULT NULL)
    RETURNS SETOF bigint
    AS 'MODULE_PATHNAME', 'outbox_ack_many'
    LANGUAGE C VOLATILE SECURITY DEFINER ROWS 100
    SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION @extschema@.outbox_ack_many(text, bigint[], uuid[], text[]) IS
    'outbox_ack for many rows in one statement; returns the ids acknowledged';

CREATE FUNCTION @extschema@.outbox_nack_many(tenant text, ids bigint[], lease_tokens uuid[],
                                 error text, retry_in interval DEFAULT NULL)
    RETURNS TABLE (id bigint, status idempotency.outbox_status)
    AS 'MODULE_PATHNAME', 'outbox_nack_many'
    LANGUAGE C VOLATILE SECURITY DEFINER ROWS 100
    SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION @extschema@.outbox_nack_many(text, bigint[], uuid[], text, interval) IS
    'outbox_nack for many rows in one statement; returns each row reported and its new status';

REVOKE ALL ON FUNCTION @extschema@.outbox_ack_many(text, bigint[], uuid[], text[]),
    @extschema@.outbox_nack_many(text, bigint[], uuid[], text, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.outbox_ack_many(text, bigint[], uuid[], text[]),
    @extschema@.outbox_nack_many(text, bigint[], uuid[], text, interval) TO idempotency_worker;

/*
 * outbox_enqueue takes a dedup_key and an ordering_key: new columns go at
 * the end of the table, in the order of a fresh install, and the function
 * is replaced (one signature, so an untyped call matches exactly one).
 */
ALTER TABLE idempotency.outbox ADD COLUMN dedup_key text;
ALTER TABLE idempotency.outbox ADD COLUMN ordering_key text;

CREATE UNIQUE INDEX outbox_dedup_idx ON idempotency.outbox (tenant_id, topic, dedup_key)
    WHERE dedup_key IS NOT NULL;

/*
 * Ordered delivery: the rows of a tenant and ordering key not yet
 * finished, by id.  The claim asks it whether a row has an unfinished
 * predecessor; outbox.c repeats this status list verbatim.
 */
CREATE INDEX outbox_ordering_idx ON idempotency.outbox (tenant_id, ordering_key, id)
    WHERE status IN ('pending', 'leased', 'dead') AND ordering_key IS NOT NULL;

DROP FUNCTION @extschema@.outbox_enqueue(text, text, jsonb, text, text, jsonb, interval, int);

CREATE FUNCTION @extschema@.outbox_enqueue(tenant text, topic text, payload jsonb,
                               key text DEFAULT NULL,
                               scope text DEFAULT NULL,
                               headers jsonb DEFAULT NULL,
                               deliver_after interval DEFAULT '0',
                               max_attempts int DEFAULT NULL,
                               dedup_key text DEFAULT NULL,
                               ordering_key text DEFAULT NULL)
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'outbox_enqueue'
    LANGUAGE C VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION @extschema@.outbox_enqueue(text, text, jsonb, text, text, jsonb, interval, int, text, text) IS
    'queue a side effect in the current transaction; NOTIFY idempotency_outbox on commit';

REVOKE ALL ON FUNCTION @extschema@.outbox_enqueue(text, text, jsonb, text, text, jsonb, interval, int, text, text)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.outbox_enqueue(text, text, jsonb, text, text, jsonb, interval, int, text, text)
    TO idempotency_app;
