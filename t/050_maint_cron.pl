# Scheduled maintenance with pg_cron really preloaded: idem_schedule_maintenance
# in pg_cron's own database, the hinted cron.schedule_in_database call for
# another database, a real run of each job, and idem_unschedule_maintenance.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest qw(new_idem_node have_pg_cron);

plan skip_all => 'pg_cron is not installed for this server' unless have_pg_cron();

# pg_cron connects to the jobs' database over libpq: point it at the test
# cluster's Unix socket directory (the test clusters do not listen on TCP)
my $node = new_idem_node('cron',
	conf => "cron.host = '$PostgreSQL::Test::Cluster::test_pghost'\n");

# in pg_cron's database before CREATE EXTENSION pg_cron: the hint says to
# create it there (the statement for another database would fail)
my ($ret, $out, $err) =
  $node->psql('postgres', "\\set VERBOSITY verbose\nSELECT idem_schedule_maintenance()");
like($err, qr/55000: pg_cron is not installed in database "postgres"/,
	'pg_cron database without the extension: 55000');
like($err, qr/HINT:  Run CREATE EXTENSION pg_cron in this database/,
	'the hint says to create pg_cron there');
$node->safe_psql('postgres', 'CREATE EXTENSION pg_cron');

# a schedule of five fields that pg_cron cannot parse (a minute 99):
# pg_cron's 22023, with the extension's hint, no job
($ret, $out, $err) =
  $node->psql('postgres', "\\set VERBOSITY verbose\nSELECT idem_schedule_maintenance('99 * * * *')");
like($err, qr/22023:/, 'a bad schedule: 22023');
like($err, qr/HINT:  Pass a cron schedule of five fields/, 'with a hint');
is($node->safe_psql('postgres', 'SELECT count(*) FROM cron.job'), '0',
	'and no job');
$node->safe_psql('postgres', 'CREATE DATABASE shop');
$node->safe_psql('shop', 'CREATE EXTENSION idempotency');

# in each database: expired finished keys, a live key, a stuck reservation
my $rows = q{
	INSERT INTO idempotency.keys (tenant_id, scope, idem_key, fingerprint,
	                              status, locked_at, expires_at)
	SELECT 'cron', 'orders', 'old-' || g, sha256(g::text::bytea), 'succeeded'::idempotency.status,
	       now() - interval '2 hours', now() - interval '1 hour'
	  FROM generate_series(1, 100) g
	UNION ALL
	SELECT 'cron', 'orders', 'live', sha256('live'::bytea), 'succeeded',
	       now(), now() + interval '1 day'
	UNION ALL
	SELECT 'cron', 'orders', 'stuck', sha256('stuck'::bytea), 'processing',
	       now() - interval '1 hour', now() + interval '1 day';
};
$node->safe_psql($_, $rows) for qw(postgres shop);

# where pg_cron lives, the extension schedules its own job
# the job's command names the procedure and types every argument: it does
# not depend on the job owner's search_path
my $maintain_call =
  "CALL idempotency.maintain('50 seconds'::pg_catalog.interval, 1000::pg_catalog.int4, '100 milliseconds'::pg_catalog.interval)";
my $jobid = $node->safe_psql('postgres', 'SELECT idem_schedule_maintenance()');
like($jobid, qr/^\d+$/, 'job scheduled in the pg_cron database');
is( $node->safe_psql(
		'postgres',
		"SELECT jobname || ' | ' || schedule || ' | ' || command || ' | ' || database FROM cron.job"
	),
	"idempotency-maintenance-postgres | * * * * * | $maintain_call | postgres",
	'the job runs idem_maintain in this database');
is($node->safe_psql('postgres', "SELECT idem_schedule_maintenance('* * * * *')"),
	$jobid, 'scheduling again updates the same job');

# elsewhere, the error's hint is the exact statement to run in pg_cron's database
($ret, $out, $err) = $node->psql('shop', 'SELECT idem_schedule_maintenance()');
isnt($ret, 0, 'no pg_cron in database shop: error');
like($err, qr/pg_cron is not installed in database "shop"/, 'error says why');
my ($hint_sql) = $err =~ /HINT:\s+Connect to database "postgres" as a superuser and run: (.*;)/;
ok(defined $hint_sql, 'hint carries a statement') or diag($err);
$node->safe_psql('postgres', $hint_sql);
is( $node->safe_psql(
		'postgres',
		"SELECT command || ' | ' || database FROM cron.job WHERE jobname = 'idempotency-maintenance-shop'"
	),
	"$maintain_call | shop",
	'the hinted statement schedules maintenance of database shop');

# a schedule in seconds, from another database: pg_cron before 1.5 takes
# none, so the extension refuses it there (the hint would hand out a
# statement pg_cron refuses); 1.5 and later take it, through the hint
my $cron_version = $node->safe_psql('postgres',
	"SELECT extversion FROM pg_extension WHERE extname = 'pg_cron'");
($ret, $out, $err) = $node->psql('shop',
	"\\set VERBOSITY verbose\nSELECT idem_schedule_maintenance('30 seconds')");
my ($cron_major, $cron_minor) = split /\./, $cron_version;
if ($cron_major == 1 && $cron_minor < 5)
{
	like($err, qr/22023: invalid schedule: 30 seconds/,
		"pg_cron $cron_version: a schedule in seconds is refused in another database");
	like($err, qr/DETAIL:  pg_cron $cron_version, installed on this server, takes no schedule in seconds/,
		'the detail names the version');
}
else
{
	my ($seconds_sql) = $err =~ /run: (.*;)/;
	ok(defined $seconds_sql, "pg_cron $cron_version: the hint carries a statement")
	  or diag($err);
	$node->safe_psql('postgres', $seconds_sql);
	$node->safe_psql('postgres',
		"SELECT cron.schedule_in_database('idempotency-maintenance-shop', '* * * * *', '$maintain_call', 'shop')");
	pass('and pg_cron takes it');
}

# pg_cron starts jobs on the minute: wait for one run of each
$node->poll_query_until('postgres',
	"SELECT count(DISTINCT jobid) = 2 FROM cron.job_run_details WHERE status IN ('succeeded', 'failed')"
) or die 'pg_cron did not run the jobs';
is( $node->safe_psql(
		'postgres',
		"SELECT string_agg(DISTINCT status || ': ' || coalesce(return_message, ''), ', ') FROM cron.job_run_details"
	),
	'succeeded: CALL',
	'both runs succeeded');

for my $db (qw(postgres shop))
{
	is( $node->safe_psql(
			$db,
			"SELECT string_agg(idem_key || ' ' || status || ' ' || needs_reconciliation, ', ' ORDER BY idem_key) FROM idempotency.keys"
		),
		'live succeeded false, stuck processing true',
		"$db: expired keys reaped, the stuck reservation flagged");
}
is($node->safe_psql('postgres',
		"SELECT reaped || ' ' || swept FROM idempotency.stats WHERE tenant = 'cron'"),
	'100 1', 'the run counted in the stats');

# README's job that bounds pg_cron's run history, which grows by a row a
# run: its command keeps the last 10,080 runs, whatever their times (a
# run that could not connect has none), and deletes the older ones
my ($purge_sql) = PostgreSQL::Test::Utils::slurp_file('README.md') =~
  /(SELECT cron\.schedule\('purge-cron-history'.*?\);)/s;
ok(defined $purge_sql, 'README shows a job that bounds the run history');
$node->safe_psql('postgres', $purge_sql);
my $last_run = $node->safe_psql('postgres', 'SELECT max(runid) FROM cron.job_run_details');
# the first run made older than the last 10,080, as a run that failed to
# connect is recorded: no start_time, no end_time
$node->safe_psql('postgres',
	"UPDATE cron.job_run_details SET runid = $last_run - 20000, status = 'failed',"
	  . " return_message = 'connection failed', start_time = NULL, end_time = NULL"
	  . " WHERE runid = (SELECT min(runid) FROM cron.job_run_details)");
my $runs_sql = "SELECT count(*) || ' ' || count(*) FILTER (WHERE runid < $last_run - 10080)"
  . " FROM cron.job_run_details WHERE runid <= $last_run";
my ($runs, $old_runs) = split / /, $node->safe_psql('postgres', $runs_sql);
is($old_runs, '1', 'one run recorded as older than the last 10,080');
$node->safe_psql('postgres',
	"DO \$\$BEGIN EXECUTE (SELECT command FROM cron.job WHERE jobname = 'purge-cron-history'); END\$\$");
is($node->safe_psql('postgres', $runs_sql), ($runs - 1) . ' 0',
	'its command deletes that run, and only that one');
$node->safe_psql('postgres', "SELECT cron.unschedule('purge-cron-history')");

# unschedule: refused in a read-only transaction (cron.unschedule would
# delete the job all the same), then true once, then false; database shop
# through the hint again
($ret, $out, $err) = $node->psql('postgres',
	"BEGIN READ ONLY;\n\\set VERBOSITY verbose\nSELECT idem_unschedule_maintenance();\nCOMMIT;");
like($err, qr/ERROR:  25006: cannot execute idem_unschedule_maintenance\(\) in a read-only transaction/,
	'unschedule in a read-only transaction: 25006');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM cron.job WHERE jobname = 'idempotency-maintenance-postgres'"),
	'1', 'and the job is still there');
is($node->safe_psql('postgres', 'SELECT idem_unschedule_maintenance()'),
	't', 'unscheduled');
is($node->safe_psql('postgres', 'SELECT idem_unschedule_maintenance()'),
	'f', 'unscheduling twice is not an error');
($ret, $out, $err) = $node->psql('shop', 'SELECT idem_unschedule_maintenance()');
($hint_sql) = $err =~ /run: (.*;)/;
ok(defined $hint_sql, 'unschedule hint carries a statement') or diag($err);
$node->safe_psql('postgres', $hint_sql);
is($node->safe_psql('postgres', 'SELECT count(*) FROM cron.job'),
	'0', 'no job left');

# A job version 1.0 scheduled calls its procedure through the schema the
# functions were installed in (public, which the database owner may own:
# the job runs as a superuser).  On the 1.0 catalog the 1.1 library
# refuses to schedule such a job; the update changes an existing one to
# call idempotency.maintain, keeping its schedule, in pg_cron's database,
# and elsewhere warns with the statement to run there.
my $old_call =
  "CALL public.idem_maintain('50 seconds'::pg_catalog.interval, 1000::pg_catalog.int4, '100 milliseconds'::pg_catalog.interval)";
for my $db (qw(postgres shop))
{
	$node->safe_psql($db,
		"DROP EXTENSION idempotency; CREATE EXTENSION idempotency VERSION '1.0'");
	$node->safe_psql('postgres',
		"SELECT cron.schedule_in_database('idempotency-maintenance-$db', '*/5 * * * *', \$\$$old_call\$\$, '$db')");
}
($ret, $out, $err) = $node->psql('postgres',
	"\\set VERBOSITY verbose\nSELECT idem_schedule_maintenance()");
like($err, qr/55000: the idempotency extension in this database is at version 1.0/,
	'on the 1.0 catalog, no job naming its schema is scheduled');
like($err, qr/HINT:  Run ALTER EXTENSION idempotency UPDATE/, 'the hint says to update first');
($ret, $out, $err) = $node->psql('postgres', 'ALTER EXTENSION idempotency UPDATE');
is($ret, 0, "the update in pg_cron's database") or diag($err);
is($node->safe_psql('postgres',
		"SELECT schedule || ' | ' || command FROM cron.job WHERE jobname = 'idempotency-maintenance-postgres'"),
	"*/5 * * * * | $maintain_call",
	"changes the job of 1.0 to call idempotency.maintain, on its schedule");
($ret, $out, $err) = $node->psql('shop', 'ALTER EXTENSION idempotency UPDATE');
is($ret, 0, 'the update in another database');
like($err, qr/WARNING:  a maintenance job version 1.0 scheduled for database "shop" must be changed in database "postgres"/,
	'warns that its job is changed in pg_cron\'s database');
($hint_sql) = $err =~ /HINT:\s+If there is one, connect to database postgres as a superuser and run: (.*;)/;
ok(defined $hint_sql, 'with the statement to run there') or diag($err);
$node->safe_psql('postgres', $hint_sql);
is($node->safe_psql('postgres',
		"SELECT schedule || ' | ' || command FROM cron.job WHERE jobname = 'idempotency-maintenance-shop'"),
	"*/5 * * * * | $maintain_call", 'which changes the job of database shop');

$node->stop;
done_testing();
