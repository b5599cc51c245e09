// The client conformance scenario with node-postgres (pg).
//
// Connects with the libpq environment (PGHOST, PGPORT, PGDATABASE) as
// IDEM_APP_USER (two connections) and IDEM_WORKER_USER.  Parameters go as
// node-postgres sends them: untyped text, JavaScript objects as JSON.
// Prints one line per step and "node-postgres: N passed, M failed".
'use strict';

const { Client } = require('pg');

const DRIVER = 'node-postgres';
const suffix = `${process.pid}-${Date.now()}`;
const tenant = `conformance-node-${suffix}`;
const scope = 'orders';
const key = 'order-1001';
const order = { item: 'book', amount: 12.5, currency: 'EUR' };

let passed = 0;
let failed = 0;

async function step(name, fn) {
  try {
    await fn();
    passed++;
    console.log(`ok - ${name}`);
  } catch (e) {
    failed++;
    console.log(`not ok - ${name}: ${e.code ? `${e.code} ` : ''}${e.message}`);
  }
}

function expect(cond, what) {
  if (!cond) throw new Error(`unexpected: ${JSON.stringify(what)}`);
}

function connect(user) {
  // behind PgBouncer nothing changes: node-postgres uses unnamed statements
  // unless a query is given a name
  return new Client({ user, application_name: 'conformance-node' });
}

async function main() {
  const app = connect(process.env.IDEM_APP_USER);
  const other = connect(process.env.IDEM_APP_USER);
  const worker = connect(process.env.IDEM_WORKER_USER);
  await Promise.all([app.connect(), other.connect(), worker.connect()]);

  const reserve = 'SELECT * FROM idem_reserve($1, $2, $3, $4)';

  await step('reserve: created', async () => {
    await app.query('BEGIN');
    const { rows: [r] } = await app.query(reserve, [tenant, scope, key, order]);
    expect(r.outcome === 'created' && r.lock_token && r.http_status === null, r);
  });

  await step('concurrent duplicate: in_progress, retry_after', async () => {
    const { rows: [r] } = await other.query(reserve, [tenant, scope, key, order]);
    expect(r.outcome === 'in_progress' && r.http_status === 409 && r.retry_after > 0, r);
  });

  await step('complete in the reserving transaction: succeeded', async () => {
    const { rows: [r] } = await app.query(
      'SELECT idem_complete($1, $2, $3, $4, $5, $6) AS status',
      [tenant, scope, key, 201, { order_id: 1001 }, { Location: '/orders/1001' }]);
    await app.query('COMMIT');
    expect(r.status === 'succeeded', r);
  });

  await step('replay, reordered and respaced body: stored response', async () => {
    const body = '{ "currency":"EUR" ,  "amount" : 12.50, "item":"book" }';
    const { rows: [r] } = await other.query(reserve, [tenant, scope, key, body]);
    expect(r.outcome === 'replay' && r.http_status === 201 && r.response_code === 201
      && r.response_body.order_id === 1001
      && r.response_headers.Location === '/orders/1001', r);
  });

  await step('different body: mismatch', async () => {
    const { rows: [r] } = await other.query(reserve, [tenant, scope, key, { ...order, amount: 13 }]);
    expect(r.outcome === 'mismatch' && r.http_status === 422, r);
  });

  const ids = [];
  await step('outbox_enqueue with a reservation', async () => {
    await app.query('BEGIN');
    const { rows: [r] } = await app.query(reserve, [tenant, scope, 'order-1002', order]);
    expect(r.outcome === 'created', r);
    for (const n of [1, 2]) {
      const { rows: [e] } = await app.query(
        'SELECT outbox_enqueue($1, $2, $3, key => $4, scope => $5) AS id',
        [tenant, 'payment.capture', { order: 1002, part: n }, 'order-1002', scope]);
      ids.push(e.id);
    }
    await app.query('SELECT idem_complete($1, $2, $3, $4, $5)',
      [tenant, scope, 'order-1002', 201, { order_id: 1002 }]);
    await app.query('COMMIT');
    expect(ids.length === 2 && ids[0] !== ids[1], ids);
  });

  let claimed = [];
  await step('outbox_claim as the worker', async () => {
    ({ rows: claimed } = await worker.query(
      'SELECT id, idem_scope, idem_key, payload, lease_token'
      + ' FROM outbox_claim($1, batch => 10, tenant => $2) ORDER BY id',
      ['worker-node', tenant]));
    expect(claimed.length === 2 && claimed[0].id === ids[0] && claimed[1].id === ids[1]
      && claimed.every((row) => row.lease_token && row.idem_key === 'order-1002')
      && claimed[1].payload.part === 2, claimed);
  });

  await step('outbox_ack', async () => {
    const [row] = claimed;
    await worker.query('SELECT outbox_ack($1, $2, $3, $4)',
      [tenant, row.id, row.lease_token, 'ref-1']);
  });

  await step('outbox_nack: pending', async () => {
    const row = claimed[1];
    const { rows: [r] } = await worker.query(
      'SELECT outbox_nack($1, $2, $3, $4) AS status',
      [tenant, row.id, row.lease_token, 'HTTP 503']);
    expect(r.status === 'pending', r);
  });

  await step('empty key: SQLSTATE 22004', async () => {
    let err = null;
    try {
      await other.query(reserve, [tenant, scope, '', order]);
    } catch (e) {
      err = e;
    }
    expect(err && err.code === '22004', err && { code: err.code, message: err.message });
  });

  await Promise.all([app.end(), other.end(), worker.end()]);
}

main()
  .catch((e) => {
    failed++;
    console.log(`not ok - connection: ${e.code ? `${e.code} ` : ''}${e.message}`);
  })
  .finally(() => {
    console.log(`${DRIVER}: ${passed} passed, ${failed} failed`);
    process.exitCode = failed === 0 && passed > 0 ? 0 : 1;
  });
