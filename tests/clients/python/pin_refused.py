"""psycopg 3 clients that each take a session advisory lock (a pin) in autocommit mode.

Every client connects first, then each in turn runs `select pg_advisory_lock(i)` and
prints what psycopg reported: `ok <i>`, or `error <i> <SQLSTATE> <message>` (the SQLSTATE
`-` when psycopg had none: the connection ended without an error it could read).

Usage: pin_refused.py <host> <port> <user> <password> <db> <clients>
"""
import sys

import psycopg


def main():
    host, port, user, password, db, n = sys.argv[1:7]
    conns = [
        psycopg.connect(host=host, port=int(port), user=user, password=password,
                        dbname=db, autocommit=True)
        for _ in range(int(n))
    ]
    for i, conn in enumerate(conns):
        try:
            conn.execute("select pg_advisory_lock(%s)", (i,))
            print(f"ok {i}")
        except psycopg.Error as e:
            message = str(e).replace("\n", " | ")
            print(f"error {i} {e.sqlstate or '-'} {message}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
