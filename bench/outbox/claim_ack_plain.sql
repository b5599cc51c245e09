-- the same round by hand: SELECT ... FOR UPDATE SKIP LOCKED, then UPDATE to
-- lease, in one transaction; then the ack
BEGIN;
SELECT tenant_id AS t, id AS i FROM plain_outbox
 WHERE status IN ('pending', 'leased') AND available_at <= now()
 ORDER BY available_at LIMIT 1
   FOR UPDATE SKIP LOCKED \gset
UPDATE plain_outbox
   SET status = 'leased', lease_token = gen_random_uuid(), leased_by = 'bench',
       lease_until = now() + interval '5 minutes', available_at = now() + interval '5 minutes'
 WHERE tenant_id = CAST(:t AS text) AND id = CAST(:i AS bigint)
RETURNING * \gset
COMMIT;
UPDATE plain_outbox SET status = 'done', done_at = now(), provider_ref = 'ref', lease_until = NULL
 WHERE tenant_id = CAST(:tenant_id AS text) AND id = CAST(:id AS bigint) AND status = 'leased'
   AND lease_token = CAST(:lease_token AS uuid);
