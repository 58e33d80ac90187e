# Sourced by bench/instructions.sh and bench/perfstat.sh: a throwaway PostgreSQL in $DIR on
# $PGPORT (binaries in $PGBIN, run through "${RUN[@]}" as postgres), initialised for pgbench
# -S, and the pooler's userlist in $DIR/userlist.txt. With AUTH=md5|scram, a login role
# bench_$AUTH whose secret (PostgreSQL's own md5 or SCRAM one) the userlist holds, as
# bench/run's connect rows log in; the server side stays trust, so only the client's login
# to the pooler is measured. Sets LOGIN and AUTHTYPE (the pooler's auth_type), and exports
# PGPASSWORD for a password login.
start_throwaway_postgres() {
    "${RUN[@]}" "$PGBIN/initdb" -D "$DIR/data" -U postgres -A trust >/dev/null
    "${RUN[@]}" "$PGBIN/pg_ctl" -D "$DIR/data" -l "$DIR/pg.log" -w \
        -o "-p $PGPORT -k $DIR -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200" \
        start >/dev/null
    "$PGBIN/pgbench" -h 127.0.0.1 -p "$PGPORT" -U postgres -i -s 1 -q postgres >/dev/null 2>&1
    echo '"postgres" ""' >"$DIR/userlist.txt"
    LOGIN=postgres AUTHTYPE=trust
    if [ -n "$AUTH" ]; then
        LOGIN=bench_$AUTH AUTHTYPE=md5
        local enc psql_pg
        enc=$([ "$AUTH" = md5 ] && echo md5 || echo scram-sha-256)
        psql_pg=("$PGBIN/psql" -h 127.0.0.1 -p "$PGPORT" -U postgres -d postgres -Atq)
        "${psql_pg[@]}" -c "set password_encryption = '$enc'" \
            -c "create role $LOGIN login password '${LOGIN}_pw'" \
            -c "grant select, insert, update on all tables in schema public to $LOGIN"
        "${psql_pg[@]}" -F ' ' -c "select rolname, rolpassword from pg_authid where rolname = '$LOGIN'" |
            awk '{printf "\"%s\" \"%s\"\n", $1, $2}' >>"$DIR/userlist.txt"
        export PGPASSWORD=${LOGIN}_pw
    fi
}
