-- The transactional outbox: side effects leave the database only after the
-- request's transaction commits, and a worker delivers each at least once.
-- The application enqueues, the worker claims and acknowledges, the
-- operator looks at the table and requeues dead letters.

\echo '== 1. The application enqueues the side effect in the same transaction as the'
\echo '==    business write (the row, and the NOTIFY idempotency_outbox, exist only if it commits)'
SET ROLE shop_app;
BEGIN;
INSERT INTO outbox_demo_orders VALUES (1001, 4500);
SELECT outbox_enqueue('outbox-demo', 'payment.capture', '{"order": 1001, "amount": 4500}',
                      key => 'order-1001', scope => 'payments') AS outbox_id \gset
COMMIT;

\echo '== 2. A worker claims due rows: a lease, a fence token, and the key to send downstream'
SET ROLE shop_worker;
SELECT id = :outbox_id AS our_row, lease_token AS token, topic, payload,
       idem_scope, idem_key, status, leased_by,
       lease_until - statement_timestamp() AS lease
  FROM outbox_claim('worker-1', batch => 10, lease => '30 seconds', tenant => 'outbox-demo') \gset
\echo our row: :our_row, topic :topic, payload :payload, status :status, leased by :leased_by for :lease
SELECT :'idem_scope' || ':' || :'idem_key' AS "Idempotency-Key for the provider";
\echo '==    The worker reads nothing else: the table itself is not its to see'
\set ON_ERROR_STOP 0
SELECT count(*) FROM idempotency.outbox;
\set ON_ERROR_STOP 1

\echo '== 3. The provider answered (it deduplicated on Idempotency-Key: payments:order-1001): ack'
SELECT outbox_ack('outbox-demo', :outbox_id, :'token', provider_ref => 'ch_3PzX');
SET ROLE shop_ops;
SELECT status, provider_ref, done_at IS NOT NULL AS delivered FROM idempotency.outbox WHERE id = :outbox_id;

\echo '== 4. A late or repeated ack is refused: nothing is delivered twice by mistake'
SET ROLE shop_worker;
\set ON_ERROR_STOP 0
SELECT outbox_ack('outbox-demo', :outbox_id, :'token');
\set ON_ERROR_STOP 1

\echo '== 5. Failures: nack retries with exponential backoff; after max_attempts the row is dead'
SET ROLE shop_app;
SELECT outbox_enqueue('outbox-demo', 'email.receipt', '{"order": 1001}', key => 'receipt-1001',
                      scope => 'emails', max_attempts => 2) AS mail_id \gset
SET ROLE shop_worker;
SELECT lease_token AS token FROM outbox_claim('worker-1', 1, '30 seconds', topics => '{email.receipt}', tenant => 'outbox-demo') \gset
SELECT outbox_nack('outbox-demo', :mail_id, :'token', 'SMTP 451: try again later', retry_in => '0') AS status;
SELECT lease_token AS token FROM outbox_claim('worker-1', 1, '30 seconds', topics => '{email.receipt}', tenant => 'outbox-demo') \gset
SELECT outbox_nack('outbox-demo', :mail_id, :'token', 'SMTP 550: mailbox unavailable') AS status;
SET ROLE shop_ops;
SELECT topic, idem_key, attempts, max_attempts, last_error, last_worker
  FROM idempotency.dead_letters WHERE tenant_id = 'outbox-demo';

\echo '== 6. Once the cause is fixed, the operator requeues the dead letter'
SELECT outbox_requeue('outbox-demo', :mail_id);
SELECT status, attempts, last_error FROM idempotency.outbox WHERE id = :mail_id;
SET ROLE shop_worker;
SELECT lease_token AS token FROM outbox_claim('worker-1', 1, '30 seconds', topics => '{email.receipt}', tenant => 'outbox-demo') \gset
SELECT outbox_ack('outbox-demo', :mail_id, :'token', 'msg-77');
SET ROLE shop_ops;
SELECT topic, status, attempts, provider_ref FROM idempotency.outbox WHERE tenant_id = 'outbox-demo' ORDER BY id;
