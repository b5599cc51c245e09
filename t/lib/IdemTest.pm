# Helpers shared by the TAP tests in t/.
package IdemTest;

use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use Exporter 'import';

our @EXPORT_OK = qw(new_idem_node catalog_snapshot have_pg_cron run_in without_job_warning);

# The server's library directory (of the pg_config first on PATH, as the
# test clusters' binaries are).
sub pkglibdir
{
	my $libdir = `pg_config --pkglibdir`;
	chomp $libdir;
	return $libdir;
}

# Whether pg_cron is installed for the server under test.
sub have_pg_cron
{
	return -f pkglibdir() . '/pg_cron.so';
}

# A fresh cluster with idempotency, and pg_cron when it is installed,
# preloaded, and the extension created in database "postgres" (pg_cron's
# database).  Extra postgresql.conf lines may be passed in %opts{conf},
# parameters of PostgreSQL::Test::Cluster's init (such as
# allows_streaming => 1) in %opts{init}.
sub new_idem_node
{
	my ($name, %opts) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init(%{ $opts{init} // {} });
	my $conf =
	  have_pg_cron()
	  ? "shared_preload_libraries = 'pg_cron,idempotency'\n"
	  . "cron.database_name = 'postgres'\n"
	  : "shared_preload_libraries = 'idempotency'\n";
	if ($ENV{IDEM_DESTDIR})
	{
		# a private installation (see scripts/lib.sh)
		my $libdir = pkglibdir();
		$conf .= "extension_destdir = '$ENV{IDEM_DESTDIR}'\n"
		  . "dynamic_library_path = '$ENV{IDEM_DESTDIR}$libdir:\$libdir'\n";
	}
	$conf .= $opts{conf} if $opts{conf};
	$node->append_conf('postgresql.conf', $conf);
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
	return $node;
}

# Everything the extension created in database $db, one line per object or
# property, sorted, without OIDs: what must be equal between a fresh
# install and an updated one.  Privileges are sorted: the order of grants
# is not a difference.
sub catalog_snapshot
{
	my ($node, $db) = @_;
	return $node->safe_psql($db, <<'SQL');
WITH ext AS (SELECT oid, extconfig, extcondition FROM pg_extension
              WHERE extname = 'idempotency'),
mem AS (SELECT d.classid, d.objid FROM pg_depend d, ext
         WHERE d.refclassid = 'pg_extension'::regclass
           AND d.refobjid = ext.oid AND d.deptype = 'e'),
rels AS (SELECT c.oid, c.relname, c.relkind, c.reloptions, c.relacl
           FROM pg_class c JOIN mem ON mem.classid = 'pg_class'::regclass
                                   AND mem.objid = c.oid),
lines AS (
  SELECT format('function %s(%s) -> %s kind=%s secdef=%s vol=%s strict=%s par=%s config=%s acl=%s lang=%s src=%s comment=%s',
                p.proname, pg_get_function_arguments(p.oid),
                pg_get_function_result(p.oid), p.prokind, p.prosecdef,
                p.provolatile, p.proisstrict, p.proparallel, p.proconfig,
                (SELECT string_agg(a::text, ',' ORDER BY a::text) FROM unnest(p.proacl) a), l.lanname, md5(p.prosrc),
                obj_description(p.oid, 'pg_proc')) AS line
    FROM pg_proc p JOIN mem ON mem.classid = 'pg_proc'::regclass AND mem.objid = p.oid
    JOIN pg_language l ON l.oid = p.prolang
  UNION ALL
  SELECT format('type %s kind=%s labels=%s acl=%s', t.typname, t.typtype,
                (SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder)
                   FROM pg_enum e WHERE e.enumtypid = t.oid), (SELECT string_agg(a::text, ',' ORDER BY a::text) FROM unnest(t.typacl) a))
    FROM pg_type t JOIN mem ON mem.classid = 'pg_type'::regclass AND mem.objid = t.oid
  UNION ALL
  SELECT format('relation %s kind=%s options=%s acl=%s comment=%s', r.relname,
                r.relkind, r.reloptions, (SELECT string_agg(a::text, ',' ORDER BY a::text) FROM unnest(r.relacl) a), obj_description(r.oid, 'pg_class'))
    FROM rels r
  UNION ALL
  SELECT format('column %s.%s #%s %s collation=%s notnull=%s default=%s identity=%s',
                r.relname, a.attname,
                row_number() OVER (PARTITION BY r.oid ORDER BY a.attnum),
                format_type(a.atttypid, a.atttypmod),
                CASE WHEN a.attcollation <> 0 THEN a.attcollation::regcollation::text END,
                a.attnotnull, pg_get_expr(ad.adbin, ad.adrelid), a.attidentity)
    FROM rels r JOIN pg_attribute a ON a.attrelid = r.oid
    LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
   WHERE a.attnum > 0 AND NOT a.attisdropped
  UNION ALL
  SELECT format('index %s', pg_get_indexdef(i.indexrelid))
    FROM rels r JOIN pg_index i ON i.indrelid = r.oid
  UNION ALL
  SELECT format('constraint %s.%s %s', r.relname, co.conname, pg_get_constraintdef(co.oid))
    FROM rels r JOIN pg_constraint co ON co.conrelid = r.oid
  UNION ALL
  SELECT format('trigger %s enabled=%s', pg_get_triggerdef(tg.oid), tg.tgenabled)
    FROM rels r JOIN pg_trigger tg ON tg.tgrelid = r.oid WHERE NOT tg.tgisinternal
  UNION ALL
  SELECT format('view %s %s', r.relname, md5(pg_get_viewdef(r.oid)))
    FROM rels r WHERE r.relkind = 'v'
  UNION ALL
  SELECT format('schema %s acl=%s', n.nspname, (SELECT string_agg(a::text, ',' ORDER BY a::text) FROM unnest(n.nspacl) a))
    FROM pg_namespace n JOIN mem ON mem.classid = 'pg_namespace'::regclass AND mem.objid = n.oid
  UNION ALL
  SELECT format('dumped %s where %s', c.cfg::regclass, c.cond)
    FROM ext, unnest(ext.extconfig, ext.extcondition) AS c(cfg, cond)
  UNION ALL
  SELECT format('member %s', pg_describe_object(mem.classid, mem.objid, 0))
    FROM mem
  UNION ALL
  SELECT format('initprivs %s type=%s privs=%s',
                pg_describe_object(ip.classoid, ip.objoid, ip.objsubid),
                ip.privtype, (SELECT string_agg(a::text, ',' ORDER BY a::text) FROM unnest(ip.initprivs) a))
    FROM pg_init_privs ip JOIN mem ON mem.classid = ip.classoid AND mem.objid = ip.objoid
)
SELECT string_agg(line, E'\n' ORDER BY line) FROM lines;
SQL
}

# Run $sql in a background session ($node->background_psql); returns its
# output and what it wrote on stderr (errors), then forgets the latter.
sub run_in
{
	my ($session, $sql) = @_;
	my $out = $session->query($sql);
	my $err = $session->{stderr};
	$session->{stderr} = '';
	return ($out, $err);
}

# $stderr without the WARNING (with its DETAIL and HINT) that the update
# from 1.0 gives in a database other than pg_cron's, where it cannot see
# whether 1.0 scheduled a maintenance job (t/050 checks it)
sub without_job_warning
{
	my ($stderr) = @_;
	$stderr =~ s/^(?:psql:\S+ )?WARNING:  a maintenance job version 1\.0 scheduled for database .*(?:\n|\z)(?:DETAIL:  .*(?:\n|\z))?(?:HINT:  .*(?:\n|\z))?//mg;
	return $stderr;
}

1;
