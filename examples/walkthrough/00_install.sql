\echo '== CREATE EXTENSION idempotency has made the schema, tables and GUCs:'
\dn idempotency
\dt idempotency.*
SELECT name, setting, unit FROM pg_settings WHERE name LIKE 'idempotency.%' ORDER BY name;
