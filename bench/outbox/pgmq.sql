-- bench/outbox against pgmq: pgmq's side of the worker rounds that loop on
-- the server (the extension's are in setup.sql).  Loaded only when the
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
