# End-to-end: the example payments service (examples/payments) connected
# straight to the database, under real concurrent HTTP clients, workers
# killed with SIGKILL, an immediate shutdown and the database down (the test
# itself is in t/lib/PaymentsE2E.pm; t/091 runs it behind PgBouncer).  The
# service, the workers and the operator each log in as a role of their own
# (examples/payments/roles.sql), granted one of the extension's roles,
# never as a superuser.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest qw(new_idem_node);
use PaymentsE2E qw(run_payments_e2e payments_skip_reason);
use PaymentsHarness qw(install_payments);

my $skip = payments_skip_reason();
plan skip_all => $skip if $skip;

my $node = new_idem_node('payments');
# the DBA: tables and roles; the operator (idempotency_admin): the policy
install_payments($node);

run_payments_e2e(node => $node);

$node->stop;
done_testing();
