#!/bin/bash
# Per-transaction costs of poolers side by side (issue 21): CPU and its user part (from
# /proc), system calls, epoll_wait returns (wake-ups) and context switches (perf stat), in
# interleaved rounds of `pgbench -n -S` against a throwaway PostgreSQL on free loopback
# ports; for pgcarpool also SHOW CARPOOL's server_moves and pool-mutex waits per
# transaction. Removes everything after.
#
#   bench/perfstat.sh [-r ROUNDS=3] [-T SECONDS=5] [-c CLIENTS=16] [-M simple|extended]
#                     [-b] [-C] [-a md5|scram] [-w WORKERS] [-P NAME]
#                     NAME=BIN[@WORKERS][+KEY=VALUE,...] ...
# BIN is a pgcarpool or PgBouncer binary (both read the same pgbouncer.ini); -w, or
# @WORKERS after one binary, sets pgcarpool's `workers` (default: one per core); +KEY=VALUE
# adds settings to that target's ini (e.g. `nodefer=target/release/pgcarpool+deferred_begin=0`).
# -b: pgbench's TPC-B-like script (BEGIN, three UPDATEs, a SELECT, an INSERT, END) instead
# of -S.
# -C: a new connection per transaction (pgbench -C): the cost of a login.
# -a md5|scram: clients log in with a password, as bench/run's connect rows do (auth_type =
# md5, the userlist holding PostgreSQL's md5 or SCRAM secret for the user; connection
# logging off).
# -P NAME: `perf record -g` of target NAME in the last round, kept in /tmp/perfstat-NAME.data
# (read it with `perf report -i`). Needs perf, pgbench, psql; run as root.
set -euo pipefail
ROUNDS=3 SECS=5 CLIENTS=16 MODE=simple WORKERS= PROFILE= WHAT=-S CONNECT= AUTH=
while getopts "r:T:c:M:w:P:bCa:" o; do
    case $o in
    r) ROUNDS=$OPTARG ;; T) SECS=$OPTARG ;; c) CLIENTS=$OPTARG ;; M) MODE=$OPTARG ;;
    w) WORKERS=$OPTARG ;; P) PROFILE=$OPTARG ;; b) WHAT=tpcb ;; C) CONNECT=1 ;;
    a) AUTH=$OPTARG ;; *) exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { echo "usage: $0 [options] NAME=BIN ..." >&2; exit 2; }
PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
DIR=$(mktemp -d /tmp/pgcarpool-perfstat.XXXXXX)
chmod 755 "$DIR"
chown postgres "$DIR"
RUN=(setpriv --reuid postgres --regid postgres --init-groups)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PGPORT=$(free_port)
POOLPID=
cleanup() {
    [ -n "$POOLPID" ] && kill "$POOLPID" 2>/dev/null || true
    "${RUN[@]}" "$PGBIN/pg_ctl" -D "$DIR/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$DIR"
}
trap cleanup EXIT

. "$(dirname "$0")/throwaway-postgres.sh"
start_throwaway_postgres

# Start pooler $2 (named $1; workers $3) on a free port: sets POOLPID, POOLPORT.
start_pooler() {
    POOLPORT=$(free_port)
    cat >"$DIR/$1.ini" <<EOF
[databases]
postgres = host=127.0.0.1 port=$PGPORT
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
logfile = $DIR/$1.log
EOF
    case $(basename "$2") in
    pgcarpool*) [ -n "$3" ] && echo "workers = $3" >>"$DIR/$1.ini" ;;
    esac
    [ -n "$AUTH" ] && printf 'log_connections = 0\nlog_disconnections = 0\n' >>"$DIR/$1.ini"
    if [ -n "$4" ]; then tr "," "\n" <<<"$4" >>"$DIR/$1.ini"; fi
    # setpriv execs the pooler itself: $! is its pid.
    setpriv --reuid postgres --regid postgres --init-groups "$2" "$DIR/$1.ini" >/dev/null 2>&1 &
    POOLPID=$!
    for _ in $(seq 100); do
        "$PGBIN/psql" -h 127.0.0.1 -p "$POOLPORT" -U "$LOGIN" -d postgres -Atc 'select 1' \
            >/dev/null 2>&1 && return
        sleep 0.1
    done
    echo "$1 did not start" >&2
    exit 1
}
# utime + stime of the pooler (clock ticks); utime alone.
ticks() { awk '{print $14 + $15}' "/proc/$POOLPID/stat"; }
uticks() { awk '{print $14}' "/proc/$POOLPID/stat"; }
# A SHOW CARPOOL column of the postgres pool (empty if the column is not there).
carpool() {
    "$PGBIN/psql" -h 127.0.0.1 -p "$POOLPORT" -U postgres -d pgbouncer -A -c 'show carpool' \
        2>/dev/null | awk -F'|' -v col="$1" 'NR == 1 {for (i = 1; i <= NF; i++) if ($i == col) c = i}
            NR > 1 && $1 == "postgres" && c {print $c}' || true
}
HZ=$(getconf CLK_TCK)
printf "%-10s %5s %9s %9s %9s %11s %9s %9s %9s %11s %9s\n" target round tps "cpu_us/tx" "user_us/tx" "syscalls/tx" \
    "wakes/tx" "cs/tx" "moves/tx" "lockwait/tx" "ns/wait"
for round in $(seq "$ROUNDS"); do
    for t in "$@"; do
        name=${t%%=*} bin=${t#*=} workers=$WORKERS extra=
        case $bin in *+*) extra=${bin#*+} bin=${bin%%+*} ;; esac
        case $bin in *@*) workers=${bin##*@} bin=${bin%@*} ;; esac
        start_pooler "$name" "$bin" "$workers" "$extra"
        what=(-S)
        [ "$WHAT" = tpcb ] && what=(-b tpcb-like)
        pgb=("$PGBIN/pgbench" -h 127.0.0.1 -p "$POOLPORT" -U "$LOGIN" -n "${what[@]}" ${CONNECT:+-C} -M "$MODE"
            -c "$CLIENTS" -j 2 postgres)
        "${pgb[@]}" -T 1 >/dev/null 2>&1
        m0=$(carpool server_moves) l0=$(carpool lock_waits) n0=$(carpool lock_wait_ns)
        c0=$(ticks) u0=$(uticks)
        perf stat -x, -o "$DIR/perf.csv" -e raw_syscalls:sys_enter,syscalls:sys_exit_epoll_wait,context-switches \
            -p "$POOLPID" -- sleep $((SECS + 1)) &
        PERF=$! PREC=
        if [ "$name" = "$PROFILE" ] && [ "$round" = "$ROUNDS" ]; then
            perf record -q -F 2999 -g -o "/tmp/perfstat-$name.data" -p "$POOLPID" -- sleep "$SECS" \
                >/dev/null 2>&1 &
            PREC=$!
        fi
        "${pgb[@]}" -T "$SECS" >"$DIR/pgbench.out" 2>&1
        c1=$(ticks) u1=$(uticks)
        wait "$PERF" ${PREC:+"$PREC"}
        m1=$(carpool server_moves) l1=$(carpool lock_waits) n1=$(carpool lock_wait_ns)
        tx=$(awk '/number of transactions actually processed/ {print $NF}' "$DIR/pgbench.out" | cut -d/ -f1)
        tps=$(awk '/^tps/ {printf "%.0f", $3}' "$DIR/pgbench.out")
        ev() { awk -F, -v e="$1" '$3 == e {print $1}' "$DIR/perf.csv"; }
        # perf counts 1 s longer than pgbench runs (a quiet second, few events).
        awk -v n="$name" -v r="$round" -v tps="$tps" -v tx="$tx" -v c="$((c1 - c0))" -v u="$((u1 - u0))" -v hz="$HZ" \
            -v sc="$(ev raw_syscalls:sys_enter)" -v w="$(ev syscalls:sys_exit_epoll_wait)" \
            -v cs="$(ev context-switches)" -v m="${m1:-0}-${m0:-0}" -v l="${l1:-0}-${l0:-0}" \
            -v ns="${n1:-0}-${n0:-0}" \
            'BEGIN {split(m, a, "-"); split(l, b, "-"); split(ns, d, "-"); waits = b[1] - b[2];
                printf "%-10s %5d %9d %9.1f %9.1f %11.2f %9.3f %9.3f %9.4f %11.4f %9.0f\n", n, r, tps,
                c / hz * 1e6 / tx, u / hz * 1e6 / tx, sc / tx, w / tx, cs / tx, (a[1] - a[2]) / tx, waits / tx,
                waits ? (d[1] - d[2]) / waits : 0}'
        kill "$POOLPID"
        wait "$POOLPID" 2>/dev/null || true
        POOLPID=
    done
done
