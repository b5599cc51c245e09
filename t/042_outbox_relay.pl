# WAL relay: with idempotency.outbox_emit_messages on, outbox_enqueue writes
# each row it inserts as a transactional logical decoding message (prefix
# "idempotency.outbox", content a JSON object).  Read through real logical
# replication slots (test_decoding, and pgoutput with messages 'true'), the
# messages arrive in commit order, not enqueue order; rows of transactions
# or subtransactions that rolled back never appear, nor do deduplicated
# enqueues or enqueues with the setting off; a prepared transaction's rows
# appear at COMMIT PREPARED.
use strict;
use warnings;
use JSON::PP;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest qw(new_idem_node);

my $node = new_idem_node('outbox_relay',
	conf => "wal_level = logical\nmax_prepared_transactions = 5\n");
# pgoutput is part of the server; test_decoding is a contrib module that a
# server built without contrib lacks
my $have_td = -f $node->config_data('--pkglibdir') . '/test_decoding.so';
$node->safe_psql('postgres', q{
SELECT pg_create_logical_replication_slot('relay_pgo', 'pgoutput');
CREATE PUBLICATION relay_pub;
});
$node->safe_psql('postgres',
	q{SELECT pg_create_logical_replication_slot('relay_td', 'test_decoding')})
  if $have_td;

my $on = 'SET idempotency.outbox_emit_messages = on;';

# off by default: nothing is emitted
is($node->safe_psql('postgres', 'SHOW idempotency.outbox_emit_messages'),
	'off', 'the setting is off by default');
$node->safe_psql('postgres',
	q{SELECT outbox_enqueue('relay', 'off', '{"n": 0}')});

# enqueued first, committed last: A's transaction stays open while B's
# commits
my $a = $node->background_psql('postgres', on_error_stop => 1);
$a->query_safe($on);
$a->query_safe('BEGIN');
my $id_a1 = $a->query_safe(
	q{SELECT outbox_enqueue('relay', 'a1', '{"n": 1, "s": "é\"x"}', key => 'order-1', scope => 'payments', headers => '{"h": "v"}', ordering_key => 'acct-1')});
$node->safe_psql('postgres',
	$on . q{SELECT outbox_enqueue('relay', 'b1', '{"n": 2}')});
$a->query_safe(q{SELECT outbox_enqueue('relay', 'a2', '{"n": 3}')});
$a->query_safe('COMMIT');

# rolled back: the whole transaction, and a subtransaction
$node->safe_psql('postgres', $on . q{
BEGIN;
SELECT outbox_enqueue('relay', 'rolled-back', '{}');
ROLLBACK;
BEGIN;
SELECT outbox_enqueue('relay', 'kept', '{}');
SAVEPOINT s;
SELECT outbox_enqueue('relay', 'sub-rolled-back', '{}');
ROLLBACK TO s;
COMMIT;
});

# deduplicated: the second enqueue inserts nothing and emits nothing
$node->safe_psql('postgres', $on . q{
SELECT outbox_enqueue('relay', 'dedup', '{"n": 1}', dedup_key => 'once');
SELECT outbox_enqueue('relay', 'dedup', '{"n": 2}', dedup_key => 'once');
});

# prepared: the message comes with COMMIT PREPARED, after what committed in
# between
$node->safe_psql('postgres', $on . q{
BEGIN;
SELECT outbox_enqueue('relay', 'prepared', '{}');
PREPARE TRANSACTION 'relay-2pc';
});
$node->safe_psql('postgres',
	$on . q{SELECT outbox_enqueue('relay', 'before-commit-prepared', '{}')});
$node->safe_psql('postgres', q{COMMIT PREPARED 'relay-2pc'});
$a->quit;

# delivered later: the message says when the row falls due
$node->safe_psql('postgres',
	$on . q{SELECT outbox_enqueue('relay', 'later', '{}', deliver_after => '1 day')});

my @expected = qw(b1 a1 a2 kept dedup before-commit-prepared prepared later);

# pgoutput, as a relay such as Debezium reads it: 'M' messages with flags,
# LSN, prefix and content
my @pgo = split /\n/, $node->safe_psql('postgres', q{
SELECT convert_from(substring(data FROM 11 FOR 18), 'UTF8') || ' '
       || get_byte(data, 1) || ' '
       || convert_from(substring(data FROM 34), 'UTF8')
  FROM pg_logical_slot_get_binary_changes('relay_pgo', NULL, NULL,
           'proto_version', '1', 'publication_names', 'relay_pub', 'messages', 'true')
 WHERE get_byte(data, 0) = ascii('M')});
my @messages;
for my $line (@pgo)
{
	like($line, qr/^idempotency\.outbox 1 \{/,
		'pgoutput: a transactional message with the documented prefix');
	my ($content) = $line =~ /^\S+ 1 (.*)$/;
	push @messages, JSON::PP->new->utf8(1)->decode($content);
}
is_deeply([ map { $_->{topic} } @messages ], \@expected,
	'pgoutput: one message per inserted row, in commit order; nothing rolled back, deduplicated or emitted with the setting off');

# test_decoding shows each message with its prefix and content too
SKIP:
{
	skip 'test_decoding is not installed for this server', 2 unless $have_td;
	my @lines = split /\n/, $node->safe_psql('postgres', q{
SELECT data FROM pg_logical_slot_get_changes('relay_td', NULL, NULL,
                                             'skip-empty-xacts', '1', 'include-xids', '0')
 WHERE data LIKE 'message:%'});
	my @td = map { /content:(.*)$/ ? JSON::PP->new->utf8(1)->decode($1) : undef } @lines;
	is(scalar(grep { /^message: transactional: 1 prefix: idempotency\.outbox, sz: \d+ content:\{/ } @lines),
		scalar(@expected), 'test_decoding: transactional messages with the documented prefix');
	is_deeply(\@td, \@messages, 'test_decoding: the same messages as pgoutput, in the same order');
}

# available_at: the row's, in UTC, as ISO 8601
my @at = map { $_->{available_at} // '' } @messages;
is(scalar(grep { /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?\+00:00$/ } @at),
	scalar(@expected), 'every message has available_at, in UTC');
is(join(' ', map {
			$node->safe_psql('postgres',
				"SELECT available_at = '$_->{available_at}'::timestamptz FROM idempotency.outbox WHERE id = $_->{id}")
		} @messages),
	join(' ', ('t') x @expected), 'each available_at is its row\'s');
my ($later) = grep { $_->{topic} eq 'later' } @messages;
is($node->safe_psql('postgres',
		"SELECT '$later->{available_at}'::timestamptz > now() + interval '23 hours'"),
	't', 'a row enqueued with deliver_after is due a day later');

my ($m) = grep { $_->{topic} eq 'a1' } @messages;
delete $m->{available_at};
is_deeply($m, {
		tenant => 'relay', topic => 'a1', id => $id_a1 + 0,
		idem_scope => 'payments', idem_key => 'order-1',
		payload => { n => 1, s => "\x{e9}\"x" }, headers => { h => 'v' },
		ordering_key => 'acct-1' },
	'the content holds tenant, topic, id, idem_scope, idem_key, payload, headers and ordering_key');
my ($b) = grep { $_->{topic} eq 'b1' } @messages;
is_deeply([ $b->{idem_scope}, $b->{idem_key}, $b->{headers}, $b->{ordering_key} ],
	[ undef, undef, undef, undef ],
	'absent key, scope, headers and ordering_key are JSON nulls');
is($node->safe_psql('postgres', q{
SELECT string_agg(topic, ' ' ORDER BY id) FROM idempotency.outbox
 WHERE tenant_id = 'relay' AND topic IN ('a1', 'b1')}), 'a1 b1',
	'while the ids are in enqueue order');
is_deeply([ map { $_->{id} } @messages ],
	[ map { $node->safe_psql('postgres',
		"SELECT id FROM idempotency.outbox WHERE tenant_id = 'relay' AND topic = '$_'") + 0 } @expected ],
	'each message carries the id of its row');

# README's REVOKE: pg_logical_emit_message is PUBLIC's by default, so any
# role could forge a message with the prefix; revoked, a plain role cannot,
# and an application role's enqueue still emits (the extension does not
# call the function)
my ($readme_revoke) = PostgreSQL::Test::Utils::slurp_file('README.md') =~
  /(DO \$\$\nDECLARE\n    f regprocedure;\nBEGIN\n    FOR f IN SELECT oid FROM pg_catalog\.pg_proc\n\s+WHERE proname = 'pg_logical_emit_message'.*?\n\$\$;)/s;
ok(defined $readme_revoke, 'README shows the REVOKE');
$node->safe_psql('postgres', q{
CREATE ROLE relay_plain LOGIN;
CREATE ROLE relay_app LOGIN IN ROLE idempotency_app;
});
my ($ret, $out, $err) = $node->psql('postgres',
	q{SELECT pg_logical_emit_message(true, 'idempotency.outbox', '{"tenant": "other"}')},
	connstr => $node->connstr('postgres') . ' user=relay_plain');
is($ret, 0, 'by default a plain role can write a message with the prefix');
$node->safe_psql('postgres', $readme_revoke);
($ret, $out, $err) = $node->psql('postgres',
	q{SELECT pg_logical_emit_message(true, 'idempotency.outbox', '{"tenant": "other"}')},
	connstr => $node->connstr('postgres') . ' user=relay_plain');
like($err, qr/permission denied for function pg_logical_emit_message/,
	'after the REVOKE it cannot');
$node->safe_psql('postgres',
	$on . q{SELECT outbox_enqueue('relay', 'after-revoke', '{}')},
	connstr => $node->connstr('postgres') . ' user=relay_app');
my @after = grep { /after-revoke/ } split /\n/, $node->safe_psql('postgres', q{
SELECT convert_from(substring(data FROM 34), 'UTF8')
  FROM pg_logical_slot_get_binary_changes('relay_pgo', NULL, NULL,
           'proto_version', '1', 'publication_names', 'relay_pub', 'messages', 'true')
 WHERE get_byte(data, 0) = ascii('M')});
is(scalar(@after), 1, "and the application's enqueue still writes its message");

$node->stop;
done_testing();
