//! pgcarpool: a PostgreSQL connection pooler, a drop-in replacement for PgBouncer.
//!
//! ```text
//! Floors, lowest first: a module imports only from floors below its own, and within
//! floors 0 and 1 only along the arrows below. `scripts/layers` (run by scripts/test) fails
//! on any import cycle between top-level modules and on an import from lock, proto,
//! config, net or stats up to a higher module.
//!
//! 6 entry     main (the binary), app, accept, signals
//! 5 console   admin
//! 4 restart   takeover
//! 3 sessions  client
//! 2 state     shared
//! 1 engines   pool, peers, server, auth, statements, sql, workers, logging, service, cli, fuzz
//! 0 floors    lock < proto < config < net < stats
//!
//! Who imports whom above floor 0 (`scripts/layers --graph`; every arrow points down):
//!   app        → accept, admin, shared, pool, net, config, workers
//!   accept     → admin, takeover, client, shared, net, proto, workers
//!   signals    → shared
//!   admin      → takeover, client, shared, pool, peers, server, cli, stats, net, proto, config
//!   takeover   → client, shared, server, service, workers, net, config
//!   client     → shared, pool, peers, server, auth, statements, sql, logging, stats, net,
//!                proto, config
//!   shared     → pool, peers, server, auth, statements, workers, logging, service, net,
//!                config, lock
//!   pool       → server, workers, logging, stats, net, proto, config, lock
//!   peers      → server, config, lock
//!   server     → auth, statements, sql, workers, logging, net, proto, config, lock
//!   auth       → net, config, lock;   statements → sql, proto, lock;   logging → config, lock
//!   fuzz       → auth, sql, proto, config;   cli, sql, service, workers: nothing
//!
//! cli        the command line (clap), PgBouncer's flags, the PgBouncer version matched
//! app        composition root: makes `Shared`, binds the listeners and starts an accept loop
//!            per worker and listener, the janitor, DNS refresh, /metrics; AppHandle
//! accept     the accept policy: max_client_conn (the oldest login makes room), placement on
//!            workers, SUSPEND and handover, draining a closing listener; each connection
//!            logs in (client::arrive) and is served as a pool client (takeover::serve)
//!            or a console session (admin::serve)
//! signals    HUP→RELOAD, TERM/INT/QUIT→shutdown, USR1/USR2→PAUSE/RESUME (shared's operations)
//! lock       the one way to take a Mutex (a panicked holder does not poison it)
//! logging    stderr, logfile (reopened on reload), syslog
//! service    systemd: sd_notify readiness, socket activation
//! workers    thread per core: one single-threaded runtime per worker; clients placed on and
//!            moved to the fewest workers their load needs (worker_spread_load)
//!
//! config/    pgbouncer.ini: ini.rs syntax, settings.rs (one table), databases.rs, auth_file.rs,
//!            hba.rs (auth_hba_file rules), ident.rs (auth_ident_file maps), names.rs (the
//!            console database, syslog facilities, the peers_dns target)
//! proto/     pure wire format: startup.rs, frontend.rs, backend.rs
//! net/       stream.rs (Tcp|Unix|TLS either way), conn.rs (framing, zero-copy output queue),
//!            listen.rs (binding, accepting: no policy), sockopt.rs (tcp_* settings on
//!            sockets), fdpass.rs (descriptors over a Unix socket, SCM_RIGHTS), tls/
//!            (client_tls_*/server_tls_* → rustls acceptor and connector, verify.rs
//!            certificate checks, channel binding hash, session description)
//! stats/     per-pool atomics and stats_period averages, histogram.rs
//! auth/      md5.rs, scram.rs (server and client side, -PLUS channel binding),
//!            cache.rs (PBKDF2 off the reactor, memoised), peer.rs (OS user of a Unix peer),
//!            cert.rs (client certificate name), dynamic.rs (the secrets auth_query found,
//!            kept auth_query_cache_ttl)
//! sql/       classify.rs: the SQL classifier (leading keywords, internal statement names),
//!            reads.rs (which texts only read: read routing's judgement), selfview.rs
//!            (what a session asks about itself, rewritten for its virtual session)
//! statements the process-wide statement registry (below client/ and server/)
//! server/    connect.rs (connect + login, host lists, role checks), roles.rs (each host's
//!            role, target_session_attrs, fencing), query.rs (pgcarpool's own queries),
//!            exchange.rs (the server's half of the relay, one ledger: what it owes for
//!            what was sent, its transaction status, the statements it holds; written by
//!            what is sent and by `receive`, asked by the rest), response.rs (the replies
//!            owed in order; each forwarded, swallowed or replaced; probes), prepared.rs
//!            (the statements a server holds, preparing them),
//!            sync.rs (apply a session at checkout, read it back, pins, cleanup, reset)
//! pool/      pool.rs (idle list, FIFO waiters, limits, pause; Pool::change_state moves a
//!            server between the states of state.rs, counted for SHOW POOLS), login.rs
//!            (server login failures and retry backoff), guard.rs (RAII checkout, cleanup
//!            of dirty servers), janitor.rs (lifetimes, min_pool_size, shared limits,
//!            stats_period averages), listener.rs (one shared LISTEN connection per pool,
//!            fan-out to clients' bounded inboxes), reads.rs (read routing's standby
//!            sub-pools, one per host, and its counters)
//! peers/     peering: key.rs (cancel keys naming their instance), dns.rs (peers by one DNS
//!            name, ids from addresses), mod.rs (peer table, forwarding cancels, SHOW PEERS)
//! shared/    what the tasks of one pooler share (mini-redis's `Db`): mod.rs (`Shared`, no
//!            public field, one accessor per concern: config, tls, pools, clients,
//!            statements, admin, restart, lifecycle tokens…), lifecycle.rs (RELOAD,
//!            PAUSE/RESUME, the shutdowns, the peer table: one set for the console and the
//!            signals), settings.rs (a pool's settings and credential from the config),
//!            registry.rs (clients by cancel key and id: SHOW CLIENTS, KILL), logins.rs
//!            (connections still logging in; the oldest makes room), counts.rs (clients
//!            per database and user), console.rs (DISABLE/PAUSE state, console roles),
//!            restart.rs (the online-restart phase, SHOW FDS sockets, the handover outbox,
//!            the clients still with the old process)
//! client/    one task per client: mod.rs (arrive: login to a Client or a console session;
//!            finish; why a client stays), startup.rs (first packets, auth),
//!            auth_query.rs (a user's secret asked of PostgreSQL over the auth user's
//!            pool), transaction.rs (the loop), fast.rs (the fast path: one plain simple
//!            Query on a server that fits the session, handed to the relay where it
//!            stands when anything else comes), relay.rs (forwarding both ways while a
//!            server is held), rewrite.rs (virtual statements on the relay), renamed.rs
//!            (server errors given back the client's names and positions), route.rs
//!            (read routing: primary or a fresh standby, the client's WAL position), session.rs
//!            (the virtual session), aborted.rs (the failed block a client is left in when
//!            its server is lost mid-transaction: 40001/08007, 25P02, ROLLBACK), notify.rs
//!            (LISTEN/UNLISTEN answered from the virtual session, notifications delivered
//!            between transactions), cancel.rs, replication.rs (replication pass-through)
//! takeover/  online restart (`-R`) and sessions that move: mod.rs (serve: a client until
//!            it leaves or moves), outgoing.rs (old process: HANDOVER sends idle clients),
//!            incoming.rs (new process: takes the sockets over the console, runs the
//!            clients sent), session.rs (versioned wire form of a session)
//! admin/     mod.rs (serve: one console session), command.rs (enum of commands), show.rs
//!            (one fn per view → Table; SHOW FDS with the sockets to pass), table.rs,
//!            metrics.rs (the same counters for Prometheus, /metrics), status.rs (the
//!            status page `/` on the metrics listener and its /status.json: the SHOW tables)
//! fuzz       fuzz target bodies (cargo-fuzz in fuzz/, bounded runs in tests/fuzz_smoke.rs)
//! ```
pub mod accept;
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
pub mod shared;
pub mod signals;
pub mod sql;
pub mod statements;
pub mod stats;
pub mod takeover;
pub mod workers;
