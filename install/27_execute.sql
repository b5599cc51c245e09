
/* ---- execute.c: a whole request in one statement ---- */

/* What a request handler returns: the response to store and replay. */
CREATE TYPE idempotency.response AS (
    status  int,
    body    jsonb,
    headers jsonb
);

/*
 * Reserve, call the handler (tenant text, key text, request jsonb) RETURNS
 * idempotency.response when the key is new, store its response, answer.
 * SECURITY INVOKER and no search_path of its own: the handler runs as the
 * caller, with the caller's search_path; the key functions it calls run
 * as their owner with search_path pinned (idem_owner_enter).
 */
CREATE FUNCTION idem_execute(tenant text, scope text, key text, request jsonb,
                             handler regproc,
                             ttl interval DEFAULT NULL,
                             wait interval DEFAULT '0')
RETURNS idempotency.reservation
AS 'MODULE_PATHNAME', 'idem_execute'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idem_execute(text, text, text, jsonb, regproc, interval, interval) IS
'one idempotent request in one statement: reserve, call the handler when the key is new, store and return its response';

REVOKE ALL ON FUNCTION idem_execute(text, text, text, jsonb, regproc, interval, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idem_execute(text, text, text, jsonb, regproc, interval, interval)
    TO idempotency_app;
