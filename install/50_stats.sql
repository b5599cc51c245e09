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
    OUT swept       bigint,
    OUT rate_limited bigint)
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
 * is waiting to leave.  One pass over the keys (a key's status has no
 * index, see 20_keys.sql); the outbox's figures each come from a partial
 * index (outbox_claim_idx for pending rows, outbox_lease_idx for leased
 * ones, outbox_dead_idx for dead ones), so they cost what the backlog
 * holds, not the delivered rows kept for idempotency.outbox_retention.
 * The view runs with its owner's rights, so pg_monitor needs no access to
 * the tables themselves.
 */
CREATE VIEW idempotency.health AS
SELECT k.processing,
       k.oldest_processing_age,
       k.stale_processing,
       k.needs_reconciliation,
       k.expired_keys,
       op.outbox_pending,
       oa.outbox_oldest_pending_age,
       ol.outbox_leased,
       od.outbox_dead,
       h.reservations_held,
       h.oldest_held_age,
       ol.outbox_expired_leases
  FROM (SELECT pg_catalog.count(*) FILTER (
                   WHERE k.status OPERATOR(pg_catalog.=) 'processing')
                   AS processing,
               pg_catalog.now() OPERATOR(pg_catalog.-)
                   pg_catalog.min(COALESCE(k.locked_at, k.created_at)) FILTER (
                   WHERE k.status OPERATOR(pg_catalog.=) 'processing')
                   AS oldest_processing_age,
               pg_catalog.count(*) FILTER (
                   WHERE k.status OPERATOR(pg_catalog.=) 'processing'
                     AND NOT k.needs_reconciliation
                     AND COALESCE(k.locked_at, k.created_at) OPERATOR(pg_catalog.<)
                         (pg_catalog.now() OPERATOR(pg_catalog.-) COALESCE(
                           s.lock_timeout,
                           pg_catalog.current_setting('idempotency.default_lock_timeout', true)::pg_catalog.interval,
                           '5 minutes'::pg_catalog.interval)))
                   AS stale_processing,
               pg_catalog.count(*) FILTER (WHERE k.needs_reconciliation)
                   AS needs_reconciliation,
               pg_catalog.count(*) FILTER (
                   WHERE k.expires_at OPERATOR(pg_catalog.<) pg_catalog.now()
                     AND k.status OPERATOR(pg_catalog.<>) 'processing'
                     AND NOT k.needs_reconciliation)
                   AS expired_keys
          FROM idempotency.keys k
          LEFT JOIN idempotency.scopes s ON s.scope OPERATOR(pg_catalog.=) k.scope) k,
       (SELECT pg_catalog.count(*) AS outbox_pending
          FROM idempotency.outbox o
         WHERE o.status OPERATOR(pg_catalog.=) 'pending') op,
       -- the oldest due row: a pending row since its available_at, or a
       -- lease that ran out since its end (its worker gone)
       (SELECT pg_catalog.now() OPERATOR(pg_catalog.-) LEAST(
                   (SELECT pg_catalog.min(o.available_at)
                      FROM idempotency.outbox o
                     WHERE o.status OPERATOR(pg_catalog.=) 'pending'
                       AND o.available_at OPERATOR(pg_catalog.<=) pg_catalog.now()),
                   (SELECT pg_catalog.min(o.lease_until)
                      FROM idempotency.outbox o
                     WHERE o.status OPERATOR(pg_catalog.=) 'leased'
                       AND o.lease_until OPERATOR(pg_catalog.<) pg_catalog.now()))
                   AS outbox_oldest_pending_age) oa,
       -- leases still running, and leases that ran out (their worker
       -- died or hung: due again, until a claim or idem_reclaim_leases
       -- takes them back)
       (SELECT pg_catalog.count(*) FILTER (
                   WHERE o.lease_until OPERATOR(pg_catalog.>=) pg_catalog.now())
                   AS outbox_leased,
               pg_catalog.count(*) FILTER (
                   WHERE o.lease_until OPERATOR(pg_catalog.<) pg_catalog.now())
                   AS outbox_expired_leases
          FROM idempotency.outbox o
         WHERE o.status OPERATOR(pg_catalog.=) 'leased'
           AND o.lease_until IS NOT NULL) ol,
       (SELECT pg_catalog.count(*) AS outbox_dead
          FROM idempotency.outbox o
         WHERE o.status OPERATOR(pg_catalog.=) 'dead') od,
       -- keys held by open and prepared transactions (a reservation in
       -- atomic use is written when it is completed or committed): the
       -- advisory locks whose fourth field is keys.c's IDEM_LOCKTAG_CLASS
       -- (0x4944), aged from the start of the transaction holding each
       -- (another role's shows to members of pg_read_all_stats) or from
       -- its PREPARE TRANSACTION (found through its xid's lock, which a
       -- prepared transaction holds without a pid).  Both are read from
       -- the functions behind pg_stat_activity and pg_prepared_xacts: those
       -- views join pg_authid, which Citus checks as the calling role.  The lock table is
       -- read once, and the prepared transactions are matched from the
       -- few rows of "prepared": a join back to pg_locks read the whole
       -- lock table again for every key held (a second for 6,000 keys).
       (WITH l AS MATERIALIZED (
             SELECT l.locktype, l.pid, l.virtualtransaction, l.transactionid
               FROM pg_catalog.pg_locks l
              WHERE (l.locktype OPERATOR(pg_catalog.=) 'advisory'
                     AND l.objsubid OPERATOR(pg_catalog.=) 18756
                     AND l.granted
                     AND l.database OPERATOR(pg_catalog.=)
                         (SELECT d.oid FROM pg_catalog.pg_database d
                           WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()))
                 OR (l.locktype OPERATOR(pg_catalog.=) 'transactionid'
                     AND l.pid IS NULL)),
             prepared AS MATERIALIZED (
             SELECT x.virtualtransaction, p.prepared
               FROM l x
               JOIN pg_catalog.pg_prepared_xact() p
                 ON p.transaction OPERATOR(pg_catalog.=) x.transactionid
              WHERE x.locktype OPERATOR(pg_catalog.=) 'transactionid')
        SELECT pg_catalog.count(*) AS reservations_held,
               pg_catalog.now() OPERATOR(pg_catalog.-)
                   pg_catalog.min(COALESCE(a.xact_start, p.prepared)) AS oldest_held_age
          FROM l
          LEFT JOIN pg_catalog.pg_stat_get_activity(NULL::pg_catalog.int4) a
                 ON a.pid OPERATOR(pg_catalog.=) l.pid
          LEFT JOIN prepared p
                 ON l.pid IS NULL
                AND p.virtualtransaction OPERATOR(pg_catalog.=) l.virtualtransaction
         WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory') h;
COMMENT ON VIEW idempotency.health IS
    'stuck reservations, reconciliation backlog, reap backlog and outbox depth';

REVOKE ALL ON FUNCTION idem_stats() FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_stats_reset() FROM PUBLIC;
REVOKE ALL ON idempotency.stats, idempotency.health FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idem_stats() TO pg_monitor, idempotency_admin;
GRANT EXECUTE ON FUNCTION idem_stats_reset() TO idempotency_admin;
GRANT SELECT ON idempotency.stats, idempotency.health TO pg_monitor, idempotency_admin;
