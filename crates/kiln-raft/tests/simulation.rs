//! The deterministic simulation (see `kiln_raft::sim`).
//!
//! * `ci_seeds`: a fixed set of seeds, every `cargo test`.
//! * `replay_is_exact`: a seed run twice gives the same trace.
//! * `checker_catches_a_disk_that_acks_before_fsync`: with disks that report fsync before the
//!   data is durable, the checker finds a lost acknowledged record for some seed.
//! * `many_seeds` (ignored): `KILN_SIM_SEEDS=N` seeds from `KILN_SIM_FIRST` (default 0), or one
//!   seed with `KILN_SIM_SEED=n` (prints its trace). `scripts/sim-replication` drives it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kiln_raft::disk::SyncBehaviour;
use kiln_raft::sim::{run, SimOptions, SimReport};

fn simulate(opts: SimOptions) -> SimReport {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(run(opts))
}

fn describe(r: &SimReport) -> String {
    format!(
        "seed {}: {} acked, {} failed, {} crashes, {} power losses, {} partitions, {} leaders, hw {}, {} reads checked, trace {:016x}",
        r.seed,
        r.acknowledged,
        r.failed_appends,
        r.crashes,
        r.power_losses,
        r.partitions,
        r.leaders,
        r.final_high_watermark,
        r.reads_checked,
        r.trace_hash()
    )
}

fn fail_with_trace(r: &SimReport) -> ! {
    for line in &r.trace {
        eprintln!("{line}");
    }
    panic!(
        "seed {} violated invariants (replay: KILN_SIM_SEED={} scripts/sim-replication):\n{}",
        r.seed,
        r.seed,
        r.violations.join("\n")
    );
}

const CI_SEEDS: std::ops::Range<u64> = 0..48;

#[test]
fn ci_seeds() {
    let mut total_acked = 0;
    let mut total_crashes = 0;
    for seed in CI_SEEDS {
        let r = simulate(SimOptions::new(seed));
        println!("{}", describe(&r));
        if !r.passed() {
            fail_with_trace(&r);
        }
        assert!(r.acknowledged > 0, "seed {seed} acknowledged nothing");
        total_acked += r.acknowledged;
        total_crashes += r.crashes;
    }
    // The schedules really do inject faults and the client really does get acknowledgements.
    assert!(
        total_crashes > CI_SEEDS.count(),
        "too few crashes: {total_crashes}"
    );
    assert!(total_acked > 100, "too few acknowledgements: {total_acked}");
}

#[test]
fn replay_is_exact() {
    for seed in [3u64, 7] {
        let a = simulate(SimOptions::new(seed));
        let b = simulate(SimOptions::new(seed));
        assert_eq!(a.trace, b.trace, "seed {seed} did not replay the same way");
        assert_eq!(a.trace_hash(), b.trace_hash());
    }
}

#[test]
fn checker_catches_a_disk_that_acks_before_fsync() {
    let mut caught = None;
    for seed in 0..30u64 {
        let mut opts = SimOptions::new(seed);
        opts.sync = SyncBehaviour::LyingWriteCache;
        let r = simulate(opts);
        if r.lost_acknowledged() {
            caught = Some(r);
            break;
        }
    }
    let r = caught.expect("no seed in 0..30 lost an acknowledged record with lying disks");
    println!("{}: {}", describe(&r), r.violations[0]);
    // The same seed with honest disks passes.
    let honest = simulate(SimOptions::new(r.seed));
    if !honest.passed() {
        fail_with_trace(&honest);
    }
}

#[test]
#[ignore = "long: run through scripts/sim-replication"]
fn many_seeds() {
    if let Ok(seed) = std::env::var("KILN_SIM_SEED") {
        let seed: u64 = seed.parse().expect("KILN_SIM_SEED must be a number");
        let r = simulate(SimOptions::new(seed));
        for line in &r.trace {
            println!("{line}");
        }
        println!("{}", describe(&r));
        if !r.passed() {
            fail_with_trace(&r);
        }
        return;
    }
    let count: u64 = std::env::var("KILN_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    let first: u64 = std::env::var("KILN_SIM_FIRST")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let started = std::time::Instant::now();
    for seed in first..first + count {
        let r = simulate(SimOptions::new(seed));
        println!("{}", describe(&r));
        if !r.passed() {
            println!("FAILING SEED: {seed}");
            fail_with_trace(&r);
        }
    }
    println!(
        "{count} seeds from {first} passed in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
