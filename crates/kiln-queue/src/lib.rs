//! The node queue: the `kiln.nodes` message schema and a thin producer over librdkafka
//! (the `rdkafka` crate), so intake and the agents work against Kiln's broker, Apache Kafka or
//! Redpanda alike.
//!
//! Producer settings and why ([`producer_client_config`], used by intake's [`NodeProducer`]
//! and by the agents' producer of retries and dead letters, so every producer Kiln runs is
//! idempotent; a configuration that tries to turn idempotence off or lower `acks` is refused):
//! - `acks=all`: a node is registered only once the broker has it durably.
//! - `enable.idempotence=true`: a batch librdkafka retries (a lost answer, a leader failover)
//!   is recognised by its producer id and sequence numbers and written once, and a retry never
//!   overtakes a later batch, so each rack's nodes stay in manifest order in their partition
//!   with up to five requests in flight. (The consumers also tolerate a duplicate: every
//!   message carries (hostname, cycle, attempt) and the store keeps that unique.)
//! - `partitioner=murmur2_random`: the Java client's partitioner, so a rack's key maps to the
//!   same partition whichever Kafka client produces it (librdkafka's default is CRC32-based).

use std::time::Duration;

use kiln_manifest::NodeSpec;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::util::Timeout;
use serde::{Deserialize, Serialize};

pub use rdkafka;

mod settings;
pub use settings::{is_secret as is_secret_setting, KafkaSettings, SASL_PASSWORD};

/// The topic intake produces to and agents consume.
pub const NODES_TOPIC: &str = "kiln.nodes";
/// The version of [`NodeMessage`] this code writes and reads.
pub const SCHEMA_VERSION: u32 = 1;
/// Attempts a node gets in one burn-in cycle before it is dead-lettered.
pub const MAX_ATTEMPTS: u32 = 10;

/// One message on `kiln.nodes`: "burn in this node". Key: the node's rack (UTF-8), so a rack's
/// nodes share a partition and keep their order. Value: this struct as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeMessage {
    /// Schema version; always [`SCHEMA_VERSION`] when written by this code.
    pub v: u32,
    /// Identity (hostname, rack) and everything the manifest said about the node.
    pub node: NodeSpec,
    /// Which registration of this node (1 for the first; re-registering a node that passed
    /// or was dead-lettered starts the next cycle).
    pub cycle: u32,
    /// Attempt within the cycle, from 1 to [`MAX_ATTEMPTS`].
    pub attempt: u32,
    /// Unix time in ms before which no agent should start this attempt (back-off).
    pub not_before_ms: i64,
    /// Unix time in ms when this message was produced.
    pub enqueued_at_ms: i64,
}

impl NodeMessage {
    /// The first attempt of a cycle, runnable at once.
    pub fn first(node: NodeSpec, cycle: u32, now_ms: i64) -> Self {
        NodeMessage {
            v: SCHEMA_VERSION,
            node,
            cycle,
            attempt: 1,
            not_before_ms: now_ms,
            enqueued_at_ms: now_ms,
        }
    }

    pub fn key(&self) -> &str {
        &self.node.rack
    }

    pub fn encode(&self) -> Vec<u8> {
        match serde_json::to_vec(self) {
            Ok(v) => v,
            // Plain structs of strings and integers always serialise.
            Err(e) => unreachable!("NodeMessage serialisation failed: {e}"),
        }
    }

    /// Decodes a message value, refusing unknown versions before looking at the rest.
    pub fn decode(bytes: &[u8]) -> Result<NodeMessage, DecodeError> {
        #[derive(Deserialize)]
        struct Version {
            v: Option<u32>,
        }
        let version: Version =
            serde_json::from_slice(bytes).map_err(|e| DecodeError::Malformed(e.to_string()))?;
        match version.v {
            Some(SCHEMA_VERSION) => {}
            Some(v) => return Err(DecodeError::UnsupportedVersion(v)),
            None => {
                return Err(DecodeError::Malformed(
                    "no \"v\" (schema version) field".into(),
                ))
            }
        }
        let msg: NodeMessage =
            serde_json::from_slice(bytes).map_err(|e| DecodeError::Malformed(e.to_string()))?;
        if msg.attempt == 0 || msg.cycle == 0 {
            return Err(DecodeError::Malformed(
                "cycle and attempt start at 1".into(),
            ));
        }
        Ok(msg)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error(
        "node message schema version {0} is not supported (this build reads v{SCHEMA_VERSION})"
    )]
    UnsupportedVersion(u32),
    #[error("malformed node message: {0}")]
    Malformed(String),
}

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("invalid Kafka client configuration: {0}")]
    Config(String),
    #[error("cannot reach the Kafka cluster at {bootstrap}: {reason}")]
    Unreachable { bootstrap: String, reason: String },
    #[error(
        "topic {topic} does not exist on {bootstrap}; create it, e.g. \
         `kiln topics create {topic} --partitions 6`"
    )]
    NoSuchTopic { topic: String, bootstrap: String },
    #[error("produce to {topic} failed: {reason}")]
    Produce { topic: String, reason: String },
}

/// Producer settings. `extra` entries are passed to librdkafka as they are (after the
/// defaults, so they override them), e.g. `security.protocol=sasl_plaintext` for a real cluster.
/// `Debug` hides every secret among them (`sasl.password`, `ssl.key.password`, ...).
#[derive(Clone)]
pub struct ProducerConfig {
    pub bootstrap: String,
    pub topic: String,
    /// How long librdkafka keeps trying to deliver one message.
    pub message_timeout_ms: u32,
    pub client_id: String,
    pub extra: Vec<(String, String)>,
}

impl std::fmt::Debug for ProducerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let extra: Vec<(&str, &str)> = self
            .extra
            .iter()
            .map(|(k, v)| (k.as_str(), settings::shown_value(k, v)))
            .collect();
        f.debug_struct("ProducerConfig")
            .field("bootstrap", &self.bootstrap)
            .field("topic", &self.topic)
            .field("message_timeout_ms", &self.message_timeout_ms)
            .field("client_id", &self.client_id)
            .field("extra", &extra)
            .finish()
    }
}

impl ProducerConfig {
    pub fn new(bootstrap: impl Into<String>) -> Self {
        ProducerConfig {
            bootstrap: bootstrap.into(),
            topic: NODES_TOPIC.to_string(),
            message_timeout_ms: 30_000,
            client_id: "kiln-intake".into(),
            extra: Vec::new(),
        }
    }
}

/// Where a message landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    pub partition: i32,
    pub offset: i64,
}

/// A producer of [`NodeMessage`]s to one topic.
#[derive(Clone)]
pub struct NodeProducer {
    inner: FutureProducer,
    config: ProducerConfig,
}

/// How long to wait for free space in librdkafka's local queue before giving up on a message.
const QUEUE_FULL_WAIT: Duration = Duration::from_secs(30);
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// Settings an `extra` entry may not change in [`producer_client_config`], with the value
/// Kiln's producers need: turning idempotence off would let a retried batch be written twice
/// or overtake a later one, and idempotence needs acks from every in-sync replica.
const FIXED_PRODUCER_SETTINGS: [(&str, &str); 2] =
    [("enable.idempotence", "true"), ("acks", "all")];

/// The librdkafka configuration of every Kiln producer (intake's [`NodeProducer`], the agents'
/// retry and dead-letter producer): idempotent, acks=all, murmur2 partitioner (see the crate
/// docs). `extra` entries are applied after the defaults, so they override them (e.g.
/// `security.protocol`), except that `enable.idempotence` and `acks` must keep their values
/// ("true"/"all", any case): anything else is refused with [`QueueError::Config`].
pub fn producer_client_config<'a>(
    bootstrap: &str,
    client_id: &str,
    message_timeout_ms: u64,
    extra: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Result<ClientConfig, QueueError> {
    let mut cc = ClientConfig::new();
    cc.set("bootstrap.servers", bootstrap)
        .set("client.id", client_id)
        .set("max.in.flight.requests.per.connection", "5")
        .set("partitioner", "murmur2_random")
        .set("linger.ms", "5")
        .set("queue.buffering.max.messages", "200000")
        .set("message.timeout.ms", message_timeout_ms.to_string());
    for (k, v) in FIXED_PRODUCER_SETTINGS {
        cc.set(k, v);
    }
    for (k, v) in extra {
        let fixed = FIXED_PRODUCER_SETTINGS
            .iter()
            .find(|(fk, _)| fk.eq_ignore_ascii_case(k.trim()));
        if let Some((fk, fv)) = fixed {
            let same = v.trim().eq_ignore_ascii_case(fv) || (*fk == "acks" && v.trim() == "-1");
            if !same {
                return Err(QueueError::Config(format!(
                    "{k}={v} is refused: Kiln's producers are idempotent ({fk} is always {fv})"
                )));
            }
            continue;
        }
        cc.set(k, v);
    }
    Ok(cc)
}

impl NodeProducer {
    pub fn new(config: ProducerConfig) -> Result<Self, QueueError> {
        let cc = producer_client_config(
            &config.bootstrap,
            &config.client_id,
            config.message_timeout_ms.into(),
            config.extra.iter().map(|(k, v)| (k, v)),
        )?;
        let inner: FutureProducer = cc.create().map_err(|e| QueueError::Config(e.to_string()))?;
        Ok(NodeProducer { inner, config })
    }

    pub fn config(&self) -> &ProducerConfig {
        &self.config
    }

    /// Checks the cluster answers and the topic exists; returns its partition count.
    pub async fn check_topic(&self) -> Result<usize, QueueError> {
        let producer = self.inner.clone();
        let topic = self.config.topic.clone();
        let bootstrap = self.config.bootstrap.clone();
        let metadata = tokio::task::spawn_blocking(move || {
            producer
                .client()
                .fetch_metadata(Some(&topic), Timeout::After(METADATA_TIMEOUT))
        })
        .await
        .map_err(|e| QueueError::Unreachable {
            bootstrap: bootstrap.clone(),
            reason: e.to_string(),
        })?
        .map_err(|e| QueueError::Unreachable {
            bootstrap: bootstrap.clone(),
            reason: e.to_string(),
        })?;
        let no_topic = || QueueError::NoSuchTopic {
            topic: self.config.topic.clone(),
            bootstrap: bootstrap.clone(),
        };
        let Some(t) = metadata
            .topics()
            .iter()
            .find(|t| t.name() == self.config.topic)
        else {
            return Err(no_topic());
        };
        if t.error().is_some() || t.partitions().is_empty() {
            return Err(no_topic());
        }
        Ok(t.partitions().len())
    }

    /// Produces every message in order and waits for every delivery report. Result `i` is
    /// message `i`'s. `delivered` is called with the number of reports received so far.
    pub async fn send_all(
        &self,
        messages: &[NodeMessage],
        mut delivered: impl FnMut(usize),
    ) -> Vec<Result<Delivery, QueueError>> {
        let topic = self.config.topic.as_str();
        let mut pending = Vec::with_capacity(messages.len());
        for msg in messages {
            let payload = msg.encode();
            pending.push(self.enqueue(topic, msg.key(), &payload).await);
        }
        let mut results = Vec::with_capacity(messages.len());
        for (i, p) in pending.into_iter().enumerate() {
            let result = match p {
                Err(e) => Err(e),
                Ok(future) => match future.await {
                    Ok(Ok(d)) => Ok(Delivery {
                        partition: d.partition,
                        offset: d.offset,
                    }),
                    Ok(Err((e, _))) => Err(self.produce_error(e.to_string())),
                    Err(_cancelled) => {
                        Err(self.produce_error("the producer was dropped before delivery".into()))
                    }
                },
            };
            results.push(result);
            delivered(i + 1);
        }
        results
    }

    async fn enqueue(
        &self,
        topic: &str,
        key: &str,
        payload: &[u8],
    ) -> Result<rdkafka::producer::DeliveryFuture, QueueError> {
        let deadline = tokio::time::Instant::now() + QUEUE_FULL_WAIT;
        loop {
            let record = FutureRecord::to(topic).key(key).payload(payload);
            match self.inner.send_result(record) {
                Ok(future) => return Ok(future),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _))
                    if tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err((e, _)) => return Err(self.produce_error(e.to_string())),
            }
        }
    }

    fn produce_error(&self, reason: String) -> QueueError {
        QueueError::Produce {
            topic: self.config.topic.clone(),
            reason,
        }
    }

    /// Waits until everything queued locally has been sent (or `timeout` passes).
    pub fn flush(&self, timeout: Duration) -> Result<(), QueueError> {
        self.inner
            .flush(Timeout::After(timeout))
            .map_err(|e| self.produce_error(e.to_string()))
    }
}

/// Creates `topic` with `partitions` partitions (and `replication` replicas) unless it exists.
/// For tests, benchmarks and first-time setup; production topics are created by operators.
pub async fn create_topic(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    replication: i32,
) -> Result<(), QueueError> {
    create_topic_with(
        bootstrap,
        topic,
        partitions,
        replication,
        &KafkaSettings::default(),
    )
    .await
}

/// [`create_topic`] with extra librdkafka settings, for a listener with TLS or SASL
/// (`security.protocol`, `sasl.username`, ...).
pub async fn create_topic_with(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    replication: i32,
    settings: &KafkaSettings,
) -> Result<(), QueueError> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let mut cc = ClientConfig::new();
    cc.set("bootstrap.servers", bootstrap);
    for (k, v) in settings {
        cc.set(k, v);
    }
    let admin: AdminClient<DefaultClientContext> =
        cc.create().map_err(|e| QueueError::Config(e.to_string()))?;
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(replication));
    let opts = AdminOptions::new().operation_timeout(Some(METADATA_TIMEOUT));
    let results =
        admin
            .create_topics([&new], &opts)
            .await
            .map_err(|e| QueueError::Unreachable {
                bootstrap: bootstrap.to_string(),
                reason: e.to_string(),
            })?;
    for r in results {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => {
                return Err(QueueError::Produce {
                    topic: name,
                    reason: format!("create topic: {code}"),
                })
            }
        }
    }
    Ok(())
}

/// Unix time now in milliseconds.
pub fn now_ms() -> i64 {
    match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        Err(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> NodeSpec {
        NodeSpec {
            hostname: "gpu-a-01".into(),
            rack: "a".into(),
            bmc_address: "10.0.0.1".into(),
            gpu_model: "H100".into(),
            gpu_count: 8,
            firmware_bmc: "1".into(),
            firmware_bios: "2".into(),
            firmware_gpu_vbios: "3".into(),
            firmware_nic: "4".into(),
            labels: [("row".to_string(), "3".to_string())].into(),
        }
    }

    #[test]
    fn message_round_trips_and_is_versioned() {
        let m = NodeMessage::first(spec(), 2, 1_700_000_000_000);
        let bytes = m.encode();
        let json: serde_json::Value = serde_json::from_slice(&bytes).expect("json");
        assert_eq!(json["v"], 1);
        assert_eq!(json["node"]["hostname"], "gpu-a-01");
        assert_eq!(json["attempt"], 1);
        assert_eq!(json["cycle"], 2);
        assert_eq!(NodeMessage::decode(&bytes), Ok(m.clone()));
        assert_eq!(m.key(), "a");
    }

    #[test]
    fn decode_refuses_other_versions_and_garbage() {
        let mut json: serde_json::Value =
            serde_json::from_slice(&NodeMessage::first(spec(), 1, 0).encode()).expect("json");
        json["v"] = 2.into();
        let bytes = serde_json::to_vec(&json).expect("json");
        assert_eq!(
            NodeMessage::decode(&bytes),
            Err(DecodeError::UnsupportedVersion(2))
        );
        // A v2 message may carry fields v1 does not know: the version is checked first.
        json["new_field"] = true.into();
        let bytes = serde_json::to_vec(&json).expect("json");
        assert_eq!(
            NodeMessage::decode(&bytes),
            Err(DecodeError::UnsupportedVersion(2))
        );
        assert!(matches!(
            NodeMessage::decode(b"not json"),
            Err(DecodeError::Malformed(_))
        ));
        assert!(matches!(
            NodeMessage::decode(b"{}"),
            Err(DecodeError::Malformed(_))
        ));
        json["v"] = 1.into();
        json["attempt"] = 0.into();
        json.as_object_mut().map(|o| o.remove("new_field"));
        let bytes = serde_json::to_vec(&json).expect("json");
        assert!(matches!(
            NodeMessage::decode(&bytes),
            Err(DecodeError::Malformed(_))
        ));
    }

    #[test]
    fn producer_config_debug_hides_secrets() {
        let mut config = ProducerConfig::new("127.0.0.1:9092");
        config.extra = extra(&[
            ("security.protocol", "SASL_SSL"),
            ("sasl.password", "pw-in-extra-1"),
            ("SSL.Key.Password", "pw-in-extra-2"),
            ("ssl.key.pem", "-----BEGIN PRIVATE KEY-----pw-in-extra-3"),
        ]);
        let shown = format!("{config:?}");
        assert!(
            shown.contains("SASL_SSL") && shown.contains("<hidden>"),
            "{shown}"
        );
        assert!(!shown.contains("pw-in-extra"), "{shown}");
    }

    fn extra(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn build(pairs: &[(&str, &str)]) -> Result<ClientConfig, QueueError> {
        let e = extra(pairs);
        producer_client_config("127.0.0.1:9092", "t", 1000, e.iter().map(|(k, v)| (k, v)))
    }

    #[test]
    fn producers_are_idempotent_with_acks_all() {
        let cc = build(&[]).expect("config");
        assert_eq!(cc.get("enable.idempotence"), Some("true"));
        assert_eq!(cc.get("acks"), Some("all"));
        // librdkafka's limit for idempotence is 5 in flight; more would be refused by it.
        assert_eq!(cc.get("max.in.flight.requests.per.connection"), Some("5"));
        assert_eq!(cc.get("partitioner"), Some("murmur2_random"));
        // NodeProducer (intake) goes through the same builder: creating one must not fail.
        let p = NodeProducer::new(ProducerConfig::new("127.0.0.1:9")).expect("producer");
        assert_eq!(p.config().client_id, "kiln-intake");
    }

    #[test]
    fn extra_settings_override_all_but_idempotence() {
        let cc = build(&[
            ("security.protocol", "plaintext"),
            ("linger.ms", "20"),
            ("enable.idempotence", "TRUE"),
            ("acks", "-1"),
        ])
        .expect("config");
        assert_eq!(cc.get("security.protocol"), Some("plaintext"));
        assert_eq!(cc.get("linger.ms"), Some("20"));
        assert_eq!(cc.get("enable.idempotence"), Some("true"));
        assert_eq!(cc.get("acks"), Some("all"));
        for bad in [
            ("enable.idempotence", "false"),
            ("acks", "1"),
            (" Acks ", "0"),
        ] {
            match build(&[bad]) {
                Err(QueueError::Config(m)) => {
                    assert!(m.contains("idempotent"), "{m}");
                }
                Err(e) => panic!("{bad:?}: {e}"),
                Ok(_) => panic!("{bad:?} accepted"),
            }
            let config = ProducerConfig {
                extra: extra(&[bad]),
                ..ProducerConfig::new("127.0.0.1:9")
            };
            assert!(NodeProducer::new(config).is_err(), "{bad:?}");
        }
    }
}
