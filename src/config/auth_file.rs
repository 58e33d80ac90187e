//! `auth_file` (PgBouncer's userlist.txt): `"user" "secret"` lines.
use std::collections::HashMap;

/// A stored SCRAM-SHA-256 verifier: `SCRAM-SHA-256$<iter>:<salt b64>$<StoredKey b64>:<ServerKey b64>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScramVerifier {
    pub iterations: u32,
    pub salt: Vec<u8>,
    pub stored_key: [u8; 32],
    pub server_key: [u8; 32],
}

/// A user's secret as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Secret {
    /// A plain-text password.
    Plain(String),
    /// `md5` + md5(password + user), as hex: stored without the `md5` prefix (32 hex chars).
    Md5(String),
    /// A SCRAM-SHA-256 verifier.
    Scram(ScramVerifier),
}

/// user name → secret.
#[derive(Debug, Clone, Default)]
pub struct AuthFile {
    pub users: HashMap<String, Secret>,
}
