# Ordered delivery under load: producers enqueue for 20 ordering keys (and
# unordered rows) while several claimers deliver, each in two transactions
# as a real worker does (claim and commit the lease; then record the
# delivery and acknowledge in one transaction).  Afterwards every row was
# delivered exactly once, the rows of each key in enqueue (id) order, and
# no snapshot taken during the run ever saw two leased rows of one key.
# Run twice: claims of 5 rows for the tenant (the locking statements), and
# claims of one row for the topic (which, on the table as the extension
# makes it, lease the row without the executor: outbox_claim_direct).
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest qw(new_idem_node);

my $node = new_idem_node('outbox_ordered', conf => "max_connections = 50\n");
my $preloaded = 3000;
my $dir = $node->basedir;

# run_ordered(TENANT, CLAIM): the scenario for the rows of TENANT, whose
# claimers lease with CLAIM (an outbox_claim call, "W" standing for the
# worker's name)
sub run_ordered
{
	my ($tenant, $claim, $batch) = @_;
	$claim =~ s/W/'w' || :client_id/;

	$node->safe_psql('postgres', qq{
CREATE TABLE IF NOT EXISTS delivered (seq bigserial PRIMARY KEY, id bigint NOT NULL,
                                      ordering_key text, worker text NOT NULL);
CREATE TABLE IF NOT EXISTS double_leases (ordering_key text, leased bigint, seen_at timestamptz DEFAULT now());
TRUNCATE delivered, double_leases;
SELECT count(outbox_enqueue('$tenant', '$tenant.topic', jsonb_build_object('g', g),
                            ordering_key => CASE WHEN g % 10 = 0 THEN NULL
                                                 ELSE 'key-' || (g % 20) END))
  FROM generate_series(1, $preloaded) g;
});

	PostgreSQL::Test::Utils::append_to_file("$dir/producer_$tenant.sql", qq{
\\set k random(0, 20)
BEGIN;
SELECT outbox_enqueue('$tenant', '$tenant.topic', jsonb_build_object('k', :k),
                      ordering_key => CASE WHEN :k = 20 THEN NULL ELSE 'key-' || :k END);
SELECT outbox_enqueue('$tenant', '$tenant.topic', jsonb_build_object('k', :k),
                      ordering_key => CASE WHEN :k = 20 THEN NULL ELSE 'key-' || :k END);
COMMIT;
});
	PostgreSQL::Test::Utils::append_to_file("$dir/claimer_$tenant.sql", qq{
SELECT coalesce(array_agg(id)::text, '{}') AS ids,
       coalesce(array_agg(lease_token)::text, '{}') AS tokens
  FROM $claim \\gset
INSERT INTO double_leases (ordering_key, leased)
SELECT ordering_key, count(*) FROM idempotency.outbox
 WHERE tenant_id = '$tenant' AND status = 'leased' AND ordering_key IS NOT NULL
 GROUP BY ordering_key HAVING count(*) > 1;
BEGIN;
INSERT INTO delivered (id, ordering_key, worker)
SELECT id, ordering_key, 'w' || :client_id FROM idempotency.outbox
 WHERE tenant_id = '$tenant' AND id = ANY (':ids'::bigint[]) ORDER BY id;
SELECT count(*) FROM outbox_ack_many('$tenant', ':ids', ':tokens');
COMMIT;
});

	# 2 producers and 6 claimers for 10 seconds
	$node->command_ok(
		[ 'pgbench', '-n', '-T', '10', '-c', '8', '-j', '2',
		  '-f', "$dir/producer_$tenant.sql\@1",
		  '-f', "$dir/claimer_$tenant.sql\@3", 'postgres' ],
		"$tenant: producers and claimers run concurrently");

	# drain what is left with 4 claimers
	for my $round (1 .. 20 * 5 / $batch)
	{
		last if $node->safe_psql('postgres',
			qq{SELECT count(*) FROM idempotency.outbox WHERE tenant_id = '$tenant' AND status <> 'done'}) == 0;
		$node->command_ok(
			[ 'pgbench', '-n', '-t', '200', '-c', '4', '-j', '2',
			  '-f', "$dir/claimer_$tenant.sql", 'postgres' ],
			"$tenant: drain round $round");
	}

	my $total = $node->safe_psql('postgres',
		qq{SELECT count(*) FROM idempotency.outbox WHERE tenant_id = '$tenant'});
	cmp_ok($total, '>', $preloaded,
		"$tenant: rows were enqueued during the run ($total in all)");
	is($node->safe_psql('postgres',
			qq{SELECT count(*) FROM idempotency.outbox WHERE tenant_id = '$tenant' AND status <> 'done'}),
		'0', "$tenant: every row was delivered");
	is($node->safe_psql('postgres', q{
SELECT count(*) || ' ' || count(DISTINCT id) FROM delivered}),
		"$total $total", "$tenant: each exactly once");
	is($node->safe_psql('postgres', q{
SELECT count(*) FROM (
    SELECT ordering_key, id, lag(id) OVER (PARTITION BY ordering_key ORDER BY seq) AS prev
      FROM delivered WHERE ordering_key IS NOT NULL) d
 WHERE id < prev}),
		'0', "$tenant: the rows of each key were delivered in enqueue order");
	is($node->safe_psql('postgres', q{SELECT count(*) FROM double_leases}),
		'0', "$tenant: no key ever had two rows leased at once");
	cmp_ok($node->safe_psql('postgres',
			q{SELECT count(DISTINCT worker) FROM delivered WHERE ordering_key = 'key-1'}),
		'>', 1, "$tenant: the rows of one key went to several workers");
	return;
}

run_ordered('ord', "outbox_claim(W, 5, '1 minute', tenant => 'ord')", 5);
run_ordered('ord1', "outbox_claim(W, 1, '1 minute', topics => '{ord1.topic}')", 1);

$node->stop;
done_testing();
