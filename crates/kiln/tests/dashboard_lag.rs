//! The dashboard's lag sampler against a real `kiln broker`: records produced with librdkafka,
//! offsets committed for two groups, and the sampled lag per partition is exactly log end -
//! committed (burnin's uncommitted partitions count from the log start).

use std::path::Path;
use std::time::Duration;

use kiln_dashboard::lag::{LagSampler, SeriesKey};
use kiln_intake::testkit::BrokerProcess;
use kiln_queue::rdkafka::config::ClientConfig;
use kiln_queue::rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use kiln_queue::rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use kiln_queue::rdkafka::{Offset, TopicPartitionList};

const KILN: &str = env!("CARGO_BIN_EXE_kiln");

fn produce(broker: &str, topic: &str, per_partition: &[usize]) {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", broker)
        .set("acks", "all")
        .create()
        .expect("producer");
    for (partition, n) in per_partition.iter().enumerate() {
        for i in 0..*n {
            let payload = format!("record {i}");
            p.send(
                BaseRecord::<(), String>::to(topic)
                    .partition(partition as i32)
                    .payload(&payload),
            )
            .expect("enqueue");
        }
    }
    p.flush(Duration::from_secs(30)).expect("flush");
}

fn commit(broker: &str, group: &str, topic: &str, offsets: &[(i32, i64)]) {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for (p, o) in offsets {
        tpl.add_partition_offset(topic, *p, Offset::Offset(*o))
            .expect("tpl");
    }
    c.commit(&tpl, CommitMode::Sync).expect("commit");
}

fn key(group: &str, topic: &str, partition: i32) -> SeriesKey {
    SeriesKey {
        group: group.into(),
        topic: topic.into(),
        partition,
    }
}

#[test]
fn lag_is_log_end_minus_committed_per_group_and_partition() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let broker = BrokerProcess::start(Path::new(KILN)).expect("start kiln broker");
    let addr = broker.addr.clone();
    rt.block_on(async {
        kiln_queue::create_topic(&addr, "kiln.nodes", 3, 1)
            .await
            .expect("create kiln.nodes");
        kiln_queue::create_topic(&addr, "reports", 1, 1)
            .await
            .expect("create reports");
    });
    produce(&addr, "kiln.nodes", &[5, 3, 0]);
    produce(&addr, "reports", &[4]);
    // burnin committed partition 0 up to 2 and nothing else; another group read reports to 1.
    commit(&addr, "burnin", "kiln.nodes", &[(0, 2)]);
    commit(&addr, "mailer", "reports", &[(0, 1)]);

    let mut sampler = LagSampler::new(
        addr.clone(),
        Duration::from_secs(10),
        kiln_client::Security::default(),
    );
    let readings = rt.block_on(sampler.sample()).expect("sample");
    let by_key: std::collections::BTreeMap<_, _> =
        readings.iter().map(|r| (r.key.clone(), r)).collect();
    let b0 = by_key[&key("burnin", "kiln.nodes", 0)];
    assert_eq!((b0.committed, b0.log_end, b0.lag), (Some(2), 5, 3));
    let b1 = by_key[&key("burnin", "kiln.nodes", 1)];
    assert_eq!(
        (b1.committed, b1.log_end, b1.lag),
        (None, 3, 3),
        "from the log start"
    );
    let b2 = by_key[&key("burnin", "kiln.nodes", 2)];
    assert_eq!((b2.committed, b2.lag), (None, 0));
    let m = by_key[&key("mailer", "reports", 0)];
    assert_eq!((m.committed, m.log_end, m.lag), (Some(1), 4, 3));
    assert_eq!(readings.len(), 4, "{readings:?}");

    // The sampler keeps working on its connections: commit more and sample again.
    commit(&addr, "burnin", "kiln.nodes", &[(0, 5), (1, 3)]);
    let again = rt.block_on(sampler.sample()).expect("second sample");
    let lags: Vec<(i32, i64)> = again
        .iter()
        .filter(|r| r.key.group == "burnin")
        .map(|r| (r.key.partition, r.lag))
        .collect();
    assert_eq!(lags, [(0, 0), (1, 0), (2, 0)]);
    drop(broker);
}
