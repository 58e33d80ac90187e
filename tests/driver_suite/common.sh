# Shared by tests/driver_suite/psycopg and tests/driver_suite/pgx (sourced, not run):
# system packages, a throwaway PostgreSQL per run, pgcarpool in front of one, clean-up of
# exactly what was started (by PID), a bounded run of the suite.
#
# The sourcing script sets `name` (used in messages and temp dir names) before sourcing and
# then calls, in order: ds_init, ds_packages, ds_pgcarpool_bin, ds_start_tmp. Each run of
# the suite: ds_start_pg <run>, ds_start_carpool <port> (through pgcarpool only),
# ds_run <run> <logfile> <command...>, ds_stop_carpool, ds_stop_pg.
# shellcheck shell=bash

here="$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cache="${DRIVER_SUITE_CACHE:-/tmp/pgcarpool-driver-suite}"
suite_timeout="${SUITE_TIMEOUT:-1200}"
only="${ONLY:-}"
strict="${STRICT:-0}"
pool_size="${POOL_SIZE:-4}"

say() { printf '==> %s\n' "$*" >&2; }
die() { printf 'driver_suite/%s: %s\n' "$name" "$*" >&2; exit 2; }

ds_init() {
    # libpq-style variables of the caller (PGSSLMODE, PGPASSWORD...) would reach pg_isready
    # and the tests: drop them all; the runs set their own.
    local var
    for var in $(compgen -e); do
        case "$var" in PG_BINDIR|PGCARPOOL_BIN) ;; PG*) unset "$var" ;; esac
    done
    case "$only" in ""|direct|pgcarpool) ;; *) die "ONLY must be direct or pgcarpool" ;; esac
    [ "$(id -u)" -eq 0 ] || die "run as root (installs packages, runs PostgreSQL as the postgres user)"
    mkdir -p "$cache"
}

apt_updated=""
apt_install() {
    say "apt-get install $*"
    if [ -z "$apt_updated" ]; then
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
        apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2
}

# PostgreSQL server programs (sets pgbin, pgmajor), with contrib (hstore, ltree, citext).
ds_packages() {
    if [ -n "${PG_BINDIR:-}" ]; then
        pgbin="$PG_BINDIR"
    else
        if ! compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null; then
            apt_install postgresql postgresql-contrib
        fi
        pgbin="$(dirname "$(printf '%s\n' /usr/lib/postgresql/*/bin/postgres | sort -V | tail -n 1)")"
    fi
    [ -x "$pgbin/initdb" ] && [ -x "$pgbin/pg_ctl" ] || die "no initdb/pg_ctl in $pgbin"
    pgmajor="$("$pgbin/postgres" --version | grep -oE '[0-9]+' | head -n 1)"
    # Debian's layout, or the server's own share folder (scripts/pg-version's majors: the
    # npm server's native/share/postgresql, the PyPI build's tools/share).
    if [ ! -e "/usr/share/postgresql/$pgmajor/extension/hstore.control" ] &&
        [ ! -e "$pgbin/../share/postgresql/extension/hstore.control" ] &&
        [ ! -e "$pgbin/../share/extension/hstore.control" ]; then
        apt_install "postgresql-contrib" || apt_install "postgresql-$pgmajor"
    fi
    id postgres >/dev/null 2>&1 || die "no postgres OS user (the postgresql package creates it)"
    command -v psql >/dev/null 2>&1 || apt_install postgresql-client
}

# The binary under test (sets bin): PGCARPOOL_BIN, or a release build of this repo.
ds_pgcarpool_bin() {
    [ "$only" != direct ] || return 0
    if [ -n "${PGCARPOOL_BIN:-}" ]; then
        bin="$PGCARPOOL_BIN"
    else
        say "cargo build --release"
        (cd "$repo" && cargo build --release >&2)
        bin="${CARGO_TARGET_DIR:-$repo/target}/release/pgcarpool"
        case "$bin" in /*) ;; *) bin="$repo/$bin" ;; esac
    fi
    [ -x "$bin" ] || die "no pgcarpool binary at $bin"
}

# --- clean-up: only what this script started ------------------------------------------
tmp=""
pg_data=""
carpool_pid=""
suite_pid=""
ds_cleanup() {
    local status=$?
    trap - EXIT INT TERM
    if [ -n "$suite_pid" ]; then
        # The suite runs under `timeout` in a process group of its own: end the group.
        kill -TERM -- "-$suite_pid" 2>/dev/null || kill -TERM "$suite_pid" 2>/dev/null || true
        wait "$suite_pid" 2>/dev/null || true
    fi
    ds_stop_carpool
    ds_stop_pg
    if [ -n "$tmp" ]; then
        rm -rf "$tmp"
    fi
    exit "$status"
}
ds_stop_carpool() {
    if [ -n "$carpool_pid" ]; then
        if kill -0 "$carpool_pid" 2>/dev/null; then
            kill -QUIT "$carpool_pid" 2>/dev/null || true
            for _ in $(seq 50); do kill -0 "$carpool_pid" 2>/dev/null || break; sleep 0.1; done
            kill -KILL "$carpool_pid" 2>/dev/null || true
        fi
        wait "$carpool_pid" 2>/dev/null || true
        carpool_pid=""
    fi
}
ds_stop_pg() {
    if [ -n "$pg_data" ]; then
        pg_run "$pgbin/pg_ctl" -D "$pg_data" -m immediate -w stop >/dev/null 2>&1 || true
        pg_data=""
    fi
}

ds_start_tmp() {
    trap ds_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    tmp="$(mktemp -d "/tmp/pgcarpool-$name.XXXXXX")"
    chown postgres: "$tmp"
    chmod 755 "$tmp"
}

pg_run() { (cd "$tmp" && runuser -u postgres -- "$@"); }

# A port nothing listens on right now (a clash at start is retried).
free_port() {
    local port
    while :; do
        port=$((20000 + RANDOM % 40000))
        if ! (: </dev/tcp/127.0.0.1/"$port") 2>/dev/null; then
            echo "$port"
            return
        fi
    done
}

wait_ready() { # wait_ready <port> [pid]: until PostgreSQL's protocol answers (30 s)
    local port=$1 pid=${2:-} deadline=$((SECONDS + 30))
    until "$pgbin/pg_isready" -q -h 127.0.0.1 -p "$port" -U postgres -d postgres; do
        if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then return 1; fi
        [ "$SECONDS" -lt "$deadline" ] || return 1
        sleep 0.1
    done
}

# A fresh cluster for each run, so that one run's leftovers cannot affect the other.
# initdb --auth=trust gives trust for local, 127.0.0.1 and ::1. Extra postgresql.conf
# lines may be given in PG_EXTRA_CONF (the sourcing script sets it).
ds_start_pg() { # ds_start_pg <run>: sets pg_port, pg_data
    local run=$1 dir="$tmp/$1" try
    mkdir -p "$dir"
    chown postgres: "$dir"
    pg_run "$pgbin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 \
        --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 \
        || pg_run "$pgbin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 \
            --locale=C >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; die "initdb failed"; }
    for try in 1 2 3; do
        pg_port="$(free_port)"
        cat >"$dir/data/postgresql.auto.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $pg_port
unix_socket_directories = '$dir'
max_connections = 200
max_prepared_transactions = 10
fsync = off
synchronous_commit = off
full_page_writes = off
jit = off
log_connections = on
shared_buffers = 128MB
${PG_EXTRA_CONF:-}
EOF
        pg_data="$dir/data"
        if pg_run "$pgbin/pg_ctl" -D "$pg_data" -l "$dir/postgres.log" -w -t 60 start \
            >/dev/null 2>&1 && wait_ready "$pg_port"; then
            return 0
        fi
        pg_run "$pgbin/pg_ctl" -D "$pg_data" -m immediate -w stop >/dev/null 2>&1 || true
        pg_data=""
    done
    tail -n 20 "$dir/postgres.log" >&2 || true
    die "PostgreSQL did not start"
}

# pgcarpool in transaction mode with a pool of $pool_size servers per database/user.
# Users in CARPOOL_USERS (default postgres) may log in (auth_type = trust).
ds_start_carpool() { # ds_start_carpool <backend port>: sets carpool_port, carpool_pid
    local backend=$1 dir="$tmp/pgcarpool" try user
    mkdir -p "$dir"
    : >"$dir/userlist.txt"
    for user in ${CARPOOL_USERS:-postgres}; do printf '"%s" ""\n' "$user" >>"$dir/userlist.txt"; done
    for try in 1 2 3; do
        carpool_port="$(free_port)"
        cat >"$dir/pgbouncer.ini" <<EOF
[databases]
* = host=127.0.0.1 port=$backend

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $carpool_port
unix_socket_dir =
auth_type = trust
auth_file = $dir/userlist.txt
pool_mode = transaction
default_pool_size = $pool_size
max_client_conn = 500
admin_users = postgres
logfile = $dir/pgcarpool.log
EOF
        # As root pgcarpool (like PgBouncer) runs as another user: postgres, owning $dir.
        local as_user=()
        if [ "$(id -u)" = 0 ]; then
            as_user=(-u postgres)
            chown -R postgres: "$dir"
        fi
        "$bin" "${as_user[@]}" -q "$dir/pgbouncer.ini" </dev/null >>"$dir/stderr.log" 2>&1 &
        carpool_pid=$!
        if wait_ready "$carpool_port" "$carpool_pid"; then
            return 0
        fi
        ds_stop_carpool
    done
    tail -n 20 "$dir/pgcarpool.log" "$dir/stderr.log" >&2 || true
    die "pgcarpool did not start"
}

# Runs the suite's command bounded by SUITE_TIMEOUT, in the background and waited for, so
# that a signal to the script runs its clean-up at once. Sets run_status and run_seconds.
ds_run() { # ds_run <run> <logfile> <command...>
    local run=$1 log=$2 start=$SECONDS
    shift 2
    run_status=0
    say "running $name's tests $run (at most ${suite_timeout}s)"
    setsid timeout -k 30 "$suite_timeout" "$@" >"$log" 2>&1 </dev/null &
    suite_pid=$!
    wait "$suite_pid" || run_status=$?
    suite_pid=""
    run_seconds=$((SECONDS - start))
}
