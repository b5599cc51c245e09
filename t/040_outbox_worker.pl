# Real worker processes (examples/payments/worker.py, as payments_worker)
# drain the outbox against the example's provider
# (examples/payments/provider.py), which deduplicates by idempotency key and
# answers 503 to the first call of every 7th key.  One worker kills itself
# with SIGKILL after the provider performed its call but before the ack; its
# lease expires, the row is delivered again by another worker, and the
# provider's dedup keeps the effect single.  At the end every row is done,
# every key reached the provider at least once, and each effect happened
# exactly once.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);
use IdemTest qw(new_idem_node);
use PaymentsHarness qw(have_psycopg install_payments spawn wait_http ledger $python);

plan skip_all => "the example's Python packages are not installed (scripts/deps.sh)"
  unless have_psycopg();

my $rows = 120;
my $logdir = $PostgreSQL::Test::Utils::log_path;

my $node = new_idem_node('outbox_worker');
install_payments($node);
my $connstr = $node->connstr('postgres') . ' user=payments_worker';

# three tenants, every row correlated with the idempotency key of the
# request that enqueued it
$node->safe_psql('postgres', qq{
	SELECT count(outbox_enqueue('tenant-' || (g % 3), 'charge.capture',
	                            jsonb_build_object('charge_id', g, 'amount', (g * 100)::text,
	                                               'currency', 'EUR', 'customer', 'cus_' || g),
	                            'order-' || g, 'charges'))
	  FROM generate_series(1, $rows) g});

# the provider: the first call of every 7th key fails with 503 (nack, retry)
my $port = PostgreSQL::Test::Cluster::get_free_port();
my $url = "http://127.0.0.1:$port";
spawn('provider', { PROVIDER_PORT => $port, PROVIDER_FAIL_EVERY => 7 },
	$python, 'examples/payments/provider.py');
wait_http("$url/_ledger") or BAIL_OUT('provider did not start');

sub start_worker
{
	my ($name, %env) = @_;
	my $pid = spawn(
		$name,
		{
			PAYMENTS_DSN => $connstr,
			PROVIDER_URL => $url,
			WORKER_NAME => $name,
			WORKER_LEASE => 3,
			WORKER_BATCH => 5,
			%env
		},
		$python,
		'examples/payments/worker.py');
	return { pid => $pid, name => $name };
}

# the doomed worker starts first, so it is sure to hold a batch when it
# kills itself after its first successful provider call
my $doomed = start_worker('w-crash', WORKER_CRASH_AFTER_CALLS => 1);
waitpid($doomed->{pid}, 0);
is($? & 127, 9, 'the doomed worker died of SIGKILL');
my ($crashed) = slurp_file("$logdir/w-crash.log") =~ /crashing after provider call for (\S+)/;
ok(defined $crashed, "it crashed after the provider call for $crashed");
my $held = $node->safe_psql('postgres',
	"SELECT count(*) FROM idempotency.outbox WHERE leased_by = 'w-crash' AND status = 'leased'");
cmp_ok($held, '>=', 1, 'the doomed worker left leased rows');
my @workers = map { start_worker("w-$_") } 1 .. 3;

ok( $node->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM idempotency.outbox WHERE status <> 'done'"),
	'every row is done');

# stop the workers (SIGTERM: each finishes its batch and exits 0) and
# collect what they did
kill 'TERM', map { $_->{pid} } @workers;
for my $w (@workers)
{
	waitpid($w->{pid}, 0);
	is($?, 0, "$w->{name} stopped cleanly on SIGTERM");
	my ($summary) = slurp_file("$logdir/$w->{name}.log") =~ /(stopped: .*)/;
	note "$w->{name}: ", $summary // '(no summary)';
}

my $ledger = ledger($url);
my %db = map { my ($k, $ref, $att) = split /\|/; ($k => [ $ref, $att ]) }
  split /\n/, $node->safe_psql('postgres',
	"SELECT tenant_id || ':' || idem_scope || ':' || idem_key, provider_ref, attempts FROM idempotency.outbox");
is(scalar(keys %db), $rows, 'no row lost or added');

my @never_called = grep { !$ledger->{calls}{$_} } keys %db;
is_deeply(\@never_called, [], 'the provider saw every key at least once');
my @no_effect = grep { !$ledger->{captures}{$_} } keys %db;
is_deeply(\@no_effect, [], 'each key was captured');
is(scalar(keys %{ $ledger->{captures} }), $rows, 'no capture for an unknown key');
my @wrong_ref = grep { $db{$_}[0] ne $ledger->{captures}{$_}{id} } keys %db;
is_deeply(\@wrong_ref, [], 'each row records the provider reference of its capture');

# the row the killed worker had delivered: called again after its lease
# expired, the provider replayed it, the reclaim counted the lost attempt
is( $node->safe_psql('postgres', qq{
		SELECT attempts >= 1 AND last_error = 'lease of worker "w-crash" expired'
		  FROM idempotency.outbox WHERE tenant_id || ':' || idem_scope || ':' || idem_key = '$crashed'}),
	't', 'the row of the killed worker was reclaimed after its lease expired');
cmp_ok($ledger->{calls}{$crashed}, '>=', 2, 'its key reached the provider again');
is($ledger->{captures}{$crashed}{id}, $db{$crashed}[0],
	'and the capture made by its first call is the one recorded');

# the 503s were nacked and retried
my $retried = grep { $_->[1] >= 1 } values %db;
my $calls = 0;
$calls += $_ for values %{ $ledger->{calls} };
cmp_ok($retried, '>', 1, 'failed deliveries were retried');
cmp_ok($calls, '>', $rows, 'more calls than rows: retries and the replay');

$node->stop;
done_testing();
