-- bench/outbox: the extension's outbox against a hand-written SQL queue on a
-- table of the same shape (same columns, keys, indexes and fillfactor).
CREATE EXTENSION IF NOT EXISTS idempotency;

-- the business row a new request writes
CREATE TABLE bench_orders (
    tenant_id text NOT NULL,
    order_no  bigint GENERATED ALWAYS AS IDENTITY,
    amount    int NOT NULL,
    PRIMARY KEY (tenant_id, order_no)
);

CREATE TABLE plain_outbox (LIKE idempotency.outbox INCLUDING ALL)
    WITH (fillfactor = 80);

-- The hand-written queue finds its due rows, pending ones and expired
-- leases, in one index order (a leased row's available_at is its lease
-- end), as the extension did before 1.1: its claim indexes take both
-- statuses, and it has no index of leases (the extension's claim indexes
-- hold pending rows only, and its leases are in outbox_lease_idx).
DO $$
DECLARE
    i regclass;
BEGIN
    FOR i IN SELECT indexrelid::regclass FROM pg_index
              WHERE indrelid = 'plain_outbox'::regclass
                AND (pg_get_indexdef(indexrelid) LIKE '%available_at%'
                     OR pg_get_indexdef(indexrelid) LIKE '%lease_until%')
    LOOP
        EXECUTE format('DROP INDEX %s', i);
    END LOOP;
END $$;
CREATE INDEX plain_outbox_claim_idx ON plain_outbox (available_at)
    WHERE status IN ('pending', 'leased');
CREATE INDEX plain_outbox_topic_claim_idx ON plain_outbox (topic, available_at)
    WHERE status IN ('pending', 'leased');
CREATE INDEX plain_outbox_tenant_claim_idx ON plain_outbox (tenant_id, available_at)
    WHERE status IN ('pending', 'leased');

-- Worker rounds that loop on the server (each statement its own
-- transaction, as a worker runs them, without a round trip between them),
-- so that the figures measure the queues rather than the client; pgmq's
-- side is in pgmq.sql.

-- the same round on the outbox: claim one, then ack it
CREATE PROCEDURE bench_outbox_one(rounds int) LANGUAGE plpgsql AS $$
DECLARE
    t text;
    m bigint;
    tok uuid;
BEGIN
    FOR i IN 1 .. rounds LOOP
        SELECT tenant_id, id, lease_token INTO t, m, tok
          FROM outbox_claim('bench', 1, '30 seconds');
        IF m IS NULL THEN
            RAISE EXCEPTION 'outbox ran dry';
        END IF;
        COMMIT;
        PERFORM outbox_ack(t, m, tok);
        COMMIT;
    END LOOP;
END $$;

-- the same round on the hand-written queue, its tighter one-statement form;
-- delete_on_ack: a queue that keeps no history deletes the row instead
CREATE PROCEDURE bench_plain_one(rounds int, delete_on_ack bool DEFAULT false)
LANGUAGE plpgsql AS $$
DECLARE
    t text;
    m bigint;
    tok uuid;
BEGIN
    FOR i IN 1 .. rounds LOOP
        UPDATE plain_outbox o
           SET status = 'leased', lease_token = gen_random_uuid(), leased_by = 'bench',
               lease_until = now() + interval '30 seconds',
               available_at = now() + interval '30 seconds'
          FROM (SELECT ctid FROM plain_outbox
                 WHERE status IN ('pending', 'leased') AND available_at <= now()
                 ORDER BY available_at LIMIT 1
                   FOR UPDATE SKIP LOCKED) c
         WHERE o.ctid = c.ctid
        RETURNING o.tenant_id, o.id, o.lease_token INTO t, m, tok;
        IF m IS NULL THEN
            RAISE EXCEPTION 'plain queue ran dry';
        END IF;
        COMMIT;
        IF delete_on_ack THEN
            DELETE FROM plain_outbox
             WHERE tenant_id = t AND id = m AND status = 'leased' AND lease_token = tok;
        ELSE
            UPDATE plain_outbox SET status = 'done', done_at = now(), lease_until = NULL
             WHERE tenant_id = t AND id = m AND status = 'leased' AND lease_token = tok;
        END IF;
        COMMIT;
    END LOOP;
END $$;

-- the same on the outbox: claim 100 of one tenant, then one outbox_ack_many
CREATE PROCEDURE bench_outbox_batch(rounds int) LANGUAGE plpgsql AS $$
DECLARE
    ids bigint[];
    toks uuid[];
BEGIN
    FOR i IN 1 .. rounds LOOP
        SELECT array_agg(id), array_agg(lease_token) INTO ids, toks
          FROM outbox_claim('bench', 100, '30 seconds', tenant => 't0');
        IF ids IS NULL THEN
            RAISE EXCEPTION 'outbox ran dry';
        END IF;
        COMMIT;
        PERFORM count(*) FROM outbox_ack_many('t0', ids, toks);
        COMMIT;
    END LOOP;
END $$;
