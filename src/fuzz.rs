//! Fuzz target bodies: one plain function per parser of untrusted (or hand-written) input.
//! cargo-fuzz runs them from `fuzz/` (nightly); `tests/fuzz_smoke.rs` runs each for a
//! bounded number of seeded random and mutated inputs on stable (what `scripts/test` runs).
//! Every one must return, without panicking, on any input; docs/testing.md says how to fuzz.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::sync::OnceLock;

use crate::auth::scram::{self, ClientCredential, ScramClient, ScramServer};
use crate::config::hba::{Hba, HbaError, Origin};
use crate::config::ident::Ident;
use crate::config::{AuthFile, Settings, databases, ini};
use crate::proto::{self, backend, frontend, startup};

/// A target: takes any bytes, must not panic.
pub type Target = fn(&[u8]);

/// Every target by name, for the smoke test and the docs.
pub const TARGETS: &[(&str, Target)] = &[
    ("message_framing", message_framing),
    ("startup_packet", startup_packet),
    ("scram_server", scram_server),
    ("scram_client", scram_client),
    ("pgbouncer_ini", pgbouncer_ini),
    ("auth_file", auth_file),
    ("hba_file", hba_file),
];

/// Split `data` at its first NUL byte (a target taking two messages).
fn two_parts(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[]),
    }
}

/// Regular messages (tag + length) framed one after the other from a buffer, each body
/// decoded by every parser that applies to its tag, from either side.
pub fn message_framing(data: &[u8]) {
    let mut buf = data;
    // A limit that lets lengths both fit and overflow a small input.
    let limit = 1 + (data.first().copied().unwrap_or(0) as usize) * 64;
    while let Ok(Some(h)) = proto::header(buf, limit.max(5)) {
        if h.total > buf.len() {
            break;
        }
        let body = &buf[5..h.total];
        match h.tag {
            b'p' => {
                let _ = frontend::parse_password(body);
                let _ = frontend::parse_sasl_initial(body);
            }
            b'Q' => {
                if let Ok(sql) = frontend::parse_query(body) {
                    let _ = crate::sql::classify::classify(sql);
                    let _ = crate::sql::classify::split(sql);
                    let _ = crate::sql::classify::named_statement(sql);
                }
            }
            b'R' => {
                let _ = backend::parse_auth(body);
            }
            b'S' => {
                let _ = backend::parse_parameter_status(body);
            }
            b'K' => {
                let _ = backend::parse_backend_key_data(body);
            }
            b'E' | b'N' => {
                let _ = backend::error_code(body);
                let _ = backend::parse_error(body);
            }
            _ => {}
        }
        buf = &buf[h.total..];
    }
}

/// Startup packets (StartupMessage, SSLRequest, CancelRequest…) one after the other, and
/// the `options` parameter of a StartupMessage.
pub fn startup_packet(data: &[u8]) {
    let mut buf = data;
    while let Ok(Some((packet, n))) = startup::parse(buf) {
        if let startup::StartupPacket::Startup { params, .. } = packet {
            for (k, v) in &params {
                if k == "options" {
                    let _ = startup::parse_options(v);
                }
            }
        }
        if n == 0 || n > buf.len() {
            break;
        }
        buf = &buf[n..];
    }
}

/// A verifier for the SCRAM targets (password "pencil", salt "fuzz-salt", 4096
/// iterations), derived once.
fn verifier() -> &'static crate::config::auth_file::ScramVerifier {
    static V: OnceLock<crate::config::auth_file::ScramVerifier> = OnceLock::new();
    V.get_or_init(|| scram::verifier_from_password("pencil", b"fuzz-salt", 4096))
}

/// The nonce half the SCRAM targets' own side uses (fixed, so that an input can echo it).
pub const SCRAM_NONCE: &str = "fuzz";

/// The server side of a SCRAM exchange fed a client-first and a client-final message
/// (split at the first NUL byte). The server's nonce half is [`SCRAM_NONCE`].
pub fn scram_server(data: &[u8]) {
    let (first, last) = two_parts(data);
    let mut server = ScramServer::with_nonce(verifier().clone(), SCRAM_NONCE);
    if server.client_first(first).is_ok() {
        let _ = server.client_final(last);
        let _ = server.client_credential();
    }
    // Messages out of order.
    let mut server = ScramServer::new(verifier().clone());
    let _ = server.client_final(first);
}

/// The client side (pgcarpool logging in to a server) fed a server-first and a
/// server-final message (split at the first NUL byte); its nonce is [`SCRAM_NONCE`].
/// Keys, not a password: the iteration count comes from the input, and PBKDF2 is not what
/// is fuzzed here.
pub fn scram_client(data: &[u8]) {
    let (first, last) = two_parts(data);
    let _ = scram::server_first_params(first);
    static KEYS: OnceLock<([u8; 32], [u8; 32])> = OnceLock::new();
    let (client_key, server_key) =
        *KEYS.get_or_init(|| scram::keys_from_password("pencil", b"fuzz-salt", 4096));
    let cred = ClientCredential::Keys {
        client_key,
        server_key,
    };
    let mut client = ScramClient::with_nonce(cred, "", SCRAM_NONCE);
    let _ = client.client_first();
    if client.server_first(first).is_ok() {
        let _ = client.server_final(last);
    }
}

/// pgbouncer.ini text: the ini syntax (an `%include` reads a small fixed file that includes
/// itself, so includes and their depth limit are exercised without the file system), then
/// every value through the parser of its section.
pub fn pgbouncer_ini(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut read = |_: &Path| -> std::io::Result<String> {
        Ok("[pgbouncer]\nlisten_port = 6432\n%include again.ini\n".to_string())
    };
    let Ok(parsed) = ini::parse_str(&text, "fuzz.ini", Path::new("/nonexistent"), &mut read) else {
        return;
    };
    let mut settings = Settings::default();
    for item in parsed.items.iter().take(1000) {
        match item.section.as_str() {
            "pgbouncer" => {
                let _ = settings.load_value(&item.key, &item.value);
            }
            "databases" => {
                let _ = databases::parse_database(&item.key, &item.value);
            }
            "users" => {
                let _ = databases::parse_user(&item.key, &item.value);
            }
            "peers" => {
                let _ = databases::parse_peer(&item.key, &item.value);
            }
            _ => {}
        }
    }
    let _ = settings.server_check();
    let _ = settings.listen_addrs();
}

/// auth_file (userlist.txt) text.
pub fn auth_file(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Ok(f) = AuthFile::parse(&text, "fuzz.txt") {
        let _ = f.get("postgres");
    }
}

/// An ident file and an hba file (split at the first NUL byte); an `@file` reads the
/// ident text. The rules are then asked about a few logins.
pub fn hba_file(data: &[u8]) {
    let (ident_part, hba_part) = two_parts(data);
    let ident_text = String::from_utf8_lossy(ident_part);
    let hba_text = String::from_utf8_lossy(hba_part);
    let ident = Ident::parse(&ident_text, Path::new("ident.conf")).ok();
    let mut read = |_: &Path| -> Result<String, HbaError> { Ok(ident_text.to_string()) };
    let Ok(hba) = Hba::parse(&hba_text, Path::new("hba.conf"), ident.as_ref(), &mut read) else {
        return;
    };
    let origins = [
        Origin::Unix,
        Origin::Tcp {
            addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
            tls: false,
        },
        Origin::Tcp {
            addr: IpAddr::V6(Ipv6Addr::LOCALHOST),
            tls: true,
        },
    ];
    for origin in origins {
        for replication in [false, true] {
            if let Some(rule) = hba.lookup(origin, replication, "db", "user")
                && let (Some(map), Some(ident)) = (&rule.map, &ident)
            {
                let _ = ident.allows(map, "user", "user");
            }
        }
    }
}
