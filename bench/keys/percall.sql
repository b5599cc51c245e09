-- Server-side cost per call, without the client round trip: replays (50000
-- calls in one statement), new keys, and new keys reserved and completed
-- (2000 in one statement), and replays planned on every call (20000
-- statements), as microseconds per call.
SET idempotency.max_keys_per_transaction = 0;
CREATE TEMP TABLE percall (variant text, usecs float8);
DO $$
DECLARE
    t0 timestamptz;
    n int;
    us_new float8;
    us_rated float8;
    us_nc float8;
    us_nc_naive float8;
    side text;
    -- the new keys' names are this run's own: a name measured before
    -- (rolled back) still has dead entries in the primary key, and a probe
    -- for it visits the heap pages they point to, which new keys never do
    run text := pg_catalog.to_hex(pg_catalog.txid_current()) || '-';
    body jsonb := '{"customer": "cus_42", "amount": 19.99, "currency": "EUR", "items": [{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}]}';
BEGIN
    FOR round IN 0..3 LOOP
        t0 := clock_timestamp();
        SELECT count(*) INTO n FROM generate_series(1, 50000) g,
               LATERAL idem_reserve('bench', 'orders', 'r-' || (g % 10000 + 1), body) r
         WHERE r.outcome = 'replay';
        INSERT INTO percall VALUES ('replay_ext', extract(epoch FROM clock_timestamp() - t0) * 1e6 / 50000);
        t0 := clock_timestamp();
        SELECT count(*) INTO n FROM generate_series(1, 50000) g,
               LATERAL naive_reserve('bench', 'orders', 'r-' || (g % 10000 + 1), body) r
         WHERE r.outcome = 'replay';
        INSERT INTO percall VALUES ('replay_plpgsql', extract(epoch FROM clock_timestamp() - t0) * 1e6 / 50000);
        -- new keys, rolled back with their subtransaction (each keeps its
        -- key's lock until then, so 2000 at a time): a scope without and
        -- with a rate of new keys and a quota of live keys per tenant.  A
        -- reservation is written by its completion or at commit, so these
        -- calls write nothing: the pairs below include the write
        BEGIN
            t0 := clock_timestamp();
            SELECT count(*) INTO n FROM generate_series(1, 2000) g,
                   LATERAL idem_reserve('bench', 'orders', 'pc-' || run || round || '-' || g, body) r;
            us_new := extract(epoch FROM clock_timestamp() - t0) * 1e6 / 2000;
            RAISE EXCEPTION USING ERRCODE = 'P0004';
        EXCEPTION WHEN assert_failure THEN
            NULL;
        END;
        BEGIN
            t0 := clock_timestamp();
            SELECT count(*) INTO n FROM generate_series(1, 2000) g,
                   LATERAL idem_reserve('bench', 'orders_rated', 'pc-' || run || round || '-' || g, body) r;
            us_rated := extract(epoch FROM clock_timestamp() - t0) * 1e6 / 2000;
            RAISE EXCEPTION USING ERRCODE = 'P0004';
        EXCEPTION WHEN assert_failure THEN
            NULL;
        END;
        INSERT INTO percall VALUES ('new_ext', us_new), ('new_rated', us_rated);
        -- a new key reserved and completed, against the naive pair, in
        -- turn first and second (a backend's first runs of 2000 rows in
        -- one transaction pay for growing its memory, whichever side runs
        -- them: round 0 is that warm-up and is not recorded)
        FOREACH side IN ARRAY CASE WHEN round % 2 = 1
                                   THEN ARRAY['ext', 'naive']
                                   ELSE ARRAY['naive', 'ext'] END LOOP
            BEGIN
                t0 := clock_timestamp();
                IF side = 'ext' THEN
                    SELECT count(*) INTO n FROM generate_series(1, 2000) g,
                           LATERAL idem_reserve('bench', 'orders', 'nc-' || run || round || '-' || g, body) r,
                           LATERAL idem_complete('bench', 'orders', 'nc-' || run || round || '-' || g, 201,
                                                 '{"id": 1, "status": "paid"}', lock_token => r.lock_token) c;
                    us_nc := extract(epoch FROM clock_timestamp() - t0) * 1e6 / 2000;
                ELSE
                    SELECT count(*) INTO n FROM generate_series(1, 2000) g,
                           LATERAL naive_reserve('bench', 'orders', 'nc-' || run || round || '-' || g, body) r,
                           LATERAL naive_complete('bench', 'orders', 'nc-' || run || round || '-' || g, 201,
                                                  '{"id": 1, "status": "paid"}') c;
                    us_nc_naive := extract(epoch FROM clock_timestamp() - t0) * 1e6 / 2000;
                END IF;
                RAISE EXCEPTION USING ERRCODE = 'P0004';
            EXCEPTION WHEN assert_failure THEN
                NULL;
            END;
        END LOOP;
        CONTINUE WHEN round = 0;
        INSERT INTO percall VALUES ('newcomplete_ext', us_nc), ('newcomplete_plpgsql', us_nc_naive);
    END LOOP;
    -- replays parsed and planned on every call, as for a client that does
    -- not prepare its statements (PgBouncer in transaction mode, a driver's
    -- unnamed statements): EXECUTE ... USING plans each run afresh; the
    -- baseline is the primary-key SELECT of the same row, planned alike
    FOR round IN 0..3 LOOP
        t0 := clock_timestamp();
        FOR g IN 1 .. 20000 LOOP
            EXECUTE 'SELECT outcome, response_code, response_body FROM idem_reserve($1, $2, $3, $4)'
               USING 'bench', 'orders', 'r-' || (g % 10000 + 1), body;
        END LOOP;
        INSERT INTO percall VALUES ('replay_planned_ext', extract(epoch FROM clock_timestamp() - t0) * 1e6 / 20000);
        t0 := clock_timestamp();
        FOR g IN 1 .. 20000 LOOP
            EXECUTE 'SELECT status, response_code, response_body, response_headers FROM idempotency.keys'
                    ' WHERE tenant_id = $1 AND scope = $2 AND idem_key = $3'
               USING 'bench', 'orders', 'r-' || (g % 10000 + 1);
        END LOOP;
        INSERT INTO percall VALUES ('replay_planned_pk', extract(epoch FROM clock_timestamp() - t0) * 1e6 / 20000);
    END LOOP;
END
$$;
SELECT variant, round(min(usecs)::numeric, 1) AS usecs_per_call FROM percall GROUP BY 1 ORDER BY 1;
