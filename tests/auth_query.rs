//! auth_query / auth_user / auth_dbname (issue 11, item 4) and SCRAM / md5 pass-through
//! (item 2), against a real PostgreSQL: users PgBouncer finds in PostgreSQL rather than in
//! auth_file, where the lookup runs, how long its answer is kept, its errors in PgBouncer's
//! words, and servers logged in to with only a verifier or an md5 hash on the pooler.
mod harness;

use std::time::Duration;

use harness::{
    TempPostgres, TestPooler, dsn_with_password, error_text, scalar, try_connect, wait_for,
};
use pgcarpool::auth::scram;

/// What a login came to: "logged in" (after a query through it), or the SQLSTATE and
/// message, or a client-side error.
async fn outcome(port: u16, user: &str, password: &str, db: &str) -> String {
    match try_connect(&dsn_with_password(port, user, Some(password), db)).await {
        Ok(c) => match scalar(&c, "select 1").await {
            Ok(_) => "logged in".into(),
            Err(e) => format!("query failed: {e}"),
        },
        Err(e) => error_text(&e),
    }
}

/// `current_user` through the pooler (the server really is logged in as that user).
async fn current_user(port: u16, user: &str, password: &str, db: &str) -> String {
    let c = try_connect(&dsn_with_password(port, user, Some(password), db))
        .await
        .unwrap_or_else(|e| panic!("{user} through the pooler: {e:?}"));
    let rows = c.query("select current_user::text", &[]).await.unwrap();
    rows[0].get(0)
}

/// A pooler whose global auth_user is `postgres` (trust in the harness's pg_hba; its
/// auth_file line is the harness's).
fn auth_query_pooler(pg: &TempPostgres) -> harness::TestPoolerBuilder {
    TestPooler::builder(pg).setting("auth_user", "postgres")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_query_finds_users_created_after_the_start() {
    let pg = TempPostgres::start();
    for auth_type in ["md5", "scram-sha-256", "plain"] {
        let p = auth_query_pooler(&pg)
            .setting("auth_type", auth_type)
            .start()
            .await;
        // Created after the pooler started, in no auth_file: md5- and SCRAM-stored.
        let (m, s) = (
            format!("aq_md5_{}", &auth_type[..3]),
            format!("aq_scram_{}", &auth_type[..3]),
        );
        pg.psql(&format!(
            "set password_encryption = 'md5'; create role {m} login password 'md5-pw'"
        ));
        pg.psql(&format!("create role {s} login password 'scram-pw'"));
        // The pooler knows no password: PostgreSQL's md5 challenge is answered with the
        // hash auth_query returned, its SCRAM exchange with the keys of the client's proof.
        if auth_type == "scram-sha-256" {
            // As PgBouncer: SCRAM cannot check a password against an md5 hash.
            let got = outcome(p.port(), &m, "md5-pw", "testdb").await;
            assert!(got.starts_with("28P01 "), "{got}");
        } else {
            assert_eq!(
                current_user(p.port(), &m, "md5-pw", "testdb").await,
                m,
                "{auth_type}"
            );
        }
        assert_eq!(
            current_user(p.port(), &s, "scram-pw", "testdb").await,
            s,
            "{auth_type}"
        );
        for user in [&m, &s] {
            let wrong = outcome(p.port(), user, "nope", "testdb").await;
            assert!(
                wrong == format!("28P01 password authentication failed for user \"{user}\"")
                    || wrong == "28P01 SASL authentication failed",
                "{auth_type}: {wrong}"
            );
        }
        // Not in PostgreSQL: PgBouncer's words.
        assert_eq!(
            outcome(p.port(), "aq_nobody", "x", "testdb").await,
            "08P01 no such user",
            "{auth_type}"
        );
        // The lookup ran over the auth user's pool in the client's database.
        let admin = p.connect("postgres", "pgbouncer").await;
        let pool = harness::console_value(
            &admin,
            "POOLS",
            &[("database", "testdb"), ("user", "postgres")],
            "user",
        )
        .await;
        assert_eq!(pool.as_deref(), Some("postgres"), "{auth_type}");
        p.shutdown().await;
    }
}

/// An auth_query function that also counts its calls per user (table `aq_log` of `db`).
fn counting_lookup(pg: &TempPostgres, db: &str) {
    pg.psql_in(
        db,
        "create table aq_log(name text);
         create function aq_lookup(u text) returns table(usename name, passwd text)
           language sql volatile as $$
             insert into aq_log values (u);
             select rolname, rolpassword from pg_authid where rolname = u and rolcanlogin;
           $$;",
    );
}

fn lookups(pg: &TempPostgres, db: &str, user: &str) -> u32 {
    pg.psql_in(
        db,
        &format!("select count(*) from aq_log where name = '{user}'"),
    )
    .parse()
    .expect("a count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_are_kept_for_the_ttl_and_a_failed_login_forgets_them() {
    let pg = TempPostgres::start();
    counting_lookup(&pg, "testdb");
    pg.psql("create role aq_kept login password 'pw'");
    let mut p = auth_query_pooler(&pg)
        .setting("auth_query", "SELECT * FROM aq_lookup($1)")
        .setting("auth_query_cache_ttl", "3600")
        .start()
        .await;
    for _ in 0..3 {
        assert_eq!(
            outcome(p.port(), "aq_kept", "pw", "testdb").await,
            "logged in"
        );
    }
    assert_eq!(
        lookups(&pg, "testdb", "aq_kept"),
        1,
        "three logins, one lookup"
    );
    // A wrong password forgets the answer: the next login asks again (a changed password
    // is seen at the next try, whatever the TTL).
    assert!(
        outcome(p.port(), "aq_kept", "nope", "testdb")
            .await
            .starts_with("28P01")
    );
    pg.psql("alter role aq_kept password 'pw2'");
    assert_eq!(
        outcome(p.port(), "aq_kept", "pw2", "testdb").await,
        "logged in"
    );
    assert_eq!(lookups(&pg, "testdb", "aq_kept"), 2);
    // New servers log in with what the newest login taught (keys of the new verifier).
    pg.psql("select pg_terminate_backend(pid) from pg_stat_activity where usename = 'aq_kept'");
    let admin = p.connect("postgres", "pgbouncer").await;
    admin.simple_query("RECONNECT testdb").await.unwrap();
    assert_eq!(
        outcome(p.port(), "aq_kept", "pw2", "testdb").await,
        "logged in"
    );
    // A reload forgets every answer (auth_query, auth_user or auth_dbname may have changed).
    p.reload_with(|c| c).await;
    assert_eq!(
        outcome(p.port(), "aq_kept", "pw2", "testdb").await,
        "logged in"
    );
    assert_eq!(lookups(&pg, "testdb", "aq_kept"), 3);
    p.shutdown().await;

    // TTL 0: asked at every login, as PgBouncer.
    let p = auth_query_pooler(&pg)
        .setting("auth_query", "SELECT * FROM aq_lookup($1)")
        .setting("auth_query_cache_ttl", "0")
        .start()
        .await;
    for _ in 0..3 {
        assert_eq!(
            outcome(p.port(), "aq_kept", "pw2", "testdb").await,
            "logged in"
        );
    }
    assert_eq!(lookups(&pg, "testdb", "aq_kept"), 6);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_user_is_refused_once_its_entry_expires() {
    let pg = TempPostgres::start();
    pg.psql("create role aq_gone login password 'pw'");
    let p = auth_query_pooler(&pg)
        .setting("auth_query_cache_ttl", "0.3")
        .start()
        .await;
    assert_eq!(
        outcome(p.port(), "aq_gone", "pw", "testdb").await,
        "logged in"
    );
    pg.psql(
        "select pg_terminate_backend(pid) from pg_stat_activity where usename = 'aq_gone';
         drop role aq_gone",
    );
    wait_for(
        "the dropped user refused",
        Duration::from_secs(10),
        || async { outcome(p.port(), "aq_gone", "pw", "testdb").await == "08P01 no such user" },
    )
    .await;
    // Past VALID UNTIL: the default query returns NULL, and no password matches.
    pg.psql("create role aq_old login password 'pw' valid until '1999-01-01'");
    assert_eq!(
        outcome(p.port(), "aq_old", "pw", "testdb").await,
        "28P01 password authentication failed for user \"aq_old\""
    );
    pg.psql("alter role aq_old valid until 'infinity'");
    assert_eq!(
        outcome(p.port(), "aq_old", "pw", "testdb").await,
        "logged in"
    );
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_user_and_auth_dbname_per_database() {
    let pg = TempPostgres::start();
    // A table of secrets that exists only in database `postgres`.
    pg.psql(
        "create table aq_creds(name text, secret text);
         insert into aq_creds values ('aq_tabled', 'from-table');
         create role aq_tabled login password 'from-table'",
    );
    let query = "auth_query='SELECT name, secret FROM aq_creds WHERE name = $1'";
    let entry = pg.db_entry("testdb");
    let p = TestPooler::builder(&pg)
        .database("with_auth", &format!("{entry} auth_user=postgres"))
        .database("without_auth", &entry)
        .database("authsrc", &pg.db_entry("postgres"))
        .database(
            "via_authsrc",
            &format!("{entry} auth_user=postgres auth_dbname=authsrc {query}"),
        )
        .database("via_itself", &format!("{entry} auth_user=postgres {query}"))
        .database(
            "via_console",
            &format!("{entry} auth_user=postgres auth_dbname=pgbouncer"),
        )
        .database(
            "via_nowhere",
            &format!("{entry} auth_user=postgres auth_dbname=nowhere"),
        )
        .start()
        .await;
    // The database's auth_user applies to it alone.
    assert_eq!(
        outcome(p.port(), "aq_tabled", "from-table", "with_auth").await,
        "logged in"
    );
    assert_eq!(
        outcome(p.port(), "aq_tabled", "from-table", "without_auth").await,
        "28P01 password authentication failed for user \"aq_tabled\""
    );
    // The query runs in auth_dbname's database (the table is there, not in testdb).
    assert_eq!(
        current_user(p.port(), "aq_tabled", "from-table", "via_authsrc").await,
        "aq_tabled"
    );
    assert_eq!(
        outcome(p.port(), "aq_tabled", "from-table", "via_itself").await,
        "08P01 bouncer config error"
    );
    // PgBouncer's words for an auth database that cannot be.
    assert_eq!(
        outcome(p.port(), "aq_tabled", "from-table", "via_console").await,
        "08P01 bouncer config error"
    );
    assert_eq!(
        outcome(p.port(), "aq_tabled", "from-table", "via_nowhere").await,
        "08P01 bouncer config error"
    );
    let admin = p.connect("postgres", "pgbouncer").await;
    admin.simple_query("DISABLE authsrc").await.unwrap();
    assert_eq!(
        outcome(p.port(), "aq_tabled", "from-table", "via_authsrc").await,
        "08P01 authentication database \"authsrc\" is disabled"
    );
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_of_the_wrong_shape_is_a_config_error() {
    let pg = TempPostgres::start();
    pg.psql("create role aq_shape login password 'pw'");
    let entry = pg.db_entry("testdb");
    let p = TestPooler::builder(&pg)
        .setting("auth_user", "postgres")
        .database(
            "one_column",
            &format!("{entry} auth_query='SELECT $1::text'"),
        )
        .database(
            "null_name",
            &format!("{entry} auth_query='SELECT NULL::text, $1::text'"),
        )
        .database(
            "no_table",
            &format!("{entry} auth_query='SELECT a, b FROM aq_missing WHERE a = $1'"),
        )
        .database("testdb", &entry)
        .start()
        .await;
    for db in ["one_column", "null_name", "no_table"] {
        assert_eq!(
            outcome(p.port(), "aq_shape", "pw", db).await,
            "08P01 bouncer config error",
            "{db}"
        );
    }
    // The auth pool's server survived the errors: the default query still works.
    assert_eq!(
        outcome(p.port(), "aq_shape", "pw", "testdb").await,
        "logged in"
    );
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_in_auth_file_is_never_looked_up() {
    let pg = TempPostgres::start();
    counting_lookup(&pg, "testdb");
    let p = auth_query_pooler(&pg)
        .setting("auth_query", "SELECT * FROM aq_lookup($1)")
        .start()
        .await;
    // md5user is in auth_file (md5pass) and in PostgreSQL.
    assert_eq!(
        outcome(p.port(), "md5user", "md5pass", "testdb").await,
        "logged in"
    );
    assert_eq!(lookups(&pg, "testdb", "md5user"), 0);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trust_lets_in_the_users_auth_query_finds_and_no_one_else() {
    let pg = TempPostgres::start();
    let p = auth_query_pooler(&pg)
        .setting("auth_type", "trust")
        .start()
        .await;
    pg.psql("set password_encryption = 'md5'; create role aq_trusted login password 'pw'");
    // No password from the client; the server's md5 challenge is answered with the hash.
    assert_eq!(
        current_user(p.port(), "aq_trusted", "", "testdb").await,
        "aq_trusted"
    );
    assert_eq!(
        outcome(p.port(), "aq_untrusted", "", "testdb").await,
        "08P01 no such user"
    );
    p.shutdown().await;
}

/// The verifier PostgreSQL stores for `role`.
fn stored_secret(pg: &TempPostgres, role: &str) -> String {
    pg.psql(&format!(
        "select rolpassword from pg_authid where rolname = '{role}'"
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_pass_through_with_only_the_verifier_in_auth_file() {
    let pg = TempPostgres::start();
    // scramuser: scram-sha-256 in PostgreSQL's pg_hba; the pooler holds only its verifier.
    let verifier = stored_secret(&pg, "scramuser");
    assert!(verifier.starts_with("SCRAM-SHA-256$4096:"), "{verifier}");
    for auth_type in ["scram-sha-256", "md5", "plain"] {
        let p = TestPooler::builder(&pg)
            .setting("auth_type", auth_type)
            .auth_file_line(&format!("\"scramuser\" \"{verifier}\""))
            .start()
            .await;
        assert_eq!(
            current_user(p.port(), "scramuser", "scrampass", "testdb").await,
            "scramuser",
            "{auth_type}"
        );
        let wrong = outcome(p.port(), "scramuser", "nope", "testdb").await;
        assert!(wrong.starts_with("28P01 "), "{auth_type}: {wrong}");
        p.shutdown().await;
    }
    // A database forcing the user: no client proof reaches its pool, and a verifier alone
    // logs in to nothing (PgBouncer's words).
    let p = TestPooler::builder(&pg)
        .auth_file_line(&format!("\"scramuser\" \"{verifier}\""))
        .database(
            "forced",
            &format!("{} user=scramuser", pg.db_entry("testdb")),
        )
        .start()
        .await;
    let got = outcome(p.port(), "md5user", "md5pass", "forced").await;
    assert!(
        got.contains("cannot do SCRAM authentication: wrong password type"),
        "{got}"
    );
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn md5_pass_through_with_only_the_hash_in_auth_file() {
    let pg = TempPostgres::start();
    // md5user: md5 in PostgreSQL's pg_hba; the pooler holds only the hash.
    let hash = stored_secret(&pg, "md5user");
    assert!(hash.starts_with("md5"), "{hash}");
    for auth_type in ["md5", "plain", "trust"] {
        let p = TestPooler::builder(&pg)
            .setting("auth_type", auth_type)
            .auth_file_line(&format!("\"md5user\" \"{hash}\""))
            .start()
            .await;
        assert_eq!(
            current_user(p.port(), "md5user", "md5pass", "testdb").await,
            "md5user",
            "{auth_type}"
        );
        p.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusual_salt_lengths_and_iteration_counts_work_on_both_sides() {
    let pg = TempPostgres::start();
    let cases: [(&[u8], u32); 3] = [(b"s", 1), (&[0x42; 64], 20_000), (b"seven!!", 4097)];
    for (i, (salt, iterations)) in cases.into_iter().enumerate() {
        let (role, pw) = (format!("aq_odd{i}"), format!("odd-pw-{i}"));
        let verifier =
            scram::verifier_to_string(&scram::verifier_from_password(&pw, salt, iterations));
        pg.psql(&format!("create role {role} login password '{verifier}'"));
        assert_eq!(
            stored_secret(&pg, &role),
            verifier,
            "PostgreSQL stores it as made"
        );
        let what = format!("salt of {} bytes, {iterations} iterations", salt.len());
        // Only the verifier on the pooler: pass-through both ways.
        let p = TestPooler::builder(&pg)
            .setting("auth_type", "scram-sha-256")
            .auth_file_line(&format!("\"{role}\" \"{verifier}\""))
            .start()
            .await;
        assert_eq!(
            current_user(p.port(), &role, &pw, "testdb").await,
            role,
            "{what}"
        );
        p.shutdown().await;
        // The password on the pooler: its own verifier for the client, the server's salt
        // and count towards PostgreSQL.
        let p = TestPooler::builder(&pg)
            .setting("auth_type", "scram-sha-256")
            .auth_file_line(&format!("\"{role}\" \"{pw}\""))
            .start()
            .await;
        assert_eq!(
            current_user(p.port(), &role, &pw, "testdb").await,
            role,
            "{what}"
        );
        p.shutdown().await;
        // Found by auth_query.
        let p = auth_query_pooler(&pg)
            .setting("auth_type", "scram-sha-256")
            .start()
            .await;
        assert_eq!(
            current_user(p.port(), &role, &pw, "testdb").await,
            role,
            "{what}"
        );
        let wrong = outcome(p.port(), &role, "nope", "testdb").await;
        assert_eq!(wrong, "28P01 SASL authentication failed", "{what}");
        p.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_logged_in_pgbouncers_words() {
    let pg = TempPostgres::start();
    pg.psql("create role aq_logged login password 'pw'");
    let entry = pg.db_entry("testdb");
    let p = harness::process::PoolerProcess::start(
        auth_query_pooler(&pg)
            .database("testdb", &entry)
            .database(
                "no_table",
                &format!("{entry} auth_query='SELECT a, b FROM aq_missing WHERE a = $1'"),
            )
            .database("via_console", &format!("{entry} auth_dbname=pgbouncer"))
            .database("via_nowhere", &format!("{entry} auth_dbname=nowhere")),
    )
    .await;
    for (db, user) in [
        ("testdb", "aq_nobody"),
        ("no_table", "aq_logged"),
        ("via_console", "aq_logged"),
        ("via_nowhere", "aq_logged"),
    ] {
        assert!(
            outcome(p.port(), user, "pw", db)
                .await
                .starts_with("08P01 ")
        );
    }
    let words = [
        "closing because: no such user (age=",
        "relation \"aq_missing\" does not exist",
        "closing because: bouncer config error (age=",
        "cannot use the reserved \"pgbouncer\" database as an auth_dbname",
        "authentication database \"nowhere\" is not configured",
    ];
    wait_for("the log lines", Duration::from_secs(10), || async {
        words.iter().all(|w| p.log().contains(w))
    })
    .await;
    // A login that found the secret: neither it nor any part of it is logged.
    assert_eq!(
        outcome(p.port(), "aq_logged", "pw", "testdb").await,
        "logged in"
    );
    let verifier = stored_secret(&pg, "aq_logged");
    for part in verifier.split(['$', ':']).filter(|s| s.len() > 8) {
        assert!(!p.log().contains(part), "a secret in the log: {part}");
    }
}
