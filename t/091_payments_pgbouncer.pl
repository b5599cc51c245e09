# The example payments service behind PgBouncer in transaction pooling mode:
# first what needs care (README, "Behind PgBouncer"), shown on a pool of one
# server connection where what a client leaves behind is certain to meet the
# next client, then the whole end-to-end test of t/090 (t/lib/PaymentsE2E.pm)
# with the service and the workers connected through PgBouncer and the
# workers' LISTEN straight to the server.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(sleep);
use IdemTest qw(new_idem_node);
use PaymentsE2E qw(run_payments_e2e payments_skip_reason);
use PaymentsHarness qw(install_payments);
use PgBouncer;

my $skip = payments_skip_reason();
$skip //= 'pgbouncer is not installed' unless PgBouncer::find_pgbouncer();
$skip //= 'DBD::Pg is not installed' unless eval { require DBD::Pg; 1 };
plan skip_all => $skip if $skip;
require DBI;

my $node = new_idem_node('bouncer', conf => "listen_addresses = '127.0.0.1'\n");
install_payments($node);
$node->safe_psql('postgres',
	PostgreSQL::Test::Utils::slurp_file('clients/setup.sql'));
my $bouncer = PgBouncer->new($node,
	users => [qw(client_app client_worker payments_service payments_worker)]);
my ($major, $minor) = PgBouncer::version();
note("PgBouncer $major.$minor");

# A DBI handle as $user to database $db: through PgBouncer ("postgres", or
# "postgres_one" for the pool of one server connection) or, with $db
# "direct", straight to the server.
sub dbh
{
	my ($db, $user) = @_;
	my $dsn = $db eq 'direct'
	  ? 'dbi:Pg:host=127.0.0.1;port=' . $node->port . ';dbname=postgres'
	  : 'dbi:Pg:host=127.0.0.1;port=' . $bouncer->port . ";dbname=$db";
	return DBI->connect($dsn, $user, '',
		{ RaiseError => 1, PrintError => 0, AutoCommit => 1, pg_switch_prepared => 0 });
}

my $n = 0;
sub reserve
{
	my ($dbh, $tenant) = @_;
	$n++;
	return scalar $dbh->selectrow_array(
		'SELECT outcome FROM idem_reserve(?, ?, ?, ?)', undef,
		$tenant, 'orders', "bouncer-$n", '{"n": ' . $n . '}');
}

# ---- SET leaks to the next client; SET LOCAL ends with the transaction
{
	my $a = dbh('postgres_one', 'client_app');
	my $b = dbh('postgres_one', 'client_app');
	$a->do(q{SET idempotency.tenant = 'acme'});
	is($b->selectrow_array('SHOW idempotency.tenant'), 'acme',
		'SET without LOCAL stays on the server connection: the next client acts for its tenant');
	eval { reserve($b, 'globex') };
	is($b->state, '42501', "... and is refused its own tenant (42501)");
	$a->do('RESET idempotency.tenant');

	$a->begin_work;
	$a->do(q{SET LOCAL idempotency.tenant = 'acme'});
	is(reserve($a, 'acme'), 'created', 'SET LOCAL idempotency.tenant, then reserve');
	$a->commit;
	is($b->selectrow_array('SHOW idempotency.tenant'), '',
		'SET LOCAL ends with the transaction: nothing is left for the next client');
	is(reserve($b, 'globex'), 'created', '... which acts for its own tenant');
	$_->disconnect for $a, $b;
}

# ---- server-side prepared statements (psycopg prepares a statement on its
# fifth execution): PgBouncer before 1.21 does not carry them across
# transactions, so two clients' statements meet on one server connection
{
	my $dsn = $bouncer->connstr('postgres_one', 'client_app');
	my $prog = <<'PY';
import sys, psycopg
dsn, threshold = sys.argv[1], sys.argv[2]
kwargs = {} if threshold == "default" else {"prepare_threshold": None}
conns = [psycopg.connect(dsn, autocommit=True, **kwargs) for _ in range(2)]
try:
    for conn in conns:
        for _ in range(6):
            conn.execute("SELECT count(*) FROM idem_lookup(%s, %s, %s)",
                         ("acme", "orders", "nothing"))
    print("ok")
except psycopg.Error as e:
    print(e.sqlstate)
PY
	my %out;
	for my $threshold ('default', 'none')
	{
		IPC::Run::run([ '/usr/bin/python3', '-c', $prog, $dsn, $threshold ],
			'>', \$out{$threshold}, '2>&1', IPC::Run::timeout(60));
		chomp $out{$threshold};
	}
	if ($major * 100 + $minor < 121)
	{
		is($out{default}, '42P05',
			"PgBouncer $major.$minor: psycopg's prepared statements collide on a shared server connection (42P05)");
	}
	else
	{
		is($out{default}, 'ok',
			"PgBouncer $major.$minor (max_prepared_statements): psycopg's prepared statements work");
	}
	is($out{none}, 'ok', 'prepare_threshold=None: no server-side prepared statement, works');
}

# ---- the claim and its lease are transaction-scoped: claim through one
# client, ack through another; two claimers never get the same row
{
	my $app = dbh('postgres', 'client_app');
	$app->begin_work;
	reserve($app, 'acme');
	my @ids = map {
		scalar $app->selectrow_array(
			q{SELECT outbox_enqueue('acme', 'bouncer.demo', ?)}, undef, qq({"row": $_}))
	} 1 .. 2;
	$app->commit;
	my ($w1, $w2, $w3) = map { dbh('postgres', 'client_worker') } 1 .. 3;
	$w1->begin_work;
	$w2->begin_work;
	my $c1 = $w1->selectall_arrayref(
		q{SELECT id, lease_token FROM outbox_claim('w1', batch => 1, topics => '{bouncer.demo}')},
		{ Slice => {} });
	my $c2 = $w2->selectall_arrayref(
		q{SELECT id, lease_token FROM outbox_claim('w2', batch => 1, topics => '{bouncer.demo}')},
		{ Slice => {} });
	$w1->commit;
	$w2->commit;
	is_deeply([ sort { $a <=> $b } map { $_->[0]{id} } $c1, $c2 ], [ sort { $a <=> $b } @ids ],
		'two concurrent claims through PgBouncer lease different rows');
	# another client, most likely another server connection
	$w3->do(q{SELECT outbox_ack('acme', ?, ?)}, undef, $_->[0]{id}, $_->[0]{lease_token})
	  for $c1, $c2;
	is( $node->safe_psql('postgres',
			"SELECT string_agg(status::text, ',') FROM idempotency.outbox WHERE topic = 'bouncer.demo'"),
		'done,done',
		'acked with the lease token through another client');
	$_->disconnect for $app, $w1, $w2, $w3;
}

# ---- LISTEN through PgBouncer: the server connection that listens goes
# back to the pool after the LISTEN, and a notification that reaches it
# while no client is linked to it is dropped by PgBouncer (one that happens
# to arrive while some client is linked goes to that client)
{
	my $through = dbh('postgres_one', 'client_worker');
	my $direct = dbh('direct', 'client_worker');
	$_->do('LISTEN idempotency_outbox') for $through, $direct;
	my $app = dbh('postgres', 'client_app');
	my $position = $bouncer->log_position;
	$app->begin_work;
	reserve($app, 'acme');
	$app->do(q{SELECT outbox_enqueue('acme', 'listen.demo', '{}')});
	$app->commit;
	my ($heard_direct, $heard_through);
	for (1 .. 50)
	{
		$direct->do('SELECT 1');
		$heard_direct ||= $direct->pg_notifies;
		last if $heard_direct;
		sleep 0.1;
	}
	ok($heard_direct && $heard_direct->[0] eq 'idempotency_outbox',
		'a worker LISTENing straight to the server is notified at commit');
	# the listener through PgBouncer is idle meanwhile
	ok($bouncer->wait_for_log(qr/got packet 'A' from server when not linked/, $position),
		'PgBouncer drops the notification sent to the idle server connection');
	$through->do('SELECT 1');
	$heard_through = $through->pg_notifies;
	ok(!$heard_through, 'a worker LISTENing through PgBouncer is not notified');
	# deliver the row: the end-to-end test expects an empty queue
	$direct->do(q{SELECT outbox_ack(tenant_id, id, lease_token)
	                FROM outbox_claim('w', topics => '{listen.demo}')});
	$_->disconnect for $through, $direct, $app;
}

# ---- the payments end-to-end test, service and workers through PgBouncer
run_payments_e2e(
	node => $node,
	dsn => $bouncer->connstr('postgres', 'payments_service'),
	worker_dsn => $bouncer->connstr('postgres', 'payments_worker'),
	listen_dsn => $node->connstr('postgres') . ' user=payments_worker',
	env => { PAYMENTS_PGBOUNCER => 1 });
note('PgBouncer pools at the end: ', $bouncer->admin('SHOW POOLS'));

$bouncer->stop;
$node->stop;
done_testing();
