//! A full disk is waited out (docs/replication.md, "Damage and full disks"): three replicas
//! over real sockets and files, one of whose log segments fail writes with ENOSPC while a
//! flag is set; and one replica on a real 4 MiB tmpfs filled to the last byte (the test needs
//! permission to mount one, and fails without it unless `KILN_TEST_NO_MOUNT=1` says that this
//! machine cannot).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kiln_log::fs::RealFs;
use kiln_raft::partition::raft_config;
use kiln_raft::sim::build_batch;
use kiln_raft::{PartitionError, ReplicatedPartition, StartOptions};
use support::*;

/// Appends `range` through `leader`, recording each acknowledged record at its offset.
async fn append_all(
    leader: &ReplicatedPartition,
    range: std::ops::Range<usize>,
    acked: &mut BTreeMap<i64, Vec<u8>>,
) {
    for i in range {
        let batch = record(i);
        let ack = tokio::time::timeout(WAIT, leader.append(Bytes::from(batch.clone())))
            .await
            .expect("append timed out")
            .unwrap();
        acked.insert(ack.base_offset, batch);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_with_a_full_disk_falls_behind_and_catches_up() {
    let dir = tempfile::tempdir().unwrap();
    let (brokers, _) = start_cluster(dir.path(), None).await;
    let all: Vec<&ReplicatedPartition> = brokers.iter().map(|b| &b.replica).collect();
    let leader = wait_for_leader(&all).await;
    let mut acked = BTreeMap::new();
    append_all(&leader, 0..10, &mut acked).await;

    let follower = brokers.iter().find(|b| b.id != leader.id()).unwrap();
    follower.faults.set_full(true);
    // The leader and the other follower still make a majority.
    append_all(&leader, 10..40, &mut acked).await;
    wait_until("the follower to report a full disk", || {
        follower.replica.disk_full()
    })
    .await;
    assert!(follower.replica.high_watermark() < 40);
    assert!(!leader.disk_full());

    follower.faults.set_full(false);
    wait_until("the follower to catch up", || {
        follower.replica.high_watermark() == 40
    })
    .await;
    assert!(!follower.replica.disk_full());
    append_all(&leader, 40..45, &mut acked).await;
    wait_until("every replica to converge", || {
        all.iter().all(|r| r.high_watermark() == 45)
    })
    .await;
    for r in &all {
        assert_log_holds(r, &acked);
    }
    for b in &brokers {
        b.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_with_a_full_disk_is_replaced_and_rejoins() {
    let dir = tempfile::tempdir().unwrap();
    let (brokers, _) = start_cluster(dir.path(), None).await;
    let all: Vec<&ReplicatedPartition> = brokers.iter().map(|b| &b.replica).collect();
    let old = wait_for_leader(&all).await;
    let old_epoch = old.leader_epoch().unwrap();
    let mut acked = BTreeMap::new();
    append_all(&old, 0..10, &mut acked).await;

    let old_broker = brokers.iter().find(|b| b.id == old.id()).unwrap();
    old_broker.faults.set_full(true);
    // This append reaches the leader's log write and waits there for space: its core can do
    // nothing else meanwhile, heartbeats included.
    let stuck = {
        let old = old.clone();
        tokio::spawn(async move { old.append(Bytes::from(record(999))).await })
    };
    wait_until("the old leader to report a full disk", || old.disk_full()).await;

    let others: Vec<&ReplicatedPartition> = brokers
        .iter()
        .filter(|b| b.id != old.id())
        .map(|b| &b.replica)
        .collect();
    let new = wait_for_leader(&others).await;
    assert!(new.leader_epoch().unwrap() > old_epoch);
    append_all(&new, 10..30, &mut acked).await;
    // The old leader's append waits for space, or was answered NOT_LEADER once its lease
    // lapsed (its fate unknown to the producer, who retries): never acknowledged while stuck.
    let answered_while_full = stuck.is_finished();

    old_broker.faults.set_full(false);
    // Its append finishes (in a log the new leader then overwrites) and it rejoins.
    let outcome = tokio::time::timeout(WAIT, stuck).await.unwrap().unwrap();
    match outcome {
        Ok(ack) => {
            assert!(!answered_while_full, "acknowledged while its disk was full");
            // If it was committed after all, it must be in the log like any other.
            acked.insert(ack.base_offset, record(999));
        }
        Err(e) => assert!(
            !answered_while_full || matches!(e, PartitionError::NotLeader { .. }),
            "{e}"
        ),
    }
    append_all(&new, 30..35, &mut acked).await;
    let end = acked.len() as i64;
    wait_until("every replica to converge", || {
        all.iter().all(|r| r.high_watermark() == end)
    })
    .await;
    assert!(!old.disk_full());
    for r in &all {
        assert_log_holds(r, &acked);
    }
    for b in &brokers {
        b.stop().await;
    }
}

/// Unmounts on drop, so a failing test leaves no mount behind.
struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Without permission to mount, the tmpfs test fails, unless `KILN_TEST_NO_MOUNT=1` opts out
/// on purpose (then it says so and tests nothing).
fn cannot_mount(why: &str) {
    if std::env::var("KILN_TEST_NO_MOUNT").as_deref() == Ok("1") {
        eprintln!("NOT RUN real_tmpfs_full_disk (KILN_TEST_NO_MOUNT=1): {why}");
        return;
    }
    panic!(
        "real_tmpfs_full_disk needs to mount a 4 MiB tmpfs (root or CAP_SYS_ADMIN): {why}. \
         Set KILN_TEST_NO_MOUNT=1 to run the other tests on a machine that cannot."
    );
}

/// A real full filesystem: a single-replica group on a 4 MiB tmpfs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_tmpfs_full_disk() {
    let dir = tempfile::tempdir().unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"])
        .arg(dir.path())
        .output();
    match mounted {
        Ok(out) if out.status.success() => {}
        Ok(out) => {
            return cannot_mount(&format!(
                "mount -t tmpfs failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
        Err(e) => return cannot_mount(&format!("cannot run mount: {e}")),
    }
    let _mount = Mount(dir.path().to_path_buf());
    let open = || async {
        let network = kiln_raft::net::TcpNetwork::new("solo/0", Arc::new(BTreeMap::new()), WAIT);
        let mut opts =
            StartOptions::data(1, raft_config(50, 150, 300), Arc::new(RealFs), dir.path());
        opts.repairable = false;
        ReplicatedPartition::start(opts, network).await.unwrap().0
    };
    let replica = open().await;
    replica.initialize(BTreeSet::from([1])).await.unwrap();
    wait_until("the single replica to lead", || {
        replica.leader_epoch().is_some()
    })
    .await;
    let batch = |i: usize| {
        Bytes::from(build_batch(
            &[vec![b'x'; 2000], i.to_be_bytes().to_vec()],
            0,
        ))
    };
    for i in 0..5 {
        replica.append(batch(i)).await.unwrap();
    }

    // Fill the filesystem to the last byte.
    let filler_path = dir.path().join("filler");
    let mut filler = std::fs::File::create(&filler_path).unwrap();
    let chunk = vec![0u8; 64 << 10];
    let mut filled = 0usize;
    loop {
        match filler.write(&chunk) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if kiln_raft::is_disk_full(&e) => break,
            Err(e) => panic!("filling the tmpfs: {e}"),
        }
    }
    let _ = filler.flush();
    assert!(filled > 1 << 20, "filled only {filled} bytes");

    let pending = {
        let replica = replica.clone();
        tokio::spawn(async move { replica.append(batch(5)).await })
    };
    wait_until("the replica to report a full disk", || replica.disk_full()).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!pending.is_finished(), "the append waits for space");

    drop(filler);
    std::fs::remove_file(&filler_path).unwrap();
    let ack = tokio::time::timeout(WAIT, pending)
        .await
        .expect("the append finishes once there is space")
        .unwrap()
        .unwrap();
    assert_eq!(ack.base_offset, 10, "two records per batch");
    assert!(!replica.disk_full());
    replica.append(batch(6)).await.unwrap();
    replica.shutdown().await;

    // Everything acknowledged is on the filesystem, whole.
    let replica = open().await;
    assert_eq!(replica.log_end_offset(), 14);
    replica.shutdown().await;
}
