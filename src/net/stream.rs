//! One stream type for every transport (TCP, Unix socket).
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    /// A Unix-socket peer running as the same OS user as this process (SO_PEERCRED).
    pub fn peer_is_same_os_user(&self) -> bool {
        match self {
            Stream::Unix(s) => s
                .peer_cred()
                // SAFETY: geteuid has no preconditions and cannot fail.
                .is_ok_and(|c| c.uid() == unsafe { libc::geteuid() }),
            Stream::Tcp(_) => false,
        }
    }

    /// The uid of a Unix-socket peer (SO_PEERCRED); None for TCP or when the kernel says
    /// nothing.
    pub fn peer_uid(&self) -> Option<u32> {
        match self {
            Stream::Unix(s) => s.peer_cred().ok().map(|c| c.uid()),
            Stream::Tcp(_) => None,
        }
    }

    /// The peer's IP address (None for a Unix socket).
    pub fn peer_ip(&self) -> Option<std::net::IpAddr> {
        match self {
            Stream::Tcp(s) => s.peer_addr().ok().map(|a| a.ip()),
            Stream::Unix(_) => None,
        }
    }

    /// Whether the connection is encrypted with TLS (hba `hostssl` / `hostnossl`). The
    /// TLS variants answer true; the plain TCP and Unix ones false.
    pub fn is_tls(&self) -> bool {
        match self {
            Stream::Tcp(_) | Stream::Unix(_) => false,
        }
    }

    /// The CommonName of the client certificate of a TLS connection, if one was presented
    /// and verified (the `cert` auth method). None without TLS.
    pub fn client_cert_common_name(&self) -> Option<String> {
        match self {
            Stream::Tcp(_) | Stream::Unix(_) => None,
        }
    }

    /// Wait until the socket has bytes (or EOF) to read, without reading.
    pub async fn readable(&self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.readable().await,
            Stream::Unix(s) => s.readable().await,
        }
    }

    /// Leave this thread's runtime, to be [`Detached::attach`]ed on another worker's.
    pub fn detach(self) -> io::Result<Detached> {
        Ok(match self {
            Stream::Tcp(s) => Detached::Tcp(s.into_std()?),
            Stream::Unix(s) => Detached::Unix(s.into_std()?),
        })
    }

    /// Be driven by the current thread's runtime from now on (a server moving to the
    /// worker of the client that checked it out): the socket is registered here under a
    /// duplicate descriptor and the old registration is dropped. On error nothing changed.
    pub fn rehome(&mut self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => {
                let dup = socket2::SockRef::from(&*s).try_clone()?;
                *s = TcpStream::from_std(dup.into())?;
            }
            Stream::Unix(s) => {
                let dup = socket2::SockRef::from(&*s).try_clone()?;
                *s = UnixStream::from_std(std::os::fd::OwnedFd::from(dup).into())?;
            }
        }
        Ok(())
    }

    /// This end's address of a TCP connection, as text; None for Unix sockets.
    pub fn local(&self) -> Option<String> {
        match self {
            Stream::Tcp(s) => s.local_addr().ok().map(|a| a.to_string()),
            Stream::Unix(_) => None,
        }
    }

    /// The peer as text for logs and SHOW CLIENTS ("unix" for Unix sockets).
    pub fn peer(&self) -> String {
        match self {
            Stream::Tcp(s) => s.peer_addr().map(|a| a.to_string()).unwrap_or_default(),
            Stream::Unix(_) => "unix".to_string(),
        }
    }
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
        }
    }
    fn is_write_vectored(&self) -> bool {
        true
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}
