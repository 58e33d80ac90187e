//! Password authentication primitives: md5 and SCRAM-SHA-256, both sides, a cache of SCRAM
//! key derivations so PBKDF2 stays off the per-login path, and the short-lived cache of the
//! secrets auth_query found (dynamic.rs).
//! The message exchange with a client lives in `client::startup`; with a server in `server::connect`.
pub mod cache;
pub mod dynamic;
pub mod md5;
pub mod scram;
