# ALTER EXTENSION idempotency UPDATE while requests come in.  The update
# waits for a transaction holding a reservation; a request from a new
# connection arriving meanwhile reads its scope's policy (idempotency.scopes)
# and then the key (idempotency.keys).  It must queue behind the update, and
# the update must go through once the reservation commits: taking the
# tables in the order of its statements (keys first, scopes later) made it
# deadlock with such a request (40P01) and roll back.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest qw(new_idem_node run_in without_job_warning);

my $node = new_idem_node('upgrade_traffic');
$node->safe_psql('postgres', 'CREATE DATABASE u');
$node->safe_psql('u', "CREATE EXTENSION idempotency VERSION '1.0'");
$node->safe_psql('u',
	q{SELECT idem_configure_scope('pay', '{"ttl": "1 day"}')});

# In a new session of database $db, run $sql (after the psql commands in
# $pre), and return the session once the statement waits for a lock (its
# text matching the LIKE pattern $like).
sub start_waiting
{
	my ($db, $pre, $sql, $like, $what) = @_;
	my $s = $node->background_psql($db, on_error_stop => 0);
	$s->query_until(qr/statement started/,
		"$pre\\echo statement started\n$sql\n");
	$node->poll_query_until($db,
		qq{SELECT count(*) = 1 FROM pg_stat_activity
		    WHERE wait_event_type = 'Lock' AND query LIKE '$like'})
	  or die "$what did not wait";
	return $s;
}

# a request holding its reservation
my $s1 = $node->background_psql('u');
$s1->query_safe('BEGIN');
is($s1->query_safe(q{SELECT outcome FROM idem_reserve('t', 'pay', 'x1', '{}'::jsonb)}),
	'created', 'a request holds its reservation');

# the update waits for it
my $upd = start_waiting('u', '', 'ALTER EXTENSION idempotency UPDATE;',
	'ALTER EXTENSION%', 'the update');

# a request on a new connection queues behind the update
my $s2 = start_waiting('u', '',
	q{SELECT outcome FROM idem_reserve('t', 'pay', 'x2', '{}'::jsonb);},
	q{%''x2''%}, 'the new request');

# the reservation commits: the update runs, then the new request
$s1->query_safe(q{SELECT idem_complete('t', 'pay', 'x1', 201, '{"id": 1}')});
$s1->query_safe('COMMIT');
my ($uout, $uerr) = run_in($upd, 'SELECT 1');
is(without_job_warning($uerr), '', 'the update went through (no deadlock)');
my ($rout, $rerr) = run_in($s2, 'SELECT 1');
like($rout, qr/^created/, 'the request that queued behind it was answered');
is($rerr, '', 'and raised nothing');
is($node->safe_psql('u',
		"SELECT extversion FROM pg_extension WHERE extname = 'idempotency'"),
	'1.1', 'the database is at 1.1');
is($node->safe_psql('u',
		q{SELECT outcome || ' ' || response_code FROM idem_reserve('t', 'pay', 'x1', '{}')}),
	'replay 201', 'the key completed while the update waited replays');

$_->quit for ($s1, $upd, $s2);

# A lookup that queues behind the update on idempotency.keys: the update
# replaces idem_lookup (its result type changes), so the call that named
# the old function fails once, with PostgreSQL's XX000, as README says,
# and answers when run again.
$node->safe_psql('postgres', 'CREATE DATABASE u2');
$node->safe_psql('u2', "CREATE EXTENSION idempotency VERSION '1.0'");
$s1 = $node->background_psql('u2');
$s1->query_safe('BEGIN');
$s1->query_safe('LOCK idempotency.keys IN ACCESS SHARE MODE');
$upd = start_waiting('u2', '', 'ALTER EXTENSION idempotency UPDATE;',
	'ALTER EXTENSION%', 'the second update');
my $s3 = start_waiting('u2', "\\set VERBOSITY verbose\n",
	q{SELECT status FROM idem_lookup('t', 'pay', 'x1');},
	'%idem_lookup%', 'the lookup');
$s1->query_safe('COMMIT');
($uout, $uerr) = run_in($upd, 'SELECT 1');
is(without_job_warning($uerr), '', 'the second update went through');
my ($lout, $lerr) = run_in($s3, 'SELECT 1');
like($lerr, qr/XX000: cache lookup failed for function/,
	'a lookup that queued behind the update fails once with XX000');
($lout, $lerr) = run_in($s3, q{SELECT count(*) FROM idem_lookup('t', 'pay', 'x1')});
is("$lout|$lerr", '0|', 'and answers when run again');
$_->quit for ($s1, $upd, $s3);
$node->stop;
done_testing();
