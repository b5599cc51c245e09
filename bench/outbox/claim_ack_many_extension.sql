-- a batch worker's round: claim 100 rows (its own transaction), then ack
-- them all in one outbox_ack_many statement
SELECT coalesce(array_agg(id)::text, '{}') AS ids, coalesce(array_agg(lease_token)::text, '{}') AS tokens
  FROM outbox_claim('bench', 100, '5 minutes', tenant => 't0') \gset
SELECT count(*) FROM outbox_ack_many('t0', CAST(:ids AS bigint[]), CAST(:tokens AS uuid[]));
