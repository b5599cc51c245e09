# README's Getting Started runs as written: its SQL blocks, in order, in
# psql against a database with the extension (pg_cron in the same
# database, and a database "shop" for the block that schedules its
# maintenance).  Each block runs as the role it names (SET ROLE): the
# application's, the worker's and the administrator's login roles, so a
# block that needs more than its role has fails here.  Documentation
# that drifts from the code fails here.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest qw(new_idem_node have_pg_cron);

plan skip_all => 'pg_cron is not installed for this server' unless have_pg_cron();

my $readme = PostgreSQL::Test::Utils::slurp_file('README.md');
my ($section) = $readme =~ /^## Getting Started\n(.*?)^### From an application/ms;
ok(defined $section, 'README has a Getting Started section');
my @blocks = $section =~ /^```sql\n(.*?)^```$/msg;
cmp_ok(scalar @blocks, '>=', 12, 'its SQL blocks are found');

my $node = new_idem_node('readme',
	conf => "cron.host = '$PostgreSQL::Test::Cluster::test_pghost'\n");
$node->safe_psql('postgres', 'CREATE EXTENSION pg_cron');
$node->safe_psql('postgres', 'CREATE DATABASE shop');
$node->safe_psql('shop', 'CREATE EXTENSION idempotency');

my $script = $node->basedir . '/getting_started.sql';
PostgreSQL::Test::Utils::append_to_file($script, join("\n", @blocks));
my ($out, $err) = ('', '');
my $ok = IPC::Run::run(
	[ 'psql', '-X', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('postgres'), '-f', $script ],
	'>', \$out, '2>', \$err);
ok($ok, 'every block runs without an error') or diag($err);
# the blocks ran as the roles they name
like($out, qr/^SET$/m, 'the blocks take their roles');
is($node->safe_psql('postgres',
		q{SELECT string_agg(r.rolname || ':' || m.rolname, ',' ORDER BY r.rolname)
		    FROM pg_auth_members a JOIN pg_roles r ON r.oid = a.member
		    JOIN pg_roles m ON m.oid = a.roleid WHERE r.rolname LIKE 'my\_%'}),
	'my_app:idempotency_app,my_dba:idempotency_admin,my_worker:idempotency_worker',
	'each login role is granted one role of the extension');
like($out, qr/^ replay  \|\s+201 \|\s+201 \| \{"order_id": 1001\}/m,
	'the retry replays the stored response, as the README shows');
like($out, qr/^ dead$/m, 'the failed delivery is a dead letter');
is($node->safe_psql('postgres', q{SELECT count(*) FROM cron.job}),
	'2', 'maintenance is scheduled for both databases');
is($node->safe_psql('postgres',
		q{SELECT status FROM idempotency.keys WHERE idem_key = 'pay-2001'}),
	'succeeded', 'the two-phase request completed with its lock token');

$node->stop;
done_testing();
