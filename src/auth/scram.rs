//! SCRAM-SHA-256 (RFC 5802 / RFC 7677) as PostgreSQL uses it, without channel binding.
//!
//! Both sides of the exchange, named after RFC 5802's messages: [`ScramServer`] checks a client
//! against a stored [`ScramVerifier`]; [`ScramClient`] logs in to PostgreSQL with a password or with
//! the ClientKey/ServerKey pair recovered from a client's proof. Pure: no I/O, bounded parsing,
//! every malformed input is a [`ScramError`].
use std::borrow::Cow;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::auth_file::ScramVerifier;

/// The SASL mechanism name we advertise (never `SCRAM-SHA-256-PLUS`).
pub const MECHANISM: &str = "SCRAM-SHA-256";
/// Longest SCRAM message we accept from either side. PostgreSQL's own messages are ~100–200 bytes.
pub const MAX_SCRAM_MESSAGE_LEN: usize = 4096;
/// Highest iteration count a ScramClient accepts in a server-first-message: one login must not cost
/// unbounded CPU. PostgreSQL's default (`scram_iterations`) is 4096; 1,000,000 takes ~0.5 s of PBKDF2.
pub const MAX_ITERATIONS: u32 = 1_000_000;
/// Iteration count for verifiers we make ourselves (PostgreSQL's default).
pub const DEFAULT_ITERATIONS: u32 = 4096;
/// Salt length for verifiers we make ourselves (PostgreSQL's default).
pub const DEFAULT_SALT_LEN: usize = 16;
/// Random bytes in a nonce before base64 (as PostgreSQL: 18 bytes → 24 chars).
const NONCE_RAW_LEN: usize = 18;
/// gs2 header for "client does not support channel binding".
const GS2_HEADER_N: &str = "n,,";

/// A 32-byte SHA-256 output or HMAC key.
pub type Key32 = [u8; 32];

#[derive(Debug, thiserror::Error)]
pub enum ScramError {
    #[error("malformed SCRAM message: {0}")]
    Malformed(&'static str),
    #[error("SCRAM nonce mismatch")]
    Nonce,
    #[error("password authentication failed")]
    BadProof,
    #[error("SCRAM server signature did not verify")]
    BadServerSignature,
}

/// Build a verifier from a plain password (PBKDF2: CPU heavy, call off the reactor or cache).
pub fn verifier_from_password(password: &str, salt: &[u8], iterations: u32) -> ScramVerifier {
    let (client_key, server_key) = keys_from_password(password, salt, iterations);
    ScramVerifier {
        iterations,
        salt: salt.to_vec(),
        stored_key: sha256(&client_key),
        server_key,
    }
}

/// A verifier with a fresh random salt of [`DEFAULT_SALT_LEN`] bytes (PBKDF2: CPU heavy).
pub fn verifier_with_random_salt(password: &str, iterations: u32) -> ScramVerifier {
    let mut salt = [0u8; DEFAULT_SALT_LEN];
    rand::fill(&mut salt[..]);
    verifier_from_password(password, &salt, iterations)
}

/// `(ClientKey, ServerKey)` for a password (PBKDF2: CPU heavy). StoredKey is `H(ClientKey)`.
pub fn keys_from_password(password: &str, salt: &[u8], iterations: u32) -> (Key32, Key32) {
    let salted = salted_password(password, salt, iterations);
    (hmac(&salted, b"Client Key"), hmac(&salted, b"Server Key"))
}

/// SaltedPassword := Hi(Normalize(password), salt, i), where Normalize is SASLprep as PostgreSQL
/// applies it: a password that SASLprep rejects is used as its raw bytes.
pub fn salted_password(password: &str, salt: &[u8], iterations: u32) -> Key32 {
    let prepared = stringprep::saslprep(password).unwrap_or(Cow::Borrowed(password));
    pbkdf2::pbkdf2_hmac_array::<Sha256, 32>(prepared.as_bytes(), salt, iterations)
}

/// Render a verifier as PostgreSQL stores it in pg_authid:
/// `SCRAM-SHA-256$<iter>:<salt b64>$<StoredKey b64>:<ServerKey b64>`.
pub fn verifier_to_string(v: &ScramVerifier) -> String {
    format!(
        "{MECHANISM}${}:{}${}:{}",
        v.iterations,
        B64.encode(&v.salt),
        B64.encode(v.stored_key),
        B64.encode(v.server_key)
    )
}

fn sha256(data: &[u8]) -> Key32 {
    Sha256::digest(data).into()
}

fn hmac(key: &[u8], data: &[u8]) -> Key32 {
    let mut mac =
        <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC accepts keys of any length");
    mac.update(data);
    mac.finalize().into_bytes().into()
}

fn xor32(a: &Key32, b: &Key32) -> Key32 {
    let mut out = [0u8; 32];
    for (o, (x, y)) in out.iter_mut().zip(a.iter().zip(b.iter())) {
        *o = x ^ y;
    }
    out
}

fn random_nonce() -> String {
    let mut raw = [0u8; NONCE_RAW_LEN];
    rand::fill(&mut raw[..]);
    B64.encode(raw)
}

/// RFC 5802 `printable`: %x21-2B / %x2D-7E (printable ASCII except ',').
fn is_printable(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b',')
}

fn as_message(data: &[u8]) -> Result<&str, ScramError> {
    if data.len() > MAX_SCRAM_MESSAGE_LEN {
        return Err(ScramError::Malformed("message too long"));
    }
    std::str::from_utf8(data).map_err(|_| ScramError::Malformed("not UTF-8"))
}

/// The value of `name=value`, or an error naming what was expected.
fn attr<'a>(part: Option<&'a str>, name: u8, what: &'static str) -> Result<&'a str, ScramError> {
    match part {
        Some(p) if p.len() >= 2 && p.as_bytes()[0] == name && p.as_bytes()[1] == b'=' => {
            Ok(&p[2..])
        }
        _ => Err(ScramError::Malformed(what)),
    }
}

fn decode_key(b64: &str, what: &'static str) -> Result<Key32, ScramError> {
    let bytes = B64.decode(b64).map_err(|_| ScramError::Malformed(what))?;
    Key32::try_from(bytes.as_slice()).map_err(|_| ScramError::Malformed(what))
}

/// The salt and iteration count of a server-first-message, for callers that derive the keys
/// themselves (with [`crate::auth::cache::ScramCache`] or off the reactor) and then call
/// [`ScramClient::server_first_with_keys`]. Checks the bounds `ScramClient` checks.
pub fn server_first_params(data: &[u8]) -> Result<(Vec<u8>, u32), ScramError> {
    let sf = ServerFirst::parse(as_message(data)?)?;
    Ok((sf.salt, sf.iterations))
}

// ---------------------------------------------------------------------------------------------
// Server side.

enum ServerState {
    Initial,
    FirstSent {
        gs2_header: String,
        client_first_bare: String,
        server_first: String,
        nonce: String,
    },
    Done {
        client_key: Key32,
    },
    Failed,
}

/// Server side of one SCRAM exchange, checking a client against a stored verifier.
pub struct ScramServer {
    verifier: ScramVerifier,
    /// Our half of the nonce; random unless injected by a test.
    server_nonce: Option<String>,
    state: ServerState,
}

impl ScramServer {
    pub fn new(verifier: ScramVerifier) -> Self {
        ScramServer {
            verifier,
            server_nonce: None,
            state: ServerState::Initial,
        }
    }

    /// With a fixed server nonce (tests: RFC vectors).
    #[cfg(test)]
    pub(crate) fn with_nonce(verifier: ScramVerifier, server_nonce: &str) -> Self {
        ScramServer {
            server_nonce: Some(server_nonce.to_owned()),
            ..ScramServer::new(verifier)
        }
    }

    /// Takes the SASLInitialResponse data (client-first-message), returns server-first-message.
    pub fn client_first(&mut self, data: &[u8]) -> Result<Vec<u8>, ScramError> {
        if !matches!(self.state, ServerState::Initial) {
            self.state = ServerState::Failed;
            return Err(ScramError::Malformed("unexpected client-first-message"));
        }
        self.state = ServerState::Failed;
        let msg = as_message(data)?;

        // gs2-header = gs2-cbind-flag "," [ authzid ] ","
        let mut parts = msg.splitn(3, ',');
        match parts.next() {
            Some("n") | Some("y") => {}
            Some(f) if f.starts_with("p=") => {
                return Err(ScramError::Malformed(
                    "channel binding is not supported (SCRAM-SHA-256-PLUS not offered)",
                ));
            }
            _ => return Err(ScramError::Malformed("bad gs2 channel binding flag")),
        }
        match parts.next() {
            Some("") => {}
            Some(_) => {
                return Err(ScramError::Malformed(
                    "authorization identity is not supported",
                ));
            }
            None => return Err(ScramError::Malformed("truncated gs2 header")),
        }
        let bare = parts
            .next()
            .ok_or(ScramError::Malformed("missing client-first-message-bare"))?;
        let gs2_header = &msg[..msg.len() - bare.len()];

        // client-first-message-bare = [reserved-mext ","] username "," nonce ["," extensions]
        let mut attrs = bare.split(',');
        let first = attrs.next();
        if first.is_some_and(|p| p.starts_with("m=")) {
            return Err(ScramError::Malformed(
                "mandatory extensions are not supported",
            ));
        }
        // PostgreSQL takes the user name from the startup packet; clients send it empty. Ignored.
        attr(first, b'n', "expected n= (username)")?;
        let client_nonce = attr(attrs.next(), b'r', "expected r= (nonce)")?;
        if !is_printable(client_nonce) {
            return Err(ScramError::Malformed("bad client nonce"));
        }

        let server_nonce = self.server_nonce.clone().unwrap_or_else(random_nonce);
        let nonce = format!("{client_nonce}{server_nonce}");
        let server_first = format!(
            "r={nonce},s={},i={}",
            B64.encode(&self.verifier.salt),
            self.verifier.iterations
        );
        let out = server_first.clone().into_bytes();
        self.state = ServerState::FirstSent {
            gs2_header: gs2_header.to_owned(),
            client_first_bare: bare.to_owned(),
            server_first,
            nonce,
        };
        Ok(out)
    }

    /// Takes the SASLResponse data (client-final-message), checks the proof, returns server-final-message.
    pub fn client_final(&mut self, data: &[u8]) -> Result<Vec<u8>, ScramError> {
        let ServerState::FirstSent {
            gs2_header,
            client_first_bare,
            server_first,
            nonce,
        } = std::mem::replace(&mut self.state, ServerState::Failed)
        else {
            return Err(ScramError::Malformed("unexpected client-final-message"));
        };
        let msg = as_message(data)?;

        // client-final-message = channel-binding "," nonce ["," extensions] "," proof
        let proof_at = msg
            .rfind(",p=")
            .ok_or(ScramError::Malformed("expected p= (proof)"))?;
        let without_proof = &msg[..proof_at];
        let proof_b64 = &msg[proof_at + 3..];

        let mut attrs = without_proof.split(',');
        let cbind = attr(attrs.next(), b'c', "expected c= (channel binding)")?;
        let cbind = B64
            .decode(cbind)
            .map_err(|_| ScramError::Malformed("bad base64 in c="))?;
        if cbind != gs2_header.as_bytes() {
            return Err(ScramError::Malformed(
                "channel binding does not match gs2 header",
            ));
        }
        let client_nonce = attr(attrs.next(), b'r', "expected r= (nonce)")?;
        if client_nonce != nonce {
            return Err(ScramError::Nonce);
        }
        let proof = decode_key(proof_b64, "bad proof")?;

        let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
        let client_signature = hmac(&self.verifier.stored_key, auth_message.as_bytes());
        let client_key = xor32(&proof, &client_signature);
        if !bool::from(sha256(&client_key).ct_eq(&self.verifier.stored_key)) {
            return Err(ScramError::BadProof);
        }
        let server_signature = hmac(&self.verifier.server_key, auth_message.as_bytes());
        self.state = ServerState::Done { client_key };
        Ok(format!("v={}", B64.encode(server_signature)).into_bytes())
    }

    /// After a successful exchange: the ClientKey recovered from the proof (lets us log in to a
    /// PostgreSQL server holding the same verifier without knowing the password).
    pub fn client_key(&self) -> Option<[u8; 32]> {
        match self.state {
            ServerState::Done { client_key } => Some(client_key),
            _ => None,
        }
    }

    /// After a successful exchange: the credential to log in to a PostgreSQL server whose stored
    /// verifier equals ours (ClientKey from the proof, ServerKey from the verifier).
    pub fn client_credential(&self) -> Option<ClientCredential> {
        self.client_key().map(|client_key| ClientCredential::Keys {
            client_key,
            server_key: self.verifier.server_key,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Client side.

/// What the client side of SCRAM knows.
#[derive(Clone)]
pub enum ClientCredential {
    Password(String),
    /// ClientKey + ServerKey (from a verifier and a client's proof).
    Keys {
        client_key: [u8; 32],
        server_key: [u8; 32],
    },
}

impl std::fmt::Debug for ClientCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print a secret.
        match self {
            ClientCredential::Password(_) => f.write_str("Password(..)"),
            ClientCredential::Keys { .. } => f.write_str("Keys{..}"),
        }
    }
}

/// A parsed server-first-message.
struct ServerFirst<'a> {
    nonce: &'a str,
    salt: Vec<u8>,
    iterations: u32,
}

impl<'a> ServerFirst<'a> {
    fn parse(msg: &'a str) -> Result<Self, ScramError> {
        // server-first-message = [reserved-mext ","] nonce "," salt "," iteration-count ["," extensions]
        let mut attrs = msg.split(',');
        let first = attrs.next();
        if first.is_some_and(|p| p.starts_with("m=")) {
            return Err(ScramError::Malformed(
                "mandatory extensions are not supported",
            ));
        }
        let nonce = attr(first, b'r', "expected r= (nonce)")?;
        if !is_printable(nonce) {
            return Err(ScramError::Malformed("bad server nonce"));
        }
        let salt = attr(attrs.next(), b's', "expected s= (salt)")?;
        let salt = B64
            .decode(salt)
            .map_err(|_| ScramError::Malformed("bad base64 in s="))?;
        if salt.is_empty() {
            return Err(ScramError::Malformed("empty salt"));
        }
        let iterations = attr(attrs.next(), b'i', "expected i= (iteration count)")?;
        if iterations.is_empty()
            || iterations.len() > 10
            || !iterations.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(ScramError::Malformed("bad iteration count"));
        }
        let iterations: u32 = iterations
            .parse()
            .map_err(|_| ScramError::Malformed("bad iteration count"))?;
        if iterations == 0 || iterations > MAX_ITERATIONS {
            return Err(ScramError::Malformed("iteration count out of range"));
        }
        Ok(ServerFirst {
            nonce,
            salt,
            iterations,
        })
    }
}

enum ClientState {
    Initial,
    FirstSent {
        client_first_bare: String,
        nonce: String,
    },
    FinalSent {
        server_signature: Key32,
    },
    Done,
    Failed,
}

/// Client side of one SCRAM exchange (pgcarpool logging in to PostgreSQL).
pub struct ScramClient {
    cred: ClientCredential,
    /// Our nonce; random unless injected by a test.
    nonce: Option<String>,
    /// The SCRAM user name: empty, as libpq sends it (PostgreSQL uses the startup packet's).
    user: String,
    state: ClientState,
}

impl ScramClient {
    pub fn new(cred: ClientCredential) -> Self {
        ScramClient {
            cred,
            nonce: None,
            user: String::new(),
            state: ClientState::Initial,
        }
    }

    /// With a fixed nonce and SCRAM user name (tests: RFC vectors use `n=user`).
    #[cfg(test)]
    pub(crate) fn with_nonce(cred: ClientCredential, user: &str, nonce: &str) -> Self {
        ScramClient {
            nonce: Some(nonce.to_owned()),
            user: user.to_owned(),
            ..ScramClient::new(cred)
        }
    }

    /// client-first-message to send in SASLInitialResponse.
    pub fn client_first(&mut self) -> Vec<u8> {
        let nonce = self.nonce.clone().unwrap_or_else(random_nonce);
        let client_first_bare = format!("n={},r={nonce}", self.user);
        let out = format!("{GS2_HEADER_N}{client_first_bare}").into_bytes();
        self.state = ClientState::FirstSent {
            client_first_bare,
            nonce,
        };
        out
    }

    /// Takes AuthenticationSASLContinue data, returns client-final-message.
    /// With a `Password` credential this runs PBKDF2 (CPU heavy): on the reactor prefer
    /// [`server_first_params`] + a cached/off-thread derivation + [`Self::server_first_with_keys`].
    pub fn server_first(&mut self, data: &[u8]) -> Result<Vec<u8>, ScramError> {
        self.server_first_inner(data, None)
    }

    /// Like [`Self::server_first`], with ClientKey/ServerKey already derived for this message's
    /// salt and iteration count (overrides the credential given to `new`).
    pub fn server_first_with_keys(
        &mut self,
        data: &[u8],
        client_key: Key32,
        server_key: Key32,
    ) -> Result<Vec<u8>, ScramError> {
        self.server_first_inner(data, Some((client_key, server_key)))
    }

    fn server_first_inner(
        &mut self,
        data: &[u8],
        keys: Option<(Key32, Key32)>,
    ) -> Result<Vec<u8>, ScramError> {
        let ClientState::FirstSent {
            client_first_bare,
            nonce: our_nonce,
        } = std::mem::replace(&mut self.state, ClientState::Failed)
        else {
            return Err(ScramError::Malformed("unexpected server-first-message"));
        };
        let msg = as_message(data)?;
        let sf = ServerFirst::parse(msg)?;
        // The server must extend our nonce with its own part.
        if sf.nonce.len() <= our_nonce.len() || !sf.nonce.starts_with(our_nonce.as_str()) {
            return Err(ScramError::Nonce);
        }
        let (client_key, server_key) = match (keys, &self.cred) {
            (Some(k), _) => k,
            (
                None,
                ClientCredential::Keys {
                    client_key,
                    server_key,
                },
            ) => (*client_key, *server_key),
            (None, ClientCredential::Password(p)) => keys_from_password(p, &sf.salt, sf.iterations),
        };

        let without_proof = format!("c={},r={}", B64.encode(GS2_HEADER_N), sf.nonce);
        let auth_message = format!("{client_first_bare},{msg},{without_proof}");
        let stored_key = sha256(&client_key);
        let client_signature = hmac(&stored_key, auth_message.as_bytes());
        let proof = xor32(&client_key, &client_signature);
        let server_signature = hmac(&server_key, auth_message.as_bytes());
        self.state = ClientState::FinalSent { server_signature };
        Ok(format!("{without_proof},p={}", B64.encode(proof)).into_bytes())
    }

    /// Takes AuthenticationSASLFinal data and verifies the server signature.
    pub fn server_final(&mut self, data: &[u8]) -> Result<(), ScramError> {
        let ClientState::FinalSent { server_signature } =
            std::mem::replace(&mut self.state, ClientState::Failed)
        else {
            return Err(ScramError::Malformed("unexpected server-final-message"));
        };
        let msg = as_message(data)?;
        // server-final-message = (server-error / verifier) ["," extensions]
        let first = msg.split(',').next();
        if first.is_some_and(|p| p.starts_with("e=")) {
            return Err(ScramError::Malformed(
                "server-final-message reports an error",
            ));
        }
        let v = attr(first, b'v', "expected v= (server signature)")?;
        let v = decode_key(v, "bad server signature")?;
        if !bool::from(v.ct_eq(&server_signature)) {
            return Err(ScramError::BadServerSignature);
        }
        self.state = ClientState::Done;
        Ok(())
    }

    /// True once the server's signature has been verified.
    pub fn is_done(&self) -> bool {
        matches!(self.state, ClientState::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // RFC 7677 section 3: user "user", password "pencil".
    const RFC_PASSWORD: &str = "pencil";
    const RFC_SALT_B64: &str = "W22ZaJ0SNY7soEsUEjb6gQ==";
    const RFC_CLIENT_NONCE: &str = "rOprNGfwEbeRWgbNEkqO";
    const RFC_SERVER_NONCE: &str = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
    const RFC_C1: &str = "n,,n=user,r=rOprNGfwEbeRWgbNEkqO";
    const RFC_S1: &str =
        "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
    const RFC_C2: &str = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
    const RFC_S2: &str = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=";

    /// pg_authid.rolpassword from PostgreSQL 15 (`password_encryption = 'scram-sha-256'`).
    /// (role, password, stored verifier)
    const PG_VERIFIERS: &[(&str, &str, &str)] = &[
        (
            "scramuser",
            "scrampass",
            "SCRAM-SHA-256$4096:W4ZlSxRMG75ZvaU2hbWN9Q==$3PbdjiGtSNh1OuMkcfOx8OyR015fbGusPXJE8KCta28=:JKw53oJ8MPNQPjE4YLq9NBB+dDMRktRHsBDbQCUraT4=",
        ),
        // U+00AD SOFT HYPHEN: SASLprep maps it to nothing.
        (
            "s2",
            "I\u{00AD}X",
            "SCRAM-SHA-256$4096:clIYGxc350cSs4zbeFQufA==$n7wYsGA2Gze5bH1LlNfsoV4dnKt2TI5bth0O9Dp6U+M=:jwGKWrKa65s4wQ+cOIB85y8QL2nV9Vb+n9GriPU4E08=",
        ),
        // BEL is prohibited by SASLprep: PostgreSQL falls back to the raw password.
        (
            "s3",
            "a\u{0007}b",
            "SCRAM-SHA-256$4096:eWxkD81lY1p1mnNhDXfcoQ==$DD/qNv4JzFJ0AyWVMFy2n79mzt7oCG0LY7pgzblkLxU=:Nh2iRVXm8FHde39V5UWBZ7HyRF8gRFhVgZgT5iTYUVI=",
        ),
        // U+2168 ROMAN NUMERAL NINE: NFKC gives "IX".
        (
            "s4",
            "\u{2168}",
            "SCRAM-SHA-256$4096:eQ5GJ+vUqMRdppRZ7CD5CQ==$5uu/I5XE+4qHLLO1j+QeC/1PIZTokn6syndef9+zbZo=:QcVH+/3BYxQZZxbnnddjT0WcuGpAR6gybhxUYeD5VSA=",
        ),
    ];

    fn rfc_verifier() -> ScramVerifier {
        let salt = B64.decode(RFC_SALT_B64).expect("salt");
        verifier_from_password(RFC_PASSWORD, &salt, 4096)
    }

    /// Parse a pg_authid verifier (test-only; the real parser lives in config::auth_file).
    fn parse_pg(s: &str) -> ScramVerifier {
        let rest = s.strip_prefix("SCRAM-SHA-256$").expect("prefix");
        let (iter_salt, keys) = rest.split_once('$').expect("$");
        let (iter, salt) = iter_salt.split_once(':').expect(":");
        let (stored, server) = keys.split_once(':').expect(":");
        ScramVerifier {
            iterations: iter.parse().expect("iter"),
            salt: B64.decode(salt).expect("salt"),
            stored_key: decode_key(stored, "stored").expect("stored"),
            server_key: decode_key(server, "server").expect("server"),
        }
    }

    fn small_verifier(password: &str) -> ScramVerifier {
        // Few iterations keep debug-build tests fast; the exchange does not depend on the count.
        verifier_from_password(password, b"0123456789abcdef", 16)
    }

    /// Drive a full exchange; returns the server (for client_key) and the client's final result.
    fn exchange(
        verifier: &ScramVerifier,
        cred: ClientCredential,
    ) -> (ScramServer, Result<(), ScramError>) {
        let mut server = ScramServer::new(verifier.clone());
        let mut client = ScramClient::new(cred);
        let c1 = client.client_first();
        let s1 = server.client_first(&c1).expect("client-first");
        let c2 = client.server_first(&s1).expect("server-first");
        let result = server
            .client_final(&c2)
            .and_then(|s2| client.server_final(&s2));
        (server, result)
    }

    #[test]
    fn rfc7677_vector_server_side() {
        let v = rfc_verifier();
        let mut server = ScramServer::with_nonce(v.clone(), RFC_SERVER_NONCE);
        assert_eq!(
            server.client_first(RFC_C1.as_bytes()).unwrap(),
            RFC_S1.as_bytes()
        );
        assert_eq!(server.client_key(), None);
        assert_eq!(
            server.client_final(RFC_C2.as_bytes()).unwrap(),
            RFC_S2.as_bytes()
        );
        let ck = server.client_key().expect("client key after success");
        assert_eq!(sha256(&ck), v.stored_key);
        let (expected_ck, _) = keys_from_password(RFC_PASSWORD, &v.salt, 4096);
        assert_eq!(ck, expected_ck);
    }

    #[test]
    fn rfc7677_vector_client_side_password() {
        let mut client = ScramClient::with_nonce(
            ClientCredential::Password(RFC_PASSWORD.into()),
            "user",
            RFC_CLIENT_NONCE,
        );
        assert_eq!(client.client_first(), RFC_C1.as_bytes());
        assert_eq!(
            client.server_first(RFC_S1.as_bytes()).unwrap(),
            RFC_C2.as_bytes()
        );
        client.server_final(RFC_S2.as_bytes()).unwrap();
        assert!(client.is_done());
    }

    #[test]
    fn rfc7677_vector_client_side_keys() {
        let salt = B64.decode(RFC_SALT_B64).unwrap();
        let (client_key, server_key) = keys_from_password(RFC_PASSWORD, &salt, 4096);
        let mut client = ScramClient::with_nonce(
            ClientCredential::Keys {
                client_key,
                server_key,
            },
            "user",
            RFC_CLIENT_NONCE,
        );
        client.client_first();
        assert_eq!(
            client.server_first(RFC_S1.as_bytes()).unwrap(),
            RFC_C2.as_bytes()
        );
        client.server_final(RFC_S2.as_bytes()).unwrap();
    }

    #[test]
    fn verifiers_match_postgresql() {
        for (role, password, stored) in PG_VERIFIERS {
            let pg = parse_pg(stored);
            let ours = verifier_from_password(password, &pg.salt, pg.iterations);
            assert_eq!(ours, pg, "role {role}");
            assert_eq!(verifier_to_string(&ours), *stored, "role {role}");
        }
    }

    #[test]
    fn client_with_keys_or_password_logs_in_to_a_postgresql_verifier() {
        let (_, password, stored) = PG_VERIFIERS[0];
        let pg = parse_pg(stored);
        // A client of ours logs in with the password; the recovered keys then log in again.
        let (server, r) = exchange(&pg, ClientCredential::Password(password.into()));
        r.unwrap();
        let keys = server.client_credential().expect("keys");
        let (_, r) = exchange(&pg, keys);
        r.unwrap();
    }

    #[test]
    fn round_trip_with_password() {
        let v = small_verifier("secret");
        let (server, r) = exchange(&v, ClientCredential::Password("secret".into()));
        r.unwrap();
        let (ck, sk) = keys_from_password("secret", &v.salt, v.iterations);
        assert_eq!(server.client_key(), Some(ck));
        assert_eq!(sk, v.server_key);
    }

    #[test]
    fn round_trip_with_keys() {
        let v = small_verifier("secret");
        let (client_key, server_key) = keys_from_password("secret", &v.salt, v.iterations);
        let (server, r) = exchange(
            &v,
            ClientCredential::Keys {
                client_key,
                server_key,
            },
        );
        r.unwrap();
        assert_eq!(server.client_key(), Some(client_key));
    }

    #[test]
    fn round_trip_with_precomputed_keys_and_params() {
        let v = small_verifier("secret");
        let mut server = ScramServer::new(v.clone());
        // The credential is ignored when keys are supplied.
        let mut client = ScramClient::new(ClientCredential::Password("wrong".into()));
        let s1 = server.client_first(&client.client_first()).unwrap();
        let (salt, iterations) = server_first_params(&s1).unwrap();
        assert_eq!(
            (salt.as_slice(), iterations),
            (v.salt.as_slice(), v.iterations)
        );
        let (ck, sk) = keys_from_password("secret", &salt, iterations);
        let c2 = client.server_first_with_keys(&s1, ck, sk).unwrap();
        let s2 = server.client_final(&c2).unwrap();
        client.server_final(&s2).unwrap();
    }

    #[test]
    fn wrong_password_is_bad_proof() {
        let v = small_verifier("secret");
        let (server, r) = exchange(&v, ClientCredential::Password("Secret".into()));
        assert!(matches!(r, Err(ScramError::BadProof)), "{r:?}");
        assert_eq!(server.client_key(), None);
        assert!(server.client_credential().is_none());
    }

    #[test]
    fn wrong_server_key_is_bad_server_signature() {
        let v = small_verifier("secret");
        let (client_key, mut server_key) = keys_from_password("secret", &v.salt, v.iterations);
        server_key[0] ^= 1;
        let (_, r) = exchange(
            &v,
            ClientCredential::Keys {
                client_key,
                server_key,
            },
        );
        assert!(matches!(r, Err(ScramError::BadServerSignature)), "{r:?}");
    }

    #[test]
    fn client_first_defaults_match_libpq() {
        let mut client = ScramClient::new(ClientCredential::Password("x".into()));
        let c1 = String::from_utf8(client.client_first()).unwrap();
        let nonce = c1.strip_prefix("n,,n=,r=").expect("libpq shape");
        assert_eq!(nonce.len(), 24);
        assert!(is_printable(nonce));
        // Two clients never share a nonce.
        let c1b = ScramClient::new(ClientCredential::Password("x".into())).client_first();
        assert_ne!(c1.as_bytes(), c1b.as_slice());
    }

    #[test]
    fn server_nonce_is_random_and_extends_client_nonce() {
        let v = small_verifier("x");
        let s1 = ScramServer::new(v.clone())
            .client_first(b"n,,n=,r=abc")
            .unwrap();
        let s1b = ScramServer::new(v).client_first(b"n,,n=,r=abc").unwrap();
        assert_ne!(s1, s1b);
        let s1 = String::from_utf8(s1).unwrap();
        let nonce = s1.strip_prefix("r=abc").unwrap().split(',').next().unwrap();
        assert_eq!(nonce.len(), 24);
        assert!(s1.ends_with(",s=MDEyMzQ1Njc4OWFiY2RlZg==,i=16"), "{s1}");
    }

    #[test]
    fn gs2_header_y_is_accepted_and_bound() {
        let v = small_verifier("secret");
        let (ck, _) = keys_from_password("secret", &v.salt, v.iterations);
        let client_final = |server: &mut ScramServer, s1: &[u8], cbind: &str| {
            let s1 = std::str::from_utf8(s1).unwrap();
            let nonce = &s1[2..s1.find(',').unwrap()];
            let without_proof = format!("c={cbind},r={nonce}");
            let auth = format!("n=,r=cn,{s1},{without_proof}");
            let proof = xor32(&ck, &hmac(&sha256(&ck), auth.as_bytes()));
            server.client_final(format!("{without_proof},p={}", B64.encode(proof)).as_bytes())
        };
        // "y,," → c=eSws
        let mut server = ScramServer::new(v.clone());
        let s1 = server.client_first(b"y,,n=,r=cn").unwrap();
        let s2 = client_final(&mut server, &s1, "eSws").unwrap();
        let auth_sig = String::from_utf8(s2).unwrap();
        assert!(auth_sig.starts_with("v="));
        // "y,," but c=biws ("n,,") → mismatch.
        let mut server = ScramServer::new(v);
        let s1 = server.client_first(b"y,,n=,r=cn").unwrap();
        assert!(matches!(
            client_final(&mut server, &s1, "biws"),
            Err(ScramError::Malformed(_))
        ));
    }

    #[test]
    fn client_first_malformed_is_error() {
        let v = small_verifier("x");
        let long = format!("n,,n=,r={}", "a".repeat(MAX_SCRAM_MESSAGE_LEN));
        let cases: Vec<&[u8]> = vec![
            b"",
            b"n",
            b"n,",
            b"n,,",
            b"x,,n=,r=abc",
            b"p=tls-server-end-point,,n=,r=abc",
            b"n,a=admin,n=,r=abc",
            b"n,,m=ext,n=,r=abc",
            b"n,,r=abc",
            b"n,,n=",
            b"n,,n=,",
            b"n,,n=,r=",
            b"n,,n=,x=abc",
            b"n,,n=,r=ab c",
            b"n,,n=,r=\xff\xfe",
            b"\xff,,n=,r=abc",
            long.as_bytes(),
        ];
        for c in cases {
            let mut server = ScramServer::new(v.clone());
            let r = server.client_first(c);
            assert!(
                matches!(r, Err(ScramError::Malformed(_))),
                "{:?} → {r:?}",
                String::from_utf8_lossy(c)
            );
            // A failed exchange stays failed.
            assert!(server.client_final(b"c=biws,r=abc,p=AAAA").is_err());
            assert_eq!(server.client_key(), None);
        }
    }

    #[test]
    fn client_first_accepts_extensions_and_a_user_name() {
        let v = small_verifier("x");
        ScramServer::new(v.clone())
            .client_first(b"n,,n=bob,r=abc,x=ext")
            .unwrap();
        ScramServer::new(v).client_first(b"y,,n=,r=abc").unwrap();
    }

    #[test]
    fn client_final_malformed_is_error() {
        let v = small_verifier("x");
        let good_proof = B64.encode([0u8; 32]);
        let cases: Vec<(String, &str)> = vec![
            (String::new(), "malformed"),
            ("c=biws".into(), "malformed"),
            ("c=biws,r=NONCE".into(), "malformed"),
            ("c=biws,r=NONCE,p=".into(), "malformed"),
            ("c=biws,r=NONCE,p=!!!!".into(), "malformed"),
            ("c=biws,r=NONCE,p=AAAA".into(), "malformed"),
            (format!("c=biws,r=NONCE,p={good_proof}AA"), "malformed"),
            (format!("c=biws,r=NONCE,p={good_proof},x=1"), "malformed"),
            (format!("c=!!,r=NONCE,p={good_proof}"), "malformed"),
            (format!("c=eSws,r=NONCE,p={good_proof}"), "malformed"),
            (format!("r=NONCE,p={good_proof}"), "malformed"),
            (format!("c=biws,p={good_proof}"), "malformed"),
            (format!("c=biws,r=NONCEx,p={good_proof}"), "nonce"),
            (format!("c=biws,r=cn,p={good_proof}"), "nonce"),
            (format!("c=biws,r=NONCE,p={good_proof}"), "proof"),
            (format!("c=biws,r=NONCE,x=ext,p={good_proof}"), "proof"),
            (
                format!("c=biws,r=NONCE,p={}", "A".repeat(MAX_SCRAM_MESSAGE_LEN)),
                "malformed",
            ),
        ];
        for (c, want) in cases {
            let mut server = ScramServer::new(v.clone());
            let s1 = String::from_utf8(server.client_first(b"n,,n=,r=cn").unwrap()).unwrap();
            let nonce = &s1[2..s1.find(',').unwrap()];
            let c = c.replace("NONCE", nonce);
            let r = server.client_final(c.as_bytes());
            let ok = match want {
                "malformed" => matches!(r, Err(ScramError::Malformed(_))),
                "nonce" => matches!(r, Err(ScramError::Nonce)),
                _ => matches!(r, Err(ScramError::BadProof)),
            };
            assert!(ok, "{c:?} → {r:?}, want {want}");
            assert_eq!(server.client_key(), None);
            // No second try on the same exchange.
            assert!(server.client_final(c.as_bytes()).is_err());
        }
    }

    #[test]
    fn messages_out_of_order_are_errors() {
        let v = small_verifier("x");
        let mut server = ScramServer::new(v.clone());
        assert!(server.client_final(b"c=biws,r=a,p=AAAA").is_err());
        let mut server = ScramServer::new(v);
        server.client_first(b"n,,n=,r=abc").unwrap();
        assert!(server.client_first(b"n,,n=,r=abc").is_err());

        let mut client = ScramClient::new(ClientCredential::Password("x".into()));
        assert!(client.server_first(b"r=abcdef,s=AAAA,i=1").is_err());
        assert!(client.server_final(b"v=AAAA").is_err());
        assert!(!client.is_done());
    }

    #[test]
    fn server_first_malformed_is_error() {
        let salt = "MDEyMzQ1Njc4OWFiY2RlZg==";
        let cases: Vec<(String, &str)> = vec![
            (String::new(), "malformed"),
            ("r=".into(), "malformed"),
            ("r=cnSN".into(), "malformed"),
            ("r=cnSN,".into(), "malformed"),
            ("r=cnSN,s=".into(), "malformed"),
            (format!("r=cnSN,s={salt}"), "malformed"),
            (format!("r=cnSN,s={salt},i="), "malformed"),
            (format!("r=cnSN,s={salt},i=0"), "malformed"),
            (format!("r=cnSN,s={salt},i=-1"), "malformed"),
            (format!("r=cnSN,s={salt},i=+5"), "malformed"),
            (format!("r=cnSN,s={salt},i=4096x"), "malformed"),
            (format!("r=cnSN,s={salt},i=1000001"), "malformed"),
            (format!("r=cnSN,s={salt},i=4294967295"), "malformed"),
            (format!("r=cnSN,s={salt},i=4294967296"), "malformed"),
            (
                format!("r=cnSN,s={salt},i=99999999999999999999999"),
                "malformed",
            ),
            ("r=cnSN,s=!!!,i=1".into(), "malformed"),
            ("r=cnSN,i=1,s=AAAA".into(), "malformed"),
            ("m=x,r=cnSN,s=AAAA,i=1".into(), "malformed"),
            ("r=cn SN,s=AAAA,i=1".into(), "malformed"),
            ("s=AAAA,r=cnSN,i=1".into(), "malformed"),
            (
                format!("r=cnSN,s={}", "A".repeat(MAX_SCRAM_MESSAGE_LEN)),
                "malformed",
            ),
            ("r=SNcn,s=AAAA,i=1".into(), "nonce"),
            ("r=cn,s=AAAA,i=1".into(), "nonce"),
            ("r=c,s=AAAA,i=1".into(), "nonce"),
        ];
        for (s, want) in cases {
            let mut client =
                ScramClient::with_nonce(ClientCredential::Password("x".into()), "", "cn");
            client.client_first();
            let r = client.server_first(s.as_bytes());
            let ok = match want {
                "malformed" => matches!(r, Err(ScramError::Malformed(_))),
                _ => matches!(r, Err(ScramError::Nonce)),
            };
            assert!(ok, "{s:?} → {r:?}, want {want}");
            assert!(server_first_params(s.as_bytes()).is_err() || want == "nonce");
            assert!(client.server_final(b"v=AAAA").is_err());
        }
        // The bound itself is accepted by the parser (not run: a million PBKDF2 rounds).
        let at_cap = format!("r=cnSN,s={salt},i={MAX_ITERATIONS}");
        assert_eq!(
            server_first_params(at_cap.as_bytes()).unwrap().1,
            MAX_ITERATIONS
        );
        // Extensions after i= are allowed.
        let ext = format!("r=cnSN,s={salt},i=1,x=y");
        assert_eq!(server_first_params(ext.as_bytes()).unwrap().1, 1);
    }

    #[test]
    fn server_final_malformed_is_error() {
        let v = small_verifier("secret");
        let good = B64.encode([0u8; 32]);
        let cases: Vec<String> = vec![
            String::new(),
            "v=".into(),
            "v=!!!".into(),
            "v=AAAA".into(),
            format!("x={good}"),
            "e=invalid-proof".into(),
            format!("v={good}AA"),
            format!("v={}", "A".repeat(MAX_SCRAM_MESSAGE_LEN)),
        ];
        for s in cases {
            let mut server = ScramServer::new(v.clone());
            let mut client = ScramClient::new(ClientCredential::Password("secret".into()));
            let s1 = server.client_first(&client.client_first()).unwrap();
            client.server_first(&s1).unwrap();
            let r = client.server_final(s.as_bytes());
            assert!(matches!(r, Err(ScramError::Malformed(_))), "{s:?} → {r:?}");
            assert!(!client.is_done());
        }
        // A well-formed but wrong signature.
        let mut server = ScramServer::new(v);
        let mut client = ScramClient::new(ClientCredential::Password("secret".into()));
        let s1 = server.client_first(&client.client_first()).unwrap();
        client.server_first(&s1).unwrap();
        let r = client.server_final(format!("v={good}").as_bytes());
        assert!(matches!(r, Err(ScramError::BadServerSignature)), "{r:?}");
    }

    #[test]
    fn truncated_and_garbage_messages_never_panic() {
        let v = rfc_verifier();
        // Every prefix of a valid client-final-message fails.
        for i in 0..RFC_C2.len() {
            let mut server = ScramServer::with_nonce(v.clone(), RFC_SERVER_NONCE);
            server.client_first(RFC_C1.as_bytes()).unwrap();
            assert!(
                server.client_final(&RFC_C2.as_bytes()[..i]).is_err(),
                "prefix {i}"
            );
        }
        // Prefixes of the other messages: errors or not, no panics.
        for i in 0..RFC_C1.len() {
            let _ = ScramServer::new(v.clone()).client_first(&RFC_C1.as_bytes()[..i]);
        }
        for i in 0..RFC_S1.len() {
            let mut client = ScramClient::with_nonce(
                ClientCredential::Keys {
                    client_key: [0; 32],
                    server_key: [0; 32],
                },
                "user",
                RFC_CLIENT_NONCE,
            );
            client.client_first();
            let r = client.server_first(&RFC_S1.as_bytes()[..i]);
            // "…,i=4", "…,i=40", "…,i=409" are complete messages in their own right.
            let complete = i >= RFC_S1.find(",i=").unwrap() + 4;
            assert!(complete || r.is_err(), "prefix {i}");
        }
        // Pseudo-random bytes drawn from the SCRAM alphabet.
        let alphabet = b"nyp=,rsicvea+/AZz09\xff\x00";
        let mut x: u32 = 0x1234_5678;
        for _ in 0..2000 {
            let len = (x % 64) as usize;
            let mut msg = Vec::with_capacity(len);
            for _ in 0..len {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                msg.push(alphabet[(x as usize) % alphabet.len()]);
            }
            let mut server = ScramServer::new(v.clone());
            let _ = server.client_first(&msg);
            let _ = server.client_final(&msg);
            let _ = server_first_params(&msg);
            let mut client = ScramClient::new(ClientCredential::Keys {
                client_key: [0; 32],
                server_key: [0; 32],
            });
            client.client_first();
            let _ = client.server_first(&msg);
            let _ = client.server_final(&msg);
        }
    }

    #[test]
    fn credential_debug_hides_secrets() {
        let p = format!("{:?}", ClientCredential::Password("hunter2".into()));
        assert!(!p.contains("hunter2"));
        let k = format!(
            "{:?}",
            ClientCredential::Keys {
                client_key: [7; 32],
                server_key: [7; 32]
            }
        );
        assert!(!k.contains('7'));
    }
}
