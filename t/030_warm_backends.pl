# Warm backends.  A session that has already used the key functions and the
# outbox keeps working when, from another session, the extension's tables
# and indexes are rebuilt under it (REINDEX, REINDEX CONCURRENTLY, VACUUM
# FULL, CLUSTER), when the extension is dropped and created again, and when
# ALTER EXTENSION UPDATE replaces its functions.  The key functions cache
# the OIDs of idempotency.keys and of its primary key (they probe the index
# directly): REINDEX CONCURRENTLY gives the index a new OID, and a stale
# OID made every later call of the warm session fail with XX000 "could not
# open relation with OID".
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest qw(new_idem_node run_in);

my $node = new_idem_node('warm_backends');
$node->safe_psql('postgres', 'CREATE DATABASE old');
$node->safe_psql('old', "CREATE EXTENSION idempotency VERSION '1.0'");

my $n = 0;

# One round of everything in a session: a new key reserved and completed
# atomically (in one transaction, so no lock_token), its replay and its
# lookup, a reservation given up, and an outbox message enqueued, claimed
# and acked.  $request is how the request is passed (the 1.0 and the
# current API differ).
sub round
{
	my ($session, $label, $request) = @_;
	$request //= q{'{"n": %d}'::jsonb};
	$n++;
	my $req = sprintf($request, $n);
	my ($out, $err) = run_in($session, <<SQL);
BEGIN;
SELECT outcome FROM idem_reserve('warm', 'orders', 'k-$n', $req);
SELECT idem_complete('warm', 'orders', 'k-$n', 201, '{"id": $n}');
COMMIT;
SELECT outcome || ' ' || response_code || ' ' || response_body::text
  FROM idem_reserve('warm', 'orders', 'k-$n', $req);
SELECT status || ' ' || response_code FROM idem_lookup('warm', 'orders', 'k-$n');
BEGIN;
SELECT outcome FROM idem_reserve('warm', 'orders', 'r-$n', $req);
SELECT idem_release('warm', 'orders', 'r-$n');
COMMIT;
SELECT count(*) FROM idem_lookup('warm', 'orders', 'r-$n');
SELECT outbox_enqueue('warm', 'topic-$n', '{"n": $n}', 'k-$n', 'orders') > 0;
SELECT count(outbox_ack(c.tenant_id, c.id, c.lease_token))
  FROM outbox_claim('warm-worker', 10, topics => ARRAY['topic-$n']) c;
SELECT status FROM idempotency.outbox WHERE topic = 'topic-$n';
SQL
	is($err, '', "$label: no error");
	is( $out,
		join("\n",
			'created', 'succeeded', qq(replay 201 {"id": $n}),
			'succeeded 201', 'created', '', '0', 't', '1', 'done'),
		"$label: reserve, complete, replay, lookup, release, enqueue, claim, ack");
}

my $warm = $node->background_psql('postgres', on_error_stop => 0);
$warm->set_query_timer_restart();
round($warm, 'first use');

# Rebuilds under warm sessions, each followed by a round in them: in the
# long-lived session, which has seen every rebuild so far, and in a session
# warmed just before this one rebuild (so that each rebuild is checked on
# its own).  Only the REINDEX ... CONCURRENTLY forms give keys_pkey a new
# OID; the others keep the OIDs and change the relfilenode.
for my $ddl (
	'REINDEX INDEX CONCURRENTLY idempotency.keys_pkey',
	'REINDEX TABLE idempotency.keys',
	'REINDEX TABLE CONCURRENTLY idempotency.keys',
	'REINDEX TABLE CONCURRENTLY idempotency.outbox',
	'REINDEX INDEX idempotency.keys_expires_at_idx',
	'VACUUM FULL idempotency.keys',
	'CLUSTER idempotency.keys USING keys_pkey',
	'VACUUM FULL idempotency.outbox',
	'REINDEX SCHEMA CONCURRENTLY idempotency',
	'VACUUM FULL idempotency.scopes')
{
	my $fresh = $node->background_psql('postgres', on_error_stop => 0);
	$fresh->set_query_timer_restart();
	round($fresh, "before $ddl, fresh session");
	$node->safe_psql('postgres', $ddl);
	round($fresh, "after $ddl, fresh session");
	round($warm, "after $ddl");
	$fresh->quit;
}
is( $node->safe_psql('postgres', q{
SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
 WHERE i.indrelid = 'idempotency.keys'::regclass AND NOT (i.indisvalid AND i.indisready)}),
	'0', 'no invalid index left behind');

# a scope policy changed from another session is seen, and survives a rebuild
$node->safe_psql('postgres',
	q{SELECT idem_configure_scope('orders', '{"cache_server_errors": true}')});
$node->safe_psql('postgres', 'REINDEX INDEX CONCURRENTLY idempotency.keys_pkey');
my ($out, $err) = run_in($warm, q{
BEGIN;
SELECT outcome FROM idem_reserve('warm', 'orders', 'e-1', '{}'::jsonb);
SELECT idem_complete('warm', 'orders', 'e-1', 503, '{}');
COMMIT;
SELECT outcome || ' ' || http_status FROM idem_reserve('warm', 'orders', 'e-1', '{}'::jsonb);});
is($err, '', 'scope change and rebuild: no error');
is($out, "created\nfailed\nreplay 503", 'scope change and rebuild: the 5xx is cached');
$node->safe_psql('postgres', q{DELETE FROM idempotency.scopes WHERE scope = 'orders'});

# the extension dropped and created again, in the warm session itself
($out, $err) = run_in($warm,
	'DROP EXTENSION idempotency; CREATE EXTENSION idempotency;');
is($err, '', 'DROP and CREATE EXTENSION in the warm session');
round($warm, 'after DROP and CREATE EXTENSION in the session');

# and from another session
$node->safe_psql('postgres',
	'DROP EXTENSION idempotency; CREATE EXTENSION idempotency;');
round($warm, 'after DROP and CREATE EXTENSION elsewhere');

# in the transaction that holds a reservation not yet written: the
# reservation goes with the table, the DROP commits, and a new install in
# the same transaction starts without it
($out, $err) = run_in($warm, q{
BEGIN;
SELECT outcome FROM idem_reserve('warm', 'orders', 'dropped-1', '{}');
DROP EXTENSION idempotency;
COMMIT;
SELECT count(*) FROM pg_extension WHERE extname = 'idempotency';
CREATE EXTENSION idempotency;
BEGIN;
SELECT outcome FROM idem_reserve('warm', 'orders', 'dropped-2', '{}');
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;
SELECT outcome FROM idem_reserve('warm', 'orders', 'dropped-2', '{}');
COMMIT;
SELECT status FROM idempotency.keys WHERE idem_key LIKE 'dropped-%';
});
is($err, '', 'DROP EXTENSION after a reservation in the same transaction');
is($out, "created\n0\ncreated\ncreated\nprocessing",
	'the reservation went with the table; a new install starts without it');
# nor does the coverage guard of the new install count it
($out, $err) = run_in($warm, q{
BEGIN;
SELECT outcome FROM idem_reserve('warm', 'orders', 'dropped-3', '{}');
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;
CREATE TABLE dropped_charges (id int);
CREATE TRIGGER need_key BEFORE INSERT ON dropped_charges
    FOR EACH STATEMENT EXECUTE FUNCTION idem_require_reservation('orders');
INSERT INTO dropped_charges VALUES (1);
ROLLBACK;
});
like($err, qr/INSERT into public.dropped_charges requires an idempotency reservation/,
	"the new install's guard does not count the old install's reservation");
# nor does idem_lookup, as its first call after the new install (it wrote
# the held reservation into the dropped table: XX000 "could not open
# relation with OID")
($out, $err) = run_in($warm, q{
BEGIN;
SELECT outcome FROM idem_reserve('warm', 'orders', 'dropped-4', '{}');
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;
SELECT count(*) FROM idem_lookup('warm', 'orders', 'dropped-4');
ROLLBACK;
});
is($err, '', 'idem_lookup after DROP and CREATE EXTENSION in the transaction');
is($out, "created
0", "and finds nothing of the old install's reservation");

# a rollback to a savepoint before the DROP EXTENSION brings the table back,
# and with it the reservation held before (it was lost: never written at
# commit, and neither completed nor counted by the guard after the rollback)
($out, $err) = run_in($warm, q{
BEGIN;
SELECT outcome FROM idem_reserve('warm', 'orders', 'saved-1', '{}');
SELECT outcome FROM idem_reserve('warm', 'orders', 'saved-2', '{}');
SAVEPOINT before_drop;
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;
SELECT count(*) FROM idem_lookup('warm', 'orders', 'saved-1');
SAVEPOINT inner_one;
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;
SELECT outcome FROM idem_reserve('warm', 'orders', 'saved-3', '{}');
RELEASE SAVEPOINT inner_one;
ROLLBACK TO SAVEPOINT before_drop;
CREATE TEMP TABLE saved_charges (id int);
CREATE TRIGGER need_key BEFORE INSERT ON saved_charges
    FOR EACH STATEMENT EXECUTE FUNCTION idem_require_reservation('orders');
INSERT INTO saved_charges VALUES (1);
DROP TABLE saved_charges;
SELECT idem_complete('warm', 'orders', 'saved-1', 201, '{"id": 1}');
COMMIT;
SELECT idem_key || ' ' || status FROM idempotency.keys
 WHERE idem_key LIKE 'saved-%' ORDER BY idem_key;
});
is($err, '', 'DROP and CREATE EXTENSION rolled back to a savepoint');
is($out, "created
created
0
created
succeeded
saved-1 succeeded
saved-2 processing",
	'the reservations held before the savepoint are held again after the rollback');
# nothing between the rollback and the commit: the reservation brought
# back is written into the table brought back (COMMIT wrote it into the
# rolled-back table's OID: XX000, and the whole transaction was lost)
($out, $err) = run_in($warm, q{
CREATE TEMP TABLE saved_orders (id int);
BEGIN;
INSERT INTO saved_orders VALUES (1);
SELECT outcome FROM idem_reserve('warm', 'orders', 'saved-5', '{}');
SAVEPOINT a;
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;
SELECT count(*) FROM idem_lookup('warm', 'orders', 'saved-5');
ROLLBACK TO SAVEPOINT a;
COMMIT;
SELECT count(*) FROM saved_orders;
SELECT idem_key || ' ' || status FROM idempotency.keys WHERE idem_key = 'saved-5';
});
is($err, '', 'COMMIT right after the rollback to the savepoint');
is($out, "created
0
1
saved-5 processing", 'writes the reservation brought back, and the rest of the transaction');
# the DROP kept and a savepoint rolled back after it: the old table's
# reservation stays gone, and a key reserved after the rollback is
# written (it went with the old reservations and was never written)
($out, $err) = run_in($warm, q{
BEGIN;
SELECT outcome FROM idem_reserve('warm', 'orders', 'saved-6', '{}');
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;
SAVEPOINT b;
SELECT count(*) FROM idem_lookup('warm', 'orders', 'saved-x');
ROLLBACK TO SAVEPOINT b;
CREATE TEMP TABLE saved_refunds (id int);
CREATE TRIGGER need_key BEFORE INSERT ON saved_refunds
    FOR EACH STATEMENT EXECUTE FUNCTION idem_require_reservation('orders');
SAVEPOINT c;
INSERT INTO saved_refunds VALUES (1);
ROLLBACK TO SAVEPOINT c;
SELECT outcome FROM idem_reserve('warm', 'orders', 'saved-7', '{}');
DROP TABLE saved_refunds;
COMMIT;
SELECT string_agg(idem_key || ' ' || status, ', ' ORDER BY idem_key)
  FROM idempotency.keys WHERE idem_key LIKE 'saved-%';
});
like($err, qr/INSERT into pg_temp_\d+.saved_refunds requires an idempotency reservation/,
	"the guard does not count the dropped table's reservation");
is($out, "created
0
created
saved-7 processing", 'a key reserved after the rollback is written; the dropped one is gone');
# the same, where the savepoint of the DROP is released into the
# transaction: the DROP stays, and the old table's reservations go with it
($out, $err) = run_in($warm, q{
BEGIN;
SELECT outcome FROM idem_reserve('warm', 'orders', 'saved-4', '{}');
SAVEPOINT s;
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;
SELECT count(*) FROM idem_lookup('warm', 'orders', 'saved-4');
RELEASE SAVEPOINT s;
SAVEPOINT t;
ROLLBACK TO SAVEPOINT t;
COMMIT;
SELECT count(*) FROM idempotency.keys WHERE idem_key LIKE 'saved-%';
});
is($err, '', 'DROP and CREATE EXTENSION in a released savepoint');
is($out, "created
0
0", 'a released savepoint keeps the new install without the old reservation');

$warm->quit;

# ALTER EXTENSION UPDATE under a warm session: a database on 1.0, used
# through the 1.0 API (the jsonb overload of idem_reserve)
my $old = $node->background_psql('old', on_error_stop => 0);
$old->set_query_timer_restart();
round($old, 'version 1.0');
# a statement the session prepared over a result row the update changes
# (a worker's claim, as a driver that prepares on its own keeps it)
($out, $err) = run_in($old,
	q{PREPARE old_claim AS SELECT * FROM outbox_claim('w', 1, '30 seconds'); EXECUTE old_claim});
is($err, '', 'a claim prepared under 1.0 runs');
# a view of the DBA's over a view the update drops stops the update,
# which changes nothing; dropped first, the update runs
$node->safe_psql('old', 'CREATE VIEW my_health AS SELECT * FROM idempotency.health');
my ($rc, $uout, $uerr) = $node->psql('old', 'ALTER EXTENSION idempotency UPDATE');
like($uerr, qr/cannot drop view idempotency.health because other objects depend on it/,
	'a view of the DBA over idempotency.health stops the update');
is($node->safe_psql('old',
		"SELECT extversion FROM pg_extension WHERE extname = 'idempotency'"),
	'1.0', 'and the update changed nothing');
$node->safe_psql('old', 'DROP VIEW my_health');
# one over a key column whose collation the update changes stops it too
$node->safe_psql('old', 'CREATE VIEW my_keys AS SELECT tenant_id, idem_key FROM idempotency.keys');
($rc, $uout, $uerr) = $node->psql('old', 'ALTER EXTENSION idempotency UPDATE');
like($uerr, qr/cannot alter type of a column used by a view or rule/,
	'a view of the DBA over the key columns stops the update (0A000)');
$node->safe_psql('old', 'DROP VIEW my_keys');
$node->safe_psql('old', 'ALTER EXTENSION idempotency UPDATE');
$node->safe_psql('old', 'CREATE VIEW my_health AS SELECT * FROM idempotency.health');
isnt($node->safe_psql('old',
		"SELECT extversion FROM pg_extension WHERE extname = 'idempotency'"),
	'1.0', 'updated');
# the current API: one signature, an untyped request literal, and the
# fingerprint by name
round($old, 'after ALTER EXTENSION UPDATE, untyped request', q{'{"n": %d}'});
round($old, 'after ALTER EXTENSION UPDATE, fingerprint',
	q{fingerprint => sha256('%d')});
($out, $err) = run_in($old,
	q{SELECT count(*) FROM idem_lookup('warm', 'orders', 'k-1') WHERE lock_token IS NULL});
like($err, qr/column "lock_token" does not exist/,
	'after the update idem_lookup no longer returns lock_token');
# the claim prepared before the update fails until it is prepared again
($out, $err) = run_in($old, q{EXECUTE old_claim});
like($err, qr/cached plan must not change result type/,
	'a statement prepared before the update over a changed result row fails (0A000)');
($out, $err) = run_in($old, q{EXECUTE old_claim});
like($err, qr/cached plan must not change result type/, 'and keeps failing');
($out, $err) = run_in($old, q{DISCARD ALL; PREPARE old_claim AS SELECT * FROM outbox_claim('w', 1, '30 seconds'); EXECUTE old_claim});
is($err, '', 'after DISCARD ALL it is prepared again and runs');
$old->quit;

# A session opened under 1.0, by a role an administrator binds to a tenant
# after the update, is held to that tenant at once: under 1.0 the session
# found no bindings table, and no invalidation would have told it the
# table appeared
$node->safe_psql('postgres', 'CREATE DATABASE old_bound');
$node->safe_psql('old_bound', "CREATE EXTENSION idempotency VERSION '1.0'");
$node->safe_psql('postgres', 'CREATE ROLE warm_app LOGIN');
my $app = $node->background_psql('old_bound', on_error_stop => 0,
	extra_params => [ '-U', 'warm_app' ]);
$app->set_query_timer_restart();
($out, $err) = run_in($app,
	q{SELECT outcome FROM idem_reserve('t1', 'orders', 'b-0', '{}'::jsonb)});
is($out, 'created', 'a role reserves under 1.0');
$node->safe_psql('old_bound', 'ALTER EXTENSION idempotency UPDATE');
$node->safe_psql('old_bound',
	q{GRANT idempotency_app TO warm_app; SELECT idem_bind_tenant('warm_app', 't1')});
($out, $err) = run_in($app,
	q{SELECT outcome FROM idem_reserve('t2', 'orders', 'b-1', '{}')});
like($err, qr/role "warm_app" is bound to tenant "t1"/,
	'after the update and a binding, the open session cannot act for another tenant');
($out, $err) = run_in($app, q{SET idempotency.tenant = 't3';
SELECT outcome FROM idem_reserve('t3', 'orders', 'b-2', '{}');
RESET idempotency.tenant;});
like($err, qr/role "warm_app" is bound to tenant "t1"/, 'not by SET either');
($out, $err) = run_in($app,
	q{SELECT outcome FROM idem_reserve('t1', 'orders', 'b-3', '{}')});
is($out . $err, 'created', 'and acts for its own');
is($node->safe_psql('old_bound',
		q{SELECT string_agg(tenant_id || '/' || idem_key, ' ' ORDER BY idem_key) FROM idempotency.keys}),
	't1/b-0 t1/b-3', 'nothing was written for the other tenants');

# The same open session, rebound to another tenant while the bindings table
# is locked: its first call cannot read the binding (lock_timeout), and the
# next call must still see the new binding, not the one it had cached
$node->safe_psql('old_bound', q{SELECT idem_bind_tenant('warm_app', 't4')});
my $locker = $node->background_psql('old_bound', on_error_stop => 0);
$locker->query_safe(
	'BEGIN; LOCK TABLE idempotency.tenant_bindings IN ACCESS EXCLUSIVE MODE');
($out, $err) = run_in($app, q{SET lock_timeout = '200ms';
SELECT outcome FROM idem_reserve('t1', 'orders', 'b-4', '{}');
RESET lock_timeout;});
like($err, qr/canceling statement due to lock timeout/,
	'rebound while the bindings are locked: the call cannot read the binding');
$locker->query_safe('COMMIT');
$locker->quit;
($out, $err) = run_in($app,
	q{SELECT outcome FROM idem_reserve('t1', 'orders', 'b-5', '{}')});
like($err, qr/role "warm_app" is bound to tenant "t4"/,
	'the next call sees the new binding: the old tenant is refused');
($out, $err) = run_in($app,
	q{SELECT outcome FROM idem_reserve('t4', 'orders', 'b-6', '{}')});
is($out . $err, 'created', 'and the new tenant is the one it acts for');
$app->quit;

$node->stop;
done_testing();
