# make demo's walkthrough (examples/walkthrough/*.sql) runs as written, in
# order, in a database "demo" as scripts/demo-cluster.sh sets it up, and
# acts with no more privilege than it says: after the set-up (00), the key
# and outbox files run as a login role that has no privilege of its own
# (NOINHERIT) and only SET ROLE to the application, worker and operator
# roles, so a statement that needs more than the role it runs as fails.
# The maintenance file, which schedules through pg_cron in database
# "postgres" as its superuser, runs as the demo runs it, when pg_cron is
# installed.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest qw(new_idem_node have_pg_cron);

my $dir = 'examples/walkthrough';
my @files = sort glob("$dir/*.sql");
is_deeply([ map { s{.*/}{}r } @files ],
	[qw(00_install.sql 10_fingerprint.sql 20_keys.sql 30_outbox.sql 40_maintenance.sql)],
	'the walkthrough files');

my $node = new_idem_node('walk');
$node->safe_psql('postgres', 'CREATE EXTENSION pg_cron') if have_pg_cron();
$node->safe_psql('postgres', 'CREATE DATABASE demo');
$node->safe_psql('demo', 'CREATE EXTENSION idempotency');

# run_file(file, user): psql -e with ON_ERROR_STOP, as the demo runs it
sub run_file
{
	my ($file, $user) = @_;
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run(
		[
			'psql', '-X', '-e', '-v', 'ON_ERROR_STOP=1',
			'-d', $node->connstr('demo') . " user=$user", '-f', $file
		],
		'>', \$out, '2>', \$err);
	ok($ok, "$file runs without an error as $user") or diag($err);
	return ($out, $err);
}

my ($out, $err) = run_file("$dir/00_install.sql", 'postgres');
like($out, qr/^ shop_app\s+\| idempotency_app$/m, 'the application role is set up');
like($out, qr/^ shop_ops\s+\| idempotency_admin$/m, 'the operator role is set up');

$node->safe_psql('postgres', q{
	CREATE ROLE walker LOGIN NOINHERIT;
	GRANT shop_app, shop_worker, shop_ops TO walker;
});

($out, $err) = run_file("$dir/10_fingerprint.sql", 'walker');
like($out, qr/^ (\w{64}) \| \1$/m, 'a retry with other spelling has the same fingerprint');
like($out, qr/^ \{"amount":10,"metadata":\{"client":"ios"\}\} \| t$/m,
	'an ignored member leaves the fingerprint alone');

($out, $err) = run_file("$dir/20_keys.sql", 'walker');
like($out, qr/^outcome: created$/m, 'a new key is created');
like($out, qr/^ replay  \|\s+201 /m, 'the retry replays the stored response');
like($out, qr/^ mismatch \|\s+422$/m, 'another body is a mismatch');
like($out, qr/^ in_progress \|\s+409 \|\s+\d+$/m, 'a concurrent retry is in progress');
like($out, qr/^outcome: created, resume from: charge-requested$/m,
	'the stale reservation is taken over with its recovery point');
like($err, qr/NOTICE:  refused: lock_token/, 'the late worker is fenced out');
is($node->safe_psql('demo',
		q{SELECT status FROM idempotency.keys WHERE idem_key = 'pay-2001'}),
	'succeeded', 'the new holder completed the two-phase request');

($out, $err) = run_file("$dir/30_outbox.sql", 'walker');
like($out, qr/^our row: t, topic payment\.capture/m, 'the worker claims the row');
like($out, qr/^ payments:order-1001$/m, 'with the key to send downstream');
like($err, qr/permission denied for table outbox/,
	'the worker cannot read the outbox table');
like($out, qr/^ done   \| ch_3PzX\s+\| t$/m, 'the ack delivers the row');
like($err, qr/ERROR:  outbox row is already done/, 'a repeated ack is refused');
like($out, qr/^ email\.receipt \| receipt-1001 \|\s+2 \|\s+2 \| SMTP 550/m,
	'the second failure makes a dead letter');
like($out, qr/^ email\.receipt\s+\| done\s+\|\s+0 \| msg-77$/m,
	'the requeued row is delivered');

SKIP:
{
	skip 'pg_cron is not installed for this server', 4 unless have_pg_cron();
	($out, $err) = run_file("$dir/40_maintenance.sql", 'postgres');
	like($out, qr/^ stale\s+\|\s+409$/m, 'a swept reservation is answered stale');
	like($err, qr/HINT: .*database "postgres"/, 'scheduling names the pg_cron database');
	like($out, qr/^ idempotency-maintenance-demo \| \* \* \* \* \* /m,
		'maintenance is scheduled in the pg_cron database');
}

$node->stop;
done_testing();
