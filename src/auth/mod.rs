//! Authentication primitives: md5 and SCRAM-SHA-256, both sides, a cache of SCRAM key
//! derivations so PBKDF2 stays off the per-login path, the short-lived cache of the
//! secrets auth_query found (dynamic.rs), and the checks of the `peer` and `cert` methods.
//! The message exchange with a client lives in `client::startup`; with a server in `server::connect`.
pub mod cache;
pub mod cert;
pub mod dynamic;
pub mod md5;
pub mod peer;
pub mod scram;
