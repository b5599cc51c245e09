# A worker acknowledging in a REPEATABLE READ (or SERIALIZABLE) transaction
# whose snapshot was taken before its rows were claimed (the claim came
# through another connection) sees the rows as they were before the claim.
# Its ack, nack or extend with the right token is then a serialization
# failure (40001, retry the transaction), as README says, not the fencing
# error (55006) that tells a worker its lease is lost; a token that is not
# the row's lease is still 55006.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest qw(new_idem_node run_in);

my $node = new_idem_node('outbox_rr');
$node->safe_psql('postgres',
	q{SELECT count(outbox_enqueue('rr', 'rr.topic', jsonb_build_object('n', g)))
	    FROM generate_series(1, 4) g});

for my $level ('REPEATABLE READ', 'SERIALIZABLE')
{
	my $worker = $node->background_psql('postgres', on_error_stop => 0);
	my ($out, $err) = run_in($worker,
		"\\set VERBOSITY sqlstate\nBEGIN ISOLATION LEVEL $level; SELECT 1;");
	is($err, '', "$level: the worker's snapshot is taken");

	# the claim, through another connection, after that snapshot
	my @rows = map { [ split / / ] } split /\n/, $node->safe_psql('postgres',
		q{SELECT id || ' ' || lease_token FROM outbox_claim('w', 4, '5 minutes') ORDER BY id});
	is(scalar @rows, 4, "$level: four rows claimed");

	my %calls = (
		outbox_ack => "outbox_ack('rr', $rows[0][0], '$rows[0][1]')",
		outbox_nack => "outbox_nack('rr', $rows[1][0], '$rows[1][1]', 'timeout')",
		outbox_extend => "outbox_extend('rr', $rows[2][0], '$rows[2][1]', '1 minute')");
	for my $fn (sort keys %calls)
	{
		($out, $err) = run_in($worker,
			"SAVEPOINT s; SELECT $calls{$fn}; ROLLBACK TO SAVEPOINT s;");
		like($err, qr/ERROR:  40001/,
			"$level: $fn with the row's token, claimed after the snapshot: 40001");
	}
	($out, $err) = run_in($worker,
		"SAVEPOINT s; SELECT outbox_ack('rr', $rows[3][0], gen_random_uuid()); ROLLBACK TO SAVEPOINT s;");
	like($err, qr/ERROR:  55006/,
		"$level: a token that is not the row's lease is still 55006");
	($out, $err) = run_in($worker, 'ROLLBACK;');

	# retried in a new transaction, the ack goes through
	($out, $err) = run_in($worker,
		"BEGIN ISOLATION LEVEL $level; SELECT $calls{outbox_ack}; COMMIT;");
	is($err, '', "$level: the retried transaction acknowledges the row");
	$worker->quit;
	is($node->safe_psql('postgres',
			"SELECT status FROM idempotency.outbox WHERE id = $rows[0][0]"),
		'done', "$level: the row is done");

	# the rest back to pending for the next level
	$node->safe_psql('postgres',
		q{UPDATE idempotency.outbox SET status = 'pending', lease_token = NULL,
		         available_at = now() - interval '1 minute', attempts = 0});
}

# a row claimed before the snapshot and extended by its holder's heartbeat
# after it: the ack in the snapshot's transaction is a serialization
# failure with the detail and hint of every such error of the extension
my ($id, $tok) = split / /, $node->safe_psql('postgres',
	q{SELECT id || ' ' || lease_token FROM outbox_claim('w', 1, '5 minutes')});
my $worker = $node->background_psql('postgres', on_error_stop => 0);
my ($out, $err) = run_in($worker,
	'BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1;');
$node->safe_psql('postgres',
	"SELECT outbox_extend('rr', $id, '$tok', '10 minutes')");
($out, $err) = run_in($worker, "SELECT outbox_ack('rr', $id, '$tok');");
like($err,
	qr/ERROR:  could not serialize access to outbox row $id\nDETAIL:  .+\nHINT:  Retry the whole transaction; under READ COMMITTED this does not happen\./,
	'an ack of a row extended after the snapshot: 40001 with its hint');
$worker->quit;

$node->stop;
done_testing();
