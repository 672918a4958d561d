//! Helpers shared by the groups_* integration tests: an in-process broker and typed wrappers
//! around the group APIs, all over real TCP through kiln-client.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition as AssignedPartition;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Encodable, StrBytes};
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use kiln_broker::{Broker, BrokerConfig};
use kiln_client::Connection;

pub const T: Duration = Duration::from_secs(10);

pub struct TestBroker {
    pub address: String,
    pub dir: PathBuf,
    pub broker: Arc<Broker>,
    server: tokio::task::JoinHandle<anyhow::Result<()>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

/// A broker with small group timeouts, on a free port, metrics off.
pub async fn start(dir: PathBuf, tweak: impl FnOnce(&mut BrokerConfig)) -> TestBroker {
    let mut config = BrokerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.clone(),
        metrics_listen: "off".into(),
        group_min_session_timeout_ms: 100,
        group_check_interval_ms: 20,
        ..BrokerConfig::default()
    };
    tweak(&mut config);
    let bound = Broker::bind(config).await.unwrap();
    let address = bound.local_addr().unwrap().to_string();
    let broker = bound.broker();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(bound.run(async move {
        let _ = rx.await;
    }));
    TestBroker {
        address,
        dir,
        broker,
        server,
        stop: Some(tx),
    }
}

impl TestBroker {
    /// Clean shutdown (closes every log), so the same directory can be opened again.
    pub async fn stop(mut self) -> PathBuf {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        (&mut self.server).await.unwrap().unwrap();
        drop(self.broker);
        self.dir
    }

    pub async fn connect(&self) -> Connection {
        Connection::connect(&self.address, T).await.unwrap()
    }
}

pub fn s(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_string())
}

pub fn topic_name(t: &str) -> TopicName {
    TopicName(s(t))
}

pub fn gid(g: &str) -> GroupId {
    GroupId(s(g))
}

pub async fn create_topic(conn: &mut Connection, name: &str, partitions: i32) {
    assert_eq!(try_create_topic(conn, name, partitions, 1).await, 0);
}

/// CreateTopics of one topic; returns its error code.
pub async fn try_create_topic(
    conn: &mut Connection,
    name: &str,
    partitions: i32,
    replication_factor: i16,
) -> i16 {
    let request = CreateTopicsRequest::default()
        .with_timeout_ms(5000)
        .with_topics(vec![CreatableTopic::default()
            .with_name(topic_name(name))
            .with_num_partitions(partitions)
            .with_replication_factor(replication_factor)]);
    let ResponseKind::CreateTopics(r) = conn
        .call(RequestKind::CreateTopics(request), T)
        .await
        .unwrap()
    else {
        panic!("CreateTopics")
    };
    r.topics[0].error_code
}

pub fn batch(n: usize, timestamp: i64) -> Bytes {
    let records: Vec<Record> = (0..n)
        .map(|i| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: (i as i32) - 1,
            timestamp,
            key: Some(Bytes::from(format!("k{i}"))),
            value: Some(Bytes::from(format!("v{i}"))),
            headers: Default::default(),
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        records.iter(),
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .unwrap();
    buf.freeze()
}

/// One batch of `n` records from an idempotent producer: `producer_id`, `epoch`, sequences
/// from `sequence`.
pub fn idempotent_batch(producer_id: i64, epoch: i16, sequence: i32, n: usize) -> Bytes {
    idempotent_batch_at(producer_id, epoch, sequence, n, 1_700_000_000_000)
}

/// As [`idempotent_batch`], its records stamped `timestamp` (ms).
pub fn idempotent_batch_at(
    producer_id: i64,
    epoch: i16,
    sequence: i32,
    n: usize,
    timestamp: i64,
) -> Bytes {
    let records: Vec<Record> = (0..n)
        .map(|i| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id,
            producer_epoch: epoch,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: sequence.wrapping_add(i as i32),
            timestamp,
            key: Some(Bytes::from(format!("k{i}"))),
            value: Some(Bytes::from(format!(
                "p{producer_id}-s{}",
                sequence as usize + i
            ))),
            headers: Default::default(),
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        records.iter(),
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .unwrap();
    buf.freeze()
}

/// One acks=all produce of `records` to topic/partition: (error code, base offset).
pub async fn produce_batch(
    conn: &mut Connection,
    topic: &str,
    partition: i32,
    records: Bytes,
) -> (i16, i64) {
    let request = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(5000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(topic_name(topic))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(partition)
                .with_records(Some(records))])]);
    match conn.call(RequestKind::Produce(request), T).await.unwrap() {
        ResponseKind::Produce(r) => {
            let p = &r.responses[0].partition_responses[0];
            (p.error_code, p.base_offset)
        }
        other => panic!("Produce answered {other:?}"),
    }
}

/// InitProducerId (no transactional id): (error code, producer id, epoch).
pub async fn init_producer_id(conn: &mut Connection) -> (i16, i64, i16) {
    let request = InitProducerIdRequest::default()
        .with_transactional_id(None)
        .with_transaction_timeout_ms(60_000)
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    match conn
        .call(RequestKind::InitProducerId(request), T)
        .await
        .unwrap()
    {
        ResponseKind::InitProducerId(r) => (r.error_code, r.producer_id.0, r.producer_epoch),
        other => panic!("InitProducerId answered {other:?}"),
    }
}

pub async fn produce(conn: &mut Connection, topic: &str, partition: i32, n: usize) {
    let request = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(5000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(topic_name(topic))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(partition)
                .with_records(Some(batch(n, 1_000)))])]);
    let ResponseKind::Produce(r) = conn.call(RequestKind::Produce(request), T).await.unwrap()
    else {
        panic!("Produce")
    };
    assert_eq!(r.responses[0].partition_responses[0].error_code, 0, "{r:?}");
}

/// Consumer-protocol subscription metadata (version 0) for `topics`.
pub fn subscription(topics: &[&str]) -> Bytes {
    let sub =
        ConsumerProtocolSubscription::default().with_topics(topics.iter().map(|t| s(t)).collect());
    let mut buf = BytesMut::new();
    buf.put_i16(0);
    sub.encode(&mut buf, 0).unwrap();
    buf.freeze()
}

/// Consumer-protocol assignment (version 0).
pub fn assignment(parts: &[(&str, &[i32])]) -> Bytes {
    let a = ConsumerProtocolAssignment::default().with_assigned_partitions(
        parts
            .iter()
            .map(|(t, ps)| {
                AssignedPartition::default()
                    .with_topic(topic_name(t))
                    .with_partitions(ps.to_vec())
            })
            .collect(),
    );
    let mut buf = BytesMut::new();
    buf.put_i16(0);
    a.encode(&mut buf, 0).unwrap();
    buf.freeze()
}

pub fn join_request(
    group: &str,
    member_id: &str,
    session_ms: i32,
    rebalance_ms: i32,
    topics: &[&str],
) -> JoinGroupRequest {
    JoinGroupRequest::default()
        .with_group_id(gid(group))
        .with_member_id(s(member_id))
        .with_session_timeout_ms(session_ms)
        .with_rebalance_timeout_ms(rebalance_ms)
        .with_protocol_type(s("consumer"))
        .with_protocols(vec![JoinGroupRequestProtocol::default()
            .with_name(s("range"))
            .with_metadata(subscription(topics))])
}

pub async fn join_at(
    conn: &mut Connection,
    version: i16,
    request: JoinGroupRequest,
) -> JoinGroupResponse {
    match conn
        .call_at(version, RequestKind::JoinGroup(request), T)
        .await
        .unwrap()
    {
        ResponseKind::JoinGroup(r) => r,
        other => panic!("JoinGroup answered {other:?}"),
    }
}

/// JoinGroup v5 including the MEMBER_ID_REQUIRED round trip; returns the response.
pub async fn join(
    conn: &mut Connection,
    group: &str,
    session_ms: i32,
    rebalance_ms: i32,
    topics: &[&str],
) -> JoinGroupResponse {
    let first = join_at(
        conn,
        5,
        join_request(group, "", session_ms, rebalance_ms, topics),
    )
    .await;
    assert_eq!(
        first.error_code,
        ResponseError::MemberIdRequired.code(),
        "{first:?}"
    );
    assert!(!first.member_id.is_empty());
    join_at(
        conn,
        5,
        join_request(
            group,
            first.member_id.as_str(),
            session_ms,
            rebalance_ms,
            topics,
        ),
    )
    .await
}

pub async fn sync(
    conn: &mut Connection,
    group: &str,
    generation: i32,
    member: &str,
    assignments: Vec<(String, Bytes)>,
) -> SyncGroupResponse {
    let request = SyncGroupRequest::default()
        .with_group_id(gid(group))
        .with_generation_id(generation)
        .with_member_id(s(member))
        .with_assignments(
            assignments
                .into_iter()
                .map(|(m, a)| {
                    SyncGroupRequestAssignment::default()
                        .with_member_id(s(&m))
                        .with_assignment(a)
                })
                .collect(),
        );
    match conn
        .call_at(3, RequestKind::SyncGroup(request), T)
        .await
        .unwrap()
    {
        ResponseKind::SyncGroup(r) => r,
        other => panic!("SyncGroup answered {other:?}"),
    }
}

pub async fn heartbeat(conn: &mut Connection, group: &str, generation: i32, member: &str) -> i16 {
    let request = HeartbeatRequest::default()
        .with_group_id(gid(group))
        .with_generation_id(generation)
        .with_member_id(s(member));
    match conn.call(RequestKind::Heartbeat(request), T).await.unwrap() {
        ResponseKind::Heartbeat(r) => r.error_code,
        other => panic!("Heartbeat answered {other:?}"),
    }
}

pub async fn leave(conn: &mut Connection, group: &str, member: &str) -> i16 {
    let request = LeaveGroupRequest::default()
        .with_group_id(gid(group))
        .with_member_id(s(member));
    match conn
        .call_at(1, RequestKind::LeaveGroup(request), T)
        .await
        .unwrap()
    {
        ResponseKind::LeaveGroup(r) => r.error_code,
        other => panic!("LeaveGroup answered {other:?}"),
    }
}

/// OffsetCommit (v8) of (topic, partition, offset, metadata); returns the error per partition.
pub async fn commit(
    conn: &mut Connection,
    group: &str,
    generation: i32,
    member: &str,
    offsets: &[(&str, i32, i64, Option<&str>)],
) -> Vec<i16> {
    let topics: Vec<OffsetCommitRequestTopic> = offsets
        .iter()
        .map(|(t, p, o, m)| {
            OffsetCommitRequestTopic::default()
                .with_name(topic_name(t))
                .with_partitions(vec![OffsetCommitRequestPartition::default()
                    .with_partition_index(*p)
                    .with_committed_offset(*o)
                    .with_committed_leader_epoch(-1)
                    .with_committed_metadata(m.map(s))])
        })
        .collect();
    let request = OffsetCommitRequest::default()
        .with_group_id(gid(group))
        .with_generation_id_or_member_epoch(generation)
        .with_member_id(s(member))
        .with_topics(topics);
    match conn
        .call_at(8, RequestKind::OffsetCommit(request), T)
        .await
        .unwrap()
    {
        ResponseKind::OffsetCommit(r) => r
            .topics
            .iter()
            .flat_map(|t| t.partitions.iter().map(|p| p.error_code))
            .collect(),
        other => panic!("OffsetCommit answered {other:?}"),
    }
}

/// OffsetFetch (v7) of one partition: (offset, metadata, error).
pub async fn fetch_offset(
    conn: &mut Connection,
    group: &str,
    topic: &str,
    partition: i32,
) -> (i64, Option<String>, i16) {
    let request = OffsetFetchRequest::default()
        .with_group_id(gid(group))
        .with_topics(Some(vec![OffsetFetchRequestTopic::default()
            .with_name(topic_name(topic))
            .with_partition_indexes(vec![partition])]));
    match conn
        .call_at(7, RequestKind::OffsetFetch(request), T)
        .await
        .unwrap()
    {
        ResponseKind::OffsetFetch(r) => {
            // A group-level error (NOT_COORDINATOR, say) comes with no topics.
            let Some(p) = r.topics.first().and_then(|t| t.partitions.first()) else {
                assert_ne!(r.error_code, 0, "OffsetFetch answered no partition: {r:?}");
                return (-1, None, r.error_code);
            };
            (
                p.committed_offset,
                p.metadata.as_ref().map(|m| m.to_string()),
                p.error_code.max(r.error_code),
            )
        }
        other => panic!("OffsetFetch answered {other:?}"),
    }
}

pub async fn describe(
    conn: &mut Connection,
    group: &str,
) -> describe_groups_response::DescribedGroup {
    let request = DescribeGroupsRequest::default().with_groups(vec![gid(group)]);
    match conn
        .call(RequestKind::DescribeGroups(request), T)
        .await
        .unwrap()
    {
        ResponseKind::DescribeGroups(r) => r.groups.into_iter().next().unwrap(),
        other => panic!("DescribeGroups answered {other:?}"),
    }
}

/// The broker still answers ApiVersions on a fresh connection.
pub async fn assert_alive(address: &str) {
    let mut conn = Connection::connect(address, T)
        .await
        .expect("broker must still accept connections");
    let r = conn
        .call(RequestKind::ApiVersions(ApiVersionsRequest::default()), T)
        .await
        .unwrap();
    assert!(matches!(r, ResponseKind::ApiVersions(ref v) if v.error_code == 0));
}

pub use kafka_protocol::ResponseError;
