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

/*
 * The same function under a name in schema idempotency, for
 * idem_configure_scope, which runs as the extension owner and so never
 * names the extension's own schema (see install/40_maintenance.sql).
 */
CREATE FUNCTION idempotency.fingerprint(request jsonb, ignore text[])
RETURNS bytea
AS 'MODULE_PATHNAME', 'idem_fingerprint'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
REVOKE ALL ON FUNCTION idempotency.fingerprint(jsonb, text[]) FROM PUBLIC;
