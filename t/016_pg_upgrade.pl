# README, "Logical replication, pg_upgrade, renames and dropped roles":
# pg_upgrade of a cluster using the extension.  Keys (finished and held by
# a committed reservation), the outbox with a lease in flight and its
# sequence, scopes, tenant bindings and sweep_state carry over and keep
# working; the counters of idempotency.stats start from zero.
#
# The old cluster runs the binaries of IDEM_UPGRADE_FROM (the installation
# prefix of an older PostgreSQL with the same extension version installed;
# make test PG=18 passes PostgreSQL 17's when it is built), else the
# binaries under test: pg_upgrade between two clusters of one version still
# moves every object of the extension through its binary-upgrade dump.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Cwd;

my $from = $ENV{IDEM_UPGRADE_FROM} // '';
my $old = PostgreSQL::Test::Cluster->new('old',
	$from ne '' ? (install_path => $from) : ());
my $new = PostgreSQL::Test::Cluster->new('new');
note('upgrading from ' . ($from ne '' ? $from : 'the same binaries')
	  . ', PostgreSQL ' . $old->pg_version . ' to ' . $new->pg_version);

# pg_upgrade wants both clusters with or without checksums alike (18's
# initdb turns them on by default, earlier ones do not)
for my $node ($old, $new)
{
	$node->init(extra => ['--data-checksums']);
	my $conf = "shared_preload_libraries = 'idempotency'\n";
	if ($ENV{IDEM_DESTDIR} && $node == $new)
	{
		# a private installation (see scripts/lib.sh)
		my $libdir = `pg_config --pkglibdir`;
		chomp $libdir;
		$conf .= "extension_destdir = '$ENV{IDEM_DESTDIR}'\n"
		  . "dynamic_library_path = '$ENV{IDEM_DESTDIR}$libdir:\$libdir'\n";
	}
	$node->append_conf('postgresql.conf', $conf);
}

$old->start;
$old->safe_psql('postgres', 'CREATE DATABASE shop');
$old->safe_psql('shop', q{
	CREATE EXTENSION idempotency;
	CREATE ROLE upgrade_app LOGIN;
	GRANT idempotency_app TO upgrade_app;
	SELECT idem_bind_tenant('upgrade_app', 'acme');
	SELECT idem_configure_scope('orders', '{"ttl": "7 days"}');
	UPDATE idempotency.sweep_state SET pages_per_run = 4242;
	BEGIN;
	SELECT outcome FROM idem_reserve('acme', 'orders', 'k-done', '{"amount": 1}');
	SELECT idem_complete('acme', 'orders', 'k-done', 201, '{"order": 1}',
	                     '{"Location": "/orders/1"}');
	COMMIT;
	SELECT outbox_enqueue('acme', 'payments', jsonb_build_object('n', n),
	                      key => 'k-done', scope => 'orders')
	  FROM generate_series(1, 3) n;
});
my $token = $old->safe_psql('shop', q{
	SELECT lock_token FROM idem_reserve('acme', 'orders', 'k-held', '{"amount": 2}')});
like($token, qr/^[0-9a-f-]{36}$/, 'a two-phase reservation committed before the upgrade');
my ($claimed, $lease) = split /\|/, $old->safe_psql('shop', q{
	SELECT id, lease_token FROM outbox_claim('w1', 1, lease => '1 hour')});
my $last_id = $old->safe_psql('shop', 'SELECT max(id) FROM idempotency.outbox');
isnt($old->safe_psql('shop',
		"SELECT created FROM idempotency.stats WHERE tenant = 'acme' AND scope = 'orders'"),
	'', 'the old cluster counted its requests');
$old->stop;

my $newbin = $new->config_data('--bindir');
my $oldbin = $old->config_data('--bindir');
my $cwd = getcwd();
# pg_upgrade writes its logs in the new data directory and wants a
# writable current directory
chdir $PostgreSQL::Test::Utils::tmp_check;
command_ok(
	[
		"$newbin/pg_upgrade", '--no-sync',
		'-d', $old->data_dir, '-D', $new->data_dir,
		'-b', $oldbin, '-B', $newbin,
		'-s', $new->host, '-p', $old->port, '-P', $new->port,
	],
	'pg_upgrade');
chdir $cwd;
$new->start;

is($new->safe_psql('shop', 'SELECT count(*) FROM idempotency.stats'),
	'0', 'the counters start from zero');
is($new->safe_psql('shop',
		"SELECT extversion FROM pg_extension WHERE extname = 'idempotency'"),
	'1.1', 'the extension is there, same version');
is($new->safe_psql('shop', q{
	SELECT outcome, http_status, response_body, response_headers
	  FROM idem_reserve('acme', 'orders', 'k-done', '{"amount": 1}')}),
	'replay|201|{"order": 1}|{"Location": "/orders/1"}',
	'a finished key replays its response');
is($new->safe_psql('shop', q{
	SELECT outcome FROM idem_reserve('acme', 'orders', 'k-done', '{"amount": 9}')}),
	'mismatch', 'its fingerprint is compared');
is($new->safe_psql('shop', q{
	SELECT outcome FROM idem_reserve('acme', 'orders', 'k-held', '{"amount": 2}')}),
	'in_progress', 'the committed reservation still holds its key');
is($new->safe_psql('shop',
		"SELECT idem_complete('acme', 'orders', 'k-held', 200, '{}', lock_token => '$token')"),
	'succeeded', 'and its holder completes it with its token');
is($new->safe_psql('shop', q{
	SELECT expires_at - now() BETWEEN interval '6 days 23 hours' AND interval '7 days 1 hour'
	  FROM idem_reserve('acme', 'orders', 'k-new', '{}')}),
	't', "the scope's ttl applies to a new key");
my ($out, $err);
$new->psql('shop', q{SELECT outcome FROM idem_reserve('globex', 'orders', 'k-1', '{}')},
	stdout => \$out, stderr => \$err,
	connstr => $new->connstr('shop') . ' user=upgrade_app');
like($err, qr/bound to tenant "acme"/, "the role's tenant binding holds");
is($new->safe_psql('shop', q{
	SELECT outcome FROM idem_reserve('acme', 'orders', 'k-app', '{}')},
	connstr => $new->connstr('shop') . ' user=upgrade_app'),
	'created', 'and its own tenant works');
is($new->safe_psql('shop', 'SELECT pages_per_run FROM idempotency.sweep_state'),
	'4242', 'sweep_state carries over');

# the lease in flight: its token acknowledges; the other two are claimed
$new->safe_psql('shop', "SELECT outbox_ack('acme', $claimed, '$lease')");
is($new->safe_psql('shop', "SELECT status FROM idempotency.outbox WHERE id = $claimed"),
	'done', 'the lease taken before the upgrade acknowledges');
is($new->safe_psql('shop', "SELECT count(*) FROM outbox_claim('w2', 10)"),
	'2', 'the pending messages are claimed');
my $next = $new->safe_psql('shop',
	"SELECT outbox_enqueue('acme', 'payments', '{\"n\": 4}')");
cmp_ok($next, '>', $last_id, 'the outbox sequence continues past the old ids');

is($new->safe_psql('shop',
		"SELECT created FROM idempotency.stats WHERE tenant = 'acme' AND scope = 'orders'"),
	'2', 'and count again');
is($new->safe_psql('shop', 'CALL idem_maintain()') // '', '', 'maintenance runs');
$new->stop;
done_testing();
