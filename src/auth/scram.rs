//! SCRAM-SHA-256 (RFC 5802 / RFC 7677) as PostgreSQL uses it, without channel binding.
use crate::config::auth_file::ScramVerifier;

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
    let _ = (password, salt, iterations);
    todo!()
}

/// Server side of one SCRAM exchange, checking a client against a stored verifier.
pub struct ScramServer {
    _v: ScramVerifier,
}

impl ScramServer {
    pub fn new(verifier: ScramVerifier) -> Self {
        ScramServer { _v: verifier }
    }
    /// Takes the SASLInitialResponse data (client-first-message), returns server-first-message.
    pub fn client_first(&mut self, data: &[u8]) -> Result<Vec<u8>, ScramError> {
        let _ = data;
        todo!()
    }
    /// Takes the SASLResponse data (client-final-message), checks the proof, returns server-final-message.
    pub fn client_final(&mut self, data: &[u8]) -> Result<Vec<u8>, ScramError> {
        let _ = data;
        todo!()
    }
    /// After a successful exchange: the ClientKey recovered from the proof (lets us log in to a
    /// PostgreSQL server holding the same verifier without knowing the password).
    pub fn client_key(&self) -> Option<[u8; 32]> {
        todo!()
    }
}

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

/// Client side of one SCRAM exchange (pgcarpool logging in to PostgreSQL).
pub struct ScramClient {
    _c: ClientCredential,
}

impl ScramClient {
    pub fn new(cred: ClientCredential) -> Self {
        ScramClient { _c: cred }
    }
    /// client-first-message to send in SASLInitialResponse.
    pub fn client_first(&mut self) -> Vec<u8> {
        todo!()
    }
    /// Takes AuthenticationSASLContinue data, returns client-final-message.
    pub fn server_first(&mut self, data: &[u8]) -> Result<Vec<u8>, ScramError> {
        let _ = data;
        todo!()
    }
    /// Takes AuthenticationSASLFinal data and verifies the server signature.
    pub fn server_final(&mut self, data: &[u8]) -> Result<(), ScramError> {
        let _ = data;
        todo!()
    }
}
