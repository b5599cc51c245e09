# The reconciliation job of the example payments service
# (examples/payments/reconcile.py), logged in as payments_ops: each kind of
# discrepancy is created on purpose and the job must find exactly it.
#   uncaptured              a charge accepted while no worker ran: its outbox
#                           row is pending and the provider never captured it
#   capture_without_charge  a capture made at the provider under a key of the
#                           charges scope that has no charge
#   resolved                a two-phase attempt (reservation and charge
#                           committed, provider called) that died before
#                           idem_complete, flagged needs_reconciliation: the
#                           provider proves the capture, the job resolves the
#                           key with idem_resolve and the client's retry
#                           replays
#   unresolved              a flagged key the provider has no record of:
#                           reported, left for an operator
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use HTTP::Tiny;
use JSON::PP;
use Time::HiRes qw(sleep time);
use IdemTest qw(new_idem_node);
use PaymentsHarness qw(have_psycopg install_payments spawn wait_http ledger $python);

plan skip_all => "the example's Python packages are not installed (scripts/deps.sh)"
  unless have_psycopg();

my $json = JSON::PP->new->canonical;
my $http = HTTP::Tiny->new(timeout => 10, keep_alive => 0);

my $node = new_idem_node('reconcile');
install_payments($node);
my $connstr = $node->connstr('postgres');

my $service_port = PostgreSQL::Test::Cluster::get_free_port();
my $provider_port = PostgreSQL::Test::Cluster::get_free_port();
my $service_url = "http://127.0.0.1:$service_port";
my $provider_url = "http://127.0.0.1:$provider_port";

spawn('provider', { PROVIDER_PORT => $provider_port },
	$python, 'examples/payments/provider.py');
spawn('service',
	{
		PAYMENTS_DSN => "$connstr user=payments_service",
		PAYMENTS_PORT => $service_port,
		PROVIDER_URL => $provider_url
	},
	$python, 'examples/payments/service.py');
ok(wait_http("$provider_url/_ledger"), 'provider is up');
ok(wait_http("$service_url/healthz"), 'service is up');

sub ops
{
	my ($sql) = @_;
	return $node->safe_psql('postgres', $sql, extra_params => [ '-U', 'payments_ops' ]);
}

sub post_charge
{
	my ($key, $body) = @_;
	return $http->post("$service_url/v1/charges",
		{
			headers => {
				'Content-Type' => 'application/json',
				Authorization => 'Bearer tok_acme',
				'Idempotency-Key' => $key
			},
			content => $body
		});
}

sub capture_at_provider
{
	my ($provider_key, $body) = @_;
	my $r = $http->post("$provider_url/v1/captures",
		{
			headers => {
				'Content-Type' => 'application/json',
				'Idempotency-Key' => $provider_key
			},
			content => $body
		});
	die "capture: $r->{status} $r->{content}" unless $r->{success};
	return $json->decode($r->{content})->{id};
}

# Run the job once; returns (exit status, output lines).
sub reconcile
{
	my (%env) = @_;
	local %ENV = (%ENV, PAYMENTS_OPS_DSN => "$connstr user=payments_ops",
		PROVIDER_URL => $provider_url, %env);
	my $out = `$python examples/payments/reconcile.py 2>&1`;
	my $rc = $? >> 8;
	note("reconcile.py (exit $rc):\n$out");
	return ($rc, split /\n/, $out);
}

# The items of a report as "kind tenant scope key", sorted.
sub items
{
	return sort map { /^(\w+ \S+ \S+ \S+): / ? $1 : () } grep { !/^summary:/ } @_;
}

sub run_worker_until_drained
{
	my ($label) = @_;
	my $pid = spawn('worker',
		{
			PAYMENTS_DSN => "$connstr user=payments_worker",
			PROVIDER_URL => $provider_url,
			WORKER_NAME => 'reconcile-worker'
		},
		$python, 'examples/payments/worker.py');
	my $deadline = time() + 30;
	my $open;
	while (1)
	{
		$open = ops("SELECT count(*) FROM idempotency.outbox WHERE status <> 'done'");
		last if $open == 0 || time() > $deadline;
		sleep 0.2;
	}
	is($open, 0, "$label: the worker delivered the outbox");
	kill 'KILL', $pid;
	waitpid($pid, 0);
	return;
}

# ---- a charge that went through: charged, captured, nothing to report
my $r = post_charge('ok-1', '{"amount": 10.00, "currency": "EUR", "customer": "cus_1"}');
is($r->{status}, 201, 'ok-1 charged');
run_worker_until_drained('ok-1');

# ---- (1) uncaptured: the service accepts a charge while no worker runs
$r = post_charge('uncap-1', '{"amount": 20.00, "currency": "EUR", "customer": "cus_2"}');
is($r->{status}, 201, 'uncap-1 charged, no worker running');

# ---- (2) a capture with no charge: the provider called directly
my $ghost_cap = capture_at_provider('acme:charges:ghost-1',
	'{"amount": "5.00", "currency": "EUR", "customer": "cus_9"}');

# ---- (3) a two-phase attempt that died after the provider captured: the
# reservation and the charge committed first, the provider was called, and
# idem_complete never ran
my $flag_body = '{"amount": 30.00, "currency": "EUR", "customer": "cus_3"}';
$node->safe_psql('postgres', qq{
	BEGIN;
	SELECT set_config('idempotency.tenant', 'acme', true);
	SELECT outcome FROM idem_reserve('acme', 'charges', 'flag-cap', '$flag_body');
	INSERT INTO payments.charges (tenant_id, idem_key, amount, currency, customer)
	VALUES ('acme', 'flag-cap', 30.00, 'EUR', 'cus_3');
	COMMIT;
}, extra_params => [ '-U', 'payments_service' ]);
my $flag_cap = capture_at_provider('acme:charges:flag-cap',
	'{"amount": "30.00", "currency": "EUR", "customer": "cus_3"}');

# ---- (4) a two-phase attempt that died before calling the provider
$node->safe_psql('postgres', q{
	BEGIN;
	SELECT set_config('idempotency.tenant', 'acme', true);
	SELECT outcome FROM idem_reserve('acme', 'charges', 'flag-nocap',
		'{"amount": 40.00, "currency": "EUR", "customer": "cus_4"}');
	COMMIT;
}, extra_params => [ '-U', 'payments_service' ]);

# Before the keys are flagged and within the grace period, the job reports
# only the capture without a charge: the young charge and the reservations
# are in flight.
my ($rc, @out) = reconcile();
is($rc, 1, 'in flight: the job exits 1');
is_deeply([ items(@out) ], ['capture_without_charge acme charges ghost-1'],
	'in flight: only the capture without a charge is reported');
like((grep { /ghost-1/ } @out)[0], qr/captured \Q$ghost_cap\E/,
	'its line names the provider\'s capture');

# ---- the sweeper flags the stale reservations
sleep 1.2;
is(ops("SELECT idem_sweep('1 second')"), 2, 'idem_sweep flags the two dead attempts');
is(ops('SELECT needs_reconciliation FROM idempotency.health'),
	2, 'health: two keys need reconciliation');
$r = post_charge('flag-cap', $flag_body);
is($r->{status}, 409, 'before reconciliation, the retry of flag-cap is 409 (stale)');

# ---- the job finds each discrepancy and resolves the proven key
($rc, @out) = reconcile(RECONCILE_GRACE => 0);
is($rc, 1, 'the job exits 1: discrepancies remain');
is_deeply(
	[ items(@out) ],
	[
		'capture_without_charge acme charges ghost-1',
		'resolved acme charges flag-cap',
		'uncaptured acme charges uncap-1',
		'unresolved acme charges flag-nocap',
	],
	'each discrepancy is found, once, and nothing else');
is( (grep { /^summary:/ } @out)[0],
	'summary: uncaptured 1, capture_without_charge 1, resolved 1, unresolved 1; unexplained 3',
	'summary counts');
like((grep { /uncap-1/ } @out)[0], qr/outbox row \d+ pending, 0 attempt/,
	'the uncaptured charge\'s line shows its pending outbox row');
like((grep { /flag-nocap/ } @out)[0], qr/no capture under this key \(0 call/,
	'the unproven key\'s line says the provider never saw it');
like((grep { /flag-cap/ } @out)[0], qr/captured \Q$flag_cap\E/,
	'the resolved key\'s line names the capture');

# (idem_lookup is the application's: looked up here as the superuser)
is( $node->safe_psql('postgres',
		"SELECT status || ' ' || needs_reconciliation || ' ' || response_code"
		  . " FROM idem_lookup('acme', 'charges', 'flag-cap')"),
	'succeeded false 201',
	'flag-cap: succeeded, no longer flagged, 201 stored');
is( $node->safe_psql('postgres',
		"SELECT status || ' ' || needs_reconciliation"
		  . " FROM idem_lookup('acme', 'charges', 'flag-nocap')"),
	'processing true',
	'flag-nocap: still processing and flagged, for an operator');
is(ops('SELECT needs_reconciliation FROM idempotency.health'),
	1, 'health: one key left to reconcile');
my $charge = ops(
	"SELECT 'ch_' || id || ' ' || status || ' ' || provider_ref FROM payments.charges"
	  . " WHERE tenant_id = 'acme' AND idem_key = 'flag-cap'");
is($charge =~ s/^\S+ //r, "captured $flag_cap",
	'flag-cap\'s charge is marked captured with the provider\'s reference');
is(ops("SELECT count(*) FROM payments.charges WHERE idem_key IN ('ghost-1', 'flag-nocap')"),
	0, 'the job invented no charge');

$r = post_charge('flag-cap', $flag_body);
is($r->{status}, 201, 'the client\'s retry of flag-cap is answered 201');
is($r->{headers}{'idempotent-replayed'}, 'true', '... replayed');
my $replayed = $json->decode($r->{content});
is("$replayed->{id} $replayed->{status}", ($charge =~ /^(\S+)/)[0] . ' captured',
	'... with the charge the provider captured');
is(ops("SELECT count(*) FROM payments.charges WHERE idem_key = 'flag-cap'"),
	1, 'and no second charge');

# ---- the job is safe to run again: what it resolved stays resolved
($rc, @out) = reconcile(RECONCILE_GRACE => 0);
is($rc, 1, 'second run exits 1');
is_deeply(
	[ items(@out) ],
	[
		'capture_without_charge acme charges ghost-1',
		'uncaptured acme charges uncap-1',
		'unresolved acme charges flag-nocap',
	],
	'second run: the same discrepancies, nothing resolved twice');

# ---- the worker delivers the pending charge: it is no longer reported
run_worker_until_drained('uncap-1');
($rc, @out) = reconcile(RECONCILE_GRACE => 0);
is_deeply(
	[ items(@out) ],
	[ 'capture_without_charge acme charges ghost-1', 'unresolved acme charges flag-nocap' ],
	'after delivery, the captured charge is no longer reported');
my $ledger = ledger($provider_url);
is($ledger->{calls}{'acme:charges:flag-cap'}, 1,
	'the provider was never called again for the resolved key');

# ---- an operator settles what the job could not; then nothing is unexplained
ops("SELECT idem_resolve('acme', 'charges', 'flag-nocap', 502,"
	  . " '{\"title\": \"The charge was never made\"}')");
# (as payments_ops, the example's operator role: it may record a charge)
ops(q{
	BEGIN;
	SELECT idem_guard_bypass('reconciliation: record the capture ghost-1');
	INSERT INTO payments.charges (tenant_id, idem_key, amount, currency, customer, status)
	VALUES ('acme', 'ghost-1', 5.00, 'EUR', 'cus_9', 'captured');
	COMMIT;
});
($rc, @out) = reconcile(RECONCILE_GRACE => 0);
is($rc, 0, 'once everything is explained, the job exits 0');
is((grep { /^summary:/ } @out)[0],
	'summary: uncaptured 0, capture_without_charge 0, resolved 0, unresolved 0; unexplained 0',
	'and reports nothing');

# ---- a two-phase attempt that wrote its charge and died before calling
# the provider: its key is unresolved; the operator resolves the key and
# deletes the charge that was never made (its charge would be uncaptured
# once the key is settled)
$node->safe_psql('postgres', q{
	BEGIN;
	SELECT set_config('idempotency.tenant', 'acme', true);
	SELECT outcome FROM idem_reserve('acme', 'charges', 'flag-nocall',
		'{"amount": 7.00, "currency": "EUR", "customer": "cus_7"}');
	INSERT INTO payments.charges (tenant_id, idem_key, amount, currency, customer)
	VALUES ('acme', 'flag-nocall', 7.00, 'EUR', 'cus_7');
	COMMIT;
}, extra_params => [ '-U', 'payments_service' ]);
sleep(1.2);
is(ops("SELECT idem_sweep('1 second')"), 1, 'idem_sweep flags the attempt');
($rc, @out) = reconcile(RECONCILE_GRACE => 0);
is_deeply([ $rc, items(@out) ], [ 1, 'unresolved acme charges flag-nocall' ],
	'its key is unresolved (its charge waits on the key)');
ops(q{
	BEGIN;
	SELECT idem_resolve('acme', 'charges', 'flag-nocall', 502, '{"title": "The charge was never made"}');
	DELETE FROM payments.charges WHERE tenant_id = 'acme' AND idem_key = 'flag-nocall';
	COMMIT;
});
($rc, @out) = reconcile(RECONCILE_GRACE => 0);
is($rc, 0, 'settled by payments_ops, the job exits 0 again');

# ---- the job cannot run: exit 2
($rc, @out) = reconcile(PROVIDER_URL => 'http://127.0.0.1:1');
is($rc, 2, 'provider unreachable: exit 2');

$node->stop;
done_testing();
