//! Network namespaces for the network-fault tests: a namespace of the test's own, joined to
//! the root namespace by a veth pair whose two ends have the only addresses of a private
//! /30 (10.213.0.0/16), and iptables rules inside that namespace that drop its traffic.
//! PostgreSQL runs inside (`TempPostgres::start_in`); pgcarpool, in the root namespace,
//! reaches it over the veth, so a rule in the namespace cuts that path and nothing else.
//! Needs root, iproute2 and iptables. Names are unique per process and namespace
//! (`pgc<pid>n<k>`); deleting the namespace on drop removes the veth pair with it.
use super::in_ci;
use std::net::{Ipv4Addr, TcpListener};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

/// Namespaces made by this process so far (for unique names and subnets).
static MADE: AtomicU32 = AtomicU32::new(0);

/// /30 subnets in 10.213.0.0/16.
const SUBNETS: u32 = 1 << 14;

pub struct NetNs {
    name: String,
    /// The veth end inside the namespace.
    ns_if: String,
    /// The veth end in the root namespace (pgcarpool's side).
    pub host_addr: Ipv4Addr,
    /// The address inside the namespace (PostgreSQL's side).
    pub ns_addr: Ipv4Addr,
}

impl NetNs {
    /// A new namespace joined by a veth pair, or why it cannot be made (not root, no
    /// iproute2, no namespaces in this container).
    pub fn create() -> Result<NetNs, String> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err("network namespaces need root".into());
        }
        let k = MADE.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        let name = format!("pgc{pid}n{k}");
        let (host_if, ns_if) = (format!("{name}h"), format!("{name}p"));
        let (host_addr, ns_addr) = free_subnet(pid, k)?;
        run(&["ip", "netns", "add", &name])?;
        // From here on, Drop deletes the namespace (and the veth with it).
        let ns = NetNs {
            name,
            ns_if,
            host_addr,
            ns_addr,
        };
        let host = format!("{host_addr}/30");
        let inner = format!("{ns_addr}/30");
        run(&[
            "ip", "link", "add", &host_if, "type", "veth", "peer", "name", &ns.ns_if,
        ])?;
        run(&["ip", "link", "set", &ns.ns_if, "netns", &ns.name])?;
        run(&["ip", "addr", "add", &host, "dev", &host_if])?;
        run(&["ip", "link", "set", &host_if, "up"])?;
        ns.run_in(&["ip", "addr", "add", &inner, "dev", &ns.ns_if])?;
        ns.run_in(&["ip", "link", "set", &ns.ns_if, "up"])?;
        ns.run_in(&["ip", "link", "set", "lo", "up"])?;
        ns.run_in(&["iptables", "-w", "-S"])?;
        Ok(ns)
    }

    /// `create`, or None with a note on stderr when it cannot be made outside CI. In CI
    /// (`CI` set, not to `false` or `0`) it panics: these tests must not pass by skipping.
    pub fn for_test(test: &str) -> Option<NetNs> {
        match NetNs::create() {
            Ok(ns) => Some(ns),
            Err(e) if in_ci() => {
                panic!("{test}: cannot make a network namespace in CI: {e}")
            }
            Err(e) => {
                eprintln!("SKIPPED {test}: cannot make a network namespace: {e}");
                None
            }
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The subnet both veth ends are in (for pg_hba.conf).
    pub fn subnet(&self) -> String {
        let [a, b, c, d] = self.ns_addr.octets();
        format!("{a}.{b}.{c}.{}/30", d & !3)
    }

    /// `ip netns exec <name>`, to which a command's program and arguments are added.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name]);
        cmd
    }

    /// Run `args` inside the namespace.
    fn run_in(&self, args: &[&str]) -> Result<Output, String> {
        let mut all = vec!["ip", "netns", "exec", &self.name];
        all.extend_from_slice(args);
        run(&all)
    }

    fn iptables(&self, args: &[&str]) {
        let mut all = vec!["iptables", "-w"];
        all.extend_from_slice(args);
        self.run_in(&all).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Drop every packet in and out of the namespace's veth (a cable cut: nothing is
    /// refused, everything is lost; connections open and new ones alike).
    pub fn drop_all(&self) {
        self.iptables(&["-A", "INPUT", "-i", &self.ns_if, "-j", "DROP"]);
        self.iptables(&["-A", "OUTPUT", "-o", &self.ns_if, "-j", "DROP"]);
    }

    /// Drop every TCP segment that carries data (PSH), both ways: new connections are
    /// accepted (the handshake has no data), then nothing either side says arrives — a
    /// login that starts and hangs.
    pub fn drop_data(&self) {
        let psh = ["--tcp-flags", "PSH", "PSH", "-j", "DROP"];
        let mut input = vec!["-A", "INPUT", "-i", &self.ns_if, "-p", "tcp"];
        input.extend_from_slice(&psh);
        self.iptables(&input);
        let mut output = vec!["-A", "OUTPUT", "-o", &self.ns_if, "-p", "tcp"];
        output.extend_from_slice(&psh);
        self.iptables(&output);
    }

    /// Remove every rule: packets flow again (TCP retransmits what was dropped).
    pub fn restore(&self) {
        self.iptables(&["-F", "INPUT"]);
        self.iptables(&["-F", "OUTPUT"]);
    }

    /// A listening socket inside the namespace, on `ns_addr` and a port of the kernel's
    /// choosing, that is never accepted from: the kernel completes every handshake and
    /// takes the bytes sent, and nothing is ever answered.
    pub fn silent_listener(&self) -> TcpListener {
        let path = format!("/run/netns/{}", self.name);
        let addr = self.ns_addr;
        // A thread of its own enters the namespace (setns changes the calling thread
        // only); the socket stays in the namespace it was made in.
        std::thread::spawn(move || {
            let f = std::fs::File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
            use std::os::fd::AsRawFd;
            // SAFETY: setns on an open namespace file, for this thread only.
            let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(r, 0, "setns {path}: {}", std::io::Error::last_os_error());
            TcpListener::bind((addr, 0)).expect("bind inside the namespace")
        })
        .join()
        .expect("the setns thread")
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        if let Err(e) = run(&["ip", "netns", "del", &self.name]) {
            eprintln!("{e}");
        }
    }
}

/// A /30 of 10.213.0.0/16 no interface of the root namespace has an address in (the
/// root side .1, the namespace side .2), chosen from `pid` and `k`.
fn free_subnet(pid: u32, k: u32) -> Result<(Ipv4Addr, Ipv4Addr), String> {
    let out = run(&["ip", "-o", "-4", "addr", "show"])?;
    let taken = String::from_utf8_lossy(&out.stdout).into_owned();
    for attempt in 0..64u32 {
        let i = (pid
            .wrapping_mul(64)
            .wrapping_add(k)
            .wrapping_add(attempt * 977))
            % SUBNETS;
        let base = u32::from(Ipv4Addr::new(10, 213, 0, 0)) + i * 4;
        let (host, inner) = (Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2));
        let clash = taken.lines().any(|l| {
            l.split_whitespace()
                .skip_while(|w| *w != "inet")
                .nth(1)
                .and_then(|a| a.split_once('/'))
                .and_then(|(a, _)| a.parse::<Ipv4Addr>().ok())
                .is_some_and(|a| u32::from(a) & !3 == base)
        });
        if !clash {
            return Ok((host, inner));
        }
    }
    Err("no free /30 in 10.213.0.0/16".into())
}

/// Run a command; its output, or what went wrong (with its stderr).
fn run(args: &[&str]) -> Result<Output, String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "`{}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(out)
}
