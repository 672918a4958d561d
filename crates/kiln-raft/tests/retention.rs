//! Retention on a replicated partition, over real sockets and files: the leader proposes a new
//! log start, every replica applies it at the same point and deletes its whole segments below
//! it, and a follower that was stopped while retention removed what it lacked catches up from
//! the leader's snapshot (which carries only the start offset and term) instead of the lost
//! entries (docs/replication.md, "Retention").
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;

use bytes::Bytes;
use kiln_log::LogConfig;
use kiln_raft::{PartitionError, ReplicatedPartition};
use support::*;

/// Small segments, so a few hundred records span many and retention has whole ones to drop.
fn small_segments() -> LogConfig {
    LogConfig {
        segment_bytes: 8192,
        index_interval_bytes: 512,
        checkpoint_interval_bytes: 4096,
        ..LogConfig::default()
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Reads every record at or above `from` below the high watermark, as offset → the bytes the
/// batch CRC covers.
fn records_from(replica: &ReplicatedPartition, from: i64) -> BTreeMap<i64, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut offset = from;
    while offset < replica.high_watermark() {
        let read = replica.read(offset, 64 << 10).unwrap();
        assert!(!read.records.is_empty(), "nothing read at {offset}");
        for b in kiln_log::batch::batches(&read.records) {
            let b = b.unwrap();
            out.insert(b.header.base_offset, b.bytes[16..].to_vec());
        }
        offset = read.next_offset;
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_stopped_while_retention_removed_what_it_lacked_catches_up_from_the_new_start() {
    let root = tempfile::tempdir().unwrap();
    let (mut brokers, peers) = start_cluster_with(root.path(), None, small_segments()).await;
    let leader = {
        let replicas: Vec<&ReplicatedPartition> = brokers.iter().map(|b| &b.replica).collect();
        wait_for_leader(&replicas).await
    };
    let lagging = brokers
        .iter()
        .position(|b| b.id != leader.id())
        .expect("a follower");
    let lagging_id = brokers[lagging].id;

    // Some records every replica has, then the follower stops and misses the rest.
    let mut acked: BTreeMap<i64, Vec<u8>> = BTreeMap::new();
    for i in 0..50 {
        let batch = record(i);
        let ack = leader.append(Bytes::from(batch.clone())).await.unwrap();
        acked.insert(ack.base_offset, batch[16..].to_vec());
    }
    let caught_up = acked.len() as i64;
    wait_until("every replica to hold the first records", || {
        brokers
            .iter()
            .all(|b| b.replica.high_watermark() == caught_up)
    })
    .await;
    brokers[lagging].stop().await;
    for i in 50..400 {
        let batch = record(i);
        let ack = leader.append(Bytes::from(batch.clone())).await.unwrap();
        acked.insert(ack.base_offset, batch[16..].to_vec());
    }
    let end = acked.len() as i64;

    // Every record is years old (record() stamps 2023): one day of retention drops every
    // closed segment the group has applied.
    let command = leader
        .retention_command(now_ms(), Some(86_400_000), None)
        .expect("closed segments past retention");
    let kiln_raft::Command::LogStart {
        kafka_offset: start,
        ..
    } = command
    else {
        unreachable!("retention proposes log starts only")
    };
    assert!(
        start > caught_up,
        "retention passes what the stopped follower holds: {start}"
    );
    leader.propose(command).await.unwrap();
    let live: Vec<&Broker> = brokers.iter().filter(|b| b.id != lagging_id).collect();
    wait_until("the live replicas to move their log start", || {
        live.iter().all(|b| b.replica.log_start_offset() == start)
    })
    .await;
    wait_until("the live replicas to delete the segments below it", || {
        live.iter().all(|b| {
            b.replica
                .segments()
                .first()
                .is_some_and(|s| s.base_kafka > caught_up)
        })
    })
    .await;
    // Below the start is out of range; at the start the records are there.
    match leader.read(0, 1 << 16) {
        Err(PartitionError::OffsetOutOfRange { .. }) => {}
        other => panic!("a read below the log start answered {other:?}"),
    }

    // The follower comes back: what it lacked is gone from every log, so it installs the
    // leader's snapshot (the start offset) and follows from there.
    let dir = brokers[lagging].dir.clone();
    let listener = tokio::net::TcpListener::bind(&peers[&lagging_id])
        .await
        .unwrap();
    brokers[lagging] =
        start_broker_with(lagging_id, &dir, listener, &peers, small_segments()).await;
    let back = &brokers[lagging].replica;
    wait_until("the follower to catch up", || {
        back.high_watermark() == end && back.log_start_offset() == start
    })
    .await;
    // Its own copy starts at the new start (its old segments are gone, nothing of the gap was
    // invented), and it holds every acknowledged record from there, as the leader does.
    let first = back.segments().first().map(|s| s.base_kafka).unwrap();
    assert_eq!(
        first, start,
        "the follower's log was reset to the snapshot's start"
    );
    let want: BTreeMap<i64, Vec<u8>> = acked.range(start..).map(|(k, v)| (*k, v.clone())).collect();
    assert_eq!(records_from(&leader, start), want);
    let from_follower = {
        let mut out = BTreeMap::new();
        let mut offset = start;
        while offset < end {
            let read = back.read_past_high_watermark(offset, 64 << 10).unwrap();
            assert!(!read.records.is_empty(), "follower: nothing at {offset}");
            for b in kiln_log::batch::batches(&read.records) {
                let b = b.unwrap();
                out.insert(b.header.base_offset, b.bytes[16..].to_vec());
            }
            offset = read.next_offset;
        }
        out
    };
    assert_eq!(from_follower, want);
    for b in &brokers {
        b.stop().await;
    }
}
