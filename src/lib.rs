//! pgcarpool: a PostgreSQL connection pooler, a drop-in replacement for PgBouncer.
//!
//! ```text
//! cli        the command line (clap), PgBouncer's flags
//! app        composition root: Shared {config, pools, clients, statements, admin}; start, reload, shutdowns
//! logging    stderr, logfile (reopened on reload), syslog
//! service    systemd: sd_notify readiness, socket activation
//! signals    HUP→RELOAD, TERM/INT/QUIT→shutdown, USR1/USR2→PAUSE/RESUME
//! config/    pgbouncer.ini: ini.rs syntax, settings.rs (one table), databases.rs, auth_file.rs
//! proto/     pure wire format: startup.rs, frontend.rs, backend.rs
//! net/       stream.rs (Tcp|Unix|TLS either way), conn.rs (framing, zero-copy output queue),
//!            listen.rs, tls/ (client_tls_*/server_tls_* → rustls acceptor and connector,
//!            verify.rs certificate checks, channel binding hash, session description)
//! auth/      md5.rs, scram.rs (server and client side, -PLUS channel binding),
//!            cache.rs (PBKDF2 off the reactor, memoised)
//! client/    one task per client:
//!            startup.rs (first packets, auth), transaction.rs (the loop), relay.rs (forwarding
//!            both ways while a server is held), rewrite.rs (virtual statements on the relay),
//!            prepared.rs (statement registry), classify.rs (leading keywords),
//!            session.rs (the virtual session), cancel.rs, registry.rs (SHOW CLIENTS, KILL),
//!            logins.rs (connections still logging in; the oldest makes room), counts.rs
//!            (clients per database and user), replication.rs (replication pass-through)
//! pool/      pool.rs (idle list, FIFO waiters, limits, pause), login.rs (server login
//!            failures and retry backoff), guard.rs (RAII checkout, cleanup of dirty
//!            servers), janitor.rs (lifetimes, min_pool_size, shared limits)
//! server/    connect.rs (connect + login, host lists), query.rs (pgcarpool's own queries),
//!            response.rs (what the server owes; each reply forwarded, swallowed or replaced;
//!            probes), prepared.rs (the statements a server holds, preparing them),
//!            sync.rs (apply a session at checkout, read it back, pins, cleanup, reset)
//! admin/     command.rs (enum of commands), show.rs (one fn per view → Table), table.rs
//! workers    thread per core: one single-threaded runtime per worker, placement of clients
//! stats/     per-pool atomics and stats_period averages, histogram.rs, metrics.rs (/metrics)
//! ```
pub mod admin;
pub mod app;
pub mod auth;
pub mod cli;
pub mod client;
pub mod config;
pub mod logging;
pub mod net;
pub mod pool;
pub mod proto;
pub mod server;
pub mod service;
pub mod signals;
pub mod stats;
pub mod workers;
