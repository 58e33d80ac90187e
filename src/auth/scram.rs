//! SCRAM-SHA-256 (RFC 5802 / RFC 7677) as PostgreSQL uses it, and SCRAM-SHA-256-PLUS
//! with `tls-server-end-point` channel binding (RFC 5929) over TLS.
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

/// The SASL mechanism name without channel binding.
pub const MECHANISM: &str = "SCRAM-SHA-256";
/// The SASL mechanism with channel binding (offered over TLS, first, as PostgreSQL does).
pub const MECHANISM_PLUS: &str = "SCRAM-SHA-256-PLUS";
/// The only channel binding type PostgreSQL (and we) support.
const CBIND_TYPE: &str = "tls-server-end-point";
/// Longest SCRAM message we accept from either side. PostgreSQL's own messages are ~100–200 bytes.
pub const MAX_SCRAM_MESSAGE_LEN: usize = 4096;
/// Highest iteration count a ScramClient derives keys for from a password: one login must not
/// cost unbounded CPU. PostgreSQL's default (`scram_iterations`) is 4096; 1,000,000 is roughly a
/// second of PBKDF2. Logging in with keys (pass-through) runs no PBKDF2 and takes any count.
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
        macs: Default::default(),
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

/// HMAC of `data` with a MAC already keyed (`KeyedMacs`).
fn keyed_hmac(keyed: &crate::config::auth_file::HmacSha256, data: &[u8]) -> Key32 {
    let mut mac = keyed.clone();
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
    check_derivable(sf.iterations)?;
    Ok((sf.salt, sf.iterations))
}

/// Refuse to run PBKDF2 for more than [`MAX_ITERATIONS`].
fn check_derivable(iterations: u32) -> Result<(), ScramError> {
    if iterations > MAX_ITERATIONS {
        return Err(ScramError::Malformed("iteration count out of range"));
    }
    Ok(())
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
    /// `tls-server-end-point` data of the TLS connection (None: no TLS, or no hash for
    /// our certificate): SCRAM-SHA-256-PLUS is offered when set.
    channel_binding: Option<Vec<u8>>,
    /// The client chose SCRAM-SHA-256-PLUS.
    plus: bool,
}

impl ScramServer {
    pub fn new(verifier: ScramVerifier) -> Self {
        ScramServer {
            verifier,
            server_nonce: None,
            state: ServerState::Initial,
            channel_binding: None,
            plus: false,
        }
    }

    /// Over TLS: offer SCRAM-SHA-256-PLUS bound to this `tls-server-end-point` data.
    pub fn with_channel_binding(mut self, data: Option<Vec<u8>>) -> Self {
        self.channel_binding = data;
        self
    }

    /// The mechanisms to advertise in AuthenticationSASL, PostgreSQL's order.
    pub fn mechanisms(&self) -> &'static [&'static str] {
        if self.channel_binding.is_some() {
            &[MECHANISM_PLUS, MECHANISM]
        } else {
            &[MECHANISM]
        }
    }

    /// The mechanism the client chose in SASLInitialResponse; one not advertised is an
    /// error.
    pub fn select(&mut self, mechanism: &str) -> Result<(), ScramError> {
        if !self.mechanisms().contains(&mechanism) {
            return Err(ScramError::Malformed("unsupported SASL mechanism"));
        }
        self.plus = mechanism == MECHANISM_PLUS;
        Ok(())
    }

    /// With a fixed server nonce (tests: RFC vectors).
    /// With a fixed server nonce (tests, and fuzzing: `crate::fuzz`). Never for real logins.
    #[doc(hidden)]
    pub fn with_nonce(verifier: ScramVerifier, server_nonce: &str) -> Self {
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
        // PostgreSQL's rules: -PLUS needs `p=tls-server-end-point`; without it, `p` is an
        // error, and `y` (the client could bind but thinks we cannot) too when we can: a
        // downgrade by someone in the middle.
        match parts.next() {
            Some("n") if !self.plus => {}
            Some("y") if !self.plus && self.channel_binding.is_none() => {}
            Some("y") if !self.plus => {
                return Err(ScramError::Malformed(
                    "SCRAM channel binding negotiation error",
                ));
            }
            Some(f) if self.plus && f.strip_prefix("p=") == Some(CBIND_TYPE) => {}
            Some(f) if f.starts_with("p=") && self.plus => {
                return Err(ScramError::Malformed(
                    "unsupported SCRAM channel-binding type",
                ));
            }
            Some(f) if f.starts_with("p=") => {
                return Err(ScramError::Malformed(
                    "channel binding is not supported (SCRAM-SHA-256-PLUS not chosen)",
                ));
            }
            Some("n") | Some("y") => {
                return Err(ScramError::Malformed(
                    "SCRAM-SHA-256-PLUS chosen without channel binding",
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
        let mut expected = gs2_header.as_bytes().to_vec();
        if self.plus {
            expected.extend_from_slice(self.channel_binding.as_deref().unwrap_or_default());
        }
        if !bool::from(cbind.ct_eq(&expected)) {
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
        let v = &self.verifier;
        let (stored_mac, server_mac) = v.macs.get(&v.stored_key, &v.server_key);
        let client_signature = keyed_hmac(stored_mac, auth_message.as_bytes());
        let client_key = xor32(&proof, &client_signature);
        if !bool::from(sha256(&client_key).ct_eq(&self.verifier.stored_key)) {
            return Err(ScramError::BadProof);
        }
        let server_signature = keyed_hmac(server_mac, auth_message.as_bytes());
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
        if iterations == 0 {
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

/// What the client side of SCRAM does about channel binding.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ChannelBinding {
    /// No TLS: `n`.
    #[default]
    None,
    /// TLS, but the server did not offer -PLUS: `y`.
    NotOffered,
    /// SCRAM-SHA-256-PLUS bound to this `tls-server-end-point` data: `p=…`.
    EndPoint(Vec<u8>),
}

/// Client side of one SCRAM exchange (pgcarpool logging in to PostgreSQL).
pub struct ScramClient {
    cred: ClientCredential,
    /// Our nonce; random unless injected by a test.
    nonce: Option<String>,
    /// The SCRAM user name: empty, as libpq sends it (PostgreSQL uses the startup packet's).
    user: String,
    state: ClientState,
    channel_binding: ChannelBinding,
}

impl ScramClient {
    pub fn new(cred: ClientCredential) -> Self {
        ScramClient {
            cred,
            nonce: None,
            user: String::new(),
            state: ClientState::Initial,
            channel_binding: ChannelBinding::None,
        }
    }

    /// Bind the exchange to the TLS connection (or say why not).
    pub fn with_channel_binding(mut self, cb: ChannelBinding) -> Self {
        self.channel_binding = cb;
        self
    }

    /// The mechanism to name in SASLInitialResponse.
    pub fn mechanism(&self) -> &'static str {
        match self.channel_binding {
            ChannelBinding::EndPoint(_) => MECHANISM_PLUS,
            _ => MECHANISM,
        }
    }

    fn gs2_header(&self) -> String {
        match self.channel_binding {
            ChannelBinding::None => GS2_HEADER_N.to_string(),
            ChannelBinding::NotOffered => "y,,".to_string(),
            ChannelBinding::EndPoint(_) => format!("p={CBIND_TYPE},,"),
        }
    }

    /// The `c=` attribute: gs2 header, then the channel binding data if bound.
    fn cbind_input(&self) -> String {
        let mut b = self.gs2_header().into_bytes();
        if let ChannelBinding::EndPoint(d) = &self.channel_binding {
            b.extend_from_slice(d);
        }
        B64.encode(b)
    }

    /// With a fixed nonce and SCRAM user name (tests: RFC vectors use `n=user`).
    /// With a fixed nonce (tests, and fuzzing: `crate::fuzz`). Never for real logins.
    #[doc(hidden)]
    pub fn with_nonce(cred: ClientCredential, user: &str, nonce: &str) -> Self {
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
        let out = format!("{}{client_first_bare}", self.gs2_header()).into_bytes();
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
            (None, ClientCredential::Password(p)) => {
                check_derivable(sf.iterations)?;
                keys_from_password(p, &sf.salt, sf.iterations)
            }
        };

        let without_proof = format!("c={},r={}", self.cbind_input(), sf.nonce);
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
mod tests;
