# Key spraying: one tenant creates keys as fast as it can from several
# connections while another tenant sends ordinary requests.  The sprayer
# gets exactly its burst of new keys and rate_limited for the rest, nothing
# written; the other tenant's requests all pass.  A quota of live keys holds
# under the same storm, and after a restart one count of a big tenant's keys
# serves all of its concurrent new keys.  Without the library in
# shared_preload_libraries a scope that sets a rate is refused (55000).
use strict;
use warnings;
use File::Temp qw(tempdir);
use Time::HiRes;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest qw(new_idem_node run_in);

my $node = new_idem_node('rate_limit');
my $dir = tempdir(CLEANUP => 1);

# 50 new keys at once per tenant, then one every 1000 seconds
$node->safe_psql('postgres', q{
	SELECT idem_configure_scope('POST /v1/charges',
	       '{"new_keys_per_second": 0.001, "new_keys_burst": 50}')});

sub script
{
	my ($tenant) = @_;
	my $file = "$dir/$tenant.sql";
	open(my $fh, '>', $file) or die;
	print $fh "\\set k random(1, 1000000000000)\n"
	  . "SELECT outcome FROM idem_reserve('$tenant', 'POST /v1/charges', "
	  . "'k-' || :client_id || '-' || :k, fingerprint => sha256((:k)::text::bytea));\n";
	close $fh;
	return $file;
}

my @conn = ('-h', $node->host, '-p', $node->port, 'postgres');
# the sprayer: 4 connections, 250 new keys each
my $spray = IPC::Run::start(
	[ 'pgbench', '-n', '-c', '4', '-j', '2', '-t', '250', '-f', script('spray'), @conn ],
	'>', "$dir/spray.out", '2>&1');
# the honest tenant: 2 connections, 20 requests each, at the same time
my $honest = IPC::Run::start(
	[ 'pgbench', '-n', '-c', '2', '-j', '1', '-t', '20', '-f', script('honest'), @conn ],
	'>', "$dir/honest.out", '2>&1');
ok($spray->finish, 'the sprayer ran its 1000 reservations')
  or diag(slurp_file("$dir/spray.out"));
ok($honest->finish, 'the honest tenant ran its 40 reservations')
  or diag(slurp_file("$dir/honest.out"));

is($node->safe_psql('postgres',
		"SELECT count(*) FROM idempotency.keys WHERE tenant_id = 'spray'"),
	50, 'the sprayer got exactly its burst of keys; the 950 others wrote nothing');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM idempotency.keys WHERE tenant_id = 'honest'"),
	40, 'every request of the other tenant created its key');
is($node->safe_psql('postgres', q{
	SELECT outcome || ' ' || http_status || ' ' || (retry_after > 900)
	  FROM idem_reserve('spray', 'POST /v1/charges', 'one-more', '{}')}),
	'rate_limited 429 true', 'the next new key is answered 429 with retry_after');
is($node->safe_psql('postgres',
		"SELECT created FROM idem_stats() WHERE tenant = 'spray'"),
	50, 'only the created keys were counted as created');

# a quota of live keys, under the same storm: the sprayer fills its quota
# and is refused from then on (over it only by the keys being created at
# the moment of a count: at most one per other connection), while the
# honest tenant's requests all pass
$node->safe_psql('postgres', q{
	SELECT idem_configure_scope('POST /v1/refunds', '{"max_live_keys": 50}')});
sub quota_script
{
	my ($tenant) = @_;
	my $file = "$dir/$tenant-quota.sql";
	open(my $fh, '>', $file) or die;
	print $fh "\\set k random(1, 1000000000000)\n"
	  . "SELECT outcome FROM idem_reserve('$tenant', 'POST /v1/refunds', "
	  . "'k-' || :client_id || '-' || :k, fingerprint => sha256((:k)::text::bytea));\n";
	close $fh;
	return $file;
}
$spray = IPC::Run::start(
	[ 'pgbench', '-n', '-c', '4', '-j', '2', '-t', '250', '-f', quota_script('spray'), @conn ],
	'>', "$dir/spray-quota.out", '2>&1');
$honest = IPC::Run::start(
	[ 'pgbench', '-n', '-c', '2', '-j', '1', '-t', '20', '-f', quota_script('honest'), @conn ],
	'>', "$dir/honest-quota.out", '2>&1');
ok($spray->finish, 'the sprayer ran its 1000 reservations against the quota')
  or diag(slurp_file("$dir/spray-quota.out"));
ok($honest->finish, 'the honest tenant ran its 40 reservations')
  or diag(slurp_file("$dir/honest-quota.out"));
my $stormed = $node->safe_psql('postgres',
	"SELECT count(*) FROM idempotency.keys WHERE tenant_id = 'spray' AND scope = 'POST /v1/refunds'");
cmp_ok($stormed, '<=', 53,
	'the storm went over the quota by at most one key per other connection');
# and filled it: a key is counted twice only when it commits between the
# moment a count reads the admissions and the moment it takes its snapshot
cmp_ok($stormed, '>=', 47,
	'the storm filled the quota but for at most one key per other connection');
# the next count, a second later, is exact: new keys then fill the quota
# (if the storm left room) and no more
sleep(2);
is($node->safe_psql('postgres', q{
	SELECT count(*) FILTER (WHERE r.outcome = 'created') + count(*) FILTER
	       (WHERE r.outcome = 'rate_limited')
	  FROM generate_series(1, 60) g,
	       LATERAL idem_reserve('spray', 'POST /v1/refunds', 'after-' || g,
	                            fingerprint => sha256(g::text::bytea)) r}),
	60, 'sixty more new keys are each created or answered rate_limited');
my $sprayed = $node->safe_psql('postgres',
	"SELECT count(*) FROM idempotency.keys WHERE tenant_id = 'spray' AND scope = 'POST /v1/refunds'");
is($sprayed, $stormed > 50 ? $stormed : 50,
	'one count later the sprayer has filled its quota, and no more');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM idempotency.keys WHERE tenant_id = 'honest' AND scope = 'POST /v1/refunds'"),
	40, 'every request of the other tenant created its key');
is($node->safe_psql('postgres',
		"SELECT (created + rate_limited)::text || ' ' || (created = $sprayed)::text"
		  . " FROM idem_stats() WHERE tenant = 'spray' AND scope = 'POST /v1/refunds'"),
	'1060 true', 'every other reservation was answered rate_limited');

# a cold quota: after a restart (as after the full table was emptied) a
# pair's live keys are unknown until they are counted, and one count of a
# tenant's keys serves all of the tenant's new keys that arrive meanwhile:
# the others wait for it rather than each count the same keys again
$node->safe_psql('postgres', q{
	SELECT idem_configure_scope('POST /v1/payouts', '{"max_live_keys": 1000000}')});
my $big = 50000;
$node->safe_psql('postgres', qq{
	INSERT INTO idempotency.keys (tenant_id, scope, idem_key, fingerprint,
	       status, response_code, completed_at, expires_at)
	SELECT 'big', 'POST /v1/payouts', 'old-' || g, sha256(g::text::bytea),
	       'succeeded', 201, now(), now() + interval '1 day'
	  FROM generate_series(1, $big) g;
	ANALYZE idempotency.keys});
$node->restart;

# every count reads each of the tenant's keys, whatever its plan; a new
# key's own reads fetch at most one row
sub keys_fetched
{
	return $node->safe_psql('postgres', q{
		SELECT seq_tup_read + coalesce(idx_tup_fetch, 0) FROM pg_stat_user_tables
		 WHERE relid = 'idempotency.keys'::regclass});
}

my $racers = 8;
my $holder = $node->background_psql('postgres');
$holder->query_safe('SELECT pg_advisory_lock(4242)');
my @sessions;
for my $i (1 .. $racers)
{
	my $session = $node->background_psql('postgres', on_error_stop => 0);
	# its plans prepared and the scope read beforehand, in a pair of its own
	$session->query_safe(
		"SELECT outcome FROM idem_reserve('warm-$i', 'POST /v1/payouts', 'w', '{}')");
	push @sessions, $session;
}
my $before = keys_fetched();
for my $i (1 .. $racers)
{
	# all wait for the advisory lock, then reserve at the same moment; the
	# statistics are written when each transaction ends
	$sessions[ $i - 1 ]->query_until(qr/waiting/, qq{\\echo waiting
BEGIN;
SELECT pg_advisory_xact_lock_shared(4242) \\g /dev/null
SELECT pg_stat_force_next_flush() \\g /dev/null
SELECT outcome FROM idem_reserve('big', 'POST /v1/payouts', 'new-$i', '{}');
COMMIT;
});
}
ok($node->poll_query_until('postgres', qq{
	SELECT count(*) = $racers FROM pg_locks
	 WHERE locktype = 'advisory' AND NOT granted}),
	'the new keys of a cold pair wait to be reserved at once');
$holder->query_safe('SELECT pg_advisory_unlock(4242)');
my @outcomes;
for my $session (@sessions)
{
	my ($out, $err) = run_in($session, q{SELECT 'done'});
	push @outcomes, $out;
	is($err, '', 'the reservation raised no error');
	$session->quit;
}
$holder->quit;
is(join(',', @outcomes), join(',', ("created\ndone") x $racers),
	'every new key of the cold pair was created');
is(int((keys_fetched() - $before) / $big), 1,
	"$racers new keys of a cold pair counted the tenant's keys once");

# a count that takes longer than the request's statement_timeout still
# lands: the request that runs it is canceled once it is recorded (57014),
# and the tenant's next new keys are admitted from it within the timeout
# (were the count canceled, every new key would count again and be
# canceled in turn)
my $huge = 400000;
$node->safe_psql('postgres', qq{
	INSERT INTO idempotency.keys (tenant_id, scope, idem_key, fingerprint,
	       status, response_code, completed_at, expires_at)
	SELECT 'huge', 'POST /v1/payouts', 'old-' || g, sha256(g::text::bytea),
	       'succeeded', 201, now(), now() + interval '1 day'
	  FROM generate_series(1, $huge) g;
	ANALYZE idempotency.keys});
$node->restart;
my @timed;
for my $i (1 .. 2)
{
	my $session = $node->background_psql('postgres', on_error_stop => 0);
	# plans prepared and the scope read beforehand, in a pair of its own
	$session->query_safe(
		"SELECT outcome FROM idem_reserve('warm-$i', 'POST /v1/payouts', 'w', '{}')");
	$session->query_safe(q{SET statement_timeout = '20ms'});
	push @timed, $session;
}
my ($tout, $terr) = run_in($timed[0], q{\set VERBOSITY verbose
SELECT outcome FROM idem_reserve('huge', 'POST /v1/payouts', 'new-1', '{}')});
like($terr, qr/57014: canceling statement due to statement timeout/,
	"the count of the tenant's keys outlasts the timeout of the request that runs it");
my @later;
for my $i (2 .. 4)
{
	($tout, $terr) = run_in($timed[1],
		"SELECT outcome FROM idem_reserve('huge', 'POST /v1/payouts', 'new-$i', '{}')");
	push @later, $tout . $terr;
}
is(join(',', @later), 'created,created,created',
	"but it is recorded: the tenant's next new keys are admitted under the same timeout");
$_->quit for @timed;

# the locks the count takes are taken first, where a cancel still ends the
# wait: a DBA's ALTER INDEX on the keys table (here held for 3 s) holds a
# counting request up only until its lock_timeout, not until it is done
$node->safe_psql('postgres', q{
	SELECT idem_configure_scope('POST /v1/holds', '{"max_live_keys": 1000}')});
my $dba = $node->background_psql('postgres');
$dba->query_safe(q{BEGIN});
$dba->query_safe(
	q{ALTER INDEX idempotency.keys_expires_at_idx SET TABLESPACE pg_default});
$dba->query_until(qr/holding/, qq{\\echo holding
SELECT pg_sleep(3);
ROLLBACK;
});
my $t0 = [Time::HiRes::gettimeofday()];
my ($hrc, $hout, $herr) = $node->psql('postgres',
	q{SET lock_timeout = '200ms';
	  SELECT outcome FROM idem_reserve('holds', 'POST /v1/holds', 'k1', '{}')},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
my $took = Time::HiRes::tv_interval($t0);
like($herr, qr/55P03: canceling statement due to lock timeout/,
	"a counting request waiting for a DBA's lock ends at its lock_timeout");
cmp_ok($took, '<', 2.5, 'before the DBA is done') or diag("took $took s");
$dba->quit;

# and so is planning it, which reads the table's statistics again after
# an ANALYZE: a DBA holding pg_statistic (VACUUM FULL, or here a LOCK for
# 3 s) holds up a session that counted before only until its lock_timeout
my $app = $node->background_psql('postgres', on_error_stop => 0);
$app->query_safe(
	q{SELECT outcome FROM idem_reserve('stat-warm', 'POST /v1/holds', 'w', '{}')});
$node->safe_psql('postgres', 'ANALYZE idempotency.keys');
$dba = $node->background_psql('postgres');
$dba->query_safe(q{BEGIN});
$dba->query_safe(q{LOCK TABLE pg_statistic IN ACCESS EXCLUSIVE MODE});
$dba->query_until(qr/holding/, qq{\\echo holding
SELECT pg_sleep(3);
ROLLBACK;
});
$t0 = [Time::HiRes::gettimeofday()];
($tout, $terr) = run_in($app, q{\set VERBOSITY verbose
SET lock_timeout = '200ms';
SELECT outcome FROM idem_reserve('stat', 'POST /v1/holds', 'k1', '{}')});
$took = Time::HiRes::tv_interval($t0);
like($terr, qr/55P03: canceling statement due to lock timeout/,
	'a count planned again after an ANALYZE waits for the statistics at its lock_timeout');
cmp_ok($took, '<', 2.5, 'not until the DBA is done') or diag("took $took s");
$app->quit;
$dba->quit;
$node->stop;

# without shared memory the limit cannot be kept: refused, not ignored
my $bare = new_idem_node('rate_limit_bare',
	conf => "shared_preload_libraries = ''\n");
$bare->safe_psql('postgres', q{
	SELECT idem_configure_scope('limited', '{"new_keys_per_second": 5}')});
my ($rc, $out, $err) = $bare->psql('postgres',
	q{SELECT outcome FROM idem_reserve('a', 'limited', 'k1', '{}')},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/55000: scope "limited" limits new keys, which needs idempotency in shared_preload_libraries/,
	'a rate without shared_preload_libraries is 55000');
is($bare->safe_psql('postgres', 'SELECT count(*) FROM idempotency.keys'),
	0, 'and nothing was written');
$bare->safe_psql('postgres', q{
	SELECT idem_configure_scope('quota', '{"max_live_keys": 5}')});
($rc, $out, $err) = $bare->psql('postgres',
	q{SELECT outcome FROM idem_reserve('a', 'quota', 'k1', '{}')},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/55000: scope "quota" limits new keys.*HINT:.*max_live_keys/s,
	'a quota without shared_preload_libraries is 55000 too');
# a scope with both: the hint's statement lifts both at once
$bare->safe_psql('postgres', q{
	SELECT idem_configure_scope('both', '{"new_keys_per_second": 5, "max_live_keys": 5}')});
($rc, $out, $err) = $bare->psql('postgres',
	q{SELECT outcome FROM idem_reserve('a', 'both', 'k1', '{}')});
my ($lift) = $err =~ /HINT:.*or lift both limits: (SELECT .*;)/;
ok(defined $lift, 'the hint holds a statement') or diag($err);
$bare->safe_psql('postgres', $lift);
is($bare->safe_psql('postgres',
		q{SELECT outcome FROM idem_reserve('a', 'both', 'k1', '{}')}),
	'created', 'which lifts the rate and the quota');
is($bare->safe_psql('postgres',
		q{SELECT outcome FROM idem_reserve('a', 'unlimited', 'k1', '{}')}),
	'created', 'scopes without a rate work as before');
$bare->stop;

done_testing();
