# REINDEX TABLE idempotency.keys in a loop while new requests arrive: each
# request waits for the REINDEX (or the REINDEX for it), as a plain INSERT
# would, and none fails.  A reservation used to probe the primary key
# (locking the table and the index for reading) before locking the table
# for its write; a REINDEX that locked the table in between and waited for
# the index deadlocked with it (40P01).
use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest qw(new_idem_node);

my $node = new_idem_node('reindex_traffic');
$node->safe_psql('postgres', 'CREATE TABLE orders (tenant text, amount bigint)');

my $requests = "${PostgreSQL::Test::Utils::tmp_check}/reindex_requests.sql";
append_to_file(
	$requests, q{
\set n random(1, 1000000000000000000)
SELECT outcome FROM idem_reserve('rx', 'orders', 'auto-' || :client_id || '-' || :n, jsonb_build_object('amount', :n));
BEGIN;
SELECT outcome FROM idem_reserve('rx', 'orders', 'new-' || :client_id || '-' || :n, jsonb_build_object('amount', :n));
INSERT INTO orders VALUES ('rx', :n);
SELECT idem_complete('rx', 'orders', 'new-' || :client_id || '-' || :n, 201, '{"ok": true}');
COMMIT;
SELECT outcome FROM idem_reserve('rx', 'orders', 'new-' || :client_id || '-' || :n, jsonb_build_object('amount', :n));
});
my $reindex = "${PostgreSQL::Test::Utils::tmp_check}/reindex_loop.sql";
append_to_file($reindex, "REINDEX TABLE idempotency.keys;\n");

sub pgbench
{
	my ($script, $clients) = @_;
	return [
		'pgbench', '-n', '-c', $clients, '-j', $clients, '-T', '8',
		'-f', $script, '-h', $node->host, '-p', $node->port, 'postgres'
	];
}

my ($out, $err, $rout, $rerr) = ('', '', '', '');
my $bench = IPC::Run::start(pgbench($requests, 4), '>', \$out, '2>', \$err);
my $rebuilds = IPC::Run::start(pgbench($reindex, 1), '>', \$rout, '2>', \$rerr);
my $bench_ok = $bench->finish;
my $rebuilds_ok = $rebuilds->finish;

ok($bench_ok, 'the requests ran to the end') or diag($err);
ok($rebuilds_ok, 'so did the REINDEX loop') or diag($rerr);
# pgbench counts a deadlock as a failed transaction (it does not abort)
unlike($err . $rerr, qr/deadlock detected/, 'no deadlock');
my ($failed) = $out =~ /number of failed transactions: (\d+)/;
my ($rfailed) = $rout =~ /number of failed transactions: (\d+)/;
is(($failed // 0) + ($rfailed // 0), 0, 'no failed transaction')
  or diag("requests: $out\nrebuilds: $rout");
my ($tx) = $out =~ /number of transactions actually processed: (\d+)/;
my ($rx) = $rout =~ /number of transactions actually processed: (\d+)/;
ok(($tx // 0) > 0 && ($rx // 0) > 0, 'requests and rebuilds both ran')
  or diag("requests: $out\nrebuilds: $rout");
note("requests: " . ($tx // 0) . ", rebuilds: " . ($rx // 0));
is($node->safe_psql('postgres',
		"SELECT count(*) FROM idempotency.keys WHERE tenant_id = 'rx' AND idem_key LIKE 'new-%' AND status <> 'succeeded'"),
	'0', 'every completed request is stored');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM orders") + 0,
	$node->safe_psql('postgres',
		"SELECT count(*) FROM idempotency.keys WHERE tenant_id = 'rx' AND idem_key LIKE 'new-%'") + 0,
	'one key per order');

$node->stop;
done_testing();
