//! A replica whose log was damaged while it was down, over real sockets and files: it
//! detects the damage, serves none of it, refuses vote requests over TCP while it repairs, is
//! refilled by the leader, and votes again (docs/replication.md, "Damage and full disks").
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use kiln_log::LogTail;
use kiln_raft::net::TcpNetwork;
use kiln_raft::ReplicatedPartition;
use openraft::error::RPCError;
use openraft::network::RPCOption;
use openraft::raft::VoteRequest;
use openraft::{EmptyNode, RaftNetwork, RaftNetworkFactory, Vote};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_damaged_replica_refuses_votes_until_its_peers_have_repaired_it() {
    let dir = tempfile::tempdir().unwrap();
    let (brokers, peers) = start_cluster(dir.path(), None).await;
    let all: Vec<&ReplicatedPartition> = brokers.iter().map(|b| &b.replica).collect();
    let leader = wait_for_leader(&all).await;
    let mut acked = BTreeMap::new();
    for i in 0..30 {
        let batch = record(i);
        let ack = leader.append(Bytes::from(batch.clone())).await.unwrap();
        acked.insert(ack.base_offset, batch);
    }
    wait_until("every replica to hold 30 records", || {
        all.iter().all(|r| r.high_watermark() == 30)
    })
    .await;
    let damaged_id = brokers.iter().find(|b| b.id != leader.id()).unwrap().id;
    let term_before = leader.raft().metrics().borrow().current_term;
    for b in &brokers {
        b.stop().await;
    }
    drop(brokers);

    // A flipped bit in the middle of a synced log, while the broker is down.
    let path = dir
        .path()
        .join(format!("broker-{damaged_id}"))
        .join(format!("{:020}.log", 0));
    let mut bytes = std::fs::read(&path).unwrap();
    let at = 4096 + (bytes.len() - 4096) / 2;
    bytes[at] ^= 0x08;
    std::fs::write(&path, &bytes).unwrap();

    // The damage lies before the checkpoint a clean shutdown leaves, so the first start trusts
    // it (restarts stay fast); the first read of it finds it, serves nothing, and leaves the
    // log to be checked whole at the next start.
    let home = |id: u64| dir.path().join(format!("broker-{id}"));
    {
        let (mut listeners, peers) = listeners(Some(&peers)).await;
        let first = start_broker(
            damaged_id,
            &home(damaged_id),
            listeners.remove(damaged_id as usize - 1),
            &peers,
        )
        .await;
        assert!(!first.recovery.repairing());
        let mut offset = 0;
        let mut refused = false;
        while offset < 30 {
            match first.replica.read_past_high_watermark(offset, 64 << 10) {
                Ok(r) if !r.records.is_empty() => offset = r.next_offset,
                Ok(_) => break,
                Err(e) => {
                    assert!(e.to_string().contains("corrupt"), "{e}");
                    refused = true;
                    break;
                }
            }
        }
        assert!(refused, "the damaged batch was served");
        first.stop().await;
    }

    // The damaged replica starts again, alone: nobody can refill it yet.
    let (mut listeners, peers) = listeners(Some(&peers)).await;
    let damaged_listener = listeners.remove(damaged_id as usize - 1);
    let damaged = start_broker(damaged_id, &home(damaged_id), damaged_listener, &peers).await;
    let LogTail::Damaged(d) = &damaged.recovery.log.tail else {
        panic!("damage not detected: {:?}", damaged.recovery);
    };
    assert!(
        d.synced_through.is_some_and(|s| s > d.first_lost_index),
        "{d:?}"
    );
    assert!(damaged.recovery.repairing());
    assert!(damaged.replica.repairing());
    // Nothing past the damage is served: what it serves is what its cut log still holds.
    assert!(damaged.replica.high_watermark() <= damaged.replica.log_end_offset());
    assert!(damaged.replica.log_end_offset() < 30);

    // Its listener refuses a vote request for the group while it repairs.
    let mut network = TcpNetwork::new(GROUP, peers.clone(), Duration::from_secs(2));
    let mut link = network.new_client(damaged_id, &EmptyNode {}).await;
    let ask = VoteRequest::new(Vote::new(1_000, 99), None);
    let answer = link
        .vote(ask.clone(), RPCOption::new(Duration::from_secs(2)))
        .await;
    assert!(
        matches!(&answer, Err(RPCError::Unreachable(e)) if e.to_string().contains("repairing")),
        "{answer:?}"
    );
    // Alone for a while, it does not stand for election either.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        damaged.replica.raft().metrics().borrow().current_term,
        term_before
    );

    let mut brokers = vec![damaged];
    for (id, listener) in (1..=3u64).filter(|&id| id != damaged_id).zip(listeners) {
        brokers.push(start_broker(id, &home(id), listener, &peers).await);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let damaged = &brokers[0];

    // The other two elect a leader (or the old one resumes), which refills it.
    let all: Vec<&ReplicatedPartition> = brokers.iter().map(|b| &b.replica).collect();
    let leader = wait_for_leader(&all).await;
    assert_ne!(leader.id(), damaged_id);
    for i in 30..35 {
        let batch = record(i);
        let ack = leader.append(Bytes::from(batch.clone())).await.unwrap();
        acked.insert(ack.base_offset, batch);
    }
    wait_until("the repair to finish", || !damaged.replica.repairing()).await;
    wait_until("every replica to converge", || {
        all.iter().all(|r| r.high_watermark() == 35)
    })
    .await;
    for r in &all {
        assert_log_holds(r, &acked);
    }
    // And it no longer refuses votes for repairing: this one is refused because it hears
    // from its leader (its vote lease), or not granted for being stale.
    let answer = link
        .vote(
            VoteRequest::new(Vote::new(1, 99), None),
            RPCOption::new(Duration::from_secs(2)),
        )
        .await;
    assert!(
        match &answer {
            Ok(resp) => !resp.vote_granted,
            Err(RPCError::Unreachable(e)) => e.to_string().contains("heard from its leader"),
            Err(_) => false,
        },
        "{answer:?}"
    );
    for b in &brokers {
        b.stop().await;
    }
    // The repair is on record: a restart does not repair again.
    drop(brokers);
    let (brokers, _) = start_cluster(dir.path(), Some(&peers)).await;
    let again = brokers.iter().find(|b| b.id == damaged_id).unwrap();
    assert!(!again.recovery.repairing(), "{:?}", again.recovery);
    for b in &brokers {
        b.stop().await;
    }
}
