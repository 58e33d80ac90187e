//! Password authentication primitives: md5 and SCRAM-SHA-256, both sides.
//! The message exchange with a client lives in `client::startup`; with a server in `server::connect`.
pub mod md5;
pub mod scram;
