#!/bin/bash
# plan_once on and off (issue 21 item 3): PostgreSQL's and the pooler's CPU per transaction,
# and tps, under pgbench -S -M extended through one pgcarpool binary, runs alternating
# 1, 0, 1, 0. A throwaway PostgreSQL (run as the postgres OS user) on a free loopback port;
# CPU is utime+stime from /proc of the postmaster's children and of the pooler.
#   bench/plan_once.sh target/release/pgcarpool [clients=16] [seconds=8]
set -e
BIN=$(realpath "$1"); CLIENTS=${2:-16}; SECS=${3:-8}
T=$(mktemp -d /tmp/pgcarpool-plan-once.XXXX); chown postgres $T
B=/usr/lib/postgresql/15/bin
fp() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
P=$(fp); CP=$(fp)
runuser -u postgres -- $B/initdb -D $T/data -U postgres --auth=trust -E UTF8 --locale=C >/dev/null
runuser -u postgres -- $B/pg_ctl -D $T/data -o "-c port=$P -c listen_addresses=127.0.0.1 -c unix_socket_directories=$T -c fsync=off -c synchronous_commit=off -c shared_buffers=128MB -c max_connections=200 -c autovacuum=off" -l $T/pg.log start -w >/dev/null
trap "runuser -u postgres -- $B/pg_ctl -D $T/data stop -m immediate >/dev/null 2>&1; rm -rf $T" EXIT
PM=$(head -1 $T/data/postmaster.pid)
$B/pgbench -q -i -s 1 -h 127.0.0.1 -p $P -U postgres postgres >/dev/null 2>&1
echo '"postgres" ""' > $T/users.txt
cpu() { local s=0; for p in "$@"; do [ -r /proc/$p/stat ] && s=$((s + $(awk '{print $14+$15}' /proc/$p/stat))); done; echo $s; }
for mode in 1 0 1 0; do
  cat > $T/p.ini <<INI
[databases]
postgres = host=127.0.0.1 port=$P dbname=postgres
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $CP
unix_socket_dir =
auth_type = trust
auth_file = $T/users.txt
pool_mode = transaction
default_pool_size = 20
max_client_conn = 500
logfile = $T/pooler.log
plan_once = $mode
INI
  $BIN -u postgres $T/p.ini >/dev/null 2>&1 & PID=$!
  for i in $(seq 50); do (echo > /dev/tcp/127.0.0.1/$CP) 2>/dev/null && break; sleep 0.1; done
  $B/pgbench -n -S -M extended -c $CLIENTS -j 2 -T 2 -h 127.0.0.1 -p $CP -U postgres postgres >/dev/null 2>&1
  KIDS=$(pgrep -P $PM | tr '\n' ' ')
  b0=$(cpu $KIDS); c0=$(cpu $PID)
  OUT=$($B/pgbench -n -S -M extended -c $CLIENTS -j 2 -T $SECS -h 127.0.0.1 -p $CP -U postgres postgres 2>&1)
  KIDS2=$(pgrep -P $PM | tr '\n' ' ')
  b1=$(cpu $KIDS2); c1=$(cpu $PID)
  TX=$(echo "$OUT" | awk '/number of transactions actually processed/ {print $NF}' | cut -d/ -f1)
  TPS=$(echo "$OUT" | awk '/^tps/ {print $3}')
  HZ=$(getconf CLK_TCK)
  python3 -c "tx=$TX; print(f'plan_once=$mode c=$CLIENTS tps={float(\"$TPS\"):.0f} postgres_cpu_us_per_tx={($b1-$b0)*1e6/$HZ/tx:.1f} pooler_cpu_us_per_tx={($c1-$c0)*1e6/$HZ/tx:.1f}')"
  kill $PID; wait $PID 2>/dev/null || true
done
