#!/bin/bash
# Instructions per transaction of a pgcarpool binary, counted by callgrind: repeatable on a
# busy machine where CPU time is not (for step-by-step decisions; CPU ratios against
# PgBouncer come from bench/perfstat.sh). One worker, `pgbench -n -S -t TX` through it
# against a throwaway PostgreSQL on free loopback ports, after a warm-up of 50 per client.
# Prints the whole run's instructions per transaction (start and warm-up included: compare
# builds at the same -t, or subtract a run with -t 1) and keeps the profile (read it with
# `callgrind_annotate --inclusive=yes FILE`).
#
#   bench/instructions.sh [-t TX_PER_CLIENT=500] [-c CLIENTS=4] [-M simple|extended|prepared]
#                         [-o PROFILE=/tmp/instructions.out] [-p] [-w] [-b] [-d 'ENTRY OPTIONS']
#                         [-s 'KEY=VALUE,...'] [-C] [-a md5|scram] BIN
# -p: BIN is PgBouncer (the same configuration without pgcarpool's own `workers`), for the
# ratio of user-space instructions against it.
# -w: write transactions (one INSERT into pgbench_history each) instead of -S.
# -b: pgbench's TPC-B-like transactions (BEGIN, three UPDATEs, a SELECT, an INSERT, END).
# -s: settings added to the pooler's ini (e.g. -s deferred_begin=0).
# -d: options added to the database entry, which then lists the server twice
#     (`host=127.0.0.1,127.0.0.1`: an entry with a host list, as read_routing needs; with no
#     standby, its reads run on the primary), e.g. -d 'read_routing=on read_your_writes=off'.
# -C: a new connection per transaction (pgbench -C), for the cost of a login: startup,
#     authentication, the first checkout, the client's teardown.
# -a md5|scram: clients log in as a user with a password, as bench/run's connect rows do
#     (auth_type = md5; the userlist holds PostgreSQL's own md5 or SCRAM secret for the user,
#     so a SCRAM login does no PBKDF2), with log_connections and log_disconnections off.
# Marginal figures: the same options with -t N and -t 1; the last line gives the run's
# instructions in all, so (all at N - all at 1) / ((N - 1) * CLIENTS) is per transaction.
# Needs valgrind, pgbench, psql; run as root.
set -euo pipefail
TX=500 CLIENTS=4 MODE=simple OUT=/tmp/instructions.out PEER= WRITE= ENTRY= TPCB= EXTRA= CONNECT= AUTH=
while getopts "t:c:M:o:pwbd:s:Ca:" o; do
    case $o in
    t) TX=$OPTARG ;; c) CLIENTS=$OPTARG ;; M) MODE=$OPTARG ;; o) OUT=$OPTARG ;; p) PEER=1 ;;
    w) WRITE=1 ;; d) ENTRY=$OPTARG ;; b) TPCB=1 ;; s) EXTRA=$OPTARG ;; C) CONNECT=1 ;;
    a) AUTH=$OPTARG ;; *) exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -eq 1 ] || { echo "usage: $0 [options] BIN" >&2; exit 2; }
case $AUTH in '' | md5 | scram) ;; *) echo "-a: md5 or scram" >&2; exit 2 ;; esac
BIN=$(realpath "$1")
PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
DIR=$(mktemp -d /tmp/pgcarpool-instructions.XXXXXX)
chmod 755 "$DIR"
chown postgres "$DIR"
RUN=(setpriv --reuid postgres --regid postgres --init-groups)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PGPORT=$(free_port) POOLPORT=$(free_port)
POOLPID=
cleanup() {
    [ -n "$POOLPID" ] && kill "$POOLPID" 2>/dev/null || true
    "${RUN[@]}" "$PGBIN/pg_ctl" -D "$DIR/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$DIR"
}
trap cleanup EXIT

. "$(dirname "$0")/throwaway-postgres.sh"
start_throwaway_postgres
entry="host=127.0.0.1 port=$PGPORT"
[ -n "$ENTRY" ] && entry="host=127.0.0.1,127.0.0.1 port=$PGPORT,$PGPORT $ENTRY"
cat >"$DIR/pool.ini" <<EOF
[databases]
postgres = $entry
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $POOLPORT
unix_socket_dir =
auth_type = $AUTHTYPE
auth_file = $DIR/userlist.txt
admin_users = postgres
pool_mode = transaction
default_pool_size = 20
max_client_conn = 2000
max_prepared_statements = 200
logfile = $DIR/pool.log
EOF
[ -n "$PEER" ] || echo "workers = 1" >>"$DIR/pool.ini"
[ -n "$AUTH" ] && printf 'log_connections = 0\nlog_disconnections = 0\n' >>"$DIR/pool.ini"
if [ -n "$EXTRA" ]; then tr "," "\n" <<<"$EXTRA" >>"$DIR/pool.ini"; fi
cd "$DIR"
"${RUN[@]}" valgrind --tool=callgrind --callgrind-out-file="$DIR/cg.out" "$BIN" "$DIR/pool.ini" \
    >/dev/null 2>"$DIR/valgrind.log" &
POOLPID=$!
for _ in $(seq 300); do
    "$PGBIN/psql" -h 127.0.0.1 -p "$POOLPORT" -U "$LOGIN" -d postgres -Atc 'select 1' \
        >/dev/null 2>&1 && break
    sleep 0.2
done
what=(-S)
if [ -n "$WRITE" ]; then
    echo 'INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (1, 1, 1, 1, now());' \
        >"$DIR/write.sql"
    what=(-f "$DIR/write.sql")
fi
[ -n "$TPCB" ] && what=(-b tpcb-like)
pgb=("$PGBIN/pgbench" -h 127.0.0.1 -p "$POOLPORT" -U "$LOGIN" -n "${what[@]}" ${CONNECT:+-C} -M "$MODE"
    -c "$CLIENTS" -j 1 postgres)
"${pgb[@]}" -t 50 >/dev/null 2>&1
"${pgb[@]}" -t "$TX" >"$DIR/pgbench.out" 2>&1
# (callgrind_control cannot be used: it stalls a pooler asleep in epoll_wait.) The counts
# include the start and the warm-up (-t 1 measures about those alone).
kill -INT "$POOLPID"
wait "$POOLPID" || true
POOLPID=
cp "$DIR/cg.out" "$OUT"
ir=$(awk '/^summary:/ {print $2}' "$OUT")
tx=$(awk '/number of transactions actually processed/ {print $NF}' "$DIR/pgbench.out" | cut -d/ -f1)
awk -v ir="$ir" -v tx="$tx" -v m="$MODE" -v c="$CLIENTS" \
    -v w="${WRITE:+ write}${TPCB:+ tpcb}${CONNECT:+ -C}${AUTH:+ $AUTH}${EXTRA:+ $EXTRA}" -v e="${ENTRY:+ ($ENTRY)}" \
    'BEGIN {printf "%s%s%s c%d: %d transactions, %.0f instructions per transaction (%.0f in all)\n",
        m, w, e, c, tx, ir / tx, ir}'
