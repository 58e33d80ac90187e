"""asyncpg driver test for pgcarpool.

Each worker has its own connection with asyncpg's default statement cache (every query
becomes a named prepared statement kept per connection) and runs a checked mix of
queries, explicit transactions and expected errors.

Usage: asyncpg_client.py <host> <port> <user> <password> <db> <workers> <iterations>
"""
import asyncio
import random
import sys

import asyncpg

TABLE = "pgcarpool_driver_rows"
queries = 0


class Mismatch(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Mismatch(msg)


async def expect_sqlstate(coro, code, what):
    global queries
    try:
        await coro
    except asyncpg.PostgresError as err:
        check(err.sqlstate == code, f"{what}: expected SQLSTATE {code}, got {err.sqlstate} ({err})")
        queries += 1
        return
    raise Mismatch(f"{what}: expected SQLSTATE {code}, got success")


async def check_pair(conn, a, tag, what):
    global queries
    row = await conn.fetchrow("select $1::int * 2, $2::text || 'x'", a, tag)
    check(tuple(row) == (2 * a, tag + "x"), f"{what}: got {tuple(row)}, want {(2 * a, tag + 'x')}")
    queries += 1


async def count_rows(conn, run, w, want, what):
    global queries
    n = await conn.fetchval(f"select count(*)::int from {TABLE} where run = $1 and worker = $2", run, w)
    check(n == want, f"{what}: row count {n}, want {want}")
    queries += 1


async def insert(conn, run, w, i, note):
    global queries
    await conn.execute(
        f"insert into {TABLE} (driver, run, worker, iter, note) values ($1, $2, $3, $4, $5)",
        "asyncpg", run, w, i, note)
    queries += 1


async def worker(cfg, run, w, iterations):
    global queries
    conn = await asyncpg.connect(**cfg)
    where = f"worker {w} start"
    try:
        inserted = 0
        for i in range(iterations):
            a = w * 100000 + i
            tag = f"w{w}-i{i}"
            where = f"worker {w} iteration {i}"
            await check_pair(conn, a, tag, f"{where} pair")
            # Several distinct statements so the statement cache holds many.
            for k in (i % 10, (i * 7 + w + 3) % 10):
                v = await conn.fetchval(f"select $1::int + {k}", a)
                check(v == a + k, f"{where} plus {k}: got {v}, want {a + k}")
                queries += 1
            if i % 2 == 1:
                n = i % 50 + 1
                row = await conn.fetchrow(
                    "select count(*)::int, coalesce(sum(g), 0)::int from generate_series(1, $1::int) g", n)
                check(tuple(row) == (n, n * (n + 1) // 2), f"{where} series: got {tuple(row)}")
                queries += 1
            if i % 3 == 0:
                async with conn.transaction():
                    await insert(conn, run, w, i, tag)
                    await count_rows(conn, run, w, inserted + 1, f"{where} count in txn")
                    await check_pair(conn, a + 1, tag + "t", f"{where} pair in txn")
                inserted += 1
            if i % 5 == 2:
                await expect_sqlstate(conn.fetchval("select 10 / $1::int", 0), "22012",
                                      f"{where} division by zero")
            if i % 10 == 7:
                tr = conn.transaction()
                await tr.start()
                await insert(conn, run, w, i, "rolled back")
                await expect_sqlstate(conn.fetchval("select 10 / $1::int", 0), "22012",
                                      f"{where} division by zero in txn")
                await tr.rollback()
                await count_rows(conn, run, w, inserted, f"{where} count after rollback")
        await count_rows(conn, run, w, inserted, f"worker {w} final count")
    except Mismatch:
        raise
    except Exception as err:
        # An unexpected error: say where, and the SQLSTATE when the server sent one.
        state = getattr(err, "sqlstate", None)
        first_line = (str(err).splitlines() or [""])[0]
        raise Mismatch(f"{where}: unexpected {type(err).__name__} (SQLSTATE {state}): {first_line}") from err
    finally:
        await conn.close()


async def main(argv):
    if len(argv) != 7:
        print("usage: asyncpg_client.py <host> <port> <user> <password> <db> <workers> <iterations>",
              file=sys.stderr)
        return 2
    host, port, user, password, database = argv[:5]
    workers, iterations = int(argv[5]), int(argv[6])
    cfg = dict(host=host, port=int(port), user=user, password=password, database=database, ssl=False)

    setup = await asyncpg.connect(**cfg)
    try:
        await setup.execute(
            f"create table if not exists {TABLE} (driver text, run bigint, worker int, iter int, note text)")
    except asyncpg.PostgresError as err:
        if err.sqlstate not in ("23505", "42P07"):
            raise
    await setup.close()

    run = random.randrange(1, 2**62)
    results = await asyncio.gather(*(worker(cfg, run, w, iterations) for w in range(workers)),
                                   return_exceptions=True)
    failed = False
    for w, r in enumerate(results):
        if isinstance(r, BaseException):
            print(f"FAIL: {r}" if isinstance(r, Mismatch) else f"FAIL: worker {w}: {type(r).__name__}: {r}")
            failed = True
    if failed:
        return 1
    print(f"ok {queries} queries")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main(sys.argv[1:])))
    except Exception as err:  # noqa: BLE001 - any unexpected error fails the run
        print(f"FAIL: {type(err).__name__}: {err}")
        sys.exit(1)
