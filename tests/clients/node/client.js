// node-postgres driver test for pgcarpool: each worker has its own pg.Client and uses
// named queries ({name, text, values}), which node-postgres prepares once per connection
// and then executes by name. A checked mix of queries, explicit transactions and
// expected errors.
//
// Usage: node client.js <host> <port> <user> <password> <db> <workers> <iterations>
'use strict';
const { Client } = require('pg');

const TABLE = 'pgcarpool_driver_rows';
let queries = 0;

class Mismatch extends Error {}

function check(cond, msg) {
  if (!cond) throw new Mismatch(msg);
}

async function q(client, name, text, values) {
  const res = await client.query({ name, text, values, rowMode: 'array' });
  return res.rows;
}

async function expectSqlState(promise, code, what) {
  try {
    await promise;
  } catch (err) {
    check(err.code === code, `${what}: expected SQLSTATE ${code}, got ${err.code} (${err.message})`);
    queries++;
    return;
  }
  throw new Mismatch(`${what}: expected SQLSTATE ${code}, got success`);
}

async function checkPair(client, a, tag, what) {
  const rows = await q(client, 'pair', "select $1::int * 2, $2::text || 'x'", [a, tag]);
  check(rows.length === 1 && rows[0][0] === 2 * a && rows[0][1] === tag + 'x',
    `${what}: got ${JSON.stringify(rows)}, want [[${2 * a},"${tag}x"]]`);
  queries++;
}

async function countRows(client, run, w, want, what) {
  const rows = await q(client, 'count', `select count(*)::int from ${TABLE} where run = $1 and worker = $2`, [run, w]);
  check(rows[0][0] === want, `${what}: row count ${rows[0][0]}, want ${want}`);
  queries++;
}

async function insert(client, run, w, i, note) {
  await q(client, 'insert', `insert into ${TABLE} (driver, run, worker, iter, note) values ($1, $2, $3, $4, $5)`,
    ['node-postgres', run, w, i, note]);
  queries++;
}

async function worker(cfg, run, w, iterations) {
  const client = new Client(cfg);
  await client.connect();
  let where = `worker ${w} start`;
  try {
    let inserted = 0;
    for (let i = 0; i < iterations; i++) {
      const a = w * 100000 + i;
      const tag = `w${w}-i${i}`;
      where = `worker ${w} iteration ${i}`;
      await checkPair(client, a, tag, `${where} pair`);
      // Several distinct named statements so the connection holds many.
      for (const k of [i % 10, (i * 7 + w + 3) % 10]) {
        const rows = await q(client, `plus${k}`, `select $1::int + ${k}`, [a]);
        check(rows[0][0] === a + k, `${where} plus ${k}: got ${rows[0][0]}, want ${a + k}`);
        queries++;
      }
      if (i % 2 === 1) {
        const n = (i % 50) + 1;
        const rows = await q(client, 'series',
          'select count(*)::int, coalesce(sum(g), 0)::int from generate_series(1, $1::int) g', [n]);
        check(rows[0][0] === n && rows[0][1] === (n * (n + 1)) / 2,
          `${where} series: got ${JSON.stringify(rows)}, want [[${n},${(n * (n + 1)) / 2}]]`);
        queries++;
      }
      if (i % 3 === 0) {
        await client.query('BEGIN');
        try {
          await insert(client, run, w, i, tag);
          await countRows(client, run, w, inserted + 1, `${where} count in txn`);
          await checkPair(client, a + 1, tag + 't', `${where} pair in txn`);
        } catch (err) {
          await client.query('ROLLBACK').catch(() => {});
          throw err;
        }
        await client.query('COMMIT');
        inserted++;
      }
      if (i % 5 === 2) {
        await expectSqlState(q(client, 'div', 'select 10 / $1::int', [0]), '22012', `${where} division by zero`);
      }
      if (i % 10 === 7) {
        await client.query('BEGIN');
        await insert(client, run, w, i, 'rolled back');
        await expectSqlState(q(client, 'div', 'select 10 / $1::int', [0]), '22012', `${where} division by zero in txn`);
        await client.query('ROLLBACK');
        await countRows(client, run, w, inserted, `${where} count after rollback`);
      }
    }
    await countRows(client, run, w, inserted, `worker ${w} final count`);
  } catch (err) {
    if (err instanceof Mismatch) throw err;
    // An unexpected error: say where, and the SQLSTATE when the server sent one.
    const state = err && err.code ? ` (SQLSTATE ${err.code})` : '';
    throw new Mismatch(`${where}: unexpected error${state}: ${err && err.message ? err.message : err}`);
  } finally {
    await client.end().catch(() => {});
  }
}

async function main() {
  const args = process.argv.slice(2);
  if (args.length !== 7) {
    console.error('usage: node client.js <host> <port> <user> <password> <db> <workers> <iterations>');
    process.exit(2);
  }
  const [host, port, user, password, database] = args;
  const workers = parseInt(args[5], 10);
  const iterations = parseInt(args[6], 10);
  const cfg = { host, port: parseInt(port, 10), user, password, database, ssl: false };

  const setup = new Client(cfg);
  await setup.connect();
  try {
    await setup.query(`create table if not exists ${TABLE} (driver text, run bigint, worker int, iter int, note text)`);
  } catch (err) {
    if (err.code !== '23505' && err.code !== '42P07') throw err;
  }
  await setup.end();

  const run = Math.floor(Math.random() * 1e15);
  const results = await Promise.allSettled(
    Array.from({ length: workers }, (_, w) => worker(cfg, run, w, iterations)));
  let failed = false;
  for (const r of results) {
    if (r.status === 'rejected') {
      console.log(`FAIL: ${r.reason instanceof Mismatch ? r.reason.message : (r.reason && r.reason.stack) || r.reason}`);
      failed = true;
    }
  }
  if (failed) process.exit(1);
  console.log(`ok ${queries} queries`);
}

main().catch((err) => {
  console.log(`FAIL: ${err && err.stack ? err.stack : err}`);
  process.exit(1);
});
