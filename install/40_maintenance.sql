/* ---- maintenance.c: reaper, sweeper, pg_cron scheduling ---- */

/*
 * Where the scheduled sweep (idem_sweep() without older_than, as
 * idem_maintain calls it) continues, and how many pages of the keys table
 * one run may read.  The sweeper has no index to go by (an index naming
 * status would make every completion a non-HOT update), so each run reads
 * one slice of the table by TID range and the next run carries on from
 * next_page: a run costs at most pages_per_run pages however large the table
 * grows, and the runs go round the whole table.  One row.
 */
CREATE TABLE idempotency.sweep_state (
    one_row       bool PRIMARY KEY DEFAULT true,
    next_page     bigint NOT NULL DEFAULT 0,
    pages_per_run int NOT NULL DEFAULT 16384,
    CONSTRAINT sweep_state_one_row CHECK (one_row),
    CONSTRAINT sweep_state_pages_positive CHECK (pages_per_run > 0)
);
INSERT INTO idempotency.sweep_state DEFAULT VALUES;
REVOKE ALL ON idempotency.sweep_state FROM PUBLIC;
GRANT SELECT, UPDATE (pages_per_run) ON idempotency.sweep_state TO idempotency_admin;

/*
 * A dump keeps the row (the budget an operator set): restoring it runs
 * CREATE EXTENSION, which makes the default row, and then loads the dumped
 * one, which this trigger merges into the row already there instead of
 * failing on the primary key.
 */
CREATE FUNCTION idempotency.sweep_state_merge()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE idempotency.sweep_state AS s
       SET next_page = NEW.next_page, pages_per_run = NEW.pages_per_run
     WHERE s.one_row;
    IF FOUND THEN
        RETURN NULL;
    END IF;
    RETURN NEW;
END
$$;

REVOKE EXECUTE ON FUNCTION idempotency.sweep_state_merge() FROM PUBLIC;

CREATE TRIGGER sweep_state_merge
    BEFORE INSERT ON idempotency.sweep_state
    FOR EACH ROW EXECUTE FUNCTION idempotency.sweep_state_merge();
-- always: also for the row the initial copy of a logical replication
-- subscription inserts, into a table that already has its row
ALTER TABLE idempotency.sweep_state ENABLE ALWAYS TRIGGER sweep_state_merge;

SELECT pg_catalog.pg_extension_config_dump('idempotency.sweep_state', '');

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
 * What maintenance runs lives in schema idempotency, which the extension
 * creates and its owner owns: idempotency.maintain, the procedure the
 * pg_cron job calls (as the job's owner, a superuser), and the functions
 * it calls.  The extension's own schema is not safe to name there: a
 * database owner may rename it (on PostgreSQL 15, public belongs to
 * pg_database_owner) and create another schema of the same name, where a
 * name written into a procedure body or a job's command would find the
 * owner's objects.  No one but the extension's owner can rename schema
 * idempotency or create in it.  These four are idem_reap, idem_sweep,
 * idem_reclaim_leases and idem_purge_outbox under names in that schema,
 * granted to the same role.
 */
CREATE FUNCTION idempotency.reap(batch_size int)
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'idem_reap'
    LANGUAGE C VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp;
CREATE FUNCTION idempotency.sweep(older_than interval)
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'idem_sweep'
    LANGUAGE C VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp;
CREATE FUNCTION idempotency.reclaim_leases()
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'idem_reclaim_leases'
    LANGUAGE C VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp;
CREATE FUNCTION idempotency.purge_outbox(batch_size int)
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'idem_purge_outbox'
    LANGUAGE C VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION idempotency.reap(int), idempotency.sweep(interval),
    idempotency.reclaim_leases(), idempotency.purge_outbox(int) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempotency.reap(int), idempotency.sweep(interval),
    idempotency.reclaim_leases(), idempotency.purge_outbox(int) TO idempotency_admin;

/*
 * idempotency.maintain (what idem_maintain runs) is a procedure so it can
 * COMMIT between batches: every batch is its own short transaction, and
 * its row locks are released at once.  PostgreSQL does not allow
 * transaction control in a SECURITY DEFINER procedure, or in one with a
 * SET clause, so this one runs with the caller's rights and relies on the
 * SECURITY DEFINER functions above (which the caller must be allowed to
 * execute) and on naming everything schema-qualified.  Call it as a
 * statement of its own, not inside BEGIN.
 *
 * The defaults are gentle on purpose: small batches with a rest between
 * them leave CPU and WAL bandwidth to the requests while a backlog is
 * worked off, and still reap several hundred thousand keys per 50-second
 * run.
 */
CREATE PROCEDURE idempotency.maintain(time_budget interval DEFAULT '50 seconds',
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
    reap_done  pg_catalog.bool := false;
    purge_done pg_catalog.bool := false;
    started   pg_catalog.timestamptz;
    stmt_timeout pg_catalog.interval;
    batches   pg_catalog.int4 := 0;
BEGIN
    IF time_budget IS NULL THEN
        RAISE EXCEPTION 'time_budget must not be null'
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'Pass how long this run may take, such as ''50 seconds'' for a job that runs every minute.';
    END IF;
    IF time_budget OPERATOR(pg_catalog.<=) '0'::pg_catalog.interval THEN
        RAISE EXCEPTION 'time_budget must be a positive interval'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass how long this run may take, such as ''50 seconds'' for a job that runs every minute.';
    END IF;
    IF time_budget OPERATOR(pg_catalog.>) '1000 years'::pg_catalog.interval THEN
        RAISE EXCEPTION 'time_budget must be at most 1000 years'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass how long this run may take, such as ''50 seconds'' for a job that runs every minute.';
    END IF;
    -- mixed signs ('-1 year 360 days') compare as positive and may still
    -- come to a negative length on the calendar
    IF pg_catalog.statement_timestamp() OPERATOR(pg_catalog.+) time_budget
       OPERATOR(pg_catalog.<=) pg_catalog.statement_timestamp() THEN
        RAISE EXCEPTION 'time_budget must be a positive interval'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'Its months, days and time have different signs, and at the current date they come to a negative or zero length.',
                  HINT = 'Pass how long this run may take, such as ''50 seconds'' for a job that runs every minute.';
    END IF;
    IF batch_size IS NULL THEN
        RAISE EXCEPTION 'batch_size must not be null'
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'Use a batch of a few thousand rows so each transaction stays short.';
    END IF;
    IF batch_size OPERATOR(pg_catalog.<) 1
       OR batch_size OPERATOR(pg_catalog.>) 1000000 THEN
        RAISE EXCEPTION 'batch_size must be between 1 and 1000000'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use a batch of a few thousand rows so each transaction stays short.';
    END IF;
    IF batch_pause IS NULL THEN
        RAISE EXCEPTION 'batch_pause must not be null'
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'Pass how long to rest between batches, such as ''20 milliseconds'', or ''0''.';
    END IF;
    IF batch_pause OPERATOR(pg_catalog.>) '1000 years'::pg_catalog.interval THEN
        RAISE EXCEPTION 'batch_pause must be at most 1000 years'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass how long to rest between batches, such as ''20 milliseconds'', or ''0''.';
    END IF;
    IF batch_pause OPERATOR(pg_catalog.<) '0'::pg_catalog.interval
       OR pg_catalog.statement_timestamp() OPERATOR(pg_catalog.+) batch_pause
          OPERATOR(pg_catalog.<) pg_catalog.statement_timestamp() THEN
        RAISE EXCEPTION 'batch_pause must not be negative'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass how long to rest between batches, such as ''20 milliseconds'', or ''0''.';
    END IF;
    deadline := pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) time_budget;
    -- statement_timeout counts from the CALL's start across its COMMITs
    -- (the scheduled job inherits the database's and role's setting): stop
    -- starting batches at four fifths of it, so that the run ends rather
    -- than being canceled (57014) by a timeout shorter than the budget
    stmt_timeout := pg_catalog.current_setting('statement_timeout')::pg_catalog.interval;
    IF stmt_timeout OPERATOR(pg_catalog.>) '0'::pg_catalog.interval THEN
        deadline := LEAST(deadline, pg_catalog.statement_timestamp()
                          OPERATOR(pg_catalog.+)
                          (stmt_timeout OPERATOR(pg_catalog.*) 0.8::pg_catalog.float8));
    END IF;
    -- COMMIT works only in a procedure CALLed as a statement of its own:
    -- inside a transaction block or a function, fail (2D000) here, before
    -- the sweep writes, rather than at the first COMMIT after it
    COMMIT;

    -- first what is urgent and small: stuck reservations and lost leases,
    -- each committed on its own (under a statement_timeout the sweep stops
    -- at two fifths of it, the lease recovery at three)
    swept := idempotency.sweep(NULL::pg_catalog.interval);
    COMMIT;
    reclaimed := idempotency.reclaim_leases();
    COMMIT;

    -- then, taking turns, a batch of expired keys and a batch of delivered
    -- outbox rows: a reap backlog that outlasts the budget must not starve
    -- the purge (nor a purge backlog the reaper)
    LOOP
        started := pg_catalog.clock_timestamp();
        IF NOT reap_done
           AND pg_catalog.clock_timestamp() OPERATOR(pg_catalog.<) deadline THEN
            n := idempotency.reap(batch_size);
            reaped := reaped OPERATOR(pg_catalog.+) n;
            batches := batches OPERATOR(pg_catalog.+) 1;
            COMMIT;
            reap_done := n OPERATOR(pg_catalog.<) batch_size;
        END IF;
        IF NOT purge_done
           AND pg_catalog.clock_timestamp() OPERATOR(pg_catalog.<) deadline THEN
            n := idempotency.purge_outbox(batch_size);
            purged := purged OPERATOR(pg_catalog.+) n;
            batches := batches OPERATOR(pg_catalog.+) 1;
            COMMIT;
            purge_done := n OPERATOR(pg_catalog.<) batch_size;
        END IF;
        EXIT WHEN (reap_done AND purge_done)
               OR pg_catalog.clock_timestamp() OPERATOR(pg_catalog.>=) deadline;
        IF batch_pause OPERATOR(pg_catalog.>) '0'::pg_catalog.interval THEN
            -- rest at least batch_pause, and twice as long as the batches
            -- took: slow batches (a bloated table, a busy server) get
            -- longer rests, so maintenance never takes more than a third
            -- of the time it runs; but never past the deadline, and no
            -- batch starts after it
            PERFORM pg_catalog.pg_sleep_for(LEAST(GREATEST(batch_pause,
                (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) started)
                    OPERATOR(pg_catalog.*) 2::pg_catalog.float8),
                deadline OPERATOR(pg_catalog.-) pg_catalog.clock_timestamp()));
            EXIT WHEN pg_catalog.clock_timestamp() OPERATOR(pg_catalog.>=) deadline;
        END IF;
    END LOOP;

    -- a deadline already past after the sweep (a short statement_timeout):
    -- the run succeeds, but it reaps nothing, and will not next time
    IF batches OPERATOR(pg_catalog.=) 0 THEN
        RAISE WARNING 'idem_maintain: no time was left to reap expired keys or purge delivered outbox rows'
            USING DETAIL = 'The run stops starting batches at its time_budget or at four fifths of statement_timeout, whichever comes first; the sweep and the lease recovery before them used that time.',
                  HINT = 'Raise statement_timeout for the role that runs maintenance (ALTER ROLE ... SET statement_timeout), or time_budget.';
    END IF;
    RAISE DEBUG 'idem_maintain: swept %, reclaimed %, reaped %, purged %',
        swept, reclaimed, reaped, purged;
END
$$;
COMMENT ON PROCEDURE idempotency.maintain(interval, int, interval) IS
    'what idem_maintain and the scheduled maintenance job run';
REVOKE ALL ON PROCEDURE idempotency.maintain(interval, int, interval) FROM PUBLIC;
GRANT EXECUTE ON PROCEDURE idempotency.maintain(interval, int, interval) TO idempotency_admin;

/* the procedure users call: idempotency.maintain, named in its schema */
CREATE PROCEDURE idem_maintain(time_budget interval DEFAULT '50 seconds',
                               batch_size int DEFAULT 1000,
                               batch_pause interval DEFAULT '100 milliseconds')
    LANGUAGE plpgsql
    AS $$
BEGIN
    CALL idempotency.maintain(time_budget, batch_size, batch_pause);
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
GRANT EXECUTE ON FUNCTION idem_reap(int), idem_sweep(interval),
    idem_reclaim_leases(), idem_purge_outbox(int),
    idem_schedule_maintenance(text), idem_unschedule_maintenance()
    TO idempotency_admin;
GRANT EXECUTE ON PROCEDURE idem_maintain(interval, int, interval) TO idempotency_admin;
