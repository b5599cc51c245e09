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
