-- The key functions under debug_discard_caches = 1 (builds with
-- assertions, where every catalog access discards the caches): loading
-- their catalog cache waited for a pass without an invalidation, which
-- never came, and a backend's first call never returned.  On other builds
-- the setting takes only 0, and this runs as usual.
SET statement_timeout = '300s';
DO $$
BEGIN
    PERFORM pg_catalog.set_config('debug_discard_caches', '1', false);
EXCEPTION WHEN invalid_parameter_value THEN
    NULL;
END
$$;
BEGIN;
SELECT outcome FROM idem_reserve('dc_a', 'orders', 'k1', fingerprint => sha256('1'));
SELECT idem_complete('dc_a', 'orders', 'k1', 201, '{"id": 1}');
COMMIT;
SELECT outcome, response_code FROM idem_reserve('dc_a', 'orders', 'k1', fingerprint => sha256('1'));
RESET debug_discard_caches;
RESET statement_timeout;
DELETE FROM idempotency.keys WHERE tenant_id = 'dc_a';
