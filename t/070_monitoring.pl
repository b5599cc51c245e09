# examples/monitoring with the real prometheus-postgres-exporter: after a
# known workload (reservations of every outcome for two tenants, a stale
# reservation flagged for reconciliation, a dead letter, a pending and a
# leased outbox row), the exporter, logged in as a role that is only a
# member of pg_monitor and reading examples/monitoring/queries.yaml, serves
# on 127.0.0.1 every counter per tenant and scope and every health gauge
# with its value; a second scrape sees the counters move.  Then promtool
# checks the alerting rules and runs their unit tests
# (examples/monitoring/alerts_test.yml), which prove that each alert fires.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use HTTP::Tiny;
use IPC::Run;
use Time::HiRes qw(sleep);
use IdemTest qw(new_idem_node);

my $dir = 'examples/monitoring';

# Debian's package, or the upstream binary on PATH
sub find_exporter
{
	for my $bin ('/usr/bin/prometheus-postgres-exporter',
		map { "$_/postgres_exporter" } split /:/, $ENV{PATH} // '')
	{
		return $bin if -x $bin;
	}
	return undef;
}

sub find_promtool
{
	for my $d ('/usr/bin', split /:/, $ENV{PATH} // '')
	{
		return "$d/promtool" if -x "$d/promtool";
	}
	return undef;
}

my $exporter_bin = find_exporter();
plan skip_all =>
  'prometheus-postgres-exporter is not installed (make test installs it: examples/monitoring/deps.sh)'
  unless $exporter_bin;

my $node = new_idem_node('monitoring');

# the exporter's role: pg_monitor and nothing else
$node->safe_psql('postgres', 'CREATE ROLE idem_exporter LOGIN IN ROLE pg_monitor');

# ---- the workload
# acme/orders: 3 requests completed, 2 replays, 1 mismatch, 1 reservation
# in flight and a concurrent duplicate of it (in_progress)
$node->safe_psql(
	'postgres', q{
	BEGIN;
	SELECT idem_reserve('acme', 'orders', 'o1', '{"n": 1}');
	SELECT idem_complete('acme', 'orders', 'o1', 201, '{"order": 1}');
	COMMIT;
	BEGIN;
	SELECT idem_reserve('acme', 'orders', 'o2', '{"n": 2}');
	SELECT idem_complete('acme', 'orders', 'o2', 201, '{"order": 2}');
	COMMIT;
	BEGIN;
	SELECT idem_reserve('acme', 'orders', 'o3', '{"n": 3}');
	SELECT idem_complete('acme', 'orders', 'o3', 201, '{"order": 3}');
	COMMIT;
	SELECT idem_reserve('acme', 'orders', 'o1', '{"n": 1}');
	SELECT idem_reserve('acme', 'orders', 'o1', '{"n": 1}');
	SELECT idem_reserve('acme', 'orders', 'o2', '{"n": 22}');
	SELECT idem_reserve('acme', 'orders', 'p1', '{"n": 4}');
	SELECT idem_reserve('acme', 'orders', 'p1', '{"n": 4}');
});
# globex/payments: a reservation left past its lock_timeout; the next
# attempt answers stale and flags it for reconciliation
$node->safe_psql(
	'postgres', q{
	SELECT idem_configure_scope('payments', '{"lock_timeout": "1 second",
	    "new_keys_per_second": 0.001, "new_keys_burst": 1}');
	SELECT idem_reserve('globex', 'payments', 'g1', '{"amount": 100}');
});
sleep 1.2;
is( $node->safe_psql(
		'postgres',
		q{SELECT outcome FROM idem_reserve('globex', 'payments', 'g1', '{"amount": 100}')}),
	'stale',
	'workload: a stale reservation');
# globex then sprays two new keys past its scope's rate
is( $node->safe_psql(
		'postgres',
		q{SELECT string_agg(outcome::text, ' ') FROM generate_series(2, 3) i,
		         idem_reserve('globex', 'payments', 'g' || i, '{"amount": 100}')}),
	'rate_limited rate_limited',
	'workload: new keys over the rate');
# outbox: a dead letter, a leased row and a pending one
$node->safe_psql(
	'postgres', q{
	SELECT outbox_enqueue('acme', 'email.receipt', '{"order": 1}', max_attempts => 1);
	SELECT id, lease_token FROM outbox_claim('w1', batch => 1, topics => '{email.receipt}') \gset
	SELECT outbox_nack('acme', :id, :'lease_token', 'HTTP 503');
	SELECT outbox_enqueue('acme', 'webhook', '{"order": 2}');
	SELECT count(*) FROM outbox_claim('w1', batch => 1, topics => '{webhook}');
	SELECT outbox_enqueue('acme', 'payment.capture', '{"order": 3}');
});
is( $node->safe_psql('postgres',
		'SELECT outbox_dead, outbox_leased, outbox_pending FROM idempotency.health'),
	'1|1|1',
	'workload: a dead letter, a leased row, a pending row');

# ---- the exporter
my $port = PostgreSQL::Test::Cluster::get_free_port();
my $log = "$PostgreSQL::Test::Utils::log_path/exporter_070_monitoring.log";
my $pid = fork();
die "fork: $!" unless defined $pid;
if ($pid == 0)
{
	open(STDOUT, '>>', $log) or die;
	open(STDERR, '>&', \*STDOUT) or die;
	# the DSN says everything; lib/pq panics on some PG* variables the test
	# framework sets (PGSYSCONFDIR)
	delete $ENV{$_} for grep { /^PG/ } keys %ENV;
	$ENV{DATA_SOURCE_NAME} =
	    'host=' . $node->host . ' port=' . $node->port
	  . ' user=idem_exporter dbname=postgres sslmode=disable';
	exec($exporter_bin, "--web.listen-address=127.0.0.1:$port",
		"--extend.query-path=$dir/queries.yaml",
		'--disable-default-metrics', '--disable-settings-metrics',
		'--no-collector.database', '--no-collector.bgwriter')
	  or die "exec $exporter_bin: $!";
}
END
{
	my $rc = $?;
	if ($pid)
	{
		kill 'TERM', $pid;
		waitpid($pid, 0);
	}
	$? = $rc;
}

my $http = HTTP::Tiny->new(timeout => 20);
my $url = "http://127.0.0.1:$port/metrics";

sub scrape
{
	my $res;
	for (1 .. 100)
	{
		$res = $http->get($url);
		last if $res->{success};
		sleep 0.1;
	}
	die "no answer from the exporter at $url: $res->{status} $res->{reason}, see $log"
	  unless $res->{success};
	my %series;
	for my $line (split /\n/, $res->{content})
	{
		next if $line =~ /^#/ || $line !~ /\S/;
		$line =~ /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/
		  or die "unexpected line: $line";
		my ($name, $labels, $value) = ($1, $2 // '', $3);
		my %l;
		while ($labels =~ /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)
		{
			$l{$1} = $2;
		}
		push @{ $series{$name} }, { labels => \%l, value => $value };
	}
	return (\%series, $res->{content});
}

# The values of the series $name whose labels include %want (other labels,
# such as the exporter's own "server", do not matter).
sub values_of
{
	my ($series, $name, %want) = @_;
	my @v;
  SERIES:
	for my $s (@{ $series->{$name} // [] })
	{
		for my $k (keys %want)
		{
			next SERIES unless ($s->{labels}{$k} // "\0") eq $want{$k};
		}
		push @v, $s->{value};
	}
	return @v;
}

# exactly one series $name with labels %want, of value $expected
sub series_is
{
	my ($series, $name, $labels, $expected, $what) = @_;
	my @v = values_of($series, $name, %$labels);
	my $desc = "$name"
	  . '{' . join(',', map { "$_=\"$labels->{$_}\"" } sort keys %$labels) . '}';
	if (@v != 1)
	{
		fail("$what: $desc");
		diag("expected one series $desc, found " . scalar(@v));
		return;
	}
	is($v[0] + 0, $expected, "$what: $desc $expected");
}

my ($series, $text) = scrape();
note("scraped:\n$text");

# the queries ran, as a member of pg_monitor, without an error
my @loaded = values_of($series, 'pg_exporter_user_queries_load_error');
is_deeply(\@loaded, ['0'], 'queries.yaml loads');
my @errors = values_of($series, 'pg_exporter_last_scrape_error');
is_deeply(\@errors, ['0'], 'the scrape ran every query without an error')
  or diag(PostgreSQL::Test::Utils::slurp_file($log));

my %acme = (datname => 'postgres', tenant => 'acme', scope => 'orders');
my %globex = (datname => 'postgres', tenant => 'globex', scope => 'payments');
my %counters = (
	acme => {
		created => 4, replayed => 2, mismatched => 1, in_progress => 1,
		stale => 0, completed => 3, released => 0, reaped => 0, swept => 0,
		rate_limited => 0
	},
	globex => {
		created => 1, replayed => 0, mismatched => 0, in_progress => 0,
		stale => 1, completed => 0, released => 0, reaped => 0, swept => 0,
		rate_limited => 2
	});
for my $c (sort keys %{ $counters{acme} })
{
	series_is($series, "idempotency_${c}_total", \%acme, $counters{acme}{$c}, 'acme');
	series_is($series, "idempotency_${c}_total", \%globex, $counters{globex}{$c},
		'globex');
	is(scalar(values_of($series, "idempotency_${c}_total")), 2,
		"idempotency_${c}_total: one series per tenant and scope, no other");
}
like($text, qr/^# TYPE idempotency_replayed_total counter$/m, 'counters are typed counter');

my %db = (datname => 'postgres');
my %gauges = (
	processing => 2,
	stale_processing => 0,
	needs_reconciliation => 1,
	expired_keys => 0,
	outbox_pending => 1,
	outbox_leased => 1,
	outbox_dead => 1,
	outbox_expired_leases => 0,
	reservations_held => 0,
	oldest_held_age_seconds => 0);
for my $g (sort keys %gauges)
{
	series_is($series, "idempotency_health_$g", \%db, $gauges{$g}, 'health');
}
like($text, qr/^# TYPE idempotency_health_outbox_dead gauge$/m, 'health series are typed gauge');
# ages: the flagged reservation is more than 1.2 s old; the pending row
# became due a moment ago
my ($age) = values_of($series, 'idempotency_health_oldest_processing_age_seconds', %db);
ok(defined $age && $age >= 1.2 && $age < 300,
	'idempotency_health_oldest_processing_age_seconds: the oldest reservation in flight, in seconds')
  or diag('got ' . ($age // 'nothing'));
my ($pending_age) =
  values_of($series, 'idempotency_health_outbox_oldest_pending_age_seconds', %db);
ok(defined $pending_age && $pending_age > 0 && $pending_age < 300,
	'idempotency_health_outbox_oldest_pending_age_seconds: in seconds')
  or diag('got ' . ($pending_age // 'nothing'));

# nothing but the extension's series and the exporter's own
my @others = grep { !/^(idempotency_|pg_exporter_|pg_up$|pg_static$|go_|process_|promhttp_|postgres_exporter_)/ }
  sort keys %$series;
is_deeply(\@others, [], 'default metrics are off: the output is small');

# each scrape reads the counters afresh
$node->safe_psql('postgres', q{
	SELECT idem_reserve('acme', 'orders', 'o3', '{"n": 3}');
	SELECT outbox_requeue('acme', id) FROM idempotency.dead_letters;
});
($series) = scrape();
series_is($series, 'idempotency_replayed_total', \%acme, 3, 'second scrape');
series_is($series, 'idempotency_health_outbox_dead', \%db, 0, 'second scrape');
series_is($series, 'idempotency_health_outbox_pending', \%db, 2, 'second scrape');

kill 'TERM', $pid;
waitpid($pid, 0);
$pid = undef;

# ---- the alerting rules
SKIP:
{
	my $promtool = find_promtool();
	skip 'promtool is not installed (Debian package prometheus)', 2 unless $promtool;
	my ($out, $err);
	my $ok = IPC::Run::run([ $promtool, 'check', 'rules', "$dir/alerts.yml" ],
		'>', \$out, '2>', \$err);
	ok($ok, 'promtool check rules alerts.yml') or diag("$out$err");
	$ok = IPC::Run::run([ $promtool, 'test', 'rules', "$dir/alerts_test.yml" ],
		'>', \$out, '2>', \$err);
	ok($ok, 'promtool test rules alerts_test.yml: every alert fires when it should')
	  or diag("$out$err");
}

done_testing();
