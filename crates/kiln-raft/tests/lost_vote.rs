//! A replica whose latest vote record is lost never follows or votes for a term below the
//! highest term in its own log. The interleaving: leader B is cut off in term T−1; the others
//! elect a leader in term T and commit entries of term T on R; R's vote file loses its saves;
//! then B, still believing it leads in term T−1, sends R AppendEntries that would truncate
//! those committed entries, and asks for votes in term T−1. Over real sockets and files
//! (docs/replication.md, "Damage and full disks").
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use bytes::Bytes;
use kiln_raft::ReplicatedPartition;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, VoteRequest};
use openraft::{CommittedLeaderId, LogId, Vote};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_leader_cannot_truncate_a_replica_that_lost_its_vote_record() {
    let dir = tempfile::tempdir().unwrap();
    let (brokers, peers) = start_cluster(dir.path(), None).await;
    let first = wait_for_leader_of(&brokers).await;
    for i in 0..10 {
        first.append(Bytes::from(record(i))).await.unwrap();
    }
    let stale_term = first.raft().metrics().borrow().current_term;
    let stale_id = first.id();
    // The first leader goes away; the other two elect a leader in a higher term and commit.
    let stale = brokers.iter().position(|b| b.id == stale_id).unwrap();
    brokers[stale].stop().await;
    let second = {
        let live: Vec<&ReplicatedPartition> = brokers
            .iter()
            .filter(|b| b.id != stale_id)
            .map(|b| &b.replica)
            .collect();
        wait_for_leader(&live).await
    };
    for i in 10..30 {
        second.append(Bytes::from(record(i))).await.unwrap();
    }
    let term = second.raft().metrics().borrow().current_term;
    assert!(term > stale_term);
    let r = brokers
        .iter()
        .position(|b| b.id != stale_id && b.id != second.id())
        .unwrap();
    let r_id = brokers[r].id;
    wait_until("R to hold every committed record", || {
        brokers[r].replica.high_watermark() == 30
    })
    .await;
    let last = brokers[r]
        .replica
        .raft()
        .metrics()
        .borrow()
        .last_log_index
        .unwrap();

    // R stops, and its vote file loses every save (zeros over the whole file).
    for b in brokers.iter().filter(|b| b.id != stale_id) {
        b.stop().await;
    }
    let vote_file = dir.path().join(format!("broker-{r_id}")).join("vote");
    let len = std::fs::metadata(&vote_file).unwrap().len();
    std::fs::write(&vote_file, vec![0u8; len as usize]).unwrap();

    // R alone restarts (its peers stay down, so only the stale leader's messages reach it).
    let listener = tokio::net::TcpListener::bind(&peers[&r_id]).await.unwrap();
    let home = dir.path().join(format!("broker-{r_id}"));
    let restarted = start_broker(r_id, &home, listener, &peers).await;
    assert_eq!(
        restarted.recovery.vote.records, 0,
        "{:?}",
        restarted.recovery.vote
    );
    let replica = &restarted.replica;

    // The stale leader's AppendEntries: an empty log before it, so everything R holds would
    // conflict and be cut. R answers with its higher vote and keeps every entry.
    let stale_vote = Vote::new_committed(stale_term, stale_id);
    let append = AppendEntriesRequest {
        vote: stale_vote,
        prev_log_id: Some(LogId::new(CommittedLeaderId::new(stale_term, stale_id), 0)),
        entries: vec![],
        leader_commit: None,
    };
    let answer = replica.raft().append_entries(append).await.unwrap();
    match answer {
        AppendEntriesResponse::HigherVote(v) => assert!(v.leader_id.term >= term, "{v:?}"),
        other => panic!("a replica that lost its vote followed a stale leader: {other:?}"),
    }
    let vote = replica
        .raft()
        .vote(VoteRequest::new(Vote::new(stale_term, stale_id), None))
        .await
        .unwrap();
    assert!(
        !vote.vote_granted,
        "granted a vote in a stale term: {vote:?}"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = replica.raft().metrics().borrow().last_log_index;
    assert_eq!(after, Some(last), "R's log was cut");
    restarted.stop().await;
}
