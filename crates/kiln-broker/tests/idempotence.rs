//! Idempotent producers over real TCP: InitProducerId, and per partition the producer's
//! sequence numbers checked by the leader (kiln-raft's `producers.rs`): a retried batch is
//! answered with its first write's offsets and written once, a gap is refused retriably and a
//! fenced epoch with Kafka's error, and all of it survives a restart; a producer the partition
//! holds no state for (never seen, or expired) may only start at sequence 0.
#![allow(clippy::unwrap_used)]

mod groups_common;

use groups_common::*;

const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
const NOT_ENOUGH_REPLICAS: i16 = 19;
const INVALID_PRODUCER_EPOCH: i16 = 47;
const UNKNOWN_PRODUCER_ID: i16 = 59;

/// The partition's high watermark, as a fetch from offset 0 reports it.
async fn high_watermark(b: &TestBroker, topic: &str) -> i64 {
    let t = b.broker.cluster.topic(topic).unwrap();
    b.broker
        .cluster
        .partition(&t, 0)
        .unwrap()
        .partition
        .high_watermark()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_batch_is_written_once_and_gaps_and_fenced_epochs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let b = start(dir.path().to_path_buf(), |_| {}).await;
    let mut conn = b.connect().await;
    create_topic(&mut conn, "idem", 1).await;

    let (code, pid, epoch) = init_producer_id(&mut conn).await;
    assert_eq!((code, epoch), (0, 0));
    let (code, other, _) = init_producer_id(&mut conn).await;
    assert_eq!(code, 0);
    assert_ne!(pid, other, "every InitProducerId gets a new id");

    let first = idempotent_batch(pid, 0, 0, 3);
    assert_eq!(
        produce_batch(&mut conn, "idem", 0, first.clone()).await,
        (0, 0)
    );
    // The same batch again (a retry after a lost answer): its first offsets, nothing written.
    assert_eq!(
        produce_batch(&mut conn, "idem", 0, first.clone()).await,
        (0, 0)
    );
    assert_eq!(high_watermark(&b, "idem").await, 3);
    assert_eq!(
        produce_batch(&mut conn, "idem", 0, idempotent_batch(pid, 0, 3, 2)).await,
        (0, 3)
    );
    // A gap: sequence 10 after 4. Sent behind batches that failed or are being retried, so
    // it is refused retriably, nothing written (out of sequence only once the gap has lasted
    // the retry window, `kiln-raft/src/proposer.rs`).
    let (code, _) = produce_batch(&mut conn, "idem", 0, idempotent_batch(pid, 0, 10, 1)).await;
    assert_eq!(code, NOT_ENOUGH_REPLICAS);
    // Another producer interleaves freely; a plain (non-idempotent) batch too.
    assert_eq!(
        produce_batch(&mut conn, "idem", 0, idempotent_batch(other, 0, 0, 1)).await,
        (0, 5)
    );
    assert_eq!(
        produce_batch(&mut conn, "idem", 0, batch(2, 1_700_000_000_000)).await,
        (0, 6)
    );
    // A new epoch starts at sequence 0; the old epoch is fenced from then on.
    let (code, _) = produce_batch(&mut conn, "idem", 0, idempotent_batch(pid, 1, 5, 1)).await;
    assert_eq!(
        code, OUT_OF_ORDER_SEQUENCE_NUMBER,
        "a new epoch must start at 0"
    );
    assert_eq!(
        produce_batch(&mut conn, "idem", 0, idempotent_batch(pid, 1, 0, 1)).await,
        (0, 8)
    );
    let (code, _) = produce_batch(&mut conn, "idem", 0, idempotent_batch(pid, 0, 5, 1)).await;
    assert_eq!(code, INVALID_PRODUCER_EPOCH);
    assert_eq!(high_watermark(&b, "idem").await, 9);

    // After a restart the producers are known again: the last batch is still a duplicate.
    drop(conn);
    let data = b.stop().await;
    let b = start(data, |_| {}).await;
    let mut conn = b.connect().await;
    assert_eq!(
        produce_batch(&mut conn, "idem", 0, idempotent_batch(pid, 1, 0, 1)).await,
        (0, 8)
    );
    assert_eq!(
        produce_batch(&mut conn, "idem", 0, idempotent_batch(pid, 1, 1, 1)).await,
        (0, 9)
    );
    let (code, pid_after, _) = init_producer_id(&mut conn).await;
    assert_eq!(code, 0);
    assert!(
        pid_after != pid && pid_after != other,
        "ids are never given twice, restarts included"
    );
    assert_eq!(high_watermark(&b, "idem").await, 10);
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_or_expired_producer_must_start_again_at_sequence_zero() {
    let dir = tempfile::tempdir().unwrap();
    let b = start(dir.path().to_path_buf(), |_| {}).await;
    let mut conn = b.connect().await;
    create_topic(&mut conn, "expiry", 1).await;
    let (_, old, _) = init_producer_id(&mut conn).await;
    let (_, late, _) = init_producer_id(&mut conn).await;

    // Never seen here: sequence 7 cannot be checked, so it is refused and nothing is written.
    let (code, _) = produce_batch(&mut conn, "expiry", 0, idempotent_batch(old, 0, 7, 1)).await;
    assert_eq!(code, UNKNOWN_PRODUCER_ID);
    assert_eq!(high_watermark(&b, "expiry").await, 0);
    let t0 = 1_700_000_000_000;
    assert_eq!(
        produce_batch(
            &mut conn,
            "expiry",
            0,
            idempotent_batch_at(old, 0, 0, 2, t0)
        )
        .await,
        (0, 0)
    );

    // Another producer writes a day and a second later (record time), past an expiry check:
    // the first producer, silent since, is forgotten (producer.id.expiration.ms, 1 day).
    let day_later = t0 + 86_400_000 + 1_000;
    assert_eq!(
        produce_batch(
            &mut conn,
            "expiry",
            0,
            idempotent_batch_at(late, 0, 0, 1_100, day_later)
        )
        .await,
        (0, 2)
    );
    let (code, _) = produce_batch(&mut conn, "expiry", 0, idempotent_batch(old, 0, 2, 1)).await;
    assert_eq!(
        code, UNKNOWN_PRODUCER_ID,
        "an expired producer's next batch"
    );
    assert_eq!(high_watermark(&b, "expiry").await, 1_102);
    // What a client does next (KIP-360): a new producer id, from sequence 0.
    let (_, renewed, _) = init_producer_id(&mut conn).await;
    assert_eq!(
        produce_batch(&mut conn, "expiry", 0, idempotent_batch(renewed, 0, 0, 1)).await,
        (0, 1_102)
    );

    // The same verdicts after a restart (the table is rebuilt from the state file and log).
    drop(conn);
    let data = b.stop().await;
    let b = start(data, |_| {}).await;
    let mut conn = b.connect().await;
    let (code, _) = produce_batch(&mut conn, "expiry", 0, idempotent_batch(old, 0, 2, 1)).await;
    assert_eq!(code, UNKNOWN_PRODUCER_ID, "still forgotten after a restart");
    assert_eq!(
        produce_batch(&mut conn, "expiry", 0, idempotent_batch(renewed, 0, 1, 1)).await,
        (0, 1_103)
    );
    b.stop().await;
}
