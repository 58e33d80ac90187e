//! Peers found by one DNS name (`peers_dns`): every A/AAAA record is an instance, re-resolved
//! every `dns_max_ttl`; each instance's peer id is derived from its address, so identical
//! configs need no per-instance id.
//!
//! The id of address A is `A mod 16383 + 1` (IPv4 as a 32-bit number, IPv6 as 128-bit;
//! IPv4-mapped IPv6 as IPv4): every instance computes every member's id the same way, and
//! any 16383 consecutive addresses (a /18 subnet) get distinct ids. Members whose ids
//! collide share one peer entry: a cancel for that id goes to each of them and only the
//! owner of the key acts on it.
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::path::Path;

use super::key::MAX_PEER_ID;
pub use crate::config::names::{Target, parse_target};

/// The largest hosts file read (a longer one is an error, not a partial read).
const MAX_HOSTS_FILE: u64 = 1 << 20;

/// The peer id of an address (1..=16383).
pub fn id_of(ip: IpAddr) -> u16 {
    let n: u128 = match ip {
        IpAddr::V4(v4) => u32::from(v4).into(),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => u32::from(v4).into(),
            None => u128::from(v6),
        },
    };
    // < 16383, so the cast cannot truncate.
    (n % u128::from(MAX_PEER_ID)) as u16 + 1
}

/// Members by id (sorted, deduplicated addresses).
pub fn members(addrs: &[SocketAddr]) -> BTreeMap<u16, Vec<SocketAddr>> {
    let mut m: BTreeMap<u16, Vec<SocketAddr>> = BTreeMap::new();
    for a in addrs {
        let v = m.entry(id_of(a.ip())).or_default();
        if !v.contains(a) {
            v.push(*a);
            v.sort();
        }
    }
    m
}

/// Resolve the name: from `hosts_file` (hosts(5) format) when given, else the system
/// resolver (all A and AAAA records). Blocking: call off the reactor.
pub fn resolve(
    t: &Target,
    port: u16,
    hosts_file: Option<&Path>,
) -> std::io::Result<Vec<SocketAddr>> {
    let port = t.port.unwrap_or(port);
    let mut out: Vec<SocketAddr> = match hosts_file {
        Some(path) => {
            let f = std::fs::File::open(path)?;
            if f.metadata()?.len() > MAX_HOSTS_FILE {
                return Err(std::io::Error::other(format!(
                    "{} is larger than {MAX_HOSTS_FILE} bytes",
                    path.display()
                )));
            }
            hosts_lookup(BufReader::new(f.take(MAX_HOSTS_FILE)), &t.name)?
                .into_iter()
                .map(|ip| SocketAddr::new(ip, port))
                .collect()
        }
        None => (t.name.as_str(), port).to_socket_addrs()?.collect(),
    };
    out.sort();
    out.dedup();
    Ok(out)
}

/// The addresses a hosts(5) file gives `name` (case-insensitive; comments and bad lines skipped).
pub fn hosts_lookup(r: impl BufRead, name: &str) -> std::io::Result<Vec<IpAddr>> {
    let mut ips = Vec::new();
    for line in r.lines() {
        let line = line?;
        let line = line.split('#').next().unwrap_or("");
        let mut fields = line.split_whitespace();
        let Some(Ok(ip)) = fields.next().map(str::parse::<IpAddr>) else {
            continue;
        };
        if fields.any(|n| n.eq_ignore_ascii_case(name)) && !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    Ok(ips)
}

/// This instance's address among the members: a concrete `listen_addr` that is one of
/// them; with a wildcard listen address, the one non-loopback member that is an address
/// of this host (a socket can be bound to it). None when it cannot be told.
pub fn own_address(listen_addr: &str, resolved: &[SocketAddr]) -> Option<IpAddr> {
    let listed: Vec<IpAddr> = listen_addr
        .split(',')
        .filter_map(|a| a.trim().parse::<IpAddr>().ok())
        .filter(|ip| !ip.is_unspecified())
        .collect();
    if !listed.is_empty() {
        return listed
            .iter()
            .find(|ip| resolved.iter().any(|r| r.ip() == **ip))
            .or(listed.first())
            .copied();
    }
    let local: Vec<IpAddr> = resolved
        .iter()
        .map(SocketAddr::ip)
        .filter(|ip| !ip.is_loopback())
        .filter(|ip| UdpSocket::bind(SocketAddr::new(*ip, 0)).is_ok())
        .collect();
    match local.as_slice() {
        [one] => Some(*one),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_with_and_without_a_port() {
        let t = |n: &str, p| Target {
            name: n.into(),
            port: p,
        };
        assert_eq!(
            parse_target("pgcarpool.svc:6432"),
            Ok(t("pgcarpool.svc", Some(6432)))
        );
        assert_eq!(parse_target(" peers "), Ok(t("peers", None)));
        assert_eq!(parse_target("[::1]:7000"), Ok(t("::1", Some(7000))));
        assert_eq!(parse_target("fe80::1"), Ok(t("fe80::1", None)));
        for bad in ["", "a:0", "a:x", "a b", "[::1", "[::1]x", ":5"] {
            assert!(parse_target(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ids_are_distinct_within_a_subnet_and_in_range() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(id_of(ip("127.0.0.2")), id_of(ip("::ffff:127.0.0.2")));
        let base = u32::from("10.244.0.0".parse::<std::net::Ipv4Addr>().unwrap());
        let mut seen = std::collections::HashSet::new();
        for i in 0..16383u32 {
            let id = id_of(IpAddr::V4((base + i).into()));
            assert!((1..=MAX_PEER_ID).contains(&id));
            assert!(seen.insert(id), "collision at +{i}");
        }
        // 16383 apart: the same id (a collision, handled by sending to both).
        assert_eq!(
            id_of(IpAddr::V4(base.into())),
            id_of(IpAddr::V4((base + 16383).into()))
        );
    }

    #[test]
    fn colliding_members_share_an_id() {
        let a: SocketAddr = "10.0.0.1:6432".parse().unwrap();
        let b = SocketAddr::new(
            IpAddr::V4((u32::from(std::net::Ipv4Addr::new(10, 0, 0, 1)) + 16383).into()),
            6432,
        );
        let c: SocketAddr = "10.0.0.2:6432".parse().unwrap();
        let m = members(&[b, a, c, a]);
        assert_eq!(m.len(), 2);
        assert_eq!(m[&id_of(a.ip())], vec![a, b]);
    }

    #[test]
    fn hosts_files_give_every_address_of_a_name() {
        let text = "# test\n127.0.0.2 peers other\n127.0.0.3\tPEERS\nbad line peers\n\
                    127.0.0.4 peers # comment\n127.0.0.5 notpeers\n::1 peers\n127.0.0.2 peers\n";
        let ips = hosts_lookup(text.as_bytes(), "peers").unwrap();
        let want: Vec<IpAddr> = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "::1"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(ips, want);
    }

    #[test]
    fn resolve_reads_a_hosts_file_and_refuses_an_oversized_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hosts");
        std::fs::write(&path, "127.0.0.3 peers\n127.0.0.2 peers\n").unwrap();
        let t = parse_target("peers").unwrap();
        let got = resolve(&t, 7000, Some(&path)).unwrap();
        let want: Vec<SocketAddr> = ["127.0.0.2:7000", "127.0.0.3:7000"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(got, want);
        std::fs::write(&path, vec![b'#'; MAX_HOSTS_FILE as usize + 1]).unwrap();
        assert!(resolve(&t, 7000, Some(&path)).is_err());
        assert!(resolve(&t, 7000, Some(&dir.path().join("missing"))).is_err());
    }

    #[test]
    fn own_address_is_the_listen_address_when_concrete() {
        let r: Vec<SocketAddr> = ["127.0.0.2:1", "127.0.0.3:1"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        assert_eq!(own_address("127.0.0.3", &r), ip("127.0.0.3"));
        assert_eq!(own_address("127.0.0.9,127.0.0.2", &r), ip("127.0.0.2"));
        assert_eq!(own_address("127.0.0.9", &r), ip("127.0.0.9"));
        // Loopback members cannot be told apart from a wildcard listener.
        assert_eq!(own_address("*", &r), None);
        assert_eq!(own_address("0.0.0.0", &r), None);
    }
}
