/* idempotency--1.0.sql: idempotency keys, request fingerprints, outbox */

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
GRANT USAGE ON SCHEMA idempotency TO PUBLIC;

CREATE TYPE idempotency.status AS ENUM ('processing', 'succeeded', 'failed');

CREATE TYPE idempotency.outcome AS ENUM
    ('created', 'replay', 'in_progress', 'mismatch', 'stale');

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
    CONSTRAINT outbox_pkey PRIMARY KEY (tenant_id, id),
    CONSTRAINT outbox_max_attempts_positive CHECK (max_attempts > 0)
) WITH (fillfactor = 80,
        autovacuum_vacuum_scale_factor = 0.02,
        autovacuum_analyze_scale_factor = 0.05);

REVOKE ALL ON ALL TABLES IN SCHEMA idempotency FROM PUBLIC;
/* ---- fingerprint.c: canonical JSON and request fingerprints ---- */

/*
 * Neither function reads a table, so they are plain (not SECURITY DEFINER)
 * C functions.  Both accept NULL for "ignore" (ignore nothing), so they are
 * not STRICT; a NULL request gives NULL.
 */
CREATE FUNCTION idem_canonical(request jsonb, ignore text[] DEFAULT NULL)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_canonical'
LANGUAGE C IMMUTABLE PARALLEL SAFE;

COMMENT ON FUNCTION idem_canonical(jsonb, text[]) IS
'RFC 8785 (JCS) canonical JSON text of a request, without the members named by the JSON Pointers in ignore';

CREATE FUNCTION idem_fingerprint(request jsonb, ignore text[] DEFAULT NULL)
RETURNS bytea
AS 'MODULE_PATHNAME', 'idem_fingerprint'
LANGUAGE C IMMUTABLE PARALLEL SAFE;

COMMENT ON FUNCTION idem_fingerprint(jsonb, text[]) IS
'SHA-256 of idem_canonical(request, ignore): the request fingerprint idem_reserve compares';

/* ---- keys.c: reserve, complete, replay ---- */

/*
 * User-facing functions: SECURITY DEFINER with a fixed search_path, so they
 * reach idempotency.keys (not readable by PUBLIC) and never depend on the
 * caller's search_path.  Not STRICT: a NULL argument is an error with a
 * hint, not a silent NULL.
 */
CREATE FUNCTION idem_reserve(tenant text, scope text, key text, request jsonb,
                             ttl interval DEFAULT NULL,
                             wait interval DEFAULT '0')
RETURNS idempotency.reservation
AS 'MODULE_PATHNAME', 'idem_reserve_request'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION idem_reserve(text, text, text, jsonb, interval, interval) IS
'reserve an idempotency key for a request: created, replay, in_progress, mismatch or stale';

CREATE FUNCTION idem_reserve(tenant text, scope text, key text, fingerprint bytea,
                             ttl interval DEFAULT NULL,
                             wait interval DEFAULT '0')
RETURNS idempotency.reservation
AS 'MODULE_PATHNAME', 'idem_reserve_fingerprint'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION idem_reserve(text, text, text, bytea, interval, interval) IS
'reserve an idempotency key for a request whose SHA-256 fingerprint the caller computed';

CREATE FUNCTION idem_complete(tenant text, scope text, key text,
                              response_code int, response_body jsonb,
                              response_headers jsonb DEFAULT NULL,
                              lock_token uuid DEFAULT NULL)
RETURNS idempotency.status
AS 'MODULE_PATHNAME', 'idem_complete'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION idem_complete(text, text, text, int, jsonb, jsonb, uuid) IS
'store the response of a reservation (2xx/3xx succeeded, 4xx failed, 5xx released unless cached)';

CREATE FUNCTION idem_checkpoint(tenant text, scope text, key text,
                                recovery_point text, lock_token uuid DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_checkpoint'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION idem_checkpoint(text, text, text, text, uuid) IS
'record the recovery point of a two-phase reservation and renew its lock';

CREATE FUNCTION idem_release(tenant text, scope text, key text,
                             lock_token uuid DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_release'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION idem_release(text, text, text, uuid) IS
'give a reservation up without storing a response: a retry runs afresh';

CREATE FUNCTION idem_lookup(tenant text, scope text, key text)
RETURNS SETOF idempotency.keys
AS 'MODULE_PATHNAME', 'idem_lookup'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER ROWS 1
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION idem_lookup(text, text, text) IS
'the row of an idempotency key, without side effects';

/* Admin: an operator's verdict on a reservation flagged for reconciliation. */
CREATE FUNCTION idem_resolve(tenant text, scope text, key text,
                             response_code int, response_body jsonb)
RETURNS idempotency.status
AS 'MODULE_PATHNAME', 'idem_resolve'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION idem_resolve(text, text, text, int, jsonb) IS
'store the outcome an operator established for a processing key and clear needs_reconciliation';

REVOKE EXECUTE ON FUNCTION idem_resolve(text, text, text, int, jsonb) FROM PUBLIC;

/*
 * Admin: set a scope's policy.  "options" is a JSON object with any of ttl,
 * lock_timeout (interval text or seconds), cache_server_errors (boolean),
 * stale_action ("fail" or "takeover") and fingerprint_ignore (array of JSON
 * Pointers); a member set to null goes back to the default, members not
 * given keep their value.  Everything is checked before the row is written.
 */
CREATE FUNCTION idem_configure_scope(scope text, options jsonb)
RETURNS idempotency.scopes
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    valid constant text[] := ARRAY['ttl', 'lock_timeout', 'cache_server_errors',
                                   'stale_action', 'fingerprint_ignore'];
    unknown text;
    opt text;
    v jsonb;
    iv interval;
    p_ttl interval;
    p_lock_timeout interval;
    p_cache bool := false;
    p_stale idempotency.stale_action := 'fail';
    p_ignore text[];
    result idempotency.scopes;
BEGIN
    IF scope IS NULL OR scope = '' THEN
        RAISE EXCEPTION 'scope must not be null or empty'
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'Pass the name of the scope to configure.';
    END IF;
    IF options IS NULL OR pg_catalog.jsonb_typeof(options) <> 'object' THEN
        RAISE EXCEPTION 'scope options must be a JSON object'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass an object such as {"ttl": "1 day", "stale_action": "takeover"}.';
    END IF;
    SELECT k INTO unknown
      FROM pg_catalog.jsonb_object_keys(options) AS k
     WHERE k <> ALL (valid)
     ORDER BY k LIMIT 1;
    IF unknown IS NOT NULL THEN
        RAISE EXCEPTION 'unknown scope option "%"', unknown
            USING ERRCODE = 'undefined_object',
                  HINT = 'Valid options are: ' || pg_catalog.array_to_string(valid, ', ') || '.';
    END IF;

    FOREACH opt IN ARRAY ARRAY['ttl', 'lock_timeout'] LOOP
        v := options -> opt;
        CONTINUE WHEN v IS NULL OR v = 'null';
        IF pg_catalog.jsonb_typeof(v) NOT IN ('string', 'number') THEN
            RAISE EXCEPTION 'scope option "%" must be an interval', opt
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Pass an interval as text, such as "1 day", or a number of seconds.';
        END IF;
        IF pg_catalog.jsonb_typeof(v) = 'number' THEN
            iv := pg_catalog.make_interval(secs => (v #>> '{}')::float8);
        ELSE
            iv := (v #>> '{}')::interval;
        END IF;
        IF iv <= interval '0' THEN
            RAISE EXCEPTION 'scope option "%" must be positive', opt
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Pass a positive interval, or null for the default.';
        END IF;
        IF opt = 'ttl' THEN
            p_ttl := iv;
        ELSE
            p_lock_timeout := iv;
        END IF;
    END LOOP;

    v := options -> 'cache_server_errors';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF pg_catalog.jsonb_typeof(v) <> 'boolean' THEN
            RAISE EXCEPTION 'scope option "cache_server_errors" must be a boolean'
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Pass true to store and replay 5xx responses, false to release the key on them.';
        END IF;
        p_cache := v::text::bool;
    END IF;

    v := options -> 'stale_action';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF pg_catalog.jsonb_typeof(v) <> 'string'
           OR (v #>> '{}') NOT IN ('fail', 'takeover') THEN
            RAISE EXCEPTION 'scope option "stale_action" must be "fail" or "takeover"'
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Use "fail" to flag stale reservations for reconciliation, "takeover" to hand them to the next attempt.';
        END IF;
        p_stale := (v #>> '{}')::idempotency.stale_action;
    END IF;

    v := options -> 'fingerprint_ignore';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF pg_catalog.jsonb_typeof(v) <> 'array'
           OR EXISTS (SELECT FROM pg_catalog.jsonb_array_elements(v) AS e
                       WHERE pg_catalog.jsonb_typeof(e) <> 'string'
                          OR pg_catalog.left(e #>> '{}', 1) <> '/') THEN
            RAISE EXCEPTION 'scope option "fingerprint_ignore" must be an array of JSON Pointers'
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Pass RFC 6901 pointers to the request members to leave out, such as ["/timestamp", "/meta/trace_id"].';
        END IF;
        SELECT pg_catalog.array_agg(e ORDER BY n) INTO p_ignore
          FROM pg_catalog.jsonb_array_elements_text(v) WITH ORDINALITY AS a(e, n);
        -- the fingerprint module's own checks of the pointers, before the write
        PERFORM @extschema@.idem_fingerprint('{}'::jsonb, p_ignore);
    END IF;

    INSERT INTO idempotency.scopes AS s
           (scope, ttl, lock_timeout, cache_server_errors, stale_action, fingerprint_ignore)
    VALUES (idem_configure_scope.scope, p_ttl, p_lock_timeout, p_cache, p_stale, p_ignore)
    ON CONFLICT ON CONSTRAINT scopes_pkey DO UPDATE SET
        ttl = CASE WHEN options ? 'ttl' THEN EXCLUDED.ttl ELSE s.ttl END,
        lock_timeout = CASE WHEN options ? 'lock_timeout' THEN EXCLUDED.lock_timeout ELSE s.lock_timeout END,
        cache_server_errors = CASE WHEN options ? 'cache_server_errors' THEN EXCLUDED.cache_server_errors ELSE s.cache_server_errors END,
        stale_action = CASE WHEN options ? 'stale_action' THEN EXCLUDED.stale_action ELSE s.stale_action END,
        fingerprint_ignore = CASE WHEN options ? 'fingerprint_ignore' THEN EXCLUDED.fingerprint_ignore ELSE s.fingerprint_ignore END
    RETURNING s.* INTO result;
    RETURN result;
END
$$;

COMMENT ON FUNCTION idem_configure_scope(text, jsonb) IS
'set the policy of a scope: ttl, lock_timeout, cache_server_errors, stale_action, fingerprint_ignore';

REVOKE EXECUTE ON FUNCTION idem_configure_scope(text, jsonb) FROM PUBLIC;

/*
 * Every backend caches scope policies; a change to the table sends a
 * relcache invalidation for it so that they all drop the cache.
 */
CREATE FUNCTION idempotency.scopes_changed()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_scopes_changed'
LANGUAGE C;

REVOKE EXECUTE ON FUNCTION idempotency.scopes_changed() FROM PUBLIC;

CREATE TRIGGER scopes_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON idempotency.scopes
    FOR EACH STATEMENT EXECUTE FUNCTION idempotency.scopes_changed();

/* ---- outbox.c: transactional outbox ---- */

/*
 * The claim path: due rows (pending, or leased with an expired lease: for a
 * leased row available_at is the end of its lease), oldest first.  Rows
 * that are done or dead leave the index, so it stays as small as the
 * backlog.  outbox.c's claim statement repeats this predicate verbatim.
 */
CREATE INDEX outbox_claim_idx ON idempotency.outbox (available_at)
    WHERE status IN ('pending', 'leased');

/* Dead letters are few; this keeps listing and counting them cheap. */
CREATE INDEX outbox_dead_idx ON idempotency.outbox (tenant_id, id)
    WHERE status = 'dead';

/*
 * Rows that used up their attempts, waiting for an operator: fix the cause,
 * then outbox_requeue(tenant, id).
 */
CREATE VIEW idempotency.dead_letters AS
    SELECT tenant_id, id, topic, idem_scope, idem_key, attempts, max_attempts,
           last_error, leased_by AS last_worker, created_at, payload, headers
      FROM idempotency.outbox
     WHERE status = 'dead';

REVOKE ALL ON idempotency.dead_letters FROM PUBLIC;

CREATE FUNCTION outbox_enqueue(tenant text, topic text, payload jsonb,
                               key text DEFAULT NULL,
                               scope text DEFAULT NULL,
                               headers jsonb DEFAULT NULL,
                               deliver_after interval DEFAULT '0',
                               max_attempts int DEFAULT NULL)
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'outbox_enqueue'
    LANGUAGE C VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION outbox_enqueue(text, text, jsonb, text, text, jsonb, interval, int) IS
    'queue a side effect in the current transaction; NOTIFY idempotency_outbox on commit';

CREATE FUNCTION outbox_claim(worker text, batch int DEFAULT 10,
                             lease interval DEFAULT '30 seconds',
                             topics text[] DEFAULT NULL,
                             tenant text DEFAULT NULL)
    RETURNS SETOF idempotency.outbox
    AS 'MODULE_PATHNAME', 'outbox_claim'
    LANGUAGE C VOLATILE SECURITY DEFINER ROWS 10
    SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION outbox_claim(text, int, interval, text[], text) IS
    'lease up to batch due outbox rows (FOR UPDATE SKIP LOCKED), oldest first';

CREATE FUNCTION outbox_ack(tenant text, id bigint, lease_token uuid,
                           provider_ref text DEFAULT NULL)
    RETURNS void
    AS 'MODULE_PATHNAME', 'outbox_ack'
    LANGUAGE C VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION outbox_ack(text, bigint, uuid, text) IS
    'mark a leased outbox row delivered (only with its current lease_token)';

CREATE FUNCTION outbox_nack(tenant text, id bigint, lease_token uuid,
                            error text, retry_in interval DEFAULT NULL)
    RETURNS idempotency.outbox_status
    AS 'MODULE_PATHNAME', 'outbox_nack'
    LANGUAGE C VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION outbox_nack(text, bigint, uuid, text, interval) IS
    'report a failed delivery: retry with backoff, or dead letter after max_attempts';

CREATE FUNCTION outbox_requeue(tenant text, id bigint)
    RETURNS void
    AS 'MODULE_PATHNAME', 'outbox_requeue'
    LANGUAGE C VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION outbox_requeue(text, bigint) IS
    'return a dead letter to the queue (operators only)';

REVOKE EXECUTE ON FUNCTION outbox_requeue(text, bigint) FROM PUBLIC;

/*
 * Undelivered intents are data, not configuration: pg_dump must keep them,
 * and the id sequence with them, or a restored database would lose pending
 * side effects and hand out ids again.
 */
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox_id_seq', '');
/* ---- maintenance.c: reaper, sweeper, pg_cron scheduling ---- */

/*
 * Admin functions: each runs with the extension owner's rights and a fixed
 * search_path, and EXECUTE is revoked from PUBLIC.  Grant them to the role
 * that runs maintenance (see README, "Maintenance").
 */
CREATE FUNCTION idem_reap(batch_size int DEFAULT 5000)
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'idem_reap'
    LANGUAGE C VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION idem_reap(int) IS
    'delete one batch of expired, finished keys (skips rows locked by others)';

CREATE FUNCTION idem_sweep(older_than interval DEFAULT NULL)
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'idem_sweep'
    LANGUAGE C VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION idem_sweep(interval) IS
    'flag stale processing keys as needing reconciliation';

CREATE FUNCTION idem_reclaim_leases()
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'idem_reclaim_leases'
    LANGUAGE C VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION idem_reclaim_leases() IS
    'return outbox rows with an expired lease to pending';

CREATE FUNCTION idem_purge_outbox(batch_size int DEFAULT 5000)
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'idem_purge_outbox'
    LANGUAGE C VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION idem_purge_outbox(int) IS
    'delete one batch of delivered outbox rows older than idempotency.outbox_retention';

/*
 * idem_maintain is a procedure so it can COMMIT between batches: every
 * batch is its own short transaction, and its row locks are released at
 * once.  PostgreSQL does not allow transaction control in a SECURITY
 * DEFINER procedure, or in one with a SET clause, so this one runs with the
 * caller's rights and relies on the SECURITY DEFINER functions above (which
 * the caller must be allowed to execute) and on naming everything
 * schema-qualified.  Call it as a statement of its own, not inside BEGIN.
 *
 * The defaults are gentle on purpose: small batches with a rest between
 * them leave CPU and WAL bandwidth to the requests while a backlog is
 * worked off, and still reap several hundred thousand keys per 50-second
 * run.
 */
CREATE PROCEDURE idem_maintain(time_budget interval DEFAULT '50 seconds',
                               batch_size int DEFAULT 1000,
                               batch_pause interval DEFAULT '100 milliseconds')
    LANGUAGE plpgsql
    AS $$
DECLARE
    deadline  timestamptz;
    n         bigint;
    swept     bigint;
    reclaimed bigint;
    reaped    bigint := 0;
    purged    bigint := 0;
    started   timestamptz;
BEGIN
    IF time_budget IS NULL OR time_budget <= interval '0' THEN
        RAISE EXCEPTION 'time_budget must be a positive interval'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass how long this run may take, such as ''50 seconds'' for a job that runs every minute.';
    END IF;
    IF batch_size IS NULL OR batch_size < 1 OR batch_size > 1000000 THEN
        RAISE EXCEPTION 'batch_size must be between 1 and 1000000'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use a batch of a few thousand rows so each transaction stays short.';
    END IF;
    IF batch_pause IS NULL OR batch_pause < interval '0' THEN
        RAISE EXCEPTION 'batch_pause must not be negative'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass how long to rest between batches, such as ''20 milliseconds'', or ''0''.';
    END IF;
    deadline := pg_catalog.clock_timestamp() + time_budget;

    -- first what is urgent and small: stuck reservations and lost leases
    swept := @extschema@.idem_sweep();
    reclaimed := @extschema@.idem_reclaim_leases();
    COMMIT;

    LOOP
        started := pg_catalog.clock_timestamp();
        n := @extschema@.idem_reap(batch_size);
        reaped := reaped + n;
        COMMIT;
        EXIT WHEN n < batch_size OR pg_catalog.clock_timestamp() >= deadline;
        IF batch_pause > interval '0' THEN
            -- rest at least batch_pause, and twice as long as the batch
            -- took: slow batches (a bloated table, a busy server) get
            -- longer rests, so the reaper never takes more than a third of
            -- the time it runs
            PERFORM pg_catalog.pg_sleep_for(GREATEST(batch_pause,
                (pg_catalog.clock_timestamp() - started) * 2));
        END IF;
    END LOOP;

    WHILE pg_catalog.clock_timestamp() < deadline LOOP
        n := @extschema@.idem_purge_outbox(batch_size);
        purged := purged + n;
        COMMIT;
        EXIT WHEN n < batch_size;
        IF batch_pause > interval '0' THEN
            PERFORM pg_catalog.pg_sleep_for(batch_pause);
        END IF;
    END LOOP;

    RAISE DEBUG 'idem_maintain: swept %, reclaimed %, reaped %, purged %',
        swept, reclaimed, reaped, purged;
END
$$;
COMMENT ON PROCEDURE idem_maintain(interval, int, interval) IS
    'sweep, reclaim outbox leases, reap expired keys and purge delivered outbox rows, committing between batches';

CREATE FUNCTION idem_schedule_maintenance(schedule text DEFAULT '* * * * *')
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'idem_schedule_maintenance'
    LANGUAGE C VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION idem_schedule_maintenance(text) IS
    'register or update the pg_cron job that runs idem_maintain in this database';

CREATE FUNCTION idem_unschedule_maintenance()
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'idem_unschedule_maintenance'
    LANGUAGE C VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION idem_unschedule_maintenance() IS
    'remove the pg_cron job that runs idem_maintain in this database';

REVOKE ALL ON FUNCTION idem_reap(int) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_sweep(interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_reclaim_leases() FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_purge_outbox(int) FROM PUBLIC;
REVOKE ALL ON PROCEDURE idem_maintain(interval, int, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_schedule_maintenance(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_unschedule_maintenance() FROM PUBLIC;
/* ---- stats.c: counters and health ---- */

/*
 * Cumulative counters per (tenant, scope), from shared memory.  They name
 * tenants, so they are for operators: not readable by PUBLIC, readable by
 * pg_monitor.
 */
CREATE FUNCTION idem_stats(
    OUT tenant      text,
    OUT scope       text,
    OUT created     bigint,
    OUT replayed    bigint,
    OUT in_progress bigint,
    OUT mismatched  bigint,
    OUT stale       bigint,
    OUT completed   bigint,
    OUT released    bigint,
    OUT reaped      bigint,
    OUT swept       bigint)
    RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'idem_stats'
    LANGUAGE C VOLATILE STRICT;
COMMENT ON FUNCTION idem_stats() IS
    'cumulative idempotency counters per tenant and scope';

CREATE VIEW idempotency.stats AS
    SELECT * FROM @extschema@.idem_stats();
COMMENT ON VIEW idempotency.stats IS
    'cumulative idempotency counters per tenant and scope (needs shared_preload_libraries)';

CREATE FUNCTION idem_stats_reset()
    RETURNS void
    AS 'MODULE_PATHNAME', 'idem_stats_reset'
    LANGUAGE C VOLATILE STRICT;
COMMENT ON FUNCTION idem_stats_reset() IS
    'zero every idempotency counter';

/*
 * The state an operator watches: what is stuck, what needs a human, what
 * is waiting to leave.  One pass over each table; the view runs with its
 * owner's rights, so pg_monitor needs no access to the tables themselves.
 */
CREATE VIEW idempotency.health AS
SELECT k.processing,
       k.oldest_processing_age,
       k.stale_processing,
       k.needs_reconciliation,
       k.expired_keys,
       o.outbox_pending,
       o.outbox_oldest_pending_age,
       o.outbox_leased,
       o.outbox_dead
  FROM (SELECT count(*) FILTER (WHERE k.status = 'processing')
                   AS processing,
               now() - min(coalesce(k.locked_at, k.created_at))
                   FILTER (WHERE k.status = 'processing')
                   AS oldest_processing_age,
               count(*) FILTER (
                   WHERE k.status = 'processing'
                     AND NOT k.needs_reconciliation
                     AND coalesce(k.locked_at, k.created_at) < now() - coalesce(
                           s.lock_timeout,
                           current_setting('idempotency.default_lock_timeout', true)::interval,
                           interval '5 minutes'))
                   AS stale_processing,
               count(*) FILTER (WHERE k.needs_reconciliation)
                   AS needs_reconciliation,
               count(*) FILTER (WHERE k.expires_at < now()
                                  AND k.status <> 'processing'
                                  AND NOT k.needs_reconciliation)
                   AS expired_keys
          FROM idempotency.keys k
          LEFT JOIN idempotency.scopes s ON s.scope = k.scope) k,
       (SELECT count(*) FILTER (WHERE o.status = 'pending')
                   AS outbox_pending,
               now() - min(o.available_at)
                   FILTER (WHERE o.status = 'pending' AND o.available_at <= now())
                   AS outbox_oldest_pending_age,
               count(*) FILTER (WHERE o.status = 'leased')
                   AS outbox_leased,
               count(*) FILTER (WHERE o.status = 'dead')
                   AS outbox_dead
          FROM idempotency.outbox o) o;
COMMENT ON VIEW idempotency.health IS
    'stuck reservations, reconciliation backlog, reap backlog and outbox depth';

REVOKE ALL ON FUNCTION idem_stats() FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_stats_reset() FROM PUBLIC;
REVOKE ALL ON idempotency.stats, idempotency.health FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idem_stats() TO pg_monitor;
GRANT SELECT ON idempotency.stats, idempotency.health TO pg_monitor;
