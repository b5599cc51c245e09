# The example payments service (examples/payments/service.py):
#   - round trips: with pipelining (the default) a new charge is two round
#     trips to the database, a replay two; with PAYMENTS_PIPELINE=0 a new
#     charge is seven (one per statement).  Counted on the wire: a proxy
#     (t/lib/wire_count.py) between the service and the server counts the
#     messages at which the server answers (Sync, Flush, Query), which bound
#     the round trips, and the statements (Execute, Query);
#   - retryable failures: a provider that answers 503, or does not answer in
#     time, releases the key (idem_complete retryable => true, in a scope
#     that otherwise stores server errors): the client is answered 503, its
#     retry runs afresh and succeeds, later retries replay that success,
#     and the provider authorized once; a declined card (402) is stored and
#     replayed without calling the provider again;
#   - every pooled connection busy: a request waits PAYMENTS_POOL_WAIT for
#     one, once, then is answered 503 with nothing reserved or charged.
use strict;
use warnings;
use HTTP::Tiny;
use JSON::PP;
use POSIX ();
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep time);
use IdemTest qw(new_idem_node);
use PaymentsHarness qw(have_psycopg install_payments spawn wait_http ledger $python);

plan skip_all => 'python3-psycopg, -psycopg-pool, -fastapi or -uvicorn is not installed'
  unless have_psycopg();

my $json = JSON::PP->new->canonical;
my $http = HTTP::Tiny->new(timeout => 15, keep_alive => 0);
my $logdir = $PostgreSQL::Test::Utils::log_path;

my $node = new_idem_node('pipeline');
install_payments($node);
my $socket = $node->host . '/.s.PGSQL.' . $node->port;

my $provider_port = PostgreSQL::Test::Cluster::get_free_port();
my $provider_url = "http://127.0.0.1:$provider_port";
spawn('provider', { PROVIDER_PORT => $provider_port, PROVIDER_SLOW => 3 },
	$python, 'examples/payments/provider.py');
ok(wait_http("$provider_url/_ledger"), 'provider is up');

# One service per mode, each with one pooled connection (so that psycopg's
# per-connection statement preparation settles quickly), each behind a
# counting proxy of its own.
my %svc;
for my $mode (qw(pipelined unpipelined))
{
	my $proxy_port = PostgreSQL::Test::Cluster::get_free_port();
	my $port = PostgreSQL::Test::Cluster::get_free_port();
	my $counts = "$logdir/wire-$mode.json";
	spawn("proxy-$mode", {}, $python, 't/lib/wire_count.py', $proxy_port,
		$socket, $counts);
	spawn(
		"service-$mode",
		{
			PAYMENTS_DSN => "host=127.0.0.1 port=$proxy_port dbname=postgres"
			  . ' user=payments_service sslmode=disable gssencmode=disable',
			PAYMENTS_PORT => $port,
			PAYMENTS_POOL_SIZE => 1,
			PAYMENTS_POOL_WAIT => 2,
			PAYMENTS_PIPELINE => $mode eq 'pipelined' ? 1 : 0,
			PAYMENTS_PROVIDER_TIMEOUT => 1,
			PROVIDER_URL => $provider_url
		},
		$python,
		'examples/payments/service.py');
	$svc{$mode} = { url => "http://127.0.0.1:$port", counts => $counts };
	ok(wait_http("$svc{$mode}{url}/healthz"), "$mode service is up");
}

sub post_charge
{
	my ($mode, $key, $body) = @_;
	return $http->post(
		"$svc{$mode}{url}/v1/charges",
		{
			headers => {
				'Content-Type' => 'application/json',
				Authorization => 'Bearer tok_acme',
				'Idempotency-Key' => $key
			},
			content => ref $body ? $json->encode($body) : $body
		});
}

sub counts
{
	my ($mode) = @_;
	return $json->decode(slurp_file($svc{$mode}{counts}));
}

# What one request costs on the wire: (answer points, statements)
sub wire_cost
{
	my ($mode, $key, $body, $want_status) = @_;
	my $before = counts($mode);
	my $r = post_charge($mode, $key, $body);
	is($r->{status}, $want_status, "$mode $key: $want_status");
	my $after = counts($mode);
	my $d = sub { my $k = shift; ($after->{$k} // 0) - ($before->{$k} // 0) };
	return ($d->('S') + $d->('H') + $d->('Q'), $d->('E') + $d->('Q'));
}

# ---- round trips
my %seen;
for my $mode (qw(pipelined unpipelined))
{
	# warm up: past psycopg's prepare_threshold (5), statements are prepared
	for my $i (1 .. 6)
	{
		my $r = post_charge($mode, "warm-$mode-$i",
			{ amount => 1 + $i, currency => 'EUR', customer => 'cus_1' });
		die "warm-up: $r->{status} $r->{content}" unless $r->{status} == 201;
	}
	for my $i (1 .. 3)
	{
		my $body = { amount => 10 + $i, currency => 'EUR', customer => 'cus_1' };
		my ($syncs, $statements) = wire_cost($mode, "rt-$mode-$i", $body, 201);
		$seen{$mode}{new}{"$syncs/$statements"}++;
		($syncs, $statements) = wire_cost($mode, "rt-$mode-$i", $body, 201);
		$seen{$mode}{replay}{"$syncs/$statements"}++;
	}
}
note('round trips/statements per request: ', $json->encode(\%seen));
is_deeply($seen{pipelined}{new}, { '2/7' => 3 },
	'pipelined: a new charge is 2 round trips for its 7 statements');
is_deeply($seen{pipelined}{replay}, { '2/4' => 3 },
	'pipelined: a replay is 2 round trips (BEGIN, tenant, reserve; COMMIT)');
is_deeply($seen{unpipelined}{new}, { '7/7' => 3 },
	'PAYMENTS_PIPELINE=0: a new charge is 7 round trips, one per statement');
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM payments.charges WHERE idem_key LIKE 'rt-%'"),
	6, 'one charge per key in both modes');

# ---- retryable failures, through the pipelined service
sub key_state
{
	my ($key) = @_;
	return $node->safe_psql('postgres',
		"SELECT coalesce((SELECT status || ' ' || response_code FROM idempotency.keys"
		  . " WHERE tenant_id = 'acme' AND scope = 'charges' AND idem_key = '$key'), 'none')"
		  . " || ' charges=' || (SELECT count(*) FROM payments.charges WHERE idem_key = '$key')"
	);
}

for my $case (
	[ 'flaky-1', 'cus_flaky', 'the provider answers 503' ],
	[ 'slow-1', 'cus_slow', 'the provider times out (after authorizing)' ])
{
	my ($key, $customer, $what) = @$case;
	my $pkey = "acme:charges:$key";
	my $body = { amount => 25, currency => 'EUR', customer => $customer };
	my $r = post_charge('pipelined', $key, $body);
	is($r->{status}, 503, "$key: $what: 503");
	like($r->{headers}{'content-type'}, qr{application/problem\+json}, "$key: problem+json");
	ok(defined $r->{headers}{'retry-after'}, "$key: with Retry-After");
	is(key_state($key), 'none charges=0',
		"$key: the key is released (not stored, though the scope stores 5xx), nothing charged");
	my $first = post_charge('pipelined', $key, $body);
	is($first->{status}, 201, "$key: the retry runs afresh and charges");
	ok(!defined $first->{headers}{'idempotent-replayed'}, "$key: ... not a replay");
	is(key_state($key), 'succeeded 201 charges=1', "$key: stored, one charge");
	my $again = post_charge('pipelined', $key, $body);
	is($again->{status}, 201, "$key: a later retry is 201");
	is($again->{headers}{'idempotent-replayed'}, 'true', "$key: ... replayed");
	is($again->{content}, $first->{content}, "$key: ... with the same body");
	my $ledger = ledger($provider_url);
	is($ledger->{authorization_calls}{$pkey}, 2,
		"$key: the provider was called twice (the failure, the retry), not for the replay");
	is($ledger->{authorizations}{$pkey}{status}, 'authorized',
		"$key: and authorized once");
	is( $node->safe_psql('postgres',
			"SELECT payload->>'authorization' FROM idempotency.outbox WHERE idem_key = '$key'"),
		$ledger->{authorizations}{$pkey}{id},
		"$key: the capture queued carries that authorization");
}

# amounts the charges table cannot hold, or with more digits than Python's
# decimal context rounds, are a 422 problem, before anything is reserved
for my $amount ('1e400', '1e26', '100000000000000000000000000', '10000000000', '12.345')
{
	my $key = "amount-$amount";
	my $r = post_charge('pipelined', $key,
		qq({"amount": $amount, "currency": "EUR", "customer": "cus_1"}));
	is($r->{status}, 422, "amount $amount: 422");
	like($r->{headers}{'content-type'}, qr{application/problem\+json},
		"amount $amount: problem+json");
	is(key_state($key), 'none charges=0', "amount $amount: nothing reserved or charged");
}

# a declined card: a permanent failure, stored and replayed
my $decl = { amount => 30, currency => 'EUR', customer => 'cus_declined' };
my $r = post_charge('pipelined', 'declined-1', $decl);
is($r->{status}, 402, 'declined card: 402');
like($r->{headers}{'content-type'}, qr{application/problem\+json},
	'declined card: problem+json');
is(key_state('declined-1'), 'failed 402 charges=0',
	'declined card: the 402 is stored, nothing charged');
my $again = post_charge('pipelined', 'declined-1', $decl);
is($again->{status}, 402, 'declined card: the retry is 402');
is($again->{headers}{'idempotent-replayed'}, 'true', 'declined card: ... replayed');
is($again->{content}, $r->{content}, 'declined card: ... with the same body');
like($again->{headers}{'content-type'}, qr{application/problem\+json},
	'declined card: ... still problem+json');
is(ledger($provider_url)->{authorization_calls}{'acme:charges:declined-1'},
	1, 'declined card: the provider was called once');

# every pooled connection busy: the pipelined service's one connection is
# held by a charge whose insert waits on a lock; another request waits
# PAYMENTS_POOL_WAIT (2 s) for a connection, once, and is answered 503
my $locker = $node->background_psql('postgres');
$locker->query_safe('BEGIN; LOCK TABLE payments.charges IN EXCLUSIVE MODE');
my $holder = fork();
die "fork: $!" unless defined $holder;
if ($holder == 0)
{
	my $h = post_charge('pipelined', 'pool-holder',
		{ amount => 40, currency => 'EUR', customer => 'cus_1' });
	# _exit: the child must not run the test's END blocks (which stop
	# the node)
	POSIX::_exit($h->{status} == 201 ? 0 : 1);
}
ok( $node->poll_query_until('postgres', q{
	SELECT count(*) > 0 FROM pg_stat_activity
	 WHERE usename = 'payments_service' AND wait_event_type = 'Lock'}),
	'pool exhausted: the one pooled connection waits inside a charge');
my $started = time();
my $busy = post_charge('pipelined', 'pool-busy',
	{ amount => 41, currency => 'EUR', customer => 'cus_1' });
my $waited = time() - $started;
is($busy->{status}, 503, 'pool exhausted: 503');
ok(defined $busy->{headers}{'retry-after'}, 'pool exhausted: with Retry-After');
note(sprintf('pool exhausted: answered after %.2f s', $waited));
# twice PAYMENTS_POOL_WAIT (4 s) when the timeout was taken for a lost
# connection and waited out again
ok($waited >= 1.9 && $waited < 3.5,
	'pool exhausted: answered after one PAYMENTS_POOL_WAIT (2 s), not two');
is(key_state('pool-busy'), 'none charges=0', 'pool exhausted: nothing reserved or charged');
$locker->query_safe('COMMIT');
$locker->quit;
waitpid($holder, 0);
is($?, 0, 'the charge that held the connection then goes through (201)');

$node->stop;
done_testing();
