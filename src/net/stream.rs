//! One stream type for every transport (TCP, Unix socket, TLS over TCP either way).
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

use super::tls;

pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    /// A client speaking TLS to us (boxed: a TLS session is large).
    TlsIn(Box<TlsIn>),
    /// Us speaking TLS to a server.
    TlsOut(Box<tokio_rustls::client::TlsStream<TcpStream>>),
    /// Nothing: the moment a stream is being upgraded to TLS. Every operation fails.
    Gone,
}

/// A client's TLS session and what we served it with.
pub struct TlsIn {
    pub tls: tokio_rustls::server::TlsStream<TcpStream>,
    /// `tls-server-end-point` channel binding data of the certificate we presented.
    pub end_point: Option<Arc<[u8]>>,
}

fn gone() -> io::Error {
    io::Error::new(
        io::ErrorKind::NotConnected,
        "stream taken for a TLS handshake",
    )
}

impl Stream {
    /// A Unix-socket peer running as the same OS user as this process (SO_PEERCRED).
    pub fn peer_is_same_os_user(&self) -> bool {
        match self {
            Stream::Unix(s) => s
                .peer_cred()
                .is_ok_and(|c| c.uid() == nix::unistd::geteuid().as_raw()),
            _ => false,
        }
    }

    /// TLS records written into the session and not yet onto the socket.
    #[inline]
    pub fn wants_write(&self) -> bool {
        match self {
            Stream::TlsIn(t) => t.tls.get_ref().1.wants_write(),
            Stream::TlsOut(t) => t.get_ref().1.wants_write(),
            _ => false,
        }
    }

    /// Over TLS (either way).
    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::TlsIn(_) | Stream::TlsOut(_))
    }

    /// The TLS session as SHOW CLIENTS/SERVERS and logs print it (PgBouncer's format,
    /// `TLSv1.3/TLS_AES_256_GCM_SHA384/ECDH=X25519`); None without TLS.
    pub fn tls_info(&self) -> Option<String> {
        match self {
            Stream::TlsIn(t) => Some(tls::describe(t.tls.get_ref().1)),
            Stream::TlsOut(t) => Some(tls::describe(t.get_ref().1)),
            _ => None,
        }
    }

    /// `tls-server-end-point` channel binding data for SCRAM-SHA-256-PLUS: of the
    /// certificate we presented (client side) or the server presented to us.
    pub fn tls_end_point(&self) -> Option<Vec<u8>> {
        match self {
            Stream::TlsIn(t) => t.end_point.as_deref().map(<[u8]>::to_vec),
            Stream::TlsOut(t) => t
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|c| tls::end_point_hash(c)),
            _ => None,
        }
    }

    /// The client's certificate (verified against `client_tls_ca_file` during the
    /// handshake: rustls only asks for one when a CA file is set), DER.
    pub fn tls_peer_cert(&self) -> Option<&[u8]> {
        match self {
            Stream::TlsIn(t) => t
                .tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .map(|c| c.as_ref()),
            _ => None,
        }
    }

    /// auth_type = cert (and hba's `cert`): the client presented a verified certificate
    /// issued to `name` (its DNS names, else its common name, as PgBouncer's
    /// `tls_peer_cert_contains_name`).
    pub fn tls_peer_cert_contains_name(&self, name: &str) -> bool {
        self.tls_peer_cert()
            .is_some_and(|c| tls::cert_names(c).iter().any(|n| n == name))
    }

    /// The TCP socket under this stream (plain or TLS).
    pub fn tcp(&self) -> Option<&TcpStream> {
        match self {
            Stream::Tcp(s) => Some(s),
            Stream::TlsIn(t) => Some(t.tls.get_ref().0),
            Stream::TlsOut(t) => Some(t.get_ref().0),
            _ => None,
        }
    }

    /// The uid of a Unix-socket peer (SO_PEERCRED); None for TCP or when the kernel says
    /// nothing.
    pub fn peer_uid(&self) -> Option<u32> {
        match self {
            Stream::Unix(s) => s.peer_cred().ok().map(|c| c.uid()),
            _ => None,
        }
    }

    /// The peer's IP address (None for a Unix socket).
    pub fn peer_ip(&self) -> Option<std::net::IpAddr> {
        self.tcp().and_then(|s| s.peer_addr().ok()).map(|a| a.ip())
    }

    /// The names the client certificate of a TLS connection was issued to (its DNS names,
    /// else its CommonName), if one was presented and verified (the `cert` auth method).
    /// None without TLS or without a certificate.
    pub fn client_cert_names(&self) -> Option<Vec<String>> {
        self.tls_peer_cert().map(tls::cert_names)
    }

    /// Whether the socket has a byte, EOF or an error waiting right now, asked of the kernel
    /// (one non-blocking `recv` with `MSG_PEEK`), not of the reactor: its readiness lags
    /// behind the socket until the runtime next polls for events.
    pub fn input_waiting(&self) -> bool {
        use std::os::fd::AsRawFd;
        let fd = match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::TlsIn(t) => t.tls.get_ref().0.as_raw_fd(),
            Stream::TlsOut(t) => t.get_ref().0.as_raw_fd(),
            Stream::Gone => return true,
        };
        use nix::errno::Errno;
        use nix::sys::socket::MsgFlags;
        let peek = MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT;
        !matches!(
            nix::sys::socket::recv(fd, &mut [0u8], peek),
            Err(Errno::EAGAIN | Errno::EINTR)
        )
    }

    /// Wait until the socket has bytes (or EOF) to read, without reading.
    pub async fn readable(&self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.readable().await,
            Stream::Unix(s) => s.readable().await,
            // Decrypted bytes may wait inside the session with nothing on the socket.
            Stream::TlsIn(t) if !t.tls.get_ref().1.wants_read() => Ok(()),
            Stream::TlsIn(t) => t.tls.get_ref().0.readable().await,
            Stream::TlsOut(t) if !t.get_ref().1.wants_read() => Ok(()),
            Stream::TlsOut(t) => t.get_ref().0.readable().await,
            Stream::Gone => Err(gone()),
        }
    }

    /// [`Stream::readable`] as a poll: the waker is kept in the socket's registration, so
    /// an idle client's task holds no state for the wait.
    pub fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            Stream::Tcp(s) => s.poll_read_ready(cx),
            Stream::Unix(s) => s.poll_read_ready(cx),
            Stream::TlsIn(t) if !t.tls.get_ref().1.wants_read() => Poll::Ready(Ok(())),
            Stream::TlsIn(t) => t.tls.get_ref().0.poll_read_ready(cx),
            Stream::TlsOut(t) if !t.get_ref().1.wants_read() => Poll::Ready(Ok(())),
            Stream::TlsOut(t) => t.get_ref().0.poll_read_ready(cx),
            Stream::Gone => Poll::Ready(Err(gone())),
        }
    }

    /// Leave this thread's runtime, to be [`Detached::attach`]ed on another worker's.
    /// Only plain sockets move this way (clients are placed before any TLS handshake).
    pub fn detach(self) -> io::Result<Detached> {
        Ok(match self {
            Stream::Tcp(s) => Detached::Tcp(s.into_std()?),
            Stream::Unix(s) => Detached::Unix(s.into_std()?),
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "a TLS stream cannot be detached",
                ));
            }
        })
    }

    /// Be driven by the current thread's runtime from now on (a server moving to the
    /// worker of the client that checked it out): the socket is registered here under a
    /// duplicate descriptor and the old registration is dropped. On error nothing changed.
    /// A TLS session stays as it is: only the socket under it is registered anew.
    pub fn rehome(&mut self) -> io::Result<()> {
        fn tcp(s: &mut TcpStream) -> io::Result<()> {
            let dup = socket2::SockRef::from(&*s).try_clone()?;
            *s = TcpStream::from_std(dup.into())?;
            Ok(())
        }
        match self {
            Stream::Tcp(s) => tcp(s)?,
            Stream::TlsOut(t) => tcp(t.get_mut().0)?,
            Stream::TlsIn(t) => tcp(t.tls.get_mut().0)?,
            Stream::Gone => return Err(gone()),
            Stream::Unix(s) => {
                let dup = socket2::SockRef::from(&*s).try_clone()?;
                *s = UnixStream::from_std(std::os::fd::OwnedFd::from(dup).into())?;
            }
        }
        Ok(())
    }

    /// This end's address of a TCP connection, as text; None for Unix sockets.
    pub fn local(&self) -> Option<String> {
        self.tcp()
            .and_then(|s| s.local_addr().ok())
            .map(|a| a.to_string())
    }

    /// The peer as text for logs and SHOW CLIENTS ("unix" for Unix sockets).
    pub fn peer(&self) -> String {
        match self {
            Stream::Unix(_) => "unix".to_string(),
            s => s
                .tcp()
                .and_then(|t| t.peer_addr().ok())
                .map(|a| addr_text(&a))
                .unwrap_or_default(),
        }
    }
}

/// `a` as `Display` writes it (`1.2.3.4:5`, `[::1]:5`), an IPv4 address without the
/// formatting machinery (once per login).
fn addr_text(a: &std::net::SocketAddr) -> String {
    let std::net::SocketAddr::V4(v4) = a else {
        return a.to_string();
    };
    fn number(n: u16, out: &mut String) {
        let mut digits = [0u8; 5];
        let mut at = digits.len();
        let mut n = n;
        loop {
            at -= 1;
            digits[at] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        out.extend(digits[at..].iter().map(|&d| char::from(d)));
    }
    let mut out = String::with_capacity(21);
    for (i, octet) in v4.ip().octets().into_iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        number(u16::from(octet), &mut out);
    }
    out.push(':');
    number(v4.port(), &mut out);
    out
}

/// A connected socket that belongs to no runtime (in transit between workers).
pub enum Detached {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

impl Detached {
    /// Register with the current thread's runtime.
    pub fn attach(self) -> io::Result<Stream> {
        Ok(match self {
            Detached::Tcp(s) => Stream::Tcp(TcpStream::from_std(s)?),
            Detached::Unix(s) => Stream::Unix(UnixStream::from_std(s)?),
        })
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
            Stream::TlsIn(t) => Pin::new(&mut t.tls).poll_read(cx, buf),
            Stream::TlsOut(t) => Pin::new(&mut **t).poll_read(cx, buf),
            Stream::Gone => Poll::Ready(Err(gone())),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
            Stream::TlsIn(t) => Pin::new(&mut t.tls).poll_write(cx, buf),
            Stream::TlsOut(t) => Pin::new(&mut **t).poll_write(cx, buf),
            Stream::Gone => Poll::Ready(Err(gone())),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::TlsIn(t) => Pin::new(&mut t.tls).poll_write_vectored(cx, bufs),
            Stream::TlsOut(t) => Pin::new(&mut **t).poll_write_vectored(cx, bufs),
            Stream::Gone => Poll::Ready(Err(gone())),
        }
    }
    fn is_write_vectored(&self) -> bool {
        true
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
            Stream::TlsIn(t) => Pin::new(&mut t.tls).poll_flush(cx),
            Stream::TlsOut(t) => Pin::new(&mut **t).poll_flush(cx),
            Stream::Gone => Poll::Ready(Err(gone())),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
            Stream::TlsIn(t) => Pin::new(&mut t.tls).poll_shutdown(cx),
            Stream::TlsOut(t) => Pin::new(&mut **t).poll_shutdown(cx),
            Stream::Gone => Poll::Ready(Err(gone())),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn addresses_are_written_as_display_writes_them() {
        for a in [
            "0.0.0.0:0",
            "127.0.0.1:5432",
            "10.20.30.40:65535",
            "255.255.255.255:1",
            "1.0.100.9:10",
            "[::1]:6432",
            "[fe80::1]:0",
        ] {
            let addr: std::net::SocketAddr = a.parse().unwrap();
            assert_eq!(super::addr_text(&addr), addr.to_string());
        }
    }

    use std::io::Write;
    use std::task::Waker;

    use super::*;

    /// Bytes that came while the runtime was busy are in the kernel, not yet in the
    /// reactor's view of the socket: `input_waiting` sees them, a poll does not.
    #[test]
    fn input_waiting_asks_the_kernel_not_the_reactor() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap();
        rt.block_on(async {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let mut peer = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (ours, _) = listener.accept().unwrap();
            ours.set_nonblocking(true).unwrap();
            let mut s = Stream::Tcp(TcpStream::from_std(ours).unwrap());
            // Nothing sent: nothing waiting; the poll clears the socket's readiness.
            let mut cx = Context::from_waker(Waker::noop());
            let mut buf = [0u8; 16];
            let mut rb = ReadBuf::new(&mut buf);
            assert!(Pin::new(&mut s).poll_read(&mut cx, &mut rb).is_pending());
            assert!(!s.input_waiting());
            // A FATAL arrives; this thread has not polled the reactor since.
            peer.write_all(b"E\0\0\0\x04").unwrap();
            let mut rb = ReadBuf::new(&mut buf);
            assert!(
                Pin::new(&mut s).poll_read(&mut cx, &mut rb).is_pending(),
                "the reactor already knew (the test proves nothing)"
            );
            assert!(s.input_waiting(), "bytes in the kernel were not seen");
            // EOF counts too.
            drop(peer);
            assert!(s.input_waiting());
        });
    }
}
