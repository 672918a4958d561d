//! Produce throughput with librdkafka's idempotent producer beside the same producer with it
//! off, on three brokers (RF 3) and on one: the cost of the broker's sequence checks and of the
//! client's tighter pipeline (an idempotent librdkafka producer keeps at most 5 requests in
//! flight per connection). Runs alternate off and on, each on freshly started brokers, so drift
//! in the disk's speed falls on both; the medians and their ratio are printed.

use std::path::Path;

use clap::Args;

use crate::brokers::Brokers;
use crate::cluster::{self, ClusterArgs, RunFigures};

/// What a broker logs when a leader's lease lapses (kiln-broker `cluster/replica.rs`).
const LEASE_LAPSED: &str = "leader lease lapsed";

#[derive(Args, Debug, Clone)]
pub struct IdempotenceArgs {
    #[command(flatten)]
    pub run: ClusterArgs,
    /// Runs of each setting, per topology.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
}

pub fn run(
    dir: &Path,
    args: &IdempotenceArgs,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<()> {
    if args.rounds == 0 {
        anyhow::bail!("--rounds must be at least 1");
    }
    let kiln_bin = cluster::kiln_bin(&args.run.load.kiln_bin)?;
    let tmp = tempfile::tempdir_in(dir)?;
    for (brokers_n, rf) in [(3, args.run.replication_factor), (1, 1)] {
        let mut rates = [Vec::new(), Vec::new()];
        for round in 0..args.rounds {
            for (slot, idempotence) in [(0, false), (1, true)] {
                let mut run = args.run.clone();
                run.load.idempotence = idempotence;
                let root = tmp
                    .path()
                    .join(format!("{brokers_n}-{round}-{idempotence}"));
                let mut brokers = if brokers_n == 3 {
                    Brokers::start_cluster(&kiln_bin, &root, 3, "")?
                } else {
                    Brokers::start_single(&kiln_bin, &root, "")?
                };
                let setup = format!("{brokers_n} broker(s), RF {rf}, idempotence {idempotence}");
                let figures = cluster::measure(&mut brokers, &run, rf, &setup, runtime);
                brokers.kill_all();
                // A leader that lost its lease under load stopped serving for a while
                // (kiln-raft liveness.rs); there should be none.
                let lapses = brokers.count_log_lines(LEASE_LAPSED);
                let f = figures?;
                println!(
                    "idempotence  {setup:<40} round {}: {:>9.0} records/s, p50 {:.1} ms, p99 {:.1} ms, lease lapses {lapses}",
                    round + 1,
                    rate(&f),
                    f.latency_us.value_at_quantile(0.5) as f64 / 1000.0,
                    f.latency_us.value_at_quantile(0.99) as f64 / 1000.0
                );
                rates[slot].push(rate(&f));
                std::fs::remove_dir_all(&root).ok();
            }
        }
        let (off, on) = (median(&mut rates[0]), median(&mut rates[1]));
        println!(
            "idempotence  {brokers_n} broker(s), RF {rf}: median off {off:.0}, on {on:.0} \
             records/s: ratio on/off {:.2}",
            on / off
        );
    }
    Ok(())
}

fn rate(f: &RunFigures) -> f64 {
    f.records as f64 / f.elapsed.as_secs_f64()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}
