# Two-phase commit (PREPARE TRANSACTION).  A transaction that enqueued
# (with idempotency.outbox_notify on, the default) can be prepared.
# PostgreSQL refuses to PREPARE a transaction that executed NOTIFY, so the
# extension sends its NOTIFY at commit only; a prepared transaction sends
# none, and its rows are claimed once COMMIT PREPARED makes them visible.
# A transaction that reserved keys can be prepared too: its unfinished
# reservation commits with COMMIT PREPARED, as a two-phase one.  Needs
# max_prepared_transactions, which the regression cluster does not set.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest qw(new_idem_node);

my $node = new_idem_node('outbox_prepare',
	conf => "max_prepared_transactions = 2\n");

# the listener is the enqueuing session itself: psql prints the
# notifications it receives after each statement
my ($ret, $out, $err) = $node->psql(
	'postgres', q{
	LISTEN idempotency_outbox;
	BEGIN;
	SELECT outbox_enqueue('t2pc', 'obx.prepared', '{"n": 1}', 'k-1') > 0;
	PREPARE TRANSACTION 'obx_2pc';
	SELECT 'after prepare';
});
is($ret, 0, 'a transaction that enqueued can be prepared');
is($err, '', 'without an error');
unlike($out, qr/Asynchronous notification/, 'a prepared transaction does not notify');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM idempotency.outbox WHERE tenant_id = 't2pc'"),
	'0', 'the row is invisible until COMMIT PREPARED');

$node->safe_psql('postgres', "COMMIT PREPARED 'obx_2pc'");
my $claimed = $node->safe_psql('postgres',
	"SELECT topic || ' ' || idem_key FROM outbox_claim('worker-2pc', 10, '1 minute', tenant => 't2pc')"
);
is($claimed, 'obx.prepared k-1', 'COMMIT PREPARED makes the row claimable');
$node->safe_psql('postgres',
	"SELECT outbox_ack(tenant_id, id, lease_token) FROM idempotency.outbox WHERE tenant_id = 't2pc'"
);

# a prepared transaction that is rolled back leaves nothing
$node->safe_psql(
	'postgres', q{
	BEGIN;
	SELECT outbox_enqueue('t2pc', 'obx.prepared', '{"n": 2}');
	PREPARE TRANSACTION 'obx_2pc_rollback';
});
$node->safe_psql('postgres', "ROLLBACK PREPARED 'obx_2pc_rollback'");
is($node->safe_psql('postgres',
		"SELECT string_agg(status::text, ',') FROM idempotency.outbox WHERE tenant_id = 't2pc'"),
	'done', 'ROLLBACK PREPARED leaves no row');

# a plain commit still notifies, once per topic, after the commit
$out = $node->safe_psql(
	'postgres', q{
	LISTEN idempotency_outbox;
	BEGIN;
	SELECT outbox_enqueue('t2pc', 'obx.plain', '{}') > 0;
	SELECT outbox_enqueue('t2pc', 'obx.plain', '{}') > 0;
	COMMIT;
});
my @notes = ($out =~ /Asynchronous notification "idempotency_outbox" with payload "([^"]*)"/g);
is_deeply(\@notes, ['obx.plain'], 'a committed transaction notifies once per topic');

# keys reserved in a prepared transaction, one finished and one not: the
# prepared transaction holds them, and COMMIT PREPARED commits both rows,
# the unfinished one as a two-phase reservation with its token
my $tok = $node->safe_psql(
	'postgres', q{
	BEGIN;
	SELECT lock_token FROM idem_reserve('t2pc', 'orders', 'k-unfinished', '{"n": 1}'::jsonb);
	SELECT outcome FROM idem_reserve('t2pc', 'orders', 'k-finished', '{"n": 2}'::jsonb) \gset
	SELECT idem_complete('t2pc', 'orders', 'k-finished', 201, '{"id": 2}') \gset
	PREPARE TRANSACTION 'keys_2pc';
});
like($tok, qr/^[0-9a-f-]{36}$/, 'a transaction that reserved keys can be prepared');
is($node->safe_psql('postgres',
		"SELECT outcome FROM idem_reserve('t2pc', 'orders', 'k-unfinished', '{\"n\": 1}'::jsonb)"),
	'in_progress', 'the prepared transaction holds the key');
# its rows are not committed: health shows the two keys by their locks,
# aged from the moment the transaction was prepared
is($node->safe_psql('postgres',
		"SELECT processing || ' ' || reservations_held || ' '"
		  . " || (oldest_held_age BETWEEN interval '0' AND interval '5 minutes')"
		  . " FROM idempotency.health"),
	'0 2 true', 'health counts the keys a prepared transaction holds');
$node->safe_psql('postgres', "COMMIT PREPARED 'keys_2pc'");
is($node->safe_psql('postgres',
		"SELECT processing || ' ' || reservations_held || ' ' || (oldest_held_age IS NULL)"
		  . " FROM idempotency.health"),
	'1 0 true', 'once committed, the unfinished reservation is a processing row');
is($node->safe_psql('postgres',
		"SELECT idem_key || ' ' || status || ' ' || (lock_token = '$tok') FROM idempotency.keys"
		  . " WHERE tenant_id = 't2pc' ORDER BY idem_key"),
	"k-finished succeeded false\nk-unfinished processing true",
	'COMMIT PREPARED commits the processing reservation with its token and the finished row');
is($node->safe_psql('postgres',
		"SELECT idem_complete('t2pc', 'orders', 'k-unfinished', 201, '{}', lock_token => '$tok')"),
	'succeeded', 'the reservation completes with its token');
is($node->safe_psql('postgres',
		"SELECT outcome || ' ' || response_body FROM idem_reserve('t2pc', 'orders', 'k-finished', '{\"n\": 2}'::jsonb)"),
	'replay {"id": 2}', 'the finished key replays');

$node->stop;
done_testing();
