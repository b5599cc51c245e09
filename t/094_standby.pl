# What a hot standby answers.  Reads work there: a retry of a finished
# request replays, lookups and the views answer.  Every call that writes
# (a new key, a completion, an enqueue, a claim, maintenance) is refused
# with 25006 and a hint that says to send it to the primary, not with
# PostgreSQL's bare "cannot execute INSERT in a read-only transaction".
# A read-only transaction on the primary gets the same.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use PostgreSQL::Test::Cluster;
use Test::More;
use IdemTest qw(new_idem_node);

my $primary = new_idem_node('primary', init => { allows_streaming => 1 });
$primary->safe_psql('postgres', q{
BEGIN;
SELECT outcome FROM idem_reserve('acme', 'orders', 'done-1', '{"amount": 1}');
SELECT idem_complete('acme', 'orders', 'done-1', 201, '{"order": 1}');
COMMIT;
});
my $token = $primary->safe_psql('postgres',
	q{SELECT lock_token FROM idem_reserve('acme', 'orders', 'flight-1', '{"amount": 2}')});
$primary->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->start;
$primary->wait_for_catchup($standby);
is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'),
	't', 'the standby is in recovery');

# reads
is($standby->safe_psql('postgres', q{
SELECT outcome || ' ' || response_code || ' ' || response_body::text
  FROM idem_reserve('acme', 'orders', 'done-1', '{"amount": 1}')}),
	'replay 201 {"order": 1}', 'a finished request replays on the standby');
is($standby->safe_psql('postgres', q{
SELECT status FROM idem_lookup('acme', 'orders', 'flight-1')}),
	'processing', 'lookups answer');
is($standby->safe_psql('postgres', q{
SELECT outcome FROM idem_reserve('acme', 'orders', 'done-1', '{"amount": 9}')}),
	'mismatch', 'a mismatch is answered');
is($standby->safe_psql('postgres',
		q{SELECT processing FROM idempotency.health}),
	'1', 'the health view answers');
# a key held by an open transaction on the primary is a lock there, which
# recovery does not replay: only the primary's health shows it (README)
my $holder = $primary->background_psql('postgres', on_error_stop => 0);
$holder->query_safe(q{BEGIN; SELECT idem_reserve('acme', 'orders', 'held-1', '{"amount": 4}')});
is($primary->safe_psql('postgres', q{SELECT reservations_held FROM idempotency.health}),
	'1', 'the primary counts the key an open transaction holds');
is($standby->safe_psql('postgres',
		q{SELECT reservations_held || ' ' || (oldest_held_age IS NULL) FROM idempotency.health}),
	'0 true', 'the standby does not see it');
$holder->query_safe('ROLLBACK');
$holder->quit;

# writes: 25006, with the hint
my %writes = (
	'a new key' =>
	  q{SELECT idem_reserve('acme', 'orders', 'new-1', '{"amount": 3}')},
	'a completion' =>
	  qq{SELECT idem_complete('acme', 'orders', 'flight-1', 200, '{}', lock_token => '$token')},
	'an enqueue' => q{SELECT outbox_enqueue('acme', 'mail', '{}')},
	'a claim' => q{SELECT * FROM outbox_claim('w', 1)},
	'a checkpoint' =>
	  qq{SELECT idem_checkpoint('acme', 'orders', 'flight-1', 'step', lock_token => '$token')},
	'a release' =>
	  qq{SELECT idem_release('acme', 'orders', 'flight-1', lock_token => '$token')},
	'a scope policy' =>
	  q{SELECT idem_configure_scope('orders', '{"ttl": "2 days"}')},
	'a reap' => q{SELECT idem_reap()},
	'a sweep' => q{SELECT idem_sweep()},
	# no lease has expired: refused all the same (it answered 0)
	'a lease recovery' => q{SELECT idem_reclaim_leases()},
	'a purge' => q{SELECT idem_purge_outbox()},
	'maintenance' => q{CALL idem_maintain('1 second')},);
for my $what (sort keys %writes)
{
	my ($ret, $out, $err) = $standby->psql('postgres',
		"\\set VERBOSITY verbose\n$writes{$what};");
	like($err, qr/ERROR:  25006:/, "$what: 25006 on the standby");
	like($err, qr/HINT:  Send the call to the primary/,
		"$what: the hint says where to send it");
	like($err, qr/DETAIL:  This server is a standby/,
		"$what: the detail says why");
}

# the same in a read-only transaction on the primary
my ($ret, $out, $err) = $primary->psql('postgres',
	"\\set VERBOSITY verbose\nBEGIN READ ONLY;\n$writes{'a new key'};\nROLLBACK;");
like($err, qr/ERROR:  25006:.*\n.*DETAIL:  This transaction is read-only.*\n.*HINT:  Send the call to the primary/,
	'a read-only transaction on the primary: 25006 with the detail and the hint');

$standby->stop;
$primary->stop;
done_testing();
