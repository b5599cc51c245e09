-- A new key's row is written once.  Reserving takes the key's lock and keeps
-- the reservation in the transaction; completing it inserts the finished
-- row, releasing it writes nothing, and a reservation still open at commit
-- is inserted then as "processing" (the two-phase case).  Savepoints undo
-- each of these steps.
CREATE FUNCTION pg_temp.writes(OUT inserts bigint, OUT updates bigint, OUT deletes bigint)
LANGUAGE sql AS $$
    SELECT n_tup_ins, n_tup_upd, n_tup_del FROM pg_catalog.pg_stat_user_tables
     WHERE relid = 'idempotency.keys'::regclass
$$;
CREATE FUNCTION pg_temp.sqlstate(stmt text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ' ' || SQLERRM;
END
$$;
SELECT pg_stat_force_next_flush();
SELECT inserts AS ins0, updates AS upd0, deletes AS del0 FROM pg_temp.writes() \gset

-- reserved and completed in one transaction: one insert, no update
BEGIN;
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'atomic-1', '{"amount": 1}'::jsonb);
-- the table shows the key once the transaction completes or commits it;
-- the key functions see it at once
SELECT count(*) AS rows_in_table FROM idempotency.keys WHERE tenant_id = 'wo_a';
SELECT idem_complete('wo_a', 'orders', 'atomic-1', 201, '{"id": 1}');
COMMIT;
SELECT pg_stat_force_next_flush();
SELECT inserts - :ins0 AS inserts, updates - :upd0 AS updates FROM pg_temp.writes();
SELECT status, response_code, response_body, lock_token IS NOT NULL AS has_token,
       created_at = locked_at AS created_at_locked_at, completed_at >= created_at AS completed_later,
       expires_at > completed_at AS expires_later, needs_reconciliation
  FROM idempotency.keys WHERE tenant_id = 'wo_a' AND idem_key = 'atomic-1';
SELECT outcome, response_code, response_body FROM idem_reserve('wo_a', 'orders', 'atomic-1', '{"amount": 1}'::jsonb);

-- the transaction's own retry is answered from the reservation (which
-- writes its row first)
BEGIN;
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'retry-1', '{"amount": 1}'::jsonb);
SELECT outcome, http_status FROM idem_reserve('wo_a', 'orders', 'retry-1', '{"amount": 1}'::jsonb);
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'retry-1', '{"amount": 2}'::jsonb);
SELECT idem_complete('wo_a', 'orders', 'retry-1', 201, '{"id": 1}');
COMMIT;
SELECT outcome, response_body FROM idem_reserve('wo_a', 'orders', 'retry-1', '{"amount": 1}'::jsonb);

-- reserved and committed unfinished: the processing row is inserted at
-- commit, with the token the reservation returned
SELECT inserts AS ins0, updates AS upd0 FROM pg_temp.writes() \gset
SELECT lock_token AS tok, expires_at AS exp FROM idem_reserve('wo_a', 'orders', 'two-phase-1', '{"amount": 3}'::jsonb) \gset
SELECT status, lock_token = :'tok' AS same_token, expires_at = :'exp' AS same_expiry
  FROM idempotency.keys WHERE tenant_id = 'wo_a' AND idem_key = 'two-phase-1';
SELECT idem_complete('wo_a', 'orders', 'two-phase-1', 200, '{}', lock_token => :'tok');
SELECT pg_stat_force_next_flush();
SELECT inserts - :ins0 AS inserts, updates - :upd0 AS updates FROM pg_temp.writes();

-- released in its own transaction: nothing is written, the key is free
SELECT inserts AS ins0, deletes AS del0 FROM pg_temp.writes() \gset
BEGIN;
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'released-1', '{"amount": 4}'::jsonb);
SELECT idem_release('wo_a', 'orders', 'released-1');
SELECT count(*) AS lookup FROM idem_lookup('wo_a', 'orders', 'released-1');
COMMIT;
SELECT pg_stat_force_next_flush();
SELECT inserts - :ins0 AS inserts, deletes - :del0 AS deletes FROM pg_temp.writes();
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'released-1', '{"amount": 5}'::jsonb);
-- a retryable failure releases it the same way
BEGIN;
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'retryable-1', '{"amount": 6}'::jsonb);
SELECT idem_complete('wo_a', 'orders', 'retryable-1', 503, '{}') IS NULL AS released;
COMMIT;
SELECT count(*) AS rows_in_table FROM idempotency.keys WHERE tenant_id = 'wo_a' AND idem_key = 'retryable-1';

-- a completion rolled back to a savepoint leaves the reservation open,
-- and the commit inserts it unfinished
BEGIN;
SELECT lock_token AS tok FROM idem_reserve('wo_a', 'orders', 'sp-1', '{"amount": 7}'::jsonb) \gset
SAVEPOINT a;
SELECT idem_complete('wo_a', 'orders', 'sp-1', 201, '{"id": 7}');
ROLLBACK TO SAVEPOINT a;
SAVEPOINT b;
SELECT idem_release('wo_a', 'orders', 'sp-1');
ROLLBACK TO SAVEPOINT b;
COMMIT;
SELECT status, lock_token = :'tok' AS same_token
  FROM idempotency.keys WHERE tenant_id = 'wo_a' AND idem_key = 'sp-1';
-- a reservation rolled back to a savepoint leaves nothing
BEGIN;
SAVEPOINT a;
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'sp-2', '{"amount": 8}'::jsonb);
ROLLBACK TO SAVEPOINT a;
COMMIT;
SELECT count(*) AS rows_in_table FROM idempotency.keys WHERE tenant_id = 'wo_a' AND idem_key = 'sp-2';
-- a completion in a released savepoint stays, and so does its row
BEGIN;
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'sp-3', '{"amount": 9}'::jsonb);
SAVEPOINT a;
SELECT idem_complete('wo_a', 'orders', 'sp-3', 201, '{"id": 9}');
RELEASE SAVEPOINT a;
SAVEPOINT c;
SELECT 1 / 0;
ROLLBACK TO SAVEPOINT c;
COMMIT;
SELECT status, response_body FROM idempotency.keys WHERE tenant_id = 'wo_a' AND idem_key = 'sp-3';

-- a checkpoint, a wrong token and a lookup see the reservation as a row
BEGIN;
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'cp-1', '{"amount": 10}'::jsonb);
SELECT status, recovery_point FROM idem_lookup('wo_a', 'orders', 'cp-1');
SELECT idem_checkpoint('wo_a', 'orders', 'cp-1', 'charged');
SELECT status, recovery_point FROM idem_lookup('wo_a', 'orders', 'cp-1');
SAVEPOINT a;
SELECT idem_complete('wo_a', 'orders', 'cp-1', 201, '{}', lock_token => '00000000-0000-0000-0000-000000000000');
ROLLBACK TO SAVEPOINT a;
SELECT idem_complete('wo_a', 'orders', 'cp-1', 201, '{"id": 10}');
COMMIT;
SELECT status, recovery_point, response_body FROM idempotency.keys WHERE tenant_id = 'wo_a' AND idem_key = 'cp-1';

-- a rolled-back transaction leaves nothing, as before
BEGIN;
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'rb-1', '{"amount": 11}'::jsonb);
ROLLBACK;
SELECT count(*) AS rows_in_table FROM idempotency.keys WHERE tenant_id = 'wo_a' AND idem_key = 'rb-1';

-- a procedure that commits and rolls back inside: each commit writes the
-- reservations of its transaction
CREATE PROCEDURE pg_temp.wo_proc() LANGUAGE plpgsql AS $$
BEGIN
    PERFORM idem_reserve('wo_a', 'orders', 'proc-1', '{}'::jsonb);
    COMMIT;
    PERFORM idem_reserve('wo_a', 'orders', 'proc-2', '{}'::jsonb);
    PERFORM idem_complete('wo_a', 'orders', 'proc-2', 200, '{}');
    COMMIT;
    PERFORM idem_reserve('wo_a', 'orders', 'proc-3', '{}'::jsonb);
    ROLLBACK;
    PERFORM idem_reserve('wo_a', 'orders', 'proc-4', '{}'::jsonb);
END
$$;
CALL pg_temp.wo_proc();
SELECT idem_key, status FROM idempotency.keys WHERE tenant_id = 'wo_a' AND idem_key LIKE 'proc-%' ORDER BY 1;

-- an application role that may not touch the table: the row written at
-- commit is written as the functions' owner
CREATE ROLE wo_app;
GRANT idempotency_app TO wo_app;
SET ROLE wo_app;
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'app-1', '{"amount": 12}'::jsonb);
BEGIN;
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'app-2', '{"amount": 13}'::jsonb);
SELECT idem_complete('wo_a', 'orders', 'app-2', 201, '{}');
COMMIT;
RESET ROLE;
SELECT idem_key, status FROM idempotency.keys WHERE tenant_id = 'wo_a' AND idem_key LIKE 'app-%' ORDER BY 1;
DROP ROLE wo_app;

-- The row is inserted without the executor when the table is as the
-- extension made it, with its indexes and any plain index a DBA adds; each
-- index holds every row (counted through the index, then through the heap)
CREATE INDEX wo_created_idx ON idempotency.keys (created_at);
BEGIN;
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'ix-1', '{"amount": 14}'::jsonb);
SELECT idem_complete('wo_a', 'orders', 'ix-1', 201, '{}');
COMMIT;
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'ix-2', '{"amount": 15}'::jsonb);
SET enable_seqscan = off;
SET enable_bitmapscan = off;
SELECT (SELECT count(*) FROM idempotency.keys WHERE tenant_id = 'wo_a') AS by_pkey,
       (SELECT count(*) FROM idempotency.keys WHERE tenant_id = 'wo_a' AND expires_at > '-infinity') AS by_expiry,
       (SELECT count(*) FROM idempotency.keys WHERE tenant_id = 'wo_a' AND created_at > '-infinity') AS by_created;
RESET enable_seqscan;
RESET enable_bitmapscan;
SET enable_indexscan = off;
SET enable_indexonlyscan = off;
SET enable_bitmapscan = off;
SELECT count(*) AS by_heap FROM idempotency.keys WHERE tenant_id = 'wo_a';
RESET enable_indexscan;
RESET enable_indexonlyscan;
RESET enable_bitmapscan;
DROP INDEX idempotency.wo_created_idx;
-- what the direct insert does not know goes through INSERT, which honours
-- it: a trigger, a CHECK constraint, a column with a default, an index
-- on an expression or with a predicate
CREATE TABLE wo_audit (idem_key text, status text);
CREATE FUNCTION wo_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.wo_audit VALUES (NEW.idem_key, NEW.status);
    RETURN NEW;
END
$$;
CREATE TRIGGER wo_audit AFTER INSERT ON idempotency.keys
    FOR EACH ROW EXECUTE FUNCTION wo_audit();
BEGIN;
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'trig-1', '{"amount": 16}'::jsonb);
SELECT idem_complete('wo_a', 'orders', 'trig-1', 201, '{}');
COMMIT;
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'trig-2', '{"amount": 17}'::jsonb);
SELECT * FROM wo_audit ORDER BY 1;
DROP TRIGGER wo_audit ON idempotency.keys;
-- with a trigger, a new key's row is written in the statement that
-- reserves it, where the trigger's code runs as in any statement: written
-- at commit, a cursor the trigger left open outlived the transaction's
-- resources (warnings, then XX000 at the next statement), a deferred
-- constraint the trigger queued could not fire (42501), and a key the
-- trigger reserved could be lost
CREATE FUNCTION wo_cursor() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE c refcursor;
BEGIN
    OPEN c FOR SELECT * FROM public.wo_audit;
    RETURN NEW;
END
$$;
CREATE TRIGGER wo_cursor AFTER INSERT ON idempotency.keys
    FOR EACH ROW EXECUTE FUNCTION wo_cursor();
BEGIN;
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'cur-1', '{}'::jsonb);
COMMIT;
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'cur-2', '{}'::jsonb);
SELECT 1 AS next_statement;
DROP TRIGGER wo_cursor ON idempotency.keys;
CREATE TABLE wo_tenants (id text PRIMARY KEY);
INSERT INTO wo_tenants VALUES ('wo_a');
CREATE TABLE wo_deferred (tenant text REFERENCES wo_tenants DEFERRABLE INITIALLY DEFERRED,
                          idem_key text);
CREATE FUNCTION wo_deferred() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.wo_deferred VALUES (NEW.tenant_id, NEW.idem_key);
    RETURN NEW;
END
$$;
CREATE TRIGGER wo_deferred AFTER INSERT ON idempotency.keys
    FOR EACH ROW EXECUTE FUNCTION wo_deferred();
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'def-fk-1', '{}'::jsonb);
SELECT * FROM wo_deferred;
DROP TRIGGER wo_deferred ON idempotency.keys;
CREATE FUNCTION wo_more() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM public.idem_reserve(NEW.tenant_id, NEW.scope, 'x' || NEW.idem_key, '{}'::jsonb);
    RETURN NEW;
END
$$;
CREATE TRIGGER wo_more AFTER INSERT ON idempotency.keys
    FOR EACH ROW WHEN (NEW.idem_key LIKE 'more-%') EXECUTE FUNCTION wo_more();
BEGIN;
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'more-1', '{}'::jsonb);
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'more-2', '{}'::jsonb);
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'more-3', '{}'::jsonb);
COMMIT;
SELECT string_agg(idem_key, ',' ORDER BY idem_key) AS written
  FROM idempotency.keys WHERE tenant_id = 'wo_a' AND idem_key LIKE '%more-%';
DROP TRIGGER wo_more ON idempotency.keys;
-- a trigger added in the transaction that reserved a key, after the
-- reservation: the commit, which writes the key's row, refuses it (55000)
-- rather than run it there; nothing is kept
BEGIN;
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'late-trig-1', '{}'::jsonb);
CREATE TRIGGER wo_cursor AFTER INSERT ON idempotency.keys
    FOR EACH ROW EXECUTE FUNCTION wo_cursor();
COMMIT;
SELECT 1 AS next_statement;
SELECT count(*) AS late_rows FROM idempotency.keys WHERE idem_key = 'late-trig-1';
SELECT count(*) AS late_triggers FROM pg_trigger
 WHERE tgrelid = 'idempotency.keys'::regclass AND tgname = 'wo_cursor';
DROP FUNCTION wo_cursor(), wo_deferred(), wo_more();
DROP TABLE wo_deferred, wo_tenants;
-- a rule likewise (the direct insert did not run it)
CREATE RULE wo_audit_rule AS ON INSERT TO idempotency.keys
    WHERE NEW.tenant_id = 'wo_a'
    DO ALSO INSERT INTO public.wo_audit VALUES ('rule:' || NEW.idem_key, NEW.status);
BEGIN;
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'rule-1', '{"amount": 16}'::jsonb);
SELECT idem_complete('wo_a', 'orders', 'rule-1', 201, '{}');
COMMIT;
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'rule-2', '{"amount": 17}'::jsonb);
SELECT * FROM wo_audit WHERE idem_key LIKE 'rule:%' ORDER BY 1;
DROP RULE wo_audit_rule ON idempotency.keys;
-- the rule dropped, a new key's row is written directly again, although
-- pg_class.relhasrules stays set until the table is next vacuumed or
-- analysed (before, every new key went through INSERT until then).  The
-- probe: the INSERT of a finished row leaves needs_reconciliation to its
-- default, which here calls a function that counts its calls; the direct
-- insert writes false itself
CREATE FUNCTION public.wo_default_probe() RETURNS bool
LANGUAGE plpgsql AS $$ BEGIN RETURN false; END $$;
ALTER TABLE idempotency.keys ALTER COLUMN needs_reconciliation
    SET DEFAULT public.wo_default_probe();
SET track_functions = 'pl';
BEGIN;
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'rule-3', '{"amount": 16}'::jsonb);
SELECT idem_complete('wo_a', 'orders', 'rule-3', 201, '{}');
SELECT coalesce(pg_stat_get_xact_function_calls('public.wo_default_probe()'::regprocedure), 0)
       AS default_calls;
COMMIT;
RESET track_functions;
ALTER TABLE idempotency.keys ALTER COLUMN needs_reconciliation SET DEFAULT false;
DROP FUNCTION public.wo_default_probe();
SELECT status, needs_reconciliation FROM idempotency.keys
 WHERE tenant_id = 'wo_a' AND idem_key = 'rule-3';
ALTER TABLE idempotency.keys ADD CONSTRAINT wo_no_teapot CHECK (response_code IS DISTINCT FROM 418);
BEGIN;
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'check-1', '{"amount": 18}'::jsonb);
SELECT pg_temp.sqlstate($$SELECT idem_complete('wo_a', 'orders', 'check-1', 418, '{}')$$);
ROLLBACK;
ALTER TABLE idempotency.keys DROP CONSTRAINT wo_no_teapot;
-- a NOT NULL on a column a new key leaves null: refused (23502) by the
-- reservation itself, which writes the row then, in autocommit and in a
-- transaction; nothing written
UPDATE idempotency.keys SET recovery_point = '' WHERE recovery_point IS NULL;
ALTER TABLE idempotency.keys ALTER COLUMN recovery_point SET NOT NULL;
\set VERBOSITY terse
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'nn-1', '{"amount": 25}'::jsonb);
\set VERBOSITY default
BEGIN;
SELECT pg_temp.sqlstate($$SELECT idem_reserve('wo_a', 'orders', 'nn-2', '{"amount": 26}'::jsonb)$$);
ROLLBACK;
SELECT count(*) AS nn_rows FROM idempotency.keys WHERE idem_key LIKE 'nn-%';
ALTER TABLE idempotency.keys ALTER COLUMN recovery_point DROP NOT NULL;
UPDATE idempotency.keys SET recovery_point = NULL WHERE recovery_point = '';
-- a default on such a column: the new key gets it
ALTER TABLE idempotency.keys ALTER COLUMN recovery_point SET DEFAULT 'not started';
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'def-1', '{"amount": 27}'::jsonb);
SELECT recovery_point FROM idempotency.keys WHERE tenant_id = 'wo_a' AND idem_key = 'def-1';
ALTER TABLE idempotency.keys ALTER COLUMN recovery_point DROP DEFAULT;
ALTER TABLE idempotency.keys ADD COLUMN wo_region text DEFAULT 'eu';
BEGIN;
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'col-1', '{"amount": 19}'::jsonb);
SELECT idem_complete('wo_a', 'orders', 'col-1', 201, '{}');
COMMIT;
SELECT idem_key, wo_region FROM idempotency.keys WHERE tenant_id = 'wo_a' AND idem_key = 'col-1';
ALTER TABLE idempotency.keys DROP COLUMN wo_region;
-- a column a DBA gave another type: a domain over the column's type (or
-- varchar for text) is read as that type, and a new key's row goes
-- through an INSERT at the reservation, which converts and checks it
-- (23514, 22001) instead of being formed directly (which stored what the
-- domain refuses); a type stored otherwise (bigint for int) is refused by
-- every call (55000), nothing written, until it is changed back
CREATE DOMAIN wo_short_key AS text CHECK (length(VALUE) <= 200);
ALTER TABLE idempotency.keys ALTER COLUMN idem_key TYPE wo_short_key COLLATE pg_catalog."C";
BEGIN;
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'dom-1', '{"amount": 30}'::jsonb);
SELECT idem_complete('wo_a', 'orders', 'dom-1', 201, '{"id": 30}');
COMMIT;
SELECT outcome, response_body FROM idem_reserve('wo_a', 'orders', 'dom-1', '{"amount": 30}'::jsonb);
SELECT pg_temp.sqlstate($$SELECT idem_reserve('wo_a', 'orders', repeat('d', 210), '{"amount": 31}'::jsonb)$$);
ALTER TABLE idempotency.keys ALTER COLUMN idem_key TYPE varchar(200) COLLATE pg_catalog."C";
SELECT pg_temp.sqlstate($$SELECT idem_reserve('wo_a', 'orders', repeat('v', 210), '{"amount": 32}'::jsonb)$$);
SELECT outcome, response_body FROM idem_reserve('wo_a', 'orders', 'dom-1', '{"amount": 30}'::jsonb);
ALTER TABLE idempotency.keys ALTER COLUMN idem_key TYPE text COLLATE pg_catalog."C";
-- the same change made in the transaction that reserved the key, after
-- the reservation: the row written at commit goes through the INSERT too
-- (it was formed directly, by the types of before: the domain's check
-- skipped, and a uuid written into a column of text read past its end)
BEGIN;
SELECT outcome FROM idem_reserve('wo_a', 'orders', repeat('c', 210), '{"amount": 34}'::jsonb);
ALTER TABLE idempotency.keys ALTER COLUMN idem_key TYPE wo_short_key COLLATE pg_catalog."C";
\set VERBOSITY terse
COMMIT;
\set VERBOSITY default
SELECT count(*) AS too_long_rows FROM idempotency.keys WHERE length(idem_key) > 200;
BEGIN;
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'late-type-1', '{"amount": 35}'::jsonb);
ALTER TABLE idempotency.keys ALTER COLUMN lock_token TYPE text;
COMMIT;
ALTER TABLE idempotency.keys ALTER COLUMN lock_token TYPE uuid USING lock_token::uuid;
SELECT status, lock_token IS NOT NULL AS has_token FROM idempotency.keys
 WHERE tenant_id = 'wo_a' AND idem_key = 'late-type-1';
DROP DOMAIN wo_short_key;
SELECT count(*) AS too_long_rows FROM idempotency.keys WHERE length(idem_key) > 200;
ALTER TABLE idempotency.keys ALTER COLUMN response_code TYPE bigint;
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'big-1', '{"amount": 33}'::jsonb);
SELECT pg_temp.sqlstate($$SELECT idem_lookup('wo_a', 'orders', 'dom-1')$$);
ALTER TABLE idempotency.keys ALTER COLUMN response_code TYPE int;
SELECT count(*) AS big_rows FROM idempotency.keys WHERE idem_key = 'big-1';
SELECT outcome, response_body FROM idem_reserve('wo_a', 'orders', 'dom-1', '{"amount": 30}'::jsonb);
CREATE INDEX wo_lower_idx ON idempotency.keys (pg_catalog.lower(idem_key));
CREATE INDEX wo_failed_idx ON idempotency.keys (idem_key) WHERE status = 'failed';
BEGIN;
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'EXPR-1', '{"amount": 20}'::jsonb);
SELECT idem_complete('wo_a', 'orders', 'EXPR-1', 409, '{}');
COMMIT;
SET enable_seqscan = off;
SET enable_bitmapscan = off;
SELECT idem_key FROM idempotency.keys WHERE pg_catalog.lower(idem_key) = 'expr-1';
SELECT idem_key FROM idempotency.keys WHERE status = 'failed' AND idem_key = 'EXPR-1';
RESET enable_seqscan;
RESET enable_bitmapscan;
DROP INDEX idempotency.wo_lower_idx;
DROP INDEX idempotency.wo_failed_idx;
-- a deferred constraint (here a DEFERRABLE foreign key) fires at commit,
-- before a pending reservation would be written: with one on the table,
-- a new key's row is written when it is reserved, and the constraint
-- checks it at commit
CREATE TABLE wo_tenants (id text COLLATE "C" PRIMARY KEY);
INSERT INTO wo_tenants SELECT DISTINCT tenant_id FROM idempotency.keys;
INSERT INTO wo_tenants VALUES ('wo_a') ON CONFLICT DO NOTHING;
ALTER TABLE idempotency.keys ADD CONSTRAINT wo_tenant_fk FOREIGN KEY (tenant_id)
    REFERENCES wo_tenants DEFERRABLE INITIALLY DEFERRED;
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'fk-1', '{"amount": 22}'::jsonb);
BEGIN;
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'fk-2', '{"amount": 23}'::jsonb);
COMMIT;
SELECT idem_key, status FROM idempotency.keys
 WHERE tenant_id = 'wo_a' AND idem_key LIKE 'fk-%' ORDER BY 1;
BEGIN;
SELECT outcome FROM idem_reserve('wo_nobody', 'orders', 'fk-3', '{"amount": 24}'::jsonb);
\set VERBOSITY terse
COMMIT;
\set VERBOSITY default
SELECT count(*) AS fk_3_rows FROM idempotency.keys WHERE tenant_id = 'wo_nobody';
ALTER TABLE idempotency.keys DROP CONSTRAINT wo_tenant_fk;
DROP TABLE wo_tenants;
-- back to the table as made: the direct insert again
BEGIN;
SELECT outcome FROM idem_reserve('wo_a', 'orders', 'after-1', '{"amount": 21}'::jsonb);
SELECT idem_complete('wo_a', 'orders', 'after-1', 201, '{"id": 21}');
COMMIT;
SELECT outcome, response_body FROM idem_reserve('wo_a', 'orders', 'after-1', '{"amount": 21}'::jsonb);
DROP TABLE wo_audit;
DROP FUNCTION wo_audit();

DELETE FROM idempotency.keys WHERE tenant_id = 'wo_a';
