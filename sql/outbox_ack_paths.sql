-- outbox_ack of a kept row updates it without the executor when the table
-- is as the extension makes it (and so does a claim of one row); a
-- trigger, a rule, or a CHECK constraint on a column the ack (or the
-- claim) sets, sends it through the executor, which runs them
-- (tenant obx_ap; removed at the end)

CREATE FUNCTION pg_temp.outbox_error(q text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    st text; msg text; hint text;
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
                            hint = PG_EXCEPTION_HINT;
    RETURN st || ': ' || msg || ' / hint: ' || hint;
END $$;

-- the rows through each index that should hold them, against the table
CREATE FUNCTION pg_temp.index_counts() RETURNS TABLE (through text, n bigint)
LANGUAGE plpgsql AS $$
BEGIN
    SET LOCAL enable_seqscan = off;
    SET LOCAL enable_bitmapscan = off;
    RETURN QUERY
    SELECT 'outbox_done_idx', count(*) FROM idempotency.outbox
     WHERE status = 'done' AND done_at > '-infinity' AND tenant_id || '' = 'obx_ap'
    UNION ALL
    SELECT 'a claim index', count(*) FROM idempotency.outbox
     WHERE status = 'pending' AND available_at > '-infinity' AND tenant_id || '' = 'obx_ap'
    UNION ALL
    SELECT 'outbox_lease_idx', count(*) FROM idempotency.outbox
     WHERE lease_until > '-infinity' AND tenant_id || '' = 'obx_ap'
    UNION ALL
    SELECT 'outbox_pkey', count(*) FROM idempotency.outbox
     WHERE tenant_id = 'obx_ap' AND id > 0;
    SET LOCAL enable_seqscan = on;
    SET LOCAL enable_indexscan = off;
    SET LOCAL enable_indexonlyscan = off;
    RETURN QUERY
    SELECT 'table, done', count(*) FROM idempotency.outbox
     WHERE status = 'done' AND tenant_id = 'obx_ap';
END $$;

-- (the counts read the index they name, or one of the three claim indexes)
SET enable_seqscan = off;
SET enable_bitmapscan = off;
EXPLAIN (COSTS OFF) SELECT count(*) FROM idempotency.outbox
 WHERE status = 'done' AND done_at > '-infinity' AND tenant_id || '' = 'obx_ap';
EXPLAIN (COSTS OFF) SELECT count(*) FROM idempotency.outbox
 WHERE tenant_id = 'obx_ap' AND id > 0;
EXPLAIN (COSTS OFF) SELECT count(*) FROM idempotency.outbox
 WHERE lease_until > '-infinity' AND tenant_id || '' = 'obx_ap';
RESET enable_seqscan;
RESET enable_bitmapscan;

SELECT count(outbox_enqueue('obx_ap', 'obx.ap', jsonb_build_object('n', g)))
  FROM generate_series(1, 5) g;
CREATE TEMP TABLE lease AS
SELECT tenant_id, id, lease_token, (payload->>'n')::int AS n
  FROM outbox_claim('w', 5, '1 minute', tenant => 'obx_ap');

-- the table as made: acked, the update counted, the indexes follow
SELECT pg_stat_force_next_flush();
SELECT n_tup_upd AS upd_before FROM pg_stat_user_tables
 WHERE relid = 'idempotency.outbox'::regclass \gset
SELECT outbox_ack(tenant_id, id, lease_token, 'ref-1') FROM lease WHERE n = 1;
SELECT pg_stat_force_next_flush();
SELECT n_tup_upd - :upd_before AS updates FROM pg_stat_user_tables
 WHERE relid = 'idempotency.outbox'::regclass;
SELECT * FROM pg_temp.index_counts();

-- a trigger on the table: the ack runs it
CREATE FUNCTION public.regress_obx_ap_note() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE 'trigger: % -> %, ref %', OLD.status, NEW.status, NEW.provider_ref;
    RETURN NEW;
END $$;
CREATE TRIGGER regress_obx_ap_note AFTER UPDATE ON idempotency.outbox
    FOR EACH ROW WHEN (NEW.tenant_id = 'obx_ap')
    EXECUTE FUNCTION public.regress_obx_ap_note();
SELECT outbox_ack(tenant_id, id, lease_token, 'ref-2') FROM lease WHERE n = 2;
-- and a claim of one row (which, on the table as made, leases the row
-- without the executor too) runs it
SELECT outbox_enqueue('obx_ap', 'obx.ap', '{"n": 8}') IS NOT NULL AS enqueued;
SELECT outbox_ack(tenant_id, id, lease_token, 'ref-8')
  FROM outbox_claim('w', 1, '1 minute', tenant => 'obx_ap');
DROP TRIGGER regress_obx_ap_note ON idempotency.outbox;
-- a CHECK constraint on a column a claim sets: checked, nothing leased
ALTER TABLE idempotency.outbox ADD CONSTRAINT regress_obx_ap_worker
    CHECK (leased_by IS DISTINCT FROM 'forbidden') NOT VALID;
SELECT outbox_enqueue('obx_ap', 'obx.ap', '{"n": 9}') AS id9 \gset
SELECT pg_temp.outbox_error($$SELECT count(*) FROM outbox_claim('forbidden', 1, '1 minute', tenant => 'obx_ap')$$);
SELECT status, leased_by FROM idempotency.outbox WHERE tenant_id = 'obx_ap' AND id = :id9;
ALTER TABLE idempotency.outbox DROP CONSTRAINT regress_obx_ap_worker;
DELETE FROM idempotency.outbox WHERE tenant_id = 'obx_ap' AND id = :id9;
DROP FUNCTION public.regress_obx_ap_note();

-- a CHECK constraint on a column the ack sets: checked, nothing written
ALTER TABLE idempotency.outbox ADD CONSTRAINT regress_obx_ap_ref
    CHECK (provider_ref IS DISTINCT FROM 'forbidden') NOT VALID;
SELECT pg_temp.outbox_error($$SELECT outbox_ack(tenant_id, id, lease_token, 'forbidden') FROM lease WHERE n = 3$$);
SELECT status, provider_ref FROM idempotency.outbox o JOIN lease l USING (tenant_id, id) WHERE l.n = 3;
ALTER TABLE idempotency.outbox DROP CONSTRAINT regress_obx_ap_ref;

-- a CHECK over a generated column computed from a column the ack sets
-- (virtual on PostgreSQL 18, whose constraint names only the generated
-- column; stored before 18): checked too, nothing written
DO $$
BEGIN
    EXECUTE pg_catalog.format('ALTER TABLE idempotency.outbox ADD COLUMN regress_obx_ap_len int
                                   GENERATED ALWAYS AS (length(provider_ref)) %s',
                              CASE WHEN current_setting('server_version_num')::int >= 180000
                                   THEN 'VIRTUAL' ELSE 'STORED' END);
END $$;
ALTER TABLE idempotency.outbox ADD CONSTRAINT regress_obx_ap_len_check
    CHECK (regress_obx_ap_len IS NULL OR regress_obx_ap_len < 10) NOT VALID;
SELECT pg_temp.outbox_error($$SELECT outbox_ack(tenant_id, id, lease_token, 'much-too-long') FROM lease WHERE n = 3$$);
SELECT status, provider_ref FROM idempotency.outbox o JOIN lease l USING (tenant_id, id) WHERE l.n = 3;
ALTER TABLE idempotency.outbox DROP COLUMN regress_obx_ap_len;

-- a NOT NULL on a column the ack may set to null (provider_ref, when the
-- ack gives none): refused as the UPDATE is (23502), nothing written
CREATE TEMP TABLE regress_obx_ap_nulls AS
    SELECT tenant_id, id FROM idempotency.outbox WHERE provider_ref IS NULL;
UPDATE idempotency.outbox SET provider_ref = 'regress-fill'
 WHERE (tenant_id, id) IN (SELECT tenant_id, id FROM regress_obx_ap_nulls);
ALTER TABLE idempotency.outbox ALTER COLUMN provider_ref SET NOT NULL;
SELECT pg_temp.outbox_error($$SELECT outbox_ack(tenant_id, id, lease_token) FROM lease WHERE n = 3$$);
SELECT status, provider_ref FROM idempotency.outbox o JOIN lease l USING (tenant_id, id) WHERE l.n = 3;
ALTER TABLE idempotency.outbox ALTER COLUMN provider_ref DROP NOT NULL;
UPDATE idempotency.outbox SET provider_ref = NULL
 WHERE (tenant_id, id) IN (SELECT tenant_id, id FROM regress_obx_ap_nulls);
DROP TABLE regress_obx_ap_nulls;

-- dropped again: the ack updates directly as before
SELECT outbox_ack(tenant_id, id, lease_token, 'ref-3'), statement_timestamp() AS ack3_at
  FROM lease WHERE n = 3 \gset
SELECT outbox_ack(tenant_id, id, lease_token) FROM lease WHERE n = 4;

-- the fence: a wrong token, a row already done, an unknown row; nothing
-- written
SELECT pg_temp.outbox_error($$SELECT outbox_ack(tenant_id, id, gen_random_uuid()) FROM lease WHERE n = 5$$);
SELECT pg_temp.outbox_error($$SELECT outbox_ack(tenant_id, id, lease_token) FROM lease WHERE n = 4$$);
SELECT pg_temp.outbox_error($$SELECT outbox_ack('obx_ap', -1, gen_random_uuid())$$);
-- a read-only transaction is refused as an UPDATE is, nothing written
BEGIN READ ONLY;
SELECT pg_temp.outbox_error($$SELECT outbox_ack(tenant_id, id, lease_token) FROM lease WHERE n = 5$$);
ROLLBACK;
-- and in a transaction that updated the row before (its extend): the ack
-- sees that version
BEGIN;
SELECT outbox_extend(tenant_id, id, lease_token, '5 minutes') > now() AS extended FROM lease WHERE n = 5;
SELECT outbox_ack(tenant_id, id, lease_token, 'ref-5') FROM lease WHERE n = 5;
COMMIT;

SELECT l.n, o.status, o.provider_ref, o.lease_until IS NULL AS lease_cleared,
       CASE WHEN l.n = 3 THEN o.done_at = :'ack3_at' END AS done_at_is_ack_time
  FROM idempotency.outbox o JOIN lease l USING (tenant_id, id) ORDER BY l.n;
SELECT * FROM pg_temp.index_counts();

-- a deduplicated row: acked, it stays in outbox_dedup_idx, so the same
-- dedup_key still returns its id and inserts nothing
SELECT outbox_enqueue('obx_ap', 'obx.ap', '{"n": 6}', dedup_key => 'ap-6') AS id6 \gset
SELECT outbox_ack(tenant_id, id, lease_token, 'ref-6')
  FROM outbox_claim('w', 1, '1 minute', tenant => 'obx_ap');
SELECT outbox_enqueue('obx_ap', 'obx.ap', '{"n": 6}', dedup_key => 'ap-6') = :id6 AS same_id;
SELECT count(*) AS rows_with_key FROM idempotency.outbox
 WHERE tenant_id = 'obx_ap' AND dedup_key = 'ap-6';

-- a rule on the table: the ack runs it too (the direct ack skipped a
-- DBA's rule)
CREATE TABLE public.regress_obx_ap_audit (id bigint, old_status text, new_status text);
CREATE RULE regress_obx_ap_audit_upd AS ON UPDATE TO idempotency.outbox
    WHERE NEW.tenant_id = 'obx_ap'
    DO ALSO INSERT INTO public.regress_obx_ap_audit VALUES (OLD.id, OLD.status, NEW.status);
SELECT outbox_enqueue('obx_ap', 'obx.ap', '{"n": 7}') IS NOT NULL AS enqueued;
SELECT outbox_ack(tenant_id, id, lease_token, 'ref-7')
  FROM outbox_claim('w', 1, '1 minute', tenant => 'obx_ap');
SELECT old_status, new_status FROM public.regress_obx_ap_audit ORDER BY id;
DROP RULE regress_obx_ap_audit_upd ON idempotency.outbox;
TRUNCATE public.regress_obx_ap_audit;
-- the rule dropped, claims and acks write directly again, although
-- pg_class.relhasrules stays set until the table is next vacuumed or
-- analysed: a claim of one row behind an ordering key's held head probes
-- the key's head once, as the direct claim does (the statements probe
-- twice; before, a dropped rule sent every claim and ack to them)
SELECT count(outbox_enqueue('obx_ap_rule', 'obx.ap', jsonb_build_object('n', g),
                            ordering_key => 'R'))
  FROM generate_series(1, 3) g;
SELECT payload->>'n' AS head_leased
  FROM outbox_claim('w', 1, '1 hour', tenant => 'obx_ap_rule');
BEGIN;
SELECT pg_stat_get_xact_numscans('idempotency.outbox_ordering_idx'::regclass) AS scans \gset
SELECT count(*) AS claimed_behind_head
  FROM outbox_claim('w', 1, '1 minute', tenant => 'obx_ap_rule');
SELECT pg_stat_get_xact_numscans('idempotency.outbox_ordering_idx'::regclass) - :scans AS probes;
COMMIT;
DELETE FROM idempotency.outbox WHERE tenant_id = 'obx_ap_rule';

-- an index on an expression (outbox_ordering_idx is one; here a DBA's, on
-- columns a claim and an ack set): a claim of one row and the ack still
-- write directly, and the index holds what the expression gives for the
-- new versions (an index scan finds them)
CREATE INDEX regress_obx_ap_expr ON idempotency.outbox
    ((pg_catalog.lower(leased_by || '/' || coalesce(provider_ref, '-'))));
SELECT outbox_enqueue('obx_ap', 'obx.ap', '{"n": 8}') AS id8 \gset
SELECT pg_stat_force_next_flush();
SELECT n_tup_upd AS upd_before FROM pg_stat_user_tables
 WHERE relid = 'idempotency.outbox'::regclass \gset
SELECT outbox_ack(tenant_id, id, lease_token, 'REF-8')
  FROM outbox_claim('W8', 1, '1 minute', tenant => 'obx_ap');
SELECT pg_stat_force_next_flush();
SELECT n_tup_upd - :upd_before AS updates FROM pg_stat_user_tables
 WHERE relid = 'idempotency.outbox'::regclass;
SET enable_seqscan = off;
SET enable_bitmapscan = off;
EXPLAIN (COSTS OFF) SELECT id FROM idempotency.outbox
 WHERE pg_catalog.lower(leased_by || '/' || coalesce(provider_ref, '-')) = 'w8/ref-8';
SELECT id = :id8 AS found_by_expression,
       pg_catalog.lower(leased_by || '/' || coalesce(provider_ref, '-')) AS expr
  FROM idempotency.outbox
 WHERE pg_catalog.lower(leased_by || '/' || coalesce(provider_ref, '-')) IN ('w8/ref-8', 'w8/-')
 ORDER BY expr;
RESET enable_seqscan;
RESET enable_bitmapscan;
DROP INDEX idempotency.regress_obx_ap_expr;

-- With idempotency.outbox_retention = 0 the ack deletes the row, directly
-- too when the table is as made: the delete counted, the row gone from
-- the table and every index, the fence as for a kept row
DELETE FROM idempotency.outbox WHERE tenant_id = 'obx_ap';
SET idempotency.outbox_retention = 0;
SELECT count(outbox_enqueue('obx_ap', 'obx.ap', jsonb_build_object('n', g),
                            dedup_key => 'del-' || g,
                            ordering_key => CASE WHEN g >= 5 THEN 'ord' END))
  FROM generate_series(1, 6) g;
CREATE TEMP TABLE dlease AS
SELECT tenant_id, id, lease_token, (payload->>'n')::int AS n
  FROM outbox_claim('w', 6, '1 minute', tenant => 'obx_ap');
-- (the second row of ordering key "ord" waits for the first)
SELECT array_agg(n ORDER BY n) AS claimed FROM dlease;
SELECT pg_stat_force_next_flush();
SELECT n_tup_del AS del_before FROM pg_stat_user_tables
 WHERE relid = 'idempotency.outbox'::regclass \gset
SELECT outbox_ack(tenant_id, id, lease_token, 'ref-d1') FROM dlease WHERE n = 1;
SELECT pg_stat_force_next_flush();
SELECT n_tup_del - :del_before AS deletes FROM pg_stat_user_tables
 WHERE relid = 'idempotency.outbox'::regclass;
SELECT * FROM pg_temp.index_counts();
-- the fence: a wrong token (55006), the row already deleted (P0002), a
-- read-only transaction (25006); nothing written
SELECT pg_temp.outbox_error($$SELECT outbox_ack(tenant_id, id, gen_random_uuid()) FROM dlease WHERE n = 2$$);
SELECT pg_temp.outbox_error($$SELECT outbox_ack(tenant_id, id, lease_token) FROM dlease WHERE n = 1$$);
BEGIN READ ONLY;
SELECT pg_temp.outbox_error($$SELECT outbox_ack(tenant_id, id, lease_token) FROM dlease WHERE n = 2$$);
ROLLBACK;
-- after its own extend in the same transaction: deletes that version
BEGIN;
SELECT outbox_extend(tenant_id, id, lease_token, '5 minutes') > now() AS extended FROM dlease WHERE n = 2;
SELECT outbox_ack(tenant_id, id, lease_token) FROM dlease WHERE n = 2;
COMMIT;
-- a trigger and a rule on delete: the ack runs them
CREATE FUNCTION public.regress_obx_ap_del() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE 'delete trigger: % %', OLD.status, OLD.payload;
    RETURN OLD;
END $$;
CREATE TRIGGER regress_obx_ap_del AFTER DELETE ON idempotency.outbox
    FOR EACH ROW WHEN (OLD.tenant_id = 'obx_ap')
    EXECUTE FUNCTION public.regress_obx_ap_del();
SELECT outbox_ack(tenant_id, id, lease_token) FROM dlease WHERE n = 3;
DROP TRIGGER regress_obx_ap_del ON idempotency.outbox;
DROP FUNCTION public.regress_obx_ap_del();
CREATE RULE regress_obx_ap_audit_del AS ON DELETE TO idempotency.outbox
    WHERE OLD.tenant_id = 'obx_ap'
    DO ALSO INSERT INTO public.regress_obx_ap_audit VALUES (OLD.id, OLD.status, NULL);
SELECT outbox_ack(tenant_id, id, lease_token) FROM dlease WHERE n = 4;
SELECT old_status, new_status FROM public.regress_obx_ap_audit ORDER BY id;
DROP RULE regress_obx_ap_audit_del ON idempotency.outbox;
DROP TABLE public.regress_obx_ap_audit;
-- the head of ordering key "ord" deleted: its successor is claimable; a
-- deleted row's dedup_key is free again
SELECT outbox_ack(tenant_id, id, lease_token) FROM dlease WHERE n = 5;
SELECT (payload->>'n')::int AS next_of_ord
  FROM outbox_claim('w', 5, '1 minute', tenant => 'obx_ap');
SELECT outbox_enqueue('obx_ap', 'obx.ap', '{"n": 1}', dedup_key => 'del-1')
       <> (SELECT id FROM dlease WHERE n = 1) AS new_row_for_freed_key;
SELECT (payload->>'n')::int AS n, status FROM idempotency.outbox
 WHERE tenant_id = 'obx_ap' ORDER BY id;
RESET idempotency.outbox_retention;

-- provider_ref given another type by a DBA (varchar(n), a domain): the ack
-- goes through the statement, which converts and checks the value (22001,
-- 23514) as an UPDATE does, where the direct ack stored it unchecked; the
-- table as made acks directly again
SELECT count(outbox_enqueue('obx_ty', 'obx.ty', jsonb_build_object('n', n)))
  FROM generate_series(1, 3) n;
CREATE TEMP TABLE tylease AS
SELECT tenant_id, id, lease_token, (payload->>'n')::int AS n
  FROM outbox_claim('w', 3, '1 minute', tenant => 'obx_ty');
ALTER TABLE idempotency.outbox ALTER COLUMN provider_ref TYPE varchar(64);
SELECT pg_temp.outbox_error(format('SELECT outbox_ack(%L, %s, %L, %L)', tenant_id,
                                   id, lease_token, repeat('r', 70)))
  FROM tylease WHERE n = 1;
SELECT outbox_ack(tenant_id, id, lease_token, 'ch_1') FROM tylease WHERE n = 1;
CREATE DOMAIN obx_ty_ref AS text CHECK (VALUE NOT LIKE 'tr\_%');
ALTER TABLE idempotency.outbox ALTER COLUMN provider_ref TYPE obx_ty_ref;
SELECT pg_temp.outbox_error(format('SELECT outbox_ack(%L, %s, %L, %L)', tenant_id,
                                   id, lease_token, 'tr_2'))
  FROM tylease WHERE n = 2;
SELECT outbox_ack(tenant_id, id, lease_token, 'ch_2') FROM tylease WHERE n = 2;
ALTER TABLE idempotency.outbox ALTER COLUMN provider_ref TYPE text;
DROP DOMAIN obx_ty_ref;
SELECT outbox_ack(tenant_id, id, lease_token, repeat('r', 70)) FROM tylease WHERE n = 3;
SELECT (payload->>'n')::int AS n, status, provider_ref FROM idempotency.outbox
 WHERE tenant_id = 'obx_ty' ORDER BY id;
DELETE FROM idempotency.outbox WHERE tenant_id = 'obx_ty';

DELETE FROM idempotency.outbox WHERE tenant_id = 'obx_ap';
