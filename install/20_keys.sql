
/* ---- keys.c: reserve, complete, replay ---- */

CREATE TYPE idempotency.status AS ENUM ('processing', 'succeeded', 'failed');

CREATE TYPE idempotency.outcome AS ENUM
    ('created', 'replay', 'in_progress', 'mismatch', 'stale', 'rate_limited');

CREATE TYPE idempotency.stale_action AS ENUM ('fail', 'takeover');

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
 * Tenants, scopes and keys are opaque identifiers, compared byte for byte
 * (collation "C"): every probe of keys_pkey compares them, and the
 * database's linguistic collation would make each comparison many times
 * dearer without changing which keys are equal.
 */
CREATE TABLE idempotency.keys (
    tenant_id            text COLLATE pg_catalog."C" NOT NULL,
    scope                text COLLATE pg_catalog."C" NOT NULL,
    idem_key             text COLLATE pg_catalog."C" NOT NULL,
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
    -- The key before the scope: a probe compares the tenant, then the key,
    -- which differs from entry to entry, and seldom reaches the scope; in
    -- the order (tenant_id, scope, idem_key) every comparison on the way
    -- down the tree also compared the scope, nearly always equal (a
    -- replay cost 12% more).  A count of a tenant's keys in one
    -- scope (quotas) still reads the tenant's range, the scope an index
    -- condition.
    CONSTRAINT keys_pkey PRIMARY KEY (tenant_id, idem_key, scope)
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

REVOKE ALL ON idempotency.keys, idempotency.scopes FROM PUBLIC;
GRANT SELECT ON idempotency.keys, idempotency.scopes TO idempotency_admin;

/*
 * Scope policies and live keys are data a dump must keep: a restored
 * database that forgot its keys would run retries again, and one that
 * forgot fingerprint_ignore would refuse honest retries.
 */
SELECT pg_catalog.pg_extension_config_dump('idempotency.keys', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.scopes', '');

/*
 * User-facing functions that take a tenant are declared SECURITY INVOKER
 * and run as their owner in C, with search_path pinned to pg_catalog,
 * pg_temp (idem_owner_enter): they reach idempotency.keys (not readable by
 * PUBLIC) and never depend on the caller's search_path, as SECURITY DEFINER
 * with a SET clause would, without the per-call cost of a function-level
 * SET; and they see the role calling them, whose tenant binding they
 * enforce (a bound role's SECURITY DEFINER function, or an index function
 * run as its table's owner, is held to its binding whoever runs it).
 * Not STRICT: a NULL argument is an error with a hint, not a silent NULL.
 */
/*
 * One signature, so that a driver sending every parameter untyped (or psql
 * literals) resolves the call to exactly one function: exactly one of
 * request and fingerprint is given.
 */
CREATE FUNCTION idem_reserve(tenant text, scope text, key text,
                             request jsonb DEFAULT NULL,
                             ttl interval DEFAULT NULL,
                             wait interval DEFAULT '0',
                             fingerprint bytea DEFAULT NULL)
RETURNS idempotency.reservation
AS 'MODULE_PATHNAME', 'idem_reserve'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idem_reserve(text, text, text, jsonb, interval, interval, bytea) IS
'reserve an idempotency key for a request (or its SHA-256 fingerprint): created, replay, in_progress, mismatch or stale';

CREATE FUNCTION idem_complete(tenant text, scope text, key text,
                              response_code int, response_body jsonb,
                              response_headers jsonb DEFAULT NULL,
                              lock_token uuid DEFAULT NULL,
                              retryable bool DEFAULT false)
RETURNS idempotency.status
AS 'MODULE_PATHNAME', 'idem_complete'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idem_complete(text, text, text, int, jsonb, jsonb, uuid, bool) IS
'store the response of a reservation (2xx/3xx succeeded, 4xx failed); release the key instead when retryable, for the scope''s retryable_codes, and for 5xx unless cached';

CREATE FUNCTION idem_checkpoint(tenant text, scope text, key text,
                                recovery_point text, lock_token uuid DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_checkpoint'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idem_checkpoint(text, text, text, text, uuid) IS
'record the recovery point of a two-phase reservation and renew its lock';

CREATE FUNCTION idem_release(tenant text, scope text, key text,
                             lock_token uuid DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_release'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idem_release(text, text, text, uuid) IS
'give a reservation up without storing a response: a retry runs afresh';

CREATE FUNCTION idem_lookup(tenant text, scope text, key text)
RETURNS TABLE (tenant_id text, scope text, idem_key text, fingerprint bytea,
               status idempotency.status, locked_at timestamptz,
               recovery_point text, response_code int, response_body jsonb,
               response_headers jsonb, needs_reconciliation bool,
               created_at timestamptz, completed_at timestamptz,
               expires_at timestamptz)
AS 'MODULE_PATHNAME', 'idem_lookup'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 1;

COMMENT ON FUNCTION idem_lookup(text, text, text) IS
'the row of an idempotency key, without side effects and without its lock_token';

/* Admin: an operator's verdict on a reservation flagged for reconciliation. */
CREATE FUNCTION idem_resolve(tenant text, scope text, key text,
                             response_code int, response_body jsonb)
RETURNS idempotency.status
AS 'MODULE_PATHNAME', 'idem_resolve'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idem_resolve(text, text, text, int, jsonb) IS
'store the outcome an operator established for a processing key and clear needs_reconciliation';

REVOKE EXECUTE ON FUNCTION idem_resolve(text, text, text, int, jsonb) FROM PUBLIC;

/*
 * Admin: set a scope's policy.  "options" is a JSON object with any of ttl,
 * lock_timeout (interval text or seconds), cache_server_errors (boolean),
 * stale_action ("fail" or "takeover"), fingerprint_ignore (array of JSON
 * Pointers), retryable_codes (status codes never stored),
 * new_keys_per_second and new_keys_burst (a rate of new keys per tenant),
 * max_live_keys (a quota of unexpired keys per tenant); a
 * member set to null goes back to the default, members not given keep
 * their value.  Everything is checked before the row is written.
 */
CREATE FUNCTION idem_configure_scope(scope text, options jsonb)
RETURNS idempotency.scopes
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    valid constant text[] := ARRAY['ttl', 'lock_timeout', 'cache_server_errors',
                                   'stale_action', 'fingerprint_ignore',
                                   'retryable_codes', 'new_keys_per_second',
                                   'new_keys_burst', 'max_live_keys'];
    unknown text;
    opt text;
    v jsonb;
    iv interval;
    p_ttl interval;
    p_lock_timeout interval;
    p_cache bool := false;
    p_stale idempotency.stale_action := 'fail';
    p_ignore text[];
    p_retryable int[];
    p_rate float8;
    p_burst int;
    p_max_live int;
    cur_rate float8;
    msg text;
    det text;
    hnt text;
    result idempotency.scopes;
BEGIN
    IF scope IS NULL OR scope = '' THEN
        RAISE EXCEPTION 'scope must not be null or empty'
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'Pass the name of the scope to configure.';
    END IF;
    IF pg_catalog.octet_length(scope) > 255 THEN
        RAISE EXCEPTION 'scope is longer than 255 bytes'
            USING ERRCODE = 'string_data_right_truncation',
                  HINT = 'Use a shorter scope; tenants and scopes are names, such as "acme" or "POST /v1/charges".';
    END IF;
    IF options IS NULL THEN
        RAISE EXCEPTION 'scope options must not be null'
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'Pass an object such as {"ttl": "1 day"}; {} keeps every option as it is.';
    END IF;
    IF pg_catalog.jsonb_typeof(options) <> 'object' THEN
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
            -- compared as numeric first: a number out of range is no error of
            -- the cast (and under a microsecond, which no interval holds, is none)
            IF (v #>> '{}')::numeric < 0.000001 THEN
                iv := interval '0';
            ELSIF (v #>> '{}')::numeric > 31104000000 THEN
                iv := NULL;
            ELSE
                iv := pg_catalog.make_interval(secs => (v #>> '{}')::float8);
            END IF;
        ELSE
            BEGIN
                iv := (v #>> '{}')::interval;
            EXCEPTION WHEN data_exception THEN
                RAISE EXCEPTION 'scope option "%" is not an interval: "%"', opt, v #>> '{}'
                    USING ERRCODE = 'invalid_parameter_value',
                          HINT = 'Pass an interval as text, such as "1 day" or "90 seconds", or a number of seconds.';
            END;
        END IF;
        IF iv <= interval '0' THEN
            RAISE EXCEPTION 'scope option "%" must be positive', opt
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Pass a positive interval, or null for the default.';
        END IF;
        -- a negative part makes the length depend on the date it is added
        -- to ('-1 mon 30 days 23 hours' is positive in some months only)
        IF extract(year FROM iv) * 12 + extract(month FROM iv) < 0
           OR extract(day FROM iv) < 0
           OR extract(hour FROM iv) * 3600 + extract(minute FROM iv) * 60
              + extract(second FROM iv) < 0 THEN
            RAISE EXCEPTION 'scope option "%" must have no negative part: "%"', opt, iv
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Pass the length without negative parts, such as "1 day" or "23 hours"; months and days vary in length.';
        END IF;
        -- expires_at and the staleness of a lock are timestamps: keep them in range
        IF iv IS NULL OR iv > interval '1000 years' THEN
            RAISE EXCEPTION 'scope option "%" must be at most 1000 years', opt
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Pass an interval such as "30 days", or null for the default.';
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
                       WHERE pg_catalog.jsonb_typeof(e) <> 'string') THEN
            RAISE EXCEPTION 'scope option "fingerprint_ignore" must be an array of JSON Pointers'
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Pass RFC 6901 pointers to the request members to leave out, such as ["/timestamp", "/meta/trace_id"].';
        END IF;
        -- every request of the scope compares its members with the list
        IF pg_catalog.jsonb_array_length(v) > 100 THEN
            RAISE EXCEPTION 'scope option "fingerprint_ignore" lists at most 100 pointers'
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Leave out the few members a retry may change, such as ["/timestamp", "/meta/trace_id"]; a pointer to an object leaves out everything under it.';
        END IF;
        SELECT pg_catalog.array_agg(e ORDER BY n) INTO p_ignore
          FROM pg_catalog.jsonb_array_elements_text(v) WITH ORDINALITY AS a(e, n);
        -- the fingerprint module's own checks of the pointers, before the
        -- write, raised as a wrong option value like every other
        BEGIN
            PERFORM idempotency.fingerprint('{}'::jsonb, p_ignore);
        EXCEPTION WHEN invalid_text_representation OR invalid_parameter_value THEN
            GET STACKED DIAGNOSTICS msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL,
                                    hnt = PG_EXCEPTION_HINT;
            RAISE EXCEPTION 'scope option "fingerprint_ignore": %', msg
                USING ERRCODE = 'invalid_parameter_value',
                      DETAIL = COALESCE(det, ''),
                      HINT = COALESCE(hnt, '');
        END;
    END IF;

    v := options -> 'retryable_codes';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF pg_catalog.jsonb_typeof(v) <> 'array'
           OR EXISTS (SELECT FROM pg_catalog.jsonb_array_elements(v) AS e
                       WHERE pg_catalog.jsonb_typeof(e) <> 'number'
                          OR (e #>> '{}')::numeric NOT BETWEEN 100 AND 599
                          OR (e #>> '{}')::numeric <> pg_catalog.trunc((e #>> '{}')::numeric)) THEN
            RAISE EXCEPTION 'scope option "retryable_codes" must be an array of status codes from 100 to 599'
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'List the codes whose responses are never stored, so that a retry runs afresh, such as [408, 429, 503].';
        END IF;
        SELECT pg_catalog.array_agg(DISTINCT (e #>> '{}')::numeric::int ORDER BY (e #>> '{}')::numeric::int) INTO p_retryable
          FROM pg_catalog.jsonb_array_elements(v) AS e;
    END IF;

    v := options -> 'new_keys_per_second';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF pg_catalog.jsonb_typeof(v) <> 'number'
           OR (v #>> '{}')::numeric < 0.000001 OR (v #>> '{}')::numeric > 1000000 THEN
            RAISE EXCEPTION 'scope option "new_keys_per_second" must be a number from 0.000001 to 1000000'
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Pass how many new keys a tenant may create per second in this scope, such as 50 or 0.5.';
        END IF;
        p_rate := (v #>> '{}')::float8;
    END IF;
    v := options -> 'new_keys_burst';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF pg_catalog.jsonb_typeof(v) <> 'number'
           OR (v #>> '{}')::numeric < 1 OR (v #>> '{}')::numeric > 1000000
           OR (v #>> '{}')::numeric <> pg_catalog.trunc((v #>> '{}')::numeric) THEN
            RAISE EXCEPTION 'scope option "new_keys_burst" must be an integer from 1 to 1000000'
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Pass how many new keys a tenant may create at once before the rate applies, such as 100.';
        END IF;
        p_burst := (v #>> '{}')::numeric::int;
    END IF;
    v := options -> 'max_live_keys';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF pg_catalog.jsonb_typeof(v) <> 'number'
           OR (v #>> '{}')::numeric < 1 OR (v #>> '{}')::numeric > 1000000000
           OR (v #>> '{}')::numeric <> pg_catalog.trunc((v #>> '{}')::numeric) THEN
            RAISE EXCEPTION 'scope option "max_live_keys" must be an integer from 1 to 1000000000'
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Pass how many unexpired keys a tenant may hold in this scope, such as 100000.';
        END IF;
        p_max_live := (v #>> '{}')::numeric::int;
    END IF;

    -- a burst is the depth of the rate's bucket: alone it limits nothing,
    -- and removing the rate removes it (below)
    IF p_burst IS NOT NULL THEN
        cur_rate := p_rate;
        IF NOT options ? 'new_keys_per_second' THEN
            SELECT s.new_keys_per_second INTO cur_rate
              FROM idempotency.scopes AS s
             WHERE s.scope = idem_configure_scope.scope;
        END IF;
        IF cur_rate IS NULL THEN
            RAISE EXCEPTION 'scope option "new_keys_burst" needs a rate'
                USING ERRCODE = 'invalid_parameter_value',
                      DETAIL = CASE WHEN options ? 'new_keys_per_second'
                                    THEN pg_catalog.format('This call removes the rate of scope "%s" and sets a burst of %s.', scope, p_burst)
                                    ELSE pg_catalog.format('Scope "%s" has no "new_keys_per_second": a burst of %s would limit nothing.', scope, p_burst) END,
                      HINT = 'Pass "new_keys_per_second" with it, such as {"new_keys_per_second": 10, "new_keys_burst": 100}: the burst is how many new keys a tenant may create at once before the rate applies.';
        END IF;
    END IF;

    -- the upsert would fail with a bare 25006: say where to send the call
    IF pg_catalog.current_setting('transaction_read_only')::pg_catalog.bool THEN
        RAISE EXCEPTION 'cannot execute idem_configure_scope() in a read-only transaction'
            USING ERRCODE = 'read_only_sql_transaction',
                  DETAIL = CASE WHEN pg_catalog.pg_is_in_recovery()
                                THEN 'This server is a standby: this call writes the extension''s tables.'
                                ELSE 'This transaction is read-only: this call writes the extension''s tables.' END,
                  HINT = 'Send the call to the primary, in a read-write transaction; a standby answers replays of finished keys and lookups.';
    END IF;

    INSERT INTO idempotency.scopes AS s
           (scope, ttl, lock_timeout, cache_server_errors, stale_action, fingerprint_ignore,
            retryable_codes, new_keys_per_second, new_keys_burst, max_live_keys)
    VALUES (idem_configure_scope.scope, p_ttl, p_lock_timeout, p_cache, p_stale, p_ignore,
            p_retryable, p_rate, p_burst, p_max_live)
    ON CONFLICT ON CONSTRAINT scopes_pkey DO UPDATE SET
        ttl = CASE WHEN options ? 'ttl' THEN EXCLUDED.ttl ELSE s.ttl END,
        lock_timeout = CASE WHEN options ? 'lock_timeout' THEN EXCLUDED.lock_timeout ELSE s.lock_timeout END,
        cache_server_errors = CASE WHEN options ? 'cache_server_errors' THEN EXCLUDED.cache_server_errors ELSE s.cache_server_errors END,
        stale_action = CASE WHEN options ? 'stale_action' THEN EXCLUDED.stale_action ELSE s.stale_action END,
        fingerprint_ignore = CASE WHEN options ? 'fingerprint_ignore' THEN EXCLUDED.fingerprint_ignore ELSE s.fingerprint_ignore END,
        retryable_codes = CASE WHEN options ? 'retryable_codes' THEN EXCLUDED.retryable_codes ELSE s.retryable_codes END,
        new_keys_per_second = CASE WHEN options ? 'new_keys_per_second' THEN EXCLUDED.new_keys_per_second ELSE s.new_keys_per_second END,
        new_keys_burst = CASE WHEN options ? 'new_keys_burst' THEN EXCLUDED.new_keys_burst
                              WHEN options ? 'new_keys_per_second' AND EXCLUDED.new_keys_per_second IS NULL THEN NULL
                              ELSE s.new_keys_burst END,
        max_live_keys = CASE WHEN options ? 'max_live_keys' THEN EXCLUDED.max_live_keys ELSE s.max_live_keys END
    RETURNING s.* INTO result;
    RETURN result;
END
$$;

COMMENT ON FUNCTION idem_configure_scope(text, jsonb) IS
'set the policy of a scope: ttl, lock_timeout, cache_server_errors, stale_action, fingerprint_ignore, retryable_codes, new_keys_per_second, new_keys_burst, max_live_keys';

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

REVOKE ALL ON FUNCTION idem_reserve(text, text, text, jsonb, interval, interval, bytea),
    idem_complete(text, text, text, int, jsonb, jsonb, uuid, bool),
    idem_checkpoint(text, text, text, text, uuid),
    idem_release(text, text, text, uuid),
    idem_lookup(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idem_reserve(text, text, text, jsonb, interval, interval, bytea),
    idem_complete(text, text, text, int, jsonb, jsonb, uuid, bool),
    idem_checkpoint(text, text, text, text, uuid),
    idem_release(text, text, text, uuid),
    idem_lookup(text, text, text) TO idempotency_app;
GRANT EXECUTE ON FUNCTION idem_resolve(text, text, text, int, jsonb),
    idem_configure_scope(text, jsonb) TO idempotency_admin;

CREATE TRIGGER scopes_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON idempotency.scopes
    FOR EACH STATEMENT EXECUTE FUNCTION idempotency.scopes_changed();

/* under logical replication: as for tenant_bindings (00_schema.sql) */
CREATE TRIGGER scopes_replicated
    AFTER INSERT OR UPDATE OR DELETE ON idempotency.scopes
    FOR EACH ROW EXECUTE FUNCTION idempotency.scopes_changed();
ALTER TABLE idempotency.scopes
    ENABLE REPLICA TRIGGER scopes_replicated,
    ENABLE ALWAYS TRIGGER scopes_changed;
