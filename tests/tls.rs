//! TLS on both sides (issue 11): psql against a test CA (verify-full, wrong host name,
//! wrong CA), plain clients refused under require, pgcarpool → PostgreSQL over TLS,
//! SCRAM-SHA-256-PLUS both ways, PostgreSQL 17's direct TLS, auth_type = cert, and
//! certificates reloaded. The certificates are made here with rcgen.
mod harness;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use harness::process::PoolerProcess;
use harness::{TempPostgres, TestPooler, TestPoolerBuilder, pg_bin, psql};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

/// A test certificate authority and the files it signed, in one directory.
struct Pki {
    dir: tempfile::TempDir,
}

struct Ca {
    issuer: Issuer<'static, KeyPair>,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::Builder::new()
            .prefix("pgcarpool-tls-")
            .tempdir()
            .unwrap();
        // PostgreSQL (another OS user) reads its certificate from here.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        Pki { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn p(&self, name: &str) -> String {
        self.path(name).to_string_lossy().into_owned()
    }

    /// A CA; its certificate is written to `<name>.crt`.
    fn ca(&self, name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("pgcarpool test {name}"));
        let cert = params.self_signed(&key).unwrap();
        std::fs::write(self.path(&format!("{name}.crt")), cert.pem()).unwrap();
        Ca {
            issuer: Issuer::new(params, key),
        }
    }

    /// A certificate for `names` (DNS names or IP addresses; none: only the common name
    /// `cn`) signed by `ca`: `<file>.crt` and `<file>.key`.
    fn leaf(&self, ca: &Ca, file: &str, cn: &str, names: &[&str]) {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        let cert = params.signed_by(&key, &ca.issuer).unwrap();
        std::fs::write(self.path(&format!("{file}.crt")), cert.pem()).unwrap();
        let key_path = self.path(&format!("{file}.key"));
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600)).unwrap();
        // Read by PostgreSQL and by pgcarpool processes, which run as that user too.
        if let Some((uid, gid)) = harness::process::pooler_os_user() {
            std::os::unix::fs::chown(&key_path, Some(uid), Some(gid)).unwrap();
        }
    }
}

/// The admin console over TLS.
fn console(port: u16) -> String {
    format!(
        "host=127.0.0.1 port={port} user=postgres password=postgres dbname=pgbouncer sslmode=require"
    )
}

/// A pooler that accepts TLS from clients with `server.crt` (for `localhost` only).
fn tls_pooler(pg: &TempPostgres, pki: &Pki, mode: &str) -> TestPoolerBuilder {
    TestPooler::builder(pg)
        .setting("client_tls_sslmode", mode)
        .setting("client_tls_key_file", &pki.p("server.key"))
        .setting("client_tls_cert_file", &pki.p("server.crt"))
        .setting("client_tls_ca_file", &pki.p("ca1.crt"))
}

fn pki_with_server_cert() -> (Pki, Ca, Ca) {
    let pki = Pki::new();
    let ca1 = pki.ca("ca1");
    let ca2 = pki.ca("ca2");
    pki.leaf(&ca1, "server", "localhost", &["localhost"]);
    (pki, ca1, ca2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psql_verify_full_checks_the_certificate_and_the_host_name() {
    let pg = TempPostgres::start();
    let (pki, _ca1, _ca2) = pki_with_server_cert();
    let p = tls_pooler(&pg, &pki, "require").start().await;
    let port = p.port();
    let conn = |host: &str, root: &str| {
        format!(
            "host={host} port={port} user=md5user password=md5pass dbname=testdb \
             sslmode=verify-full sslrootcert={}",
            pki.p(root)
        )
    };
    assert_eq!(
        psql(&conn("localhost", "ca1.crt"), "SELECT 1").unwrap(),
        "1"
    );
    // The certificate names localhost only.
    let e = psql(&conn("127.0.0.1", "ca1.crt"), "SELECT 1").unwrap_err();
    assert!(e.contains("does not match host name"), "{e}");
    // Another CA did not sign it.
    let e = psql(&conn("localhost", "ca2.crt"), "SELECT 1").unwrap_err();
    assert!(e.contains("certificate verify failed"), "{e}");
    // SHOW CLIENTS has the session as PgBouncer prints it.
    let admin = format!(
        "host=localhost port={port} user=postgres password=postgres dbname=pgbouncer sslmode=require"
    );
    let tls = psql(&admin, "SHOW CLIENTS").unwrap();
    assert!(tls.contains("|TLSv1.3/TLS_"), "{tls}");
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_clients_are_refused_under_require() {
    let pg = TempPostgres::start();
    let (pki, _ca1, _ca2) = pki_with_server_cert();
    let p = tls_pooler(&pg, &pki, "require").start().await;
    let base = format!(
        "host=127.0.0.1 port={} user=md5user password=md5pass dbname=testdb",
        p.port()
    );
    let e = psql(&format!("{base} sslmode=disable"), "SELECT 1").unwrap_err();
    // PgBouncer's words.
    assert!(e.contains("SSL required"), "{e}");
    assert_eq!(
        psql(
            &format!("{base} sslmode=require"),
            "SELECT ssl FROM pg_stat_ssl LIMIT 0"
        )
        .map(|_| ()),
        Ok(())
    );
    p.shutdown().await;

    // prefer: TLS if asked for, plain otherwise.
    let p = tls_pooler(&pg, &pki, "prefer").start().await;
    let base = format!(
        "host=127.0.0.1 port={} user=md5user password=md5pass dbname=testdb",
        p.port()
    );
    assert_eq!(
        psql(&format!("{base} sslmode=disable"), "SELECT 1").unwrap(),
        "1"
    );
    assert_eq!(
        psql(&format!("{base} sslmode=require"), "SELECT 1").unwrap(),
        "1"
    );
    p.shutdown().await;
}

/// A PostgreSQL with TLS on (`pg.crt` for 127.0.0.1, signed by ca1).
fn tls_postgres(pki: &Pki, ca1: &Ca) -> TempPostgres {
    pki.leaf(ca1, "pg", "127.0.0.1", &["127.0.0.1"]);
    TempPostgres::start_with(&[
        ("ssl", "on"),
        ("ssl_cert_file", &pki.p("pg.crt")),
        ("ssl_key_file", &pki.p("pg.key")),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_are_reached_over_tls_and_verified() {
    let (pki, ca1, _ca2) = pki_with_server_cert();
    let pg = tls_postgres(&pki, &ca1);
    let p = TestPooler::builder(&pg)
        .setting("server_tls_sslmode", "verify-full")
        .setting("server_tls_ca_file", &pki.p("ca1.crt"))
        .start()
        .await;
    let c = p.connect("md5user", "testdb").await;
    let row = c
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = \"pg_backend_pid\"()",
            &[],
        )
        .await
        .unwrap();
    assert!(row.get::<_, bool>(0), "the server connection is TLS");
    drop(c);
    // SHOW SERVERS: the idle server's session (once its reset is over; a server being
    // reset shows it too).
    let admin = p.connect("postgres", "pgbouncer").await;
    let tls = harness::wait_value(
        "an idle server in SHOW SERVERS",
        Duration::from_secs(10),
        || harness::console_value(&admin, "SERVERS", &[("state", "idle")], "tls"),
    )
    .await;
    assert!(tls.starts_with("TLSv1.3/TLS_"), "{tls}");
    // A server in use (a client inside a transaction) shows its session too.
    let c = p.connect("md5user", "testdb").await;
    c.simple_query("BEGIN; SELECT 1").await.unwrap();
    let rows = admin.simple_query("SHOW SERVERS").await.unwrap();
    let active: Vec<String> = rows
        .iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) if r.get("state") == Some("active") => {
                Some(r.get("tls").unwrap_or("").to_string())
            }
            _ => None,
        })
        .collect();
    assert_eq!(active.len(), 1, "{active:?}");
    assert!(active[0].starts_with("TLSv1.3/TLS_"), "{active:?}");
    drop(c);
    p.shutdown().await;

    // The wrong CA: no login (verify-full checks the chain).
    let p = TestPooler::builder(&pg)
        .setting("server_tls_sslmode", "verify-full")
        .setting("server_tls_ca_file", &pki.p("ca2.crt"))
        .setting("server_login_retry", "0")
        .start()
        .await;
    assert!(
        harness::try_connect(&p.dsn("md5user", "testdb"))
            .await
            .is_err()
    );
    p.shutdown().await;

    // server_tls_sslmode = disable: plain.
    let p = TestPooler::builder(&pg)
        .setting("server_tls_sslmode", "disable")
        .start()
        .await;
    let c = p.connect("md5user", "testdb").await;
    let row = c
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = \"pg_backend_pid\"()",
            &[],
        )
        .await
        .unwrap();
    assert!(!row.get::<_, bool>(0));
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_towards_a_tls_server_uses_channel_binding() {
    let (pki, ca1, _ca2) = pki_with_server_cert();
    let pg = tls_postgres(&pki, &ca1);
    let spec = TestPooler::builder(&pg)
        .setting("server_tls_sslmode", "require")
        .setting("auth_type", "scram-sha-256");
    let p = PoolerProcess::start_with_args(spec, &["-v"]).await;
    let c = p.connect("scramuser").await;
    let row = c
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = \"pg_backend_pid\"()",
            &[],
        )
        .await
        .unwrap();
    assert!(row.get::<_, bool>(0));
    let log = p.log();
    assert!(
        log.contains("SASL login with SCRAM-SHA-256-PLUS"),
        "the server login used channel binding:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psql_channel_binding_require_logs_in_over_tls() {
    let pg = TempPostgres::start();
    let (pki, _ca1, _ca2) = pki_with_server_cert();
    let p = tls_pooler(&pg, &pki, "require")
        .setting("auth_type", "scram-sha-256")
        .start()
        .await;
    let base = format!(
        "host=localhost port={} user=scramuser dbname=testdb sslmode=verify-full sslrootcert={}",
        p.port(),
        pki.p("ca1.crt")
    );
    assert_eq!(
        psql(
            &format!("{base} password=scrampass channel_binding=require"),
            "SELECT 1"
        )
        .unwrap(),
        "1"
    );
    let e = psql(
        &format!("{base} password=wrong channel_binding=require"),
        "SELECT 1",
    )
    .unwrap_err();
    assert!(e.contains("SASL authentication failed"), "{e}");
    p.shutdown().await;
}

/// The major version of the psql the tests run.
fn psql_major() -> Option<u32> {
    let out = Command::new(pg_bin("psql"))
        .arg("--version")
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .find_map(|w| w.split('.').next()?.parse().ok())
}

/// A rustls client configuration trusting `ca`, with ALPN `postgresql`.
fn client_config(ca: &Path, alpn: bool) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    if alpn {
        cfg.alpn_protocols = vec![b"postgresql".to_vec()];
    }
    Arc::new(cfg)
}

/// Direct TLS as libpq 17 does it (`sslnegotiation=direct`): a TLS handshake at once,
/// then the StartupMessage inside. Returns the first message's tag and body.
async fn direct_tls_startup(port: u16, ca: &Path, alpn: bool) -> std::io::Result<(u8, Vec<u8>)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let connector = tokio_rustls::TlsConnector::from(client_config(ca, alpn));
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await?;
    let mut body = Vec::new();
    body.extend_from_slice(&196608i32.to_be_bytes());
    for (k, v) in [("user", "md5user"), ("database", "testdb")] {
        body.extend_from_slice(k.as_bytes());
        body.push(0);
        body.extend_from_slice(v.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut msg = ((body.len() + 4) as i32).to_be_bytes().to_vec();
    msg.extend_from_slice(&body);
    tls.write_all(&msg).await?;
    let mut head = [0u8; 5];
    tls.read_exact(&mut head).await?;
    let len = i32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    let mut rest = vec![0u8; len.saturating_sub(4).min(8192)];
    tls.read_exact(&mut rest).await?;
    Ok((head[0], rest))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_tls_from_a_client() {
    let pg = TempPostgres::start();
    let (pki, _ca1, _ca2) = pki_with_server_cert();
    let p = tls_pooler(&pg, &pki, "require").start().await;
    let ca = pki.path("ca1.crt");
    // md5 auth: AuthenticationMD5Password (R, code 5) inside the TLS session.
    let (tag, body) = tokio::time::timeout(
        Duration::from_secs(10),
        direct_tls_startup(p.port(), &ca, true),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!((tag, &body[..4]), (b'R', &5i32.to_be_bytes()[..]));
    // Without ALPN: PostgreSQL's refusal.
    let (tag, body) = tokio::time::timeout(
        Duration::from_secs(10),
        direct_tls_startup(p.port(), &ca, false),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(tag, b'E');
    assert!(
        String::from_utf8_lossy(&body).contains("without ALPN"),
        "{}",
        String::from_utf8_lossy(&body)
    );
    // psql with a libpq of 17 or newer: psql 17+ itself, else Debian's psql on libpq 18
    // (`harness::libpq_with_protocol_3_2`, from `scripts/pg-version 18`).
    let libpq = match psql_major() {
        Some(v) if v >= 17 => Ok(None),
        v => harness::libpq_with_protocol_3_2()
            .map(Some)
            .map_err(|why| format!("psql {v:?} is older than 17 and {why}")),
    };
    match libpq {
        Ok(libpq) => {
            let dsn = format!(
                "host=localhost port={} user=md5user password=md5pass dbname=testdb \
                 sslmode=require sslrootcert={} sslnegotiation=direct",
                p.port(),
                ca.display()
            );
            let mut cmd = harness::psql_command(&dsn, "SELECT 1");
            if let Some(dir) = libpq {
                cmd.env("LD_LIBRARY_PATH", dir);
            }
            let out = cmd.output().unwrap();
            assert!(out.status.success(), "{}", harness::output_text(&out));
            assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1");
            // A direct TLS session that the server checked: pgcarpool's SHOW CLIENTS
            // would say TLS; the refusal of plain text under `require` shows it too.
            let plain = psql(
                &format!(
                    "host=localhost port={} user=md5user password=md5pass dbname=testdb \
                     sslmode=disable",
                    p.port()
                ),
                "SELECT 1",
            );
            assert!(plain.unwrap_err().contains("SSL required"));
        }
        Err(why) => eprintln!(
            "skipped psql sslnegotiation=direct: {why}; direct TLS was tested above with a \
             rustls client sending ALPN postgresql"
        ),
    }
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cert_auth_wants_a_certificate_issued_to_the_user() {
    let pg = TempPostgres::start();
    let (pki, ca1, ca2) = pki_with_server_cert();
    pki.leaf(&ca1, "md5user", "md5user", &[]);
    pki.leaf(&ca1, "other", "scramuser", &[]);
    pki.leaf(&ca2, "foreign", "md5user", &[]);
    let p = tls_pooler(&pg, &pki, "verify-full")
        .setting("auth_type", "cert")
        .start()
        .await;
    let conn = |cert: &str| {
        format!(
            "host=localhost port={} user=md5user dbname=testdb sslmode=verify-full \
             sslrootcert={} sslcert={} sslkey={}",
            p.port(),
            pki.p("ca1.crt"),
            pki.p(&format!("{cert}.crt")),
            pki.p(&format!("{cert}.key")),
        )
    };
    assert_eq!(
        psql(&conn("md5user"), "SELECT current_user").unwrap(),
        "md5user"
    );
    let e = psql(&conn("other"), "SELECT 1").unwrap_err();
    assert!(e.contains("certificate authentication failed"), "{e}");
    // A certificate from another CA fails the handshake.
    let e = psql(&conn("foreign"), "SELECT 1").unwrap_err();
    assert!(!e.is_empty());
    // No certificate at all: verify-full wants one.
    let e = psql(
        &format!(
            "host=localhost port={} user=md5user dbname=testdb sslmode=verify-full sslrootcert={} sslcert=/nonexistent",
            p.port(),
            pki.p("ca1.crt")
        ),
        "SELECT 1",
    )
    .unwrap_err();
    assert!(!e.is_empty());
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_certificate_is_served_after_reload() {
    let pg = TempPostgres::start();
    let (pki, _ca1, ca2) = pki_with_server_cert();
    let spec = tls_pooler(&pg, &pki, "require");
    let p = PoolerProcess::start(spec).await;
    let conn = |root: &str| {
        format!(
            "host=localhost port={} user=md5user password=md5pass dbname=testdb \
             sslmode=verify-full sslrootcert={}",
            p.port(),
            pki.p(root)
        )
    };
    assert_eq!(psql(&conn("ca1.crt"), "SELECT 1").unwrap(), "1");
    // Same file names, new contents (a certificate renewed in place), then RELOAD.
    pki.leaf(&ca2, "server", "localhost", &["localhost"]);
    psql(&console(p.port()), "RELOAD").unwrap();
    let e = psql(&conn("ca1.crt"), "SELECT 1").unwrap_err();
    assert!(e.contains("certificate verify failed"), "{e}");
    assert_eq!(psql(&conn("ca2.crt"), "SELECT 1").unwrap(), "1");
}

async fn pid(c: &tokio_postgres::Client) -> i32 {
    c.query_one("SELECT \"pg_backend_pid\"()", &[])
        .await
        .unwrap()
        .get::<_, i32>(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_reconnect_only_when_their_tls_settings_change() {
    let pg = TempPostgres::start();
    let spec = TestPooler::builder(&pg).setting("pool_mode", "transaction");
    let p = PoolerProcess::start(spec).await;
    let c = p.connect("md5user").await;
    let first = pid(&c).await;
    let admin = p.console().await;
    admin.simple_query("RELOAD").await.unwrap();
    assert_eq!(pid(&c).await, first, "nothing changed: the server stays");
    admin
        .simple_query("SET server_tls_protocols = 'tlsv1.3'")
        .await
        .unwrap();
    assert_ne!(pid(&c).await, first, "a TLS setting changed: a new server");
    assert!(p.log().contains("database configuration changed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_tls_setting_keeps_the_old_configuration() {
    let pg = TempPostgres::start();
    let (pki, _ca1, _ca2) = pki_with_server_cert();
    let p = PoolerProcess::start(tls_pooler(&pg, &pki, "require")).await;
    psql(&console(p.port()), "SET client_tls13_ciphers = 'unknown'").unwrap();
    assert!(p.log().contains("failed to set the TLSv1.3 cipher suites"));
    let conn = format!(
        "host=localhost port={} user=md5user password=md5pass dbname=testdb sslmode=require",
        p.port()
    );
    assert_eq!(psql(&conn, "SELECT 1").unwrap(), "1");
}

/// Run openssl with `args` in `dir`; panics on failure.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An X.509 v1 certificate `<name>.crt`/`<name>.key` for `cn`, signed by `v1ca` (as
/// `openssl x509 -req` and PgBouncer's test CA make them; webpki refuses v1).
fn v1_leaf(pki: &Pki, name: &str, cn: &str) {
    let dir = pki.dir.path();
    let key = format!("{name}.key");
    openssl(
        dir,
        &["ecparam", "-genkey", "-name", "prime256v1", "-out", &key],
    );
    let csr = format!("{name}.csr");
    let subj = format!("/CN={cn}");
    openssl(
        dir,
        &["req", "-new", "-key", &key, "-subj", &subj, "-out", &csr],
    );
    let crt = format!("{name}.crt");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "v1ca.crt",
            "-CAkey",
            "v1ca.key",
            "-CAcreateserial",
            "-days",
            "30",
            "-out",
            &crt,
        ],
    );
    let text = Command::new("openssl")
        .args(["x509", "-noout", "-text", "-in", &crt])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&text.stdout).contains("Version: 1 (0x0)"));
    use std::os::unix::fs::PermissionsExt;
    let key_path = pki.path(&key);
    std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600)).unwrap();
    if let Some((uid, gid)) = harness::process::pooler_os_user() {
        std::os::unix::fs::chown(&key_path, Some(uid), Some(gid)).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x509_v1_certificates_work_as_with_openssl() {
    let pki = Pki::new();
    let dir = pki.dir.path();
    openssl(
        dir,
        &[
            "ecparam",
            "-genkey",
            "-name",
            "prime256v1",
            "-out",
            "v1ca.key",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-new",
            "-key",
            "v1ca.key",
            "-subj",
            "/CN=v1 test CA",
            "-days",
            "30",
            "-out",
            "v1ca.crt",
        ],
    );
    v1_leaf(&pki, "server", "localhost");
    v1_leaf(&pki, "client", "md5user");
    v1_leaf(&pki, "pg", "127.0.0.1");
    let pg = TempPostgres::start_with(&[
        ("ssl", "on"),
        ("ssl_cert_file", &pki.p("pg.crt")),
        ("ssl_key_file", &pki.p("pg.key")),
    ]);
    // Clients: our v1 certificate served, theirs checked (cert auth), both ways verify-full.
    let p = TestPooler::builder(&pg)
        .setting("client_tls_sslmode", "verify-full")
        .setting("client_tls_key_file", &pki.p("server.key"))
        .setting("client_tls_cert_file", &pki.p("server.crt"))
        .setting("client_tls_ca_file", &pki.p("v1ca.crt"))
        .setting("auth_type", "cert")
        .setting("server_tls_sslmode", "verify-full")
        .setting("server_tls_ca_file", &pki.p("v1ca.crt"))
        .start()
        .await;
    let conn = format!(
        "host=localhost port={} user=md5user dbname=testdb sslmode=verify-full sslrootcert={} \
         sslcert={} sslkey={}",
        p.port(),
        pki.p("v1ca.crt"),
        pki.p("client.crt"),
        pki.p("client.key"),
    );
    // The server's name (127.0.0.1) is only in its common name.
    assert_eq!(
        psql(
            &conn,
            "SELECT ssl FROM pg_stat_ssl WHERE pid = \"pg_backend_pid\"()"
        )
        .unwrap(),
        "t"
    );
    p.shutdown().await;
    // The same server reached as localhost: its name does not match.
    let p = TestPooler::builder(&pg)
        .database(
            "testdb",
            &format!("host=localhost port={} dbname=testdb", pg.port()),
        )
        .setting("server_tls_sslmode", "verify-full")
        .setting("server_tls_ca_file", &pki.p("v1ca.crt"))
        .setting("server_login_retry", "0")
        .start()
        .await;
    assert!(
        harness::try_connect(&p.dsn("md5user", "testdb"))
            .await
            .is_err()
    );
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_server_tls_setting_ends_the_cached_login_failure() {
    // PostgreSQL without TLS; server_tls_sslmode = require cannot log in.
    let pg = TempPostgres::start();
    let mut p = TestPooler::builder(&pg)
        .setting("server_tls_sslmode", "require")
        .setting("server_login_retry", "60")
        .start()
        .await;
    let Err(e) = harness::try_connect(&p.dsn("md5user", "testdb")).await else {
        panic!("logged in although the server has no TLS");
    };
    let msg = e
        .as_db_error()
        .map(|d| d.message().to_string())
        .unwrap_or_default();
    assert!(msg.contains("server refused SSL"), "{e:?}");
    // Within server_login_retry the error is cached, until the TLS settings change.
    p.reload_with(|c| c.setting("server_tls_sslmode", "prefer"))
        .await;
    let c = p.connect("md5user", "testdb").await;
    c.simple_query("SELECT 1").await.unwrap();
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_results_and_copy_flow_through_tls_on_both_sides() {
    // Many megabytes each way, TLS on both sides: records TLS holds when a socket is full
    // must still go out (a stall would show as psql's timeout).
    let (pki, ca1, _ca2) = pki_with_server_cert();
    let pg = tls_postgres(&pki, &ca1);
    let p = tls_pooler(&pg, &pki, "require")
        .setting("server_tls_sslmode", "require")
        .start()
        .await;
    let conn = format!(
        "host=localhost port={} user=md5user password=md5pass dbname=testdb sslmode=require",
        p.port()
    );
    let sql = "SELECT sum(length(x)) FROM (SELECT repeat('x', 1000) || g AS x \
               FROM generate_series(1, 30000) g) s; \
               SELECT repeat('y', 1000) FROM generate_series(1, 30000)";
    let out = Command::new("timeout")
        .arg("60")
        .arg(pg_bin("psql"))
        .args(["-X", "-At", "-v", "ON_ERROR_STOP=1", "-d", &conn, "-c", sql])
        .output()
        .expect("run psql");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // 30,000 rows of 1,000 bytes after the sum.
    assert_eq!(out.stdout.len(), "30138894\n".len() + 30_000 * 1001);
    // COPY in: 30 MB from the client.
    let data: String = (0..30_000)
        .map(|i| format!("{i}\t{}\n", "z".repeat(1000)))
        .collect();
    let mut child = Command::new("timeout")
        .arg("60")
        .arg(pg_bin("psql"))
        .args([
            "-X",
            "-At",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            &conn,
            "-c",
            "CREATE TEMP TABLE t (i int, s text)",
            "-c",
            "COPY t FROM STDIN",
            "-c",
            "SELECT count(*), sum(length(s)) FROM t",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(data.as_bytes()).unwrap();
        stdin.write_all(b"\\.\n").unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "CREATE TABLE\nCOPY 30000\n30000|30000000"
    );
    p.shutdown().await;
}
