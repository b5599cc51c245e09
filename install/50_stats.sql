/* ---- stats.c: counters and health ---- */

/*
 * Cumulative counters per (tenant, scope), from shared memory.  They name
 * tenants, so they are for operators: not readable by PUBLIC, readable by
 * pg_monitor.
 */
CREATE FUNCTION idem_stats(
    OUT tenant      text,
    OUT scope       text,
    OUT created     bigint,
    OUT replayed    bigint,
    OUT in_progress bigint,
    OUT mismatched  bigint,
    OUT stale       bigint,
    OUT completed   bigint,
    OUT released    bigint,
    OUT reaped      bigint,
    OUT swept       bigint)
    RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'idem_stats'
    LANGUAGE C VOLATILE STRICT;
COMMENT ON FUNCTION idem_stats() IS
    'cumulative idempotency counters per tenant and scope';

CREATE VIEW idempotency.stats AS
    SELECT * FROM @extschema@.idem_stats();
COMMENT ON VIEW idempotency.stats IS
    'cumulative idempotency counters per tenant and scope (needs shared_preload_libraries)';

CREATE FUNCTION idem_stats_reset()
    RETURNS void
    AS 'MODULE_PATHNAME', 'idem_stats_reset'
    LANGUAGE C VOLATILE STRICT;
COMMENT ON FUNCTION idem_stats_reset() IS
    'zero every idempotency counter';

/*
 * The state an operator watches: what is stuck, what needs a human, what
 * is waiting to leave.  One pass over each table; the view runs with its
 * owner's rights, so pg_monitor needs no access to the tables themselves.
 */
CREATE VIEW idempotency.health AS
SELECT k.processing,
       k.oldest_processing_age,
       k.stale_processing,
       k.needs_reconciliation,
       k.expired_keys,
       o.outbox_pending,
       o.outbox_oldest_pending_age,
       o.outbox_leased,
       o.outbox_dead
  FROM (SELECT count(*) FILTER (WHERE k.status = 'processing')
                   AS processing,
               now() - min(coalesce(k.locked_at, k.created_at))
                   FILTER (WHERE k.status = 'processing')
                   AS oldest_processing_age,
               count(*) FILTER (
                   WHERE k.status = 'processing'
                     AND NOT k.needs_reconciliation
                     AND coalesce(k.locked_at, k.created_at) < now() - coalesce(
                           s.lock_timeout,
                           current_setting('idempotency.default_lock_timeout', true)::interval,
                           interval '5 minutes'))
                   AS stale_processing,
               count(*) FILTER (WHERE k.needs_reconciliation)
                   AS needs_reconciliation,
               count(*) FILTER (WHERE k.expires_at < now()
                                  AND k.status <> 'processing'
                                  AND NOT k.needs_reconciliation)
                   AS expired_keys
          FROM idempotency.keys k
          LEFT JOIN idempotency.scopes s ON s.scope = k.scope) k,
       (SELECT count(*) FILTER (WHERE o.status = 'pending')
                   AS outbox_pending,
               now() - min(o.available_at)
                   FILTER (WHERE o.status = 'pending' AND o.available_at <= now())
                   AS outbox_oldest_pending_age,
               count(*) FILTER (WHERE o.status = 'leased')
                   AS outbox_leased,
               count(*) FILTER (WHERE o.status = 'dead')
                   AS outbox_dead
          FROM idempotency.outbox o) o;
COMMENT ON VIEW idempotency.health IS
    'stuck reservations, reconciliation backlog, reap backlog and outbox depth';

REVOKE ALL ON FUNCTION idem_stats() FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_stats_reset() FROM PUBLIC;
REVOKE ALL ON idempotency.stats, idempotency.health FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idem_stats() TO pg_monitor;
GRANT SELECT ON idempotency.stats, idempotency.health TO pg_monitor;
