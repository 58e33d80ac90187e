//! pgcarpool: a PostgreSQL connection pooler, a drop-in replacement for PgBouncer.
//!
//! ```text
//! cli        the command line (clap), PgBouncer's flags, the PgBouncer version matched
//! app        composition root: Shared {config, pools, clients, statements, admin}; start, reload, shutdowns
//! lock       the one way to take a Mutex (a panicked holder does not poison it)
//! logging    stderr, logfile (reopened on reload), syslog
//! service    systemd: sd_notify readiness, socket activation
//! signals    HUP→RELOAD, TERM/INT/QUIT→shutdown, USR1/USR2→PAUSE/RESUME
//!
//! Floors, lowest first: lock, proto, config, net, stats import nothing above them (scripts/layers
//! checks it, and that no import closes a cycle between top-level modules but the knot
//! still left around app::Shared: admin, app, client, takeover).
//!
//! config/    pgbouncer.ini: ini.rs syntax, settings.rs (one table), databases.rs, auth_file.rs,
//!            hba.rs (auth_hba_file rules), ident.rs (auth_ident_file maps), names.rs (the
//!            console database, syslog facilities, the peers_dns target)
//! proto/     pure wire format: startup.rs, frontend.rs, backend.rs
//! net/       stream.rs (Tcp|Unix|TLS either way), conn.rs (framing, zero-copy output queue),
//!            listen.rs (binding, accepting), sockopt.rs (tcp_* settings on sockets),
//!            fdpass.rs (descriptors over a Unix socket, SCM_RIGHTS), tls/
//!            (client_tls_*/server_tls_* → rustls acceptor and connector, verify.rs
//!            certificate checks, channel binding hash, session description)
//! auth/      md5.rs, scram.rs (server and client side, -PLUS channel binding),
//!            cache.rs (PBKDF2 off the reactor, memoised), peer.rs (OS user of a Unix peer),
//!            cert.rs (client certificate name), dynamic.rs (the secrets auth_query found,
//!            kept auth_query_cache_ttl)
//! sql/       classify.rs: the SQL classifier (leading keywords, internal statement names)
//! statements the process-wide statement registry (below client/ and server/)
//! client/    one task per client: accept.rs (the accept policy: max_client_conn, placement
//!            on workers, SUSPEND and handover, draining a closing listener),
//!            startup.rs (first packets, auth), auth_query.rs (a user's secret asked of
//!            PostgreSQL over the auth user's pool), transaction.rs (the loop), relay.rs (forwarding
//!            both ways while a server is held), rewrite.rs (virtual statements on the relay),
//!            renamed.rs (server errors given back the client's names and positions),
//!            session.rs (the virtual session), aborted.rs (the failed block a client is
//!            left in when its server is lost mid-transaction: 40001/08007, 25P02, ROLLBACK),
//!            notify.rs (LISTEN/UNLISTEN answered from the
//!            virtual session, notifications delivered between transactions),
//!            cancel.rs, registry.rs (SHOW CLIENTS, KILL),
//!            logins.rs (connections still logging in; the oldest makes room), counts.rs
//!            (clients per database and user), replication.rs (replication pass-through)
//! pool/      pool.rs (idle list, FIFO waiters, limits, pause; Pool::change_state moves a
//!            server between the states of state.rs, counted for SHOW POOLS), login.rs
//!            (server login failures and retry backoff), guard.rs (RAII checkout, cleanup
//!            of dirty servers), janitor.rs (lifetimes, min_pool_size, shared limits,
//!            stats_period averages), listener.rs (one shared LISTEN connection per pool,
//!            fan-out to clients' bounded inboxes)
//! server/    connect.rs (connect + login, host lists, role checks), roles.rs (each host's
//!            role, target_session_attrs, fencing), query.rs (pgcarpool's own queries),
//!            exchange.rs (the server's half of the relay, one ledger: what it owes for
//!            what was sent, its transaction status, the statements it holds; written by
//!            what is sent and by `receive`, asked by the rest), response.rs (the replies
//!            owed in order; each forwarded, swallowed or replaced; probes), prepared.rs
//!            (the statements a server holds, preparing them),
//!            sync.rs (apply a session at checkout, read it back, pins, cleanup, reset)
//! takeover/  online restart (`-R`) and sessions that move to the new process: mod.rs
//!            (SUSPEND / HANDOVER phase), outgoing.rs (old process: SHOW FDS passes the
//!            sockets, HANDOVER sends idle clients), incoming.rs (new process: takes the
//!            sockets over the console, runs the clients sent), session.rs (versioned
//!            wire form of a session)
//! admin/     command.rs (enum of commands), show.rs (one fn per view → Table), table.rs,
//!            metrics.rs (the same counters for Prometheus, /metrics)
//! peers/     peering: key.rs (cancel keys naming their instance), dns.rs (peers by one DNS
//!            name, ids from addresses), mod.rs (peer table, forwarding cancels, SHOW PEERS)
//! workers    thread per core: one single-threaded runtime per worker, placement of clients
//! stats/     per-pool atomics and stats_period averages, histogram.rs
//! fuzz       fuzz target bodies (cargo-fuzz in fuzz/, bounded runs in tests/fuzz_smoke.rs)
//! ```
pub mod admin;
pub mod app;
pub mod auth;
pub mod cli;
pub mod client;
pub mod config;
pub mod fuzz;
pub mod lock;
pub mod logging;
pub mod net;
pub mod peers;
pub mod pool;
pub mod proto;
pub mod server;
pub mod service;
pub mod signals;
pub mod sql;
pub mod statements;
pub mod stats;
pub mod takeover;
pub mod workers;
