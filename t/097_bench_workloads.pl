# The workloads under bench/ still run against the extension as it is:
# bench/keys' set-up, each of its pgbench scripts for a few transactions
# from two clients, and its per-call measurements; bench/outbox's set-up
# and a few rounds of its server-side loops on both queues; bench/maint
# whole, with 20,000 keys and a few seconds of reaping.  make bench
# measures, and takes minutes; this only checks that what it runs runs (a
# set-up that reserved more keys in one transaction than
# idempotency.max_keys_per_transaction allows stopped bench/keys before
# its first run).
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest qw(new_idem_node);

my $sharedir = `pg_config --sharedir`;
chomp $sharedir;
plan skip_all => 'pgcrypto (the naive baseline of bench/keys) is not installed'
  unless -f "$sharedir/extension/pgcrypto.control";

my $node = new_idem_node('bench');
local $ENV{PGHOST} = $node->host;
local $ENV{PGPORT} = $node->port;

# run COMMAND in DIR, as bench/*/run.sh runs it there: (ok, stdout, stderr)
sub run_in_dir
{
	my ($dir, @cmd) = @_;
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run(\@cmd, '>', \$out, '2>', \$err,
		init => sub { chdir $dir or die "chdir $dir: $!" });
	return ($ok, $out, $err);
}

my @psql = ('psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1');

# ---- bench/keys
my ($ok, $out, $err) = run_in_dir('bench/keys', @psql, '-d', 'postgres', '-f', 'setup.sql');
ok($ok, 'bench/keys: the set-up runs') or diag($err);
is( $node->safe_psql('bench_keys', q{
		SELECT (SELECT count(*) FROM idempotency.keys WHERE status = 'succeeded')
		    || ' ' || (SELECT count(*) FROM naive_keys WHERE status = 'succeeded')
		    || ' ' || (SELECT count(*) FROM key_rows)}),
	'10000 10000 10000',
	'bench/keys: the replayed keys are finished in every implementation');

my @scripts = map { s{^bench/keys/}{}r } sort glob('bench/keys/{new,replay}_*.sql');
cmp_ok(scalar @scripts, '>=', 12, 'bench/keys: its pgbench scripts are found');
for my $script (@scripts)
{
	my ($pok, $pout, $perr) = run_in_dir('bench/keys', 'pgbench', '-n', '-M', 'prepared',
		'-c', '2', '-j', '2', '-t', '5', '-f', $script, 'bench_keys');
	ok($pok && $pout =~ m{number of transactions actually processed: 10/10},
		"bench/keys: $script runs") or diag($pout, $perr);
}
is( $node->safe_psql('bench_keys',
		q{SELECT count(*) FROM idempotency.keys WHERE status = 'succeeded'}),
	10000 + 10 * scalar(grep { /^new_(ext|exec|rated)\.sql$/ } @scripts),
	'bench/keys: each new request of the extension finished its key');

($ok, $out, $err) = run_in_dir('bench/keys', @psql, '-At', '-F', ' ', '-d', 'bench_keys',
	'-f', 'percall.sql');
ok($ok, 'bench/keys: the per-call measurements run') or diag($err);
like($out, qr/^newcomplete_ext [0-9.]+$/m,
	'bench/keys: they report a pair reserved and completed');

# ---- bench/outbox
$node->safe_psql('postgres', 'CREATE DATABASE bench_outbox');
($ok, $out, $err) = run_in_dir('bench/outbox', @psql, '-d', 'bench_outbox', '-f', 'setup.sql');
ok($ok, 'bench/outbox: the set-up runs') or diag($err);
for my $table ('idempotency.outbox', 'plain_outbox')
{
	$node->safe_psql('bench_outbox', qq{
		INSERT INTO $table (tenant_id, topic, payload, max_attempts, available_at)
		SELECT 't' || (g % 10), 'payment.capture', jsonb_build_object('order', g), 10,
		       now() - interval '1 hour' + g * interval '1 millisecond'
		  FROM generate_series(1, 400) g});
}
for my $call ('CALL bench_outbox_one(50)', 'CALL bench_plain_one(50)',
	'CALL bench_plain_one(50, true)')
{
	my ($cok, $cout, $cerr) = run_in_dir('bench/outbox', @psql, '-d', 'bench_outbox', '-c', $call);
	ok($cok, "bench/outbox: $call runs") or diag($cerr);
}
is( $node->safe_psql('bench_outbox', q{
		SELECT (SELECT count(*) FROM idempotency.outbox WHERE status = 'done')
		    || ' ' || (SELECT count(*) FROM plain_outbox WHERE status = 'done')
		    || ' ' || (SELECT count(*) FROM plain_outbox)}),
	'50 50 350',
	'bench/outbox: each loop delivered its rounds');

# ---- bench/maint, at a small scale: the whole script, its three parts
my $results = PostgreSQL::Test::Utils::tempdir();
{
	local $ENV{KEYS} = 20000;
	local $ENV{SMALL_KEYS} = 2000;
	local $ENV{CHUNK} = 10000;
	local $ENV{CLIENTS} = 2;
	local $ENV{DURATION} = 1;
	local $ENV{REAP_SECONDS} = 3;
	local $ENV{QUIET_SECONDS} = 2;
	local $ENV{BENCH_RESULTS} = $results;
	($ok, $out, $err) = run_in_dir('bench/maint', 'bash', 'run.sh');
}
ok($ok, 'bench/maint: runs at a small scale') or diag($out, $err);
like($out, qr{^  new: 20000 keys against 2000: +[0-9.]+x}m,
	'bench/maint: it compares new requests in the large and the small table');
like($out, qr{^  scheduled run \(idem_sweep\(\), one slice\) run 3: [0-9]+ blocks}m,
	'bench/maint: it measures the scheduled sweep');
for my $when ('before', 'while', 'after')
{
	like($out,
		qr{^  $when reaping: +p50 [0-9.]+ ms, p99 [0-9.]+ ms, p99\.9 [0-9.]+ ms, slowest [0-9.]+ ms, worst second's p99 [0-9.]+ ms, [0-9.]+ tps$}m,
		"bench/maint: it reports the latency $when reaping");
}
like($out, qr{^  p99 while reaping / before: [0-9.]+x}m,
	'bench/maint: it reports the p99 while reaping against before');
like($out, qr{^  reaped [1-9][0-9]* keys}m, 'bench/maint: the reaper reaped');
ok(-s "$results/maint-latency.dat", 'bench/maint: the latency per second is written');

$node->stop;
done_testing();
