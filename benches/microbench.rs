//! Micro-benchmarks of the hot path, no PostgreSQL needed: message framing, the SQL
//! classifier, the relay's per-message scan (both directions) and the virtual
//! prepared-statement rewrite.
//!
//! `cargo bench --bench microbench` runs them all; a name filter picks some
//! (`cargo bench --bench microbench -- relay/`). The relay benches build a real `Relay` over
//! Unix socket pairs but never touch the sockets in the measured loop: bytes are put in the
//! read buffer as a read would, scanned, and the queued output is dropped (`Conn::discard_out`).
use std::hint::black_box;

use bytes::{BufMut, BytesMut};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tokio::io::AsyncReadExt;
use tokio::net::UnixStream;
use tokio::runtime::Runtime;

use pgcarpool::client::relay::Relay;
use pgcarpool::client::session::VirtualSession;
use pgcarpool::config::PoolMode;
use pgcarpool::net::{Conn, Stream};
use pgcarpool::proto::{self, Reader, backend, frontend};
use pgcarpool::server::{Server, ServerAddr};
use pgcarpool::sql::classify;
use pgcarpool::statements::StatementRegistry;

// ---------------------------------------------------------------------------------------
// Messages, as pgbench (simple and -M prepared, which goes through libpq) sends and gets them.

const SELECT_SQL: &str = "SELECT abalance FROM pgbench_accounts WHERE aid = 48213;";
const PREPARED_SQL: &str = "SELECT abalance FROM pgbench_accounts WHERE aid = $1;";
const STMT: &str = "P0_1";

/// A message with this tag and body.
fn msg(out: &mut BytesMut, tag: u8, body: &[u8]) {
    out.put_u8(tag);
    out.put_i32(4 + body.len() as i32);
    out.put_slice(body);
}

fn cstr(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(s.as_bytes());
    b.push(0);
}

fn parse(out: &mut BytesMut, name: &str, sql: &str) {
    let mut b = Vec::new();
    cstr(&mut b, name);
    cstr(&mut b, sql);
    b.extend_from_slice(&0i16.to_be_bytes());
    msg(out, frontend::PARSE, &b);
}

/// Bind of `stmt` to the unnamed portal with one text parameter.
fn bind(out: &mut BytesMut, stmt: &str, param: &str) {
    let mut b = Vec::new();
    cstr(&mut b, "");
    cstr(&mut b, stmt);
    b.extend_from_slice(&0i16.to_be_bytes());
    b.extend_from_slice(&1i16.to_be_bytes());
    b.extend_from_slice(&(param.len() as i32).to_be_bytes());
    b.extend_from_slice(param.as_bytes());
    b.extend_from_slice(&0i16.to_be_bytes());
    msg(out, frontend::BIND, &b);
}

/// What libpq's PQexecPrepared sends: Bind, Describe portal, Execute, Sync.
fn exec_prepared(out: &mut BytesMut, stmt: &str) {
    bind(out, stmt, "48213");
    msg(out, frontend::DESCRIBE, b"P\0");
    msg(out, frontend::EXECUTE, b"\0\0\0\0\0");
    frontend::sync(out);
}

/// One row of one int4 column, then the end of the command.
fn select_reply(out: &mut BytesMut) {
    backend::row_description(out, &[("abalance", 23)]);
    backend::data_row(out, [Some("-2731")].into_iter());
    backend::command_complete(out, "SELECT 1");
}

fn simple_reply(out: &mut BytesMut) {
    select_reply(out);
    backend::ready_for_query(out, b'I');
}

fn prepared_reply(out: &mut BytesMut) {
    msg(out, backend::BIND_COMPLETE, b"");
    simple_reply(out);
}

fn build(f: impl FnOnce(&mut BytesMut)) -> Vec<u8> {
    let mut b = BytesMut::new();
    f(&mut b);
    b.to_vec()
}

// ---------------------------------------------------------------------------------------
// (1) Framing.

fn framing(c: &mut Criterion) {
    // A pgbench-like mix of both directions: simple query + reply, prepared round trip
    // + reply, and a tpcb-like UPDATE.
    let mut buf = BytesMut::new();
    for _ in 0..200 {
        frontend::query(&mut buf, SELECT_SQL);
        simple_reply(&mut buf);
        exec_prepared(&mut buf, STMT);
        prepared_reply(&mut buf);
        frontend::query(
            &mut buf,
            "UPDATE pgbench_accounts SET abalance = abalance + -2731 WHERE aid = 48213;",
        );
        backend::command_complete(&mut buf, "UPDATE 1");
        backend::ready_for_query(&mut buf, b'T');
    }
    let buf = buf.freeze();
    let count = {
        let (mut at, mut n) = (0, 0);
        while let Some(h) = proto::header(&buf[at..], usize::MAX).unwrap() {
            at += h.total;
            n += 1;
        }
        assert_eq!(at, buf.len());
        n
    };

    let mut g = c.benchmark_group("framing");
    g.throughput(Throughput::Elements(count as u64));
    g.bench_function(format!("header/{count}_msgs"), |b| {
        b.iter(|| {
            let buf = black_box(&buf[..]);
            let (mut at, mut tags) = (0usize, 0u32);
            while let Some(h) = proto::header(&buf[at..], i32::MAX as usize).unwrap() {
                tags = tags.wrapping_add(h.tag as u32);
                at += h.total;
            }
            tags
        })
    });

    // Reader: the fields the rewrite reads from a Bind (portal and statement names).
    let bind_msg = build(|b| bind(b, STMT, "48213"));
    g.throughput(Throughput::Elements(1));
    g.bench_function("reader/bind_names", |b| {
        b.iter(|| {
            let mut r = Reader::new(&black_box(&bind_msg[..])[5..], "Bind");
            let portal = r.cstr_bytes().unwrap();
            let name = r.cstr_bytes().unwrap();
            (portal.len(), name.len())
        })
    });
    g.finish();
}

// ---------------------------------------------------------------------------------------
// (2) Classifier.

fn classify_bench(c: &mut Criterion) {
    let orm = "SELECT u.id, u.email, u.created_at, o.id AS order_id, o.total, o.status, \
        p.name AS product, p.price FROM users u JOIN orders o ON o.user_id = u.id \
        JOIN order_items i ON i.order_id = o.id JOIN products p ON p.id = i.product_id \
        WHERE u.tenant_id = $1 AND o.created_at >= $2 AND o.status IN ('paid', 'shipped') \
        ORDER BY o.created_at DESC LIMIT 50 OFFSET 100";
    let queries: [(&str, &str, bool); 8] = [
        ("select", SELECT_SQL, false),
        (
            "update",
            "UPDATE pgbench_accounts SET abalance = abalance + -2731 WHERE aid = 48213;",
            false,
        ),
        ("begin", "BEGIN;", false),
        ("orm_join", orm, false),
        ("set", "SET application_name = 'bench'", true),
        (
            "set_config",
            "SELECT set_config('search_path', 'public', false)",
            true,
        ),
        (
            "multi_stmt_set",
            "BEGIN; SET LOCAL work_mem = '64MB'; SELECT 1",
            true,
        ),
        ("discard_all", "DISCARD ALL", true),
    ];
    let mut g = c.benchmark_group("classify");
    g.throughput(Throughput::Elements(1));
    for (name, sql, matters) in queries {
        assert_eq!(classify::may_matter(sql.as_bytes()), matters, "{name}");
        g.bench_function(format!("may_matter/{name}"), |b| {
            b.iter(|| classify::may_matter(black_box(sql.as_bytes())))
        });
    }
    for (name, sql, matters) in queries {
        if matters || name == "select" {
            g.bench_function(format!("classify/{name}"), |b| {
                b.iter(|| classify::classify(black_box(sql.as_bytes())))
            });
        }
    }
    g.finish();
}

// ---------------------------------------------------------------------------------------
// (3) and (4): a Relay over in-memory socket pairs.

/// A client connection, a server connection and everything a Relay borrows. The far ends
/// of both socket pairs are kept to check, once, what the relay queued.
struct Rig {
    rt: Runtime,
    client: Conn,
    server: Server,
    session: VirtualSession,
    registry: StatementRegistry,
    client_peer: UnixStream,
    server_peer: UnixStream,
}

impl Rig {
    fn new() -> Rig {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _guard = rt.enter();
        let (client, client_peer) = UnixStream::pair().unwrap();
        let (server, server_peer) = UnixStream::pair().unwrap();
        let server = Server::new(
            1,
            Conn::new(Stream::Unix(server)),
            ServerAddr::Unix("/nonexistent/.s.PGSQL.5432".into()),
            (1, 1),
            Default::default(),
        );
        Rig {
            client: Conn::new(Stream::Unix(client)),
            server,
            session: VirtualSession::default(),
            registry: StatementRegistry::default(),
            rt,
            client_peer,
            server_peer,
        }
    }

    /// A relay in `mode`; transaction mode has virtual prepared statements on.
    fn relay(&mut self, mode: PoolMode) -> Relay<'_> {
        let max_prepared = if mode == PoolMode::Session { 0 } else { 100 };
        Relay::new(
            &mut self.client,
            &mut self.server,
            &mut self.session,
            mode,
            &self.registry,
            max_prepared,
        )
    }
}

/// Bytes arriving in a read buffer, as `Conn::poll_read_more` gets them (same reserve rule).
#[inline]
fn feed(conn: &mut Conn, bytes: &[u8]) {
    if conn.rbuf.capacity() - conn.rbuf.len() < 4 * 1024 {
        conn.rbuf.reserve(16 * 1024);
    }
    conn.rbuf.extend_from_slice(bytes);
}

/// Write what `conn` queued to its socket and read it at the far end (checks only).
fn take_written(rt: &Runtime, conn: &mut Conn, peer: &mut UnixStream) -> Vec<u8> {
    let n = conn.out_len();
    rt.block_on(async {
        conn.flush().await.unwrap();
        let mut got = vec![0; n];
        peer.read_exact(&mut got).await.unwrap();
        got
    })
}

/// One client request and the server's reply through the relay's two scans.
#[inline]
fn round_trip(relay: &mut Relay<'_>, request: &[u8], reply: &[u8]) {
    feed(relay.client, request);
    black_box(relay.scan_client().unwrap());
    black_box(relay.server.conn_mut().discard_out());
    feed(relay.server.conn_mut(), reply);
    black_box(relay.scan_server().unwrap());
    black_box(relay.client.discard_out());
}

/// Prepare `STMT` through the relay (Parse + Sync, ParseComplete + ReadyForQuery), as the
/// client's first use of it would.
fn prepare_stmt(rig: &mut Rig) {
    let parse_sync = build(|b| {
        parse(b, STMT, PREPARED_SQL);
        frontend::sync(b);
    });
    let reply = build(|b| {
        backend::parse_complete(b);
        backend::ready_for_query(b, b'I');
    });
    // pgcarpool learns a shared statement's description on its first Parse (a Describe
    // it adds; its replies are dropped).
    let server_reply = build(|b| {
        backend::parse_complete(b);
        msg(b, b't', &[0, 1, 0, 0, 0, 23]);
        backend::row_description(b, &[("abalance", 23)]);
        backend::ready_for_query(b, b'I');
    });
    let mut relay = rig.relay(PoolMode::Transaction);
    feed(relay.client, &parse_sync);
    relay.scan_client().unwrap();
    feed(relay.server.conn_mut(), &server_reply);
    relay.scan_server().unwrap();
    drop(relay);
    let sent = take_written(&rig.rt, rig.server.conn_mut(), &mut rig.server_peer);
    assert!(
        sent.windows(11).any(|w| w == b"PGCARPOOL_1"),
        "Parse renamed"
    );
    let got = take_written(&rig.rt, &mut rig.client, &mut rig.client_peer);
    assert_eq!(got, reply, "ParseComplete and ReadyForQuery forwarded");
    assert!(rig.server.exchange().owes_nothing());
}

fn relay_bench(c: &mut Criterion) {
    let query = build(|b| frontend::query(b, SELECT_SQL));
    let query_reply = build(simple_reply);
    let prepared = build(|b| exec_prepared(b, STMT));
    let prepared_reply = build(prepared_reply);

    let mut g = c.benchmark_group("relay");
    g.throughput(Throughput::Elements(1));

    // Baseline: only the copies into the read buffers that every case below includes.
    let mut rig = Rig::new();
    g.bench_function("baseline_feed_only", |b| {
        b.iter(|| {
            feed(&mut rig.client, &query);
            rig.client.rbuf.clear();
            feed(rig.server.conn_mut(), &query_reply);
            rig.server.conn_mut().rbuf.clear();
        })
    });

    // Session mode: passthrough, nothing rewritten.
    let mut rig = Rig::new();
    {
        let mut relay = rig.relay(PoolMode::Session);
        round_trip(&mut relay, &query, &query_reply);
        g.bench_function("session/simple_select_txn", |b| {
            b.iter(|| round_trip(&mut relay, &query, &query_reply))
        });
        g.bench_function("session/prepared_select_txn", |b| {
            b.iter(|| round_trip(&mut relay, &prepared, &prepared_reply))
        });
    }
    assert!(rig.server.exchange().is_idle());

    // Transaction mode, virtual prepared statements on: simple Query (on_query path) and
    // Bind/Describe/Execute/Sync of a named statement (Bind rewritten to the server name).
    let mut rig = Rig::new();
    prepare_stmt(&mut rig);
    {
        // Check once that the bytes queued are the expected ones.
        let mut relay = rig.relay(PoolMode::Transaction);
        feed(relay.client, &prepared);
        assert!(relay.scan_client().unwrap().is_none());
        feed(relay.server.conn_mut(), &prepared_reply);
        assert!(matches!(
            relay.scan_server().unwrap(),
            Some(pgcarpool::client::relay::RelayEvent::Release)
        ));
    }
    let sent = take_written(&rig.rt, rig.server.conn_mut(), &mut rig.server_peer);
    assert_eq!(
        sent,
        build(|b| exec_prepared(b, "PGCARPOOL_1")),
        "Bind rewritten"
    );
    let got = take_written(&rig.rt, &mut rig.client, &mut rig.client_peer);
    assert_eq!(got, prepared_reply, "reply forwarded whole");
    {
        let mut relay = rig.relay(PoolMode::Transaction);
        g.bench_function("transaction/simple_select_txn", |b| {
            b.iter(|| round_trip(&mut relay, &query, &query_reply))
        });
        g.bench_function("transaction/prepared_select_txn", |b| {
            b.iter(|| round_trip(&mut relay, &prepared, &prepared_reply))
        });
    }
    assert!(rig.server.exchange().owes_nothing());
    g.finish();
}

fn rewrite_bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("rewrite");
    g.throughput(Throughput::Elements(1));

    let mut rig = Rig::new();
    prepare_stmt(&mut rig);

    // Parse of a key the server already holds: answered by pgcarpool (ParseComplete), the
    // client's name mapped, nothing sent to the server.
    // Under another client name (a name the client already has is refused, 42P05).
    const OTHER: &str = "other";
    let parse_msg = build(|b| parse(b, OTHER, PREPARED_SQL));
    {
        let mut relay = rig.relay(PoolMode::Transaction);
        feed(relay.client, &parse_msg);
        relay.scan_client().unwrap();
        assert_eq!(
            relay.server.conn_mut().out_len(),
            0,
            "Parse answered locally"
        );
        assert!(relay.server.exchange().ledger_empty());
    }
    let got = take_written(&rig.rt, &mut rig.client, &mut rig.client_peer);
    assert_eq!(got, build(backend::parse_complete));
    {
        let mut relay = rig.relay(PoolMode::Transaction);
        g.bench_function("parse_known_answered_locally", |b| {
            b.iter(|| {
                relay.session.statements.remove(OTHER.as_bytes());
                feed(relay.client, &parse_msg);
                black_box(relay.scan_client().unwrap());
                black_box(relay.client.discard_out());
            })
        });
    }

    // Bind of the named statement: rewritten (new header + server name, the rest shared).
    // Compared with a Bind of the unnamed statement, forwarded as it is.
    for (name, stmt) in [
        ("bind_named_rewritten", STMT),
        ("bind_unnamed_passthrough", ""),
    ] {
        let bind_msg = build(|b| bind(b, stmt, "48213"));
        let mut relay = rig.relay(PoolMode::Transaction);
        // The client's unnamed statement, held by this server.
        relay.session.ext.unnamed = Some(bytes::Bytes::from_static(b"select 1\0\0\0"));
        relay.session.ext.unnamed_id = 7;
        relay.server.set_unnamed(7);
        g.bench_function(name, |b| {
            b.iter(|| {
                feed(relay.client, &bind_msg);
                black_box(relay.scan_client().unwrap());
                black_box(relay.server.conn_mut().discard_out());
                // The BindComplete it waits for is not part of this measurement.
                relay.server.forget_owed();
            })
        });
    }
    g.finish();
}

criterion_group!(benches, framing, classify_bench, relay_bench, rewrite_bench);
criterion_main!(benches);
