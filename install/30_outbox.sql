
/* ---- outbox.c: transactional outbox ---- */

CREATE TYPE idempotency.outbox_status AS ENUM ('pending', 'leased', 'done', 'dead');

/*
 * Transactional outbox: intents written in the same transaction as the
 * key and the business rows, delivered by workers outside the database.
 * The tenant is compared byte for byte, as in idempotency.keys (and Citus
 * colocates the two tables only when their tenant columns agree), and so
 * are the other identifiers the indexes compare: topic, dedup_key and
 * ordering_key (the database's collation would cost more per comparison
 * and change nothing for equality).
 */
CREATE TABLE idempotency.outbox (
    tenant_id    text COLLATE pg_catalog."C" NOT NULL,
    id           bigint GENERATED ALWAYS AS IDENTITY,
    topic        text COLLATE pg_catalog."C" NOT NULL,
    payload      jsonb NOT NULL,
    headers      jsonb,
    idem_scope   text,
    idem_key     text,
    status       idempotency.outbox_status NOT NULL DEFAULT 'pending',
    attempts     int NOT NULL DEFAULT 0,
    max_attempts int NOT NULL,
    available_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    lease_token  uuid,
    leased_by    text,
    lease_until  timestamptz,
    last_error   text,
    provider_ref text,
    created_at   timestamptz NOT NULL DEFAULT pg_catalog.now(),
    done_at      timestamptz,
    dedup_key    text COLLATE pg_catalog."C",
    ordering_key text COLLATE pg_catalog."C",
    CONSTRAINT outbox_pkey PRIMARY KEY (tenant_id, id),
    CONSTRAINT outbox_max_attempts_positive CHECK (max_attempts > 0)
) WITH (fillfactor = 80,
        autovacuum_vacuum_scale_factor = 0.02,
        autovacuum_analyze_scale_factor = 0.05);

REVOKE ALL ON idempotency.outbox FROM PUBLIC;
GRANT SELECT ON idempotency.outbox TO idempotency_admin;

/*
 * The claim path: pending rows, oldest available_at first.  A claim moves
 * a row out of it (the lease enters the primary key and outbox_lease_idx
 * only, not the three claim indexes), and rows that are done or dead are
 * not in it, so it stays as small as the backlog.  outbox.c's claim
 * statements repeat this predicate.
 */
CREATE INDEX outbox_claim_idx ON idempotency.outbox (available_at)
    WHERE status = 'pending';

/*
 * Leased rows by the end of their lease: the claim takes expired leases
 * (their worker died or hung) from here first, and idem_reclaim_leases
 * finds them here, without reading the pending backlog.  Only a leased row
 * has a lease_until (every way out of a lease clears it).  The predicate
 * names lease_until rather than the status so that the statements that
 * find one row by its key and status (ack, nack, extend, and their batch
 * forms) are never planned over this index: they condition on the status
 * and not on lease_until, and go through the primary key.
 */
CREATE INDEX outbox_lease_idx ON idempotency.outbox (lease_until)
    WHERE lease_until IS NOT NULL;

/*
 * The claim path of a worker that asks for one topic: that topic's pending
 * rows, oldest first, without reading the due rows of the others, so that
 * a backlog of one topic (its workers stopped) does not slow down the
 * workers of the rest.  Same predicate as outbox_claim_idx; outbox.c
 * names the topic as an equality for the planner to use it.
 */
CREATE INDEX outbox_topic_claim_idx ON idempotency.outbox (topic, available_at)
    WHERE status = 'pending';

/*
 * The claim path of a worker that claims for one tenant (a claim naming
 * it, or any claim by a role bound to it): that tenant's pending rows, oldest
 * first, without reading the due rows of the others, so that one tenant's
 * backlog does not slow down the workers of the rest.  Same predicate as
 * outbox_claim_idx; outbox.c names the tenant as an equality.
 */
CREATE INDEX outbox_tenant_claim_idx ON idempotency.outbox (tenant_id, available_at)
    WHERE status = 'pending';

/*
 * Deduplicated enqueue: one row per tenant, topic and dedup_key, for as
 * long as the row exists.  outbox.c's ON CONFLICT names this predicate.
 */
CREATE UNIQUE INDEX outbox_dedup_idx ON idempotency.outbox (tenant_id, topic, dedup_key)
    WHERE dedup_key IS NOT NULL;

/*
 * Ordered delivery: the rows of a tenant and ordering key not yet
 * finished, by a 64-bit hash of the two, then id (integers are cheaper to
 * compare than the two strings; outbox.c computes the same hash, and
 * passes over rows of another key that share it).  The claim asks it
 * whether a row has an unfinished predecessor; outbox.c repeats this
 * status list (as "= ANY" of the same statuses, which the planner proves
 * equal).
 */
CREATE INDEX outbox_ordering_idx ON idempotency.outbox
    ((pg_catalog.hashtextextended(ordering_key,
                                  pg_catalog.hashtextextended(tenant_id, 0::pg_catalog.int8))),
     id)
    WHERE status IN ('pending', 'leased', 'dead') AND ordering_key IS NOT NULL;

/* Dead letters are few; this keeps listing and counting them cheap. */
CREATE INDEX outbox_dead_idx ON idempotency.outbox (tenant_id, id)
    WHERE status = 'dead';

/*
 * Delivered rows kept for idempotency.outbox_retention, by the time they
 * were delivered: the purge (idem_purge_outbox, idem_maintain) deletes the
 * oldest through it, so a run reads what it deletes instead of the whole
 * table (which holds every row delivered within the retention, millions
 * on a busy outbox).  Only a done-marking ack enters it.
 */
CREATE INDEX outbox_done_idx ON idempotency.outbox (done_at)
    WHERE status = 'done';

/*
 * Rows that used up their attempts, waiting for an operator: fix the cause,
 * then outbox_requeue(tenant, id).
 */
CREATE VIEW idempotency.dead_letters AS
    SELECT tenant_id, id, topic, idem_scope, idem_key, attempts, max_attempts,
           last_error, leased_by AS last_worker, created_at, payload, headers
      FROM idempotency.outbox
     WHERE status OPERATOR(pg_catalog.=) 'dead';

REVOKE ALL ON idempotency.dead_letters FROM PUBLIC;

/*
 * The outbox functions are declared SECURITY INVOKER and run as their owner
 * with search_path pinned in C (idem_owner_enter, as idem_reserve), which
 * costs less per message than a function-level SET and sees the calling
 * role's tenant binding.
 */
CREATE FUNCTION outbox_enqueue(tenant text, topic text, payload jsonb,
                               key text DEFAULT NULL,
                               scope text DEFAULT NULL,
                               headers jsonb DEFAULT NULL,
                               deliver_after interval DEFAULT '0',
                               max_attempts int DEFAULT NULL,
                               dedup_key text DEFAULT NULL,
                               ordering_key text DEFAULT NULL)
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'idem_outbox_enqueue'
    LANGUAGE C VOLATILE;

COMMENT ON FUNCTION outbox_enqueue(text, text, jsonb, text, text, jsonb, interval, int, text, text) IS
    'queue a side effect in the current transaction; NOTIFY idempotency_outbox on commit';

CREATE FUNCTION outbox_claim(worker text, batch int DEFAULT 10,
                             lease interval DEFAULT '30 seconds',
                             topics text[] DEFAULT NULL,
                             tenant text DEFAULT NULL)
    RETURNS SETOF idempotency.outbox
    AS 'MODULE_PATHNAME', 'idem_outbox_claim'
    LANGUAGE C VOLATILE ROWS 10;

COMMENT ON FUNCTION outbox_claim(text, int, interval, text[], text) IS
    'lease up to batch due outbox rows (FOR UPDATE SKIP LOCKED), oldest first';

CREATE FUNCTION outbox_ack(tenant text, id bigint, lease_token uuid,
                           provider_ref text DEFAULT NULL)
    RETURNS void
    AS 'MODULE_PATHNAME', 'idem_outbox_ack'
    LANGUAGE C VOLATILE;

COMMENT ON FUNCTION outbox_ack(text, bigint, uuid, text) IS
    'mark a leased outbox row delivered (only with its current lease_token)';

CREATE FUNCTION outbox_nack(tenant text, id bigint, lease_token uuid,
                            error text, retry_in interval DEFAULT NULL)
    RETURNS idempotency.outbox_status
    AS 'MODULE_PATHNAME', 'idem_outbox_nack'
    LANGUAGE C VOLATILE;

COMMENT ON FUNCTION outbox_nack(text, bigint, uuid, text, interval) IS
    'report a failed delivery: retry with backoff, or dead letter after max_attempts';

CREATE FUNCTION outbox_requeue(tenant text, id bigint)
    RETURNS void
    AS 'MODULE_PATHNAME', 'idem_outbox_requeue'
    LANGUAGE C VOLATILE;

COMMENT ON FUNCTION outbox_requeue(text, bigint) IS
    'return a dead letter to the queue (operators only)';

CREATE FUNCTION outbox_discard(tenant text, id bigint)
    RETURNS void
    AS 'MODULE_PATHNAME', 'idem_outbox_discard'
    LANGUAGE C VOLATILE;

COMMENT ON FUNCTION outbox_discard(text, bigint) IS
    'delete a dead letter that will not be delivered; the next row of its ordering key becomes its head (operators only)';

CREATE FUNCTION outbox_extend(tenant text, id bigint, lease_token uuid,
                              lease interval DEFAULT '30 seconds')
    RETURNS timestamptz
    AS 'MODULE_PATHNAME', 'idem_outbox_extend'
    LANGUAGE C VOLATILE;

COMMENT ON FUNCTION outbox_extend(text, bigint, uuid, interval) IS
    'heartbeat: extend the lease of a row still leased under lease_token to now + lease';

REVOKE ALL ON FUNCTION outbox_enqueue(text, text, jsonb, text, text, jsonb, interval, int, text, text),
    outbox_claim(text, int, interval, text[], text),
    outbox_ack(text, bigint, uuid, text),
    outbox_nack(text, bigint, uuid, text, interval),
    outbox_requeue(text, bigint),
    outbox_discard(text, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox_enqueue(text, text, jsonb, text, text, jsonb, interval, int, text, text)
    TO idempotency_app;
GRANT EXECUTE ON FUNCTION outbox_claim(text, int, interval, text[], text),
    outbox_ack(text, bigint, uuid, text),
    outbox_nack(text, bigint, uuid, text, interval) TO idempotency_worker;
GRANT EXECUTE ON FUNCTION outbox_requeue(text, bigint),
    outbox_discard(text, bigint) TO idempotency_admin;
REVOKE ALL ON FUNCTION outbox_extend(text, bigint, uuid, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox_extend(text, bigint, uuid, interval)
    TO idempotency_worker;

CREATE FUNCTION outbox_ack_many(tenant text, ids bigint[], lease_tokens uuid[],
                                provider_refs text[] DEFAULT NULL)
    RETURNS SETOF bigint
    AS 'MODULE_PATHNAME', 'idem_outbox_ack_many'
    LANGUAGE C VOLATILE ROWS 100;

COMMENT ON FUNCTION outbox_ack_many(text, bigint[], uuid[], text[]) IS
    'outbox_ack for many rows in one statement; returns the ids acknowledged';

CREATE FUNCTION outbox_nack_many(tenant text, ids bigint[], lease_tokens uuid[],
                                 error text, retry_in interval DEFAULT NULL)
    RETURNS TABLE (id bigint, status idempotency.outbox_status)
    AS 'MODULE_PATHNAME', 'idem_outbox_nack_many'
    LANGUAGE C VOLATILE ROWS 100;

COMMENT ON FUNCTION outbox_nack_many(text, bigint[], uuid[], text, interval) IS
    'outbox_nack for many rows in one statement; returns each row reported and its new status';

REVOKE ALL ON FUNCTION outbox_ack_many(text, bigint[], uuid[], text[]),
    outbox_nack_many(text, bigint[], uuid[], text, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox_ack_many(text, bigint[], uuid[], text[]),
    outbox_nack_many(text, bigint[], uuid[], text, interval) TO idempotency_worker;
GRANT SELECT ON idempotency.dead_letters TO idempotency_admin;

/*
 * The lease token each claim writes, drawn from a pool of strong random
 * bytes (outbox.c).  Only the outbox's own functions call it.
 */
CREATE FUNCTION idempotency.new_lease_token()
    RETURNS uuid
    AS 'MODULE_PATHNAME', 'idem_new_lease_token'
    LANGUAGE C VOLATILE;

COMMENT ON FUNCTION idempotency.new_lease_token() IS
    'a fresh random lease token (version 4 UUID) for outbox_claim';

REVOKE ALL ON FUNCTION idempotency.new_lease_token() FROM PUBLIC;

/*
 * The claim's ordering condition for a row with an ordering key: true when
 * no earlier row of its tenant and key is pending, leased or dead, probed
 * through outbox_ordering_idx (outbox.c).  Only the outbox's own claims
 * call it.  Its cost is one index probe: priced so, a claim of one topic
 * keeps to outbox_topic_claim_idx when other topics have a backlog, rather
 * than filtering their due rows out of outbox_claim_idx.
 */
CREATE FUNCTION idempotency.outbox_ordering_head(outbox oid, tenant text,
                                                 ordering_key text, id bigint)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'idem_outbox_ordering_head'
    LANGUAGE C STABLE STRICT COST 1000;

COMMENT ON FUNCTION idempotency.outbox_ordering_head(oid, text, text, bigint) IS
    'whether an outbox row is the first undelivered row of its ordering key, for outbox_claim';

REVOKE ALL ON FUNCTION idempotency.outbox_ordering_head(oid, text, text, bigint) FROM PUBLIC;

/*
 * Undelivered intents are data, not configuration: pg_dump must keep them,
 * and the id sequence with them, or a restored database would lose pending
 * side effects and hand out ids again.
 */
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox_id_seq', '');
