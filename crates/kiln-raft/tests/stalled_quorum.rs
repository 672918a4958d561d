//! A leader whose quorum is gone while producers keep submitting: its proposer's queue stays
//! within `PROPOSER_QUEUE_BYTES_MAX` (past it appends are refused at once, retriably), and an
//! append whose producer stopped waiting (a produce that timed out) is never written once the
//! quorum is back, so it cannot land behind the client's retry; an idempotent producer's batch
//! sent behind a dropped one is answered retriably, not as out of sequence; a new leader whose
//! first entry cannot commit does not call its high watermark current. Over real sockets and
//! files.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeSet;

use bytes::Bytes;
use kiln_raft::partition::PROPOSER_QUEUE_BYTES_MAX;
use kiln_raft::sim::{build_batch, build_idempotent_batch};
use kiln_raft::PartitionError;
use support::*;

/// One record of `bytes` bytes whose first eight say `i`.
fn big_record(i: u64, bytes: usize) -> Bytes {
    let mut value = vec![b'.'; bytes];
    value[..8].copy_from_slice(&i.to_be_bytes());
    Bytes::from(build_batch(&[value], 1_700_000_000_000))
}

/// Stops every broker but `leader`'s; returns their indexes in `brokers`.
async fn stop_followers(brokers: &[Broker], leader: &kiln_raft::ReplicatedPartition) -> Vec<usize> {
    let followers: Vec<usize> = (0..brokers.len())
        .filter(|&i| brokers[i].id != leader.id())
        .collect();
    for &i in &followers {
        brokers[i].stop().await;
    }
    followers
}

/// Starts `followers` again on their files and addresses, standing for no election while the
/// leader reaches them again (`start_patient_follower`).
async fn restart_patient(
    brokers: &[Broker],
    followers: &[usize],
    peers: &kiln_raft::net::PeerAddrs,
    root: &std::path::Path,
) -> Vec<Broker> {
    let mut restarted = Vec::new();
    for &i in followers {
        let id = brokers[i].id;
        let listener = tokio::net::TcpListener::bind(&peers[&id]).await.unwrap();
        let home = root.join(format!("broker-{id}"));
        restarted.push(start_patient_follower(id, &home, listener, peers).await);
    }
    restarted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stalled_quorum_keeps_the_queue_bounded_and_drops_abandoned_appends() {
    let dir = tempfile::tempdir().unwrap();
    let (brokers, peers) = start_cluster_long_lease(dir.path()).await;
    let leader = wait_for_leader_of(&brokers).await;
    let term = leader.leader_epoch().unwrap();
    // One append while the quorum is whole: the proposer has taken up its term.
    leader
        .proposer()
        .submit(big_record(u64::MAX, 1024))
        .await
        .unwrap()
        .unwrap();
    // Both followers go away: nothing can commit.
    let followers = stop_followers(&brokers, &leader).await;

    // Submit 1 MiB appends until the proposer refuses one.
    let record_bytes = 1 << 20;
    let mut waiting = Vec::new();
    let mut refused = 0;
    for i in 0..(PROPOSER_QUEUE_BYTES_MAX / record_bytes + 16) as u64 {
        let mut rx = leader
            .proposer()
            .submit_produce(big_record(i, record_bytes), true);
        match rx.try_recv() {
            Ok(Err(PartitionError::QueueFull { queued, max })) => {
                assert_eq!(max, PROPOSER_QUEUE_BYTES_MAX);
                assert!(queued <= max, "{queued} queued, bound {max}");
                refused += 1;
            }
            Ok(other) => panic!("append {i} answered while no quorum exists: {other:?}"),
            Err(_) => waiting.push((i, rx)),
        }
        assert!(leader.proposer().queued_bytes() <= PROPOSER_QUEUE_BYTES_MAX);
    }
    assert!(
        refused >= 8,
        "only {refused} appends refused past the bound"
    );
    assert!(
        leader.proposer().queued_bytes() + 2 * record_bytes > PROPOSER_QUEUE_BYTES_MAX,
        "the queue filled up to its bound: {} bytes",
        leader.proposer().queued_bytes()
    );

    // The producers of every other queued append give up (their produce timed out). The
    // first few appends are already proposed (in flight in Raft) and will commit regardless.
    let (kept, abandoned): (Vec<_>, Vec<_>) = waiting.into_iter().partition(|(i, _)| i % 2 == 0);
    let abandoned: BTreeSet<u64> = abandoned.into_iter().map(|(i, _)| i).collect();

    // The followers come back on their files and addresses; the quorum is whole again. They
    // stand for no election meanwhile: one that did would take the term (its log is as long
    // as the other's), and the queued appends would be refused, which is another test.
    let restarted = restart_patient(&brokers, &followers, &peers, dir.path()).await;
    let mut acked = BTreeSet::new();
    for (i, rx) in kept {
        match rx.await.unwrap() {
            Ok(_) => {
                acked.insert(i);
            }
            Err(e) => panic!("append {i}: {e}"),
        }
    }
    assert_eq!(
        leader.leader_epoch(),
        Some(term),
        "the leader kept its term (else the queued appends were refused, not dropped)"
    );

    // What the log holds: every acknowledged append, and of the abandoned ones only those the
    // proposer had already handed to Raft before their producers gave up.
    let hw = leader.high_watermark();
    let mut written = BTreeSet::new();
    let mut offset = 0;
    while offset < hw {
        let read = leader.read(offset, 4 << 20).unwrap();
        for b in kiln_log::batch::batches(&read.records) {
            let b = b.unwrap();
            if b.bytes.len() > record_bytes {
                let value = &b.bytes[b.bytes.len() - record_bytes - 1..];
                written.insert(u64::from_be_bytes(value[..8].try_into().unwrap()));
            }
            offset = b.header.base_offset + 1;
        }
    }
    assert!(
        acked.is_subset(&written),
        "an acknowledged append is missing"
    );
    let late: Vec<u64> = abandoned.intersection(&written).copied().collect();
    assert!(
        late.iter().all(|&i| i < 8),
        "abandoned appends written after the quorum returned: {late:?}"
    );
    assert!(
        abandoned.iter().filter(|&&i| i >= 8).count() > 20,
        "the test abandoned too few queued appends"
    );
    println!(
        "{} appends refused past {} MiB queued; {} acknowledged; {} abandoned, {} of them written (already proposed)",
        refused,
        PROPOSER_QUEUE_BYTES_MAX >> 20,
        acked.len(),
        abandoned.len(),
        late.len()
    );
    for b in restarted.iter().chain(brokers.iter()) {
        b.stop().await;
    }
}

/// One record from idempotent producer 7 at `sequence`.
fn idempotent(sequence: i32) -> Bytes {
    let value = format!("seq {sequence}").into_bytes();
    Bytes::from(build_idempotent_batch(
        &[value],
        1_700_000_000_000,
        7,
        sequence,
    ))
}

// librdkafka answers OUT_OF_ORDER_SEQUENCE_NUMBER on any request but its first in flight by
// starting a new epoch, which duplicates what other partitions may hold (librdkafka issue
// 4953). A batch queued behind one the proposer dropped is therefore refused retriably
// (for a while: `proposer.rs`, `Gaps`, unit-tested there).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_behind_a_dropped_one_of_its_producer_is_refused_retriably() {
    let dir = tempfile::tempdir().unwrap();
    let (brokers, peers) = start_cluster_long_lease(dir.path()).await;
    let leader = wait_for_leader_of(&brokers).await;
    let first = leader
        .proposer()
        .submit(idempotent(0))
        .await
        .unwrap()
        .unwrap();
    let followers = stop_followers(&brokers, &leader).await;
    // Every entry slot taken by a write that cannot commit yet, one entry each.
    let mut in_flight = Vec::new();
    for i in 0..4u64 {
        in_flight.push(leader.proposer().submit(big_record(i, 1024)));
        wait_until("the write to be proposed", || {
            leader.proposer().entries_in_flight() == i as usize + 1
        })
        .await;
    }
    // Sequence 1 waits for a slot; its producer gives up (the produce timed out). Sequence 2,
    // pipelined behind it, is still waited for.
    drop(leader.proposer().submit_produce(idempotent(1), true));
    let behind = leader.proposer().submit_produce(idempotent(2), true);

    let restarted = restart_patient(&brokers, &followers, &peers, dir.path()).await;
    for rx in in_flight {
        rx.await.unwrap().unwrap();
    }
    match behind.await.unwrap() {
        Err(PartitionError::EarlierBatchUnwritten {
            producer_id: 7,
            expected: 1,
            got: 2,
        }) => {}
        other => panic!("sequence 2 behind a dropped sequence 1 answered {other:?}"),
    }
    // The producer resends both, in order: written once each, right after the others.
    let one = leader
        .proposer()
        .submit(idempotent(1))
        .await
        .unwrap()
        .unwrap();
    let two = leader
        .proposer()
        .submit(idempotent(2))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(one.base_offset, first.base_offset + 5);
    assert_eq!(two.base_offset, one.base_offset + 1);
    // A rewind that is none of the kept batches is out of sequence at once.
    let rewind = build_idempotent_batch(&[b"a".to_vec(), b"b".to_vec()], 1_700_000_000_000, 7, 1);
    match leader.proposer().submit(Bytes::from(rewind)).await.unwrap() {
        Err(PartitionError::OutOfOrderSequence { .. }) => {}
        other => panic!("a rewind answered {other:?}"),
    }
    for b in restarted.iter().chain(brokers.iter()) {
        b.stop().await;
    }
}

/// A new leader whose follower's disk takes no writes cannot commit its term's first entry:
/// until it does, it says its high watermark is not current (ListOffsets answers
/// OFFSET_NOT_AVAILABLE then). Once the follower's disk takes writes again the entry commits,
/// and the high watermark is the one the previous leader acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_leaders_high_watermark_is_current_only_once_its_term_has_committed() {
    let dir = tempfile::tempdir().unwrap();
    let (brokers, peers) = start_cluster(dir.path(), None).await;
    let old = wait_for_leader_of(&brokers).await;
    for i in 0..10 {
        old.append(Bytes::from(record(i))).await.unwrap();
    }
    assert!(old.high_watermark_is_current());
    let acknowledged = old.high_watermark();
    assert_eq!(acknowledged, 10);
    let followers: Vec<usize> = (0..brokers.len())
        .filter(|&i| brokers[i].id != old.id())
        .collect();
    // One follower (C) restarts patient, so that the other (B) is the next leader; C's disk
    // is then full, so B's first entry reaches no majority.
    let (b, c) = (followers[0], followers[1]);
    brokers[c].stop().await;
    let c = restart_patient(&brokers, &[c], &peers, dir.path())
        .await
        .remove(0);
    wait_until("every replica to apply what was acknowledged", || {
        brokers[b].replica.high_watermark() == acknowledged
            && c.replica.high_watermark() == acknowledged
    })
    .await;
    c.faults.set_full(true);
    brokers
        .iter()
        .find(|x| x.id == old.id())
        .unwrap()
        .stop()
        .await;
    let new = brokers[b].replica.clone();
    let raft_leader = || new.raft().metrics().borrow().state == openraft::ServerState::Leader;
    wait_until("B to win the election", raft_leader).await;
    for _ in 0..10 {
        assert!(raft_leader());
        assert!(
            !new.high_watermark_is_current(),
            "a leader whose term committed nothing says its high watermark is current"
        );
        tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    }
    // Its lease counts from the votes that elected it (a voter refuses others for its vote
    // lease); with no append acknowledged since, it lapses and B stops leading for clients
    // (`liveness.rs`), still Raft leader.
    wait_until("B's lease to lapse", || new.leader_epoch().is_none()).await;
    assert!(raft_leader());
    c.faults.set_full(false);
    wait_until("the new term's first entry to commit", || {
        new.high_watermark_is_current() && new.leads()
    })
    .await;
    assert_eq!(new.high_watermark(), acknowledged);
    brokers[b].stop().await;
    c.stop().await;
}

/// A leader cut off from its peers (its Raft links down, the replica itself running) does not
/// know it is deposed: openraft 0.9 keeps it Leader until it hears of a later term. Its lease
/// (`liveness.rs`) lapses first: it stops leading for clients, its pending write is answered
/// (NotLeader: fate unknown) instead of waiting forever, and at no moment do two replicas lead.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_cut_off_from_its_quorum_stops_leading_before_another_leads() {
    use std::sync::Arc;
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let cuts = Arc::new(kiln_raft::net::LinkCuts::default());
    let brokers = start_cluster_cuttable(dir.path(), &cuts).await;
    let old = wait_for_leader_of(&brokers).await;
    old.append(Bytes::from(record(0))).await.unwrap();
    assert!(old.leads());
    let term = old.leader_epoch().unwrap();
    cuts.isolate(old.id());
    let cut_at = tokio::time::Instant::now();
    let o = old.clone();
    let pending = tokio::spawn(async move { o.append(Bytes::from(record(1))).await });
    // Watch every replica until another one leads: never two at once.
    let others: Vec<&Broker> = brokers.iter().filter(|b| b.id != old.id()).collect();
    let mut fenced_after = None;
    let successor = tokio::time::timeout(WAIT, async {
        loop {
            let old_leads = old.leads();
            if !old_leads && fenced_after.is_none() {
                fenced_after = Some(cut_at.elapsed());
            }
            if let Some(b) = others.iter().find(|b| b.replica.leads()) {
                assert!(!old_leads, "two replicas lead at once");
                return b.replica.clone();
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .expect("no successor elected");
    let fenced_after = fenced_after.unwrap();
    println!(
        "cut-off leader stopped leading after {fenced_after:?}; successor led after {:?}",
        cut_at.elapsed()
    );
    // Still Leader to Raft, in its old term: only the lease tells it apart.
    {
        let m = old.raft().metrics().borrow().clone();
        assert_eq!(m.state, openraft::ServerState::Leader);
        assert_eq!(m.current_term, term);
    }
    assert_eq!(old.leader_epoch(), None);
    assert_eq!(old.leader_and_term().0, None);
    let answer = tokio::time::timeout(Duration::from_secs(5), pending)
        .await
        .expect("a write at a cut-off leader waited on past its lease")
        .unwrap();
    assert!(
        matches!(answer, Err(PartitionError::NotLeader { .. })),
        "{answer:?}"
    );
    // Healed, it learns of the later term and follows; the successor's log holds record 0.
    cuts.heal(old.id());
    wait_until("the old leader to follow", || {
        old.leader_and_term().0 == Some(successor.id())
    })
    .await;
    successor.append(Bytes::from(record(2))).await.unwrap();
    assert!(successor.high_watermark() >= 2);
    for b in &brokers {
        b.stop().await;
    }
}
