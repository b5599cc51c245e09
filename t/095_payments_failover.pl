# Failover: the example payments service on a primary with a synchronous
# standby, under concurrent retrying load; the primary is killed with
# SIGKILL (the postmaster and every backend, as when its machine dies) in
# the middle of the load, the standby is promoted, and the service and the
# workers reconnect to it by themselves (their DSN lists both nodes with
# target_session_attrs=read-write).  Then:
#   - every answer the service acknowledged before or after the failover is
#     still there: replaying the request returns the same body;
#   - retries converge to one charge per key, none acknowledged twice;
#   - the outbox drains on the new primary, and the provider captured each
#     charge exactly once.
use strict;
use warnings;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep time);
use IdemTest qw(new_idem_node);
use PaymentsHarness qw(have_psycopg install_payments spawn wait_http
  read_ack_log check_acknowledged check_outbox_and_provider children_of
  $python);

plan skip_all => "the example's Python packages are not installed (scripts/deps.sh)"
  unless have_psycopg();

my $started = time();
my $logdir = $PostgreSQL::Test::Utils::log_path;
my $json = JSON::PP->new->canonical;

# ---- a primary and a synchronous standby
my $primary = new_idem_node(
	'primary',
	init => { allows_streaming => 1 },
	conf => "max_connections = 60\nshared_buffers = 16MB\n");
install_payments($primary);
$primary->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->start;
# only the primary waits for a standby: the promoted standby will be alone
$primary->append_conf('postgresql.conf',
	"synchronous_standby_names = '*'\nsynchronous_commit = on\n");
$primary->reload;
ok( $primary->poll_query_until('postgres',
		"SELECT sync_state = 'sync' FROM pg_stat_replication"),
	'the standby is synchronous');
is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'),
	't', 'the standby is in recovery');

# both nodes, the writable one wins: after the failover a new connection
# goes to the promoted standby without any reconfiguration
my $hosts = join(',', $primary->host, $standby->host);
my $ports = join(',', $primary->port, $standby->port);
my $base_dsn = "host=$hosts port=$ports dbname=postgres "
  . 'target_session_attrs=read-write connect_timeout=3';
my $service_dsn = "$base_dsn user=payments_service";
my $worker_dsn = "$base_dsn user=payments_worker";
for ([ $service_dsn, 'payments_service' ], [ $worker_dsn, 'payments_worker' ])
{
	my ($dsn, $role) = @$_;
	my $out = `psql -X -A -t -d '$dsn' -c "SELECT current_user || ' ' || rolsuper FROM pg_roles WHERE rolname = current_user"`;
	chomp $out;
	is($out, "$role false", "$role connects through the failover DSN, not a superuser");
}

my $service_port = PostgreSQL::Test::Cluster::get_free_port();
my $provider_port = PostgreSQL::Test::Cluster::get_free_port();
my $service_url = "http://127.0.0.1:$service_port";
my $provider_url = "http://127.0.0.1:$provider_port";

my $provider = spawn('provider', { PROVIDER_PORT => $provider_port },
	$python, 'examples/payments/provider.py');
my $service = spawn(
	'service',
	{
		PAYMENTS_DSN => $service_dsn,
		PAYMENTS_PORT => $service_port,
		PROVIDER_URL => $provider_url,
		PAYMENTS_PROCESSING_DELAY => '0.02',
		# at most a second's wait for a database connection: the outage is
		# answered 503
		PAYMENTS_POOL_WAIT => 1
	},
	$python,
	'examples/payments/service.py');
my @workers = map {
	spawn(
		"worker$_",
		{
			PAYMENTS_DSN => $worker_dsn,
			PROVIDER_URL => $provider_url,
			WORKER_NAME => "w$_",
			WORKER_LEASE => 3,
			WORKER_BATCH => 5
		},
		$python,
		'examples/payments/worker.py')
} 1 .. 2;
ok(wait_http("$provider_url/_ledger"), 'provider is up');
ok(wait_http("$service_url/healthz"), 'service is up');

# ---- retrying clients: keys start over 10 seconds, each sent by 2 clients
# twice; every acknowledged answer is logged as it arrives
my $ack_log = "$logdir/failover-acks.jsonl";
my $summary = "$logdir/failover-loadtest.json";
my $keys = 160;
my $load = spawn(
	'loadtest', {},
	'sh', '-c',
	"exec $python examples/payments/loadtest.py --url $service_url"
	  . " --keys $keys --clients 2 --repeats 2 --mismatch-rate 0.1"
	  . " --spread 10 --deadline 120 --prefix fo --seed 23"
	  . " --ack-log $ack_log > $summary");

# ---- in the middle of the load, the primary's machine dies
my $deadline = time() + 60;
sleep 0.2 while scalar(read_ack_log($ack_log)) < 80 && time() < $deadline;
my $pm = (split /\n/, slurp_file($primary->data_dir . '/postmaster.pid'))[0];
my @backends = children_of($pm);
$primary->kill9;
kill 'KILL', @backends;
my $killed_at = time();
my $acked_before = scalar(read_ack_log($ack_log));
note("primary killed (postmaster $pm and "
	  . scalar(@backends)
	  . " children) after $acked_before acknowledged answers");
cmp_ok($acked_before, '>=', 80, 'the primary died under load');

# the service fails closed meanwhile (503, clients retry); then promote.
# The outage lasts longer than the service's wait for a pooled connection
# (PAYMENTS_POOL_WAIT, 1 s) and its one retry on a fresh connection, so a
# request arriving in it is answered 503 rather than carried over to the
# promoted standby.
sleep 3;
$standby->promote;
ok( $standby->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()'),
	'the standby is promoted');
my $promoted_at = time();

waitpid($load, 0);
is($?, 0, 'the load client finished');
my $s = $json->decode(slurp_file($summary));
note('answers by status: ', $json->encode($s->{statuses}));
is_deeply($s->{errors}, [], 'every key got a final answer before the deadline');
ok(($s->{statuses}{503} // 0) + ($s->{statuses}{'connection-error'} // 0) > 0,
	'clients saw the outage and retried')
  or diag(explain $s->{statuses});

# each key: one final answer, 201, the same for every client and repeat
my ($bad, $changed_bad) = (0, 0);
for my $k (sort keys %{ $s->{keys} })
{
	my @f = @{ $s->{keys}{$k}{final} };
	if (@f != 1 || $json->decode($f[0])->[0] != 201)
	{
		$bad++;
		diag("$k: final answers @f");
	}
	$changed_bad += grep { $_ != 422 } @{ $s->{keys}{$k}{changed} };
}
is($bad, 0, 'retries converged: one identical 201 per key');
is($changed_bad, 0, 'a changed body was refused (422) every time');

# ---- nothing acknowledged was lost, nothing happened twice
my @acks = read_ack_log($ack_log);
my ($nkeys, $lost, $doubles) =
  check_acknowledged('after failover', $service_url, @acks);
is( $standby->safe_psql('postgres',
		"SELECT count(*) || '/' || count(DISTINCT (tenant_id, idem_key)) FROM payments.charges"),
	"$keys/$keys",
	'exactly one charge per key on the new primary');
is( $standby->safe_psql('postgres', q{
		SELECT count(*) FROM payments.charges c
		  FULL JOIN (SELECT * FROM idempotency.keys WHERE scope = 'charges') k
		    ON k.tenant_id = c.tenant_id AND k.idem_key = c.idem_key
		 WHERE c.id IS NULL OR k.status IS DISTINCT FROM 'succeeded'}),
	0,
	'every charge has its completed key, every completed key its charge');
my ($captures, $redelivered) =
  check_outbox_and_provider('after failover', $standby, $provider_url, 60);
my $svclog = slurp_file("$logdir/service.log");
my $unique_violations = () = $svclog =~ /database error 23505/g;
is($unique_violations, 0, 'the service never tried to charge a key twice');

kill 'KILL', @workers, $service, $provider;
waitpid($_, 0) for @workers, $service, $provider;

diag(
	sprintf(
		"failover: %d answers acknowledged (%d keys; %d answers before the primary was killed), "
		  . "lost: %d, doubles: %d; %d charges, %d captures (%d keys redelivered); "
		  . "promoted %.1fs after the kill; run %.0fs",
		scalar(@acks), $nkeys, $acked_before, $lost, $doubles,
		$keys, $captures, $redelivered,
		$promoted_at - $killed_at, time() - $started));

$standby->stop;
done_testing();
