# Nothing planted in a schema on the caller's search_path ever runs inside
# the extension: operators and functions that the install script's SQL uses
# are created in public before CREATE EXTENSION, public is put first on the
# database's search_path, and every function, procedure and view is run —
# directly and as maintenance really scheduled by pg_cron (which runs it as
# the extension owner, a superuser).  Each planted object logs who ran it.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest qw(new_idem_node have_pg_cron);

# pg_cron reaches the database through the test cluster's socket
my $node = new_idem_node('search_path',
	conf => "cron.host = '$PostgreSQL::Test::Cluster::test_pghost'\n");
$node->safe_psql('postgres', 'CREATE EXTENSION pg_cron') if have_pg_cron();
$node->safe_psql('postgres', 'CREATE DATABASE shop');

# the planted objects: every operator (on the argument types the SQL bodies
# use) and the shadowable functions
$node->safe_psql('shop', q{
CREATE TABLE public.planted_calls (what text, who name);
GRANT INSERT ON public.planted_calls TO PUBLIC;
DO $plant$
DECLARE
    op record;
    f record;
BEGIN
    FOR op IN SELECT * FROM (VALUES
        ('*', 'interval', 'integer', 'interval'),
        ('*', 'interval', 'double precision', 'interval'),
        ('+', 'timestamp with time zone', 'interval', 'timestamp with time zone'),
        ('-', 'timestamp with time zone', 'interval', 'timestamp with time zone'),
        ('-', 'timestamp with time zone', 'timestamp with time zone', 'interval'),
        ('<', 'timestamp with time zone', 'timestamp with time zone', 'boolean'),
        ('<=', 'timestamp with time zone', 'timestamp with time zone', 'boolean'),
        ('>=', 'timestamp with time zone', 'timestamp with time zone', 'boolean'),
        ('<', 'interval', 'interval', 'boolean'),
        ('<=', 'interval', 'interval', 'boolean'),
        ('>', 'interval', 'interval', 'boolean'),
        ('<', 'bigint', 'integer', 'boolean'),
        ('<', 'integer', 'integer', 'boolean'),
        ('>', 'integer', 'integer', 'boolean'),
        ('+', 'bigint', 'bigint', 'bigint'),
        ('=', 'text', 'text', 'boolean'),
        ('<>', 'text', 'text', 'boolean'),
        ('||', 'text', 'text', 'text'),
        ('=', 'anyenum', 'anyenum', 'boolean'),
        ('<>', 'anyenum', 'anyenum', 'boolean'),
        ('=', 'oid', 'oid', 'boolean'),
        ('=', 'uuid', 'uuid', 'boolean'),
        ('=', 'jsonb', 'jsonb', 'boolean'),
        ('<>', 'jsonb', 'jsonb', 'boolean'),
        ('->', 'jsonb', 'text', 'jsonb'),
        ('#>>', 'jsonb', 'text[]', 'text'),
        ('?', 'jsonb', 'text', 'boolean')) AS t(name, l, r, res)
    LOOP
        EXECUTE format(
            'CREATE FUNCTION public.planted_%s(%s, %s) RETURNS %s LANGUAGE plpgsql AS '
            '$f$ BEGIN INSERT INTO public.planted_calls VALUES (%L, current_user); '
            'RETURN NULL; END $f$',
            md5(op.name || op.l || op.r), op.l, op.r, op.res,
            op.name || '(' || op.l || ', ' || op.r || ')');
        EXECUTE format('CREATE OPERATOR public.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = public.planted_%s)',
            op.name, op.l, op.r, md5(op.name || op.l || op.r));
    END LOOP;
    FOR f IN SELECT * FROM (VALUES
        ('now', '', 'timestamp with time zone'),
        ('clock_timestamp', '', 'timestamp with time zone'),
        ('current_setting', 'text, boolean', 'text'),
        ('pg_sleep_for', 'interval', 'boolean'),
        ('jsonb_typeof', 'jsonb', 'text'),
        ('jsonb_object_keys', 'jsonb', 'text'),
        ('array_to_string', 'text[], text', 'text'),
        ('make_interval', 'integer, integer, integer, integer, integer, integer, double precision', 'interval'),
        ('left', 'text, integer', 'text'),
        ('format', 'text', 'text'),
        ('idem_sweep', '', 'bigint'),
        ('idem_reclaim_leases', 'integer', 'bigint')) AS t(name, args, res)
    LOOP
        EXECUTE format(
            'CREATE FUNCTION public.%I(%s) RETURNS %s LANGUAGE plpgsql AS '
            '$f$ BEGIN INSERT INTO public.planted_calls VALUES (%L, current_user); '
            'RETURN NULL; END $f$',
            f.name, f.args, f.res, f.name || '(' || f.args || ')');
    END LOOP;
END
$plant$;
ALTER DATABASE shop SET search_path = public, pg_catalog;
});

$node->safe_psql('shop', 'CREATE EXTENSION idempotency');

my $calls = q{SELECT pg_catalog.count(*) FROM public.planted_calls};
is($node->safe_psql('shop', $calls), '0', 'installing runs nothing planted');

# every function, procedure and view, with the planted search_path
$node->safe_psql('shop', q{
CREATE ROLE sp_bound LOGIN;
SELECT idem_configure_scope('pay', '{"ttl": "1 day", "lock_timeout": 1, "stale_action": "takeover", "fingerprint_ignore": ["/trace"]}');
SELECT idem_configure_scope('ship', '{"lock_timeout": "1 second"}');
SELECT idem_bind_tenant('sp_bound', 'acme');
SELECT idem_unbind_tenant('sp_bound');
BEGIN;
SELECT idem_reserve('acme', 'pay', 'k1', '{"amount": 1, "trace": "x"}');
SELECT outbox_enqueue('acme', 'charge', '{"amount": 1}', 'k1', 'pay');
SELECT idem_complete('acme', 'pay', 'k1', 201, '{"id": 1}', '{"Location": "/c/1"}');
COMMIT;
SELECT idem_reserve('acme', 'pay', 'k1', '{"amount": 1, "trace": "y"}');
SELECT * FROM idem_lookup('acme', 'pay', 'k1');
SELECT idem_reserve('acme', 'pay', 'k2', fingerprint => sha256('b'), ttl => '1 hour', wait => '0');
SELECT idem_reserve('acme', 'ship', 'k3', '{}');
SELECT idem_reserve('acme', 'ship', 'k4', '{}');
SELECT pg_sleep(1.2);
SELECT idem_reserve('acme', 'pay', 'k2', fingerprint => sha256('b'));
SELECT idem_reserve('acme', 'ship', 'k3', '{}');
SELECT idem_resolve('acme', 'ship', 'k3', 200, '{}');
SELECT idem_sweep('1 second');
SELECT c.id AS id1, c.lease_token AS t1 FROM outbox_claim('w', 1, '1 minute') c \gset
SELECT outbox_nack('acme', :id1, :'t1', 'boom', '0');
SELECT outbox_enqueue('acme', 'mail', '{}', max_attempts => 1);
SELECT c.id AS id2, c.lease_token AS t2 FROM outbox_claim('w', 1, '1 minute', topics => '{mail}') c \gset
SELECT outbox_nack('acme', :id2, :'t2', 'dead');
SELECT outbox_requeue('acme', :id2);
SELECT c.id AS id3, c.lease_token AS t3 FROM outbox_claim('w', 1, '1 minute', tenant => 'acme') c \gset
SELECT outbox_ack('acme', :id3, :'t3', 'ref');
SELECT outbox_enqueue('acme', 'poison', '{}', max_attempts => 1) AS id4 \gset
SELECT c.lease_token AS t4 FROM outbox_claim('w', 1, '1 minute', topics => '{poison}') c \gset
SELECT outbox_nack('acme', :id4, :'t4', 'rejected');
SELECT outbox_discard('acme', :id4);
SELECT idem_reap(10);
SELECT idem_reclaim_leases();
SELECT idem_purge_outbox(10);
SELECT * FROM idempotency.health;
SELECT * FROM idempotency.stats;
SELECT * FROM idempotency.dead_letters;
SELECT idem_canonical('{"b": 1, "a": [1.50, "x"]}');
SELECT idem_fingerprint('{"b": 1}', '{/b}');
SELECT idem_stats_reset();
});
# enough expired keys for several reap batches, so that every branch of
# idem_maintain runs
$node->safe_psql('shop', join('', map {
	"BEGIN; SELECT idem_reserve('acme', 'old', 'o$_', '{}', ttl => '1 second');"
	  . " SELECT idem_complete('acme', 'old', 'o$_', 200, '{}'); COMMIT;\n"
} 1 .. 25) . 'SELECT pg_sleep(1.1);');
$node->safe_psql('shop', q{CALL idem_maintain('2 seconds', 10, '1 millisecond')});
is($node->safe_psql('shop', $calls), '0',
	'every function, procedure and view runs nothing planted');

# maintenance as pg_cron runs it: scheduled from pg_cron's database, run in
# shop as the extension owner with shop's search_path
SKIP:
{
	skip 'pg_cron is not installed for this server', 3 unless have_pg_cron();
	my ($ret, $out, $err) =
	  $node->psql('shop', 'SELECT idem_schedule_maintenance()');
	my ($hint_sql) = $err =~ /run: (SELECT cron\.schedule_in_database.*;)/;
	ok(defined $hint_sql,
		'the hint says how to schedule from pg_cron\'s database')
	  or diag($err);
	$node->safe_psql('postgres', $hint_sql);
	my $ran = $node->poll_query_until('postgres', q{
SELECT count(*) > 0 FROM cron.job_run_details d JOIN cron.job j USING (jobid)
 WHERE j.jobname = 'idempotency-maintenance-shop' AND d.status = 'succeeded'});
	ok($ran, 'pg_cron ran maintenance in shop')
	  or diag($node->safe_psql('postgres',
		'SELECT string_agg(status || coalesce(return_message, \'\'), \', \') FROM cron.job_run_details'
	  ));
	is($node->safe_psql('shop', $calls),
		'0', 'maintenance run by pg_cron runs nothing planted');
}

# A database owner renames the extension's schema and creates another of
# its name (PostgreSQL 15 gives public to the database owner), with objects
# named like the extension's.  Neither what runs as the extension owner
# (idem_configure_scope) nor the scheduled job's command, run as a
# superuser as pg_cron runs it, nor a DBA's idem_maintain calls them.
$node->safe_psql('postgres', q{
CREATE ROLE shop_owner LOGIN;
CREATE DATABASE owned OWNER shop_owner;
GRANT idempotency_admin TO shop_owner;
});
$node->safe_psql('owned', 'CREATE EXTENSION idempotency');
my @as_owner = (extra_params => [ '-U', 'shop_owner' ]);
$node->safe_psql('owned', q{
ALTER SCHEMA public RENAME TO public_orig;
CREATE SCHEMA public;
CREATE TABLE public.planted_calls (what text, who name);
GRANT INSERT ON public.planted_calls TO PUBLIC;
CREATE FUNCTION public.planted(what text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.planted_calls VALUES (what, current_user);
    IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
        EXECUTE 'ALTER ROLE shop_owner SUPERUSER';
    END IF;
END $$;
CREATE FUNCTION public.idem_sweep(interval) RETURNS bigint LANGUAGE plpgsql
    AS $$ BEGIN PERFORM public.planted('idem_sweep'); RETURN 0; END $$;
CREATE FUNCTION public.idem_reclaim_leases() RETURNS bigint LANGUAGE plpgsql
    AS $$ BEGIN PERFORM public.planted('idem_reclaim_leases'); RETURN 0; END $$;
CREATE FUNCTION public.idem_reap(int) RETURNS bigint LANGUAGE plpgsql
    AS $$ BEGIN PERFORM public.planted('idem_reap'); RETURN 0; END $$;
CREATE FUNCTION public.idem_purge_outbox(int) RETURNS bigint LANGUAGE plpgsql
    AS $$ BEGIN PERFORM public.planted('idem_purge_outbox'); RETURN 0; END $$;
CREATE FUNCTION public.idem_fingerprint(jsonb, text[]) RETURNS bytea LANGUAGE plpgsql
    AS $$ BEGIN PERFORM public.planted('idem_fingerprint'); RETURN NULL; END $$;
CREATE PROCEDURE public.idem_maintain(interval, int, interval) LANGUAGE plpgsql
    AS $$ BEGIN PERFORM public.planted('idem_maintain'); END $$;
SELECT public_orig.idem_configure_scope('pay', '{"fingerprint_ignore": ["/trace"]}');
}, @as_owner);
my ($sret, $sout, $serr) =
  $node->psql('owned', 'SELECT public_orig.idem_schedule_maintenance()');
my ($job) = $serr =~
  /schedule_in_database\('(?:[^']|'')*', '(?:[^']|'')*', '((?:[^']|'')*)'/;
ok(defined $job, 'the hint gives the job\'s command') or diag($serr);
$job =~ s/''/'/g if defined $job;
$node->safe_psql('owned', $job // 'SELECT');
$node->safe_psql('owned',
	q{CALL public_orig.idem_maintain('1 second', 10, '1 millisecond')});
is( $node->safe_psql(
		'owned',
		q{SELECT count(*) || ' ' || (SELECT rolsuper FROM pg_roles WHERE rolname = 'shop_owner')
		    FROM public.planted_calls}),
	'0 false',
	'with the extension\'s schema renamed and replaced, nothing planted runs and the owner stays unprivileged');

$node->stop;
done_testing();
