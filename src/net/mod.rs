//! Sockets: the stream enum (TCP, Unix, TLS both ways), TLS configuration, buffered message framing, listeners.
pub mod conn;
pub mod fdpass;
pub mod listen;
pub mod sockopt;
pub mod stream;
pub mod tls;

pub use conn::Conn;
pub use stream::Stream;
