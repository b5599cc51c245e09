# Helpers shared by the TAP tests in t/.
package IdemTest;

use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use Exporter 'import';

our @EXPORT_OK = qw(new_idem_node);

# A fresh cluster with pg_cron and idempotency preloaded and the extension
# created in database "postgres" (pg_cron's database).  Extra postgresql.conf
# lines may be passed in %opts{conf}.
sub new_idem_node
{
	my ($name, %opts) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init;
	my $conf = "shared_preload_libraries = 'pg_cron,idempotency'\n"
	  . "cron.database_name = 'postgres'\n";
	if ($ENV{IDEM_DESTDIR})
	{
		# a private installation (see scripts/lib.sh)
		my $libdir = `pg_config --pkglibdir`;
		chomp $libdir;
		$conf .= "extension_destdir = '$ENV{IDEM_DESTDIR}'\n"
		  . "dynamic_library_path = '$ENV{IDEM_DESTDIR}$libdir:\$libdir'\n";
	}
	$conf .= $opts{conf} if $opts{conf};
	$node->append_conf('postgresql.conf', $conf);
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
	return $node;
}

1;
