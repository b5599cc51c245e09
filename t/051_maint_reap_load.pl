# New requests keep flowing while idem_maintain reaps a million expired keys:
# pgbench runs the new-request workload during the reaping, and the test
# checks what must hold (every expired key gone, no pgbench error) and
# reports the latency with and without reaping (timing is for bench/, not an
# assertion here: the machine may be shared).
use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest qw(new_idem_node);

my $rows = 1_000_000;
my $node = new_idem_node('reap_load',
	conf => "shared_buffers = 256MB\nmax_wal_size = 2GB\n");

$node->safe_psql(
	'postgres', qq{
	INSERT INTO idempotency.keys (tenant_id, scope, idem_key, fingerprint,
	                              status, locked_at, completed_at, expires_at,
	                              response_code)
	SELECT 'tenant-' || (g % 50), 'orders', 'old-' || g,
	       sha256(g::text::bytea), 'succeeded'::idempotency.status,
	       now() - interval '2 days', now() - interval '2 days',
	       now() - interval '1 day' + g * interval '1 millisecond', 201
	  FROM generate_series(1, $rows) g;
	VACUUM ANALYZE idempotency.keys;
});

# the new-request workload: reserve, business write, complete, commit
my $has_reserve = $node->safe_psql('postgres',
	"SELECT to_regprocedure('idem_reserve(text,text,text,jsonb,interval,interval)') IS NOT NULL"
);
my $script = "$PostgreSQL::Test::Utils::tmp_check/reap_load.sql";
$node->safe_psql('postgres',
	'CREATE TABLE orders (id bigserial PRIMARY KEY, tenant text, amount bigint)');
if ($has_reserve eq 't')
{
	append_to_file(
		$script, q{
\set n random(1, 1000000000000000000)
BEGIN;
SELECT outcome FROM idem_reserve('load', 'orders', 'new-' || :client_id || '-' || :n, jsonb_build_object('amount', :n));
INSERT INTO orders (tenant, amount) VALUES ('load', :n);
SELECT idem_complete('load', 'orders', 'new-' || :client_id || '-' || :n, 201, '{"ok": true}');
COMMIT;
});
}
else
{
	# the same shape written directly, where idem_reserve is not available
	append_to_file(
		$script, q{
\set n random(1, 1000000000000000000)
BEGIN;
INSERT INTO idempotency.keys (tenant_id, scope, idem_key, fingerprint, status, lock_token, locked_at, expires_at) VALUES ('load', 'orders', 'new-' || :client_id || '-' || :n, sha256(:n::text::bytea), 'processing', gen_random_uuid(), now(), now() + interval '1 day') ON CONFLICT DO NOTHING;
INSERT INTO orders (tenant, amount) VALUES ('load', :n);
UPDATE idempotency.keys SET status = 'succeeded', response_code = 201, response_body = '{"ok": true}', completed_at = now() WHERE tenant_id = 'load' AND scope = 'orders' AND idem_key = 'new-' || :client_id || '-' || :n;
COMMIT;
});
}

sub pgbench
{
	my ($seconds) = @_;
	return [
		'pgbench', '-n', '-c', '2', '-j', '2', '-T', $seconds,
		'-f', $script, '-h', $node->host, '-p', $node->port, 'postgres'
	];
}

sub latency
{
	my ($out) = @_;
	my ($tps) = $out =~ /tps = ([\d.]+)/;
	my ($lat) = $out =~ /latency average = ([\d.]+) ms/;
	my ($failed) = $out =~ /number of failed transactions: (\d+)/;
	return ($tps // 0, $lat // -1, $failed // 0);
}

# without reaping
my ($out, $err) = ('', '');
IPC::Run::run(pgbench(5), '>', \$out, '2>', \$err)
  or die "pgbench failed: $err";
my ($tps0, $lat0) = latency($out);

# with reaping: pgbench starts, then idem_maintain reaps the backlog
($out, $err) = ('', '');
my $bench = IPC::Run::start(pgbench(15), '>', \$out, '2>', \$err);
sleep 1;
my $t0 = time;
# full speed here (no rest between batches): this test is about correctness
$node->safe_psql('postgres', "CALL idem_maintain('50 seconds', 5000, '0')");
my $reap_seconds = time - $t0;
my $bench_ok = $bench->finish;
my ($tps1, $lat1, $failed1) = latency($out);

ok($bench_ok, 'pgbench succeeded during the reaping') or diag($err);
is($failed1, 0, 'no failed transactions');
unlike($err, qr/ERROR/, 'no errors reported by pgbench');
ok($tps1 > 0, 'new requests were served during the reaping');
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM idempotency.keys WHERE idem_key LIKE 'old-%'"),
	'0',
	'all expired keys reaped in one idem_maintain call');
is($node->safe_psql('postgres',
		"SELECT sum(reaped) FROM idempotency.stats WHERE tenant LIKE 'tenant-%'"),
	$rows, 'every reaped key counted');
note sprintf(
	'reaped %d keys in ~%d s; new requests: %.1f tps, %.2f ms average without reaping; %.1f tps, %.2f ms during',
	$rows, $reap_seconds, $tps0, $lat0, $tps1, $lat1);

$node->stop;
done_testing();
