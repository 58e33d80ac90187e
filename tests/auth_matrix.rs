//! Every auth_type × right or wrong password × known or unknown user, with the outcome a
//! client sees: logged in, or refused with the SQLSTATE PostgreSQL gives for the same case
//! (28P01 for a failed password, 28000 for a login the rules refuse) and PgBouncer's text.
//! Password methods are also run straight against PostgreSQL and must agree with it.
//! Every attempt is bounded in time: a hang is an outcome ("timeout") and fails the table.
//!
//! The abuse cases (unknown users get the same exchange as wrong passwords, log injection,
//! sockets that never log in, reloads from empty files) are in tests/login_abuse.rs.
mod harness;

use std::path::Path;
use std::time::Duration;

use harness::process::PoolerProcess;
use harness::{
    TempPostgres, TestPooler, conninfo_quote, dsn_with_password, error_text, scalar, try_connect,
};

/// How long one login may take before it counts as a hang.
const LOGIN_LIMIT: Duration = Duration::from_secs(10);

/// What a login came to: `ok <current_user>`, `<SQLSTATE> <message>`, a client-side error
/// (the server asked for a password the client does not have) or `timeout`.
async fn outcome(dsn: &str) -> String {
    let attempt = async {
        let client = try_connect(dsn).await.map_err(|e| error_text(&e))?;
        scalar(&client, "select current_user").await
    };
    match tokio::time::timeout(LOGIN_LIMIT, attempt).await {
        Err(_) => "timeout".into(),
        Ok(Ok(user)) => format!("ok {user}"),
        Ok(Err(e)) => e,
    }
}

/// The SQLSTATE of an outcome ("ok" when logged in).
fn class(outcome: &str) -> &str {
    outcome.split(' ').next().unwrap_or("")
}

/// Over TCP to the pooler's port, database `db`.
fn tcp(port: u16, user: &str, password: Option<&str>, db: &str) -> String {
    dsn_with_password(port, user, password, db)
}

/// Over the Unix socket in `dir` for `port`.
fn unix(dir: &Path, port: u16, user: &str, password: Option<&str>, db: &str) -> String {
    let mut dsn = format!(
        "host={} port={port} user={} dbname={db}",
        conninfo_quote(&dir.to_string_lossy()),
        conninfo_quote(user)
    );
    if let Some(p) = password {
        dsn.push_str(&format!(" password={}", conninfo_quote(p)));
    }
    dsn
}

/// Users of the matrix: (name, right password); `nobody` is in no auth_file and no
/// PostgreSQL.
const USERS: [(&str, &str); 3] = [
    ("md5user", "md5pass"),
    ("scramuser", "scrampass"),
    ("nobody", "nopass"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn password_methods_refuse_as_postgresql_does() {
    let pg = TempPostgres::start();
    for auth_type in ["plain", "md5", "scram-sha-256"] {
        let p = TestPooler::builder(&pg)
            .setting("auth_type", auth_type)
            .start()
            .await;
        for (user, right) in USERS {
            for password in [right, "wrong"] {
                let got = outcome(&tcp(p.port(), user, Some(password), "testdb")).await;
                let straight = outcome(&tcp(pg.port(), user, Some(password), "testdb")).await;
                let known = user != "nobody";
                let want = if known && password == right {
                    format!("ok {user}")
                } else if auth_type == "scram-sha-256" {
                    // PgBouncer's words: a failed SCRAM exchange names no user.
                    "28P01 SASL authentication failed".into()
                } else {
                    format!("28P01 password authentication failed for user \"{user}\"")
                };
                let case = format!("{auth_type} {user}/{password}");
                assert_eq!(got, want, "{case}");
                assert_eq!(
                    class(&got),
                    class(&straight),
                    "{case}: PostgreSQL said {straight}"
                );
            }
        }
        p.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trust_wants_a_known_user_and_any_takes_everyone() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("auth_type", "trust")
        .start()
        .await;
    for (user, right) in USERS {
        for password in [right, "wrong"] {
            let got = outcome(&tcp(p.port(), user, Some(password), "testdb")).await;
            let want = match user {
                // PostgreSQL: 28000 role "nobody" does not exist; PgBouncer's text.
                "nobody" => "28000 \"trust\" authentication failed".to_string(),
                _ => format!("ok {user}"),
            };
            assert_eq!(got, want, "trust {user}/{password}");
        }
    }
    p.shutdown().await;
    // any: every database logs in as its forced user; the name given is ignored.
    let p = TestPooler::builder(&pg)
        .setting("auth_type", "any")
        .database("testdb", &format!("{} user=md5user", pg.db_entry("testdb")))
        .start()
        .await;
    for (user, right) in USERS {
        for password in [right, "wrong"] {
            let got = outcome(&tcp(p.port(), user, Some(password), "testdb")).await;
            assert_eq!(got, "ok md5user", "any {user}/{password}");
        }
    }
    p.shutdown().await;
}

/// A pooler config with `auth_type = hba` and these rules and ident lines (written into
/// `dir`, which also holds the Unix socket), databases `dbs` (name, entry).
fn hba_builder(
    pg: &TempPostgres,
    dir: &Path,
    rules: &str,
    ident: &str,
    dbs: &[(&str, String)],
) -> harness::TestPoolerBuilder {
    std::fs::write(dir.join("hba.conf"), rules).unwrap();
    std::fs::write(dir.join("ident.conf"), ident).unwrap();
    let mut b = TestPooler::builder(pg)
        .setting("auth_type", "hba")
        .setting("auth_hba_file", &dir.join("hba.conf").to_string_lossy())
        .setting("auth_ident_file", &dir.join("ident.conf").to_string_lossy())
        .setting("unix_socket_dir", &dir.to_string_lossy());
    for (name, entry) in dbs {
        b = b.database(name, entry);
    }
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hba_rules_pick_the_method_per_database() {
    let pg = TempPostgres::start();
    let rules = "\
# one database per method
host    trustdb   all  127.0.0.1/32  trust
host    md5db     all  127.0.0.1/32  md5
host    scramdb   all  127.0.0.1/32  scram-sha-256
host    passdb    all  127.0.0.1/32  password
host    rejectdb  all  127.0.0.1/32  reject
hostssl ssldb     all  0.0.0.0/0     trust
hostnossl nossldb all  127.0.0.1/32  trust
host    certdb    all  127.0.0.1/32  cert
host    peerdb    all  127.0.0.1/32  peer
host    userdb    md5user  10.0.0.0/8  trust
host    userdb    md5user  127.0.0.1 255.255.255.255  md5
";
    let dbs = [
        "trustdb", "md5db", "scramdb", "passdb", "rejectdb", "ssldb", "nossldb", "certdb",
        "peerdb", "userdb", "nodb",
    ];
    let dir = tempfile::tempdir().unwrap();
    let entries: Vec<_> = dbs.iter().map(|d| (*d, pg.db_entry("testdb"))).collect();
    let p = hba_builder(&pg, dir.path(), rules, "", &entries)
        .start()
        .await;
    for (user, right) in USERS {
        for password in [right, "wrong"] {
            let known = user != "nobody";
            let good = known && password == right;
            for db in dbs {
                let got = outcome(&tcp(p.port(), user, Some(password), db)).await;
                let fail_pw = format!("28P01 password authentication failed for user \"{user}\"");
                let want: String = match db {
                    "trustdb" | "nossldb" if known => format!("ok {user}"),
                    "trustdb" | "nossldb" => "28000 \"trust\" authentication failed".into(),
                    "md5db" | "passdb" if good => format!("ok {user}"),
                    "md5db" | "passdb" => fail_pw,
                    "scramdb" if good => format!("ok {user}"),
                    "scramdb" => "28P01 SASL authentication failed".into(),
                    "rejectdb" => "28000 login rejected".into(),
                    // Not TLS: no hostssl line applies; nothing else names ssldb.
                    "ssldb" | "nodb" => "28000 no authentication method is found".into(),
                    "certdb" => "28000 certificate authentication failed".into(),
                    // peer over TCP fails, as in PgBouncer.
                    "peerdb" => "28000 unix socket login rejected".into(),
                    // 127.0.0.1 is not in 10.0.0.0/8: the second line (md5) applies.
                    "userdb" if user == "md5user" && good => format!("ok {user}"),
                    "userdb" if user == "md5user" => fail_pw,
                    "userdb" => "28000 no authentication method is found".into(),
                    _ => unreachable!(),
                };
                assert_eq!(got, want, "hba {db} {user}/{password}");
            }
        }
    }
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_on_the_unix_socket_is_the_os_user_or_its_map() {
    let pg = TempPostgres::start();
    // The OS user this test runs as (the in-process pooler sees it through SO_PEERCRED).
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    let me = pgcarpool::auth::peer::os_user_name(uid).expect("a name for this OS user");
    let rules = "\
local   mapdb   all  peer map=m
local   all     all  peer
host    all     all  127.0.0.1/32 md5
";
    let ident = format!("m {me} md5user\nm {me} nobody\n");
    // `selfdb` logs in to PostgreSQL as postgres whoever the client is, so the OS user
    // needs no role of its own; the pooler knows the OS user's name from its auth_file.
    let dir = tempfile::tempdir().unwrap();
    let dbs = [
        ("mapdb", pg.db_entry("testdb")),
        ("testdb", pg.db_entry("testdb")),
        ("selfdb", format!("{} user=postgres", pg.db_entry("testdb"))),
    ];
    let p = hba_builder(&pg, dir.path(), rules, &ident, &dbs)
        .auth_file_line(&format!("\"{me}\" \"unused\""))
        .start()
        .await;
    let sock = dir.path();
    let port = p.port();
    for password in [None, Some("wrong")] {
        let case = |what: &str| format!("{what}, password {password:?}");
        // The OS user logs in as itself whatever the password.
        assert_eq!(
            outcome(&unix(sock, port, &me, password, "selfdb")).await,
            "ok postgres",
            "{}",
            case("self")
        );
        // Mapped to md5user by map m.
        assert_eq!(
            outcome(&unix(sock, port, "md5user", password, "mapdb")).await,
            "ok md5user",
            "{}",
            case("mapped")
        );
        // Mapped, but a user nobody knows: refused like any other failure.
        let rejected = "28000 unix socket login rejected";
        assert_eq!(
            outcome(&unix(sock, port, "nobody", password, "mapdb")).await,
            rejected,
            "{}",
            case("mapped unknown")
        );
        // Without a map the OS user must be the user.
        for user in ["md5user", "nobody"] {
            assert_eq!(
                outcome(&unix(sock, port, user, password, "testdb")).await,
                rejected,
                "{}",
                case(user)
            );
        }
    }
    // Over TCP the same users meet the md5 line.
    assert_eq!(
        outcome(&tcp(port, "md5user", Some("md5pass"), "testdb")).await,
        "ok md5user"
    );
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hba_rules_reload_and_a_broken_file_keeps_the_old_ones() {
    let pg = TempPostgres::start();
    let dir = tempfile::tempdir().unwrap();
    let console_rule = "host pgbouncer postgres 127.0.0.1/32 md5\n";
    let b = hba_builder(
        &pg,
        dir.path(),
        &format!("{console_rule}host all all 127.0.0.1/32 md5\n"),
        "",
        &[("testdb", pg.db_entry("testdb"))],
    )
    .setting("unix_socket_dir", "");
    harness::process::give_to_pooler(dir.path());
    let p = PoolerProcess::start(b).await;
    let dsn = tcp(p.port(), "md5user", Some("md5pass"), "testdb");
    let login = || outcome(&dsn);
    assert_eq!(login().await, "ok md5user");
    // The console is let in by the md5 line for database pgbouncer.
    let console = p.console().await;
    // The rules change on RELOAD.
    let hba = dir.path().join("hba.conf");
    std::fs::write(
        &hba,
        format!("{console_rule}host all all 127.0.0.1/32 reject\n"),
    )
    .unwrap();
    console.simple_query("RELOAD").await.expect("RELOAD");
    assert_eq!(login().await, "28000 login rejected");
    // A broken line: the reload is refused, the log names file and line, the rules stay.
    std::fs::write(
        &hba,
        format!("{console_rule}host all all 127.0.0.1/32 md6\n"),
    )
    .unwrap();
    let e = console
        .simple_query("RELOAD")
        .await
        .expect_err("RELOAD with a broken hba file");
    assert_eq!(harness::sqlstate(&e), Some("F0000"), "{e:?}");
    let want = format!("{}:2: unknown authentication method \"md6\"", hba.display());
    assert!(
        p.log().contains(&want),
        "{want} not in the log:\n{}",
        p.log()
    );
    assert_eq!(login().await, "28000 login rejected");
}
