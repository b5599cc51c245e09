#!/usr/bin/perl
# The client conformance scenario with DBI and DBD::Pg.
#
# Connects with the libpq environment (PGHOST, PGPORT, PGDATABASE) as
# IDEM_APP_USER (two connections) and IDEM_WORKER_USER.  Placeholders are
# bound as DBD::Pg binds them by default; JSON goes as a string
# (encode_json) and comes back as a string (decode_json).  Prints one line
# per step and "DBD::Pg: N passed, M failed".  IDEM_PGBOUNCER=1: connected
# through PgBouncer in transaction mode (pg_switch_prepared => 0).
use strict;
use warnings;
use DBI;
use JSON::PP qw(encode_json decode_json);

my $DRIVER = 'DBD::Pg';
my $tenant = "conformance-perl-$$-" . time;
my $scope = 'orders';
my $key = 'order-1001';
my %order = (item => 'book', amount => 12.5, currency => 'EUR');
my $reserve = 'SELECT * FROM idem_reserve(?, ?, ?, ?)';

my ($passed, $failed) = (0, 0);

sub step
{
	my ($name, $fn) = @_;
	if (eval { $fn->(); 1 })
	{
		$passed++;
		print "ok - $name\n";
	}
	else
	{
		$failed++;
		my $err = $@;
		$err =~ s/\s+\z//;
		$err = ($DBI::state ? "$DBI::state " : '') . $err if $err =~ /^DBD::Pg/;
		print "not ok - $name: $err\n";
	}
}

sub expect
{
	my ($cond, $what) = @_;
	die 'unexpected: ' . JSON::PP->new->canonical->allow_blessed->encode($what) . "\n"
	  unless $cond;
}

sub connect_as
{
	my ($user) = @_;
	my %attr = (RaiseError => 1, PrintError => 0, AutoCommit => 1);
	# PgBouncer (transaction mode) before 1.21: the unnamed statement only
	$attr{pg_switch_prepared} = 0 if $ENV{IDEM_PGBOUNCER};
	return DBI->connect('dbi:Pg:application_name=conformance-perl', $user, '', \%attr);
}

my $ok = eval {
	my $app = connect_as($ENV{IDEM_APP_USER});
	my $other = connect_as($ENV{IDEM_APP_USER});
	my $worker = connect_as($ENV{IDEM_WORKER_USER});

	step('reserve: created', sub {
		$app->begin_work;
		my $r = $app->selectrow_hashref($reserve, undef,
			$tenant, $scope, $key, encode_json(\%order));
		expect($r->{outcome} eq 'created' && $r->{lock_token}
			  && !defined $r->{http_status}, $r);
	});

	step('concurrent duplicate: in_progress, retry_after', sub {
		my $r = $other->selectrow_hashref($reserve, undef,
			$tenant, $scope, $key, encode_json(\%order));
		expect($r->{outcome} eq 'in_progress' && $r->{http_status} == 409
			  && $r->{retry_after} > 0, $r);
	});

	step('complete in the reserving transaction: succeeded', sub {
		my ($status) = $app->selectrow_array(
			'SELECT idem_complete(?, ?, ?, ?, ?, ?)', undef,
			$tenant, $scope, $key, 201, encode_json({ order_id => 1001 }),
			encode_json({ Location => '/orders/1001' }));
		$app->commit;
		expect($status eq 'succeeded', $status);
	});

	step('replay, reordered and respaced body: stored response', sub {
		my $body = '{ "currency":"EUR" ,  "amount" : 12.50, "item":"book" }';
		my $r = $other->selectrow_hashref($reserve, undef,
			$tenant, $scope, $key, $body);
		expect($r->{outcome} eq 'replay' && $r->{http_status} == 201
			  && $r->{response_code} == 201
			  && decode_json($r->{response_body})->{order_id} == 1001
			  && decode_json($r->{response_headers})->{Location} eq '/orders/1001', $r);
	});

	step('different body: mismatch', sub {
		my $r = $other->selectrow_hashref($reserve, undef,
			$tenant, $scope, $key, encode_json({ %order, amount => 13 }));
		expect($r->{outcome} eq 'mismatch' && $r->{http_status} == 422, $r);
	});

	my @ids;
	step('outbox_enqueue with a reservation', sub {
		$app->begin_work;
		my ($outcome) = $app->selectrow_array(
			'SELECT outcome FROM idem_reserve(?, ?, ?, ?)', undef,
			$tenant, $scope, 'order-1002', encode_json(\%order));
		expect($outcome eq 'created', $outcome);
		my $enqueue = $app->prepare(
			'SELECT outbox_enqueue(?, ?, ?, key => ?, scope => ?)');
		for my $part (1, 2)
		{
			$enqueue->execute($tenant, 'payment.capture',
				encode_json({ order => 1002, part => $part }), 'order-1002', $scope);
			push @ids, $enqueue->fetchrow_array;
		}
		$app->do('SELECT idem_complete(?, ?, ?, ?, ?)', undef,
			$tenant, $scope, 'order-1002', 201, encode_json({ order_id => 1002 }));
		$app->commit;
		expect(@ids == 2 && $ids[0] != $ids[1], \@ids);
	});
	$app->rollback unless $app->{AutoCommit};

	my $claimed = [];
	step('outbox_claim as the worker', sub {
		$claimed = $worker->selectall_arrayref(
			'SELECT id, idem_key, payload, lease_token'
			  . '  FROM outbox_claim(?, batch => 10, tenant => ?) ORDER BY id',
			{ Slice => {} }, 'worker-perl', $tenant);
		expect(join(',', map { $_->{id} } @$claimed) eq join(',', @ids)
			  && !grep({ !$_->{lease_token} || $_->{idem_key} ne 'order-1002' } @$claimed)
			  && decode_json($claimed->[1]{payload})->{part} == 2, $claimed);
	});

	step('outbox_ack', sub {
		my $row = $claimed->[0] or die "nothing claimed\n";
		$worker->do('SELECT outbox_ack(?, ?, ?, ?)', undef,
			$tenant, $row->{id}, $row->{lease_token}, 'ref-1');
	});

	step('outbox_nack: pending', sub {
		my $row = $claimed->[1] or die "nothing claimed\n";
		my ($status) = $worker->selectrow_array(
			'SELECT outbox_nack(?, ?, ?, ?)', undef,
			$tenant, $row->{id}, $row->{lease_token}, 'HTTP 503');
		expect($status eq 'pending', $status);
	});

	step('empty key: SQLSTATE 22004', sub {
		my $r = eval {
			$other->selectrow_hashref($reserve, undef,
				$tenant, $scope, '', encode_json(\%order));
		};
		die "no error\n" if $r;
		expect($other->state eq '22004', $other->state . ' ' . $other->errstr);
	});

	$_->disconnect for $app, $other, $worker;
	1;
};
unless ($ok)
{
	$failed++;
	print "not ok - connection: $@";
}
print "$DRIVER: $passed passed, $failed failed\n";
exit($failed == 0 && $passed > 0 ? 0 : 1);
