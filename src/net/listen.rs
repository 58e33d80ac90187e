//! Listening sockets (TCP via socket2 with SO_REUSEPORT when asked, Unix socket): binding,
//! accepting, taking what is queued (the accept policy is client/accept.rs's).
//!
//! Online restart (`-R`, "takeover"): the new process binds the same TCP port with
//! SO_REUSEPORT and attaches a classic BPF program to the port's reuseport group that sends
//! every new connection to its own socket, so the old process's socket gets no more; a Unix
//! socket is bound at a temporary path and renamed over the old one. When a listener stops
//! (shutdown), it first accepts whatever is already queued on it: closing a listening
//! socket resets the connections in its accept queue.
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use socket2::{Domain, Protocol, SockRef, Socket, Type};
use tokio::net::{TcpListener, UnixListener};

use super::Stream;
use crate::config::Settings;

pub enum Listener {
    Tcp(TcpListener),
    /// The socket file is removed on drop by the listener that bound it, not its clones.
    Unix(UnixListener, Option<SocketFile>),
}

/// A listening socket not yet registered with a runtime: bound before `-d` forks (so a
/// port clash is reported on the terminal), passed by systemd, or another descriptor of
/// the same socket for another worker's accept loop.
pub enum Bound {
    Tcp(std::net::TcpListener),
    /// The socket file is removed on drop by the listener that bound it, not its clones.
    Unix(std::os::unix::net::UnixListener, Option<SocketFile>),
}

impl Bound {
    /// Register with the current thread's runtime.
    pub fn attach(self) -> std::io::Result<Listener> {
        Ok(match self {
            Bound::Tcp(l) => Listener::Tcp(TcpListener::from_std(l)?),
            Bound::Unix(l, file) => Listener::Unix(UnixListener::from_std(l)?, file),
        })
    }

    /// A duplicate descriptor of the same listening socket (same accept queue).
    pub fn try_clone(&self) -> std::io::Result<Bound> {
        Ok(match self {
            Bound::Tcp(l) => Bound::Tcp(l.try_clone()?),
            Bound::Unix(l, _) => Bound::Unix(l.try_clone()?, None),
        })
    }

    pub fn local_tcp_addr(&self) -> Option<SocketAddr> {
        match self {
            Bound::Tcp(l) => l.local_addr().ok(),
            Bound::Unix(..) => None,
        }
    }
}

impl std::fmt::Display for Bound {
    /// `127.0.0.1:6432` or `unix:/tmp/.s.PGSQL.6432`, for the log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Bound::Tcp(l) => match l.local_addr() {
                Ok(a) => write!(f, "{a}"),
                Err(_) => write!(f, "a TCP socket"),
            },
            Bound::Unix(l, _) => match l
                .local_addr()
                .ok()
                .and_then(|a| a.as_pathname().map(Path::to_path_buf))
            {
                Some(p) => write!(f, "unix:{}", p.display()),
                None => write!(f, "a Unix socket"),
            },
        }
    }
}

/// The path of a Unix listening socket and the inode bound there: on exit the file is
/// removed only while it is still ours (a takeover may have renamed a new socket over it).
pub struct SocketFile {
    path: PathBuf,
    ino: u64,
}

impl SocketFile {
    /// The socket file at `path`, bound with inode `ino` (a socket received from the
    /// process `-R` took over: its file is ours to remove at exit now).
    pub fn new(path: PathBuf, ino: u64) -> SocketFile {
        SocketFile { path, ino }
    }
}

impl Listener {
    /// The next connection, waiting for one.
    pub async fn accept(&self) -> std::io::Result<Stream> {
        match self {
            Listener::Tcp(t) => Ok(Stream::Tcp(t.accept().await?.0)),
            Listener::Unix(u, _) => Ok(Stream::Unix(u.accept().await?.0)),
        }
    }

    /// The listening socket belongs to the new process now: close this process's
    /// descriptor without accepting what is queued (the new process will) and leave the
    /// socket file.
    pub fn hand_over(self) {
        if let Listener::Unix(_, file) = self
            && let Some(f) = file
        {
            // Not removed on drop: the new process serves it.
            std::mem::forget(f);
        }
    }

    /// One connection already queued on the socket, without waiting: Ok(None) when the
    /// queue is empty.
    pub fn try_accept(&self) -> std::io::Result<Option<Stream>> {
        let sock = match self {
            Listener::Tcp(l) => SockRef::from(l).accept(),
            Listener::Unix(l, _) => SockRef::from(l).accept(),
        };
        let sock = match sock {
            Ok((sock, _)) => sock,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) => return Err(e),
        };
        sock.set_nonblocking(true)?;
        Ok(Some(match self {
            Listener::Tcp(_) => Stream::Tcp(tokio::net::TcpStream::from_std(sock.into())?),
            Listener::Unix(..) => Stream::Unix(tokio::net::UnixStream::from_std(
                std::os::unix::net::UnixStream::from(std::os::fd::OwnedFd::from(sock)),
            )?),
        }))
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        match std::fs::metadata(&self.path) {
            Ok(m) if m.ino() == self.ino => {
                let _ = std::fs::remove_file(&self.path);
            }
            Ok(_) => tracing::info!(
                "{} now belongs to another process: left in place",
                self.path.display()
            ),
            Err(_) => {}
        }
    }
}

/// Bind every listen_addr on listen_port, and the Unix socket in unix_socket_dir.
/// `takeover` (`-R`): share the port with a running pgcarpool and draw every new
/// connection to this process; replace its Unix socket.
pub fn bind(s: &Settings, takeover: bool) -> std::io::Result<Vec<Bound>> {
    let mut out = Vec::new();
    let mut port = s.listen_port;
    for addr in s.listen_addrs() {
        let addrs: Vec<SocketAddr> = if addr == "*" {
            vec![SocketAddr::from(([0, 0, 0, 0], port))]
        } else {
            (addr.as_str(), port).to_socket_addrs()?.collect()
        };
        for a in addrs {
            let l = bind_tcp(a, s, s.so_reuseport || takeover, takeover)
                .map_err(|e| context(e, format!("could not listen on {a}")))?;
            // listen_port = 0 (tests): every address shares the first port picked.
            if port == 0 {
                port = l.local_addr()?.port();
            }
            out.push(Bound::Tcp(l));
        }
    }
    if !s.unix_socket_dir.is_empty() {
        let path = PathBuf::from(format!("{}/.s.PGSQL.{}", s.unix_socket_dir, port));
        let l = bind_unix(path.clone(), s, takeover)
            .map_err(|e| context(e, format!("could not listen on unix:{}", path.display())))?;
        out.push(l);
    }
    Ok(out)
}

/// The same error, with what was being done in front.
fn context(e: std::io::Error, what: String) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// The listening sockets systemd passed (socket activation, `LISTEN_FDS` for this PID),
/// or None when there are none. They replace `listen_addr` and `unix_socket_dir`, as in
/// PgBouncer.
pub fn from_systemd() -> std::io::Result<Option<Vec<Bound>>> {
    use std::os::fd::FromRawFd;
    let fds: Vec<_> = sd_notify::listen_fds()?.collect();
    if fds.is_empty() {
        return Ok(None);
    }
    let mut out = Vec::new();
    for fd in fds {
        // SAFETY: systemd hands these descriptors to this process (LISTEN_PID is ours) and
        // nothing else in it owns them.
        let sock = unsafe { Socket::from_raw_fd(fd) };
        if !sock.is_listener()? {
            return Err(std::io::Error::other(format!(
                "descriptor {fd} passed by the service manager is not a listening socket"
            )));
        }
        sock.set_nonblocking(true)?;
        let local = sock.local_addr()?;
        out.push(if local.is_unix() {
            Bound::Unix(std::os::fd::OwnedFd::from(sock).into(), None)
        } else {
            Bound::Tcp(sock.into())
        });
    }
    // SAFETY: single-threaded at this point (called before any runtime or thread starts).
    unsafe {
        std::env::remove_var("LISTEN_PID");
        std::env::remove_var("LISTEN_FDS");
        std::env::remove_var("LISTEN_FDNAMES");
    }
    Ok(Some(out))
}

fn bind_unix(path: PathBuf, s: &Settings, takeover: bool) -> std::io::Result<Bound> {
    let live = path.exists() && std::os::unix::net::UnixStream::connect(&path).is_ok();
    if path.exists() && !live {
        let _ = std::fs::remove_file(&path); // stale socket from a dead process
    }
    // Taking over a live socket: bind beside it, then rename over it in one step, so a
    // client connecting meanwhile finds one socket or the other, never none.
    let bind_path = if live && takeover {
        let mut tmp = path.clone().into_os_string();
        tmp.push(format!(".takeover.{}", std::process::id()));
        let tmp = PathBuf::from(tmp);
        let _ = std::fs::remove_file(&tmp);
        tmp
    } else {
        path.clone()
    };
    let sock = Socket::new(Domain::UNIX, Type::STREAM, None)?;
    sock.bind(&socket2::SockAddr::unix(&bind_path)?)?;
    sock.listen(backlog(s))?;
    sock.set_nonblocking(true)?;
    let l = std::os::unix::net::UnixListener::from(std::os::fd::OwnedFd::from(sock));
    if let Err(e) = chown_group(&bind_path, s.other_value("unix_socket_group").as_deref()) {
        let _ = std::fs::remove_file(&bind_path);
        return Err(e);
    }
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::Permissions::from_mode(s.unix_socket_mode);
        let _ = std::fs::set_permissions(&bind_path, mode);
    }
    let ino = std::fs::metadata(&bind_path)?.ino();
    if bind_path != path {
        if let Err(e) = std::fs::rename(&bind_path, &path) {
            let _ = std::fs::remove_file(&bind_path);
            return Err(e);
        }
        tracing::info!("took over {}", path.display());
    }
    Ok(Bound::Unix(l, Some(SocketFile { path, ino })))
}

/// `listen_backlog` as listen(2) takes it.
fn backlog(s: &Settings) -> i32 {
    i32::try_from(s.listen_backlog).unwrap_or(i32::MAX)
}

/// `unix_socket_group`: give the socket file to that group (a name or a number), as
/// PgBouncer; a group that does not exist or a chown refused stops the start.
fn chown_group(path: &Path, group: Option<&str>) -> std::io::Result<()> {
    let Some(group) = group.map(str::trim).filter(|g| !g.is_empty()) else {
        return Ok(());
    };
    let gid = match group.parse::<u32>() {
        Ok(gid) => nix::unistd::Gid::from_raw(gid),
        Err(_) => match nix::unistd::Group::from_name(group) {
            Ok(Some(g)) => g.gid,
            Ok(None) => {
                return Err(std::io::Error::other(format!(
                    "could not find group '{group}'"
                )));
            }
            Err(e) => {
                return Err(std::io::Error::other(format!(
                    "could not find group '{group}': {e}"
                )));
            }
        },
    };
    nix::unistd::chown(path, None, Some(gid)).map_err(|e| {
        std::io::Error::other(format!("chown({}, -1, {gid}) failed: {e}", path.display()))
    })
}

fn bind_tcp(
    addr: SocketAddr,
    s: &Settings,
    reuseport: bool,
    takeover: bool,
) -> std::io::Result<std::net::TcpListener> {
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    sock.set_reuse_address(true)?;
    if reuseport {
        sock.set_reuse_port(true)?;
    }
    sock.set_nonblocking(true)?;
    sock.bind(&addr.into())?;
    sock.listen(backlog(s))?;
    super::sockopt::set_defer_accept(SockRef::from(&sock), s.tcp_defer_accept != 0);
    if takeover {
        let bound = sock.local_addr()?.as_socket().unwrap_or(addr);
        match reuseport_index(bound) {
            Some(index) => {
                steer_to(&sock, index)?;
                if index > 0 {
                    tracing::info!(
                        "taking over {bound}: new connections come here, not to the {index} other listener(s)"
                    );
                }
            }
            None => tracing::warn!(
                "cannot tell this socket's place in {bound}'s SO_REUSEPORT group: connections stay spread over every listener"
            ),
        }
    }
    Ok(sock.into())
}

/// This socket's index in its SO_REUSEPORT group (sockets are numbered in the order of
/// their listen()): the listening sockets on `addr` in /proc/net/tcp{,6}, less one.
fn reuseport_index(addr: SocketAddr) -> Option<u32> {
    let file = match addr {
        SocketAddr::V4(_) => "/proc/net/tcp",
        SocketAddr::V6(_) => "/proc/net/tcp6",
    };
    let listening = count_listening(&std::fs::read_to_string(file).ok()?, addr);
    u32::try_from(listening.checked_sub(1)?).ok()
}

/// Listening sockets on `addr` in the text of /proc/net/tcp (IPv4) or tcp6 (IPv6).
fn count_listening(proc_net_tcp: &str, addr: SocketAddr) -> usize {
    let local = match addr {
        // The kernel prints each 32-bit word of the address in host (little-endian) order.
        SocketAddr::V4(a) => format!("{:08X}", u32::from_le_bytes(a.ip().octets())),
        SocketAddr::V6(a) => a
            .ip()
            .octets()
            .chunks_exact(4)
            .map(|w| format!("{:08X}", u32::from_le_bytes([w[0], w[1], w[2], w[3]])))
            .collect(),
    };
    let wanted = format!("{local}:{:04X}", addr.port());
    proc_net_tcp
        .lines()
        .skip(1)
        .filter(|line| {
            let mut fields = line.split_whitespace().skip(1);
            let local = fields.next();
            let state = fields.nth(1);
            local == Some(wanted.as_str()) && state == Some("0A")
        })
        .count()
}

/// Attach to the socket's SO_REUSEPORT group a classic BPF program choosing socket
/// `index` for every new connection (an index past the group's end falls back to hashing:
/// once the older listeners are closed, this socket is the group).
fn steer_to(sock: &Socket, index: u32) -> std::io::Result<()> {
    let mut program = [libc::sock_filter {
        code: (libc::BPF_RET | libc::BPF_K) as u16,
        jt: 0,
        jf: 0,
        k: index,
    }];
    let fprog = libc::sock_fprog {
        len: 1,
        filter: program.as_mut_ptr(),
    };
    use nix::sys::socket::{setsockopt, sockopt::AttachReusePortCbpf};
    setsockopt(sock, AttachReusePortCbpf, &fprog).map_err(std::io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROC_NET_TCP: &str = "\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1
   1: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1
   2: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 3 1
   3: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4 1
   4: 0100007F:1F91 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5 1
";

    #[test]
    fn counts_listeners_on_one_address_only() {
        let addr: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        assert_eq!(count_listening(PROC_NET_TCP, addr), 2);
        let any: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        assert_eq!(count_listening(PROC_NET_TCP, any), 1);
        let other: SocketAddr = "127.0.0.1:9000".parse().unwrap();
        assert_eq!(count_listening(PROC_NET_TCP, other), 0);
    }

    #[test]
    fn ipv6_loopback_is_printed_word_by_word() {
        let text = "header\n   0: 00000000000000000000000001000000:1F90 \
                    00000000000000000000000000000000:0000 0A 0 0 0 0 0 1 1\n";
        let addr: SocketAddr = "[::1]:8080".parse().unwrap();
        assert_eq!(count_listening(text, addr), 1);
    }

    #[tokio::test]
    async fn each_socket_of_a_reuseport_group_finds_its_index() {
        let first = bind_tcp(
            "127.0.0.1:0".parse().unwrap(),
            &Settings::default(),
            true,
            false,
        )
        .unwrap();
        let addr = first.local_addr().unwrap();
        // /proc may be unreadable in some sandboxes: then nothing to check.
        let Some(index) = reuseport_index(addr) else {
            return;
        };
        assert_eq!(index, 0);
        let _second = bind_tcp(addr, &Settings::default(), true, true).unwrap();
        assert_eq!(reuseport_index(addr), Some(1));
    }
}
