-- The coverage guard: a trigger that refuses writes from transactions
-- holding no reservation; the logged bypass for administrators; the audit
-- view of every table.
CREATE FUNCTION pg_temp.err(sql text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    st text;
    msg text;
    detail text;
    hint text;
BEGIN
    EXECUTE sql;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
                            detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
    RETURN st || ' ' || msg || E'\n    detail: ' || coalesce(detail, '(none)')
              || E'\n      hint: ' || coalesce(hint, '(none)');
END
$$;

CREATE SCHEMA shop;
CREATE TABLE shop.charges (id int PRIMARY KEY, amount int);
CREATE TABLE shop.refunds (id int PRIMARY KEY, charge_id int);
CREATE TABLE shop.audit_log (id serial PRIMARY KEY, line text);
CREATE TABLE shop.orders (id int, region text) PARTITION BY LIST (region);
CREATE TABLE shop.orders_eu PARTITION OF shop.orders FOR VALUES IN ('eu');
CREATE TRIGGER charges_need_key BEFORE INSERT OR UPDATE OR DELETE ON shop.charges
    FOR EACH STATEMENT EXECUTE FUNCTION idem_require_reservation('POST /v1/charges');
CREATE TRIGGER refunds_need_key BEFORE INSERT ON shop.refunds
    FOR EACH ROW EXECUTE FUNCTION idem_require_reservation('POST /v1/refunds', 'POST /v1/charges');
CREATE TRIGGER orders_need_key AFTER INSERT OR UPDATE ON shop.orders
    FOR EACH ROW EXECUTE FUNCTION idem_require_reservation();

-- a write path without a key is refused (ID001), before anything is written
SELECT pg_temp.err($$INSERT INTO shop.charges VALUES (1, 10)$$);
SELECT pg_temp.err($$UPDATE shop.charges SET amount = 0$$);
SELECT pg_temp.err($$DELETE FROM shop.charges$$);
SELECT pg_temp.err($$INSERT INTO shop.refunds VALUES (1, 1)$$);
SELECT pg_temp.err($$INSERT INTO shop.orders VALUES (1, 'eu')$$);
SELECT count(*) FROM shop.charges;
-- an unguarded table takes writes as before
INSERT INTO shop.audit_log (line) VALUES ('unguarded');

-- with a reservation in the right scope the writes go through
BEGIN;
SELECT outcome FROM idem_reserve('g_a', 'POST /v1/charges', 'c-1', '{"amount": 10}'::jsonb);
INSERT INTO shop.charges VALUES (1, 10);
INSERT INTO shop.refunds VALUES (1, 1);
INSERT INTO shop.orders VALUES (1, 'eu');
SELECT idem_complete('g_a', 'POST /v1/charges', 'c-1', 201, '{"id": 1}');
-- still inside the transaction that completed it
UPDATE shop.charges SET amount = 11 WHERE id = 1;
COMMIT;
SELECT * FROM shop.charges;
-- a reservation of another scope does not open the charges table
BEGIN;
SELECT outcome FROM idem_reserve('g_a', 'POST /v1/refunds', 'r-1', '{"charge": 1}'::jsonb);
INSERT INTO shop.refunds VALUES (2, 1);
SELECT pg_temp.err($$INSERT INTO shop.charges VALUES (2, 20)$$);
ROLLBACK;
-- the reservation belongs to the transaction: the next one holds none
SELECT pg_temp.err($$UPDATE shop.charges SET amount = 12$$);
-- a replay is not a reservation
BEGIN;
SELECT outcome FROM idem_reserve('g_a', 'POST /v1/charges', 'c-1', '{"amount": 10}'::jsonb);
SELECT pg_temp.err($$UPDATE shop.charges SET amount = 12$$);
ROLLBACK;
-- a reservation made in a rolled-back savepoint is gone with it
BEGIN;
SAVEPOINT s;
SELECT outcome FROM idem_reserve('g_a', 'POST /v1/charges', 'c-sp', '{"amount": 3}'::jsonb);
ROLLBACK TO SAVEPOINT s;
SELECT pg_temp.err($$INSERT INTO shop.charges VALUES (3, 30)$$);
ROLLBACK;
-- a later proof in a savepoint does not drop the outer reservation
BEGIN;
SELECT outcome FROM idem_reserve('g_a', 'POST /v1/charges', 'c-sp2', '{"amount": 3}'::jsonb);
SAVEPOINT s;
SELECT idem_checkpoint('g_a', 'POST /v1/charges', 'c-sp2', 'step-1');
ROLLBACK TO SAVEPOINT s;
INSERT INTO shop.charges VALUES (3, 30);
SELECT idem_complete('g_a', 'POST /v1/charges', 'c-sp2', 201, '{}');
COMMIT;
-- two-phase: the second transaction proves its reservation with the token
SELECT lock_token AS tok FROM idem_reserve('g_a', 'POST /v1/charges', 'c-2p', '{"amount": 4}'::jsonb) \gset
BEGIN;
SELECT pg_temp.err($$INSERT INTO shop.charges VALUES (4, 40)$$);
SELECT idem_checkpoint('g_a', 'POST /v1/charges', 'c-2p', 'charged', lock_token => :'tok');
INSERT INTO shop.charges VALUES (4, 40);
SELECT idem_complete('g_a', 'POST /v1/charges', 'c-2p', 201, '{}', lock_token => :'tok');
COMMIT;
-- a wrong token proves nothing
SELECT lock_token AS tok2 FROM idem_reserve('g_a', 'POST /v1/charges', 'c-2q', '{"amount": 5}'::jsonb) \gset
BEGIN;
SELECT pg_temp.err($$SELECT idem_checkpoint('g_a', 'POST /v1/charges', 'c-2q', 'x', lock_token => '00000000-0000-0000-0000-000000000000')$$);
ROLLBACK;
BEGIN;
SELECT pg_temp.err($$INSERT INTO shop.charges VALUES (5, 50)$$);
ROLLBACK;

-- a reservation the transaction gave up no longer opens the table: after
-- idem_release, or a completion that releases the key (5xx), the retry
-- gets a new reservation and would write again
BEGIN;
SELECT outcome FROM idem_reserve('g_a', 'POST /v1/charges', 'c-rel', '{"amount": 7}'::jsonb);
SELECT idem_release('g_a', 'POST /v1/charges', 'c-rel');
SELECT pg_temp.err($$INSERT INTO shop.charges VALUES (7, 70)$$);
ROLLBACK;
BEGIN;
SELECT outcome FROM idem_reserve('g_a', 'POST /v1/charges', 'c-503', '{"amount": 8}'::jsonb);
SELECT idem_complete('g_a', 'POST /v1/charges', 'c-503', 503, '{"error": "busy"}') IS NULL AS released;
SELECT pg_temp.err($$INSERT INTO shop.charges VALUES (8, 80)$$);
ROLLBACK;
-- a two-phase reservation released with its token, in the proving transaction
SELECT lock_token AS tok3 FROM idem_reserve('g_a', 'POST /v1/charges', 'c-2r', '{"amount": 9}'::jsonb) \gset
BEGIN;
SELECT idem_checkpoint('g_a', 'POST /v1/charges', 'c-2r', 'x', lock_token => :'tok3');
SELECT idem_release('g_a', 'POST /v1/charges', 'c-2r', :'tok3');
SELECT pg_temp.err($$INSERT INTO shop.charges VALUES (9, 90)$$);
ROLLBACK;
-- a release in a savepoint that rolls back is undone with it; reserving the
-- key again after a release holds it again
BEGIN;
SELECT outcome FROM idem_reserve('g_a', 'POST /v1/charges', 'c-rel2', '{"amount": 7}'::jsonb);
SAVEPOINT s;
SELECT idem_release('g_a', 'POST /v1/charges', 'c-rel2');
ROLLBACK TO SAVEPOINT s;
INSERT INTO shop.charges VALUES (10, 100);
SELECT idem_release('g_a', 'POST /v1/charges', 'c-rel2');
SELECT outcome FROM idem_reserve('g_a', 'POST /v1/charges', 'c-rel2', '{"amount": 7}'::jsonb);
INSERT INTO shop.charges VALUES (11, 110);
ROLLBACK;
-- ...but reserving it again in a savepoint that rolls back leaves it given
-- up (after a release, and after a completion that releases it)
BEGIN;
SELECT outcome FROM idem_reserve('g_a', 'POST /v1/charges', 'c-rel3', '{"amount": 7}'::jsonb);
SELECT idem_release('g_a', 'POST /v1/charges', 'c-rel3');
SAVEPOINT s;
SELECT outcome FROM idem_reserve('g_a', 'POST /v1/charges', 'c-rel3', '{"amount": 7}'::jsonb);
ROLLBACK TO SAVEPOINT s;
SELECT pg_temp.err($$INSERT INTO shop.charges VALUES (12, 120)$$);
ROLLBACK;
BEGIN;
SELECT outcome FROM idem_reserve('g_a', 'POST /v1/charges', 'c-rel4', '{"amount": 7}'::jsonb);
SELECT idem_complete('g_a', 'POST /v1/charges', 'c-rel4', 503, '{}') IS NULL AS released;
SAVEPOINT s;
SELECT outcome FROM idem_reserve('g_a', 'POST /v1/charges', 'c-rel4', '{"amount": 7}'::jsonb);
SAVEPOINT inner_s;
RELEASE SAVEPOINT inner_s;
ROLLBACK TO SAVEPOINT s;
SELECT pg_temp.err($$INSERT INTO shop.charges VALUES (13, 130)$$);
-- and made again for good, it opens the table
SELECT outcome FROM idem_reserve('g_a', 'POST /v1/charges', 'c-rel4', '{"amount": 7}'::jsonb);
INSERT INTO shop.charges VALUES (13, 130);
ROLLBACK;
-- nested: given up, made again in savepoint a, given up and made again in
-- savepoints b and c; back to a, it is given up as it was before a
BEGIN;
SELECT outcome FROM idem_reserve('g_a', 'POST /v1/charges', 'c-rel5', '{"amount": 7}'::jsonb);
SELECT idem_release('g_a', 'POST /v1/charges', 'c-rel5');
SAVEPOINT a;
SELECT outcome FROM idem_reserve('g_a', 'POST /v1/charges', 'c-rel5', '{"amount": 7}'::jsonb);
SAVEPOINT b;
SELECT idem_release('g_a', 'POST /v1/charges', 'c-rel5');
SAVEPOINT c;
SELECT outcome FROM idem_reserve('g_a', 'POST /v1/charges', 'c-rel5', '{"amount": 7}'::jsonb);
ROLLBACK TO SAVEPOINT b;
-- back to b: made again in a, held
INSERT INTO shop.charges VALUES (14, 140);
ROLLBACK TO SAVEPOINT a;
SELECT pg_temp.err($$INSERT INTO shop.charges VALUES (15, 150)$$);
ROLLBACK;
-- held, then given up and made again in a savepoint that rolls back: held,
-- with its first token (the row written at commit carries it)
BEGIN;
SELECT lock_token AS first_tok FROM idem_reserve('g_a', 'POST /v1/charges', 'c-rel6', '{"amount": 7}'::jsonb) \gset
SAVEPOINT s;
SELECT idem_release('g_a', 'POST /v1/charges', 'c-rel6');
SELECT outcome FROM idem_reserve('g_a', 'POST /v1/charges', 'c-rel6', '{"amount": 7}'::jsonb);
ROLLBACK TO SAVEPOINT s;
INSERT INTO shop.charges VALUES (16, 160);
COMMIT;
SELECT status, lock_token = :'first_tok' AS first_token FROM idempotency.keys
 WHERE tenant_id = 'g_a' AND idem_key = 'c-rel6';
SELECT idem_complete('g_a', 'POST /v1/charges', 'c-rel6', 201, '{}', lock_token => :'first_tok');
-- the bypass: administrators only, inside a transaction block, with a reason
CREATE ROLE guard_app IN ROLE idempotency_app;
CREATE ROLE guard_admin IN ROLE idempotency_admin;
GRANT USAGE ON SCHEMA shop TO guard_app, guard_admin;
GRANT INSERT, UPDATE, DELETE, SELECT ON shop.charges TO guard_app, guard_admin;
SET ROLE guard_app;
BEGIN;
SELECT pg_temp.err($$SELECT idem_guard_bypass('backfill')$$);
ROLLBACK;
RESET ROLE;
SET ROLE guard_admin;
-- outside a transaction block it would end at once (25P01)
SELECT idem_guard_bypass('backfill');
BEGIN;
SELECT pg_temp.err($$SELECT idem_guard_bypass('')$$);
SELECT pg_temp.err($$SELECT idem_guard_bypass(E' \t ')$$);
SELECT pg_temp.err($$SELECT idem_guard_bypass(NULL)$$);
ROLLBACK;
BEGIN;
SELECT idem_guard_bypass('migration 0042: backfill charges');
INSERT INTO shop.charges VALUES (6, 60);
UPDATE shop.charges SET amount = amount + 1 WHERE id = 6;
COMMIT;
-- the bypass ended with its transaction
SELECT pg_temp.err($$DELETE FROM shop.charges WHERE id = 6$$);
-- a bypass in a savepoint that rolls back is gone with it, as a
-- reservation would be; one in a released savepoint lasts
BEGIN;
SAVEPOINT s;
SELECT idem_guard_bypass('rolled back');
ROLLBACK TO SAVEPOINT s;
SELECT pg_temp.err($$DELETE FROM shop.charges WHERE id = 6$$);
SAVEPOINT t;
SELECT idem_guard_bypass('released');
RELEASE SAVEPOINT t;
SAVEPOINT u;
SELECT pg_temp.err($$UPDATE shop.charges SET amount = amount + 1 WHERE id = 6$$);
ROLLBACK TO SAVEPOINT u;
SELECT pg_temp.err($$UPDATE shop.charges SET amount = amount + 1 WHERE id = 6$$);
ROLLBACK;
RESET ROLE;
SELECT id, amount FROM shop.charges ORDER BY id;

-- attaching the guard takes EXECUTE on it (application and admin roles
-- have it); a writer without it is held to the guard all the same
CREATE ROLE guard_plain;
CREATE ROLE guard_owner IN ROLE idempotency_app;
GRANT USAGE, CREATE ON SCHEMA shop TO guard_plain, guard_owner;
SET ROLE guard_plain;
CREATE TABLE shop.plain_notes (id int);
SELECT pg_temp.err($$CREATE TRIGGER notes_need_key BEFORE INSERT ON shop.plain_notes
    FOR EACH ROW EXECUTE FUNCTION idem_require_reservation()$$);
DROP TABLE shop.plain_notes;
RESET ROLE;
SET ROLE guard_owner;
CREATE TABLE shop.owned_notes (id int);
CREATE TRIGGER notes_need_key BEFORE INSERT ON shop.owned_notes
    FOR EACH ROW EXECUTE FUNCTION idem_require_reservation();
GRANT INSERT ON shop.owned_notes TO guard_plain;
RESET ROLE;
SET ROLE guard_plain;
SELECT pg_temp.err($$INSERT INTO shop.owned_notes VALUES (1)$$);
RESET ROLE;
DROP TABLE shop.owned_notes;
REVOKE ALL ON SCHEMA shop FROM guard_plain, guard_owner;
DROP ROLE guard_plain, guard_owner;

-- called directly, it says what it is
SELECT pg_temp.err($$SELECT idem_require_reservation()$$);

-- the audit view: every table of the database and its guards
SELECT table_name, guarded, events, scopes, triggers
  FROM idempotency.guard_coverage
 WHERE table_name::text LIKE 'shop.%' ORDER BY table_name::text;
ALTER TABLE shop.refunds DISABLE TRIGGER refunds_need_key;
SELECT table_name, guarded FROM idempotency.guard_coverage WHERE table_name = 'shop.refunds'::regclass;
-- ENABLE REPLICA: the guard no longer fires in ordinary sessions
ALTER TABLE shop.refunds ENABLE REPLICA TRIGGER refunds_need_key;
SELECT table_name, guarded FROM idempotency.guard_coverage WHERE table_name = 'shop.refunds'::regclass;
-- a partitioned table: a statement-level guard on the parent does not
-- hold a write that names a partition, and the partition shows unguarded;
-- a row-level guard is cloned to every partition
CREATE TABLE shop.pay (id int, amount int) PARTITION BY RANGE (id);
CREATE TABLE shop.pay_a PARTITION OF shop.pay FOR VALUES FROM (0) TO (100);
CREATE TRIGGER pay_need_key BEFORE INSERT ON shop.pay
    FOR EACH STATEMENT EXECUTE FUNCTION idem_require_reservation();
SELECT pg_temp.err($$INSERT INTO shop.pay VALUES (1, 1)$$);
SELECT pg_temp.err($$INSERT INTO shop.pay_a VALUES (2, 2)$$);
SELECT table_name, guarded, triggers FROM idempotency.guard_coverage
 WHERE table_name::text LIKE 'shop.pay%' ORDER BY table_name::text;
CREATE TRIGGER pay_rows_need_key BEFORE INSERT ON shop.pay
    FOR EACH ROW EXECUTE FUNCTION idem_require_reservation();
SELECT pg_temp.err($$INSERT INTO shop.pay_a VALUES (3, 3)$$);
SELECT table_name, guarded, triggers FROM idempotency.guard_coverage
 WHERE table_name::text LIKE 'shop.pay%' ORDER BY table_name::text;
-- a foreign table is a table the application writes too: listed
CREATE FOREIGN DATA WRAPPER guard_fdw;
CREATE SERVER guard_srv FOREIGN DATA WRAPPER guard_fdw;
CREATE FOREIGN TABLE shop.remote_ledger (id int) SERVER guard_srv;
SELECT table_name, guarded FROM idempotency.guard_coverage WHERE table_name = 'shop.remote_ledger'::regclass;
CREATE TRIGGER ledger_need_key BEFORE INSERT ON shop.remote_ledger
    FOR EACH ROW EXECUTE FUNCTION idem_require_reservation();
SELECT table_name, guarded FROM idempotency.guard_coverage WHERE table_name = 'shop.remote_ledger'::regclass;
DROP FOREIGN TABLE shop.remote_ledger;
DROP SERVER guard_srv;
DROP FOREIGN DATA WRAPPER guard_fdw;
-- a guard with a WHEN condition may let any row through, and one for
-- UPDATE OF some columns lets updates of the others through: neither
-- counts for those events, and both are listed as conditional
CREATE TABLE shop.cond (id int, amount int, note text);
CREATE TRIGGER cond_when BEFORE INSERT OR UPDATE OR DELETE ON shop.cond
    FOR EACH ROW WHEN (pg_trigger_depth() > 5) EXECUTE FUNCTION idem_require_reservation();
SELECT pg_temp.err($$INSERT INTO shop.cond VALUES (1, 1, 'x')$$);
SELECT table_name, guarded, events, triggers, conditional_triggers
  FROM idempotency.guard_coverage WHERE table_name = 'shop.cond'::regclass;
CREATE TRIGGER cond_cols BEFORE INSERT OR UPDATE OF amount OR DELETE ON shop.cond
    FOR EACH ROW EXECUTE FUNCTION idem_require_reservation('POST /cond');
SELECT pg_temp.err($$UPDATE shop.cond SET note = 'y'$$);
SELECT table_name, guarded, events, scopes, triggers, conditional_triggers
  FROM idempotency.guard_coverage WHERE table_name = 'shop.cond'::regclass;
CREATE TRIGGER cond_rows BEFORE UPDATE ON shop.cond
    FOR EACH ROW EXECUTE FUNCTION idem_require_reservation('POST /cond');
SELECT table_name, guarded, events, scopes, triggers, conditional_triggers
  FROM idempotency.guard_coverage WHERE table_name = 'shop.cond'::regclass;
-- the extension's own tables are not listed
SELECT count(*) FROM idempotency.guard_coverage WHERE table_name::text LIKE 'idempotency.%';
-- as an INSTEAD OF trigger of a view it would report the view's writes as
-- done without making them (they were dropped): refused (39P01), with a
-- reservation held too, and nothing written
CREATE TABLE shop.base (id int, v int);
CREATE VIEW shop.base_view AS SELECT * FROM shop.base;
CREATE TRIGGER base_view_guard INSTEAD OF INSERT OR UPDATE OR DELETE ON shop.base_view
    FOR EACH ROW EXECUTE FUNCTION idem_require_reservation();
BEGIN;
SELECT outcome FROM idem_reserve('g_a', 'POST /view', 'v-1', '{}');
SELECT pg_temp.err($$INSERT INTO shop.base_view VALUES (1, 1)$$);
ROLLBACK;
SELECT count(*) AS base_rows FROM shop.base;

DROP SCHEMA shop CASCADE;
DROP ROLE guard_app, guard_admin;
DELETE FROM idempotency.keys WHERE tenant_id = 'g_a';
