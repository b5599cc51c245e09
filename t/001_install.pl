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
$node->stop;
done_testing();
