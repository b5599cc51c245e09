
/* ---- guard.c: the coverage guard ---- */

/*
 * Trigger function for business tables: a write from a transaction that
 * holds no reservation in one of the scopes given as trigger arguments
 * (any scope without arguments) fails with SQLSTATE ID001.  It reads no
 * table and can only run as a trigger.  EXECUTE is checked when a trigger
 * is created, not when it fires: application and admin roles may attach
 * it, and every writer of a guarded table is held to it.
 */
CREATE FUNCTION idem_require_reservation()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_require_reservation'
LANGUAGE C;

COMMENT ON FUNCTION idem_require_reservation() IS
'coverage guard: refuse writes to the table from transactions holding no idempotency reservation in the scopes given as arguments';

/* Admin: let the rest of this transaction write without a reservation; logged. */
CREATE FUNCTION idem_guard_bypass(reason text)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_guard_bypass'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idem_guard_bypass(text) IS
'let the rest of this transaction write to guarded tables without a reservation (logged with the reason)';

REVOKE ALL ON FUNCTION idem_require_reservation() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idem_require_reservation()
    TO idempotency_app, idempotency_admin;
REVOKE ALL ON FUNCTION idem_guard_bypass(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idem_guard_bypass(text) TO idempotency_admin;

/*
 * Every table of the database outside the system and the extensions, with
 * the enabled guards on it: the checklist's "every state-changing path
 * enforces the key".  scopes is empty when a guard accepts any scope.
 * Enabled means it fires in ordinary sessions (not ENABLE REPLICA).  A
 * guard counts only for what it holds whatever the row: nothing with a
 * WHEN condition, UPDATE only without a column list (UPDATE OF); such
 * guards are listed in conditional_triggers.
 * Partitions are listed too: a statement-level guard on a partitioned
 * table is not cloned to its partitions, so a write that names a partition
 * passes it, and the partition shows unguarded (row-level guards are
 * cloned, and show on every partition).
 */
CREATE VIEW idempotency.guard_coverage AS
SELECT c.oid::pg_catalog.regclass AS table_name,
       COALESCE(g.mask OPERATOR(pg_catalog.<>) 0, false) AS guarded,
       CASE WHEN g.mask OPERATOR(pg_catalog.<>) 0 THEN
           ARRAY(SELECT e.event FROM (VALUES (4, 'INSERT'), (16, 'UPDATE'),
                                            (8, 'DELETE'), (32, 'TRUNCATE'))
                                     AS e(bit, event)
                  WHERE (g.mask OPERATOR(pg_catalog.&) e.bit) OPERATOR(pg_catalog.<>) 0)
       END AS events,
       g.scopes,
       g.triggers,
       g.conditional_triggers
  FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
  LEFT JOIN LATERAL (
       SELECT pg_catalog.array_agg(DISTINCT t.tgname ORDER BY t.tgname)
                FILTER (WHERE x.bits OPERATOR(pg_catalog.<>) 0) AS triggers,
              pg_catalog.bit_or(x.bits) AS mask,
              CASE WHEN pg_catalog.bool_or(t.tgnargs OPERATOR(pg_catalog.=) 0)
                          FILTER (WHERE x.bits OPERATOR(pg_catalog.<>) 0)
                   THEN '{}'::pg_catalog.text[]
                   ELSE (SELECT pg_catalog.array_agg(DISTINCT s ORDER BY s)
                           FROM pg_catalog.unnest(pg_catalog.array_agg(a.args)
                                  FILTER (WHERE x.bits OPERATOR(pg_catalog.<>) 0)) AS s)
              END AS scopes,
              pg_catalog.array_agg(DISTINCT t.tgname ORDER BY t.tgname)
                FILTER (WHERE x.conditional) AS conditional_triggers
         FROM pg_catalog.pg_trigger t
        -- what a guard covers whatever the row: nothing with a WHEN
        -- condition, and UPDATE only without a column list (UPDATE OF)
        CROSS JOIN LATERAL (
              SELECT CASE WHEN t.tgqual IS NOT NULL THEN 0
                          ELSE t.tgtype::pg_catalog.int4 OPERATOR(pg_catalog.&)
                               CASE WHEN t.tgattr OPERATOR(pg_catalog.=) ''::pg_catalog.int2vector
                                    THEN 60 ELSE 44 END
                     END AS bits,
                     t.tgqual IS NOT NULL
                     OR t.tgattr OPERATOR(pg_catalog.<>) ''::pg_catalog.int2vector AS conditional) AS x
        CROSS JOIN LATERAL (
              SELECT pg_catalog.convert_from(
                         pg_catalog.substring(t.tgargs,
                                              z.prev OPERATOR(pg_catalog.+) 2,
                                              z.pos OPERATOR(pg_catalog.-) z.prev OPERATOR(pg_catalog.-) 1),
                         pg_catalog.getdatabaseencoding()) AS args
                FROM (SELECT i AS pos,
                             pg_catalog.lag(i, 1, -1) OVER (ORDER BY i) AS prev
                        FROM pg_catalog.generate_series(0, pg_catalog.length(t.tgargs) OPERATOR(pg_catalog.-) 1) AS i
                       WHERE pg_catalog.get_byte(t.tgargs, i) OPERATOR(pg_catalog.=) 0) AS z
               UNION ALL
              SELECT NULL WHERE t.tgnargs OPERATOR(pg_catalog.=) 0) AS a
        WHERE t.tgrelid OPERATOR(pg_catalog.=) c.oid
          AND t.tgfoid OPERATOR(pg_catalog.=) '@extschema@.idem_require_reservation()'::pg_catalog.regprocedure
          AND t.tgenabled OPERATOR(pg_catalog.=) ANY ('{O,A}'::pg_catalog."char"[])
       HAVING pg_catalog.count(*) OPERATOR(pg_catalog.>) 0) AS g ON true
 WHERE c.relkind OPERATOR(pg_catalog.=) ANY ('{r,p,f}'::pg_catalog."char"[])
   AND n.nspname OPERATOR(pg_catalog.<>) ALL ('{pg_catalog,information_schema,pg_toast,idempotency}'::pg_catalog.name[])
   AND NOT pg_catalog.starts_with(n.nspname::pg_catalog.text, 'pg_temp_')
   AND NOT pg_catalog.starts_with(n.nspname::pg_catalog.text, 'pg_toast_temp_')
   AND NOT EXISTS (SELECT FROM pg_catalog.pg_depend d
                    WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
                      AND d.objid OPERATOR(pg_catalog.=) c.oid
                      AND d.deptype OPERATOR(pg_catalog.=) 'e');

COMMENT ON VIEW idempotency.guard_coverage IS
'every table of the database (outside system schemas and extensions) and the coverage guards that protect it';

REVOKE ALL ON idempotency.guard_coverage FROM PUBLIC;
GRANT SELECT ON idempotency.guard_coverage TO idempotency_admin, pg_monitor;
