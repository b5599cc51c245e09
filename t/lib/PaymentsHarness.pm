# Helpers for the TAP tests that run the example payments service
# (examples/payments) against real clusters: install its tables and roles,
# start its programs, read what the load client was acknowledged, and check
# that it all survived.
package PaymentsHarness;

use strict;
use warnings;
use Exporter 'import';
use HTTP::Tiny;
use JSON::PP;
use POSIX ();
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep time);

our @EXPORT_OK = qw(have_psycopg install_payments spawn wait_http
  read_ack_log check_acknowledged check_outbox_and_provider ledger
  children_of $python);

our $python = '/usr/bin/python3';
my $json = JSON::PP->new->canonical;
# a fresh connection per request: the example server and keep-alive
# interact badly with delayed ACKs (tens of milliseconds per request)
my $http = HTTP::Tiny->new(timeout => 10, keep_alive => 0);

# The example's Python packages (Debian: python3-psycopg,
# python3-psycopg-pool, python3-fastapi, python3-uvicorn)
sub have_psycopg
{
	return -x $python
	  && system("$python -c 'import psycopg, psycopg_pool, fastapi, uvicorn' 2>/dev/null")
	  == 0;
}

# The DBA creates the tables and the roles; the operator (payments_ops,
# granted idempotency_admin) sets the scope's policy.
sub install_payments
{
	my ($node) = @_;
	$node->safe_psql('postgres', slurp_file("examples/payments/$_"))
	  for qw(schema.sql roles.sql);
	$node->safe_psql('postgres', slurp_file('examples/payments/scope.sql'),
		extra_params => [ '-U', 'payments_ops' ]);
	return;
}

# Start a program in the background, output appended to a log file in the
# test's log directory; returns its pid.  Whatever is still running when the
# test ends (even by dying half-way) is killed.
my @spawned;
my $test_pid = $$;

sub spawn
{
	my ($name, $env, @cmd) = @_;
	my $logdir = $PostgreSQL::Test::Utils::log_path;
	my $pid = fork();
	die "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		open(STDOUT, '>>', "$logdir/$name.log") or die;
		open(STDERR, '>&', \*STDOUT) or die;
		%ENV = (%ENV, %$env);
		exec(@cmd) or POSIX::_exit(127);
	}
	push @spawned, $pid;
	return $pid;
}

END
{
	local $?;    # keep the test's exit status
	if ($$ == $test_pid)
	{
		for my $pid (@spawned)
		{
			kill('KILL', $pid) if waitpid($pid, POSIX::WNOHANG()) == 0;
		}
	}
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

# The processes whose parent is $pid.
sub children_of
{
	my ($pid) = @_;
	my @kids;
	for my $stat (glob '/proc/[0-9]*/stat')
	{
		open(my $fh, '<', $stat) or next;
		my $line = <$fh>;
		close $fh;
		next unless defined $line;
		# pid (comm) state ppid ...: comm may hold spaces and parentheses
		push @kids, $1 if $line =~ /^(\d+) \(.*\) \S+ (\d+) / && $2 == $pid;
	}
	return @kids;
}

# The answers the load client was acknowledged (loadtest.py --ack-log), one
# hash per line; a torn last line (client killed mid-write) is skipped.
sub read_ack_log
{
	my ($path) = @_;
	my @acks;
	return wantarray ? @acks : 0 unless -e $path;
	for my $line (split /\n/, slurp_file($path))
	{
		my $a = eval { $json->decode($line) };
		push @acks, $a if $a;
	}
	return wantarray ? @acks : scalar @acks;
}

sub ledger
{
	my ($provider_url) = @_;
	my $r = $http->get("$provider_url/_ledger");
	die "provider ledger: $r->{status}" unless $r->{success};
	return $json->decode($r->{content});
}

my %tokens = (acme => 'tok_acme', globex => 'tok_globex');

# Every acknowledged answer must still be there: each key was acknowledged
# with one body only (otherwise the key was executed twice), and a replay of
# the same request through the service answers that same body again (a key
# that was lost would be charged afresh, with a new body).  Returns
# (distinct keys, lost, doubles).
sub check_acknowledged
{
	my ($label, $service_url, @acks) = @_;
	my %bodies;
	my %request;
	for my $a (@acks)
	{
		my $k = "$a->{tenant}/$a->{key}";
		$bodies{$k}{ $a->{body} } = 1;
		$request{$k} = $a;
	}
	my @doubles = grep { keys %{ $bodies{$_} } > 1 } sort keys %bodies;
	my @lost;
	for my $k (sort keys %request)
	{
		my $a = $request{$k};
		my $r = $http->post(
			"$service_url/v1/charges",
			{
				headers => {
					'Content-Type' => 'application/json',
					Authorization => "Bearer $tokens{$a->{tenant}}",
					'Idempotency-Key' => $a->{key}
				},
				content => $json->encode($a->{request})
			});
		next
		  if $r->{status} == $a->{status}
		  && $r->{content} eq $a->{body}
		  && ($r->{headers}{'idempotent-replayed'} // '') eq 'true';
		push @lost, $k;
		diag("$label: $k acknowledged $a->{status} $a->{body}, now "
			  . "$r->{status} $r->{content}");
	}
	my $nkeys = keys %request;
	cmp_ok($nkeys, '>', 0, "$label: the service acknowledged requests");
	is_deeply(\@doubles, [],
		"$label: no key was acknowledged with two different answers");
	is_deeply(\@lost, [],
		"$label: every acknowledged answer is replayed, identical");
	return ($nkeys, scalar @lost, scalar @doubles);
}

# The outbox drains, and the provider captured each charge exactly once:
# one capture per charge row, the charge row holding that capture.
# Returns (captures of charges, charge keys the provider was called for
# more than once).
sub check_outbox_and_provider
{
	my ($label, $node, $provider_url, $timeout) = @_;
	my $deadline = time() + ($timeout // 60);
	my $open;
	while (1)
	{
		$open = $node->safe_psql('postgres',
			"SELECT count(*) FROM idempotency.outbox WHERE status <> 'done'");
		last if $open == 0 || time() > $deadline;
		sleep 0.3;
	}
	is($open, 0, "$label: the outbox drained, no row orphaned");
	my $ledger = ledger($provider_url);
	# the provider's keys for charges (it may also serve other scopes)
	delete $ledger->{captures}{$_}
	  for grep { !/^[^:]+:charges:/ } keys %{ $ledger->{captures} };
	delete $ledger->{calls}{$_}
	  for grep { !/^[^:]+:charges:/ } keys %{ $ledger->{calls} };
	my %charges = map { my ($k, $ref) = split /\|/; ($k => $ref // '') }
	  split /\n/,
	  $node->safe_psql('postgres',
		"SELECT tenant_id || ':charges:' || idem_key, provider_ref FROM payments.charges");
	my $ncaptures = keys %{ $ledger->{captures} };
	is($ncaptures, scalar(keys %charges),
		"$label: provider captures == charges");
	my @wrong = grep {
		!defined $ledger->{captures}{$_}
		  || $ledger->{captures}{$_}{id} ne $charges{$_}
	} sort keys %charges;
	is_deeply(\@wrong, [],
		"$label: every charge is captured, with the capture the provider made for its key"
	);
	my $redelivered = grep { $_ > 1 } values %{ $ledger->{calls} };
	return ($ncaptures, $redelivered);
}

1;
