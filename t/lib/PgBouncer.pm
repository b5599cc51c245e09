# A PgBouncer in transaction pooling mode in front of a test cluster, for the
# TAP tests in t/.  Listens on 127.0.0.1 only, trusts the users it is given,
# and serves two databases: the node's "postgres" under its own name (pool of
# pool_size server connections) and under "postgres_one" with a pool of one
# server connection, where what one client leaves on a server connection is
# certain to meet the next client.  The node must listen on 127.0.0.1.
package PgBouncer;

use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Time::HiRes qw(sleep);

my @running;

# PgBouncer->new($node, users => [names], pool_size => N)
sub new
{
	my ($class, $node, %opts) = @_;
	my $bin = find_pgbouncer() or die "pgbouncer is not installed";
	my $dir = PostgreSQL::Test::Utils::tempdir('pgbouncer');
	my $port = PostgreSQL::Test::Cluster::get_free_port();
	my $pool_size = $opts{pool_size} // 8;
	my $server = 'host=127.0.0.1 port=' . $node->port . ' dbname=postgres';

	open(my $ul, '>', "$dir/userlist.txt") or die;
	print $ul qq{"$_" ""\n} for @{ $opts{users} // [] }, 'postgres';
	close $ul;
	# 1.21 and later keep the clients' protocol-level prepared statements
	my ($major, $minor) = version();
	my $prepared = ($major // 0) * 100 + ($minor // 0) >= 121
	  ? "max_prepared_statements = 200\n" : '';
	open(my $ini, '>', "$dir/pgbouncer.ini") or die;
	print $ini <<"INI";
[databases]
postgres = $server
postgres_one = $server pool_size=1

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $dir/userlist.txt
pool_mode = transaction
default_pool_size = $pool_size
max_client_conn = 300
admin_users = postgres
pidfile = $dir/pgbouncer.pid
; pgjdbc sends it at start-up; PgBouncer would refuse the connection
ignore_startup_parameters = extra_float_digits
; a restarted server is found again quickly; while the server is down a
; query waits in PgBouncer's queue at most 3 s (default 120 s), so that the
; service answers 503 before its client gives up
server_login_retry = 1
server_connect_timeout = 3
query_wait_timeout = 3
$prepared
INI
	close $ini;

	# its log, one per test file: tmp_check/log/pgbouncer_<test>.log
	my $test = $0;
	$test =~ s{.*/}{};
	$test =~ s{\.pl$}{};
	my $log = "$PostgreSQL::Test::Utils::log_path/pgbouncer_$test.log";
	my $pid = fork();
	die "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		open(STDOUT, '>>', $log) or die;
		open(STDERR, '>&', \*STDOUT) or die;
		exec($bin, "$dir/pgbouncer.ini") or die "exec $bin: $!";
	}
	my $self = bless { pid => $pid, port => $port, dir => $dir, log => $log }, $class;
	push @running, $self;
	# up when it answers its admin console
	for (1 .. 100)
	{
		my $ret = system('psql', '-X', '-q', '-h', '127.0.0.1', '-p', $port,
			'-U', 'postgres', '-d', 'pgbouncer', '-c', 'SHOW VERSION',
			'-o', '/dev/null');
		return $self if $ret == 0;
		sleep 0.1;
	}
	die "pgbouncer did not start, see $log";
}

sub find_pgbouncer
{
	for my $bin ('/usr/sbin/pgbouncer', '/usr/bin/pgbouncer')
	{
		return $bin if -x $bin;
	}
	return undef;
}

# PgBouncer's version as (major, minor), e.g. (1, 18)
sub version
{
	my $bin = find_pgbouncer() or return;
	my $out = `$bin --version`;
	return $out =~ /PgBouncer (\d+)\.(\d+)/ ? ($1, $2) : ();
}

sub port { return $_[0]{port} }

# A libpq connection string to database $db through PgBouncer.
sub connstr
{
	my ($self, $db, $user) = @_;
	my $s = "host=127.0.0.1 port=$self->{port} dbname=" . ($db // 'postgres');
	$s .= " user=$user" if $user;
	return $s;
}

# Run SQL through PgBouncer's admin console, e.g. "SHOW POOLS".
sub admin
{
	my ($self, $sql) = @_;
	my $out = `psql -X -A -t -h 127.0.0.1 -p $self->{port} -U postgres -d pgbouncer -c "$sql"`;
	return $out;
}

# The size of PgBouncer's log now, to look for lines written after it.
sub log_position
{
	my ($self) = @_;
	return -s $self->{log} // 0;
}

# Wait up to $timeout seconds for a line matching $re written after
# $position; true if one was.
sub wait_for_log
{
	my ($self, $re, $position, $timeout) = @_;
	for (1 .. ($timeout // 10) * 10)
	{
		my $text = PostgreSQL::Test::Utils::slurp_file($self->{log});
		return 1 if substr($text, $position) =~ $re;
		sleep 0.1;
	}
	return 0;
}

sub stop
{
	my ($self) = @_;
	return unless $self->{pid};
	kill 'TERM', $self->{pid};
	waitpid($self->{pid}, 0);
	$self->{pid} = undef;
	return;
}

END
{
	my $rc = $?;
	$_->stop for @running;
	$? = $rc;
}

1;
