-- the one-statement round, deleting the row on ack (no history kept)
UPDATE plain_outbox o
   SET status = 'leased', lease_token = gen_random_uuid(), leased_by = 'bench',
       lease_until = now() + interval '5 minutes', available_at = now() + interval '5 minutes'
  FROM (SELECT ctid FROM plain_outbox
         WHERE status IN ('pending', 'leased') AND available_at <= now()
         ORDER BY available_at LIMIT 1
           FOR UPDATE SKIP LOCKED) c
 WHERE o.ctid = c.ctid
RETURNING o.* \gset
DELETE FROM plain_outbox
 WHERE tenant_id = CAST(:tenant_id AS text) AND id = CAST(:id AS bigint) AND status = 'leased'
   AND lease_token = CAST(:lease_token AS uuid);
