//! pgcarpool: a PostgreSQL connection pooler, a drop-in replacement for PgBouncer.
//!
//! ```text
//! cli        the command line (clap), PgBouncer's flags
//! app        composition root: Shared {config, pools, clients, statements, admin}; start, reload, shutdowns
//! logging    stderr, logfile (reopened on reload), syslog
//! service    systemd: sd_notify readiness, socket activation
//! signals    HUP→RELOAD, TERM/INT/QUIT→shutdown, USR1/USR2→PAUSE/RESUME
//! config/    pgbouncer.ini: ini.rs syntax, settings.rs (one table), databases.rs, auth_file.rs,
//!            hba.rs (auth_hba_file rules), ident.rs (auth_ident_file maps)
//! proto/     pure wire format: startup.rs, frontend.rs, backend.rs
//! net/       stream.rs (Tcp|Unix|TLS either way), conn.rs (framing, zero-copy output queue),
//!            listen.rs, sockopt.rs (tcp_* settings on sockets), fdpass.rs (descriptors over
//!            a Unix socket, SCM_RIGHTS), tls/
//!            (client_tls_*/server_tls_* → rustls acceptor and connector, verify.rs
//!            certificate checks, channel binding hash, session description)
//! auth/      md5.rs, scram.rs (server and client side, -PLUS channel binding),
//!            cache.rs (PBKDF2 off the reactor, memoised), peer.rs (OS user of a Unix peer),
//!            cert.rs (client certificate name), dynamic.rs (the secrets auth_query found,
//!            kept auth_query_cache_ttl)
//! client/    one task per client:
//!            startup.rs (first packets, auth), auth_query.rs (a user's secret asked of
//!            PostgreSQL over the auth user's pool), transaction.rs (the loop), relay.rs (forwarding
//!            both ways while a server is held), rewrite.rs (virtual statements on the relay),
//!            renamed.rs (server errors given back the client's names and positions),
//!            prepared.rs (statement registry), classify.rs (leading keywords),
//!            session.rs (the virtual session), aborted.rs (the failed block a client is
//!            left in when its server is lost mid-transaction: 40001/08007, 25P02, ROLLBACK),
//!            notify.rs (LISTEN/UNLISTEN answered from the
//!            virtual session, notifications delivered between transactions),
//!            cancel.rs, registry.rs (SHOW CLIENTS, KILL),
//!            logins.rs (connections still logging in; the oldest makes room), counts.rs
//!            (clients per database and user), replication.rs (replication pass-through)
//! pool/      pool.rs (idle list, FIFO waiters, limits, pause), login.rs (server login
//!            failures and retry backoff), guard.rs (RAII checkout, cleanup of dirty
//!            servers), janitor.rs (lifetimes, min_pool_size, shared limits), listener.rs
//!            (one shared LISTEN connection per pool, fan-out to clients' bounded inboxes)
//! server/    connect.rs (connect + login, host lists, role checks), roles.rs (each host's
//!            role, target_session_attrs, fencing), query.rs (pgcarpool's own queries),
//!            response.rs (what the server owes; each reply forwarded, swallowed or replaced;
//!            probes), prepared.rs (the statements a server holds, preparing them),
//!            sync.rs (apply a session at checkout, read it back, pins, cleanup, reset)
//! takeover/  online restart (`-R`) and sessions that move to the new process: mod.rs
//!            (SUSPEND / HANDOVER phase), outgoing.rs (old process: SHOW FDS passes the
//!            sockets, HANDOVER sends idle clients), incoming.rs (new process: takes the
//!            sockets over the console, runs the clients sent), session.rs (versioned
//!            wire form of a session)
//! admin/     command.rs (enum of commands), show.rs (one fn per view → Table), table.rs
//! peers/     peering: key.rs (cancel keys naming their instance), dns.rs (peers by one DNS
//!            name, ids from addresses), mod.rs (peer table, forwarding cancels, SHOW PEERS)
//! workers    thread per core: one single-threaded runtime per worker, placement of clients
//! stats/     per-pool atomics and stats_period averages, histogram.rs, metrics.rs (/metrics)
//! fuzz       fuzz target bodies (cargo-fuzz in fuzz/, bounded runs in tests/fuzz_smoke.rs)
//! ```
pub mod admin;
pub mod app;
pub mod auth;
pub mod cli;
pub mod client;
pub mod config;
pub mod fuzz;
pub mod logging;
pub mod net;
pub mod peers;
pub mod pool;
pub mod proto;
pub mod server;
pub mod service;
pub mod signals;
pub mod stats;
pub mod takeover;
pub mod workers;
