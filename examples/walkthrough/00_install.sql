-- Set-up, as the database owner: the extension, and one role per job.
\echo '== CREATE EXTENSION idempotency has made the schema, tables and GUCs:'
\dn idempotency
\dt idempotency.*
SELECT name, setting, unit FROM pg_settings WHERE name LIKE 'idempotency.%' ORDER BY name;

\echo '== Three roles carry the privileges.  The rest of the walkthrough acts as an'
\echo '== application (shop_app), a delivery worker (shop_worker) and an operator'
\echo '== (shop_ops), each granted one of them, switching with SET ROLE:'
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'shop_app') THEN
        CREATE ROLE shop_app NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'shop_worker') THEN
        CREATE ROLE shop_worker NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'shop_ops') THEN
        CREATE ROLE shop_ops NOLOGIN;
    END IF;
END
$$;
GRANT idempotency_app TO shop_app;
GRANT idempotency_worker TO shop_worker;
GRANT idempotency_admin TO shop_ops;
SELECT r.rolname AS role, m.rolname AS member_of
  FROM pg_catalog.pg_auth_members a
  JOIN pg_catalog.pg_roles r ON r.oid = a.member
  JOIN pg_catalog.pg_roles m ON m.oid = a.roleid
 WHERE r.rolname LIKE 'shop\_%' ORDER BY 1;

\echo '== The application owns its business tables; the extension needs nothing more.'
CREATE TABLE IF NOT EXISTS outbox_demo_orders (id bigint PRIMARY KEY, amount int);
GRANT INSERT, SELECT ON outbox_demo_orders TO shop_app;
