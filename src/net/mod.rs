//! Sockets: the stream enum, buffered message framing, listeners.
pub mod conn;
pub mod fdpass;
pub mod listen;
pub mod stream;

pub use conn::Conn;
pub use stream::Stream;
