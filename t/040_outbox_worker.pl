# Real worker processes drain the outbox against a fake HTTP provider that
# deduplicates by idempotency key.  One worker is killed with SIGKILL after
# the provider performed its call but before the ack; its lease expires, the
# row is delivered again by another worker, and the provider's dedup keeps
# the effect single.  At the end every row is done, every key reached the
# provider at least once, and each effect happened exactly once.
use strict;
use warnings;
use File::Temp qw(tempdir);
use HTTP::Tiny;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest qw(new_idem_node);

# Debian's interpreter, where python3-psycopg lives (not a pyenv shim)
my $python = '/usr/bin/python3';
plan skip_all => 'python3 with psycopg is not installed'
  unless -x $python && system($python, '-c', 'import psycopg') == 0;

my $rows = 120;
my $dir = tempdir(CLEANUP => 1);
my $here = $0 =~ s{/[^/]+$}{}r;
my $worker_script = "$here/outbox/worker.py";
my $provider_script = "$here/outbox/provider.py";

my $node = new_idem_node('outbox_worker');
my $connstr = $node->connstr('postgres');

# three tenants, every row correlated with the idempotency key of the
# request that enqueued it
$node->safe_psql('postgres', qq{
	SELECT count(outbox_enqueue('tenant-' || (g % 3), 'payment.capture',
	                            jsonb_build_object('order', g, 'amount', g * 100),
	                            'order-' || g, 'payments'))
	  FROM generate_series(1, $rows) g});

# the provider: first call of every 7th key fails with 503 (nack and retry)
my $port_file = "$dir/provider.port";
my $provider = IPC::Run::start([ $python, $provider_script, $port_file, 7 ],
	'>', "$dir/provider.log", '2>&1');
wait_for_file($port_file, 30) or BAIL_OUT('provider did not start');
my $port = slurp_file($port_file);
my $url = "http://127.0.0.1:$port/charge";

my $stop_file = "$dir/stop";
my %common = (OUTBOX_STOP_FILE => $stop_file, OUTBOX_DEADLINE => 90,
	OUTBOX_LEASE => '3 seconds', OUTBOX_BATCH => 5);

sub start_worker
{
	my ($name, %env) = @_;
	local %ENV = (%ENV, %common, %env);
	my $out = '';
	my $h = IPC::Run::start([ $python, $worker_script, $connstr, $url, $name ],
		'>', \$out, '2>', \$out);
	return { h => $h, out => \$out, name => $name };
}

# the doomed worker starts first, so it is sure to hold a batch when it hangs
my $pause_file = "$dir/paused";
my $doomed = start_worker('w-crash', OUTBOX_PAUSE_FILE => $pause_file);
wait_for_file($pause_file, 30) or BAIL_OUT('worker did not reach the pause');
my $held = $node->safe_psql('postgres',
	"SELECT count(*) FROM idempotency.outbox WHERE leased_by = 'w-crash' AND status = 'leased'");
cmp_ok($held, '>=', 1, 'the doomed worker holds leased rows');
my @workers = map { start_worker("w-$_") } 1 .. 3;

# kill -9 after the provider call, before the ack
my ($doomed_pid, $crashed) = split / /, slurp_file($pause_file);
kill 'KILL', $doomed_pid;
$doomed->{h}->finish;
is($doomed->{h}->full_result & 127, 9, 'the doomed worker died of SIGKILL');

# restart it (without the pause): it works the queue like the others
push @workers, start_worker('w-crash');

ok( $node->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM idempotency.outbox WHERE status <> 'done'"),
	'every row is done');

# stop the workers and collect what they did
open(my $fh, '>', $stop_file) or die "cannot create $stop_file: $!";
close $fh;
for my $w (@workers)
{
	ok($w->{h}->finish, "$w->{name} exited cleanly");
	note ${ $w->{out} };
}

my $res = HTTP::Tiny->new(timeout => 10)->get("http://127.0.0.1:$port/stats");
ok($res->{success}, 'provider answers its stats');
my $stats = decode_json($res->{content});
$provider->kill_kill;

my %db = map { my ($k, $ref, $att) = split /\|/; ($k => [ $ref, $att ]) }
  split /\n/, $node->safe_psql('postgres',
	"SELECT idem_scope || ':' || idem_key, provider_ref, attempts FROM idempotency.outbox");
is(scalar(keys %db), $rows, 'no row lost or added');

my @never_called = grep { !$stats->{calls}{$_} } keys %db;
is_deeply(\@never_called, [], 'the provider saw every key at least once');
my @not_once = grep { ($stats->{effects}{$_} // 0) != 1 } keys %db;
is_deeply(\@not_once, [], 'each effect happened exactly once');
is(scalar(keys %{ $stats->{effects} }), $rows, 'no effect for an unknown key');
my @wrong_ref = grep { $db{$_}[0] ne $stats->{refs}{$_} } keys %db;
is_deeply(\@wrong_ref, [], 'each row records the provider reference of its effect');

# the row the killed worker had delivered: called again after its lease
# expired, the provider replayed it, the reclaim counted the lost attempt
is( $node->safe_psql('postgres', qq{
		SELECT attempts >= 1 AND last_error = 'lease of worker "w-crash" expired'
		  FROM idempotency.outbox WHERE idem_scope || ':' || idem_key = '$crashed'}),
	't', 'the row of the killed worker was reclaimed after its lease expired');
cmp_ok($stats->{calls}{$crashed}, '>=', 2, 'its key reached the provider again');
is($stats->{effects}{$crashed}, 1, 'and its effect still happened once');

# the 503s were nacked and retried
my $retried = grep { $_->[1] >= 1 } values %db;
my $calls = 0;
$calls += $_ for values %{ $stats->{calls} };
cmp_ok($retried, '>', 0, 'failed deliveries were retried');
cmp_ok($calls, '>', $rows, 'more calls than rows: retries and the replay');

$node->stop;
done_testing();

sub wait_for_file
{
	my ($path, $secs) = @_;
	for (1 .. $secs * 10)
	{
		return 1 if -e $path;
		select(undef, undef, undef, 0.1);
	}
	return 0;
}
