# Upgrade path: a database on the released 1.0 script, with finished and
# in-flight keys, scope policies and outbox rows, is updated with ALTER
# EXTENSION idempotency UPDATE.  Afterwards (a) every object of the
# extension (functions and their signatures, options and privileges, types,
# tables, columns, indexes, constraints, triggers, views, roles' grants,
# pg_dump registrations) is what a fresh install of the current version
# creates, and (b) the old data keeps working: finished keys replay,
# in-flight two-phase keys complete with their lock token, outbox rows are
# claimed and delivered; (c) grants an administrator made on 1.0's objects
# stay the database's own: pg_dump keeps them, as it keeps those made after
# a fresh install (PostgreSQL records a whole ACL that an extension script
# changes as the extension's initial privileges, which pg_dump leaves out).
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest qw(new_idem_node catalog_snapshot);

my $node = new_idem_node('upgrade');
my $current = $node->safe_psql('postgres',
	"SELECT default_version FROM pg_available_extensions WHERE name = 'idempotency'");
isnt($current, '1.0', "the current version ($current) is newer than 1.0");

# an operator's grants, made on both databases after their install, also
# to PUBLIC, pg_monitor and the extension's roles on objects the update
# keeps (the admin's INSERT on scopes shares an entry with the SELECT the
# update grants); on
# 1.0 also grants on objects the update drops and creates again (a
# signature that changes, a view it rebuilds) and on idem_maintain, which
# in 1.1 needs more of its caller: the fresh database gets what the update
# must carry them over to
my $grants = q{
GRANT SELECT ON idempotency.dead_letters TO reader;
GRANT SELECT (processing, outbox_dead) ON idempotency.health TO reader;
GRANT EXECUTE ON FUNCTION idem_reap(int), idem_sweep(interval), idem_reclaim_leases(), idem_purge_outbox(int) TO ops;
GRANT SELECT ON idempotency.keys TO ops;
GRANT SELECT ON idempotency.health TO ops WITH GRANT OPTION;
GRANT EXECUTE ON PROCEDURE idem_maintain(interval, int, interval) TO ops;
GRANT SELECT ON idempotency.outbox TO PUBLIC;
GRANT SELECT ON idempotency.scopes TO pg_monitor;
GRANT EXECUTE ON FUNCTION idem_reap(int) TO idempotency_app;
GRANT INSERT ON idempotency.scopes TO idempotency_admin;
};
my $grants_10 = $grants . q{
GRANT EXECUTE ON FUNCTION idem_reserve(text, text, text, jsonb, interval, interval),
                          idem_complete(text, text, text, int, jsonb, jsonb, uuid),
                          idem_lookup(text, text, text) TO app1;
};
my $grants_11 = $grants . q{
GRANT USAGE ON SCHEMA idempotency TO reader;
GRANT EXECUTE ON FUNCTION idem_reserve, idem_complete, idem_lookup TO app1;
GRANT USAGE ON SCHEMA idempotency TO ops;
GRANT EXECUTE ON PROCEDURE idempotency.maintain(interval, int, interval) TO ops;
GRANT EXECUTE ON FUNCTION idempotency.reap(int), idempotency.sweep(interval),
                          idempotency.reclaim_leases(), idempotency.purge_outbox(int) TO ops;
};
$node->safe_psql('postgres', 'CREATE ROLE ops LOGIN');
$node->safe_psql('postgres', 'CREATE ROLE app1 LOGIN');
$node->safe_psql('postgres', 'CREATE ROLE reader LOGIN');
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', 'CREATE EXTENSION idempotency');
$node->safe_psql('fresh', $grants_11);
$node->safe_psql('postgres', 'CREATE DATABASE old');
$node->safe_psql('old', "CREATE EXTENSION idempotency VERSION '1.0'");
$node->safe_psql('old', $grants_10);
is($node->safe_psql('old', 'CALL idem_maintain()', connstr => $node->connstr('old') . ' user=ops') // '',
	'', 'on 1.0 the operator runs idem_maintain');
is($node->safe_psql('old',
		"SELECT extversion FROM pg_extension WHERE extname = 'idempotency'"),
	'1.0', 'the released 1.0 script installs');

# data written through the 1.0 API
$node->safe_psql('old', q{
SELECT idem_configure_scope('pay', '{"ttl": "2 days", "stale_action": "takeover", "fingerprint_ignore": ["/trace"]}');
BEGIN;
SELECT outcome FROM idem_reserve('acme', 'pay', 'done-1', '{"amount": 1, "trace": "a"}'::jsonb);
SELECT idem_complete('acme', 'pay', 'done-1', 201, '{"charge": "ch_1"}', '{"Location": "/c/1"}');
SELECT outbox_enqueue('acme', 'charge.created', '{"charge": "ch_1"}', 'done-1', 'pay');
COMMIT;
SELECT outbox_enqueue('acme', 'mail', '{"to": "x"}');
});
my $token = $node->safe_psql('old',
	q{SELECT lock_token FROM idem_reserve('acme', 'pay', 'flight-1', '{"amount": 2}'::jsonb)});
like($token, qr/^[0-9a-f-]{36}$/, 'a two-phase reservation in flight under 1.0');
# the 1.1 library probes 1.0's primary key, whose columns are in another
# order (tenant_id, scope, idem_key), until the update
is($node->safe_psql('old', q{
SELECT outcome || ' ' || response_code
  FROM idem_reserve('acme', 'pay', 'done-1', '{"amount": 1, "trace": "c"}'::jsonb)
UNION ALL
SELECT outcome::text FROM idem_reserve('acme', 'pay', 'flight-1', '{"amount": 2}'::jsonb)}),
	"replay 201\nin_progress", 'the new library reads keys through 1.0\'s primary key');
# the 1.1 library serves 1.0's stats view (11 columns) until the update
is($node->safe_psql('old',
		"SELECT created || ' ' || completed FROM idempotency.stats WHERE tenant = 'acme'"),
	'2 1', 'the 1.0 stats view works with the new library');

# the 1.1 library claims from 1.0's outbox (no ordering_key column, no
# new_lease_token()) in both forms of a claim, and acks; the rows are
# queued again for the checks after the update
is($node->safe_psql('old', q{
SELECT count(*) || ' ' || count(DISTINCT c.lease_token) || ' '
       || bool_and(c.lease_token::text ~ '^[0-9a-f]{8}-[0-9a-f]{4}-4')
  FROM (SELECT * FROM outbox_claim('w0', 1)
        UNION ALL
        SELECT * FROM outbox_claim('w0', 5)) c}),
	'2 2 true', 'the 1.0 outbox is claimed by the new library, one row and a batch');
is($node->safe_psql('old', q{
SELECT count(outbox_nack(tenant_id, id, lease_token, 'redeliver', '0 seconds'))
  FROM idempotency.outbox WHERE status = 'leased'}),
	'2', 'and its leases are fenced by their tokens');
$node->safe_psql('old', q{UPDATE idempotency.outbox SET attempts = 0});

# maintenance works in the 1.0 database before the update: the sweep reads
# the whole table (no sweep_state yet) and idem_maintain runs; no job is
# scheduled before the update (it would call 1.0's procedure through the
# schema the functions are in, which the database owner may control;
# idempotency.maintain comes with the update)
is($node->safe_psql('old', 'SELECT idem_sweep() >= 0'),
	't', 'idem_sweep() works on the 1.0 catalog');
$node->safe_psql('old', q{CALL idem_maintain('1 second', 10, '0')});
my ($sret, $sout, $serr) =
  $node->psql('old', 'SELECT idem_schedule_maintenance()');
like($serr, qr/the idempotency extension in this database is at version 1\.0/,
	'scheduling before the update is refused');

my ($uret, $uout, $update_notices) =
  $node->psql('old', 'ALTER EXTENSION idempotency UPDATE');
is($uret, 0, 'the update runs') or diag($update_notices);
($sret, $sout, $serr) =
  $node->psql('old', 'SELECT idem_schedule_maintenance()');
like($serr, qr/'CALL idempotency\.maintain\(/,
	'scheduled after the update, the job calls idempotency.maintain');
is($node->safe_psql('old',
		"SELECT extversion FROM pg_extension WHERE extname = 'idempotency'"),
	$current, "updated to $current");

# (a) the catalog equals a fresh install's
my $fresh = catalog_snapshot($node, 'fresh');
my $updated = catalog_snapshot($node, 'old');
ok(length($fresh) > 1000, 'the catalog snapshot lists the extension objects');
is($updated, $fresh, 'an updated database has the objects of a fresh install');

# (b) the grants on objects the update replaced were carried over, and the
# operator still runs maintenance, the application still reserves
is($node->safe_psql('old', 'CALL idem_maintain()', connstr => $node->connstr('old') . ' user=ops') // '',
	'', 'after the update the operator still runs idem_maintain');
is($node->safe_psql('old', q{SELECT outcome FROM idem_reserve('acme', 'pay', 'app1-1', '{"amount": 3}')},
		connstr => $node->connstr('old') . ' user=app1'),
	'created', 'and the application role its grant on idem_reserve');
is($node->safe_psql('old', q{SELECT processing >= 0 AND outbox_dead >= 0 FROM idempotency.health},
		connstr => $node->connstr('old') . ' user=reader')
	  . ' ' . $node->safe_psql('old', q{SELECT count(*) >= 0 FROM idempotency.dead_letters},
		connstr => $node->connstr('old') . ' user=reader'),
	't t', 'a role granted the views (and columns of one) still reads them');

# (b) the old data works with the new version
is($node->safe_psql('old', q{
SELECT outcome || ' ' || response_code || ' ' || response_body::text
  FROM idem_reserve('acme', 'pay', 'done-1', '{"trace": "b", "amount": 1}')}),
	'replay 201 {"charge": "ch_1"}', 'a key finished under 1.0 replays');
is($node->safe_psql('old', q{
SELECT outcome FROM idem_reserve('acme', 'pay', 'flight-1', '{"amount": 2}')}),
	'in_progress', 'a reservation in flight under 1.0 is still held');
is($node->safe_psql('old', qq{
SELECT idem_complete('acme', 'pay', 'flight-1', 200, '{"ok": true}', lock_token => '$token')}),
	'succeeded', 'and completes with its lock token');
$node->safe_psql('old', q{
SELECT outbox_ack(c.tenant_id, c.id, c.lease_token) FROM outbox_claim('w1', 10) c});
is($node->safe_psql('old',
		q{SELECT count(*) FROM idempotency.outbox WHERE status = 'done'}),
	'2', 'outbox rows written under 1.0 are claimed and delivered');

# (c) the operator's grants survive a dump and restore of the updated
# database, as of the fresh one
for my $db ('old', 'fresh')
{
	my $dump = $node->basedir . "/$db.dump";
	$node->command_ok(
		[ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr($db) ],
		"pg_dump of $db");
	$node->safe_psql('postgres', "CREATE DATABASE ${db}_restored");
	$node->command_ok(
		[ 'pg_restore', '-d', $node->connstr("${db}_restored"), $dump ],
		"pg_restore of $db");
	is($node->safe_psql("${db}_restored", q{
SELECT has_function_privilege('ops', 'idem_reap(int)', 'EXECUTE') AND
       has_function_privilege('ops', 'idem_sweep(interval)', 'EXECUTE') AND
       has_table_privilege('ops', 'idempotency.keys', 'SELECT') AND
       has_table_privilege('ops', 'idempotency.health', 'SELECT WITH GRANT OPTION') AND
       has_schema_privilege('ops', 'idempotency', 'USAGE') AND
       has_schema_privilege('reader', 'idempotency', 'USAGE') AND
       has_table_privilege('reader', 'idempotency.dead_letters', 'SELECT') AND
       has_column_privilege('reader', 'idempotency.health', 'processing', 'SELECT') AND
       NOT has_column_privilege('reader', 'idempotency.health', 'expired_keys', 'SELECT') AND
       has_function_privilege('ops', 'idempotency.maintain(interval, int, interval)', 'EXECUTE') AND
       has_function_privilege('app1', 'idem_reserve(text, text, text, jsonb, interval, interval, bytea)', 'EXECUTE') AND
       has_table_privilege('public', 'idempotency.outbox', 'SELECT') AND
       has_table_privilege('pg_monitor', 'idempotency.scopes', 'SELECT') AND
       has_function_privilege('idempotency_app', 'idem_reap(int)', 'EXECUTE') AND
       has_table_privilege('idempotency_admin', 'idempotency.scopes', 'INSERT') AND
       NOT has_table_privilege('idempotency_admin', 'idempotency.scopes', 'UPDATE') AND
       NOT has_function_privilege('ops', 'idem_resolve(text, text, text, int, jsonb)', 'EXECUTE') AND
       NOT has_function_privilege('app1', 'outbox_enqueue(text, text, jsonb, text, text, jsonb, interval, int, text, text)', 'EXECUTE')}),
		't', "$db: the operator's grants are restored, and only those");
}

$node->stop;
done_testing();
