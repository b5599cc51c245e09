# Logical replication of the extension's tables (README, "Logical
# replication"): a publication FOR ALL TABLES carries them, and a
# subscriber with the extension installed must (1) finish the initial copy
# of idempotency.sweep_state, whose one row it already has, and (2) apply
# tenant bindings and scope changes to sessions already open there.  The
# apply worker fires no statement trigger and no trigger enabled for origin
# only: before, the copy of sweep_state failed with 23505 for ever and a
# bound role kept acting for another tenant in a warm session.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest qw(new_idem_node run_in);

my $pub = new_idem_node('pub', init => { allows_streaming => 'logical' });
my $sub = new_idem_node('sub');
for my $node ($pub, $sub)
{
	$node->safe_psql('postgres', q{
		CREATE TABLE orders (id int PRIMARY KEY);
		CREATE ROLE lr_app IN ROLE idempotency_app;
	});
}

# on the publisher: a key, a scope, a sweep budget of its own
$pub->safe_psql('postgres', q{
	SELECT outcome FROM idem_reserve('acme', 'orders', 'k-1', '{"n": 1}');
	SELECT idem_configure_scope('orders', '{"ttl": "2 days"}');
	UPDATE idempotency.sweep_state SET pages_per_run = 777;
	CREATE PUBLICATION allpub FOR ALL TABLES;
});
my $connstr = $pub->connstr . ' dbname=postgres';
$sub->safe_psql('postgres',
	"CREATE SUBSCRIPTION allsub CONNECTION '$connstr' PUBLICATION allpub");

# the initial copy of every table finishes (sweep_state's included)
my $synced = 0;
for (1 .. 120)
{
	$synced = $sub->safe_psql('postgres',
		"SELECT count(*) = 0 FROM pg_subscription_rel WHERE srsubstate NOT IN ('r', 's')"
	) eq 't';
	last if $synced;
	sleep 0.5;
}
ok($synced, 'the initial copy of every table finished')
  or diag($sub->safe_psql('postgres',
	"SELECT string_agg(srrelid::regclass || ' ' || srsubstate, ', ') FROM pg_subscription_rel"));
is($sub->safe_psql('postgres',
		'SELECT count(*) || \' \' || max(pages_per_run) FROM idempotency.sweep_state'),
	'1 777', "sweep_state: one row, the publisher's budget");
is($sub->safe_psql('postgres',
		"SELECT status FROM idempotency.keys WHERE idem_key = 'k-1'"),
	'processing', 'the key arrived');

# a warm session of lr_app on the subscriber, unbound: it acts for any
# tenant, and has cached the scope's policy
my $warm = $sub->background_psql('postgres', on_error_stop => 0);
my ($out, $err) = run_in($warm, q{
SET ROLE lr_app;
SELECT outcome FROM idem_reserve('evil', 'orders', 'w-1', '{}');
SELECT expires_at - now() < interval '3 days' FROM idem_reserve('acme', 'orders', 'w-2', '{}');
});
is($out, "created\nt", 'unbound: the warm session reserves for tenant evil');

# the binding and a new ttl arrive by replication
$pub->safe_psql('postgres', q{
	SELECT idem_bind_tenant('lr_app', 'acme');
	SELECT idem_configure_scope('orders', '{"ttl": "30 days"}');
});
$pub->wait_for_catchup('allsub');
is($sub->safe_psql('postgres',
		'SELECT tenant FROM idempotency.tenant_bindings'),
	'acme', 'the binding arrived');

($out, $err) = run_in($warm, q{
SELECT outcome FROM idem_reserve('evil', 'orders', 'w-3', '{}');
});
like($err, qr/role "lr_app" is bound to tenant "acme"/,
	'the warm session is held to the replicated binding');
is($out, '', 'and reserves nothing');
($out, $err) = run_in($warm, q{
SELECT expires_at - now() > interval '29 days' FROM idem_reserve('acme', 'orders', 'w-4', '{}');
});
is($out, 't', 'and uses the replicated ttl');
is($sub->safe_psql('postgres',
		"SELECT count(*) FROM idempotency.keys WHERE tenant_id = 'evil'"),
	'1', 'one key of tenant evil, from before the binding');

# what pg_restore --disable-triggers leaves (every trigger back to origin
# only), then README's statement that sets the modes again: the triggers
# are as a fresh install has them, and a binding that arrives after it
# holds in the warm session
my $modes = q{SELECT string_agg(tgrelid::regclass || '.' || tgname || '=' || tgenabled::text, ' ' ORDER BY 1)
  FROM pg_trigger WHERE tgrelid IN ('idempotency.tenant_bindings'::regclass,
    'idempotency.scopes'::regclass, 'idempotency.sweep_state'::regclass) AND NOT tgisinternal};
my $fresh_modes = $pub->safe_psql('postgres', $modes);
$sub->safe_psql('postgres', q{
	ALTER TABLE idempotency.tenant_bindings DISABLE TRIGGER ALL;
	ALTER TABLE idempotency.scopes DISABLE TRIGGER ALL;
	ALTER TABLE idempotency.sweep_state DISABLE TRIGGER ALL;
	ALTER TABLE idempotency.tenant_bindings ENABLE TRIGGER ALL;
	ALTER TABLE idempotency.scopes ENABLE TRIGGER ALL;
	ALTER TABLE idempotency.sweep_state ENABLE TRIGGER ALL;
});
isnt($sub->safe_psql('postgres', $modes), $fresh_modes,
	'DISABLE/ENABLE TRIGGER ALL changes the modes');
# README, "Logical replication, pg_upgrade, renames and dropped roles"
$sub->safe_psql('postgres', q{
	ALTER TABLE idempotency.tenant_bindings ENABLE REPLICA TRIGGER
	tenant_bindings_replicated, ENABLE ALWAYS TRIGGER
	tenant_bindings_changed; ALTER TABLE idempotency.scopes ENABLE REPLICA
	TRIGGER scopes_replicated, ENABLE ALWAYS TRIGGER scopes_changed; ALTER
	TABLE idempotency.sweep_state ENABLE ALWAYS TRIGGER sweep_state_merge;
});
is($sub->safe_psql('postgres', $modes), $fresh_modes,
	"README's statement sets them as a fresh install has them");
$pub->safe_psql('postgres', q{SELECT idem_bind_tenant('lr_app', 'globex')});
$pub->wait_for_catchup('allsub');
($out, $err) = run_in($warm, q{
SELECT outcome FROM idem_reserve('acme', 'orders', 'w-5', '{}');
});
like($err, qr/role "lr_app" is bound to tenant "globex"/,
	'a binding that arrives after it holds in the warm session');

# the subscription's apply worker is still running (no error loop)
is($sub->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_subscription WHERE subname = 'allsub' AND pid IS NOT NULL"),
	'1', 'the apply worker runs');
$warm->quit;
$sub->safe_psql('postgres', 'DROP SUBSCRIPTION allsub');
$sub->stop;
$pub->stop;
done_testing();
