# Warm backends inside a transaction block.  A session that has used the
# key functions opens a transaction (BEGIN, a statement that locks none of
# the extension's tables), and while it is idle in that transaction another
# session rebuilds the keys table's primary key with REINDEX CONCURRENTLY
# (which does not wait for it), or changes a scope's policy.  The next call
# in the open transaction must see the change, as any SQL statement would:
# no XX000 "could not open relation with OID" from a cached OID, and the
# scope's new policy ("every backend picks a change up at its next call
# after the commit").
#
# The key functions must process pending invalidations before trusting
# what they cached (a transaction processes them at its start and when it
# locks a relation, neither of which happened since the change).  (DROP and
# CREATE EXTENSION in the same situation is not checked: the statement's
# own parse analysis resolves idem_reserve from the stale catalog cache and
# fails in the core, "cache lookup failed for type", whatever the
# extension does.)
use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest qw(new_idem_node run_in);

my $node = new_idem_node('warm_transactions');

# DDL from another session, while $session is idle in a transaction it
# opened just before (and which holds no lock the DDL waits for)
sub ddl_while_idle_in_transaction
{
	my ($session, $ddl) = @_;
	# a call outside of a transaction block first: whatever an earlier
	# case left to reload is loaded now
	my ($out, $err) = run_in($session,
		q{SELECT count(*) FROM idem_reserve('wt', 'orders', 'warm-1', '{}'::jsonb) a,
		                       idem_reserve('wt', 'pol', 'warm-2', '{}'::jsonb) b;});
	is("$out $err", '1 ', "warm before: $ddl");
	($out, $err) = run_in($session, 'BEGIN; SELECT 1;');
	is($err, '', "BEGIN before: $ddl");
	my ($ret, $stdout, $stderr) =
	  $node->psql('postgres', $ddl, timeout => $PostgreSQL::Test::Utils::timeout_default);
	is($ret, 0, "$ddl does not wait for the idle transaction") or diag($stderr);
}

my $warm = $node->background_psql('postgres', on_error_stop => 0);
$warm->set_query_timer_restart();
my ($out, $err) = run_in($warm, q{
BEGIN;
SELECT outcome FROM idem_reserve('wt', 'orders', 'warm-1', '{}'::jsonb);
SELECT idem_complete('wt', 'orders', 'warm-1', 200, '{}');
COMMIT;
SELECT outcome FROM idem_reserve('wt', 'pol', 'warm-2', '{}'::jsonb);});
is($err, '', 'warm-up: no error');
is($out, "created\nsucceeded\ncreated", 'warm-up: the caches are loaded');
# a two-phase reservation, committed, for the fenced write below
my $token = $node->safe_psql('postgres',
	q{SELECT lock_token FROM idem_reserve('wt', 'orders', 'tp-1', '{}'::jsonb)});

# 1. keys_pkey gets a new OID: the first call in the open transaction
ddl_while_idle_in_transaction($warm,
	'REINDEX INDEX CONCURRENTLY idempotency.keys_pkey');
($out, $err) = run_in($warm, q{
SELECT outcome FROM idem_reserve('wt', 'orders', 'k-1', '{}'::jsonb);
SELECT idem_complete('wt', 'orders', 'k-1', 201, '{}');
COMMIT;});
is($err, '', 'REINDEX CONCURRENTLY, then reserve in a transaction begun before it: no error');
is($out, "created\nsucceeded", 'and the key is reserved and completed');

# 2. the same, with a fenced write as the first call: a committed two-phase
# reservation completed without its token is 55006, not XX000
ddl_while_idle_in_transaction($warm,
	'REINDEX TABLE CONCURRENTLY idempotency.keys');
($out, $err) = run_in($warm,
	q{SELECT idem_complete('wt', 'orders', 'tp-1', 200, '{}');});
like($err, qr/lock_token is required to complete/,
	'REINDEX CONCURRENTLY, then complete without lock_token: fenced (55006)');
unlike($err, qr/could not open relation/, 'not XX000');
run_in($warm, 'ROLLBACK;');
($out, $err) = run_in($warm,
	qq{SELECT idem_complete('wt', 'orders', 'tp-1', 200, '{}', lock_token => '$token');});
is("$out $err", 'succeeded ', 'completed with its token');

# 3. a scope's policy changed: the next call uses it
ddl_while_idle_in_transaction($warm,
	q{SELECT idem_configure_scope('pol', '{"ttl": "1 hour"}')});
($out, $err) = run_in($warm, q{
SELECT outcome FROM idem_reserve('wt', 'pol', 'k-2', '{}'::jsonb);
SELECT expires_at - created_at FROM idem_lookup('wt', 'pol', 'k-2');
COMMIT;});
is($err, '', 'scope changed, then reserve in a transaction begun before: no error');
is($out, "created\n01:00:00", "and the key gets the scope's new ttl");

# A rebuild racing the warm session: REINDEX CONCURRENTLY in a loop in
# another session while the warm session goes on with short transactions
# (BEGIN, reserve, complete, COMMIT, replay).  A REINDEX that completes
# between a BEGIN and the reserve that follows it is case 1 above; the loop
# meets it now and then.
my ($rout, $rerr) = ('', '');
my $reindexer = IPC::Run::start(
	[
		$node->installed_command('psql'), '-XAtq', '-v', 'ON_ERROR_STOP=1',
		'-d', $node->connstr('postgres'),
		map { ('-c', 'REINDEX INDEX CONCURRENTLY idempotency.keys_pkey') } 1 .. 8
	],
	'>', \$rout, '2>', \$rerr);
my $rounds = 0;
my $failed = 0;
while ($rounds < 100)
{
	($out, $err) = run_in($warm, <<SQL);
BEGIN;
SELECT outcome FROM idem_reserve('wt', 'race', 'race-$rounds', '{}'::jsonb);
SELECT idem_complete('wt', 'race', 'race-$rounds', 200, '{}');
COMMIT;
SELECT outcome FROM idem_reserve('wt', 'race', 'race-$rounds', '{}'::jsonb);
SQL
	$rounds++;
	if ($err ne '' || $out ne "created\nsucceeded\nreplay")
	{
		$failed++;
		diag("round $rounds during REINDEX CONCURRENTLY: $out $err");
	}
	last unless $reindexer->pumpable;
	$reindexer->pump_nb;
}
$reindexer->finish;
is($rerr, '', 'the concurrent REINDEX loop ran');
is($failed, 0, "$rounds rounds racing REINDEX CONCURRENTLY all worked");

# and afterwards, outside of any such transaction, everything works
($out, $err) = run_in($warm, q{
SELECT outcome FROM idem_reserve('wt', 'orders', 'k-4', '{}'::jsonb);});
is("$out $err", 'created ', 'a later call works');

$warm->quit;
$node->stop;
done_testing();
