# The extension installs into a preloaded cluster and survives a restart.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest qw(new_idem_node);

my $node = new_idem_node('install');
is($node->safe_psql('postgres',
		"SELECT extversion FROM pg_extension WHERE extname = 'idempotency'"),
	'1.1', 'extension created');
is($node->safe_psql('postgres', 'SHOW idempotency.default_ttl'),
	'1d', 'GUCs registered at preload');
$node->restart;
is($node->safe_psql('postgres', 'SHOW idempotency.max_request_size'),
	'1MB', 'server restarts with the library preloaded');

# Two databases install the extension at the same time, before its roles
# exist: the second one's CREATE ROLE waits for the first one's and then
# finds the name taken.  The install takes the role the other made.
$node->safe_psql('postgres', 'DROP EXTENSION idempotency');
$node->safe_psql('postgres',
	'DROP ROLE idempotency_app, idempotency_worker, idempotency_admin');
$node->safe_psql('postgres', 'CREATE DATABASE r1');
$node->safe_psql('postgres', 'CREATE DATABASE r2');
my $first = $node->background_psql('r1', on_error_stop => 0);
$first->query_safe('BEGIN; CREATE EXTENSION idempotency;');
my $second = $node->background_psql('r2', on_error_stop => 0);
$second->query_until(qr/started/, "\\echo started\nCREATE EXTENSION idempotency;\n");
ok($node->poll_query_until('postgres', q{
SELECT count(*) > 0 FROM pg_stat_activity
 WHERE datname = 'r2' AND wait_event_type = 'Lock'}),
	'the second install waits for the roles of the first');
$first->query_safe('COMMIT');
$first->quit;
$second->quit;
is($second->{stderr}, '', 'the second install raised no error');
is($node->safe_psql('r2',
		"SELECT extversion FROM pg_extension WHERE extname = 'idempotency'"),
	'1.1', 'and created the extension');
is($node->safe_psql('r2',
		"SELECT count(*) FROM pg_roles WHERE rolname LIKE 'idempotency\\_%'"),
	'3', 'one of each role');
$node->stop;
done_testing();
