-- the extension's objects are where the contract says
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
SELECT n.nspname, c.relname, c.relkind
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'idempotency' AND c.relkind IN ('r', 'v')
 ORDER BY 2;
-- tables are not readable by PUBLIC
SELECT c.relname, has_table_privilege('public', c.oid, 'SELECT') AS public_select
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'idempotency' AND c.relkind = 'r'
 ORDER BY 1;
