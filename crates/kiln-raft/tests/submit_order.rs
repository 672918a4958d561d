//! A leader's appends keep their submit order whichever way each reaches the log: written at
//! once by the task that submits it (`Proposer::write_now`, while a slot is free and nothing
//! is queued), or queued and joined with its neighbours by the proposing task. A burst of
//! submits from one task mixes both; every append is answered with offsets in submit order, and
//! every replica holds the records at those offsets. Over real sockets and files.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;

use bytes::Bytes;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn appends_written_at_once_and_queued_keep_their_submit_order() {
    let dir = tempfile::tempdir().unwrap();
    let (brokers, _) = start_cluster(dir.path(), None).await;
    let leader = wait_for_leader_of(&brokers).await;
    // The first append takes up the term (the proposer learns its offsets).
    let mut expected = BTreeMap::new();
    expected.insert(0i64, record(0));
    leader
        .proposer()
        .submit_produce(Bytes::from(record(0)), true)
        .await
        .unwrap()
        .unwrap();
    // Bursts: the first appends of each go out at once, the rest queue behind them.
    let mut next = 1usize;
    for _ in 0..10 {
        let mut waiting = Vec::new();
        for _ in 0..40 {
            let rx = leader
                .proposer()
                .submit_produce(Bytes::from(record(next)), true);
            waiting.push((next, rx));
            next += 1;
        }
        for (i, rx) in waiting {
            let ack = rx.await.unwrap().unwrap();
            assert_eq!(
                ack.base_offset, i as i64,
                "append {i} answered out of order"
            );
            assert_eq!(ack.last_offset, i as i64);
            expected.insert(i as i64, record(i));
        }
    }
    for b in &brokers {
        let replica = b.replica.clone();
        wait_until("the replica has every record", || {
            replica.high_watermark() == expected.len() as i64
        })
        .await;
        assert_log_holds(&replica, &expected);
    }
    for b in &brokers {
        b.stop().await;
    }
}
