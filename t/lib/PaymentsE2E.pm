# The end-to-end test of the example payments service (examples/payments),
# shared by t/090_payments_e2e.pl (the service connected straight to the
# database) and t/091_payments_pgbouncer.pl (through PgBouncer): real
# concurrent HTTP clients, workers killed with SIGKILL between the provider
# call and the ack, an immediate shutdown of the database in the middle of
# load, and the database down altogether.  The service and the workers log
# in as the roles of examples/payments/roles.sql, never as a superuser, and
# the operator's maintenance runs as payments_ops (idempotency_admin).
# Everything runs on 127.0.0.1 with bounded request counts and deadlines.
package PaymentsE2E;

use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use HTTP::Tiny;
use JSON::PP;
use IPC::Run;
use POSIX ":sys_wait_h";
use Time::HiRes qw(sleep time);
use Exporter 'import';

our @EXPORT_OK = qw(run_payments_e2e payments_skip_reason);

my $python = '/usr/bin/python3';
my $json = JSON::PP->new->canonical;
# set by run_payments_e2e, used by the helpers below
my ($node, $logdir, $http, $service_url);

# Why the test cannot run here, or undef.
sub payments_skip_reason
{
	return 'python3-psycopg, -psycopg-pool, -fastapi or -uvicorn is not installed'
	  unless system("$python -c 'import psycopg, psycopg_pool, fastapi, uvicorn' 2>/dev/null")
	  == 0;
	return undef;
}

# Start a program in the background, output to a log file; returns its pid.
sub spawn
{
	my ($name, $env, @cmd) = @_;
	my $pid = fork();
	die "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		open(STDOUT, '>>', "$logdir/$name.log") or die;
		open(STDERR, '>&', \*STDOUT) or die;
		%ENV = (%ENV, %$env);
		exec(@cmd) or die "exec @cmd: $!";
	}
	return $pid;
}

sub wait_http
{
	my ($url) = @_;
	for (1 .. 100)
	{
		return 1 if $http->get($url)->{status} < 500;
		sleep 0.1;
	}
	return 0;
}

sub psql1
{
	my ($sql) = @_;
	return $node->safe_psql('postgres', $sql);
}

sub post_charge
{
	my ($token, $key, $body) = @_;
	my %h = ('Content-Type' => 'application/json');
	$h{Authorization} = "Bearer $token" if defined $token;
	$h{'Idempotency-Key'} = $key if defined $key;
	# a string is sent as it is, to control the exact JSON text
	return $http->post("$service_url/v1/charges",
		{ headers => \%h, content => ref $body ? $json->encode($body) : $body });
}

sub loadtest
{
	my (@args) = @_;
	my $out = `$python examples/payments/loadtest.py --url $service_url @args`;
	die "loadtest failed: $?" if $?;
	return $json->decode($out);
}

# Check a loadtest summary: one final answer per key, all 2xx, every changed
# body refused with 422, and exactly one charge row per key.
sub check_summary
{
	my ($label, $s, $prefix) = @_;
	is_deeply($s->{errors}, [], "$label: no client errors");
	my ($bad_final, $bad_changed, $changed) = (0, 0, 0);
	for my $k (sort keys %{ $s->{keys} })
	{
		my $e = $s->{keys}{$k};
		my @f = @{ $e->{final} };
		if (@f != 1 || $json->decode($f[0])->[0] != 201)
		{
			$bad_final++;
			diag("$k: final answers @f");
		}
		for my $st (@{ $e->{changed} })
		{
			$changed++;
			$bad_changed++ if $st != 422;
		}
	}
	is($bad_final, 0,
		"$label: every repeated key got one identical 201 answer");
	is($bad_changed, 0, "$label: all $changed changed-body requests got 422");
	my $nkeys = scalar keys %{ $s->{keys} };
	is( psql1(
			"SELECT count(*) || '/' || count(DISTINCT (tenant_id, idem_key)) FROM payments.charges WHERE idem_key LIKE '$prefix-%'"
		),
		"$nkeys/$nkeys",
		"$label: exactly one charge row per key");
	return $changed;
}

sub outbox_open
{
	return psql1(
		"SELECT count(*) FROM idempotency.outbox WHERE status <> 'done'");
}

# The rows not delivered yet, for a failure's diagnostics.
sub outbox_rows
{
	return psql1(
		"SELECT tenant_id, id, topic, status, attempts, available_at, leased_by, last_error"
		  . " FROM idempotency.outbox WHERE status <> 'done'");
}

# What a connection made with exactly this DSN is: its role, whether it is a
# superuser, whether it is a member of idempotency_app, idempotency_worker.
sub role_of
{
	my ($conninfo) = @_;
	my ($out, $err);
	IPC::Run::run(
		[
			'psql', '-X', '-A', '-t', '-d', $conninfo, '-c',
			"SELECT current_user || ' super=' || rolsuper"
			  . " || ' app=' || pg_has_role('idempotency_app', 'MEMBER')"
			  . " || ' worker=' || pg_has_role('idempotency_worker', 'MEMBER')"
			  . ' FROM pg_roles WHERE rolname = current_user'
		],
		'>', \$out, '2>', \$err)
	  or die "psql -d '$conninfo': $err";
	chomp $out;
	return $out;
}

# run_payments_e2e(node => $node, dsn => ..., worker_dsn => ...,
#                  listen_dsn => ..., env => {...})
#
# $node holds the extension and examples/payments/schema.sql, roles.sql and
# scope.sql.  The service connects with dsn (default: straight to $node as
# payments_service), the workers with worker_dsn (default: straight to
# $node as payments_worker) and LISTEN on listen_dsn (default: worker_dsn);
# env is added to their environment.
sub run_payments_e2e
{
	my (%args) = @_;
	$node = $args{node};
	my $dsn = $args{dsn} // $node->connstr('postgres') . ' user=payments_service';
	my $worker_dsn = $args{worker_dsn}
	  // $node->connstr('postgres') . ' user=payments_worker';
	$logdir = $PostgreSQL::Test::Utils::log_path;
	my $service_port = PostgreSQL::Test::Cluster::get_free_port();
	my $provider_port = PostgreSQL::Test::Cluster::get_free_port();
	$service_url = "http://127.0.0.1:$service_port";
	my $provider_url = "http://127.0.0.1:$provider_port";
	$http = HTTP::Tiny->new(timeout => 10);

	# least privilege: neither program is a superuser
	is(role_of($dsn), 'payments_service super=false app=true worker=false',
		'the service logs in as a non-superuser granted idempotency_app');
	is(role_of($worker_dsn), 'payments_worker super=false app=false worker=true',
		'the workers log in as a non-superuser granted idempotency_worker');

	my %common = (PROVIDER_URL => $provider_url, %{ $args{env} // {} });
	my $provider = spawn('provider', { PROVIDER_PORT => $provider_port },
		$python, 'examples/payments/provider.py');
	my $service = spawn('service',
		{ %common, PAYMENTS_DSN => $dsn, PAYMENTS_PORT => $service_port,
		  PAYMENTS_PROCESSING_DELAY => '0.05',
		  # a request waits a second at most for a database connection:
		  # an outage is answered 503, and the clients retry
		  PAYMENTS_POOL_WAIT => 1 },
		$python, 'examples/payments/service.py');
	ok(wait_http("$provider_url/_ledger"), 'provider is up');
	ok(wait_http("$service_url/healthz"), 'service is up');

	# the coverage guard: a write path that skips the key is refused
	my ($rc, $out, $err) = $node->psql('postgres',
		"INSERT INTO payments.charges (tenant_id, idem_key, amount, currency, customer)"
		  . " VALUES ('acme', 'no-key', 1, 'EUR', 'cus_x')",
		extra_params => [ '-U', 'payments_service', '-v', 'VERBOSITY=verbose' ]);
	like($err, qr/ID001: INSERT into payments\.charges requires an idempotency reservation/,
		'an INSERT into payments.charges without a reserved key is refused (ID001)');
	is(psql1("SELECT count(*) FROM payments.charges WHERE idem_key = 'no-key'"),
		0, 'and nothing was written');
	is( $node->safe_psql('postgres',
			"SELECT guarded || ' ' || events::text || ' ' || scopes::text FROM idempotency.guard_coverage"
			  . " WHERE table_name = 'payments.charges'::regclass",
			extra_params => [ '-U', 'payments_ops' ]),
		'true {INSERT} {charges}',
		'the operator sees payments.charges guarded in idempotency.guard_coverage');
	$node->safe_psql('postgres',
		"BEGIN; SELECT idem_guard_bypass('e2e: the bypass is logged'); ROLLBACK;",
		extra_params => [ '-U', 'payments_ops' ]);
	ok( $node->log_contains(
			qr/coverage guard bypassed by role "payments_ops" \(session user "payments_ops"\): e2e: the bypass is logged/),
		'a bypass by the operator is written to the server log');

	# ---- single requests: the HTTP contract
	my $body = '{"amount": 12.50, "currency": "EUR", "customer": "cus_1"}';
	my $r = post_charge('tok_acme', undef, $body);
	is($r->{status}, 400, 'missing Idempotency-Key is 400');
	like($r->{headers}{'content-type'}, qr{application/problem\+json},
		'errors are problem+json');
	$r = post_charge(undef, 'single-1', $body);
	is($r->{status}, 401, 'no bearer token is 401');
	my $first = post_charge('tok_acme', 'single-1', $body);
	is($first->{status}, 201, 'first request creates the charge');
	my $again = post_charge('tok_acme', 'single-1',
		'{ "customer":"cus_1","currency":"EUR","amount":1.25e1 }');
	is($again->{status}, 201, 'retry with an equivalent body replays 201');
	is($again->{content}, $first->{content}, 'replayed body is identical');
	is($again->{headers}{'idempotent-replayed'}, 'true', 'replay is marked');
	is($again->{headers}{location}, $first->{headers}{location},
		'replay carries the stored headers');
	$r = post_charge('tok_acme', 'single-1',
		'{"amount": 13.00, "currency": "EUR", "customer": "cus_1"}');
	is($r->{status}, 422, 'same key, different body is 422');
	$r = post_charge('tok_globex', 'single-1', $body);
	is($r->{status}, 201, 'same key in another tenant is a new charge');
	isnt($r->{content}, $first->{content}, 'tenants never share a response');
	$r = post_charge('tok_acme', 'x' x 300, $body);
	is($r->{status}, 400, 'an over-long key is refused');
	$r = post_charge('tok_acme', 'single-2', '{"amount": "12.50", "currency": "EUR", "customer": "cus_1"}');
	is($r->{status}, 422, 'an amount that is not a number is refused');
	$r = post_charge('tok_acme', 'single-3', '[' x 5000 . ']' x 5000);
	is($r->{status}, 400, 'JSON nested too deep for the parser is 400');
	$r = post_charge('tok_acme', 'single-4',
		'{"amount": 1, "currency": "EUR", "customer": "cus_1", "pad": "' . ('x' x (1024 * 1024)) . '"}');
	is($r->{status}, 413, 'a request over idempotency.max_request_size is 413');
	# a key whose stored answer expired already made its charge: 409
	$r = post_charge('tok_acme', 'single-5', $body);
	is($r->{status}, 201, 'a charge whose answer will expire');
	psql1(q{UPDATE idempotency.keys SET expires_at = now() - interval '1 second'
	         WHERE tenant_id = 'acme' AND idem_key = 'single-5';
	        SELECT idem_reap()});
	$r = post_charge('tok_acme', 'single-5', $body);
	is($r->{status}, 409, 'its retry after the answer expired is 409, not a second charge');
	is(psql1(q{SELECT count(*) FROM payments.charges WHERE idem_key = 'single-5'}), '1',
		'one charge for the key');
	# the provider answered an attempt too late (the key was released),
	# then the same key comes with another body: the provider refuses it,
	# the client gets 422; the first body gets the provider's answer to it
	my $slow = '{"amount": 5, "currency": "EUR", "customer": "cus_slow"}';
	$r = post_charge('tok_acme', 'slow-1', $slow);
	is($r->{status}, 503, 'a provider answer too late is 503');
	$r = post_charge('tok_acme', 'slow-1', '{"amount": 6, "currency": "EUR", "customer": "cus_slow"}');
	is($r->{status}, 422, 'then another body with that key is 422, not 503');
	$r = post_charge('tok_acme', 'slow-1', $slow);
	is($r->{status}, 201, 'and the first body gets the authorization the provider made');

	# ---- concurrent retrying clients, some with a changed body
	my $s = loadtest(qw(--keys 24 --clients 4 --repeats 3 --mismatch-rate 0.3),
		qw(--prefix conc --deadline 60 --seed 7));
	my $changed = check_summary('concurrent clients', $s, 'conc');
	note('concurrent clients, answers by status: ', $json->encode($s->{statuses}));
	ok($changed > 0, 'some clients changed the body');
	ok(($s->{statuses}{409} // 0) > 0,
		'concurrent duplicates were answered 409 in_progress')
	  or diag(explain $s->{statuses});

	# ---- the worker is killed after the provider call, before the ack
	my %worker_env;
	$worker_env{WORKER_LISTEN_DSN} = $args{listen_dsn} if $args{listen_dsn};
	my $crashes = 0;
	my @slots = (undef, undef);
	my $deadline = time() + 90;
	while (time() < $deadline)
	{
		for my $i (0 .. $#slots)
		{
			if (defined $slots[$i])
			{
				my $w = waitpid($slots[$i], WNOHANG);
				next if $w == 0;
				$crashes++ if ($? & 127) == 9;
				$slots[$i] = undef;
			}
			# crash-prone workers until several crashes were seen, then clean ones
			my %env = (%common, %worker_env, PAYMENTS_DSN => $worker_dsn,
				WORKER_NAME => "w$i-$crashes",
				WORKER_LEASE => 2, WORKER_BATCH => 3);
			$env{WORKER_CRASH_AFTER_CALLS} = 2 if $crashes < 4;
			$slots[$i] = spawn("worker$i", \%env, $python,
				'examples/payments/worker.py');
		}
		last if $crashes >= 4 && outbox_open() == 0;
		sleep 0.3;
	}
	cmp_ok($crashes, '>=', 4, "workers were killed with SIGKILL $crashes times");
	note("workers killed: $crashes");
	is(outbox_open(), 0, 'every outbox row is done') or diag(outbox_rows());

	my $ledger = $json->decode($http->get("$provider_url/_ledger")->{content});
	my $ncharges = psql1('SELECT count(*) FROM payments.charges');
	is(scalar keys %{ $ledger->{captures} }, $ncharges,
		'the provider captured exactly one charge per charge row');
	my $redelivered = grep { $_ > 1 } values %{ $ledger->{calls} };
	ok($redelivered > 0,
		"$redelivered keys reached the provider more than once and were captured once");
	is( psql1(
			"SELECT count(*) FROM payments.charges WHERE status <> 'captured' OR provider_ref IS NULL"
		),
		0,
		'every charge is captured with the provider reference');
	my $refs = psql1(
		"SELECT string_agg(tenant_id || ':charges:' || idem_key || '=' || provider_ref, ',' ORDER BY 1) FROM payments.charges"
	);
	my $want = join(',',
		sort map { "$_=$ledger->{captures}{$_}{id}" } keys %{ $ledger->{captures} });
	is(join(',', sort split(/,/, $refs)), $want,
		'each charge row holds the capture the provider made for its key');

	# ---- immediate shutdown of the database in the middle of load
	my $lt_out = "$logdir/loadtest-crash.json";
	my $lt = fork();
	if ($lt == 0)
	{
		exec(
			"$python examples/payments/loadtest.py --url $service_url --keys 120 --clients 3 --repeats 2 --mismatch-rate 0.2 --prefix crash --deadline 90 --seed 11 > $lt_out"
		);
	}
	# stop the database once the load is under way, whatever the machine's
	# pace: a few of its charges are in, most are still to come
	my $until = time() + 30;
	sleep 0.1
	  while psql1("SELECT count(*) FROM payments.charges WHERE idem_key LIKE 'crash-%'") < 5
	  && time() < $until;
	$node->stop('immediate');
	sleep 1.0;
	$node->start;
	waitpid($lt, 0);
	is($?, 0, 'load test finished');
	$s = $json->decode(PostgreSQL::Test::Utils::slurp_file($lt_out));
	ok(($s->{statuses}{503} // 0) + ($s->{statuses}{'connection-error'} // 0) > 0,
		'clients saw the outage (503) and retried')
	  or diag(explain $s->{statuses});
	check_summary('immediate shutdown', $s, 'crash');
	note('immediate shutdown, answers by status: ', $json->encode($s->{statuses}));
	is( psql1(
			"SELECT count(*) FROM payments.charges c
			   LEFT JOIN idempotency.keys k
			     ON k.tenant_id = c.tenant_id AND k.scope = 'charges' AND k.idem_key = c.idem_key
			  WHERE k.status IS DISTINCT FROM 'succeeded'
			    -- its answer was expired and reaped on purpose, above
			    AND c.idem_key <> 'single-5'"),
		0,
		'no charge without a completed reservation');
	is( psql1(
			"SELECT count(*) FROM idempotency.keys k
			  WHERE k.scope = 'charges' AND NOT EXISTS (
			        SELECT 1 FROM payments.charges c
			         WHERE c.tenant_id = k.tenant_id AND c.idem_key = k.idem_key)"),
		0,
		'no completed reservation without its charge');

	# ---- fail closed: the database is down
	$node->stop('fast');
	$r = post_charge('tok_acme', 'while-down', $body);
	is($r->{status}, 503, 'database down: 503');
	like($r->{headers}{'content-type'}, qr{application/problem\+json},
		'503 is problem+json');
	ok(defined $r->{headers}{'retry-after'}, '503 carries Retry-After');
	$node->start;
	is( psql1(
			"SELECT count(*) FROM payments.charges WHERE idem_key = 'while-down'"),
		0,
		'nothing was charged while the database was down');
	# the client retries as told (Retry-After) while it is answered 503: a
	# pooler may take a moment to find the server again
	my $tries = 0;
	do
	{
		sleep($r->{headers}{'retry-after'} // 1) if $tries++;
		$r = post_charge('tok_acme', 'while-down', $body);
	} while ($r->{status} == 503 && $tries < 10);
	is($r->{status}, 201, 'the retry after recovery charges once');
	note("answered after $tries tries");
	is( psql1(
			"SELECT count(*) FROM payments.charges WHERE idem_key = 'while-down'"),
		1,
		'one charge for the key');

	# let the clean workers deliver what the outage left, then stop everything
	$deadline = time() + 60;
	sleep 0.3 while outbox_open() > 0 && time() < $deadline;
	is(outbox_open(), 0, 'outbox drained after the restart') or diag(outbox_rows());
	$ledger = $json->decode($http->get("$provider_url/_ledger")->{content});
	is( scalar keys %{ $ledger->{captures} },
		psql1('SELECT count(*) FROM payments.charges'),
		'provider captures match charges after the restart');

	# the operator, as payments_ops (idempotency_admin): maintenance and
	# health
	my @ops = (extra_params => [ '-U', 'payments_ops' ]);
	$node->safe_psql('postgres', 'CALL idem_maintain()', @ops);
	is( $node->safe_psql('postgres',
			"SELECT needs_reconciliation || '/' || outbox_pending || '/' || outbox_leased || '/' || outbox_dead FROM idempotency.health",
			@ops),
		'0/0/0/0',
		'the operator sees nothing to reconcile and an empty outbox');
	my $svclog = slurp_file("$logdir/service.log");
	like($svclog, qr/database role payments_service$/m,
		'the service reports its role');
	unlike($svclog, qr/WARNING: .* superuser/, 'and it is not a superuser');

	kill 'KILL', grep { defined } @slots, $service, $provider;
	waitpid($_, 0) for grep { defined } @slots, $service, $provider;
	return;
}

1;
