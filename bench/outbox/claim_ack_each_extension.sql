-- a batch worker's round: claim 100 rows (its own transaction), then ack
-- each with outbox_ack, in one statement (no round trip per row)
SELECT coalesce(array_agg(id)::text, '{}') AS ids, coalesce(array_agg(lease_token)::text, '{}') AS tokens
  FROM outbox_claim('bench', 100, '5 minutes', tenant => 't0') \gset
SELECT count(outbox_ack('t0', a.id, a.token))
  FROM unnest(CAST(:ids AS bigint[]), CAST(:tokens AS uuid[])) AS a(id, token);
