//! Socket settings as PgBouncer applies them, read back from the pooler's own sockets
//! with getsockopt (the pooler runs in this process): tcp_keepalive, tcp_keepidle,
//! tcp_keepintvl, tcp_keepcnt, tcp_user_timeout, tcp_socket_buffer on client and server
//! sockets; tcp_defer_accept and listen_backlog (as `ss` shows it) on the listener;
//! unix_socket_group on the socket file.
mod harness;

use std::os::fd::{BorrowedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use harness::{TempPostgres, TestPooler};
use socket2::SockRef;

/// Every TCP socket of this process: (fd, local port, peer port or None for a listener).
fn tcp_sockets() -> Vec<(RawFd, u16, Option<u16>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").expect("read /proc/self/fd") {
        let Ok(entry) = entry else { continue };
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<RawFd>() else {
            continue;
        };
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        if !target.to_string_lossy().starts_with("socket:") {
            continue;
        }
        // SAFETY: the descriptor is open (listed just now) and only read for this call.
        let fd_ref = unsafe { BorrowedFd::borrow_raw(fd) };
        let sock = SockRef::from(&fd_ref);
        let Some(local) = sock.local_addr().ok().and_then(|a| a.as_socket()) else {
            continue;
        };
        let peer = sock
            .peer_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .map(|a| a.port());
        out.push((fd, local.port(), peer));
    }
    out
}

/// What the keepalive, user timeout and buffer options of socket `fd` are.
#[derive(Debug, PartialEq)]
struct Tuned {
    keepalive: bool,
    idle: Duration,
    interval: Duration,
    count: u32,
    user_timeout: Option<Duration>,
    sndbuf: usize,
    rcvbuf: usize,
    nodelay: bool,
}

fn tuned(fd: RawFd) -> Tuned {
    // SAFETY: as in `tcp_sockets`.
    let fd_ref = unsafe { BorrowedFd::borrow_raw(fd) };
    let s = SockRef::from(&fd_ref);
    Tuned {
        keepalive: s.keepalive().unwrap(),
        idle: s.tcp_keepalive_time().unwrap(),
        interval: s.tcp_keepalive_interval().unwrap(),
        count: s.tcp_keepalive_retries().unwrap(),
        user_timeout: s.tcp_user_timeout().unwrap(),
        sndbuf: s.send_buffer_size().unwrap(),
        rcvbuf: s.recv_buffer_size().unwrap(),
        nodelay: s.tcp_nodelay().unwrap(),
    }
}

fn defer_accept(fd: RawFd) -> libc::c_int {
    let mut val: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: an open descriptor, an int-sized buffer and its length.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&mut val as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    assert_eq!(r, 0, "getsockopt TCP_DEFER_ACCEPT");
    val
}

/// The pooler's accepted client socket and its server socket (the client holds a server
/// in a session-mode pool).
fn client_and_server_fds(pooler_port: u16, pg_port: u16) -> (RawFd, RawFd) {
    let socks = tcp_sockets();
    let client = socks
        .iter()
        .find(|(_, local, peer)| *local == pooler_port && peer.is_some())
        .expect("the pooler's client socket")
        .0;
    let server = socks
        .iter()
        .find(|(_, _, peer)| *peer == Some(pg_port))
        .expect("the pooler's server socket")
        .0;
    (client, server)
}

fn listener_fd(port: u16) -> RawFd {
    tcp_sockets()
        .iter()
        .find(|(_, local, peer)| *local == port && peer.is_none())
        .expect("the pooler's listening socket")
        .0
}

/// The backlog of the listening socket on 127.0.0.1:`port` as `ss -ltn` shows it (Send-Q).
fn ss_backlog(port: u16) -> u32 {
    let out = std::process::Command::new("ss")
        .args(["-ltnH", &format!("sport = :{port}")])
        .output()
        .expect("run ss");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().next().unwrap_or_else(|| panic!("ss: {text}"));
    // State Recv-Q Send-Q Local Peer
    line.split_whitespace()
        .nth(2)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("ss line: {line}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_settings_are_set_on_client_and_server_sockets() {
    let pg = TempPostgres::start();
    let mut p = TestPooler::builder(&pg)
        .settings(&[
            ("pool_mode", "session"),
            ("tcp_keepalive", "1"),
            ("tcp_keepidle", "37"),
            ("tcp_keepintvl", "11"),
            ("tcp_keepcnt", "4"),
            ("tcp_user_timeout", "12345"),
            ("tcp_socket_buffer", "65536"),
        ])
        .start()
        .await;
    let c = p.connect("md5user", "testdb").await;
    c.batch_execute("select 1").await.unwrap();
    let (client, server) = client_and_server_fds(p.port(), pg.port());
    for (what, fd) in [("client", client), ("server", server)] {
        let t = tuned(fd);
        assert_eq!(
            t,
            Tuned {
                keepalive: true,
                idle: Duration::from_secs(37),
                interval: Duration::from_secs(11),
                count: 4,
                user_timeout: Some(Duration::from_millis(12345)),
                // Linux doubles the value given (socket(7)).
                sndbuf: 131072,
                rcvbuf: 131072,
                nodelay: true,
            },
            "{what} socket"
        );
    }
    drop(c);
    // The client socket's buffers came from the listening socket, set before the handshake
    // (a buffer shrunk after it makes a stream crawl: tests/replication.rs); a reload sets
    // the listener's for the connections that come next.
    let l = listener_fd(p.port());
    assert_eq!((tuned(l).sndbuf, tuned(l).rcvbuf), (131072, 131072));
    p.reload_with(|c| c.setting("tcp_socket_buffer", "32768"))
        .await;
    assert_eq!((tuned(l).sndbuf, tuned(l).rcvbuf), (65536, 65536));
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_keepalive_off_turns_keepalive_off() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .settings(&[("pool_mode", "session"), ("tcp_keepalive", "0")])
        .start()
        .await;
    let c = p.connect("md5user", "testdb").await;
    c.batch_execute("select 1").await.unwrap();
    let (client, server) = client_and_server_fds(p.port(), pg.port());
    assert!(!tuned(client).keepalive, "client socket keepalive");
    assert!(!tuned(server).keepalive, "server socket keepalive");
    assert_eq!(tuned(client).user_timeout, None, "no tcp_user_timeout");
    drop(c);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_backlog_and_tcp_defer_accept_are_set_on_the_listener() {
    let pg = TempPostgres::start();
    let mut p = TestPooler::builder(&pg)
        .settings(&[("listen_backlog", "17"), ("tcp_defer_accept", "1")])
        .start()
        .await;
    assert_eq!(ss_backlog(p.port()), 17, "listen_backlog");
    let l = listener_fd(p.port());
    assert!(defer_accept(l) > 0, "TCP_DEFER_ACCEPT on");
    // Changed on a reload, as PgBouncer: taken off the listening socket.
    p.reload_with(|c| c.setting("tcp_defer_accept", "0")).await;
    assert_eq!(defer_accept(l), 0, "TCP_DEFER_ACCEPT off after reload");
    // Clients still get in.
    let c = p.connect("md5user", "testdb").await;
    c.batch_execute("select 1").await.unwrap();
    drop(c);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_socket_group_owns_the_socket_file() {
    let pg = TempPostgres::start();
    let dir = tempfile::tempdir().unwrap();
    // A group number no file here has: chown works for root (the tests' user) with any.
    let gid = 54321u32;
    let p = TestPooler::builder(&pg)
        .settings(&[
            ("unix_socket_dir", &dir.path().to_string_lossy()),
            ("unix_socket_group", &gid.to_string()),
            ("unix_socket_mode", "0770"),
        ])
        .start()
        .await;
    let path = dir.path().join(format!(".s.PGSQL.{}", p.port()));
    let meta = std::fs::metadata(&path).expect("socket file");
    assert_eq!(meta.gid(), gid, "group of {}", path.display());
    assert_eq!(meta.mode() & 0o7777, 0o770, "mode");
    p.shutdown().await;

    // A group that does not exist stops the start, as PgBouncer.
    let err = TestPooler::builder(&pg)
        .settings(&[
            ("unix_socket_dir", &dir.path().to_string_lossy()),
            ("unix_socket_group", "no_such_group_pgcarpool"),
        ])
        .try_start()
        .await
        .err()
        .expect("start refused");
    assert!(
        err.to_string()
            .contains("could not find group 'no_such_group_pgcarpool'"),
        "{err}"
    );
}
