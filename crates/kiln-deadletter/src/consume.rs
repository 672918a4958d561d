//! The dead-letter consumer: one librdkafka `StreamConsumer` in group `deadletter` on
//! `kiln.nodes.dlq`, auto-commit and auto offset store off. Messages are handled one at a time
//! (dead letters are rare): decode, build the triage record, store it, and only then commit the
//! offset. A redelivered dead letter is harmless: records are unique on (hostname, cycle).
//!
//! An undecodable message is logged with its partition and offset and skipped (committed), as
//! the agents do: blocking the partition on it forever would hide every later node. A store
//! that keeps failing ends the service with an error, committing nothing past the message.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{anyhow, Context};
use kiln_agent::{DeadLetter, DLQ_SCHEMA_VERSION};
use kiln_queue::now_ms;
use kiln_queue::rdkafka::config::ClientConfig;
use kiln_queue::rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, StreamConsumer};
use kiln_queue::rdkafka::message::{BorrowedMessage, Message};
use kiln_queue::rdkafka::{Offset, TopicPartitionList};
use kiln_store::Store;
use tokio::sync::watch;
use tokio::time::timeout;

use crate::config::DeadletterConfig;
use crate::triage::triage_record;

/// Tries of one message's store work before the service gives up.
const STORE_TRIES_MAX: u32 = 5;
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

fn client_config(config: &DeadletterConfig) -> ClientConfig {
    let mut cc = ClientConfig::new();
    cc.set("bootstrap.servers", &config.bootstrap)
        .set("group.id", &config.group)
        .set("client.id", &config.instance_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", config.session_timeout_ms.to_string());
    for (k, v) in &config.kafka {
        cc.set(k, v);
    }
    cc
}

/// Per partition, the high watermark the group has not consumed up to yet (at start). The
/// scheduler waits for these before a report that is due at start, so the first report after
/// a restart includes what arrived while the service was down.
fn catch_up_targets(config: &DeadletterConfig) -> anyhow::Result<HashMap<i32, i64>> {
    let c: BaseConsumer = client_config(config).create().context("Kafka consumer")?;
    let md = c
        .fetch_metadata(Some(&config.topic), METADATA_TIMEOUT)
        .context("topic metadata")?;
    let Some(t) = md.topics().iter().find(|t| t.name() == config.topic) else {
        return Ok(HashMap::new());
    };
    let mut tpl = TopicPartitionList::new();
    let mut highs = HashMap::new();
    for p in t.partitions() {
        let (_, high) = c
            .fetch_watermarks(&config.topic, p.id(), METADATA_TIMEOUT)
            .context("watermarks")?;
        highs.insert(p.id(), high);
        tpl.add_partition(&config.topic, p.id());
    }
    let committed = c
        .committed_offsets(tpl, METADATA_TIMEOUT)
        .context("committed offsets")?;
    for e in committed.elements() {
        if let Offset::Offset(o) = e.offset() {
            if highs.get(&e.partition()).is_some_and(|h| o >= *h) {
                highs.remove(&e.partition());
            }
        }
    }
    highs.retain(|_, high| *high > 0);
    Ok(highs)
}

/// Consumes until an error it cannot get past; `caught_up` turns true once the group has
/// consumed what was on the topic at start (or at once when that cannot be told).
pub async fn run_consumer(
    config: &DeadletterConfig,
    store: &Store,
    caught_up: watch::Sender<bool>,
) -> anyhow::Result<()> {
    let consumer: StreamConsumer = client_config(config)
        .create()
        .context("creating the Kafka consumer")?;
    consumer
        .subscribe(&[config.topic.as_str()])
        .with_context(|| format!("subscribing to {}", config.topic))?;
    let cfg = config.clone();
    let mut targets = match tokio::task::spawn_blocking(move || catch_up_targets(&cfg)).await {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => {
            tracing::warn!(error = %format!("{e:#}"), "cannot tell how far behind the dead-letter topic is; not waiting for it");
            HashMap::new()
        }
        Err(e) => return Err(anyhow!("catch-up task: {e}")),
    };
    tracing::info!(topic = %config.topic, group = %config.group, behind = ?targets, "consuming dead letters");
    if targets.is_empty() {
        let _ = caught_up.send(true);
    }
    loop {
        let msg = match consumer.recv().await {
            Ok(m) => m,
            Err(e) => {
                // Transport errors are retried by librdkafka; keep polling.
                tracing::warn!(error = %e, "dead-letter consumer");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        handle(config, store, &msg).await?;
        consumer
            .commit_message(&msg, CommitMode::Async)
            .with_context(|| format!("committing {}/{}", msg.partition(), msg.offset()))?;
        if targets
            .get(&msg.partition())
            .is_some_and(|high| msg.offset() + 1 >= *high)
        {
            targets.remove(&msg.partition());
            if targets.is_empty() {
                tracing::info!("caught up with the dead-letter topic");
                let _ = caught_up.send(true);
            }
        }
    }
}

/// Decodes one dead letter (or gives up on it) and stores its triage record.
async fn handle(
    config: &DeadletterConfig,
    store: &Store,
    msg: &BorrowedMessage<'_>,
) -> anyhow::Result<()> {
    let (p, o) = (msg.partition(), msg.offset());
    let dl: DeadLetter = match msg.payload().map(serde_json::from_slice::<DeadLetter>) {
        Some(Ok(dl)) if dl.v == DLQ_SCHEMA_VERSION => dl,
        Some(Ok(dl)) => {
            tracing::error!(
                partition = p,
                offset = o,
                version = dl.v,
                "dead letter of an unknown schema version; skipped"
            );
            return Ok(());
        }
        Some(Err(e)) => {
            tracing::error!(partition = p, offset = o, error = %e, "undecodable dead letter; skipped");
            return Ok(());
        }
        None => {
            tracing::error!(partition = p, offset = o, "empty dead letter; skipped");
            return Ok(());
        }
    };
    let host = dl.message.node.hostname.clone();
    let limit = Duration::from_millis(config.step_timeout_ms);
    let mut last_err = None;
    for attempt in 1..=STORE_TRIES_MAX {
        let work = async {
            let fetched = match &dl.history {
                Some(_) => None,
                None => store.node_history(&host).await?,
            };
            let record = triage_record(&dl, dl.history.as_ref().or(fetched.as_ref()), now_ms());
            let new = store.record_triage(&record).await?;
            Ok::<_, kiln_store::StoreError>((record, new))
        };
        match timeout(limit, work).await {
            Ok(Ok((record, new))) => {
                tracing::info!(host, cycle = record.cycle, action = %record.action, new, partition = p, offset = o, "triage recorded");
                return Ok(());
            }
            Ok(Err(e)) => last_err = Some(anyhow::Error::from(e)),
            Err(_) => last_err = Some(anyhow!("no answer within {} ms", limit.as_millis())),
        }
        tracing::warn!(host, attempt, error = ?last_err, "storing the triage record failed; retrying");
        tokio::time::sleep(Duration::from_millis(500 << attempt.min(6))).await;
    }
    Err(last_err
        .unwrap_or_else(|| anyhow!("no tries"))
        .context(format!("storing the triage record of {host} ({p}/{o})")))
}
