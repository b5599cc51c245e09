# The client conformance scenario with ruby-pg.
#
# Connects with the libpq environment (PGHOST, PGPORT, PGDATABASE) as
# IDEM_APP_USER (two connections) and IDEM_WORKER_USER.  exec_params sends
# every parameter untyped; JSON goes as a string (to_json) and comes back as
# a string (JSON.parse).  Prints one line per step and
# "ruby-pg: N passed, M failed".  Behind PgBouncer nothing changes:
# exec_params uses the unnamed statement.
require 'json'
require 'pg'

DRIVER = 'ruby-pg'
TENANT = "conformance-ruby-#{Process.pid}-#{Time.now.to_i}"
SCOPE = 'orders'
KEY = 'order-1001'
ORDER = { item: 'book', amount: 12.5, currency: 'EUR' }.freeze
RESERVE = 'SELECT * FROM idem_reserve($1, $2, $3, $4)'

$passed = 0
$failed = 0

def step(name)
  yield
  $passed += 1
  puts "ok - #{name}"
rescue StandardError => e
  $failed += 1
  state = e.respond_to?(:result) && e.result ? "#{e.result.error_field(PG::Result::PG_DIAG_SQLSTATE)} " : ''
  puts "not ok - #{name}: #{state}#{e.message.lines.first&.chomp}"
end

def expect(cond, what)
  raise "unexpected: #{what.inspect}" unless cond
end

def connect(user)
  PG.connect(user: user, application_name: 'conformance-ruby')
end

begin
  app = connect(ENV.fetch('IDEM_APP_USER'))
  other = connect(ENV.fetch('IDEM_APP_USER'))
  worker = connect(ENV.fetch('IDEM_WORKER_USER'))

  step('reserve: created') do
    app.exec('BEGIN')
    r = app.exec_params(RESERVE, [TENANT, SCOPE, KEY, ORDER.to_json]).first
    expect(r['outcome'] == 'created' && r['lock_token'] && r['http_status'].nil?, r)
  end

  step('concurrent duplicate: in_progress, retry_after') do
    r = other.exec_params(RESERVE, [TENANT, SCOPE, KEY, ORDER.to_json]).first
    expect(r['outcome'] == 'in_progress' && r['http_status'] == '409' && r['retry_after'].to_i.positive?, r)
  end

  step('complete in the reserving transaction: succeeded') do
    status = app.exec_params('SELECT idem_complete($1, $2, $3, $4, $5, $6)',
                             [TENANT, SCOPE, KEY, 201, { order_id: 1001 }.to_json,
                              { Location: '/orders/1001' }.to_json]).getvalue(0, 0)
    app.exec('COMMIT')
    expect(status == 'succeeded', status)
  end

  step('replay, reordered and respaced body: stored response') do
    body = '{ "currency":"EUR" ,  "amount" : 12.50, "item":"book" }'
    r = other.exec_params(RESERVE, [TENANT, SCOPE, KEY, body]).first
    expect(r['outcome'] == 'replay' && r['http_status'] == '201' && r['response_code'] == '201' &&
           JSON.parse(r['response_body']) == { 'order_id' => 1001 } &&
           JSON.parse(r['response_headers']) == { 'Location' => '/orders/1001' }, r)
  end

  step('different body: mismatch') do
    r = other.exec_params(RESERVE, [TENANT, SCOPE, KEY, ORDER.merge(amount: 13).to_json]).first
    expect(r['outcome'] == 'mismatch' && r['http_status'] == '422', r)
  end

  ids = []
  step('outbox_enqueue with a reservation') do
    app.transaction do |conn|
      outcome = conn.exec_params('SELECT outcome FROM idem_reserve($1, $2, $3, $4)',
                                 [TENANT, SCOPE, 'order-1002', ORDER.to_json]).getvalue(0, 0)
      expect(outcome == 'created', outcome)
      [1, 2].each do |part|
        ids << conn.exec_params('SELECT outbox_enqueue($1, $2, $3, key => $4, scope => $5)',
                                [TENANT, 'payment.capture', { order: 1002, part: part }.to_json,
                                 'order-1002', SCOPE]).getvalue(0, 0)
      end
      conn.exec_params('SELECT idem_complete($1, $2, $3, $4, $5)',
                       [TENANT, SCOPE, 'order-1002', 201, { order_id: 1002 }.to_json])
    end
    expect(ids.uniq.size == 2, ids)
  end

  claimed = []
  step('outbox_claim as the worker') do
    claimed = worker.exec_params('SELECT id, idem_key, payload, lease_token' \
                                 '  FROM outbox_claim($1, batch => 10, tenant => $2) ORDER BY id',
                                 ['worker-ruby', TENANT]).to_a
    expect(claimed.map { |row| row['id'] } == ids &&
           claimed.all? { |row| row['lease_token'] && row['idem_key'] == 'order-1002' } &&
           JSON.parse(claimed[1]['payload'])['part'] == 2, claimed)
  end

  step('outbox_ack') do
    row = claimed.fetch(0)
    worker.exec_params('SELECT outbox_ack($1, $2, $3, $4)',
                       [TENANT, row['id'], row['lease_token'], 'ref-1'])
  end

  step('outbox_nack: pending') do
    row = claimed.fetch(1)
    status = worker.exec_params('SELECT outbox_nack($1, $2, $3, $4)',
                                [TENANT, row['id'], row['lease_token'], 'HTTP 503']).getvalue(0, 0)
    expect(status == 'pending', status)
  end

  step('empty key: SQLSTATE 22004') do
    begin
      other.exec_params(RESERVE, [TENANT, SCOPE, '', ORDER.to_json])
      raise 'no error'
    rescue PG::NullValueNotAllowed => e
      state = e.result.error_field(PG::Result::PG_DIAG_SQLSTATE)
      expect(state == '22004', state)
    end
  end

  [app, other, worker].each(&:close)
rescue PG::Error => e
  $failed += 1
  puts "not ok - connection: #{e.message.lines.first&.chomp}"
end

puts "#{DRIVER}: #{$passed} passed, #{$failed} failed"
exit($failed.zero? && $passed.positive? ? 0 : 1)
