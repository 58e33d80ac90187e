#!/usr/bin/env python3
"""Idle memory per client of a pgcarpool binary (issue 21, item 4), stdlib only.

Starts a throwaway PostgreSQL and the pooler on free loopback ports (as user postgres when
run as root), opens N connections that log in (md5, SCRAM-SHA-256, or md5 over TLS) and
stay idle, and reports the pooler's RSS growth per client. Removes everything after.

    bench/idle_memory.py PGCARPOOL_BIN [--clients 5000] [--auth md5|scram|tls]
"""
import argparse, asyncio, base64, glob, hashlib, hmac, os, shutil, socket, ssl, struct
import resource, subprocess, sys, tempfile, time

PG = sorted(glob.glob("/usr/lib/postgresql/*/bin"))[-1]
ROOT = os.getuid() == 0
PW = "idle_pw"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_as(cmd, **kw):
    return subprocess.run((["runuser", "-u", "postgres", "--"] if ROOT else []) + cmd, check=True, **kw)


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))


async def read_msg(r):
    hdr = await r.readexactly(5)
    return hdr[:1], await r.readexactly(struct.unpack("!i", hdr[1:])[0] - 4)


def send(w, typ, body):
    w.write(typ + struct.pack("!i", 4 + len(body)) + body)


async def scram(r, w, body):
    nonce = base64.b64encode(os.urandom(18)).decode()
    first_bare = f"n=,r={nonce}"
    first = ("n,," + first_bare).encode()
    send(w, b"p", b"SCRAM-SHA-256\0" + struct.pack("!i", len(first)) + first)
    typ, body = await read_msg(r)
    server_first = body[4:].decode()
    f = dict(kv.split("=", 1) for kv in server_first.split(","))
    salted = hashlib.pbkdf2_hmac("sha256", PW.encode(), base64.b64decode(f["s"]), int(f["i"]))
    ckey = hmac.new(salted, b"Client Key", "sha256").digest()
    final_bare = f"c=biws,r={f['r']}"
    auth = f"{first_bare},{server_first},{final_bare}".encode()
    sig = hmac.new(hashlib.sha256(ckey).digest(), auth, "sha256").digest()
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(ckey, sig))).decode()
    send(w, b"p", f"{final_bare},p={proof}".encode())


async def login(port, user, tls, holders, failures, sem):
    async with sem:
        try:
            if tls:
                r, w = await asyncio.open_connection("127.0.0.1", port)
                w.write(struct.pack("!ii", 8, 80877103))
                await w.drain()
                if await r.readexactly(1) != b"S":
                    raise RuntimeError("no TLS")
                ctx = ssl.create_default_context()
                ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
                await w.start_tls(ctx)
            else:
                r, w = await asyncio.open_connection("127.0.0.1", port)
            params = b"user\0" + user.encode() + b"\0database\0postgres\0\0"
            w.write(struct.pack("!ii", 8 + len(params), 196608) + params)
            while True:
                await w.drain()
                typ, body = await read_msg(r)
                if typ == b"R":
                    code = struct.unpack("!i", body[:4])[0]
                    if code == 5:
                        inner = hashlib.md5((PW + user).encode()).hexdigest().encode()
                        send(w, b"p", b"md5" + hashlib.md5(inner + body[4:8]).hexdigest().encode() + b"\0")
                    elif code == 10:
                        await scram(r, w, body)
                    elif code not in (0, 11, 12):
                        raise RuntimeError(f"auth request {code}")
                elif typ == b"E":
                    raise RuntimeError(body.replace(b"\0", b" ").decode(errors="replace"))
                elif typ == b"Z":
                    holders.append(w)
                    return
        except Exception as e:
            failures.append(repr(e)[:200])


async def hold(port, user, tls, n, pid):
    holders, failures = [], []
    sem = asyncio.Semaphore(100)
    before = rss_kb(pid)
    await asyncio.gather(*(login(port, user, tls, holders, failures, sem) for _ in range(n)))
    await asyncio.sleep(2)
    held = rss_kb(pid)
    for w in holders:
        w.close()
    return before, held, len(holders), failures


def main():
    a = argparse.ArgumentParser()
    a.add_argument("bin")
    a.add_argument("--clients", type=int, default=5000)
    a.add_argument("--auth", choices=["md5", "scram", "tls"], default="md5")
    a = a.parse_args()
    d = tempfile.mkdtemp(prefix="pgcarpool-idle.")
    os.chmod(d, 0o755)
    if ROOT:
        shutil.chown(d, "postgres")
    pg_port, port = free_port(), free_port()
    procs = []
    try:
        run_as([f"{PG}/initdb", "-D", f"{d}/data", "-U", "postgres", "-A", "trust"], stdout=subprocess.DEVNULL)
        run_as([f"{PG}/pg_ctl", "-D", f"{d}/data", "-l", f"{d}/pg.log", "-w", "-o",
                f"-p {pg_port} -k {d} -c listen_addresses=127.0.0.1 -c fsync=off", "start"], stdout=subprocess.DEVNULL)
        user = "idle_scram" if a.auth == "scram" else "idle_md5"
        enc = "scram-sha-256" if a.auth == "scram" else "md5"
        run_as([f"{PG}/psql", "-h", d, "-p", str(pg_port), "-U", "postgres", "-qc",
                f"set password_encryption = '{enc}'; create role {user} login password '{PW}'"])
        secret = run_as([f"{PG}/psql", "-h", d, "-p", str(pg_port), "-U", "postgres", "-Atc",
                         f"select rolpassword from pg_authid where rolname = '{user}'"],
                        capture_output=True, text=True).stdout.strip()
        with open(f"{d}/userlist.txt", "w") as f:
            f.write(f'"{user}" "{secret}"\n')
        ini = [
            "[databases]", f"postgres = host=127.0.0.1 port={pg_port} user=postgres",
            "[pgbouncer]", "listen_addr = 127.0.0.1", f"listen_port = {port}", "unix_socket_dir =",
            "auth_type = md5", f"auth_file = {d}/userlist.txt", "pool_mode = transaction",
            f"max_client_conn = {a.clients + 100}", f"logfile = {d}/pooler.log",
        ]
        if a.auth == "tls":
            subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                            "-nodes", "-keyout", f"{d}/tls.key", "-out", f"{d}/tls.crt", "-days", "1",
                            "-subj", "/CN=localhost"], check=True, capture_output=True)
            ini += ["client_tls_sslmode = require", f"client_tls_key_file = {d}/tls.key",
                    f"client_tls_cert_file = {d}/tls.crt"]
        with open(f"{d}/pgbouncer.ini", "w") as f:
            f.write("\n".join(ini) + "\n")
        if ROOT:
            for root, _, files in os.walk(d):
                for x in files:
                    if not root.startswith(f"{d}/data"):
                        shutil.chown(os.path.join(root, x), "postgres")
        # Room for every client's socket: PgBouncer does not raise its own soft limit, and
        # runuser sets it back to the system's default (prlimit execs: the pid is the pooler's).
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = max(soft, min(hard, a.clients + 1000))
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        limit = ["prlimit", f"--nofile={want}:{hard}"]
        pooler = subprocess.Popen((["runuser", "-u", "postgres", "--"] if ROOT else []) + limit + [a.bin, f"{d}/pgbouncer.ini"],
                                  stdout=subprocess.DEVNULL, stderr=open(f"{d}/stderr", "w"))
        procs_err = f"{d}/stderr"
        procs.append(pooler)
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), 1).close()
                break
            except OSError:
                time.sleep(0.1)
        pid = int(subprocess.run(["pgrep", "-P", str(pooler.pid)], capture_output=True, text=True).stdout.split()[0]) \
            if ROOT else pooler.pid
        # A first round warms the allocator and the pooler's pools; the second is measured.
        asyncio.run(hold(port, user, a.auth == "tls", min(a.clients, 500), pid))
        time.sleep(1)
        before, held, n, failures = asyncio.run(hold(port, user, a.auth == "tls", a.clients, pid))
        print(f"{a.bin} {a.auth}: {n} idle clients, RSS {before} -> {held} kB: "
              f"{(held - before) * 1024 / max(n, 1):.0f} bytes per client"
              + (f"; {len(failures)} failed, e.g. {failures[0]}" if failures else ""))
        if os.environ.get("PROBE"):
            print(open(procs_err).read()[:2000])
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)
        subprocess.run((["runuser", "-u", "postgres", "--"] if ROOT else []) +
                       [f"{PG}/pg_ctl", "-D", f"{d}/data", "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
