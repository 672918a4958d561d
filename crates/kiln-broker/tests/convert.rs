//! A data directory of the previous standalone layout (fixtures/kiln/layout-v1, written by
//! that version's own broker; see fixtures/kiln/layout-v1.md) is converted on the first start: same topics and
//! ids, every record at its offset (a partition whose retention had moved its start keeps it),
//! every committed offset, the cluster id; the old files are kept aside; a second start does
//! nothing more. The previous cluster layout is refused with a message.
#![allow(clippy::unwrap_used)]

mod groups_common;

use std::path::Path;

use groups_common::*;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::*;
use kafka_protocol::records::RecordBatchDecoder;
use kiln_client::Connection;

/// Relative to this crate.
const FIXTURE: &str = "../../fixtures/kiln/layout-v1/data";

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

/// (error code, log start, every record's (offset, value)) of fetches from `from` on.
async fn fetch_all(
    conn: &mut Connection,
    topic: &str,
    partition: i32,
    from: i64,
) -> (i16, i64, Vec<(i64, Vec<u8>)>) {
    let mut out = Vec::new();
    let mut offset = from;
    loop {
        let request = FetchRequest::default()
            .with_max_wait_ms(0)
            .with_min_bytes(0)
            .with_max_bytes(1 << 20)
            .with_topics(vec![FetchTopic::default()
                .with_topic(topic_name(topic))
                .with_partitions(vec![FetchPartition::default()
                    .with_partition(partition)
                    .with_fetch_offset(offset)
                    .with_partition_max_bytes(1 << 20)])]);
        let ResponseKind::Fetch(r) = conn
            .call_at(11, RequestKind::Fetch(request), T)
            .await
            .unwrap()
        else {
            panic!("Fetch")
        };
        let p = &r.responses[0].partitions[0];
        if p.error_code != 0 {
            return (p.error_code, p.log_start_offset, out);
        }
        let mut bytes = p.records.clone().unwrap_or_default();
        if bytes.is_empty() {
            return (0, p.log_start_offset, out);
        }
        for set in RecordBatchDecoder::decode_all(&mut bytes).unwrap() {
            for rec in set.records {
                out.push((
                    rec.offset,
                    rec.value.map(|v| v.to_vec()).unwrap_or_default(),
                ));
                offset = rec.offset + 1;
            }
        }
        if offset >= p.high_watermark {
            return (0, p.log_start_offset, out);
        }
    }
}

/// ListOffsets EARLIEST (-2) or LATEST (-1).
async fn list_offset(conn: &mut Connection, topic: &str, partition: i32, which: i64) -> i64 {
    let request = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(topic_name(topic))
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(partition)
                .with_timestamp(which)])]);
    let ResponseKind::ListOffsets(r) = conn
        .call_at(2, RequestKind::ListOffsets(request), T)
        .await
        .unwrap()
    else {
        panic!("ListOffsets")
    };
    let p = &r.topics[0].partitions[0];
    assert_eq!(p.error_code, 0);
    p.offset
}

async fn check_converted(b: &TestBroker) {
    let mut conn = b.connect().await;
    let topics = b.broker.cluster.topics();
    let mut names: Vec<(String, String, i32)> = topics
        .iter()
        .map(|t| (t.name.clone(), t.id.to_string(), t.partition_count()))
        .collect();
    names.sort();
    assert_eq!(
        names,
        vec![
            ("aged".to_string(), names[0].1.clone(), 1),
            (
                "orders".to_string(),
                "34e211f2-5083-4ffa-a516-b4209a7f7742".to_string(),
                2
            ),
        ]
    );
    for p in 0..2 {
        let (code, start, records) = fetch_all(&mut conn, "orders", p, 0).await;
        assert_eq!((code, start), (0, 0));
        let want: Vec<(i64, Vec<u8>)> = (0..20)
            .map(|k| {
                let i = k * 2 + i64::from(p);
                (k, format!("order-{i}").repeat(4).into_bytes())
            })
            .collect();
        // (The first start produces three more to orders/0; the second start finds them too.)
        assert_eq!(records[..20], want[..], "orders/{p}");
    }
    // Retention had removed offsets 0..39 of `aged`: the converted log starts at 40.
    assert_eq!(list_offset(&mut conn, "aged", 0, -2).await, 40);
    assert_eq!(list_offset(&mut conn, "aged", 0, -1).await, 60);
    let (code, start, records) = fetch_all(&mut conn, "aged", 0, 40).await;
    assert_eq!((code, start), (0, 40));
    let want: Vec<(i64, Vec<u8>)> = (40..60)
        .map(|i| (i, format!("aged-{i}").repeat(8).into_bytes()))
        .collect();
    assert_eq!(records, want);
    let (code, _, _) = fetch_all(&mut conn, "aged", 0, 0).await;
    assert_eq!(code, 1, "below the log start is OFFSET_OUT_OF_RANGE");
    // Committed offsets.
    assert_eq!(fetch_offset(&mut conn, "burnin", "orders", 0).await.0, 17);
    assert_eq!(fetch_offset(&mut conn, "burnin", "orders", 1).await.0, 9);
    // The metadata exactly as the old store held it (confluent-kafka sent it with a NUL).
    assert_eq!(
        fetch_offset(&mut conn, "triage", "aged", 0).await,
        (55, Some("checkpoint\0".to_string()), 0)
    );
    assert_eq!(
        b.broker.cluster_id().as_deref(),
        Some("kiln-f8511061f1b54f778c84ffca67e4fda4")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_of_the_older_layout_is_converted_on_first_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    copy_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join(FIXTURE), &data);
    let tweak = |c: &mut kiln_broker::BrokerConfig| c.node_id = 1;
    let b = start(data.clone(), tweak).await;
    check_converted(&b).await;
    // The old files are kept aside, untouched; the new layout is in place.
    assert!(!data.join("topics").exists() && !data.join("internal").exists());
    assert!(data
        .join("legacy-layout/topics/orders/0/00000000000000000000.log")
        .exists());
    assert!(data
        .join("legacy-layout/internal/consumer-offsets/CURRENT")
        .exists());
    // New records follow the converted ones.
    let mut conn = b.connect().await;
    produce(&mut conn, "orders", 0, 3).await;
    let (_, _, records) = fetch_all(&mut conn, "orders", 0, 19).await;
    assert_eq!(
        records.iter().map(|r| r.0).collect::<Vec<_>>(),
        vec![19, 20, 21, 22]
    );
    drop(conn);
    // A second start converts nothing again and finds everything where it was.
    let data = b.stop().await;
    let b = start(data, tweak).await;
    check_converted(&b).await;
    b.stop().await;
}

#[tokio::test]
async fn a_directory_of_the_older_cluster_layout_is_refused_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let replica = dir
        .path()
        .join("replicas/34e211f2-5083-4ffa-a516-b4209a7f7742/0");
    std::fs::create_dir_all(&replica).unwrap();
    std::fs::write(replica.join("raft.log"), b"old frames").unwrap();
    std::fs::write(replica.join("vote"), b"old vote").unwrap();
    let config = kiln_broker::BrokerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.path().to_path_buf(),
        metrics_listen: "off".into(),
        ..kiln_broker::BrokerConfig::default()
    };
    let refused = match kiln_broker::Broker::bind(config).await {
        Ok(_) => panic!("a directory of the older cluster layout was taken"),
        Err(e) => format!("{e:#}"),
    };
    assert!(refused.contains("older cluster layout"), "{refused}");
    assert!(refused.contains("docs/operations.md"), "{refused}");
    // Nothing was changed or removed.
    assert_eq!(
        std::fs::read(replica.join("raft.log")).unwrap(),
        b"old frames"
    );
}
