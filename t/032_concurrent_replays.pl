# Retries of a finished request that arrive together: every one of them
# gets the stored answer.  A retry that met another retry holding the key's
# lock for an instant (while being answered) used to be told in_progress
# (409), as if the request were still running.  The same for a retry with
# a different body: always mismatch (422).
use strict;
use warnings;
use File::Temp qw(tempdir);
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest qw(new_idem_node);

my $node = new_idem_node('concurrent_replays');
my $dir = tempdir(CLEANUP => 1);

$node->safe_psql('postgres', q{
BEGIN;
SELECT outcome FROM idem_reserve('acme', 'POST /v1/charges', 'k-1', '{"amount": 4500}');
SELECT idem_complete('acme', 'POST /v1/charges', 'k-1', 201, '{"charge": "ch_1"}');
COMMIT;
-- each answer is recorded
CREATE UNLOGGED TABLE answers (outcome text, code int);
});

# $body: the request each retry sends
sub script
{
	my ($name, $body) = @_;
	my $file = "$dir/$name.sql";
	open(my $fh, '>', $file) or die;
	print $fh "INSERT INTO answers SELECT outcome::text, http_status "
	  . "FROM idem_reserve('acme', 'POST /v1/charges', 'k-1', '$body');\n";
	close $fh;
	return $file;
}

my @conn = ('-h', $node->host, '-p', $node->port, 'postgres');
my $same = IPC::Run::start(
	[ 'pgbench', '-n', '-c', '6', '-j', '2', '-t', '500',
	  '-f', script('same', '{"amount": 4500}'), @conn ],
	'>', "$dir/same.out", '2>&1');
my $other = IPC::Run::start(
	[ 'pgbench', '-n', '-c', '2', '-j', '1', '-t', '500',
	  '-f', script('other', '{"amount": 9900}'), @conn ],
	'>', "$dir/other.out", '2>&1');
ok($same->finish, '6 connections retried the request 3,000 times')
  or diag(slurp_file("$dir/same.out"));
ok($other->finish, '2 connections retried it 1,000 times with another body')
  or diag(slurp_file("$dir/other.out"));

is($node->safe_psql('postgres',
		"SELECT string_agg(outcome || ' ' || code || ': ' || n, ', ' ORDER BY outcome)
		   FROM (SELECT outcome, code, count(*) AS n FROM answers GROUP BY 1, 2) a"),
	'mismatch 422: 1000, replay 201: 3000',
	'every retry got the stored answer, or mismatch for the other body; none in_progress');

$node->stop;
done_testing();
