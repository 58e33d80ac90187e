//! Peering (PgBouncer 1.19+): instances behind one load balancer pass each other the cancel
//! requests meant for the other's clients.
//!
//! key.rs: the cancel key layout (peer id, hop budget). dns.rs: peers found by one DNS name
//! and the address-derived instance id. This file: the peer table (`[peers]` entries and DNS
//! members), forwarding a cancel request over a bounded pool of connections per peer, and
//! SHOW PEERS / SHOW PEER_POOLS.
pub mod dns;
pub mod key;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;

use crate::config::Config;
use crate::lock::Locked;
use crate::server::ServerAddr;

/// One peer: where it listens and the cancel requests in flight to it.
pub struct PeerPool {
    pub peer_id: u16,
    /// Where to send its cancel requests: one address, or several when DNS members share
    /// an id (a collision: each gets the request, only the owner acts on it).
    pub addrs: Vec<ServerAddr>,
    /// As SHOW PEERS prints it.
    pub host: String,
    pub port: u16,
    pub pool_size: usize,
    /// Found by `peers_dns` (not a `[peers]` entry).
    from_dns: bool,
    slots: Arc<Semaphore>,
    /// Requests waiting for a free connection (cl_waiting_cancel_req).
    waiting: AtomicUsize,
    /// Requests forwarded, waiting for the peer to finish (cl_active_cancel_req).
    active: AtomicUsize,
    /// Connections forwarding a request (sv_active_cancel).
    sv_active: AtomicUsize,
    /// Connections being opened (sv_login).
    sv_login: AtomicUsize,
}

impl PeerPool {
    fn new(peer_id: u16, addrs: Vec<ServerAddr>, host: String, port: u16, size: usize) -> Self {
        PeerPool {
            peer_id,
            addrs,
            host,
            port,
            pool_size: size,
            from_dns: false,
            slots: Arc::new(Semaphore::new(size.max(1))),
            waiting: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            sv_active: AtomicUsize::new(0),
            sv_login: AtomicUsize::new(0),
        }
    }

    fn same_place(&self, other: &PeerPool) -> bool {
        self.addrs == other.addrs && self.pool_size == other.pool_size
    }

    /// (cl_active_cancel_req, cl_waiting_cancel_req, sv_active_cancel, sv_login).
    pub fn counts(&self) -> [usize; 4] {
        [
            self.active.load(Ordering::Relaxed),
            self.waiting.load(Ordering::Relaxed),
            self.sv_active.load(Ordering::Relaxed),
            self.sv_login.load(Ordering::Relaxed),
        ]
    }
}

/// Counts one in-flight step; undone when dropped (however the forward ends).
struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    fn new(c: &'a AtomicUsize) -> Self {
        c.fetch_add(1, Ordering::Relaxed);
        Counted(c)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// This instance's id and its peers.
#[derive(Default)]
pub struct Peers {
    /// `peer_id` from the config (0: none given).
    configured: AtomicU16,
    /// The id derived from this instance's address among the `peers_dns` members (0: none).
    derived: AtomicU16,
    /// This instance's address among the DNS members (None: not known, or no `peers_dns`).
    own_addr: Mutex<Option<SocketAddr>>,
    /// DNS members by derived id (empty without `peers_dns`).
    members: Mutex<BTreeMap<u16, Vec<SocketAddr>>>,
    table: Mutex<BTreeMap<u16, Arc<PeerPool>>>,
}

impl Peers {
    /// This instance's peer id: `peer_id` when set, else the one derived from `peers_dns`;
    /// 0 turns peering off (keys carry no id, nothing is forwarded).
    pub fn own_id(&self) -> u16 {
        match self.configured.load(Ordering::Relaxed) {
            0 => self.derived.load(Ordering::Relaxed),
            id => id,
        }
    }

    pub fn set_derived_id(&self, id: u16) {
        self.derived.store(id, Ordering::Relaxed);
    }

    /// The `peers_dns` members changed: rebuild the table.
    pub fn set_members(&self, cfg: &Config, members: BTreeMap<u16, Vec<SocketAddr>>) {
        *self.members.locked() = members;
        self.apply(cfg);
    }

    /// Rebuild the table from the config's `[peers]` and the DNS members. A peer whose
    /// address and size did not change keeps its pool (and the requests in flight on it).
    pub fn apply(&self, cfg: &Config) {
        let s = &cfg.settings;
        self.configured.store(s.peer_id, Ordering::Relaxed);
        let mut next: BTreeMap<u16, PeerPool> = BTreeMap::new();
        for p in cfg.peers.values() {
            let Some(host) = p.host.clone() else { continue };
            let size = p.pool_size.unwrap_or(s.default_pool_size);
            let addr = ServerAddr::new(Some(&host), p.port);
            next.insert(
                p.peer_id,
                PeerPool::new(p.peer_id, vec![addr], host, p.port, size),
            );
        }
        let members = self.members.locked();
        for (id, addrs) in members.iter() {
            if next.contains_key(id) || addrs.is_empty() {
                continue; // a [peers] entry names this id by hand: it wins
            }
            let host = addrs
                .iter()
                .map(|a| a.ip().to_string())
                .collect::<Vec<_>>()
                .join(",");
            let port = addrs[0].port();
            let servers = addrs
                .iter()
                .map(|a| ServerAddr::Tcp {
                    host: a.ip().to_string(),
                    port: a.port(),
                })
                .collect();
            let mut pool = PeerPool::new(*id, servers, host, port, s.default_pool_size);
            pool.from_dns = true;
            next.insert(*id, pool);
        }
        drop(members);
        let mut table = self.table.locked();
        let old = std::mem::take(&mut *table);
        for (id, p) in next {
            let keep = old.get(&id).filter(|o| o.same_place(&p)).cloned();
            table.insert(id, keep.unwrap_or_else(|| Arc::new(p)));
        }
    }

    pub fn all(&self) -> Vec<Arc<PeerPool>> {
        let table = self.table.locked();
        table.values().cloned().collect()
    }

    fn get(&self, id: u16) -> Option<Arc<PeerPool>> {
        let table = self.table.locked();
        table.get(&id).cloned()
    }

    /// Whether a key naming our own id that is not one of our clients' may belong to
    /// another DNS member with the same id (a collision).
    pub fn has_twins(&self, id: u16) -> bool {
        self.get(id)
            .is_some_and(|p| p.from_dns && p.addrs.len() > 1)
    }

    /// Forward a cancel request whose key names peer `id` (TTL already spent) over one of
    /// that peer's connections; waits at most `wait` for a free one. When several DNS
    /// members share the id, each gets it (this instance excepted). `rest`: the rest of a
    /// long (protocol 3.2) secret, passed on as it came.
    pub async fn forward(&self, id: u16, (k, rest): (key::Key, &[u8]), wait: Duration) {
        let Some(peer) = self.get(id) else {
            tracing::debug!("could not find peer {id} to forward a cancel request to");
            return;
        };
        let own = *self.own_addr.locked();
        let is_own = |a: &ServerAddr| match (a, own) {
            (ServerAddr::Tcp { host, port }, Some(o)) => {
                *port == o.port() && host.parse::<std::net::IpAddr>().ok() == Some(o.ip())
            }
            _ => false,
        };
        let wait = if wait.is_zero() {
            Duration::from_secs(10)
        } else {
            wait
        };
        let slot = {
            let _waiting = Counted::new(&peer.waiting);
            match tokio::time::timeout(wait, peer.slots.clone().acquire_owned()).await {
                Ok(Ok(slot)) => slot,
                _ => {
                    tracing::warn!("cancel request for peer {id} dropped: no free connection");
                    return;
                }
            }
        };
        let _active = Counted::new(&peer.active);
        tracing::debug!("forwarding cancellation request to peer {id}");
        for addr in peer.addrs.iter().filter(|a| !is_own(a)) {
            let _sv = Counted::new(&peer.sv_active);
            let connected = {
                let _login = Counted::new(&peer.sv_login);
                tokio::time::timeout(wait, addr.connect()).await
            };
            let sent = match connected {
                Ok(Ok(stream)) => crate::server::connect::send_cancel_over(stream, k, rest).await,
                Ok(Err(e)) => Err(e),
                Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
            };
            if let Err(e) = sent {
                tracing::warn!("could not forward cancel request to peer {id} at {addr}: {e}");
            }
        }
        drop(slot);
    }
}

/// Resolve `peers_dns` once (off the reactor) and apply what changed since `last`; derive
/// this instance's id once its address is known. Without `peers_dns`: forget the members.
/// True when the members were set anew (this instance's id may have changed: the client
/// registry's keys must name it).
pub async fn refresh(peers: &Peers, cfg: &Config, last: &mut Option<Vec<SocketAddr>>) -> bool {
    let s = &cfg.settings;
    if s.peers_dns.is_empty() {
        if last.take().is_some() {
            peers.set_derived_id(0);
            *peers.own_addr.locked() = None;
            peers.set_members(cfg, BTreeMap::new());
            return true;
        }
        return false;
    }
    let Ok(target) = dns::parse_target(&s.peers_dns) else {
        return false; // checked when the config was loaded
    };
    let port = s.listen_port;
    let hosts =
        (!s.peers_hosts_file.is_empty()).then(|| std::path::PathBuf::from(&s.peers_hosts_file));
    let t = target.clone();
    let found = tokio::task::spawn_blocking(move || dns::resolve(&t, port, hosts.as_deref()))
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
    let addrs = match found {
        Err(e) => {
            tracing::warn!("peers_dns: cannot resolve {}: {e}", target.name);
            return false;
        }
        Ok(addrs) if last.as_ref() == Some(&addrs) => return false,
        Ok(addrs) => addrs,
    };
    if peers.derived.load(Ordering::Relaxed) == 0 {
        match dns::own_address(&s.listen_addr, &addrs) {
            Some(ip) => {
                let id = dns::id_of(ip);
                tracing::info!("peers_dns: this instance is peer {id} ({ip})");
                peers.set_derived_id(id);
                let own_port = target.port.unwrap_or(port);
                *peers.own_addr.locked() = Some(SocketAddr::new(ip, own_port));
            }
            None => tracing::warn!(
                "peers_dns: cannot tell which member is this instance \
                 (set listen_addr to its address, or peer_id)"
            ),
        }
    }
    let derived = peers.derived.load(Ordering::Relaxed);
    if s.peer_id > 0 && derived != 0 && derived != s.peer_id {
        tracing::warn!(
            "peers_dns: peer_id = {} differs from the id {derived} the other members derive \
             for this instance; their cancel requests for its clients go astray",
            s.peer_id
        );
    }
    tracing::info!("peers_dns: {} members: {addrs:?}", addrs.len());
    peers.set_members(cfg, dns::members(&addrs));
    *last = Some(addrs);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Config {
        Config::from_str(text, "pgbouncer.ini", std::path::Path::new("/tmp")).unwrap()
    }

    #[test]
    fn the_table_holds_the_peers_section_and_the_dns_members() {
        let c = cfg(
            "[databases]\n[pgbouncer]\npeer_id = 2\ndefault_pool_size = 7\n\
                     [peers]\n1 = host=10.0.0.1\n3 = host=/tmp/p3 port=7000 pool_size=2\n",
        );
        let p = Peers::default();
        p.apply(&c);
        assert_eq!(p.own_id(), 2);
        let rows: Vec<_> = p
            .all()
            .iter()
            .map(|x| (x.peer_id, x.host.clone(), x.port, x.pool_size))
            .collect();
        assert_eq!(
            rows,
            vec![
                (1, "10.0.0.1".to_string(), 6432, 7),
                (3, "/tmp/p3".to_string(), 7000, 2)
            ]
        );
        // DNS members: an id named by [peers] keeps its entry; the others join.
        let a: SocketAddr = "10.1.0.5:6432".parse().unwrap();
        let b: SocketAddr = "10.1.0.6:6432".parse().unwrap();
        let mut m = dns::members(&[a, b]);
        m.insert(3, vec!["10.9.9.9:6432".parse().unwrap()]);
        let kept = p.get(1).unwrap();
        p.set_members(&c, m);
        assert!(
            Arc::ptr_eq(&kept, &p.get(1).unwrap()),
            "an unchanged peer keeps its pool"
        );
        assert_eq!(p.get(3).unwrap().host, "/tmp/p3");
        let member = p.get(dns::id_of(a.ip())).unwrap();
        assert_eq!((member.host.as_str(), member.pool_size), ("10.1.0.5", 7));
        assert!(member.from_dns && !p.has_twins(member.peer_id));
        // peer_id 0 and no derived id: peering off.
        let off = cfg("[databases]\n[pgbouncer]\n");
        p.apply(&off);
        assert_eq!(p.own_id(), 0);
        p.set_derived_id(dns::id_of(a.ip()));
        assert_eq!(p.own_id(), dns::id_of(a.ip()));
    }
}
