# idempotency.stats across restarts, as README says: counters survive a clean
# restart and are discarded after a crash (immediate shutdown).  Also: what
# happens when there are more (tenant, scope) pairs than
# idempotency.stats_max_entries (the reaper's counts never evict; a request
# of a new pair evicts the least used pairs into "(other)", totals intact),
# per-database views, entries of a dropped database, and the clear error of
# a server that did not preload the library.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest qw(new_idem_node);

my $node = new_idem_node('stats', conf => "idempotency.stats_max_entries = 16\n");

# count 3 reaped keys for each of 20 tenants: 16 fit, 4 overflow
sub reap_for_tenants
{
	my ($db, $prefix, $n) = @_;
	$node->safe_psql(
		$db, qq{
		INSERT INTO idempotency.keys (tenant_id, scope, idem_key, fingerprint,
		                              status, locked_at, expires_at)
		SELECT '$prefix' || lpad(t::text, 2, '0'), 'orders', 'k' || g,
		       sha256(g::text::bytea), 'succeeded'::idempotency.status,
		       now() - interval '2 hours', now() - interval '1 hour'
		  FROM generate_series(1, $n) t, generate_series(1, 3) g;
		SELECT idem_reap();
	});
}

reap_for_tenants('postgres', 't', 20);
my $summary = q{
	SELECT count(*) FILTER (WHERE tenant <> '(other)') || ' pairs, '
	       || sum(reaped) FILTER (WHERE tenant <> '(other)') || ' reaped, other '
	       || coalesce(sum(reaped) FILTER (WHERE tenant = '(other)'), 0)
	  FROM idempotency.stats};
is($node->safe_psql('postgres', $summary),
	'16 pairs, 48 reaped, other 12',
	'pairs beyond stats_max_entries are counted under (other)');

# another database sees only its own tenants (and the shared overflow row)
$node->safe_psql('postgres', 'CREATE DATABASE other_db');
$node->safe_psql('other_db', 'CREATE EXTENSION idempotency');
is($node->safe_psql('other_db',
		"SELECT string_agg(tenant || ' ' || reaped, ', ') FROM idempotency.stats"),
	'(other) 12', 'per-database view');

# clean restart: kept
$node->restart;
is($node->safe_psql('postgres', $summary),
	'16 pairs, 48 reaped, other 12', 'counters survive a clean restart');
ok(!-e $node->data_dir . '/pg_stat/idempotency.stat',
	'the saved file is removed once loaded');

# crash: discarded
$node->stop('immediate');
$node->start;
is($node->safe_psql('postgres', 'SELECT count(*) FROM idempotency.stats'),
	'0', 'counters are discarded after a crash');

# counting resumes; reset clears this database's entries
reap_for_tenants('postgres', 'u', 2);
is($node->safe_psql('postgres', $summary), '2 pairs, 6 reaped, other 0',
	'counting after the crash');
$node->safe_psql('postgres', 'SELECT idem_stats_reset()');
is($node->safe_psql('postgres', 'SELECT count(*) FROM idempotency.stats'),
	'0', 'reset');

# eviction: one busy pair, then a full table of pairs the reaper counted,
# then 40 new tenants making requests
$node->safe_psql(
	'postgres', q{
	BEGIN;
	SELECT idem_reserve('busy', 'orders', 'b1', '{}'::jsonb);
	SELECT idem_complete('busy', 'orders', 'b1', 200, '{}');
	COMMIT;
	SELECT count(idem_reserve('busy', 'orders', 'b1', '{}'::jsonb))
	  FROM generate_series(1, 20);
});
reap_for_tenants('postgres', 'v', 15);
is($node->safe_psql('postgres', $summary), '16 pairs, 45 reaped, other 0',
	'the table is full');
$node->safe_psql('postgres',
	q{SELECT count(idem_reserve('new' || g, 'orders', 'k', '{}'::jsonb))
	    FROM generate_series(1, 40) g});
my $totals = q{
	SELECT sum(created) || ' created, ' || sum(replayed) || ' replayed, '
	       || sum(completed) || ' completed, ' || sum(reaped) || ' reaped'
	  FROM idempotency.stats};
is($node->safe_psql('postgres', $totals),
	'41 created, 20 replayed, 1 completed, 45 reaped',
	'eviction keeps the totals');
is($node->safe_psql('postgres',
		"SELECT created || ' ' || replayed FROM idempotency.stats WHERE tenant = 'new40'"),
	'1 0', 'a new pair gets its own row when the table is full');
is($node->safe_psql('postgres',
		"SELECT replayed FROM idempotency.stats WHERE tenant = 'busy'"),
	'20', 'the busy pair is not evicted');
is($node->safe_psql('postgres', q{
	SELECT (count(*) FILTER (WHERE tenant <> '(other)') <= 16)
	       || ' ' || (sum(created) FILTER (WHERE tenant = '(other)') >= 25)
	       || ' ' || (sum(reaped) FILTER (WHERE tenant = '(other)') >= 30)
	  FROM idempotency.stats}),
	'true true true', 'evicted pairs are counted under (other)');

# usage survives a clean restart: the busy pair still outlives newcomers
$node->restart;
is($node->safe_psql('postgres', $totals),
	'41 created, 20 replayed, 1 completed, 45 reaped',
	'totals after a clean restart');
$node->safe_psql('postgres',
	q{SELECT count(idem_reserve('newer' || g, 'orders', 'k', '{}'::jsonb))
	    FROM generate_series(1, 40) g});
is($node->safe_psql('postgres',
		"SELECT replayed FROM idempotency.stats WHERE tenant = 'busy'"),
	'20', 'the busy pair keeps its row after a restart');
is($node->safe_psql('postgres', $totals),
	'81 created, 20 replayed, 1 completed, 45 reaped',
	'totals after more evictions');

# a dropped database gives its room back, but only once the drop commits
$node->safe_psql('postgres', 'SELECT idem_stats_reset()');
$node->safe_psql('postgres', 'CREATE DATABASE doomed');
$node->safe_psql('doomed', 'CREATE EXTENSION idempotency');
reap_for_tenants('doomed', 'd', 16);
$node->safe_psql('postgres', 'ALTER DATABASE doomed IS_TEMPLATE true');
my ($drop_ret) = $node->psql('postgres', 'DROP DATABASE doomed');
isnt($drop_ret, 0, 'a template database cannot be dropped');
is($node->safe_psql('doomed',
		"SELECT count(*) FROM idempotency.stats WHERE tenant <> '(other)'"),
	'16', 'a failed DROP DATABASE keeps the entries');
$node->safe_psql('postgres', 'ALTER DATABASE doomed IS_TEMPLATE false');
$node->safe_psql('postgres', 'DROP DATABASE doomed');
reap_for_tenants('postgres', 'p', 16);
is($node->safe_psql('postgres', $summary), '16 pairs, 48 reaped, other 0',
	'the entries of a dropped database are gone');

# a file saved by an older version of the library (format version 1, no
# usage per entry) is still read after the upgrade's restart
my $dboid = $node->safe_psql('postgres',
	"SELECT oid FROM pg_database WHERE datname = 'postgres'");
my $statfile = $node->data_dir . '/pg_stat/idempotency.stat';

# stop the server, put a statistics file in place, start it again
sub restart_with_statfile
{
	my ($bytes) = @_;
	$node->stop;
	open(my $fh, '>:raw', $statfile) or die "could not write $statfile: $!";
	print $fh $bytes;
	close($fh);
	$node->start;
	return;
}

my $v1_entry = 'L Z128 Z128 x4 Q9';
my $v1 =
    pack('L L L q', 0x1de57a75, 1, 9, 2)
  . pack($v1_entry, $dboid, 'v1-tenant', 'orders', 5, 4, 0, 0, 0, 3, 0, 0, 0)
  . pack($v1_entry, 0, '(other)', '(other)', 7, 0, 0, 0, 0, 0, 0, 2, 0);
restart_with_statfile($v1);
is($node->safe_psql('postgres',
		"SELECT string_agg(tenant || ' ' || created || ' ' || replayed || ' '"
		  . " || completed || ' ' || reaped, ', ' ORDER BY tenant)"
		  . " FROM idempotency.stats"),
	'(other) 7 0 0 2, v1-tenant 5 4 3 0',
	'a version 1 file is read');

# a version 2 file (usage per entry, 9 counters: no rate_limited yet) is
# read too, and the counter it lacks starts at zero
my $v2_entry = 'L Z128 Z128 x4 d Q9';
my $v2 =
    pack('L L L q', 0x1de57a75, 2, 9, 1)
  . pack($v2_entry, $dboid, 'v2-tenant', 'orders', 1.0, 6, 1, 0, 2, 0, 5, 0, 4, 0);
restart_with_statfile($v2);
is($node->safe_psql('postgres',
		"SELECT string_agg(tenant || ' ' || created || ' ' || mismatched || ' '"
		  . " || completed || ' ' || reaped || ' ' || rate_limited, ', ' ORDER BY tenant)"
		  . " FROM idempotency.stats"),
	'v2-tenant 6 2 5 4 0',
	'a version 2 file is read, rate_limited starts at zero');

# and what this version saves at a clean stop is read back, rate_limited
# included
$node->safe_psql('postgres',
	"SELECT idem_configure_scope('rl-restart', '{\"new_keys_per_second\": 0.001, \"new_keys_burst\": 1}')");
$node->safe_psql('postgres',
	"SELECT idem_reserve('v3-tenant', 'rl-restart', 'k' || i, '{}') FROM generate_series(1, 3) i");
$node->restart;
is($node->safe_psql('postgres',
		"SELECT created || ' ' || rate_limited FROM idempotency.stats"
		  . " WHERE tenant = 'v3-tenant'"),
	'1 2', 'rate_limited survives a clean restart');

# a tenant and a scope over 110 bytes (shown by their short form) keep one
# row across clean restarts: the saved short form is read back as it is,
# not shortened again (the scope is of three-byte characters)
my $long_t = "repeat('L', 200)";
my $long_s = "repeat(chr(8364), 60)";
my $long_sum = "SELECT count(*) || ' ' || coalesce(sum(created), 0) FROM idempotency.stats"
  . " WHERE tenant LIKE 'LLL%'";
$node->safe_psql('postgres',
	"SELECT idem_reserve($long_t, $long_s, 'k' || i, '{}') FROM generate_series(1, 2) i");
is($node->safe_psql('postgres', $long_sum), '1 2', 'a long-named pair has one row');
$node->restart;
$node->safe_psql('postgres',
	"SELECT idem_reserve($long_t, $long_s, 'k' || i, '{}') FROM generate_series(3, 5) i");
is($node->safe_psql('postgres', $long_sum), '1 5',
	'after a clean restart, the same row counts on');
$node->restart;
is($node->safe_psql('postgres', $long_sum), '1 5', 'and after another');
is($node->safe_psql('postgres',
		"SELECT convert_to(scope, 'UTF8') IS NOT NULL FROM idempotency.stats WHERE tenant LIKE 'LLL%'"),
	't', 'the short form of a multibyte name is valid UTF-8');

# a version 3 file (names cut at 127 bytes): a name over 110 bytes, whose
# whole form is unknown, is counted under (other); shorter names as they were
my $v3_entry = 'L Z128 Z128 x4 d Q10';
my $v3 =
    pack('L L L q', 0x1de57a75, 3, 10, 2)
  . pack($v3_entry, $dboid, 'v3-short', 'orders', 1.0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0)
  . pack($v3_entry, $dboid, 'x' x 127, 'orders', 1.0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0);
restart_with_statfile($v3);
is($node->safe_psql('postgres',
		"SELECT string_agg(tenant || ' ' || created, ', ' ORDER BY tenant)"
		  . " FROM idempotency.stats"),
	'(other) 3, v3-short 2',
	'a version 3 file is read, its long name under (other)');

# a tenant and scope that an application names "(other)" count into the
# overflow row: one row for the pair, as an exporter keys its series
$node->safe_psql('postgres',
	"SELECT idem_reserve('(other)', '(other)', 'o' || i, '{}') FROM generate_series(1, 2) i");
is($node->safe_psql('postgres',
		"SELECT count(*) || ' ' || sum(created) FROM idempotency.stats"
		  . " WHERE tenant = '(other)' AND scope = '(other)'"),
	'1 5', 'a pair named (other) shares the overflow row');
$node->stop;

# without shared_preload_libraries (neither idempotency nor pg_cron): the
# view and the scheduler say what to do, the rest works
my $plain = PostgreSQL::Test::Cluster->new('plain');
$plain->init;
if ($ENV{IDEM_DESTDIR})
{
	my $libdir = `pg_config --pkglibdir`;
	chomp $libdir;
	$plain->append_conf('postgresql.conf',
		    "extension_destdir = '$ENV{IDEM_DESTDIR}'\n"
		  . "dynamic_library_path = '$ENV{IDEM_DESTDIR}$libdir:\$libdir'\n");
}
$plain->start;
$plain->safe_psql('postgres', 'CREATE EXTENSION idempotency');
my ($ret, $out, $err) =
  $plain->psql('postgres', 'SELECT * FROM idempotency.stats',
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/ERROR:  55000: idempotency statistics are not available/,
	'stats without preload: 55000');
like($err, qr/HINT:  Add idempotency to shared_preload_libraries/,
	'stats without preload: the hint says how');
($ret, $out, $err) =
  $plain->psql('postgres', 'SELECT idem_schedule_maintenance()');
like($err, qr/ERROR:  pg_cron is not loaded on this server/,
	'scheduling without pg_cron loaded: error');
like($err,
	qr/HINT:  Add pg_cron to shared_preload_libraries, .* and there run: SELECT cron.schedule_in_database\('idempotency-maintenance-postgres', '\* \* \* \* \*', 'CALL idempotency.maintain\(''50 seconds''::pg_catalog.interval, 1000::pg_catalog.int4, ''100 milliseconds''::pg_catalog.interval\)', 'postgres'\);/,
	'scheduling without pg_cron loaded: the hint says how');
$node = $plain;
reap_for_tenants('postgres', 'p', 1);
is($plain->safe_psql('postgres', 'SELECT count(*) FROM idempotency.keys'),
	'0', 'the reaper works (and counts nothing) without preload');
$plain->stop;
done_testing();
