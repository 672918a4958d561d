//! How long a broker takes to serve committed offsets again after `kill -9`, with few commits
//! made and with many: the offsets group is compacted (a snapshot of the table, the log behind
//! it purged), so the time should follow the number of keys, not the number of commits.
//!
//! One broker (a cluster of one: the same replicated offsets group and code path as three)
//! holds a topic of `--partitions` partitions with `--groups` groups committing to each, so
//! `groups x partitions` keys. Round one commits every key once; the broker is killed and
//! started again, and the time from the start to OffsetFetch answering every key's offset is
//! printed. Then the commits go on until `--commits` have been made in all, and the restart is
//! timed again, with the entries the offsets group replayed on opening (from the broker's log).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::{
    GroupId, OffsetCommitRequest, RequestKind, ResponseKind, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kiln_client::admin::Cluster;
use kiln_client::Connection;
use rdkafka::producer::Producer;

use crate::brokers::{Brokers, TopicSpec};
use crate::cluster::{self, LoadArgs};

const TOPIC: &str = "committed";
/// Every request's timeout.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait for the restarted broker to answer every key.
const RESTART_TIMEOUT: Duration = Duration::from_secs(120);
/// Connections committing at once.
const COMMITTERS: usize = 32;

#[derive(Args, Debug, Clone)]
pub struct OffsetsArgs {
    #[command(flatten)]
    pub load: LoadArgs,
    /// Groups committing (each to every partition of the topic).
    #[arg(long, default_value_t = 100)]
    pub groups: usize,
    /// Commits made in all (offset commits, one per key per round).
    #[arg(long, default_value_t = 1_000_000)]
    pub commits: u64,
}

pub fn run(
    dir: &Path,
    args: &OffsetsArgs,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<()> {
    cluster::check_load(&args.load)?;
    let keys = args.groups as u64 * args.load.partitions as u64;
    if args.groups == 0 || args.commits < keys {
        bail!("--groups must be at least 1 and --commits at least one per key ({keys})");
    }
    let kiln_bin = cluster::kiln_bin(&args.load.kiln_bin)?;
    let tmp = tempfile::tempdir_in(dir)?;
    let mut brokers = Brokers::start_single(&kiln_bin, tmp.path(), "")?;
    let result = measure(&mut brokers, args, keys, runtime);
    brokers.kill_all();
    result
}

fn measure(
    brokers: &mut Brokers,
    args: &OffsetsArgs,
    keys: u64,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<()> {
    let load = &args.load;
    let rounds = args.commits / keys;
    let spec = TopicSpec {
        name: TOPIC,
        partitions: load.partitions,
        replication_factor: 1,
        configs: &[],
    };
    let ready = Duration::from_secs(load.ready_timeout_s);
    let (bootstrap, _) = cluster::prepare(brokers, &spec, ready, runtime)?;
    // Offsets up to `rounds` must be below each partition's high watermark.
    let producer = cluster::producer(&bootstrap, load)?;
    cluster::warm_up(&producer, brokers, TOPIC, load, Instant::now() + ready)?;
    producer.context().reset();
    let records = rounds * load.partitions as u64;
    cluster::drive(&producer, TOPIC, load, "offsets", &mut |sent, _| {
        sent >= records
    })?;
    cluster::finish(&producer, brokers, "offsets", records)?;
    drop(producer);
    println!(
        "offsets  1 broker, {} groups x {} partitions = {keys} keys; {} commits in {rounds} rounds",
        args.groups, load.partitions, args.commits
    );

    let started = Instant::now();
    runtime.block_on(commit_rounds(&bootstrap, args, 1..=1))?;
    println!(
        "offsets  round 1: {keys} commits in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    restart(brokers, args, runtime, &bootstrap, 1, keys)?;

    let started = Instant::now();
    runtime.block_on(commit_rounds(&bootstrap, args, 2..=rounds))?;
    let made = (rounds - 1) * keys;
    let s = started.elapsed().as_secs_f64();
    println!(
        "offsets  rounds 2..={rounds}: {made} commits in {s:.1} s ({:.0} commits/s, {:.0} requests/s)",
        made as f64 / s,
        (rounds - 1) as f64 * args.groups as f64 / s
    );
    restart(
        brokers,
        args,
        runtime,
        &bootstrap,
        rounds as i64,
        rounds * keys,
    )
}

/// Commits offset `r` to every key for each round `r`, from [`COMMITTERS`] connections, each
/// owning some groups (a group's commits stay in order on its connection).
async fn commit_rounds(
    bootstrap: &str,
    args: &OffsetsArgs,
    rounds: std::ops::RangeInclusive<u64>,
) -> anyhow::Result<()> {
    let done = Arc::new(AtomicU64::new(0));
    let total = (rounds.end() + 1).saturating_sub(*rounds.start()) * args.groups as u64;
    let mut tasks = Vec::new();
    for c in 0..COMMITTERS.min(args.groups) {
        let groups: Vec<usize> = (c..args.groups).step_by(COMMITTERS).collect();
        let address = bootstrap.to_string();
        let partitions = args.load.partitions;
        let rounds = rounds.clone();
        let done = Arc::clone(&done);
        tasks.push(tokio::spawn(async move {
            let mut conn = Connection::connect(&address, REQUEST_TIMEOUT)
                .await
                .with_context(|| format!("connecting to {address}"))?;
            for r in rounds {
                for &g in &groups {
                    commit(&mut conn, g, partitions, r as i64).await?;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
            anyhow::Ok(())
        }));
    }
    let progress = tokio::spawn({
        let done = Arc::clone(&done);
        async move {
            let started = Instant::now();
            loop {
                tokio::time::sleep(Duration::from_secs(10)).await;
                let n = done.load(Ordering::Relaxed);
                eprintln!(
                    "offsets  {n} of {total} commit requests after {:.0} s",
                    started.elapsed().as_secs_f64()
                );
            }
        }
    });
    let mut result = Ok(());
    for t in tasks {
        match t.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => result = result.and(Err(e)),
            Err(e) => result = result.and(Err(anyhow::anyhow!("committer task: {e}"))),
        }
    }
    progress.abort();
    result
}

fn group_name(g: usize) -> String {
    format!("bench-{g}")
}

/// One OffsetCommit for group `g`, every partition at `offset`, outside any generation (as
/// an admin tool resets offsets); every partition must be answered without error.
async fn commit(
    conn: &mut Connection,
    g: usize,
    partitions: i32,
    offset: i64,
) -> anyhow::Result<()> {
    let request = OffsetCommitRequest::default()
        .with_group_id(GroupId(StrBytes::from_string(group_name(g))))
        .with_generation_id_or_member_epoch(-1)
        .with_topics(vec![OffsetCommitRequestTopic::default()
            .with_name(TopicName(StrBytes::from_static_str(TOPIC)))
            .with_partitions(
                (0..partitions)
                    .map(|p| {
                        OffsetCommitRequestPartition::default()
                            .with_partition_index(p)
                            .with_committed_offset(offset)
                            .with_committed_leader_epoch(-1)
                    })
                    .collect(),
            )]);
    let response = conn
        .call(RequestKind::OffsetCommit(request), REQUEST_TIMEOUT)
        .await
        .context("OffsetCommit")?;
    let ResponseKind::OffsetCommit(r) = response else {
        bail!("OffsetCommit answered with another response kind");
    };
    for t in &r.topics {
        for p in &t.partitions {
            if p.error_code != 0 {
                bail!(
                    "OffsetCommit of {}/{} for {} failed: {}",
                    TOPIC,
                    p.partition_index,
                    group_name(g),
                    kiln_client::admin::error_name(p.error_code)
                );
            }
        }
    }
    Ok(())
}

/// Kills the broker, starts it again and times it until OffsetFetch answers `expected` for
/// every key.
fn restart(
    brokers: &mut Brokers,
    args: &OffsetsArgs,
    runtime: &tokio::runtime::Runtime,
    bootstrap: &str,
    expected: i64,
    commits_made: u64,
) -> anyhow::Result<()> {
    brokers.kill(1)?;
    let started = Instant::now();
    brokers.restart(1)?;
    brokers.wait_listening_one(1, started + RESTART_TIMEOUT)?;
    let listening = started.elapsed();
    let wanted: BTreeMap<String, Vec<i32>> =
        BTreeMap::from([(TOPIC.to_string(), (0..args.load.partitions).collect())]);
    let mut client = Cluster::new(bootstrap, REQUEST_TIMEOUT);
    let mut last = String::new();
    let served = loop {
        brokers.check_alive()?;
        let mut all = true;
        for g in 0..args.groups {
            match runtime.block_on(client.committed(bootstrap, &group_name(g), Some(&wanted))) {
                Ok(found)
                    if found
                        .iter()
                        .all(|c| c.offset == expected && c.error_code == 0) => {}
                Ok(found) => {
                    last = format!("{}: {:?}", group_name(g), found.first().map(|c| c.offset));
                    all = false;
                    break;
                }
                Err(e) => {
                    last = e.to_string();
                    all = false;
                    break;
                }
            }
        }
        if all {
            break started.elapsed();
        }
        if started.elapsed() >= RESTART_TIMEOUT {
            bail!(
                "after a restart the broker did not answer every committed offset in {} s \
                 (last: {last})\n{}",
                RESTART_TIMEOUT.as_secs(),
                brokers.log_tails()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let data = &brokers.procs[brokers.index_of(1)?].data_dir;
    println!(
        "offsets  after {commits_made} commits: kill -9 and restart: listening after {:.3} s, \
         every key's offset served after {:.3} s; offsets group replayed {} entries; data \
         directory {:.1} MiB",
        listening.as_secs_f64(),
        served.as_secs_f64(),
        replayed_entries(brokers).unwrap_or_else(|| "?".into()),
        crate::disk::dir_bytes(data)? as f64 / (1u64 << 20) as f64
    );
    Ok(())
}

/// The `entries=` of the last "replica open" line of the offsets group in the broker's log.
fn replayed_entries(brokers: &Brokers) -> Option<String> {
    let log = std::fs::read_to_string(brokers.procs.first()?.log_path()).ok()?;
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains("replica open") && l.contains("__consumer_offsets"))?;
    let at = line.find("entries=")? + "entries=".len();
    Some(
        line[at..]
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect(),
    )
}
