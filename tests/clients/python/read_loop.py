"""psycopg 3 clients of one application loop (tests/read_routing.rs): each writes a row and
bumps a counter (one committed transaction), then reads the row back and the counter,
each in its own transaction (autocommit, the extended protocol, prepared after psycopg's
default prepare_threshold). A read is stale when the row is missing or the counter is
below what the client wrote or read before.

Writes go through `write_dsn`, reads through `read_dsn` (the same: one connection).
Prints `ok <rounds> rounds <stale> stale`; exits 1 (printing why) on any error.

Usage: read_loop.py <write_dsn> <read_dsn> <clients> <rounds>
"""
import sys
import threading

import psycopg


def client(write_dsn, read_dsn, rounds, out, errors):
    try:
        w = psycopg.connect(write_dsn, autocommit=True)
        r = w if read_dsn == write_dsn else psycopg.connect(read_dsn, autocommit=True)
        stale = 0
        last = 0
        for k in range(rounds):
            with w.transaction():
                (row_id,) = w.execute(
                    "INSERT INTO t (v) VALUES (%s) RETURNING id", (k,)
                ).fetchone()
                (n,) = w.execute("UPDATE counter SET n = n + 1 RETURNING n").fetchone()
            last = max(last, n)
            (found,) = r.execute(
                "SELECT count(*) FROM t WHERE id = %s", (row_id,)
            ).fetchone()
            (now,) = r.execute("SELECT n FROM counter").fetchone()
            stale += (found != 1) + (now < last)
            last = max(last, now)
        out.append(stale)
    except Exception as e:  # noqa: BLE001 - reported, the run fails
        errors.append(f"{type(e).__name__}: {getattr(e, 'sqlstate', None)} {e}")


def main():
    write_dsn, read_dsn, clients, rounds = sys.argv[1:5]
    out, errors = [], []
    threads = [
        threading.Thread(target=client, args=(write_dsn, read_dsn, int(rounds), out, errors))
        for _ in range(int(clients))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        for e in errors:
            print(f"FAIL: {e}")
        sys.exit(1)
    print(f"ok {int(clients) * int(rounds)} rounds {sum(out)} stale")


if __name__ == "__main__":
    main()
