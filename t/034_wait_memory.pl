# idem_reserve(..., wait => ...) waiting for a committed reservation looks
# at the key's row some ten times a second, for as long as "wait" allows (up
# to a day).  Each look's memory is freed before the next: the waiting
# backend's memory stays flat.  (Each look kept about 550 bytes until the
# call returned: some 5 KB a second, 480 MB over a day's wait.)
#
# The waiting backend's memory contexts are logged twice, three seconds
# apart (pg_log_backend_memory_contexts), and their grand totals compared.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);
use IdemTest qw(new_idem_node);

my $node = new_idem_node('wait_memory');

# a committed reservation, never completed: a retry waits for it
is( $node->safe_psql('postgres',
		q{SELECT outcome FROM idem_reserve('acme', 'orders', 'held', '{}')}),
	'created', 'a reservation committed and left at work');

my $waiter = $node->background_psql('postgres');
my $pid = $waiter->query_safe('SELECT pg_backend_pid()');
$waiter->query_until(qr/waiting/, q{
\echo waiting
SELECT outcome FROM idem_reserve('acme', 'orders', 'held', '{}', wait => '8 seconds');
});
ok( $node->poll_query_until('postgres',
		"SELECT state = 'active' AND wait_event IS NOT NULL FROM pg_stat_activity WHERE pid = $pid"),
	'the retry waits');

# the grand total of the n-th dump of backend $pid's memory in the log
sub grand_total
{
	my ($offset) = @_;
	my $log = slurp_file($node->logfile, $offset);
	my ($total) = $log =~ /\[$pid\][^\n]*Grand total: \d+ bytes in \d+ blocks; \d+ free \(\d+ chunks\); (\d+) used/;
	return $total;
}

# dump the backend's memory now; the grand total the dump logs
sub dump_total
{
	my $offset = -s $node->logfile;
	$node->safe_psql('postgres', "SELECT pg_log_backend_memory_contexts($pid)");
	for (1 .. 100)
	{
		my $total = grand_total($offset);
		return $total if defined $total;
		sleep(0.1);
	}
	return undef;
}

sleep(1);
my $first = dump_total();
ok(defined $first, 'first dump of its memory');
sleep(3);
my $second = dump_total();
ok(defined $second, 'second dump of its memory');
note("memory of the waiting backend: $first bytes used, 3 s later $second");
cmp_ok($second - $first, '<', 4096,
	'the waiting backend does not grow (some 30 looks meanwhile)');

$waiter->query_safe('SELECT 1');
$waiter->quit;
$node->stop;
done_testing();
