-- bench/outbox against pgmq: the same worker rounds on both queues, as
-- procedures that loop on the server (each statement its own transaction,
-- as a worker runs them, without a round trip between them), so that the
-- figures measure the queues rather than the client.  Loaded only when the
-- pgmq extension is installed for the bench server.
CREATE EXTENSION IF NOT EXISTS pgmq;
SELECT pgmq.create('bench');

-- one message per round: read one, then delete it
CREATE PROCEDURE bench_pgmq_one(rounds int) LANGUAGE plpgsql AS $$
DECLARE
    m bigint;
BEGIN
    FOR i IN 1 .. rounds LOOP
        SELECT msg_id INTO m FROM pgmq.read('bench', 30, 1);
        IF m IS NULL THEN
            RAISE EXCEPTION 'pgmq queue ran dry';
        END IF;
        COMMIT;
        PERFORM pgmq.delete('bench', m);
        COMMIT;
    END LOOP;
END $$;

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

-- batches of 100: read 100, then one delete of their ids
CREATE PROCEDURE bench_pgmq_batch(rounds int) LANGUAGE plpgsql AS $$
DECLARE
    ids bigint[];
BEGIN
    FOR i IN 1 .. rounds LOOP
        SELECT array_agg(msg_id) INTO ids FROM pgmq.read('bench', 30, 100);
        IF ids IS NULL THEN
            RAISE EXCEPTION 'pgmq queue ran dry';
        END IF;
        COMMIT;
        PERFORM count(*) FROM pgmq.delete('bench', ids);
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
