# The client conformance scenario (clients/) with every driver: node-postgres,
# psycopg, asyncpg, pgx, JDBC, ruby-pg and DBD::Pg, each logged in as roles
# granted idempotency_app / idempotency_worker, first straight to the
# server, then through PgBouncer in transaction mode with the setting
# README.md gives for that driver.  Each client prints a line per step; its
# output is in this test's log (regress_log_060_clients).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use IdemTest qw(new_idem_node);
use PgBouncer;

# the scenario's steps, the same for every client, plus JDBC's two ways of
# passing idem_execute's handler (README: setString cannot)
my %steps = (jdbc => 12);
my @clients = qw(node psycopg asyncpg pgx jdbc ruby perl);

my $node = new_idem_node('clients', conf => "listen_addresses = '127.0.0.1'\n");
$node->safe_psql('postgres',
	PostgreSQL::Test::Utils::slurp_file('clients/setup.sql'));

sub run_clients
{
	my ($label, %env) = @_;
	local %ENV = (%ENV, PGHOST => '127.0.0.1', PGDATABASE => 'postgres',
		IDEM_APP_USER => 'client_app', IDEM_WORKER_USER => 'client_worker', %env);
	for my $c (@clients)
	{
		my $out = '';
		my $ok = eval {
			IPC::Run::run([ 'bash', 'clients/run.sh', $c ], '<', \undef,
				'>&', \$out, IPC::Run::timeout(180));
		};
		$out .= "error: $@" if $@;
		my $steps = $steps{$c} // 10;
		my $oks = () = $out =~ /^ok - /mg;
		my $summary = $out =~ /^(\S+: \d+ passed, \d+ failed)$/m ? $1 : 'no summary';
		note("$c$label:\n$out");
		ok($ok && $oks == $steps && $summary =~ / $steps passed, 0 failed$/,
			"$c$label: $summary") or diag($out);
	}
}

run_clients('', PGPORT => $node->port);

SKIP:
{
	skip 'pgbouncer is not installed', scalar @clients
	  unless PgBouncer::find_pgbouncer();
	# a pool smaller than the clients' connections: server connections are
	# shared between clients, transaction by transaction
	my $bouncer = PgBouncer->new($node,
		users => [qw(client_app client_worker)], pool_size => 2);
	run_clients(' through PgBouncer', PGPORT => $bouncer->port, IDEM_PGBOUNCER => 1);
	$bouncer->stop;
}

$node->stop;
done_testing();
