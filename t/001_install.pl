# The extension installs into a preloaded cluster and survives a restart.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest qw(without_job_warning new_idem_node);

my $node = new_idem_node('install');
is($node->safe_psql('postgres',
		"SELECT extversion FROM pg_extension WHERE extname = 'idempotency'"),
	'1.1', 'extension created');
is($node->safe_psql('postgres', 'SHOW idempotency.default_ttl'),
	'1d', 'GUCs registered at preload');
$node->restart;
is($node->safe_psql('postgres', 'SHOW idempotency.max_request_size'),
	'1MB', 'server restarts with the library preloaded');

# Two databases install the extension at the same time, before its roles
# exist: the second one's CREATE ROLE waits for the first one's and then
# finds the name taken.  The install takes the role the other made.
$node->safe_psql('postgres', 'DROP EXTENSION idempotency');
$node->safe_psql('postgres',
	'DROP ROLE idempotency_app, idempotency_worker, idempotency_admin');
$node->safe_psql('postgres', 'CREATE DATABASE r1');
$node->safe_psql('postgres', 'CREATE DATABASE r2');
my $first = $node->background_psql('r1', on_error_stop => 0);
$first->query_safe('BEGIN; CREATE EXTENSION idempotency;');
my $second = $node->background_psql('r2', on_error_stop => 0);
$second->query_until(qr/started/, "\\echo started\nCREATE EXTENSION idempotency;\n");
ok($node->poll_query_until('postgres', q{
SELECT count(*) > 0 FROM pg_stat_activity
 WHERE datname = 'r2' AND wait_event_type = 'Lock'}),
	'the second install waits for the roles of the first');
$first->query_safe('COMMIT');
$first->quit;
$second->quit;
is($second->{stderr}, '', 'the second install raised no error');
is($node->safe_psql('r2',
		"SELECT extversion FROM pg_extension WHERE extname = 'idempotency'"),
	'1.1', 'and created the extension');
is($node->safe_psql('r2',
		"SELECT count(*) FROM pg_roles WHERE rolname LIKE 'idempotency\\_%'"),
	'3', 'one of each role');

# installed in a schema of the DBA's choice (and updated there from 1.0),
# with README's grant of the schema to the roles: then granting one role is
# the whole set-up of a login role; the extension itself grants nothing on
# the schema (pg_dump would then leave out the DBA's own grants on it)
for my $version ('1.1', '1.0')
{
	my $db = 'api' . ($version =~ s/\.//r);
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db,
		"CREATE SCHEMA api; CREATE EXTENSION idempotency SCHEMA api VERSION '$version'");
	$node->safe_psql($db, 'ALTER EXTENSION idempotency UPDATE')
	  if $version eq '1.0';
	is($node->safe_psql($db,
			"SELECT count(*) FROM pg_init_privs WHERE classoid = 'pg_namespace'::regclass"
			  . " AND objoid = 'api'::regnamespace"),
		'0', "SCHEMA api ($version): no initial privileges recorded on the schema");
	$node->safe_psql($db,
		'GRANT USAGE ON SCHEMA api TO idempotency_app, idempotency_worker, idempotency_admin, pg_monitor');
	$node->safe_psql($db, q{
		DO $$ BEGIN
			IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'api_app') THEN
				CREATE ROLE api_app LOGIN; CREATE ROLE api_worker LOGIN;
				CREATE ROLE api_dba LOGIN;
				GRANT idempotency_app TO api_app;
				GRANT idempotency_worker TO api_worker;
				GRANT idempotency_admin TO api_dba;
			END IF;
		END $$});
	my $as = sub { $node->connstr($db) . " user=$_[0]" };
	is($node->safe_psql($db,
			"SELECT outcome FROM api.idem_reserve('acme', 'orders', 'k1', '{}')",
			connstr => $as->('api_app')),
		'created', "SCHEMA api ($version): the application reserves");
	is($node->safe_psql($db, 'SELECT count(*) FROM api.outbox_claim(\'w\')',
			connstr => $as->('api_worker')),
		'0', "SCHEMA api ($version): the worker claims");
	is($node->safe_psql($db, 'CALL api.idem_maintain()',
			connstr => $as->('api_dba')) // '',
		'', "SCHEMA api ($version): the operator runs maintenance");
}
# created (or updated from 1.0) where standard_conforming_strings is off,
# a database's legacy setting: the install script's literals mean what they
# say, and guard_coverage lists a table whose schema looks like a
# temporary one ("pg-temp-billing") as it does elsewhere
for my $version ('1.1', '1.0')
{
	my $db = 'legacy' . ($version =~ s/\.//r);
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql('postgres',
		"ALTER DATABASE $db SET standard_conforming_strings = off");
	my ($stdout, $stderr);
	$node->psql($db, "CREATE EXTENSION idempotency VERSION '$version'",
		stdout => \$stdout, stderr => \$stderr, on_error_die => 1);
	$node->psql($db, 'ALTER EXTENSION idempotency UPDATE',
		stdout => \$stdout, stderr => \my $update_stderr, on_error_die => 1)
	  if $version eq '1.0';
	is(without_job_warning($stderr . ($update_stderr // '')), '',
		"standard_conforming_strings off ($version): installed without a warning");
	$node->safe_psql($db, q{
		CREATE SCHEMA "pg-temp-billing";
		CREATE TABLE "pg-temp-billing".charges (id int);
		CREATE SCHEMA pgXtempXledger;
		CREATE TABLE pgXtempXledger.entries (id int)});
	is($node->safe_psql($db,
			'SELECT string_agg(table_name::text, \',\' ORDER BY table_name::text)'
			  . ' FROM idempotency.guard_coverage WHERE NOT guarded'),
		'"pg-temp-billing".charges,pgxtempxledger.entries',
		"standard_conforming_strings off ($version): guard_coverage lists every table");
}
$node->stop;
done_testing();
