-- outbox: enqueue, claim and ack, their filters and their errors
-- (tenants obx_a and obx_b, topics obx.*; everything is removed at the end)

-- report an error as SQLSTATE, message and hint in one line
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

-- enqueue writes one pending row with the correlation key
SELECT outbox_enqueue('obx_a', 'obx.capture', '{"amount": 450}', 'order-1', 'payments',
                      '{"x-trace": "t1"}') AS id1 \gset
SELECT tenant_id, topic, payload, headers, idem_scope, idem_key, status, attempts,
       max_attempts, available_at = created_at AS due_now, lease_token IS NULL AS no_token
  FROM idempotency.outbox WHERE tenant_id = 'obx_a' AND id = :id1;

-- the row belongs to the enqueuing transaction: a rollback leaves nothing
BEGIN;
SELECT outbox_enqueue('obx_a', 'obx.rollback', '{}') IS NOT NULL AS enqueued;
SELECT count(*) FROM idempotency.outbox WHERE topic = 'obx.rollback';
ROLLBACK;
SELECT count(*) FROM idempotency.outbox WHERE topic = 'obx.rollback';

-- max_attempts: the row's own, else idempotency.outbox_max_attempts
SET idempotency.outbox_max_attempts = 3;
SELECT outbox_enqueue('obx_a', 'obx.other', '{}') AS id_guc \gset
RESET idempotency.outbox_max_attempts;
SELECT outbox_enqueue('obx_a', 'obx.other', '{}', max_attempts => 7) AS id_own \gset
SELECT id = :id_guc AS from_guc, max_attempts FROM idempotency.outbox
 WHERE id IN (:id_guc, :id_own) ORDER BY id;
DELETE FROM idempotency.outbox WHERE id IN (:id_guc, :id_own);

-- a claim leases the row to the worker for exactly the lease, with a token
-- and the key the worker passes downstream
SELECT id = :id1 AS same_row, status, leased_by, idem_scope, idem_key,
       lease_until - statement_timestamp() AS lease,
       lease_until = available_at AS reclaimable_at_lease_end,
       lease_token IS NOT NULL AS has_token, attempts
  FROM outbox_claim('worker-1', 10, '45 seconds', tenant => 'obx_a');
-- nothing else is due
SELECT count(*) FROM outbox_claim('worker-2', 10, '45 seconds', tenant => 'obx_a');
SELECT lease_token AS token1 FROM idempotency.outbox WHERE id = :id1 \gset

-- ack: done, with the provider's reference and done_at
SELECT outbox_ack('obx_a', :id1, :'token1', 'ch_123');
SELECT status, provider_ref, done_at IS NOT NULL AS has_done_at, lease_until
  FROM idempotency.outbox WHERE id = :id1;

-- acking twice is an error and changes nothing
SELECT pg_temp.outbox_error(format('SELECT outbox_ack(%L, %s, %L, %L)',
                                   'obx_a', :id1, :'token1', 'ch_999'));
SELECT provider_ref FROM idempotency.outbox WHERE id = :id1;

-- a token that is not the current lease's is refused (fencing)
SELECT outbox_enqueue('obx_a', 'obx.capture', '{}') AS id2 \gset
SELECT count(*) FROM outbox_claim('worker-1', 1, '1 minute', tenant => 'obx_a');
SELECT pg_temp.outbox_error(format('SELECT outbox_ack(%L, %s, %L)',
                                   'obx_a', :id2, gen_random_uuid()));
SELECT status FROM idempotency.outbox WHERE id = :id2;
-- unknown id, and a real id under another tenant: both "does not exist"
SELECT pg_temp.outbox_error(format('SELECT outbox_ack(%L, %s, %L)',
                                   'obx_a', -1, gen_random_uuid()));
SELECT pg_temp.outbox_error(format('SELECT outbox_ack(%L, %s, %L)',
                                   'obx_b', :id2, gen_random_uuid()));
-- NULL arguments
SELECT pg_temp.outbox_error('SELECT outbox_ack(NULL, 1, gen_random_uuid())');
SELECT pg_temp.outbox_error('SELECT outbox_ack(''obx_a'', NULL, gen_random_uuid())');
SELECT pg_temp.outbox_error('SELECT outbox_ack(''obx_a'', 1, NULL)');
DELETE FROM idempotency.outbox WHERE tenant_id = 'obx_a';

-- claim order: oldest available_at first, whatever the id order; batch is
-- honoured.  Rows 1, 3 and 5 are due a millisecond apart, in that order:
-- rows due at the same time come in the order of their places in the
-- table, which the free space earlier tests left decides
SELECT count(outbox_enqueue('obx_a', 'obx.order', jsonb_build_object('n', n)))
  FROM generate_series(1, 5) n;
UPDATE idempotency.outbox
   SET available_at = CASE WHEN (payload->>'n')::int IN (2, 4)
                           THEN now() - (payload->>'n')::int * interval '1 minute'
                           ELSE now() - (10 - (payload->>'n')::int) * interval '1 millisecond' END
 WHERE tenant_id = 'obx_a';
SELECT payload->>'n' AS n FROM outbox_claim('w', 3, '1 minute', tenant => 'obx_a');
SELECT payload->>'n' AS n FROM outbox_claim('w', 3, '1 minute', tenant => 'obx_a');
SELECT count(*) FROM outbox_claim('w', 3, '1 minute', tenant => 'obx_a');

-- a row due later is not claimed before its time
SELECT outbox_enqueue('obx_a', 'obx.later', '{}', deliver_after => '1 hour') AS id_later \gset
SELECT count(*) FROM outbox_claim('w', 10, '1 minute', topics => '{obx.later}');
SELECT available_at - created_at AS delay FROM idempotency.outbox WHERE id = :id_later;
DELETE FROM idempotency.outbox WHERE tenant_id = 'obx_a';

-- filters: topics and tenant; NULL means any
SELECT count(outbox_enqueue(t, tp, '{}'))
  FROM (VALUES ('obx_a', 'obx.mail'), ('obx_a', 'obx.sms'), ('obx_b', 'obx.mail'),
               ('obx_b', 'obx.sms'), ('obx_b', 'obx.push')) v(t, tp);
SELECT tenant_id, topic FROM outbox_claim('w', 10, '1 minute', topics => '{obx.mail,obx.push}', tenant => 'obx_b')
 ORDER BY 1, 2;
SELECT tenant_id, topic FROM outbox_claim('w', 10, '1 minute', topics => '{obx.sms}')
 ORDER BY 1, 2;
SELECT tenant_id, topic FROM outbox_claim('w', 10, '1 minute', topics => '{obx.mail,obx.sms,obx.push}')
 ORDER BY 1, 2;
-- a topic list that can match nothing is refused, not taken for "idle"
SELECT pg_temp.outbox_error($$SELECT * FROM outbox_claim('w', 10, '1 minute', topics => '{}')$$);
SELECT pg_temp.outbox_error($$SELECT * FROM outbox_claim('w', 10, '1 minute', topics => '{NULL}')$$);
SELECT pg_temp.outbox_error($$SELECT * FROM outbox_claim('w', 1, '1 minute', topics => '{obx.sms,NULL}')$$);
SELECT pg_temp.outbox_error($$SELECT * FROM outbox_claim('w', 10, '1 minute', topics => '{{obx.mail},{obx.sms}}')$$);
SELECT pg_temp.outbox_error($$SELECT * FROM outbox_claim('w', 10, '1 minute', topics => ARRAY['obx.mail', ''])$$);
SELECT pg_temp.outbox_error($$SELECT * FROM outbox_claim('w', 10, '1 minute', topics => ARRAY[repeat('t', 256)])$$);
DELETE FROM idempotency.outbox WHERE tenant_id IN ('obx_a', 'obx_b');

-- a backlog of one topic does not slow down the workers of another: a
-- claim of one topic reads its own due rows (outbox_topic_claim_idx), not
-- the older due rows of the other topics
INSERT INTO idempotency.outbox (tenant_id, topic, payload, max_attempts, available_at)
SELECT 'obx_a', 'obx.bulk', '{"padding": "0123456789012345678901234567890123456789"}', 5,
       now() - interval '1 hour' + g * interval '1 millisecond'
  FROM generate_series(1, 20000) g;
-- (each due a microsecond after the one before: rows due at the same time
-- are claimed in the order of their places in the table, which the free
-- space left by earlier tests decides)
SELECT count(outbox_enqueue('obx_a', 'obx.urgent', jsonb_build_object('n', g),
                            deliver_after => g * interval '1 microsecond'))
  FROM generate_series(1, 4) g;
VACUUM ANALYZE idempotency.outbox;
SELECT pg_stat_force_next_flush();
BEGIN;
SELECT payload->>'n' AS n FROM outbox_claim('w', 2, '1 minute', topics => '{obx.urgent}')
 ORDER BY 1;
SELECT payload->>'n' AS n FROM outbox_claim('w', 1, '1 minute', topics => '{obx.urgent}');
SELECT pg_relation_size('idempotency.outbox') / current_setting('block_size')::int > 100
           AS many_pages,
       pg_stat_get_xact_blocks_fetched('idempotency.outbox'::regclass) <= 40
           AS reads_its_topic;
COMMIT;
-- one topic at another index of the array, and several topics: the same
-- rows as before, oldest first
SELECT payload->>'n' AS n FROM outbox_claim('w', 2, '1 minute', topics => '[0:0]={obx.urgent}');
SELECT topic, count(*) FROM outbox_claim('w', 2, '1 minute', topics => '{obx.urgent,obx.bulk}')
 GROUP BY topic ORDER BY topic;

-- likewise a claim for one tenant (naming it, or by a session confined to
-- it) reads that tenant's due rows (outbox_tenant_claim_idx), not the
-- older due rows of the other tenants
SELECT count(outbox_enqueue('obx_q', 'obx.quiet', jsonb_build_object('n', g)))
  FROM generate_series(1, 4) g;
-- due a millisecond apart, in the order of n (see the claim order above)
UPDATE idempotency.outbox
   SET available_at = now() - (10 - (payload->>'n')::int) * interval '1 millisecond'
 WHERE tenant_id = 'obx_q';
INSERT INTO idempotency.outbox (tenant_id, topic, payload, max_attempts, available_at)
SELECT 'obx_t' || g % 20, 'obx.other', '{}', 5, now() + interval '1 hour'
  FROM generate_series(1, 200) g;
ANALYZE idempotency.outbox;
SELECT pg_stat_force_next_flush();
BEGIN;
SELECT payload->>'n' AS n FROM outbox_claim('w', 2, '1 minute', tenant => 'obx_q')
 ORDER BY 1;
SET LOCAL idempotency.tenant = 'obx_q';
SELECT payload->>'n' AS n FROM outbox_claim('w', 1, '1 minute');
SELECT pg_stat_get_xact_blocks_fetched('idempotency.outbox'::regclass) <= 40
           AS reads_its_tenant;
COMMIT;
DELETE FROM idempotency.outbox WHERE tenant_id = 'obx_q' OR tenant_id LIKE 'obx_t%';

-- idempotency.tenant binds the session: a NULL tenant means that tenant, and
-- naming another one is refused
SELECT outbox_enqueue('obx_a', 'obx.bound', '{}') AS id_ba \gset
SELECT outbox_enqueue('obx_b', 'obx.bound', '{}') AS id_bb \gset
SET idempotency.tenant = 'obx_a';
SELECT tenant_id, topic FROM outbox_claim('w', 10, '1 minute', topics => '{obx.bound}');
SELECT pg_temp.outbox_error('SELECT * FROM outbox_claim(''w'', tenant => ''obx_b'')');
SELECT pg_temp.outbox_error('SELECT outbox_enqueue(''obx_b'', ''obx.bound'', ''{}'')');
SELECT pg_temp.outbox_error(format('SELECT outbox_ack(%L, %s, %L)', 'obx_b', :id_bb, gen_random_uuid()));
RESET idempotency.tenant;
SELECT tenant_id, status FROM idempotency.outbox WHERE topic = 'obx.bound' ORDER BY 1;
DELETE FROM idempotency.outbox WHERE tenant_id IN ('obx_a', 'obx_b');

-- bad input to enqueue: each refused with its own SQLSTATE, nothing written
SELECT pg_temp.outbox_error('SELECT outbox_enqueue(NULL, ''obx.x'', ''{}'')');
SELECT pg_temp.outbox_error('SELECT outbox_enqueue(''obx_a'', NULL, ''{}'')');
SELECT pg_temp.outbox_error('SELECT outbox_enqueue(''obx_a'', ''obx.x'', NULL)');
-- headers are an object of names and values, as idem_complete's
SELECT pg_temp.outbox_error($$SELECT outbox_enqueue('obx_a', 'obx.x', '{}', headers => '[1]')$$);
SELECT pg_temp.outbox_error($$SELECT outbox_enqueue('obx_a', 'obx.x', '{}', headers => '"a string"')$$);
-- the JSON value null is taken as it is (README, the WAL relay's message)
SELECT outbox_enqueue('obx_a', 'obx.null-headers', '{}', headers => 'null') AS nid \gset
SELECT headers IS NOT NULL AND headers = 'null'::jsonb AS json_null_kept
  FROM idempotency.outbox WHERE tenant_id = 'obx_a' AND id = :nid;
DELETE FROM idempotency.outbox WHERE tenant_id = 'obx_a' AND id = :nid;
SELECT pg_temp.outbox_error('SELECT outbox_enqueue(''obx_a'', '''', ''{}'')');
SELECT pg_temp.outbox_error(format('SELECT outbox_enqueue(%L, %L, %L)', 'obx_a', repeat('t', 256), '{}'));
SELECT pg_temp.outbox_error('SELECT outbox_enqueue(''obx_a'', ''obx.x'', ''{}'', key => '''')');
SELECT pg_temp.outbox_error(format('SELECT outbox_enqueue(%L, %L, %L, key => %L)', 'obx_a', 'obx.x', '{}', repeat('k', 256)));
SELECT pg_temp.outbox_error(format('SELECT outbox_enqueue(%L, %L, %L, key => %L)', 'obx_a', 'obx.x', '{}', E'caf\u00e9'));
SELECT pg_temp.outbox_error('SELECT outbox_enqueue(''obx_a'', ''obx.x'', ''{}'', scope => ''s'')');
SELECT pg_temp.outbox_error('SELECT outbox_enqueue(''obx_a'', ''obx.x'', ''{}'', key => ''k'', scope => '''')');
SELECT pg_temp.outbox_error(format('SELECT outbox_enqueue(%L, %L, %L, key => %L, scope => %L)', 'obx_a', 'obx.x', '{}', 'k', repeat('s', 256)));
SELECT pg_temp.outbox_error('SELECT outbox_enqueue(''obx_a'', ''obx.x'', ''{}'', deliver_after => ''-1 second'')');
-- at most 1000 years, refused before an id is drawn
SELECT last_value AS seq_before FROM idempotency.outbox_id_seq \gset
SELECT pg_temp.outbox_error('SELECT outbox_enqueue(''obx_a'', ''obx.x'', ''{}'', deliver_after => ''1000 years 1 day'')');
SELECT pg_temp.outbox_error('SELECT outbox_enqueue(''obx_a'', ''obx.x'', ''{}'', deliver_after => ''178000000 years'')');
SELECT last_value = :seq_before AS no_id_drawn FROM idempotency.outbox_id_seq;
SELECT outbox_enqueue('obx_a', 'obx.far', '{}', deliver_after => '1000 years') IS NOT NULL AS thousand_years;
SELECT pg_temp.outbox_error('SELECT outbox_enqueue(''obx_a'', ''obx.x'', ''{}'', max_attempts => 0)');
SET idempotency.max_payload_size = '1kB';
SELECT pg_temp.outbox_error(format('SELECT outbox_enqueue(%L, %L, %L)', 'obx_a', 'obx.x',
                                   jsonb_build_object('blob', repeat('x', 1100))));
-- the limit counts payload plus headers
SELECT pg_temp.outbox_error(format('SELECT outbox_enqueue(%L, %L, %L, headers => %L)', 'obx_a', 'obx.x',
                                   jsonb_build_object('blob', repeat('x', 600)),
                                   jsonb_build_object('h', repeat('y', 600))));
SELECT outbox_enqueue('obx_a', 'obx.fits', jsonb_build_object('blob', repeat('x', 900))) IS NOT NULL AS fits;
RESET idempotency.max_payload_size;
SELECT topic, count(*) FROM idempotency.outbox WHERE tenant_id = 'obx_a' GROUP BY 1;
DELETE FROM idempotency.outbox WHERE tenant_id = 'obx_a';

-- bad input to claim
SELECT pg_temp.outbox_error('SELECT * FROM outbox_claim(NULL)');
SELECT pg_temp.outbox_error('SELECT * FROM outbox_claim('''')');
SELECT pg_temp.outbox_error('SELECT * FROM outbox_claim(''w'', 1, ''1001 years'')');
SELECT pg_temp.outbox_error('SELECT * FROM outbox_claim(''w'', NULL)');
SELECT pg_temp.outbox_error('SELECT * FROM outbox_claim(''w'', 0)');
SELECT pg_temp.outbox_error('SELECT * FROM outbox_claim(''w'', -5)');
SELECT pg_temp.outbox_error('SELECT * FROM outbox_claim(''w'', 10, NULL)');
SELECT pg_temp.outbox_error('SELECT * FROM outbox_claim(''w'', 10, ''0 seconds'')');
SELECT pg_temp.outbox_error('SELECT * FROM outbox_claim(''w'', 10, ''-30 seconds'')');

-- privileges: tables and the dead-letter view are closed to PUBLIC, the
-- worker functions open, requeue revoked
SELECT has_table_privilege('public', 'idempotency.outbox', 'SELECT') AS outbox_select,
       has_table_privilege('public', 'idempotency.dead_letters', 'SELECT') AS dead_letters_select;
SELECT p.proname, has_function_privilege('public', p.oid, 'EXECUTE') AS public_execute,
       p.prosecdef AS security_definer, p.proconfig
  FROM pg_proc p
 WHERE p.proname LIKE 'outbox\_%' AND p.pronamespace <> pg_my_temp_schema()
 ORDER BY 1;

-- a role without any table privilege works the queue through the functions
CREATE ROLE regress_obx_app IN ROLE idempotency_app, idempotency_worker;
SET ROLE regress_obx_app;
SELECT outbox_enqueue('obx_a', 'obx.app', '{"ok": true}', 'k-app', 'app') IS NOT NULL AS enqueued;
SELECT pg_temp.outbox_error('SELECT count(*) FROM idempotency.outbox');
SELECT id AS app_id, lease_token AS app_token, idem_key FROM outbox_claim('app-worker', 1, '1 minute', tenant => 'obx_a') \gset
SELECT :'idem_key' AS idem_key, outbox_ack('obx_a', :app_id, :'app_token');
SELECT pg_temp.outbox_error('SELECT outbox_requeue(''obx_a'', 1)');
RESET ROLE;
SELECT status FROM idempotency.outbox WHERE id = :app_id;
DELETE FROM idempotency.outbox WHERE tenant_id = 'obx_a';
DROP ROLE regress_obx_app;

-- pg_dump keeps undelivered rows, and the id sequence with them
SELECT c.relname, c.relkind
  FROM pg_extension e, unnest(e.extconfig) AS cfg(reloid)
  JOIN pg_class c ON c.oid = cfg.reloid
 WHERE e.extname = 'idempotency' AND c.relname LIKE 'outbox%'
 ORDER BY 1;
