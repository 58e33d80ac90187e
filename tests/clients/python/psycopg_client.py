"""psycopg 3 driver test for pgcarpool.

Each worker has its own connection with prepare_threshold=0, so psycopg prepares every
query as a named server-side statement on first use and executes it by name after that.
A checked mix of queries, explicit transactions and expected errors.

Usage: psycopg_client.py <host> <port> <user> <password> <db> <workers> <iterations>
"""
import asyncio
import random
import sys

import psycopg

TABLE = "pgcarpool_driver_rows"
queries = 0


class Mismatch(Exception):
    pass


class Rollback(Exception):
    """Raised inside a transaction block to roll it back on purpose."""


def check(cond, msg):
    if not cond:
        raise Mismatch(msg)


async def fetchone(conn, sql, params):
    cur = await conn.execute(sql, params)
    return await cur.fetchone()


async def expect_sqlstate(coro, code, what):
    global queries
    try:
        await coro
    except psycopg.Error as err:
        check(err.sqlstate == code, f"{what}: expected SQLSTATE {code}, got {err.sqlstate} ({err})")
        queries += 1
        return
    raise Mismatch(f"{what}: expected SQLSTATE {code}, got success")


async def check_pair(conn, a, tag, what):
    global queries
    row = await fetchone(conn, "select %s::int * 2, %s::text || 'x'", (a, tag))
    check(row == (2 * a, tag + "x"), f"{what}: got {row}, want {(2 * a, tag + 'x')}")
    queries += 1


async def count_rows(conn, run, w, want, what):
    global queries
    row = await fetchone(conn, f"select count(*)::int from {TABLE} where run = %s and worker = %s", (run, w))
    check(row[0] == want, f"{what}: row count {row[0]}, want {want}")
    queries += 1


async def insert(conn, run, w, i, note):
    global queries
    await conn.execute(
        f"insert into {TABLE} (driver, run, worker, iter, note) values (%s, %s, %s, %s, %s)",
        ("psycopg", run, w, i, note))
    queries += 1


async def worker(conninfo, run, w, iterations):
    global queries
    conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True, prepare_threshold=0)
    where = f"worker {w} start"
    try:
        inserted = 0
        for i in range(iterations):
            a = w * 100000 + i
            tag = f"w{w}-i{i}"
            where = f"worker {w} iteration {i}"
            await check_pair(conn, a, tag, f"{where} pair")
            # Several distinct statements so the prepared-statement cache holds many.
            for k in (i % 10, (i * 7 + w + 3) % 10):
                row = await fetchone(conn, f"select %s::int + {k}", (a,))
                check(row[0] == a + k, f"{where} plus {k}: got {row[0]}, want {a + k}")
                queries += 1
            if i % 2 == 1:
                n = i % 50 + 1
                row = await fetchone(
                    conn, "select count(*)::int, coalesce(sum(g), 0)::int from generate_series(1, %s::int) g", (n,))
                check(row == (n, n * (n + 1) // 2), f"{where} series: got {row}")
                queries += 1
            if i % 3 == 0:
                async with conn.transaction():
                    await insert(conn, run, w, i, tag)
                    await count_rows(conn, run, w, inserted + 1, f"{where} count in txn")
                    await check_pair(conn, a + 1, tag + "t", f"{where} pair in txn")
                inserted += 1
            if i % 5 == 2:
                await expect_sqlstate(fetchone(conn, "select 10 / %s::int", (0,)), "22012",
                                      f"{where} division by zero")
            if i % 10 == 7:
                try:
                    async with conn.transaction():
                        await insert(conn, run, w, i, "rolled back")
                        await expect_sqlstate(fetchone(conn, "select 10 / %s::int", (0,)), "22012",
                                              f"{where} division by zero in txn")
                        raise Rollback()
                except Rollback:
                    pass
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
        print("usage: psycopg_client.py <host> <port> <user> <password> <db> <workers> <iterations>",
              file=sys.stderr)
        return 2
    host, port, user, password, database = argv[:5]
    workers, iterations = int(argv[5]), int(argv[6])
    conninfo = psycopg.conninfo.make_conninfo(
        host=host, port=port, user=user, password=password, dbname=database, sslmode="disable")

    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as setup:
        try:
            await setup.execute(
                f"create table if not exists {TABLE} (driver text, run bigint, worker int, iter int, note text)")
        except psycopg.Error as err:
            if err.sqlstate not in ("23505", "42P07"):
                raise

    run = random.randrange(1, 2**62)
    results = await asyncio.gather(*(worker(conninfo, run, w, iterations) for w in range(workers)),
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
