//! Every fuzz target of `pgcarpool::fuzz` for a bounded number of inputs on stable Rust:
//! the saved regression inputs (fuzz/regressions/<target>/), valid seeds, then seeded
//! random mutations of the seeds and plain random bytes. The same seed gives the same
//! inputs; a panic names the target and writes the input under target/fuzz-smoke/.
//! Real fuzzing (coverage-guided, open-ended) is `cargo +nightly fuzz run <target>`
//! (docs/testing.md).
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use pgcarpool::auth::scram::{ClientCredential, ScramClient, ScramServer};
use pgcarpool::proto::{backend, frontend, startup};

/// The verifier the fuzz targets use (password "pencil", salt "fuzz-salt", 4096).
fn fuzz_verifier() -> pgcarpool::config::auth_file::ScramVerifier {
    pgcarpool::auth::scram::verifier_from_password("pencil", b"fuzz-salt", 4096)
}

/// Inputs per target (mutated or random), unless the time budget runs out first.
const ITERATIONS: usize = 10_000;
/// Time budget per target.
const BUDGET: Duration = Duration::from_millis(1000);
/// The PRNG seed (change it to explore other inputs; keep a found bug as a regression file).
const SEED: u64 = 0x5eed_2026_1123;

/// SplitMix64: small, seeded, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

/// Bytes that mean something to one parser or another.
const TOKENS: &[&[u8]] = &[
    b"\0",
    b"\xff\xff\xff\xff",
    b"\x00\x00\x00\x04",
    b"\x7f\xff\xff\xff",
    b",",
    b"\"",
    b"\"\"",
    b"=",
    b"\n",
    b"#",
    b";",
    b"@",
    b"/",
    b"all",
    b"map=",
    b"%include ",
    b"[pgbouncer]",
    b"r=",
    b"s=",
    b"i=",
    b"p=",
    b"c=",
    b"v=",
    b"n,,",
    b"p=tls-server-end-point,,",
    b"SCRAM-SHA-256$",
    b"md5",
    b"::1/128",
    b"0.0.0.0/0",
    b"255.255.255.0",
    b"replication",
];

fn mutate(rng: &mut Rng, input: &[u8], seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        match rng.below(8) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = rng.next() as u8;
            }
            2 => {
                let i = rng.below(v.len() + 1);
                v.insert(i, rng.next() as u8);
            }
            3 if !v.is_empty() => {
                let i = rng.below(v.len());
                let n = 1 + rng.below((v.len() - i).min(16));
                v.drain(i..i + n);
            }
            4 if !v.is_empty() => {
                let i = rng.below(v.len());
                let n = 1 + rng.below((v.len() - i).min(32));
                let chunk = v[i..i + n].to_vec();
                let at = rng.below(v.len() + 1);
                v.splice(at..at, chunk);
            }
            5 => {
                let t = TOKENS[rng.below(TOKENS.len())];
                let at = rng.below(v.len() + 1);
                v.splice(at..at, t.iter().copied());
            }
            6 => {
                let other = &seeds[rng.below(seeds.len())];
                let from = rng.below(other.len() + 1);
                let at = rng.below(v.len() + 1);
                v.truncate(at);
                v.extend_from_slice(&other[from..]);
            }
            _ => v.truncate(rng.below(v.len() + 1)),
        }
    }
    v
}

fn random(rng: &mut Rng) -> Vec<u8> {
    let n = rng.below(256);
    (0..n).map(|_| rng.next() as u8).collect()
}

fn built(f: impl FnOnce(&mut BytesMut)) -> Vec<u8> {
    let mut b = BytesMut::new();
    f(&mut b);
    b.to_vec()
}

fn joined(a: &[u8], b: &[u8]) -> Vec<u8> {
    let mut v = a.to_vec();
    v.push(0);
    v.extend_from_slice(b);
    v
}

/// Valid inputs for each target, the starting points of mutation.
fn seeds(target: &str) -> Vec<Vec<u8>> {
    match target {
        "message_framing" => {
            let mut all = Vec::new();
            all.extend(built(|b| frontend::password(b, b"secret")));
            all.extend(built(|b| frontend::sasl_initial_response(b, "SCRAM-SHA-256", b"n,,n=,r=abc")));
            all.extend(built(|b| frontend::query(b, "select 1; SET search_path = x; PREPARE p AS select 1")));
            all.extend(built(|b| backend::authentication_md5(b, [1, 2, 3, 4])));
            all.extend(built(|b| backend::authentication_sasl(b, &["SCRAM-SHA-256"])));
            all.extend(built(|b| backend::parameter_status(b, "TimeZone", "UTC")));
            all.extend(built(|b| backend::backend_key_data(b, 42, 7)));
            all.extend(built(|b| backend::error_response(b, "FATAL", "28P01", "no")));
            let mut first = vec![255u8];
            first.extend_from_slice(&all);
            vec![all, first]
        }
        "startup_packet" => vec![
            built(|b| startup::startup_message(b, &[("user", "u"), ("database", "d"), ("options", "-c search_path=x --work_mem=1MB")])),
            built(|b| startup::startup_message_minor(b, 2, &[("user", "u"), ("_pq_.x", "1")])),
            built(|b| startup::cancel_request(b, 1, 2)),
            vec![0, 0, 0, 8, 4, 210, 22, 47],
        ],
        "scram_server" => {
            // A real client's messages against the fuzz server (nonce half SCRAM_NONCE),
            // so mutations start from an exchange that gets to the proof check.
            let mut client = ScramClient::with_nonce(
                ClientCredential::Password("pencil".into()),
                "",
                "rOprNGfwEbeRWgbNEkqO",
            );
            let first = client.client_first();
            let mut server = ScramServer::with_nonce(fuzz_verifier(), pgcarpool::fuzz::SCRAM_NONCE);
            let server_first = server.client_first(&first).unwrap();
            let last = client.server_first(&server_first).unwrap();
            vec![
                joined(&first, &last),
                joined(b"y,,n=user,r=abc", b"c=eSws,r=abcfuzz,p=AAAA"),
                joined(b"p=tls-server-end-point,,n=,r=abc", b"c=cD10bHMtc2VydmVyLWVuZC1wb2ludCws,r=abcfuzz,p=AAAA"),
            ]
        }
        "scram_client" => {
            // A real server's messages for the fuzz client's nonce.
            let mut client = ScramClient::with_nonce(
                ClientCredential::Password("pencil".into()),
                "",
                pgcarpool::fuzz::SCRAM_NONCE,
            );
            let first = client.client_first();
            let mut server = ScramServer::with_nonce(fuzz_verifier(), "3rfcNHYJY1ZVvWVs7j");
            let server_first = server.client_first(&first).unwrap();
            let last = client.server_first(&server_first).unwrap();
            let server_final = server.client_final(&last).unwrap();
            vec![
                joined(&server_first, &server_final),
                joined(b"r=fuzzx,s=AAAA,i=1", b"e=invalid-proof"),
            ]
        }
        "pgbouncer_ini" => vec![
            b"[databases]\n* = host=127.0.0.1 port=5432\napp = host=/tmp dbname=app user=u password=p pool_size=5 pool_mode=transaction\n\
              [users]\nu = pool_mode=session max_user_connections=3\n[peers]\n1 = host=/tmp/p1 port=6432\n\
              [pgbouncer]\nlisten_port = 6432\nauth_type = hba\nauth_hba_file = hba.conf\nserver_lifetime = 3600\n\
              query_timeout = 1.5\nadmin_users = a, b\n%include other.ini\n"
                .to_vec(),
        ],
        "auth_file" => vec![
            b"\"u\" \"plain\"\n\"m\" \"md5ab8b744ff66bee42dc47bae34ca17959\"\n;comment\n\
              \"s\" \"SCRAM-SHA-256$4096:D76gvGUVj9Z4DNiGoabOBg==$RukL0Xo3Ql/2F9FsD7mcQ3GATG2fD3PA71qY1JagGDs=:BhKUwyyivFm7Tq2jDJVXSVRbRDgTWyBilZKgg6DDuYU=\"\n\
              \"q\"\"uote\" \"\"\n"
                .to_vec(),
        ],
        "hba_file" => vec![joined(
            b"m os user\nm \"q\" all\n",
            b"local all all peer map=m\nhost db,@x user 127.0.0.1/32 md5\nhostssl all all ::1/128 cert map=m\n\
              hostnossl replication,sameuser \"user\" 10.0.0.0 255.0.0.0 trust # c\nhost all all all reject\n",
        )],
        other => panic!("no seeds for target {other}"),
    }
}

/// The saved inputs that once broke a target (fuzz/regressions/<target>/*).
fn regressions(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/regressions")
        .join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut out: Vec<_> = entries
        .filter_map(|e| e.ok())
        .map(|e| {
            (
                e.path().display().to_string(),
                std::fs::read(e.path()).expect("read regression"),
            )
        })
        .collect();
    out.sort();
    out
}

/// Run `f` on `input`; on a panic save the input and fail naming it.
fn run_one(target: &str, what: &str, f: fn(&[u8]), input: &[u8]) {
    if catch_unwind(AssertUnwindSafe(|| f(input))).is_err() {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-smoke");
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join(format!("{target}-crash.bin"));
        let _ = std::fs::write(&path, input);
        panic!(
            "fuzz target {target} panicked on {what} (saved as {}): {input:?}",
            path.display()
        );
    }
}

#[test]
fn every_fuzz_target_survives_seeded_random_and_mutated_inputs() {
    let mut rng = Rng(SEED);
    for &(target, f) in pgcarpool::fuzz::TARGETS {
        for (path, input) in regressions(target) {
            run_one(target, &path, f, &input);
        }
        let seeds = seeds(target);
        for (i, s) in seeds.iter().enumerate() {
            run_one(target, &format!("seed {i}"), f, s);
        }
        // PGCARPOOL_FUZZ_SEEDS=fuzz/corpus writes the seeds as cargo-fuzz's starting corpus.
        if let Some(dir) = std::env::var_os("PGCARPOOL_FUZZ_SEEDS") {
            let dir = Path::new(&dir).join(target);
            std::fs::create_dir_all(&dir).expect("make the corpus dir");
            for (i, s) in seeds.iter().enumerate() {
                std::fs::write(dir.join(format!("seed-{i}")), s).expect("write a seed");
            }
        }
        let started = Instant::now();
        let mut ran = 0;
        while ran < ITERATIONS && started.elapsed() < BUDGET {
            let input = if ran % 4 == 3 {
                random(&mut rng)
            } else {
                let s = &seeds[rng.below(seeds.len())];
                mutate(&mut rng, s, &seeds)
            };
            run_one(target, &format!("input {ran}"), f, &input);
            ran += 1;
        }
        eprintln!(
            "fuzz smoke: {target}: {ran} inputs in {:?}",
            started.elapsed()
        );
        assert!(ran >= 100, "{target}: only {ran} inputs within {BUDGET:?}");
    }
}

#[test]
fn the_seeds_are_valid_inputs() {
    // The seeds must reach deep code, not be refused at once: a few spot checks.
    let s = &seeds("startup_packet")[0];
    assert!(matches!(
        startup::parse(s),
        Ok(Some((startup::StartupPacket::Startup { .. }, _)))
    ));
    let s = String::from_utf8(seeds("auth_file")[0].clone()).unwrap();
    assert!(pgcarpool::config::AuthFile::parse(&s, "seed").is_ok());
    let s = &seeds("hba_file")[0];
    let at = s.iter().position(|&b| b == 0).unwrap();
    let ident = pgcarpool::config::ident::Ident::parse(
        std::str::from_utf8(&s[..at]).unwrap(),
        Path::new("i"),
    )
    .unwrap();
    let hba = pgcarpool::config::hba::Hba::parse(
        std::str::from_utf8(&s[at + 1..]).unwrap(),
        Path::new("h"),
        Some(&ident),
        &mut |_| Ok("a b\n".into()),
    )
    .unwrap();
    assert_eq!(hba.rules.len(), 5);
    // The SCRAM seeds are whole exchanges the targets' own side accepts.
    let s = &seeds("scram_server")[0];
    let at = s.iter().position(|&b| b == 0).unwrap();
    let mut server = ScramServer::with_nonce(fuzz_verifier(), pgcarpool::fuzz::SCRAM_NONCE);
    server.client_first(&s[..at]).unwrap();
    server
        .client_final(&s[at + 1..])
        .expect("the seed's proof is right");
    let s = &seeds("scram_client")[0];
    let at = s.iter().position(|&b| b == 0).unwrap();
    let v = fuzz_verifier();
    let mut client = ScramClient::with_nonce(
        ClientCredential::Keys {
            client_key: pgcarpool::auth::scram::keys_from_password("pencil", b"fuzz-salt", 4096).0,
            server_key: v.server_key,
        },
        "",
        pgcarpool::fuzz::SCRAM_NONCE,
    );
    client.client_first();
    client.server_first(&s[..at]).unwrap();
    client
        .server_final(&s[at + 1..])
        .expect("the seed's server signature is right");
}
