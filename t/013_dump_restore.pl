# pg_dump + pg_restore into a new database keeps what a retry depends on:
# scope policies (fingerprint_ignore among them), live keys (finished and in
# flight), tenant bindings and undelivered outbox rows, and the sweeper's
# budget an operator set.  A retry within the ttl replays after the restore
# instead of running again.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest qw(new_idem_node);

my $node = new_idem_node('dump');
$node->safe_psql('postgres', 'CREATE DATABASE shop');
$node->safe_psql('shop', 'CREATE EXTENSION idempotency');
$node->safe_psql('shop', q{
CREATE ROLE dump_bound;
SELECT idem_configure_scope('pay', '{"ttl": "2 days", "fingerprint_ignore": ["/trace"], "stale_action": "takeover"}');
SELECT idem_bind_tenant('dump_bound', 'acme');
UPDATE idempotency.sweep_state SET pages_per_run = 65536;
BEGIN;
SELECT outcome FROM idem_reserve('acme', 'pay', 'k1', '{"amount": 10, "trace": "a"}');
SELECT outbox_enqueue('acme', 'charge.capture', '{"amount": 10}', 'k1', 'pay');
SELECT idem_complete('acme', 'pay', 'k1', 201, '{"charge": "ch_1"}', '{"Location": "/c/1"}');
COMMIT;
});
my $token = $node->safe_psql('shop',
	q{SELECT lock_token FROM idem_reserve('acme', 'pay', 'k2', '{"amount": 20}')});
# what a DBA adds to the extension's tables is not dumped (README)
$node->safe_psql('shop', q{
CREATE INDEX my_keys_created_idx ON idempotency.keys (created_at);
ALTER TABLE idempotency.outbox SET (fillfactor = 50);
});

my $dump = $node->basedir . '/shop.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr('shop') ],
	'pg_dump of the database');
$node->safe_psql('postgres', 'CREATE DATABASE restored');
$node->command_ok(
	[ 'pg_restore', '--exit-on-error', '-d', $node->connstr('restored'), $dump ],
	'pg_restore into a new database');

is($node->safe_psql('restored',
		q{SELECT scope || ' ' || ttl || ' ' || stale_action || ' ' || fingerprint_ignore::text FROM idempotency.scopes}),
	'pay 2 days takeover {/trace}', 'scope policies survive');
is($node->safe_psql('restored',
		q{SELECT role::text || ' ' || tenant FROM idempotency.tenant_bindings}),
	'dump_bound acme', 'tenant bindings survive');
is($node->safe_psql('restored',
		q{SELECT count(*) || ' ' || max(pages_per_run) FROM idempotency.sweep_state}),
	'1 65536', 'the sweep budget survives, still in one row');
# the retry differs only in an ignored member: it must replay, with the
# fingerprint computed under the restored fingerprint_ignore
is($node->safe_psql('restored', q{
SELECT outcome || ' ' || response_code || ' ' || response_body::text || ' ' || response_headers::text
  FROM idem_reserve('acme', 'pay', 'k1', '{"amount": 10, "trace": "retry"}')}),
	'replay 201 {"charge": "ch_1"} {"Location": "/c/1"}',
	'a retry within the ttl replays after the restore');
is($node->safe_psql('restored',
		q{SELECT outcome FROM idem_reserve('acme', 'pay', 'k2', '{"amount": 20}')}),
	'in_progress', 'a reservation in flight is still held');
is($node->safe_psql('restored',
		qq{SELECT idem_complete('acme', 'pay', 'k2', 200, '{}', lock_token => '$token')}),
	'succeeded', 'and its attempt completes it with its lock token');
is($node->safe_psql('restored', q{
SELECT count(*) FROM (SELECT outbox_ack(c.tenant_id, c.id, c.lease_token)
                        FROM outbox_claim('w', 10) c) a}),
	'1', 'the undelivered outbox row is delivered from the restored database');
is($node->safe_psql('restored',
		q{SELECT outbox_enqueue('acme', 'x', '{}') > max(id) FROM idempotency.outbox WHERE topic <> 'x'}),
	't', 'outbox ids continue after the restored ones');
is($node->safe_psql('restored', q{
SELECT (SELECT count(*) FROM pg_catalog.pg_indexes
         WHERE schemaname = 'idempotency' AND indexname = 'my_keys_created_idx')
       || ' ' || (SELECT reloptions::text FROM pg_catalog.pg_class
                   WHERE oid = 'idempotency.outbox'::regclass)}),
	'0 {fillfactor=80,autovacuum_vacuum_scale_factor=0.02,autovacuum_analyze_scale_factor=0.05}',
	"an index of the DBA's on an extension table, and changed storage settings, are not in the dump");

$node->stop;
done_testing();
