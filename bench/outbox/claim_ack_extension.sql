-- a worker's round: claim one row (its own transaction), then ack it
SELECT * FROM outbox_claim('bench', 1, '5 minutes') \gset
SELECT outbox_ack(:tenant_id, CAST(:id AS bigint), CAST(:lease_token AS uuid), 'ref');
