//! The differential test: client sessions generated from fixed seeds (`harness::diffgen`)
//! run straight against PostgreSQL and through pgcarpool in transaction mode over a pool of
//! one or two servers; every message each client receives must be the same
//! (`harness::differential`). A difference is reduced to a short script and printed as a
//! test to paste below the generated ones. `scripts/differential` runs the `long_run`
//! test (ignored here) over many seeds for a given time.
mod harness;

use std::time::{Duration, Instant};

use harness::differential::{DiffEnv, RunOptions, as_rust_test, assert_same, describe, shrink};
use harness::diffgen::{ClientScript, GenConfig, generate};

/// Issue 19's known bugs (being fixed on another branch): while this is true, the
/// generator avoids them — COPY data waits for CopyInResponse (bug 1: a streamed COPY keeps
/// its server) and a setting given at startup is never reset on its own (bug 2: RESET
/// forgets the startup value). `DIFF_ISSUE19_BUGS=allow` in the environment lets them in.
/// Set to false once the fixes are merged.
const AVOID_ISSUE19_BUGS: bool = true;

fn avoid_issue19_bugs() -> bool {
    match std::env::var("DIFF_ISSUE19_BUGS").as_deref() {
        Ok("allow") => false,
        Ok("avoid") => true,
        _ => AVOID_ISSUE19_BUGS,
    }
}

/// What one seed runs: 8 to 16 clients over a pool of 1 or 2 (from the seed).
fn config_for(seed: u64, ops: usize) -> (GenConfig, RunOptions) {
    let avoid = avoid_issue19_bugs();
    let gen_cfg = GenConfig {
        clients: 8 + (seed % 9) as usize,
        ops,
        avoid_reset_of_startup_values: avoid,
    };
    let opts = RunOptions {
        pool_size: 1 + (seed % 2) as usize,
        copy_waits_for_copy_in_response: avoid,
        ..RunOptions::default()
    };
    (gen_cfg, opts)
}

/// Run one seed; on a difference, reduce it within `shrink_budget` and return the report.
async fn run_seed(
    env: &DiffEnv,
    seed: u64,
    ops: usize,
    shrink_budget: Duration,
) -> (usize, Option<String>) {
    let (gen_cfg, opts) = config_for(seed, ops);
    let scripts = generate(seed, &gen_cfg);
    let total: usize = scripts.iter().map(|c| c.steps.len()).sum();
    let Some(d) = env.differs(&scripts, &opts).await else {
        return (total, None);
    };
    let mut report = format!(
        "seed {seed}: {} clients, {total} steps, pool_size {}\n{}",
        scripts.len(),
        opts.pool_size,
        describe(&d, &scripts)
    );
    let (reduced, runs) = shrink(env, &scripts, &d, &opts, shrink_budget).await;
    let steps: usize = reduced.iter().map(|c| c.steps.len()).sum();
    report.push_str(&format!(
        "\nreduced in {runs} pairs of runs to {} clients, {steps} steps:\n",
        reduced.len()
    ));
    if let Some(d) = env.differs(&reduced, &opts).await {
        report.push_str(&describe(&d, &reduced));
    } else {
        report.push_str("(the reduced script did not differ again: flaky)\n");
    }
    report.push_str("\n// paste into tests/differential.rs:\n");
    report.push_str(&as_rust_test(
        &format!("differential_seed_{seed}"),
        &reduced,
        &opts,
    ));
    (total, Some(report))
}

/// The fixed seeds CI runs (about a minute on a debug build).
const CI_SEEDS: std::ops::Range<u64> = 1..9;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_seeds_give_every_client_the_same_messages() {
    let env = DiffEnv::start().await;
    let mut failures = Vec::new();
    for seed in CI_SEEDS {
        let started = Instant::now();
        let (steps, report) = run_seed(&env, seed, 30, Duration::from_secs(60)).await;
        eprintln!("seed {seed}: {steps} steps in {:.1?}", started.elapsed());
        if let Some(r) = report {
            eprintln!("{r}");
            failures.push(seed);
        }
    }
    assert!(failures.is_empty(), "seeds with differences: {failures:?}");
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}={v}: not a number"))
        })
        .unwrap_or(default)
}

/// `scripts/differential --seconds N --seed S`: seeds S, S+1, … until N seconds passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long run: scripts/differential"]
async fn long_run() {
    let seconds = env_u64("DIFF_SECONDS", 60);
    let first = env_u64("DIFF_SEED", 1);
    let ops = env_u64("DIFF_OPS", 40) as usize;
    let shrink_secs = env_u64("DIFF_SHRINK_SECONDS", 300);
    let env = DiffEnv::start().await;
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let (mut seeds, mut clients, mut steps, mut diffs) = (0, 0, 0, Vec::new());
    let mut seed = first;
    while Instant::now() < deadline {
        let started = Instant::now();
        let (n, report) = run_seed(&env, seed, ops, Duration::from_secs(shrink_secs)).await;
        let c = config_for(seed, ops).0.clients;
        seeds += 1;
        clients += c;
        steps += n;
        let verdict = if report.is_some() { "DIFFERS" } else { "same" };
        println!(
            "seed {seed}: {c} clients, {n} steps, {verdict} ({:.1?})",
            started.elapsed()
        );
        if let Some(r) = report {
            println!("{r}");
            diffs.push(seed);
        }
        seed += 1;
    }
    println!(
        "summary: {seeds} seeds ({first}..{}), {clients} clients, {steps} steps, {} differences {diffs:?}",
        seed - 1,
        diffs.len()
    );
    assert!(diffs.is_empty(), "seeds with differences: {diffs:?}");
}

// Regression tests: reduced scripts of seeds that found bugs.
#[allow(unused)]
fn _regressions_use(_: ClientScript) {
    let _ = assert_same;
}
