//! Cluster mode with three in-process brokers over real TCP (Kafka and Raft listeners on
//! loopback): the controller creates topics, leaders alone take writes and serve reads, and a
//! leader or coordinator that stops hands over without losing an acknowledged record or
//! committed offset. Killed processes are covered by tests/test_cluster_chaos.py.
#![allow(clippy::unwrap_used)]

mod groups_common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use groups_common::{
    batch, idempotent_batch, init_producer_id, produce_batch, topic_name, TestBroker, T,
};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use kiln_broker::{BrokerConfig, ClusterSettings, PeerSettings};
use kiln_client::Connection;
use kiln_raft::net::LinkCuts;

const NOT_LEADER: i16 = 6;

/// A port nothing listens on now and that no other test of this binary was given (tests run
/// in parallel, and the OS may hand a just-released port out again).
fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap();
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

struct Cluster {
    _dir: tempfile::TempDir,
    configs: Vec<BrokerConfig>,
    brokers: Vec<Option<TestBroker>>,
    /// Cuts brokers' Raft links (the test hook every broker here is started with).
    cuts: Arc<LinkCuts>,
}

impl Cluster {
    async fn start() -> Cluster {
        Cluster::start_these(&[1, 2, 3]).await
    }

    /// Configures three brokers and starts those in `ids`, together.
    async fn start_these(ids: &[i32]) -> Cluster {
        Cluster::start_configured(ids, |_| {}).await
    }

    /// As `start_these`, with `adjust` applied to every broker's settings.
    async fn start_configured(ids: &[i32], adjust: impl Fn(&mut BrokerConfig)) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let cuts = Arc::new(LinkCuts::default());
        let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
        let peers: Vec<PeerSettings> = ports
            .iter()
            .enumerate()
            .map(|(i, (kafka, raft))| PeerSettings {
                id: i as i32 + 1,
                kafka: format!("127.0.0.1:{kafka}"),
                raft: format!("127.0.0.1:{raft}"),
                listeners: Default::default(),
            })
            .collect();
        let configs: Vec<BrokerConfig> = ports
            .iter()
            .enumerate()
            .map(|(i, (kafka, raft))| BrokerConfig {
                node_id: i as i32 + 1,
                listen: format!("127.0.0.1:{kafka}").parse().unwrap(),
                data_dir: dir.path().join(format!("b{}", i + 1)),
                metrics_listen: "off".into(),
                group_min_session_timeout_ms: 100,
                group_check_interval_ms: 20,
                cluster: Some(ClusterSettings {
                    raft_listen: format!("127.0.0.1:{raft}").parse().unwrap(),
                    peers: peers.clone(),
                    link_cuts: Some(cuts.clone()),
                    ..ClusterSettings::default()
                }),
                ..BrokerConfig::default()
            })
            .map(|mut c| {
                adjust(&mut c);
                c
            })
            .collect();
        // Started together: a broker on a new data directory waits for a peer to confirm that
        // no cluster exists yet before it takes part.
        let starting: Vec<_> = configs
            .iter()
            .map(|c| {
                ids.contains(&c.node_id)
                    .then(|| tokio::spawn(start_one(c.clone())))
            })
            .collect();
        let mut brokers = Vec::new();
        for s in starting {
            brokers.push(match s {
                Some(s) => Some(s.await.unwrap()),
                None => None,
            });
        }
        Cluster {
            _dir: dir,
            configs,
            brokers,
            cuts,
        }
    }

    fn live(&self) -> impl Iterator<Item = &TestBroker> {
        self.brokers.iter().flatten()
    }

    fn by_id(&self, id: i32) -> &TestBroker {
        self.brokers[(id - 1) as usize].as_ref().unwrap()
    }

    async fn stop(&mut self, id: i32) {
        let b = self.brokers[(id - 1) as usize].take().unwrap();
        b.stop().await;
    }

    async fn restart(&mut self, id: i32) {
        let config = self.configs[(id - 1) as usize].clone();
        self.brokers[(id - 1) as usize] = Some(start_one(config).await);
    }

    /// Waits until `check` holds, polling.
    async fn until<F: Fn(&Cluster) -> Option<R>, R>(&self, what: &str, check: F) -> R {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(r) = check(self) {
                return r;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The controller's id once one is elected and every live broker agrees.
    async fn controller(&self) -> i32 {
        self.until("a controller", |c| {
            let ids: Vec<i32> = c.live().map(|b| b.broker.cluster.controller()).collect();
            (ids[0] >= 0 && ids.iter().all(|i| *i == ids[0])).then_some(ids[0])
        })
        .await
    }

    /// The leader of a topic partition once every live broker agrees on it.
    async fn leader(&self, topic: &str, partition: i32) -> i32 {
        self.leader_other_than(topic, partition, -1).await
    }

    /// As `leader`, waiting for one other than `old` (a stopped broker).
    async fn leader_other_than(&self, topic: &str, partition: i32, old: i32) -> i32 {
        self.until("a partition leader", |c| {
            let mut ids = Vec::new();
            for b in c.live() {
                let cluster = &b.broker.cluster;
                let t = cluster.topic(topic)?;
                ids.push(cluster.partition(&t, partition)?.leader().0);
            }
            (ids[0] >= 0 && ids[0] != old && ids.iter().all(|i| *i == ids[0])).then_some(ids[0])
        })
        .await
    }
}

async fn start_one(config: BrokerConfig) -> TestBroker {
    let dir = config.data_dir.clone();
    groups_common::start(dir, move |c| *c = config).await
}

async fn create(conn: &mut Connection, name: &str, partitions: i32) -> i16 {
    groups_common::try_create_topic(conn, name, partitions, 3).await
}

/// DeleteTopics of one topic by name: its error code.
async fn delete(conn: &mut Connection, name: &str) -> i16 {
    let request = DeleteTopicsRequest::default()
        .with_timeout_ms(5000)
        .with_topic_names(vec![topic_name(name)]);
    match conn
        .call(RequestKind::DeleteTopics(request), T)
        .await
        .unwrap()
    {
        ResponseKind::DeleteTopics(r) => r.responses[0].error_code,
        other => panic!("{other:?}"),
    }
}

/// (error code, base offset) of one acks=all produce of `n` records.
async fn produce(conn: &mut Connection, topic: &str, partition: i32, n: usize) -> (i16, i64) {
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
    let p = &r.responses[0].partition_responses[0];
    (p.error_code, p.base_offset)
}

/// (error code, high watermark, record bytes) of one fetch from offset 0.
async fn fetch(conn: &mut Connection, topic: &str, partition: i32) -> (i16, i64, usize) {
    let request = FetchRequest::default()
        .with_max_wait_ms(0)
        .with_min_bytes(0)
        .with_max_bytes(1 << 20)
        .with_topics(vec![FetchTopic::default()
            .with_topic(topic_name(topic))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(partition)
                .with_fetch_offset(0)
                .with_partition_max_bytes(1 << 20)])]);
    let ResponseKind::Fetch(r) = conn.call(RequestKind::Fetch(request), T).await.unwrap() else {
        panic!("Fetch")
    };
    let p = &r.responses[0].partitions[0];
    (
        p.error_code,
        p.high_watermark,
        p.records.as_ref().map_or(0, |b| b.len()),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_broker_creates_topics_through_the_controller_and_only_leaders_take_writes() {
    let cluster = Cluster::start().await;
    let controller = cluster.controller().await;
    let other = if controller == 1 { 2 } else { 1 };
    // At a broker that is not the controller: forwarded there (KIP-590), as are deletes.
    let mut conn = cluster.by_id(other).connect().await;
    assert_eq!(create(&mut conn, "scratch", 1).await, 0);
    assert_eq!(delete(&mut conn, "scratch").await, 0);
    assert_eq!(
        delete(&mut conn, "scratch").await,
        ResponseError::UnknownTopicOrPartition.code()
    );
    assert_eq!(create(&mut conn, "orders", 3).await, 0);
    let mut conn = cluster.by_id(controller).connect().await;
    assert_eq!(
        create(&mut conn, "orders", 3).await,
        ResponseError::TopicAlreadyExists.code()
    );

    // Every broker learned the topic from the metadata log, with one assignment: each broker
    // is the preferred leader of one partition and holds a replica of all three.
    let assignments = cluster
        .until("the topic on every broker", |c| {
            let seen: Vec<Vec<Vec<i32>>> = c
                .live()
                .filter_map(|b| b.broker.cluster.topic("orders"))
                .map(|t| t.assignments.clone())
                .collect();
            (seen.len() == 3 && seen.iter().all(|a| *a == seen[0])).then(|| seen[0].clone())
        })
        .await;
    let mut preferred: Vec<i32> = assignments.iter().map(|r| r[0]).collect();
    preferred.sort_unstable();
    assert_eq!(preferred, vec![1, 2, 3], "{assignments:?}");
    assert!(assignments.iter().all(|r| r.len() == 3));

    let leader = cluster.leader("orders", 0).await;
    let follower = if leader == 1 { 2 } else { 1 };
    let mut to_follower = cluster.by_id(follower).connect().await;
    assert_eq!(
        produce(&mut to_follower, "orders", 0, 5).await.0,
        NOT_LEADER
    );
    assert_eq!(fetch(&mut to_follower, "orders", 0).await.0, NOT_LEADER);

    let mut to_leader = cluster.by_id(leader).connect().await;
    assert_eq!(produce(&mut to_leader, "orders", 0, 5).await, (0, 0));
    assert_eq!(produce(&mut to_leader, "orders", 0, 3).await, (0, 5));
    let (code, high_watermark, bytes) = fetch(&mut to_leader, "orders", 0).await;
    assert_eq!((code, high_watermark), (0, 8));
    assert!(bytes > 0);

    // Every replica reaches the same high watermark.
    cluster
        .until("replicas to converge", |c| {
            c.live()
                .all(|b| {
                    let cl = &b.broker.cluster;
                    let t = cl.topic("orders").unwrap();
                    cl.partition(&t, 0).unwrap().partition.high_watermark() == 8
                })
                .then_some(())
        })
        .await;

    // Metadata from any broker names the same leader and all three replicas.
    let ResponseKind::Metadata(md) = to_follower
        .call(
            RequestKind::Metadata(MetadataRequest::default().with_topics(None)),
            T,
        )
        .await
        .unwrap()
    else {
        panic!("Metadata")
    };
    assert_eq!(md.brokers.len(), 3);
    let p0 = &md.topics[0].partitions[0];
    assert_eq!(p0.leader_id.0, leader);
    assert_eq!(p0.replica_nodes.len(), 3);
    assert!(p0.leader_epoch > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_leader_and_coordinator_hand_over_every_acknowledged_record_and_offset() {
    let mut cluster = Cluster::start().await;
    let controller = cluster.controller().await;
    let mut conn = cluster.by_id(controller).connect().await;
    assert_eq!(create(&mut conn, "jobs", 1).await, 0);
    let leader = cluster.leader("jobs", 0).await;
    let mut to_leader = cluster.by_id(leader).connect().await;
    for i in 0..10 {
        assert_eq!(produce(&mut to_leader, "jobs", 0, 4).await, (0, i * 4));
    }

    // Commit offset 17 for group g through its coordinator (the offsets group's leader).
    let coordinator = cluster
        .until("a coordinator", |c| {
            let b = c.live().next()?;
            let id = b.broker.cluster.offsets.leader().0;
            (id > 0 && c.by_id(id).broker.groups.store().is_serving()).then_some(id)
        })
        .await;
    let mut to_coordinator = cluster.by_id(coordinator).connect().await;
    assert_eq!(commit(&mut to_coordinator, "g", "jobs", 17).await, 0);
    assert_eq!(committed(&mut to_coordinator, "g", "jobs").await, (0, 17));

    // Stop the partition leader (and only it: two of three brokers stay up, so every group
    // keeps a majority). Its open connections go first, since they hold the broker.
    drop((conn, to_leader, to_coordinator));
    cluster.stop(leader).await;
    let new_leader = cluster.leader_other_than("jobs", 0, leader).await;
    assert_ne!(new_leader, leader);
    let mut conn = cluster.by_id(new_leader).connect().await;
    let (code, high_watermark, _) = fetch(&mut conn, "jobs", 0).await;
    assert_eq!(
        (code, high_watermark),
        (0, 40),
        "no acknowledged record lost"
    );
    assert_eq!(produce(&mut conn, "jobs", 0, 2).await, (0, 40));

    // The committed offset survives its coordinator's stop (if that was the one stopped, a new
    // coordinator rebuilt it from the replicated log).
    let coordinator = cluster
        .until("a serving coordinator", |c| {
            c.live()
                .find(|b| b.broker.groups.store().is_serving())
                .map(|b| b.broker.config.node_id)
        })
        .await;
    let mut to_coordinator = cluster.by_id(coordinator).connect().await;
    assert_eq!(committed(&mut to_coordinator, "g", "jobs").await, (0, 17));
    // Followers refuse group requests and point clients at the coordinator.
    let follower = cluster
        .live()
        .map(|b| b.broker.config.node_id)
        .find(|id| *id != coordinator)
        .unwrap();
    let mut to_follower = cluster.by_id(follower).connect().await;
    assert_eq!(
        commit(&mut to_follower, "g", "jobs", 18).await,
        ResponseError::NotCoordinator.code()
    );

    // The stopped broker comes back and catches up from its peers.
    cluster.restart(leader).await;
    cluster
        .until("the restarted replica to catch up", |c| {
            let cl = &c.by_id(leader).broker.cluster;
            let t = cl.topic("jobs")?;
            (cl.partition(&t, 0)?.partition.high_watermark() == 42).then_some(())
        })
        .await;
}

async fn commit(conn: &mut Connection, group: &str, topic: &str, offset: i64) -> i16 {
    groups_common::commit(conn, group, -1, "", &[(topic, 0, offset, None)]).await[0]
}

async fn committed(conn: &mut Connection, group: &str, topic: &str) -> (i16, i64) {
    let (offset, _, code) = groups_common::fetch_offset(conn, group, topic, 0).await;
    (code, offset)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn brokers_of_a_new_cluster_start_in_any_order_and_a_broker_whose_disk_was_lost_is_refused() {
    // Two of three form the cluster and take writes (a majority); the third comes later.
    let mut c = Cluster::start_these(&[1, 2]).await;
    let controller = c.controller().await;
    let mut admin = c.by_id(controller).connect().await;
    let topic = topic_name("late");
    assert_eq!(create(&mut admin, &topic, 1).await, 0);
    let leader = c.leader(&topic, 0).await;
    let mut conn = c.by_id(leader).connect().await;
    assert_eq!(produce(&mut conn, &topic, 0, 5).await.0, 0);
    c.restart(3).await;
    let registered = |c: &Cluster| {
        let all: Vec<_> = c
            .live()
            .map(|b| b.broker.cluster.registered_brokers())
            .collect();
        (all.iter().all(|r| r.len() == 3) && all.windows(2).all(|w| w[0] == w[1]))
            .then(|| all[0].clone())
    };
    let incarnations = c.until("three registered brokers", registered).await;
    // The late broker catches up: it holds the five records.
    let three = c.by_id(3);
    c.until("broker 3 to hold the records", |c| {
        let cluster = &c.by_id(3).broker.cluster;
        let t = cluster.topic(&topic)?;
        (cluster.partition(&t, 0)?.partition.high_watermark() >= 5).then_some(())
    })
    .await;
    let dir3 = three.dir.clone();

    // Broker 3's disk is lost: with an empty directory under its old id it is refused, and
    // refused again on the next try (nothing it wrote makes it look like a member).
    c.stop(3).await;
    std::fs::remove_dir_all(&dir3).unwrap();
    for attempt in 0..2 {
        let refused = match kiln_broker::Broker::bind(c.configs[2].clone()).await {
            Ok(_) => panic!("attempt {attempt}: a broker whose data is gone was let in"),
            Err(e) => format!("{e:#}"),
        };
        assert!(refused.contains("its data is gone"), "{refused}");
        assert!(
            refused.contains(&format!("{:016x}", incarnations[&3])),
            "the refusal names the registered incarnation: {refused}"
        );
    }
    // The other two still serve.
    let leader = c.leader(&topic, 0).await;
    let mut conn = c.by_id(leader).connect().await;
    assert_eq!(produce(&mut conn, &topic, 0, 1).await.0, 0);
}

/// The cluster id in a Metadata answer from the broker at the other end of `conn`.
async fn metadata_cluster_id(conn: &mut Connection) -> Option<String> {
    let request = MetadataRequest::default().with_topics(Some(vec![]));
    let ResponseKind::Metadata(r) = conn
        .call_at(9, RequestKind::Metadata(request), T)
        .await
        .unwrap()
    else {
        panic!("Metadata")
    };
    r.cluster_id.map(|s| s.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_broker_reports_its_clusters_id_from_its_first_answer() {
    let mut c = Cluster::start().await;
    c.controller().await;
    let named = c
        .until("every broker to know the cluster id", |c| {
            let ids: Vec<Option<String>> = c.live().map(|b| b.broker.cluster_id()).collect();
            (ids[0].is_some() && ids.iter().all(|i| *i == ids[0])).then(|| ids[0].clone())
        })
        .await
        .unwrap();
    for b in c.live() {
        let mut conn = b.connect().await;
        assert_eq!(
            metadata_cluster_id(&mut conn).await.as_deref(),
            Some(named.as_str())
        );
    }
    // Every broker stops; one comes back alone. Without a majority it applies nothing of the
    // metadata log, and still answers with the cluster's id (recorded in broker.json), never
    // one of its own.
    for id in [1, 2, 3] {
        c.stop(id).await;
    }
    c.restart(2).await;
    assert_eq!(
        c.by_id(2).broker.cluster.controller(),
        -1,
        "alone, it has no controller"
    );
    let mut conn = c.by_id(2).connect().await;
    assert_eq!(
        metadata_cluster_id(&mut conn).await.as_deref(),
        Some(named.as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idempotent_producers_retry_after_a_failover_is_written_once() {
    let mut c = Cluster::start().await;
    let controller = c.controller().await;
    let mut admin = c.by_id(controller).connect().await;
    let topic = topic_name("idem");
    assert_eq!(create(&mut admin, &topic, 1).await, 0);
    // Every broker gives producer ids (the others through the controller), never one twice.
    let mut ids = Vec::new();
    for id in [1, 2, 3] {
        let mut conn = c.by_id(id).connect().await;
        for _ in 0..2 {
            let (code, pid, epoch) = init_producer_id(&mut conn).await;
            assert_eq!((code, epoch), (0, 0), "broker {id}");
            ids.push(pid);
        }
    }
    let mut unique = ids.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), ids.len(), "producer ids given twice: {ids:?}");
    let pid = ids[0];

    let leader = c.leader(&topic, 0).await;
    let mut conn = c.by_id(leader).connect().await;
    for seq in [0, 3] {
        let (code, _) = produce_batch(&mut conn, &topic, 0, idempotent_batch(pid, 0, seq, 3)).await;
        assert_eq!(code, 0);
    }
    let last = idempotent_batch(pid, 0, 6, 3);
    assert_eq!(
        produce_batch(&mut conn, &topic, 0, last.clone()).await,
        (0, 6)
    );
    c.until("every replica to hold 9 records", |c| {
        c.live()
            .all(|b| {
                let t = b.broker.cluster.topic(&topic);
                t.and_then(|t| b.broker.cluster.partition(&t, 0))
                    .is_some_and(|r| r.partition.high_watermark() == 9)
            })
            .then_some(())
    })
    .await;
    drop(conn);

    // The leader goes; the producer, not knowing its last batch was acknowledged, sends it
    // again to the new leader: answered with its offsets, not written twice.
    c.stop(leader).await;
    let new_leader = c.leader_other_than(&topic, 0, leader).await;
    let mut conn = c.by_id(new_leader).connect().await;
    assert_eq!(produce_batch(&mut conn, &topic, 0, last).await, (0, 6));
    assert_eq!(
        produce_batch(&mut conn, &topic, 0, idempotent_batch(pid, 0, 9, 1)).await,
        (0, 9)
    );
    let (_, hw, _) = fetch(&mut conn, &topic, 0).await;
    assert_eq!(
        hw, 10,
        "nine records before the failover, one after, nothing twice"
    );
}

/// The error code Metadata gives for `topic` at this connection's broker (0: listed).
async fn metadata_topic_error(conn: &mut Connection, topic: &str) -> i16 {
    let request = MetadataRequest::default()
        .with_topics(Some(vec![metadata_request::MetadataRequestTopic::default(
        )
        .with_name(Some(topic_name(topic)))]))
        .with_allow_auto_topic_creation(false);
    let ResponseKind::Metadata(r) = conn
        .call_at(9, RequestKind::Metadata(request), T)
        .await
        .unwrap()
    else {
        panic!("Metadata")
    };
    assert_eq!(r.topics.len(), 1);
    r.topics[0].error_code
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_broker_never_calls_a_topic_it_missed_unknown_before_it_has_caught_up() {
    let mut c = Cluster::start().await;
    // The broker that misses the topic must not be the controller, so that two others are left
    // to commit: any broker but the controller (a restarted broker can win the next election
    // again, so none is restarted to arrange this).
    let controller = c.controller().await;
    let missing = [1, 2, 3].into_iter().find(|id| *id != controller).unwrap();
    let others: Vec<i32> = [1, 2, 3].into_iter().filter(|id| *id != missing).collect();
    c.until("the missing broker to catch up", |c| {
        c.by_id(missing).broker.cluster.is_current().then_some(())
    })
    .await;
    c.stop(missing).await;
    let mut conn = c.by_id(controller).connect().await;
    assert_eq!(create(&mut conn, "missed", 1).await, 0);
    drop(conn);
    // It comes back alone: it cannot learn of "missed", and must not deny it exists.
    for &id in &others {
        c.stop(id).await;
    }
    c.restart(missing).await;
    let mut conn = c.by_id(missing).connect().await;
    for _ in 0..20 {
        assert_eq!(
            metadata_topic_error(&mut conn, "missed").await,
            ResponseError::LeaderNotAvailable.code(),
            "a broker that has not caught up answers a topic it does not know as retriable"
        );
        assert!(!c.by_id(missing).broker.cluster.is_current());
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // Its peers return: it catches up, lists the topic, and now knows what does not exist.
    for &id in &others {
        c.restart(id).await;
    }
    c.until("the missing broker to catch up", |c| {
        c.by_id(missing).broker.cluster.is_current().then_some(())
    })
    .await;
    assert_eq!(metadata_topic_error(&mut conn, "missed").await, 0);
    assert_eq!(
        metadata_topic_error(&mut conn, "never-created").await,
        ResponseError::UnknownTopicOrPartition.code()
    );
}

/// (error code, message) of an IncrementalAlterConfigs that sets one key of a topic.
async fn set_topic_config(
    conn: &mut Connection,
    topic: &str,
    key: &str,
    value: &str,
) -> (i16, Option<String>) {
    let request = IncrementalAlterConfigsRequest::default().with_resources(vec![
        incremental_alter_configs_request::AlterConfigsResource::default()
            .with_resource_type(2)
            .with_resource_name(StrBytes::from_string(topic.to_string()))
            .with_configs(vec![
                incremental_alter_configs_request::AlterableConfig::default()
                    .with_name(StrBytes::from_string(key.to_string()))
                    .with_config_operation(0)
                    .with_value(Some(StrBytes::from_string(value.to_string()))),
            ]),
    ]);
    let ResponseKind::IncrementalAlterConfigs(r) = conn
        .call(RequestKind::IncrementalAlterConfigs(request), T)
        .await
        .unwrap()
    else {
        panic!("IncrementalAlterConfigs")
    };
    let r = &r.responses[0];
    (
        r.error_code,
        r.error_message.as_ref().map(|m| m.to_string()),
    )
}

/// (error code, message) of a CreatePartitions that raises `topic` to `count` partitions.
async fn add_partitions(conn: &mut Connection, topic: &str, count: i32) -> (i16, Option<String>) {
    let request = CreatePartitionsRequest::default()
        .with_timeout_ms(5000)
        .with_topics(vec![
            create_partitions_request::CreatePartitionsTopic::default()
                .with_name(topic_name(topic))
                .with_count(count)
                .with_assignments(None),
        ]);
    let ResponseKind::CreatePartitions(r) = conn
        .call(RequestKind::CreatePartitions(request), T)
        .await
        .unwrap()
    else {
        panic!("CreatePartitions")
    };
    let r = &r.results[0];
    (
        r.error_code,
        r.error_message.as_ref().map(|m| m.to_string()),
    )
}

// The Java admin client and kafka-python send AlterConfigs to any broker; Kafka's brokers
// forward it to the controller, and so do Kiln's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_change_sent_to_any_broker_is_forwarded_to_the_controller() {
    let cluster = Cluster::start().await;
    let controller = cluster.controller().await;
    let mut to_controller = cluster.by_id(controller).connect().await;
    assert_eq!(create(&mut to_controller, "changes", 1).await, 0);
    let others: Vec<i32> = [1, 2, 3].into_iter().filter(|i| *i != controller).collect();
    for &other in &others {
        let mut conn = cluster.by_id(other).connect().await;
        let value = (3_600_000 + other).to_string();
        let (code, message) = set_topic_config(&mut conn, "changes", "retention.ms", &value).await;
        assert_eq!(code, 0, "{message:?}");
        cluster
            .until("every broker to apply the forwarded config", |c| {
                c.live()
                    .all(|b| {
                        b.broker
                            .cluster
                            .topic("changes")
                            .is_some_and(|t| t.overrides.get("retention.ms") == Some(&value))
                    })
                    .then_some(())
            })
            .await;
        // The controller's refusals come back as they are, message included.
        let (code, message) = set_topic_config(&mut conn, "changes", "retention.ms", "soon").await;
        assert_eq!(code, ResponseError::InvalidConfig.code(), "{message:?}");
        assert!(message.unwrap_or_default().contains("retention.ms"));
        let (code, _) = set_topic_config(&mut conn, "changes", "retention.typo", "1").await;
        assert_eq!(code, ResponseError::InvalidConfig.code());
        let (code, _) = set_topic_config(&mut conn, "missing", "retention.ms", "1").await;
        assert_eq!(code, ResponseError::UnknownTopicOrPartition.code());
    }

    let mut conn = cluster.by_id(others[0]).connect().await;
    let (code, message) = add_partitions(&mut conn, "changes", 3).await;
    assert_eq!(code, 0, "{message:?}");
    cluster
        .until("every broker to open the new partitions", |c| {
            c.live()
                .all(|b| {
                    b.broker
                        .cluster
                        .topic("changes")
                        .is_some_and(|t| t.partition_count() == 3)
                })
                .then_some(())
        })
        .await;
    let (code, message) = add_partitions(&mut conn, "changes", 2).await;
    assert_eq!(code, ResponseError::InvalidPartitions.code(), "{message:?}");
    let leader = cluster.leader("changes", 2).await;
    let mut to_leader = cluster.by_id(leader).connect().await;
    assert_eq!(produce(&mut to_leader, "changes", 2, 4).await, (0, 0));
}

/// The serving group coordinator's id, other than `not` (-1: any).
async fn serving_coordinator(c: &Cluster, not: i32) -> i32 {
    c.until("a serving coordinator", |c| {
        c.live()
            .map(|b| b.broker.config.node_id)
            .find(|&id| id != not && c.by_id(id).broker.groups.store().is_serving())
    })
    .await
}

/// A broker whose Raft links are cut while its Kafka listener stays up does not know it is
/// deposed (openraft keeps it Leader), but its lease lapses before another broker can lead:
/// it names no leader for the partition it led and refuses produce there, stops coordinating
/// groups (OffsetFetch and OffsetCommit get NOT_COORDINATOR), and so never answers a committed
/// offset lower than one acknowledged by the coordinator that took over. Healed, it follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_cut_off_from_its_peers_stops_serving_what_it_led() {
    let cluster = Cluster::start().await;
    let controller = cluster.controller().await;
    let mut conn = cluster.by_id(controller).connect().await;
    assert_eq!(create(&mut conn, "cut", 1).await, 0);
    drop(conn);
    let leader_of = |c: &Cluster, id: i32| -> Option<i32> {
        let cl = &c.by_id(id).broker.cluster;
        let topic = cl.topic("cut")?;
        cl.partition(&topic, 0).map(|r| r.leader().0)
    };

    // The partition's leader is cut off.
    let leader = cluster.leader("cut", 0).await;
    let mut to_leader = cluster.by_id(leader).connect().await;
    assert_eq!(produce(&mut to_leader, "cut", 0, 4).await, (0, 0));
    cluster.cuts.isolate(leader as u64);
    let cut_at = Instant::now();
    cluster
        .until("the cut-off leader to name no leader", |c| {
            (leader_of(c, leader)? == -1).then_some(())
        })
        .await;
    println!("cut-off leader fenced after {:?}", cut_at.elapsed());
    assert_eq!(produce(&mut to_leader, "cut", 0, 1).await.0, NOT_LEADER);
    let cut_replica = |c: &Cluster| {
        let cl = &c.by_id(leader).broker.cluster;
        cl.partition(&cl.topic("cut").unwrap(), 0).unwrap()
    };
    // Counted (kiln_leader_lease_lapses_total) once its metrics show the lapse.
    cluster
        .until("the lapse to be counted", |c| {
            (cut_replica(c).lease_lapses() == 1).then_some(())
        })
        .await;
    let next = cluster
        .until("a new leader", |c| {
            c.live()
                .map(|b| b.broker.config.node_id)
                .filter(|&id| id != leader)
                .find_map(|id| leader_of(c, id).filter(|&l| l > 0 && l != leader))
        })
        .await;
    let mut to_next = cluster.by_id(next).connect().await;
    assert_eq!(produce(&mut to_next, "cut", 0, 2).await, (0, 4));
    assert_eq!(produce(&mut to_leader, "cut", 0, 1).await.0, NOT_LEADER);
    cluster.cuts.heal(leader as u64);
    cluster
        .until("the healed broker to follow", |c| {
            (leader_of(c, leader)? == next).then_some(())
        })
        .await;
    drop((to_leader, to_next));

    // The group coordinator is cut off. Right after the heal the offsets group may still be
    // settling (a coordinator whose write is refused answers COORDINATOR_NOT_AVAILABLE, which
    // clients retry): the first commit is retried as a client would.
    let retriable = [
        ResponseError::CoordinatorNotAvailable.code(),
        ResponseError::CoordinatorLoadInProgress.code(),
        ResponseError::NotCoordinator.code(),
    ];
    let deadline = Instant::now() + Duration::from_secs(20);
    let (coordinator, mut to_coordinator) = loop {
        let coordinator = serving_coordinator(&cluster, -1).await;
        let mut conn = cluster.by_id(coordinator).connect().await;
        let code = commit(&mut conn, "g", "cut", 3).await;
        if code == 0 {
            break (coordinator, conn);
        }
        assert!(retriable.contains(&code), "commit refused with {code}");
        assert!(Instant::now() < deadline, "no coordinator took the commit");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    cluster.cuts.isolate(coordinator as u64);
    let cut_at = Instant::now();
    cluster
        .until("the cut-off coordinator to stop serving", |c| {
            (!c.by_id(coordinator).broker.groups.store().is_serving()).then_some(())
        })
        .await;
    println!("cut-off coordinator fenced after {:?}", cut_at.elapsed());
    let not_coordinator = ResponseError::NotCoordinator.code();
    assert_eq!(
        committed(&mut to_coordinator, "g", "cut").await.0,
        not_coordinator
    );
    let next = serving_coordinator(&cluster, coordinator).await;
    let mut to_next = cluster.by_id(next).connect().await;
    assert_eq!(committed(&mut to_next, "g", "cut").await, (0, 3));
    assert_eq!(commit(&mut to_next, "g", "cut", 5).await, 0);
    // The cut-off broker still answers, and never with the older 3.
    assert_eq!(
        committed(&mut to_coordinator, "g", "cut").await.0,
        not_coordinator
    );
    assert_eq!(
        commit(&mut to_coordinator, "g", "cut", 4).await,
        not_coordinator
    );
    cluster.cuts.heal(coordinator as u64);
    assert_eq!(committed(&mut to_next, "g", "cut").await, (0, 5));
}

/// One SCRAM upsertion of `password` for `user`, sent to `conn`: the result's error code.
async fn upsert_user(conn: &mut Connection, user: &str, password: &str) -> i16 {
    use alter_user_scram_credentials_request::ScramCredentialUpsertion;
    let m = kiln_sasl::Mechanism::ScramSha512;
    let salt = b"cluster-test-salt".to_vec();
    let salted = m.salted_password(password.as_bytes(), &salt, 4096);
    let request = AlterUserScramCredentialsRequest::default().with_upsertions(vec![
        ScramCredentialUpsertion::default()
            .with_name(StrBytes::from_string(user.into()))
            .with_mechanism(m.kafka_type())
            .with_iterations(4096)
            .with_salt(salt.into())
            .with_salted_password(salted.into()),
    ]);
    match conn
        .call(RequestKind::AlterUserScramCredentials(request), T)
        .await
        .unwrap()
    {
        ResponseKind::AlterUserScramCredentials(r) => r.results[0].error_code,
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scram_user_created_at_any_broker_is_known_to_every_broker_and_survives_a_restart() {
    let mut cluster = Cluster::start().await;
    let controller = cluster.controller().await;
    let other = [1, 2, 3].into_iter().find(|i| *i != controller).unwrap();
    // At a broker that is not the controller: forwarded there, written to the metadata log.
    let mut conn = cluster.by_id(other).connect().await;
    assert_eq!(upsert_user(&mut conn, "alice", "alice-pw").await, 0);
    let m = kiln_sasl::Mechanism::ScramSha512;
    let knows = |c: &Cluster| {
        c.live()
            .all(|b| {
                b.broker
                    .cluster
                    .scram_credential("alice", m)
                    .is_some_and(|cred| cred.verify_password(m, b"alice-pw"))
            })
            .then_some(())
    };
    cluster
        .until("every broker to hold alice's credential", knows)
        .await;
    // Only the salted keys are kept: nothing in the table equals the password.
    let cred = cluster
        .by_id(controller)
        .broker
        .cluster
        .scram_credential("alice", m)
        .unwrap();
    assert!(!cred.verify_password(m, b"alice-pW"));
    // A restarted broker has it again from its own log (the connection goes first: it holds
    // the broker).
    drop(conn);
    cluster.stop(other).await;
    cluster.restart(other).await;
    cluster
        .until("the restarted broker to hold alice's credential", knows)
        .await;
    // A bad credential is refused by the controller, from any broker.
    let mut conn = cluster.by_id(other).connect().await;
    let bad = AlterUserScramCredentialsRequest::default().with_upsertions(vec![
        alter_user_scram_credentials_request::ScramCredentialUpsertion::default()
            .with_name(StrBytes::from_static_str("bob"))
            .with_mechanism(2)
            .with_iterations(100)
            .with_salt(vec![1u8; 8].into())
            .with_salted_password(vec![0u8; 64].into()),
    ]);
    match conn
        .call(RequestKind::AlterUserScramCredentials(bad), T)
        .await
        .unwrap()
    {
        ResponseKind::AlterUserScramCredentials(r) => {
            assert_eq!(
                r.results[0].error_code,
                ResponseError::UnacceptableCredential.code()
            )
        }
        other => panic!("{other:?}"),
    }
}

/// The server-first message a broker answers an unknown user's SCRAM client-first with.
async fn server_first_for(conn: &mut Connection, user: &str) -> String {
    let handshake =
        SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("SCRAM-SHA-512"));
    match conn
        .call(RequestKind::SaslHandshake(handshake), T)
        .await
        .unwrap()
    {
        ResponseKind::SaslHandshake(r) => assert_eq!(r.error_code, 0),
        other => panic!("{other:?}"),
    }
    let first = format!("n,,n={user},r=fixed-client-nonce");
    let request = SaslAuthenticateRequest::default().with_auth_bytes(first.into_bytes().into());
    match conn
        .call(RequestKind::SaslAuthenticate(request), T)
        .await
        .unwrap()
    {
        ResponseKind::SaslAuthenticate(r) => {
            assert_eq!(r.error_code, 0);
            String::from_utf8(r.auth_bytes.to_vec()).unwrap()
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_broker_gives_an_unknown_user_the_same_decoy_salt() {
    let cluster = Cluster::start_configured(&[1, 2, 3], |c| {
        c.sasl = Some(kiln_broker::config::SaslSettings::default());
    })
    .await;
    cluster
        .until("every broker to hold the cluster's decoy secret", |c| {
            let secrets: Vec<_> = c
                .live()
                .map(|b| b.broker.cluster.scram_decoy_secret())
                .collect();
            (secrets[0].is_some() && secrets.iter().all(|s| *s == secrets[0])).then_some(())
        })
        .await;
    let mut salts = Vec::new();
    for id in [1, 2, 3] {
        let mut conn = cluster.by_id(id).connect().await;
        let first = server_first_for(&mut conn, "ghost").await;
        // r=<client nonce><server nonce>,s=<salt>,i=<iterations>
        let salt = first.split(",s=").nth(1).unwrap().to_string();
        salts.push(salt);
    }
    assert!(salts.iter().all(|s| *s == salts[0]), "{salts:?}");
}

/// CreateAcls and DeleteAcls at brokers that are not the controller are forwarded to it, and
/// every broker then enforces the same bindings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_created_or_deleted_at_any_broker_reaches_every_broker() {
    use kafka_protocol::messages::create_acls_request::AclCreation;
    use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
    let cluster = Cluster::start_configured(&[1, 2, 3], |c| {
        c.authorization = Some(kiln_broker::config::AuthorizationSettings {
            super_users: vec!["User:ANONYMOUS".into()],
            allow_everyone_if_no_acl_found: false,
        });
    })
    .await;
    let controller = cluster.controller().await;
    let others: Vec<i32> = [1, 2, 3].into_iter().filter(|i| *i != controller).collect();
    let mut conn = cluster.by_id(others[0]).connect().await;
    let creation = AclCreation::default()
        .with_resource_type(kiln_acl::ResourceType::Group.code())
        .with_resource_name(StrBytes::from_static_str("burnin"))
        .with_resource_pattern_type(kiln_acl::PatternType::Literal.code())
        .with_principal(StrBytes::from_static_str("User:agent"))
        .with_host(StrBytes::from_static_str("*"))
        .with_operation(kiln_acl::Operation::Read.code())
        .with_permission_type(kiln_acl::Permission::Allow.code());
    let request = CreateAclsRequest::default().with_creations(vec![creation]);
    match conn
        .call(RequestKind::CreateAcls(request), T)
        .await
        .unwrap()
    {
        ResponseKind::CreateAcls(r) => assert_eq!(r.results[0].error_code, 0, "{r:?}"),
        other => panic!("{other:?}"),
    }
    let held = |c: &Cluster| -> Vec<usize> {
        c.live()
            .map(|b| {
                b.broker
                    .cluster
                    .acls_matching(&kiln_acl::Filter::any())
                    .len()
            })
            .collect()
    };
    cluster
        .until("every broker to hold the ACL", |c| {
            (held(c) == vec![1, 1, 1]).then_some(())
        })
        .await;
    drop(conn);
    let mut conn = cluster.by_id(others[1]).connect().await;
    let filter = DeleteAclsFilter::default()
        .with_resource_type_filter(1)
        .with_resource_name_filter(None)
        .with_pattern_type_filter(1)
        .with_principal_filter(Some(StrBytes::from_static_str("User:agent")))
        .with_host_filter(None)
        .with_operation(1)
        .with_permission_type(1);
    let request = DeleteAclsRequest::default().with_filters(vec![filter]);
    match conn
        .call(RequestKind::DeleteAcls(request), T)
        .await
        .unwrap()
    {
        ResponseKind::DeleteAcls(r) => {
            assert_eq!(r.filter_results[0].error_code, 0, "{r:?}");
            assert_eq!(r.filter_results[0].matching_acls.len(), 1, "{r:?}");
        }
        other => panic!("{other:?}"),
    }
    cluster
        .until("every broker to drop the ACL", |c| {
            (held(c) == vec![0, 0, 0]).then_some(())
        })
        .await;
}
