//! Peering: several pgcarpool instances on 127.0.0.2-4 (one port, as behind a TCP load
//! balancer) pass each other the cancel requests meant for the other's clients; keys carry
//! the owner's peer id and a hop budget; peers are named by hand (`[peers]`) or by one name
//! (`peers_dns`, here resolved from a hosts file the test writes).
mod harness;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use harness::{
    Observer, TempPostgres, TestPooler, TestPoolerBuilder, eventually, free_port, wait_for,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const IPS: [&str; 3] = ["127.0.0.2", "127.0.0.3", "127.0.0.4"];

/// Start one pooler per address of `IPS` on one shared port; `spec(builder, index, port)`
/// shapes each. Another port is tried when one is taken on some address.
async fn fleet(
    pg: &TempPostgres,
    spec: impl Fn(TestPoolerBuilder, usize, u16) -> TestPoolerBuilder,
) -> (Vec<TestPooler>, u16) {
    fleet_on(pg, &IPS, spec).await
}

/// `fleet` on the addresses `ips`.
async fn fleet_on(
    pg: &TempPostgres,
    ips: &[&str],
    spec: impl Fn(TestPoolerBuilder, usize, u16) -> TestPoolerBuilder,
) -> (Vec<TestPooler>, u16) {
    'port: for _ in 0..10 {
        let port = free_port();
        let mut started = Vec::new();
        for (i, ip) in ips.iter().enumerate() {
            let b = TestPooler::builder(pg)
                .setting("listen_addr", ip)
                .setting("listen_port", &port.to_string())
                .setting("pool_mode", "transaction")
                .setting("auth_type", "trust");
            match spec(b, i, port).try_start().await {
                Ok(p) => started.push(p),
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                    for p in started {
                        p.shutdown().await;
                    }
                    continue 'port;
                }
                Err(e) => panic!("start pgcarpool on {ip}: {e}"),
            }
        }
        return (started, port);
    }
    panic!("no port free on all of {ips:?}");
}

/// Peers 1, 2, 3 on 127.0.0.2, .3, .4, every config listing all three (own entry included).
async fn static_fleet(pg: &TempPostgres) -> (Vec<TestPooler>, u16) {
    fleet(pg, |b, i, port| {
        let mut b = b.setting("peer_id", &(i + 1).to_string());
        for (j, ip) in IPS.iter().enumerate() {
            b = b.peer(j as u16 + 1, &format!("host={ip} port={port}"));
        }
        b
    })
    .await
}

async fn shutdown(fleet: Vec<TestPooler>) {
    for p in fleet {
        p.shutdown().await;
    }
}

/// A client logged in (trust) on `ip:port` that knows its BackendKeyData.
struct RawClient {
    s: TcpStream,
    key: (i32, i32),
}

impl RawClient {
    async fn connect(ip: &str, port: u16) -> RawClient {
        let mut s = TcpStream::connect((ip, port)).await.unwrap();
        s.write_all(&harness::wire::startup_message(&[
            ("user", "md5user"),
            ("database", "testdb"),
        ]))
        .await
        .unwrap();
        let mut c = RawClient { s, key: (0, 0) };
        loop {
            let (tag, body) = c.next().await.expect("login: connection closed");
            match tag {
                b'K' => {
                    c.key = (
                        i32::from_be_bytes(body[..4].try_into().unwrap()),
                        i32::from_be_bytes(body[4..8].try_into().unwrap()),
                    )
                }
                b'E' => panic!("login failed: {}", String::from_utf8_lossy(&body)),
                b'Z' => return c,
                _ => {}
            }
        }
    }

    async fn next(&mut self) -> Option<(u8, Vec<u8>)> {
        let mut head = [0u8; 5];
        tokio::time::timeout(Duration::from_secs(20), self.s.read_exact(&mut head))
            .await
            .expect("no reply within 20 s")
            .ok()?;
        let len = u32::from_be_bytes(head[1..].try_into().unwrap()) as usize;
        let mut body = vec![0u8; len - 4];
        self.s.read_exact(&mut body).await.ok()?;
        Some((head[0], body))
    }

    async fn send_query(&mut self, sql: &str) {
        let mut body = sql.as_bytes().to_vec();
        body.push(0);
        self.s
            .write_all(&harness::wire::message(b'Q', &body))
            .await
            .unwrap();
    }

    /// The SQLSTATE the query sent ends with (None: it succeeded), within `limit`.
    async fn outcome(&mut self, limit: Duration) -> Option<Option<String>> {
        let read = async {
            let mut code = None;
            loop {
                let (tag, body) = self.next().await.expect("connection closed");
                match tag {
                    b'E' => code = Some(harness::wire::error_fields(&body).0),
                    b'Z' => return code,
                    _ => {}
                }
            }
        };
        tokio::time::timeout(limit, read).await.ok()
    }
}

/// Send a CancelRequest with `key` to `ip:port` and wait until the pooler closes the
/// connection (it has handled the request, forwarded or not).
async fn send_cancel(ip: &str, port: u16, key: (i32, i32)) {
    let mut s = TcpStream::connect((ip, port)).await.unwrap();
    let mut m = 16i32.to_be_bytes().to_vec();
    m.extend_from_slice(&80877102i32.to_be_bytes());
    m.extend_from_slice(&key.0.to_be_bytes());
    m.extend_from_slice(&key.1.to_be_bytes());
    s.write_all(&m).await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut rest))
        .await
        .expect("the cancel connection was not closed")
        .ok();
}

fn key_bytes(k: (i32, i32)) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&k.0.to_be_bytes());
    b[4..].copy_from_slice(&k.1.to_be_bytes());
    b
}

fn key_from(b: [u8; 8]) -> (i32, i32) {
    (
        i32::from_be_bytes(b[..4].try_into().unwrap()),
        i32::from_be_bytes(b[4..].try_into().unwrap()),
    )
}

/// Wait until PostgreSQL runs the test's pg_sleep(30) (a cancel before that has nothing
/// to end).
async fn wait_running(pg: &TempPostgres) {
    let obs = Observer::new(pg).await;
    obs.wait_running("md5user", "pg_sleep(30)", 1).await;
}

/// A pg_sleep on the pooler at `owner` ends with 57014 when its cancel goes to `via`.
async fn cancel_via(pg: &TempPostgres, owner: &str, via: &str, port: u16) {
    let mut c = RawClient::connect(owner, port).await;
    // A backend of the last call may still show as active for a moment.
    Observer::new(pg)
        .await
        .wait_running("md5user", "pg_sleep(30)", 0)
        .await;
    c.send_query("SELECT pg_sleep(30)").await;
    wait_running(pg).await;
    send_cancel(via, port, c.key).await;
    let got = c.outcome(Duration::from_secs(5)).await.unwrap_or_else(|| {
        panic!("query on {owner} still runs 5 s after its cancel sent to {via}")
    });
    assert_eq!(
        got.as_deref(),
        Some("57014"),
        "query on {owner}, cancel via {via}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_sent_to_another_peer_ends_the_query() {
    let pg = TempPostgres::start();
    let (fleet, port) = static_fleet(&pg).await;
    for (owner, via) in [(0, 1), (0, 2), (1, 0), (2, 1), (1, 1)] {
        cancel_via(&pg, IPS[owner], IPS[via], port).await;
    }
    shutdown(fleet).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_carry_the_peer_id_and_a_full_ttl() {
    let pg = TempPostgres::start();
    let (fleet, port) = fleet(&pg, |b, i, _| {
        b.setting("peer_id", &(0x1230 + i).to_string())
    })
    .await;
    for (i, ip) in IPS.iter().enumerate() {
        for _ in 0..5 {
            let c = RawClient::connect(ip, port).await;
            let b = key_bytes(c.key);
            let id = 0x1230 + i as u16;
            assert_eq!((b[1], b[2]), ((id & 0xff) as u8, (id >> 8) as u8), "{b:?}");
            assert_eq!(b[7] & 3, 3, "TTL bits of {b:?}");
            assert!(c.key.0 >= 0, "negative pid {}", c.key.0);
        }
    }
    shutdown(fleet).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_spends_one_hop_and_an_exhausted_key_is_dropped() {
    let pg = TempPostgres::start();
    let (fleet, port) = static_fleet(&pg).await;
    let mut c = RawClient::connect(IPS[0], port).await;
    c.send_query("SELECT pg_sleep(30)").await;
    wait_running(&pg).await;
    let mut b = key_bytes(c.key);
    b[7] &= !3;
    // TTL 0 at peer 2: it may not forward it any more.
    send_cancel(IPS[1], port, key_from(b)).await;
    assert_eq!(
        c.outcome(Duration::from_millis(700)).await,
        None,
        "a cancel with no hop left was forwarded"
    );
    // TTL 1 at peer 2: forwarded once (arrives with 0 left), and the owner acts on it.
    b[7] |= 1;
    send_cancel(IPS[1], port, key_from(b)).await;
    let got = c.outcome(Duration::from_secs(5)).await;
    assert_eq!(got, Some(Some("57014".into())));
    shutdown(fleet).await;
}

/// Protocol 3.2 clients: their 32-byte secrets keep the peer id and the TTL in the first 8
/// bytes, and a cancel sent to another peer is forwarded whole: the owner ends the query
/// only when the whole secret is the client's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_key_sent_to_another_peer_ends_the_query_only_when_whole() {
    let pg = TempPostgres::start();
    let (fleet, port) = static_fleet(&pg).await;
    for (owner, via) in [(0, 1), (2, 0), (1, 1)] {
        let mut c =
            harness::raw::RawClient::connect((IPS[owner], port), 2, ("md5user", "testdb"), &[])
                .await;
        assert_eq!(c.secret_len(), 32);
        let b = key_bytes(c.key);
        assert_eq!((b[1], b[2], b[7] & 3), (owner as u8 + 1, 0, 3), "{b:?}");
        Observer::new(&pg)
            .await
            .wait_running("md5user", "pg_sleep(10)", 0)
            .await;
        c.send_query("SELECT pg_sleep(10)").await;
        Observer::new(&pg)
            .await
            .wait_running("md5user", "pg_sleep(10)", 1)
            .await;
        let mut wrong = c.rest.clone();
        wrong[0] ^= 0x80;
        harness::raw::send_cancel((IPS[via], port), c.key, &wrong).await;
        harness::raw::send_cancel((IPS[via], port), c.key, &[]).await;
        assert_eq!(
            c.outcome(Duration::from_millis(700)).await,
            None,
            "owner {owner}, via {via}: a cancel with a wrong secret ended the query"
        );
        harness::raw::send_cancel((IPS[via], port), c.key, &c.rest.clone()).await;
        let got = c.outcome(Duration::from_secs(5)).await;
        assert_eq!(got, Some(Some("57014".into())), "owner {owner}, via {via}");
    }
    shutdown(fleet).await;
}

/// A peer that takes connections and never answers: forwards to it stay in flight.
async fn silent_peer() -> (tokio::task::JoinHandle<()>, u16) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = l.accept().await {
            held.push(s);
        }
    });
    (task, port)
}

async fn rows(admin: &tokio_postgres::Client, sql: &str) -> Vec<Vec<String>> {
    admin
        .simple_query(sql)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => Some(
                (0..r.len())
                    .map(|i| r.get(i).unwrap_or("").to_string())
                    .collect(),
            ),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_peers_and_peer_pools_count_forwards_bounded_by_pool_size() {
    let pg = TempPostgres::start();
    let (silent, silent_port) = silent_peer().await;
    let p = TestPooler::builder(&pg)
        .setting("peer_id", "1")
        .setting("cancel_wait_timeout", "3")
        .peer(1, "host=127.0.0.1 port=1")
        .peer(7, &format!("host=127.0.0.1 port={silent_port} pool_size=1"))
        .peer(9, "host=/tmp/nowhere")
        .start()
        .await;
    let admin = p.connect("postgres", "pgbouncer").await;
    let head: Vec<String> = match &admin.simple_query("SHOW PEERS").await.unwrap()[0] {
        tokio_postgres::SimpleQueryMessage::RowDescription(cols) => {
            cols.iter().map(|c| c.name().to_string()).collect()
        }
        other => panic!("no row description: {other:?}"),
    };
    assert_eq!(head, ["peer_id", "host", "port", "pool_size"]);
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(
        rows(&admin, "SHOW PEERS").await,
        vec![
            s(&["1", "127.0.0.1", "1", "20"]),
            s(&["7", "127.0.0.1", &silent_port.to_string(), "1"]),
            s(&["9", "/tmp/nowhere", "6432", "20"]),
        ]
    );
    // Two cancels for peer 7 (pool_size 1): one forwarded and held, one waiting.
    let k = key_from([0, 7, 0, 0, 0, 0, 0, 3]);
    let addr = p.addr();
    let senders: Vec<_> = (0..2)
        .map(|_| tokio::spawn(send_cancel_to(addr, k)))
        .collect();
    let want = s(&["7", "1", "1", "1", "0"]);
    let seen = eventually(Duration::from_secs(2), || async {
        rows(&admin, "SHOW PEER_POOLS").await.contains(&want)
    })
    .await;
    let last = rows(&admin, "SHOW PEER_POOLS").await;
    assert!(seen, "SHOW PEER_POOLS never showed {want:?}: {last:?}");
    for t in senders {
        t.await.unwrap();
    }
    // Once the silent peer's 5 s wait and the waiter's 3 s timeout are over: all zero.
    wait_for("peer 7 idle", Duration::from_secs(10), || async {
        rows(&admin, "SHOW PEER_POOLS")
            .await
            .iter()
            .any(|r| r == &s(&["7", "0", "0", "0", "0"]))
    })
    .await;
    silent.abort();
    p.shutdown().await;
}

async fn send_cancel_to(addr: SocketAddr, key: (i32, i32)) {
    send_cancel(&addr.ip().to_string(), addr.port(), key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_named_by_one_dns_name_find_each_other() {
    let pg = TempPostgres::start();
    let hosts_dir = tempfile::tempdir().unwrap();
    let hosts = hosts_dir.path().join("hosts");
    // At first the name lists two of the three instances.
    std::fs::write(
        &hosts,
        "127.0.0.2 carpool.test\n127.0.0.3 carpool.test\n127.0.0.9 other.test\n",
    )
    .unwrap();
    let hosts_path = hosts.to_string_lossy().to_string();
    // The same settings everywhere except the address each listens on.
    let (fleet, port) = fleet(&pg, |b, _, port| {
        b.setting("peers_dns", &format!("carpool.test:{port}"))
            .setting("peers_hosts_file", &hosts_path)
            .setting("dns_max_ttl", "1")
    })
    .await;
    let id = |ip: &str| pgcarpool::peers::dns::id_of(ip.parse::<IpAddr>().unwrap());
    // Each instance derived its id from its address before taking clients: the very first
    // key it hands out carries it.
    for ip in IPS {
        let b = key_bytes(RawClient::connect(ip, port).await.key);
        assert_eq!(
            u16::from(b[1]) | (u16::from(b[2]) << 8),
            id(ip),
            "{ip}: {b:?}"
        );
    }
    let admin = harness::try_connect(&format!(
        "host={} port={port} user=postgres dbname=pgbouncer",
        IPS[0]
    ))
    .await
    .unwrap();
    let listed = |n: usize| {
        let admin = &admin;
        async move {
            let r = rows(admin, "SHOW PEERS").await;
            r.len() == n
        }
    };
    assert!(eventually(Duration::from_secs(5), || listed(2)).await);
    cancel_via(&pg, IPS[1], IPS[0], port).await;
    // The third joins the name: found within a re-resolution or two.
    std::fs::write(
        &hosts,
        "127.0.0.2 carpool.test\n127.0.0.3 carpool.test\n127.0.0.4 carpool.test\n",
    )
    .unwrap();
    wait_for("the third member", Duration::from_secs(5), || listed(3)).await;
    let r = rows(&admin, "SHOW PEERS").await;
    let mut want: Vec<Vec<String>> = IPS
        .iter()
        .map(|ip| {
            vec![
                id(ip).to_string(),
                ip.to_string(),
                port.to_string(),
                "20".into(),
            ]
        })
        .collect();
    want.sort_by_key(|r| r[0].parse::<u16>().unwrap());
    assert_eq!(r, want);
    wait_for(
        "peer 3 knows the others",
        Duration::from_secs(5),
        || async {
            let c = harness::try_connect(&format!(
                "host={} port={port} user=postgres dbname=pgbouncer",
                IPS[2]
            ))
            .await
            .unwrap();
            rows(&c, "SHOW PEERS").await.len() == 3
        },
    )
    .await;
    cancel_via(&pg, IPS[2], IPS[0], port).await;
    cancel_via(&pg, IPS[0], IPS[2], port).await;
    shutdown(fleet).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_members_whose_ids_collide_still_get_their_cancels() {
    let pg = TempPostgres::start();
    // 127.0.64.1 is 16383 addresses after 127.0.0.2: the same derived id.
    let ips = ["127.0.0.2", "127.0.64.1", "127.0.0.3"];
    let id = |ip: &str| pgcarpool::peers::dns::id_of(ip.parse::<IpAddr>().unwrap());
    assert_eq!(id(ips[0]), id(ips[1]));
    let hosts_dir = tempfile::tempdir().unwrap();
    let hosts = hosts_dir.path().join("hosts");
    let text: String = ips
        .iter()
        .map(|ip| format!("{ip} carpool.test\n"))
        .collect();
    std::fs::write(&hosts, text).unwrap();
    let hosts_path = hosts.to_string_lossy().to_string();
    let (fleet, port) = fleet_on(&pg, &ips, |b, _, port| {
        b.setting("peers_dns", &format!("carpool.test:{port}"))
            .setting("peers_hosts_file", &hosts_path)
    })
    .await;
    let admin = harness::try_connect(&format!(
        "host={} port={port} user=postgres dbname=pgbouncer",
        ips[2]
    ))
    .await
    .unwrap();
    let shared = vec![
        id(ips[0]).to_string(),
        format!("{},{}", ips[0], ips[1]),
        port.to_string(),
        "20".to_string(),
    ];
    let listed = rows(&admin, "SHOW PEERS").await;
    assert!(listed.contains(&shared), "{listed:?}");
    // From the third member, and between the two that share an id, both ways.
    for (owner, via) in [(1, 2), (0, 2), (0, 1), (1, 0)] {
        cancel_via(&pg, ips[owner], ips[via], port).await;
    }
    shutdown(fleet).await;
}
