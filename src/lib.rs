//! pgcarpool: a PostgreSQL connection pooler, a drop-in replacement for PgBouncer.
//!
//! ```text
//! app        composition root: Shared {config, pools, clients, stats}; listeners, janitor, shutdown
//! signals    HUP→RELOAD, TERM/INT/QUIT→shutdown, USR1/USR2→PAUSE/RESUME
//! config/    pgbouncer.ini: ini syntax, settings table, [databases]/[users], auth_file
//! proto/     pure wire format: startup packets, frontend and backend messages
//! net/       sockets: stream enum, buffered framing, listeners
//! auth/      md5, SCRAM-SHA-256 (server and client side)
//! client/    one task per client: startup, auth, the transaction loop, cancel, registry
//! pool/      pools per (db, user): idle list, FIFO waiters, limits; RAII checkout guard; janitor
//! server/    server connections: connect + login, response reactor, session sync and reset
//! admin/     the pgbouncer admin console
//! stats/     counters and snapshots
//! ```
pub mod admin;
pub mod app;
pub mod auth;
pub mod client;
pub mod config;
pub mod net;
pub mod pool;
pub mod proto;
pub mod server;
pub mod signals;
pub mod stats;
