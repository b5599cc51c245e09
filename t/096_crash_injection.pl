# Crash injection: the example payments service under retrying load while
# crashes are injected one after another, each followed by recovery and
# verification:
#   - a backend killed with SIGKILL in the middle of an idem_reserve,
#     idem_complete, idem_checkpoint, outbox_claim or outbox_ack
#     transaction (held open at a known point with pg_sleep): the
#     postmaster then terminates every backend and runs crash recovery;
#   - an immediate shutdown of the server, then a start (crash recovery);
#   - an outbox worker killed with SIGKILL (after its provider call, before
#     its ack, when it got that far).
# After each crash: nothing the killed transaction did is visible, every
# reservation committed before it is still there, every answer acknowledged
# so far is still stored.  At the end: every acknowledged answer replays
# identically (0 lost), no key executed twice (0 doubles), every outbox row
# done (0 orphaned), and every two-phase key in flight at a crash ends
# taken over (and completed) or stale (and resolved by an operator), then
# replayed, its side effect performed once.
#
# IDEM_CRASHES sets the number of crashes (default 24; "make crash" runs more).
use strict;
use warnings;
use HTTP::Tiny;
use IPC::Run;
use JSON::PP;
use POSIX ":sys_wait_h";
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep time);
use IdemTest qw(new_idem_node);
use PaymentsHarness qw(have_psycopg install_payments spawn wait_http
  read_ack_log check_acknowledged check_outbox_and_provider ledger $python);

plan skip_all => "the example's Python packages are not installed (scripts/deps.sh)"
  unless have_psycopg();

my $crashes = $ENV{IDEM_CRASHES} || 24;
my $started = time();
my $logdir = $PostgreSQL::Test::Utils::log_path;
my $json = JSON::PP->new->canonical;
my $http = HTTP::Tiny->new(timeout => 10, keep_alive => 0);

my $node = new_idem_node(
	'crash',
	conf => "restart_after_crash = on\nmax_connections = 60\n"
	  . "shared_buffers = 16MB\n");
install_payments($node);
my $connstr = $node->connstr('postgres');

sub as_role
{
	my ($role, $sql) = @_;
	return $node->safe_psql('postgres', $sql, extra_params => [ '-U', $role ]);
}
my @app = ('payments_service');
my @worker = ('payments_worker');
my @ops = ('payments_ops');

# two-phase scopes, with a short lock_timeout so that an attempt that died
# is stale two seconds later: one hands it to the next attempt, the other
# flags it for an operator
as_role(@ops, q{
	SELECT idem_configure_scope('transfers', '{"lock_timeout": "2 seconds", "stale_action": "takeover"}');
	SELECT idem_configure_scope('refunds', '{"lock_timeout": "2 seconds", "stale_action": "fail"}')});

my $service_port = PostgreSQL::Test::Cluster::get_free_port();
my $provider_port = PostgreSQL::Test::Cluster::get_free_port();
my $service_url = "http://127.0.0.1:$service_port";
my $provider_url = "http://127.0.0.1:$provider_port";
my $provider = spawn('provider', { PROVIDER_PORT => $provider_port },
	$python, 'examples/payments/provider.py');
my $service = spawn(
	'service',
	{
		PAYMENTS_DSN => "$connstr user=payments_service",
		PAYMENTS_PORT => $service_port,
		PROVIDER_URL => $provider_url,
		PAYMENTS_PROCESSING_DELAY => '0.02'
	},
	$python,
	'examples/payments/service.py');
my %worker_env = (
	PAYMENTS_DSN => "$connstr user=payments_worker",
	PROVIDER_URL => $provider_url,
	WORKER_LEASE => 2,
	WORKER_BATCH => 3);
my $regular_worker = spawn('worker', { %worker_env, WORKER_NAME => 'w1' },
	$python, 'examples/payments/worker.py');
ok(wait_http("$provider_url/_ledger"), 'provider is up');
ok(wait_http("$service_url/healthz"), 'service is up');

# steady retrying load for the whole run
my $ack_log = "$logdir/crash-acks.jsonl";
my $summary = "$logdir/crash-loadtest.json";
my $load = spawn(
	'loadtest', {},
	'sh', '-c',
	"exec $python examples/payments/loadtest.py --url $service_url"
	  . ' --keys '
	  . ($crashes * 6)
	  . ' --clients 2 --repeats 2 --mismatch-rate 0.1 --spread '
	  . ($crashes * 2)
	  . " --deadline 600 --prefix load --seed 5 --ack-log $ack_log > $summary"
);

# ---- helpers

my @victim_acks;    # answers acknowledged to the test's own requests

# POST a charge through the service, retrying an outage like a client;
# the acknowledged answer is remembered.
sub charge
{
	my ($key, $request) = @_;
	my $deadline = time() + 30;
	while (time() < $deadline)
	{
		my $r = $http->post(
			"$service_url/v1/charges",
			{
				headers => {
					'Content-Type' => 'application/json',
					Authorization => 'Bearer tok_acme',
					'Idempotency-Key' => $key
				},
				content => $json->encode($request)
			});
		if ($r->{status} =~ /^2/)
		{
			push @victim_acks,
			  {
				tenant => 'acme',
				key => $key,
				request => $request,
				status => $r->{status},
				body => $r->{content}
			  };
			return $r;
		}
		return $r unless $r->{status} == 409 || $r->{status} >= 500;
		sleep 0.2;
	}
	return { status => 'timeout' };
}

sub provider_call
{
	my ($downstream_key, $payload) = @_;
	my $r = $http->post(
		"$provider_url/v1/captures",
		{
			headers => {
				'Content-Type' => 'application/json',
				'Idempotency-Key' => $downstream_key
			},
			content => $json->encode($payload)
		});
	die "provider: $r->{status} $r->{content}" unless $r->{success};
	return $json->decode($r->{content})->{id};
}

# Run "BEGIN; $sql; SELECT pg_sleep(60); COMMIT" as $role in the
# background, wait until it sleeps, and kill its backend with SIGKILL.
# Returns once the server has reinitialised and finished crash recovery.
sub kill_backend_during
{
	my ($name, $role, $sql) = @_;
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start(
		[
			'psql', '-X', '-A', '-t', '-v', 'ON_ERROR_STOP=1',
			'-d', "$connstr user=$role application_name=$name",
			'-c', "BEGIN; $sql; SELECT pg_sleep(60); COMMIT;"
		],
		'>', \$out, '2>', \$err);
	my $pid = '';
	my $deadline = time() + 60;
	while (time() < $deadline)
	{
		$pid = $node->safe_psql('postgres',
			"SELECT pid FROM pg_stat_activity WHERE application_name = '$name' AND wait_event = 'PgSleep'"
		);
		last if $pid ne '';
		$h->pump_nb;
		die "victim $name ended before its pause: $err" unless $h->pumpable;
		sleep 0.05;
	}
	die "victim $name never reached its pause" if $pid eq '';
	my $offset = -s $node->logfile;
	kill 'KILL', $pid;
	my $deadline2 = time() + 120;
	while (1)
	{
		last
		  if slurp_file($node->logfile, $offset) =~
		  /all server processes terminated; reinitializing.*database system is ready to accept connections/s;
		die "no crash recovery after killing $name" if time() > $deadline2;
		sleep 0.05;
	}
	$h->finish;
	# the victim was never told its transaction committed
	die "victim $name did not fail: $out" if $h->result == 0;
	return;
}

sub crash_immediate
{
	$node->stop('immediate');
	$node->start;
	return;
}

# every answer acknowledged so far is stored, as a finished key
sub acked_so_far_present
{
	my @acks = (read_ack_log($ack_log), @victim_acks);
	return (0, 0) unless @acks;
	my %seen;
	my @pairs = grep { !$seen{$_}++ }
	  map { "('$_->{tenant}', '$_->{key}')" } @acks;
	my $missing = $node->safe_psql('postgres',
		"SELECT count(*) FROM (VALUES "
		  . join(',', @pairs)
		  . ") a(t, k) WHERE NOT EXISTS (SELECT FROM idempotency.keys k WHERE k.tenant_id = a.t AND k.scope = 'charges' AND k.idem_key = a.k AND k.status = 'succeeded')"
	);
	return (scalar(@pairs), $missing);
}

sub key_row
{
	my ($scope, $key) = @_;
	return $node->safe_psql('postgres',
		"SELECT status || '|' || coalesce(recovery_point, '') FROM idempotency.keys WHERE tenant_id = 'acme' AND scope = '$scope' AND idem_key = '$key'"
	);
}

sub charge_request
{
	my ($i) = @_;
	return { amount => 10 + $i, currency => 'EUR', customer => "cus_v$i" };
}

# ---- the crashes
my @kinds = qw(reserve twophase_complete claim immediate complete
  twophase_checkpoint ack worker twophase_fail);
my (%injected, %recovered);
my @inflight;    # two-phase keys whose attempt died
my $lost_midway = 0;
my ($worker_self_killed, $worker_killed) = (0, 0);
my $effects = 0;    # outbox rows of topic crash.effect enqueued

for my $i (1 .. $crashes)
{
	my $kind = $kinds[ ($i - 1) % @kinds ];
	my $ok = 1;
	if ($kind eq 'reserve' || $kind eq 'complete')
	{
		# atomic flow: killed after the reservation, or after everything but
		# the COMMIT
		my $key = "victim-$i";
		my $req = charge_request($i);
		my $reqjson = $json->encode($req);
		my $sql =
		  "SELECT set_config('idempotency.tenant', 'acme', true); "
		  . "SELECT outcome FROM idem_reserve('acme', 'charges', '$key', '$reqjson')";
		$sql .=
		  "; WITH c AS (INSERT INTO payments.charges (tenant_id, idem_key, amount, currency, customer) VALUES ('acme', '$key', $req->{amount}, 'EUR', 'cus_v$i') RETURNING id) "
		  . "SELECT outbox_enqueue('acme', 'charge.capture', jsonb_build_object('charge_id', c.id, 'amount', '$req->{amount}', 'currency', 'EUR', 'customer', 'cus_v$i'), '$key', 'charges') FROM c; "
		  . "SELECT idem_complete('acme', 'charges', '$key', 201, '{\"victim\": $i}')"
		  if $kind eq 'complete';
		kill_backend_during("victim-$i", @app, $sql);
		$ok &&= is(
			$node->safe_psql('postgres',
				"SELECT (SELECT count(*) FROM idempotency.keys WHERE idem_key = '$key') || '/' || "
				  . "(SELECT count(*) FROM payments.charges WHERE idem_key = '$key') || '/' || "
				  . "(SELECT count(*) FROM idempotency.outbox WHERE idem_key = '$key')"),
			'0/0/0',
			"crash $i ($kind): nothing of the killed transaction survives");
		# the client retries with the same key: charged once, now
		my $r = charge($key, $req);
		$ok &&= is($r->{status}, 201,
			"crash $i ($kind): the retry after recovery is charged");
	}
	elsif ($kind =~ /^twophase_(checkpoint|complete|fail)$/)
	{
		# two-phase flow: the reservation commits alone, the provider is
		# called, a checkpoint records it, the completion is killed
		my $scope = $1 eq 'fail' ? 'refunds' : 'transfers';
		my $key = "tp-$i";
		my $req = { amount => $i, to => "acct_$i" };
		my $reqjson = $json->encode($req);
		my $r = as_role(@app,
			"SELECT outcome || '|' || lock_token FROM idem_reserve('acme', '$scope', '$key', '$reqjson')"
		);
		my ($outcome, $token) = split /\|/, $r;
		die "reserve $key: $r" unless $outcome eq 'created';
		my $entry = {
			scope => $scope,
			key => $key,
			request => $req,
			token => $token,
			kind => $kind
		};
		if ($1 eq 'checkpoint')
		{
			# killed while recording that the provider call starts
			kill_backend_during("victim-$i", @app,
				"SELECT idem_checkpoint('acme', '$scope', '$key', 'calling', '$token')"
			);
			$entry->{recovery_point} = '';
		}
		else
		{
			my $cap = provider_call("acme:$scope:$key", $req);
			as_role(@app,
				"SELECT idem_checkpoint('acme', '$scope', '$key', 'captured:$cap', '$token')"
			);
			kill_backend_during("victim-$i", @app,
				"SELECT idem_complete('acme', '$scope', '$key', 201, '{\"capture\": \"$cap\"}', NULL, '$token')"
			);
			$entry->{recovery_point} = "captured:$cap";
		}
		# the committed reservation and checkpoint survived, the completion
		# did not
		$ok &&= is(key_row($scope, $key), "processing|$entry->{recovery_point}",
			"crash $i ($kind): the committed reservation and checkpoint survive, the killed step does not"
		);
		push @inflight, $entry;
	}
	elsif ($kind eq 'claim' || $kind eq 'ack')
	{
		# side effects of topic crash.effect, which only this test delivers
		my $n = $kind eq 'claim' ? 3 : 2;
		as_role(@app,
			"SELECT count(outbox_enqueue('acme', 'crash.effect', jsonb_build_object('n', g), 'fx-$i-' || g, 'effects')) FROM generate_series(1, $n) g"
		);
		$effects += $n;
		if ($kind eq 'claim')
		{
			kill_backend_during("victim-$i", @worker,
				"SELECT count(*) FROM outbox_claim('victim-$i', 10, '30 seconds', ARRAY['crash.effect'])"
			);
			$ok &&= is(
				$node->safe_psql('postgres',
					"SELECT count(*) FROM idempotency.outbox WHERE leased_by = 'victim-$i' OR (idem_key LIKE 'fx-$i-%' AND status <> 'pending')"
				),
				0,
				"crash $i ($kind): the killed claim leased nothing");
		}
		else
		{
			# the claim commits, the provider performs the effects, the ack
			# is killed: the rows stay leased until their lease expires
			my @rows = map { [ split /\|/ ] } split /\n/,
			  as_role(@worker,
				"SELECT tenant_id, id, lease_token, idem_scope || ':' || idem_key, payload FROM outbox_claim('victim-$i', 10, '3 seconds', ARRAY['crash.effect'])"
			  );
			my @acks;
			for my $row (@rows)
			{
				my ($t, $id, $lt, $k, $payload) = @$row;
				my $ref = provider_call("$t:$k", $json->decode($payload));
				push @acks, "SELECT outbox_ack('$t', $id, '$lt', '$ref')";
			}
			kill_backend_during("victim-$i", @worker, join('; ', @acks));
			my $ids = join(',', map { $_->[1] } @rows);
			$ok &&= is(
				$node->safe_psql('postgres',
					"SELECT count(*) FROM idempotency.outbox WHERE id IN ($ids) AND status = 'leased' AND leased_by = 'victim-$i'"
				),
				scalar(@rows),
				"crash $i ($kind): the killed ack left its rows leased, not done");
		}
	}
	elsif ($kind eq 'immediate')
	{
		crash_immediate();
	}
	elsif ($kind eq 'worker')
	{
		# a worker that kills itself with SIGKILL right after its first
		# provider call, before the ack (the regular worker is paused
		# meanwhile, so that the new charges are left to it); killed from
		# outside if it found nothing to deliver in time
		kill 'STOP', $regular_worker;
		my $pid = spawn("worker-crash-$i",
			{ %worker_env, WORKER_NAME => "crashy-$i", WORKER_CRASH_AFTER_CALLS => 1 },
			$python, 'examples/payments/worker.py');
		charge("wk-$i-$_", charge_request(1000 + $i * 10 + $_)) for 1 .. 3;
		my $deadline = time() + 10;
		my $w = 0;
		while (time() < $deadline)
		{
			$w = waitpid($pid, WNOHANG);
			last if $w;
			sleep 0.05;
		}
		if ($w)
		{
			$worker_self_killed++ if ($? & 127) == 9;
		}
		else
		{
			kill 'KILL', $pid;
			waitpid($pid, 0);
		}
		kill 'CONT', $regular_worker;
		$worker_killed++;
	}
	$injected{$kind}++;

	# after every crash: all acknowledged so far is there
	my ($npairs, $missing) = acked_so_far_present();
	$lost_midway += $missing;
	$ok &&= is($missing, 0,
		"crash $i ($kind): all $npairs keys acknowledged so far are stored");
	$recovered{$kind}++ if $ok;
}

# ---- end of the load
waitpid($load, 0);
is($?, 0, 'the load client finished');
my $s = $json->decode(slurp_file($summary));
note('load answers by status: ', $json->encode($s->{statuses}));
is_deeply($s->{errors}, [], 'every load key got a final answer');
my $bad = 0;
for my $k (sort keys %{ $s->{keys} })
{
	my @f = @{ $s->{keys}{$k}{final} };
	next if @f == 1 && $json->decode($f[0])->[0] == 201;
	$bad++;
	diag("$k: final answers @f");
}
is($bad, 0, 'retries converged: one identical 201 per load key');

# ---- the two-phase keys whose attempt died: the next attempt, after the
# scope's lock_timeout, takes over (transfers) or is told the key is stale
# and an operator resolves it (refunds); then the key replays
my %ended = (taken_over => 0, stale_resolved => 0, replayed => 0, fenced => 0);
my @bad_inflight;
my @tp_acks;
for my $e (@inflight)
{
	my ($scope, $key, $req) = @$e{qw(scope key request)};
	my $reqjson = $json->encode($req);
	my ($outcome, $token, $rp);
	my $deadline = time() + 30;
	while (1)
	{
		my $r = as_role(@app,
			"SELECT outcome || '|' || coalesce(lock_token::text, '') || '|' || coalesce(recovery_point, '') FROM idem_reserve('acme', '$scope', '$key', '$reqjson')"
		);
		($outcome, $token, $rp) = split /\|/, $r, 3;
		$rp //= '';
		last unless $outcome eq 'in_progress' && time() < $deadline;
		sleep 0.5;
	}
	my $body;
	if ($scope eq 'transfers' && $outcome eq 'created' && $rp eq $e->{recovery_point})
	{
		# the recovery point says whether the provider was already called
		my $cap = $rp =~ /^captured:(.*)/ ? $1 : provider_call("acme:$scope:$key", $req);
		as_role(@app,
			"SELECT idem_checkpoint('acme', '$scope', '$key', 'captured:$cap', '$token')")
		  if $rp eq '';
		$body = "{\"capture\": \"$cap\"}";
		as_role(@app,
			"SELECT idem_complete('acme', '$scope', '$key', 201, '$body', NULL, '$token')"
		);
		$ended{taken_over}++;
		# the dead attempt's token no longer completes anything
		my ($rc, $out, $err) = $node->psql('postgres',
			"SELECT idem_complete('acme', '$scope', '$key', 201, '{}', NULL, '$e->{token}')",
			extra_params => [ '-U', 'payments_service', '-v', 'VERBOSITY=verbose' ]);
		$ended{fenced}++ if $rc != 0 && $err =~ /ERROR:  55006: lock_token does not match/;
	}
	elsif ($scope eq 'refunds' && $outcome eq 'stale' && $rp eq $e->{recovery_point})
	{
		# the operator reconciles with the provider and stores the outcome
		my $l = ledger($provider_url);
		my $cap = $l->{captures}{"acme:$scope:$key"}{id};
		$body = "{\"capture\": \"$cap\"}";
		as_role(@ops,
			"SELECT idem_resolve('acme', '$scope', '$key', 201, '$body')");
		$ended{stale_resolved}++;
	}
	else
	{
		push @bad_inflight, "$key: $outcome (recovery point '$rp')";
		next;
	}
	my $replay = as_role(@app,
		"SELECT outcome || '|' || response_code || '|' || response_body FROM idem_reserve('acme', '$scope', '$key', '$reqjson')"
	);
	if ($replay eq "replay|201|$body")
	{
		$ended{replayed}++;
	}
	else
	{
		push @bad_inflight, "$key: replay answered $replay";
	}
}
is_deeply(\@bad_inflight, [],
	'every two-phase key in flight at a crash was taken over or flagged stale, then replayed'
);
is($ended{fenced}, $ended{taken_over},
	'the token of every dead attempt is fenced out after the takeover (55006)');
my $l = ledger($provider_url);
my @tp_twice = grep { $l->{calls}{"acme:$_->{scope}:$_->{key}"} != 1 } @inflight;
is(scalar(@tp_twice), 0,
	'the recovery points kept each two-phase side effect to one provider call');

# ---- deliver the crash.effect rows (leases of killed claims expire first)
my $deadline = time() + 60;
while (time() < $deadline)
{
	my @rows = map { [ split /\|/ ] } split /\n/,
	  as_role(@worker,
		"SELECT tenant_id, id, lease_token, idem_scope || ':' || idem_key, payload FROM outbox_claim('drain', 50, '10 seconds', ARRAY['crash.effect'])"
	  );
	for my $row (@rows)
	{
		my ($t, $id, $lt, $k, $payload) = @$row;
		my $ref = provider_call("$t:$k", $json->decode($payload));
		as_role(@worker, "SELECT outbox_ack('$t', $id, '$lt', '$ref')");
	}
	last
	  if $node->safe_psql('postgres',
		"SELECT count(*) FROM idempotency.outbox WHERE topic = 'crash.effect' AND status <> 'done'"
	  ) == 0;
	sleep 0.3;
}
$l = ledger($provider_url);
my @fx = split /\n/,
  $node->safe_psql('postgres',
	"SELECT tenant_id || ':effects:' || idem_key FROM idempotency.outbox WHERE topic = 'crash.effect'"
  );
is(scalar(@fx), $effects, 'every crash.effect row is still there');
is(scalar(grep { $l->{captures}{$_} } @fx),
	$effects, 'every crash.effect reached the provider');
my $fx_redelivered = grep { $l->{calls}{$_} > 1 } @fx;

# ---- the verdict
my @acks = (read_ack_log($ack_log), @victim_acks);
my ($nkeys, $lost, $doubles) =
  check_acknowledged('after the crashes', $service_url, @acks);
my $ncharges = $node->safe_psql('postgres', 'SELECT count(*) FROM payments.charges');
is( $node->safe_psql('postgres',
		'SELECT count(DISTINCT (tenant_id, idem_key)) FROM payments.charges'),
	$ncharges,
	'one charge per key');
is( $node->safe_psql('postgres', q{
		SELECT count(*) FROM payments.charges c
		  FULL JOIN (SELECT * FROM idempotency.keys WHERE scope = 'charges') k
		    ON k.tenant_id = c.tenant_id AND k.idem_key = c.idem_key
		 WHERE c.id IS NULL OR k.status IS DISTINCT FROM 'succeeded'}),
	0,
	'every charge has its completed key, every completed key its charge');
my ($captures, $redelivered) =
  check_outbox_and_provider('after the crashes', $node, $provider_url, 60);
my $orphans = $node->safe_psql('postgres',
	"SELECT count(*) FROM idempotency.outbox WHERE status <> 'done'");
is($orphans, 0, 'no outbox row orphaned, none dead');
my $svclog = slurp_file("$logdir/service.log");
my $unique_violations = () = $svclog =~ /database error 23505/g;
is($unique_violations, 0, 'the service never executed a key twice');
as_role(@ops, 'CALL idem_maintain()');
is( as_role(@ops,
		"SELECT processing || '/' || needs_reconciliation || '/' || outbox_dead FROM idempotency.health"
	),
	'0/0/0',
	'nothing left processing, to reconcile or dead');

my $ninjected = 0;
$ninjected += $_ for values %injected;
my $nrecovered = 0;
$nrecovered += $_ for values %recovered;
is($ninjected, $crashes, "$crashes crashes injected");
is($nrecovered, $ninjected, 'and recovered from, verified each time');

kill 'KILL', $regular_worker, $service, $provider;
waitpid($_, 0) for $regular_worker, $service, $provider;

diag(
	sprintf(
		"crashes: %d injected (%s), %d recovered; %d answers acknowledged "
		  . "(%d keys), lost: %d, doubles: %d, orphaned outbox rows: %d; "
		  . "two-phase in flight: %d (taken over %d, old token fenced %d, "
		  . "stale and resolved %d, replayed %d); workers killed %d (%d after "
		  . "a provider call); "
		  . "%d charges, %d captures; run %.0fs",
		$ninjected,
		join(', ', map { "$_ $injected{$_}" } sort keys %injected),
		$nrecovered, scalar(@acks), $nkeys, $lost + $lost_midway, $doubles,
		$orphans, scalar(@inflight), $ended{taken_over}, $ended{fenced},
		$ended{stale_resolved}, $ended{replayed}, $worker_killed,
		$worker_self_killed, $ncharges, $captures, time() - $started));

$node->stop;
done_testing();
