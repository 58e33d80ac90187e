#!/bin/bash
# A client with many custom settings behind pgcarpool (issue 21, item 5): the mean latency
# of its transactions after its SETs against a client that set nothing (both alone), then
# the time of its SETs and a bystander's latency while it runs them again. Starts a
# throwaway PostgreSQL and pgcarpool on free loopback ports (as user postgres when run as
# root), pgbench only; removes everything after.
#
#   bench/settings.sh [PGCARPOOL_BIN] [SETTINGS=9000] [TRANSACTIONS=1000]
set -euo pipefail
BIN=$(realpath "${1:-target/release/pgcarpool}")
SETTINGS=${2:-9000}
TX=${3:-1000}
PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
DIR=$(mktemp -d /tmp/pgcarpool-settings.XXXXXX)
chmod 755 "$DIR"
RUN=()
if [ "$(id -u)" = 0 ]; then
    chown postgres "$DIR"
    RUN=(runuser -u postgres --)
fi
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PGPORT=$(free_port)
POOLPORT=$(free_port)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    "${RUN[@]}" "$PGBIN/pg_ctl" -D "$DIR/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$DIR"
}
trap cleanup EXIT

"${RUN[@]}" "$PGBIN/initdb" -D "$DIR/data" -U postgres -A trust >/dev/null
"${RUN[@]}" "$PGBIN/pg_ctl" -D "$DIR/data" -l "$DIR/pg.log" -w \
    -o "-p $PGPORT -k $DIR -c listen_addresses=127.0.0.1 -c fsync=off" start >/dev/null
cat >"$DIR/pgbouncer.ini" <<EOF
[databases]
postgres = host=127.0.0.1 port=$PGPORT
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $POOLPORT
unix_socket_dir =
auth_type = trust
auth_file = $DIR/userlist.txt
pool_mode = transaction
default_pool_size = 20
max_client_conn = 100
client_max_settings = 20000
logfile = $DIR/pgcarpool.log
EOF
echo '"postgres" ""' >"$DIR/userlist.txt"
"${RUN[@]}" "$BIN" "$DIR/pgbouncer.ini" &
PIDS+=($!)
for _ in $(seq 100); do
    "$PGBIN/psql" -h 127.0.0.1 -p "$POOLPORT" -U postgres -d postgres -Atc 'select 1' >/dev/null 2>&1 && break
    sleep 0.1
done

for i in $(seq "$SETTINGS"); do echo "SET my.s$i = 'v$i';"; done >"$DIR/sets.sql"
for _ in $(seq "$TX"); do echo "select 1;"; done >"$DIR/tx.sql"
cat "$DIR/sets.sql" "$DIR/tx.sql" >"$DIR/heavy.sql"
echo "select 1;" >"$DIR/one.sql"
pgb() { "$PGBIN/pgbench" -h 127.0.0.1 -p "$POOLPORT" -U postgres -n "$@" postgres; }

# Mean latency (ms) of the commands of lines FROM..TO of a `pgbench -r` report.
mean() { awk -v from="$2" -v to="$3" '/^ +[0-9.]+ +[0-9]+ +/ {n++; if (n >= from && n <= to) {s += $1; c++}} END {printf "%.3f", s / c}' "$1"; }

"$PGBIN/pgbench" -h 127.0.0.1 -p "$PGPORT" -U postgres -n -t 1 -r -f "$DIR/heavy.sql" postgres \
    >"$DIR/direct.out" 2>&1
# Both clients alone first, in the same conditions (a new connection each): the one with
# the settings, then the one without.
pgb -t 1 -r -f "$DIR/heavy.sql" >"$DIR/heavy.out" 2>&1
pgb -t 1 -r -f "$DIR/tx.sql" >"$DIR/plain.out" 2>&1
plain=$(mean "$DIR/plain.out" 1 "$TX")

# The bystander runs alone, then beside the client with many settings.
pgb -T 5 -f "$DIR/one.sql" -l --log-prefix="$DIR/alone" >/dev/null 2>&1
"$PGBIN/pgbench" -h 127.0.0.1 -p "$POOLPORT" -U postgres -n -T 900 -f "$DIR/one.sql" -l \
    --log-prefix="$DIR/beside" postgres >/dev/null 2>&1 &
BY=$!
start=$(date +%s.%N)
pgb -t 1 -r -f "$DIR/heavy.sql" >"$DIR/heavy-beside.out" 2>&1
end=$(date +%s.%N)
kill "$BY" 2>/dev/null || true
wait "$BY" 2>/dev/null || true
sets_total() { awk -v s="$SETTINGS" '/^ +[0-9.]+ +[0-9]+ +/ {n++; if (n <= s) t += $1} END {printf "%.0f", t}' "$1"; }
direct_ms=$(sets_total "$DIR/direct.out")
direct_tx=$(mean "$DIR/direct.out" $((SETTINGS + 1)) $((SETTINGS + TX)))
sets_ms=$(sets_total "$DIR/heavy-beside.out")
heavy=$(mean "$DIR/heavy.out" $((SETTINGS + 1)) $((SETTINGS + TX)))
# Latency percentiles (ms) of pgbench -l logs (3rd column: µs).
pct() { cat "$@" 2>/dev/null | awk '{print $3}' | sort -n | awk '{a[NR]=$1} END {printf "p50 %.2f p99 %.2f max %.2f (n=%d)", a[int(NR*0.5)]/1000, a[int(NR*0.99)]/1000, a[NR]/1000, NR}'; }
echo "pgcarpool: $BIN"
echo "$SETTINGS SETs: ${sets_ms} ms in all (sum of command latencies), wall $(echo "$end - $start" | bc) s"
echo "the same straight to PostgreSQL: ${direct_ms} ms, then $TX transactions: mean ${direct_tx} ms"
echo "then $TX transactions (alone): mean ${heavy} ms; a client with no settings: ${plain} ms;" \
    "ratio $(awk -v h="$heavy" -v p="$plain" 'BEGIN {printf "%.2f", h / p}')"
echo "beside the bystander, the $SETTINGS SETs and $TX transactions' mean: $(mean "$DIR/heavy-beside.out" $((SETTINGS + 1)) $((SETTINGS + TX))) ms"
echo "bystander alone:          $(pct "$DIR"/alone.*)"
echo "bystander beside the SETs: $(pct "$DIR"/beside.*)"
