//! The agent loop. One `StreamConsumer` in group `burnin` (auto-commit and auto offset store
//! off, cooperative-sticky assignment); every message becomes a task. Per partition at most
//! `max_in_flight_per_partition` tasks run; later messages wait in a local queue, and the
//! partition is paused only when that queue is full (`WAITING_MAX`) and resumed when it has
//! drained to half. Each task runs one node:
//!
//! 1. decode the `NodeMessage` (an undecodable message is logged and skipped);
//! 2. wait until its `not_before_ms` (back-off) — holding its slot, not the partition;
//! 3. `Store::begin_run`; run the playbook under its deadline; `Store::finish_run` (the run,
//!    its check results and the node's next state in one transaction);
//! 4. on `retrying`, produce attempt + 1 to `kiln.nodes` with a back-off; on `dead_lettered`,
//!    produce a [`DeadLetter`] (history and last error) to `kiln.nodes.dlq`;
//! 5. report done to the loop, which marks the offset finished in the partition's
//!    [`Watermark`] and commits the watermark when it moved.
//!
//! So an offset is committed only after its result is in the store and its follow-up message
//! is delivered (invariant 7). Every store call and produce has a timeout; a task whose steps
//! keep failing is retried a few times, then the agent exits with an error, committing
//! nothing past that node, which is redelivered to another agent.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context as _};
use kiln_checks::{CheckContext, FirmwareBaseline, NodeTarget, Verdict};
use kiln_queue::rdkafka::config::ClientConfig;
use kiln_queue::rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use kiln_queue::rdkafka::error::KafkaResult;
use kiln_queue::rdkafka::message::{Message, OwnedMessage};
use kiln_queue::rdkafka::producer::{FutureProducer, FutureRecord};
use kiln_queue::rdkafka::{ClientContext, Offset, TopicPartitionList};
use kiln_queue::{now_ms, NodeMessage};
use kiln_store::{
    BeginRun, CheckVerdict, FinishOptions, NodeHistory, NodeState, RunVerdict, Store,
};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio::time::{timeout, Instant};

use crate::access::NodeAccess;
use crate::config::AgentConfig;
use crate::metrics::{self, AgentMetrics};
use crate::playbooks::{needs_bmc, needs_shell, PlaybookSet};
use crate::watermark::Watermark;

/// Version of the [`DeadLetter`] JSON on `kiln.nodes.dlq`.
pub const DLQ_SCHEMA_VERSION: u32 = 1;
/// Largest dead letter produced: below the 1 MB `message.max.bytes` brokers and librdkafka
/// default to. A history that would not fit is left out (the store has it whole).
pub const DEAD_LETTER_BYTES_MAX: usize = 900 * 1024;
/// Times a node's work (store, produce) is retried before the agent gives up and exits.
const WORK_TRIES_MAX: u32 = 5;
/// How often paused partitions are checked against their bound.
const RESUME_CHECK: Duration = Duration::from_secs(1);
/// Messages received beyond the in-flight bound wait in a local queue (they count as
/// unfinished for the commit watermark). The partition is paused only when this many wait:
/// pausing makes librdkafka drop what it had prefetched, and the resumed fetch costs up to
/// `fetch.wait.max.ms` (500 ms), which would otherwise be paid after every node. Node
/// messages are about 1 KiB, so the queue stays small.
const WAITING_MAX: usize = 1024;

/// A dead-lettered node on `kiln.nodes.dlq` (key: rack): the last attempt's message, why it
/// failed and everything the store knows about the node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetter {
    pub v: u32,
    pub message: NodeMessage,
    pub last_error: String,
    pub history: Option<NodeHistory>,
    pub agent: String,
    pub dead_lettered_at_ms: i64,
}

enum RebalanceEvent {
    Assigned(Vec<i32>),
    Revoked(Vec<i32>),
}

struct AgentContext {
    topic: String,
    events: mpsc::UnboundedSender<RebalanceEvent>,
    metrics: Arc<AgentMetrics>,
}

impl AgentContext {
    fn partitions(&self, tpl: &TopicPartitionList) -> Vec<i32> {
        tpl.elements()
            .iter()
            .filter(|e| e.topic() == self.topic)
            .map(|e| e.partition())
            .collect()
    }
}

impl ClientContext for AgentContext {}

impl ConsumerContext for AgentContext {
    fn pre_rebalance(&self, _c: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let parts = self.partitions(tpl);
            tracing::info!(partitions = ?parts, "partitions revoked");
            self.metrics.forget(&self.topic, &parts);
            let _ = self.events.send(RebalanceEvent::Revoked(parts));
        }
    }
    fn post_rebalance(&self, _c: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            let parts = self.partitions(tpl);
            tracing::info!(partitions = ?parts, "partitions assigned");
            let _ = self.events.send(RebalanceEvent::Assigned(parts));
        }
    }
    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        if let Err(e) = result {
            tracing::warn!(error = %e, ?offsets, "offset commit failed; a later commit covers it");
        }
    }
}

/// What every task shares.
struct Shared {
    config: AgentConfig,
    store: Store,
    playbooks: PlaybookSet,
    access: NodeAccess,
    producer: FutureProducer,
    metrics: Arc<AgentMetrics>,
}

/// One partition's work.
struct Partition {
    epoch: u64,
    watermark: Watermark,
    running: HashMap<i64, AbortHandle>,
    waiting: VecDeque<OwnedMessage>,
    paused: bool,
}

struct Done {
    partition: i32,
    offset: i64,
    epoch: u64,
    result: anyhow::Result<()>,
}

/// Runs an agent until `shutdown` resolves (or a fatal error).
pub async fn run_agent(
    config: AgentConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    config.validate()?;
    let playbooks = PlaybookSet::load(config.playbook.as_ref(), &config.playbooks)?;
    let access = NodeAccess::new(&config.ssh, &config.redfish)?;
    let store = timeout(
        Duration::from_millis(config.step_timeout_ms),
        Store::connect_with_password_file(
            &config.database_url,
            config.database_password_file.as_deref(),
        ),
    )
    .await
    .map_err(|_| {
        anyhow!(
            "the store did not answer within {} ms",
            config.step_timeout_ms
        )
    })??;

    // Intake's producer settings (kiln_queue): idempotent, so retries and dead letters are
    // written once and in order, across failovers too; the same partitioner as intake.
    let producer: FutureProducer = kiln_queue::producer_client_config(
        &config.bootstrap,
        &format!("kiln-agent-{}", config.agent_id),
        config.step_timeout_ms,
        &config.kafka,
    )?
    .create()
    .context("creating the producer")?;

    let agent_metrics = Arc::new(AgentMetrics::new(&config.agent_id, &config.group));
    let metrics_task = metrics::bind(&config.metrics_listen)
        .await?
        .map(|l| tokio::spawn(metrics::serve(l, agent_metrics.clone())));
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let mut cc = ClientConfig::new();
    cc.set("bootstrap.servers", &config.bootstrap)
        .set("group.id", &config.group)
        .set("client.id", format!("kiln-agent-{}", config.agent_id))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("partition.assignment.strategy", "cooperative-sticky")
        .set("session.timeout.ms", config.session_timeout_ms.to_string())
        .set(
            "heartbeat.interval.ms",
            (config.session_timeout_ms / 3).max(100).to_string(),
        );
    for (k, v) in &config.kafka {
        cc.set(k, v);
    }
    let consumer: StreamConsumer<AgentContext> = cc
        .create_with_context(AgentContext {
            topic: config.topic.clone(),
            events: events_tx,
            metrics: agent_metrics.clone(),
        })
        .context("creating the consumer")?;
    consumer
        .subscribe(&[&config.topic])
        .context("subscribing")?;
    tracing::info!(agent = %config.agent_id, group = %config.group, topic = %config.topic,
        playbooks = %playbooks.describe(), "agent started");

    let shared = Arc::new(Shared {
        config,
        store,
        playbooks,
        access,
        producer,
        metrics: agent_metrics,
    });
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Done>();
    let mut parts: HashMap<i32, Partition> = HashMap::new();
    let mut assigned: HashSet<i32> = HashSet::new();
    // Resumes every assigned partition that is below its bound, in case a pause outlived the
    // state that set it (librdkafka keeps an application pause across reassignment).
    let mut resume_tick = tokio::time::interval(RESUME_CHECK);
    let mut next_epoch = 0u64;
    let max = shared.config.max_in_flight_per_partition;
    let topic = shared.config.topic.clone();
    tokio::pin!(shutdown);

    let result: anyhow::Result<()> = loop {
        tokio::select! {
            _ = &mut shutdown => break Ok(()),
            Some(ev) = events.recv() => {
                apply_rebalance(ev, &mut parts, &mut assigned, &consumer, &topic);
            }
            _ = resume_tick.tick() => {
                for p in &assigned {
                    let part = parts.get_mut(p);
                    let full = part
                        .as_ref()
                        .is_some_and(|x| x.waiting.len() >= WAITING_MAX);
                    if !full {
                        if let Err(e) = set_paused(&consumer, &topic, *p, false) {
                            tracing::warn!(error = %e, partition = *p, "resume failed");
                        } else if let Some(x) = part {
                            x.paused = false;
                        }
                    }
                }
            }
            Some(done) = done_rx.recv() => {
                while let Ok(ev) = events.try_recv() {
                    apply_rebalance(ev, &mut parts, &mut assigned, &consumer, &topic);
                }
                let Some(part) = parts.get_mut(&done.partition) else { continue };
                if part.epoch != done.epoch {
                    continue;
                }
                part.running.remove(&done.offset);
                if let Err(e) = done.result {
                    break Err(e.context(format!(
                        "giving up on partition {} offset {}", done.partition, done.offset
                    )));
                }
                if let Some(commit) = part.watermark.finish(done.offset) {
                    let mut tpl = TopicPartitionList::new();
                    if let Err(e) = tpl.add_partition_offset(&topic, done.partition, Offset::Offset(commit)) {
                        break Err(e.into());
                    }
                    if let Err(e) = consumer.commit(&tpl, CommitMode::Async) {
                        tracing::warn!(error = %e, partition = done.partition, commit, "commit failed");
                    } else {
                        tracing::debug!(partition = done.partition, commit, "committed");
                        shared.metrics.committed(&topic, done.partition, commit);
                    }
                }
                while part.running.len() < max {
                    let Some(m) = part.waiting.pop_front() else { break };
                    spawn_work(&shared, part, m, &done_tx);
                }
                if part.paused && part.waiting.len() < WAITING_MAX / 2 {
                    match set_paused(&consumer, &topic, done.partition, false) {
                        Ok(()) => part.paused = false,
                        Err(e) => tracing::warn!(error = %e, "resume failed"),
                    }
                }
            }
            msg = consumer.recv() => {
                let msg = match msg {
                    Ok(m) => m.detach(),
                    Err(e) => {
                        tracing::warn!(error = %e, "consumer error");
                        continue;
                    }
                };
                while let Ok(ev) = events.try_recv() {
                    apply_rebalance(ev, &mut parts, &mut assigned, &consumer, &topic);
                }
                if msg.topic() != topic {
                    continue;
                }
                let p = msg.partition();
                if !assigned.contains(&p) {
                    // Fetched before a revocation: no longer ours (the new owner reads it
                    // again from the committed offset), so neither run nor commit it.
                    tracing::debug!(partition = p, offset = msg.offset(), "message of a revoked partition dropped");
                    continue;
                }
                let part = parts.entry(p).or_insert_with(|| {
                    next_epoch += 1;
                    Partition {
                        epoch: next_epoch,
                        watermark: Watermark::new(),
                        running: HashMap::new(),
                        waiting: VecDeque::new(),
                        paused: false,
                    }
                });
                if !part.watermark.start(msg.offset()) {
                    continue;
                }
                if part.running.len() < max {
                    spawn_work(&shared, part, msg, &done_tx);
                } else {
                    part.waiting.push_back(msg);
                }
                if !part.paused && part.waiting.len() >= WAITING_MAX {
                    match set_paused(&consumer, &topic, p, true) {
                        Ok(()) => part.paused = true,
                        Err(e) => tracing::warn!(error = %e, "pause failed"),
                    }
                }
            }
        }
    };
    for part in parts.values() {
        for h in part.running.values() {
            h.abort();
        }
    }
    consumer.unsubscribe();
    if let Some(t) = metrics_task {
        t.abort();
    }
    shared.store.close().await;
    // Dropping the consumer blocks until librdkafka has left the group (and the producer until
    // it is destroyed). Done on a blocking thread: on an async worker it would also stall the
    // tasks queued behind it on that worker, such as the handler of this very LeaveGroup when
    // the broker runs in the same process (`kiln demo`, tests) — a 5 s stall per agent.
    if let Err(e) = tokio::task::spawn_blocking(move || drop((consumer, shared))).await {
        tracing::warn!(error = %e, "closing the Kafka clients failed");
    }
    tracing::info!("agent stopped");
    result
}

fn set_paused(
    consumer: &StreamConsumer<AgentContext>,
    topic: &str,
    partition: i32,
    pause: bool,
) -> KafkaResult<()> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, partition);
    if pause {
        consumer.pause(&tpl)
    } else {
        consumer.resume(&tpl)
    }
}

/// Revoked partitions: their work is abandoned (another agent gets the messages again from
/// the committed offset) and their watermarks dropped. Assigned: a fresh start (anything left
/// from an earlier ownership is dropped) and resumed, as librdkafka keeps an application pause
/// from an earlier assignment.
fn apply_rebalance(
    ev: RebalanceEvent,
    parts: &mut HashMap<i32, Partition>,
    assigned: &mut HashSet<i32>,
    consumer: &StreamConsumer<AgentContext>,
    topic: &str,
) {
    let (ps, assign) = match ev {
        RebalanceEvent::Revoked(ps) => (ps, false),
        RebalanceEvent::Assigned(ps) => (ps, true),
    };
    for p in ps {
        if let Some(part) = parts.remove(&p) {
            for h in part.running.values() {
                h.abort();
            }
        }
        if assign {
            assigned.insert(p);
            if let Err(e) = set_paused(consumer, topic, p, false) {
                tracing::warn!(error = %e, partition = p, "resume failed");
            }
        } else {
            assigned.remove(&p);
        }
    }
}

fn spawn_work(
    shared: &Arc<Shared>,
    part: &mut Partition,
    msg: OwnedMessage,
    done: &mpsc::UnboundedSender<Done>,
) {
    let (partition, offset, epoch) = (msg.partition(), msg.offset(), part.epoch);
    let shared = Arc::clone(shared);
    let done = done.clone();
    let handle = tokio::spawn(async move {
        let result = work(&shared, msg.payload().unwrap_or_default()).await;
        let _ = done.send(Done {
            partition,
            offset,
            epoch,
            result,
        });
    });
    part.running.insert(offset, handle.abort_handle());
}

/// One node, from message to follow-up; retried on store or produce errors.
async fn work(shared: &Shared, payload: &[u8]) -> anyhow::Result<()> {
    let _in_flight = shared.metrics.task_started();
    let msg = match NodeMessage::decode(payload) {
        Ok(m) => m,
        Err(e) => {
            tracing::error!(error = %e, "skipping an undecodable message on the node topic");
            return Ok(());
        }
    };
    let wait_ms = msg.not_before_ms.saturating_sub(now_ms());
    if wait_ms > 0 {
        tracing::debug!(host = %msg.node.hostname, attempt = msg.attempt, wait_ms, "waiting out back-off");
        tokio::time::sleep(Duration::from_millis(u64::try_from(wait_ms).unwrap_or(0))).await;
    }
    let mut tries = 0;
    loop {
        tries += 1;
        match burn_in(shared, &msg).await {
            Ok(()) => return Ok(()),
            Err(e) if tries < WORK_TRIES_MAX => {
                let pause = Duration::from_millis(500 << tries);
                tracing::warn!(host = %msg.node.hostname, attempt = msg.attempt, error = %format!("{e:#}"),
                    "node work failed; trying again in {} ms", pause.as_millis());
                tokio::time::sleep(pause).await;
            }
            Err(e) => return Err(e.context(format!("node {}", msg.node.hostname))),
        }
    }
}

async fn step<T, E>(
    shared: &Shared,
    what: &str,
    f: impl std::future::Future<Output = Result<T, E>>,
) -> anyhow::Result<T>
where
    E: std::error::Error + Send + Sync + 'static,
{
    let limit = shared.config.step_timeout_ms;
    match timeout(Duration::from_millis(limit), f).await {
        Ok(r) => r.with_context(|| what.to_string()),
        Err(_) => Err(anyhow!("{what}: no answer within {limit} ms")),
    }
}

async fn burn_in(shared: &Shared, msg: &NodeMessage) -> anyhow::Result<()> {
    let agent = shared.config.agent_id.as_str();
    let host = msg.node.hostname.as_str();
    let begun = step(
        shared,
        "store: begin run",
        shared
            .store
            .begin_run(&msg.node, msg.cycle, msg.attempt, agent, now_ms()),
    )
    .await?;
    let (state, last_error) = match begun {
        BeginRun::Stale { current } => {
            tracing::info!(
                host,
                cycle = msg.cycle,
                attempt = msg.attempt,
                ?current,
                "stale message; skipped"
            );
            return Ok(());
        }
        BeginRun::AlreadyFinished { state, .. } => {
            tracing::info!(host, attempt = msg.attempt, %state, "attempt already finished (redelivery); repeating its follow-up");
            (state, String::new())
        }
        BeginRun::Started { run } | BeginRun::Resumed { run, .. } => {
            let (verdict, checks) = run_playbook(shared, msg).await;
            let last_error = checks
                .iter()
                .filter(|c| !matches!(c.verdict, CheckVerdict::Pass))
                .map(|c| format!("{}: {}", c.name, c.message))
                .collect::<Vec<_>>()
                .join("; ");
            let options = if verdict == RunVerdict::Fail {
                fail_fast(shared, msg, &checks).await?
            } else {
                FinishOptions::default()
            };
            let finished = step(
                shared,
                "store: finish run",
                shared
                    .store
                    .finish_run_with(run, verdict, &checks, now_ms(), &options),
            )
            .await?;
            tracing::info!(host, attempt = msg.attempt, ?verdict, state = %finished.state, "run finished");
            shared.metrics.record_outcome(finished.state);
            if finished.state == NodeState::Retrying && !finished.already_finished {
                remediate(shared, msg, &checks).await?;
            }
            (finished.state, last_error)
        }
    };
    match state {
        NodeState::Passed => Ok(()),
        NodeState::Retrying => {
            let now = now_ms();
            let backoff = shared.config.backoff_ms(msg.attempt);
            let next = NodeMessage {
                attempt: msg.attempt + 1,
                not_before_ms: now.saturating_add(i64::try_from(backoff).unwrap_or(i64::MAX)),
                enqueued_at_ms: now,
                ..msg.clone()
            };
            produce(shared, &shared.config.topic, msg.key(), &next.encode()).await
        }
        NodeState::DeadLettered => {
            let history = step(
                shared,
                "store: node history",
                shared.store.node_history(host),
            )
            .await?;
            let last_error = if last_error.is_empty() {
                history
                    .as_ref()
                    .map(|h| h.node.state_reason.clone())
                    .unwrap_or_default()
            } else {
                last_error
            };
            let mut dl = DeadLetter {
                v: DLQ_SCHEMA_VERSION,
                message: msg.clone(),
                last_error,
                history: history.map(lean_history),
                agent: shared.config.agent_id.clone(),
                dead_lettered_at_ms: now_ms(),
            };
            let mut payload = serde_json::to_vec(&dl).context("encoding the dead letter")?;
            if payload.len() > DEAD_LETTER_BYTES_MAX {
                tracing::warn!(host, bytes = payload.len(), "dead letter too large with its history; sending it without (the store keeps it)");
                dl.history = None;
                payload = serde_json::to_vec(&dl).context("encoding the dead letter")?;
            }
            tracing::warn!(host, attempts = msg.attempt, "dead-lettered");
            produce(shared, &shared.config.dlq_topic, msg.key(), &payload).await
        }
        other => Err(anyhow!("store left {host} {other} after its run")),
    }
}

/// Whether this failed attempt dead-letters its node now (`[fail_fast]`), with the cycle's
/// earlier failed runs from the store when a repeated fault is looked for.
async fn fail_fast(
    shared: &Shared,
    msg: &NodeMessage,
    checks: &[kiln_store::CheckResult],
) -> anyhow::Result<FinishOptions> {
    let settings = &shared.config.fail_fast;
    let earlier = if settings.repeated && msg.attempt > 1 {
        step(
            shared,
            "store: node history",
            shared.store.node_history(&msg.node.hostname),
        )
        .await?
        .map(|h| {
            h.runs
                .into_iter()
                .filter(|r| {
                    r.cycle == msg.cycle
                        && r.attempt < msg.attempt
                        && r.verdict == Some(RunVerdict::Fail)
                })
                .collect::<Vec<_>>()
        })
        .unwrap_or_default()
    } else {
        Vec::new()
    };
    let dead_letter_now = crate::decide::dead_letter_now(settings, checks, &earlier);
    if let Some(why) = &dead_letter_now {
        tracing::warn!(host = %msg.node.hostname, attempt = msg.attempt, why, "dead-lettering at once");
    }
    Ok(FinishOptions { dead_letter_now })
}

/// Runs the `[remediation]` command the failed checks call for, if one is configured, and
/// records what it did in the node's history. A remediation that fails is recorded, not
/// retried: the next attempt shows whether the fault is still there.
async fn remediate(
    shared: &Shared,
    msg: &NodeMessage,
    checks: &[kiln_store::CheckResult],
) -> anyhow::Result<()> {
    let Some(r) = crate::decide::remediation(&shared.config.remediation, checks) else {
        return Ok(());
    };
    let host = msg.node.hostname.as_str();
    let limit = Duration::from_millis(shared.config.remediation.timeout_ms);
    let outcome = match shared
        .access
        .open(host, &msg.node.bmc_address, true, false)
        .await
    {
        Ok(session) => {
            let result = match &session.shell {
                Some(shell) => match shell.exec(&r.command, limit).await {
                    Ok(out) => format!("exit {:?}", out.exit_code),
                    Err(e) => format!("did not complete: {e}"),
                },
                None => "no SSH access configured".to_string(),
            };
            let close_limit = Duration::from_millis(shared.config.step_timeout_ms);
            let _ = timeout(close_limit, session.close()).await;
            result
        }
        Err(e) => format!("not run: {e}"),
    };
    let reason = format!(
        "remediation {} before attempt {}: `{}`: {outcome}",
        r.action.as_str(),
        msg.attempt + 1,
        r.command
    );
    tracing::info!(host, %reason, "remediation");
    step(
        shared,
        "store: remediation event",
        shared.store.add_event(host, &reason, now_ms()),
    )
    .await?;
    Ok(())
}

/// A history for the dead-letter topic: without the raw evidence of its checks, and without
/// the measured values of the checks that passed (the store keeps both). Ten attempts of a
/// long playbook would otherwise not fit one message.
fn lean_history(mut h: NodeHistory) -> NodeHistory {
    for run in &mut h.runs {
        for c in &mut run.checks {
            c.evidence.clear();
            if c.verdict == CheckVerdict::Pass {
                c.measured = serde_json::Value::Null;
            }
        }
    }
    h
}

async fn produce(shared: &Shared, topic: &str, key: &str, payload: &[u8]) -> anyhow::Result<()> {
    let limit = Duration::from_millis(shared.config.step_timeout_ms);
    let record = FutureRecord::to(topic).key(key).payload(payload);
    match timeout(limit, shared.producer.send(record, limit)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err((e, _))) => Err(anyhow!("produce to {topic}: {e}")),
        Err(_) => Err(anyhow!(
            "produce to {topic}: no delivery report within {} ms",
            limit.as_millis()
        )),
    }
}

/// Runs the playbook under its deadline (plus a grace period for the whole run), mapping
/// check results to the store's form. `Error` verdicts fail the attempt (it is retried).
async fn run_playbook(
    shared: &Shared,
    msg: &NodeMessage,
) -> (RunVerdict, Vec<kiln_store::CheckResult>) {
    let node = &msg.node;
    let pb = match shared
        .playbooks
        .for_node(&node.gpu_model, u32::from(node.gpu_count))
    {
        Ok(pb) => pb,
        Err(why) => return not_run(shared, "playbook", why),
    };
    // Waits for an SSH permit (agent-wide bound) before the run's deadline starts.
    let session = match shared
        .access
        .open(
            &node.hostname,
            &node.bmc_address,
            needs_shell(pb),
            needs_bmc(pb),
        )
        .await
    {
        Ok(s) => s,
        Err(why) => return not_run(shared, "node_access", why),
    };
    let mut ctx = CheckContext::new(target(msg), Instant::now() + pb.timeout);
    ctx.shell = session.shell.clone();
    ctx.bmc = session.bmc.clone();
    let limit = pb.timeout + Duration::from_millis(shared.config.run_grace_ms);
    let running = shared.metrics.playbook_started();
    let run = timeout(limit, pb.run(&ctx)).await;
    drop(running);
    drop(ctx);
    // Always disconnect and log out (BMCs have few session slots), bounded like a store step.
    let close_limit = Duration::from_millis(shared.config.step_timeout_ms);
    if timeout(close_limit, session.close()).await.is_err() {
        tracing::warn!(host = %node.hostname, "closing SSH and Redfish sessions timed out");
    }
    let run = match run {
        Ok(run) => run,
        Err(_) => {
            shared
                .metrics
                .record_check("playbook", Verdict::Error, limit);
            let check = kiln_store::CheckResult {
                name: "playbook".into(),
                verdict: CheckVerdict::Error,
                measured: serde_json::json!({ "timed_out": true, "limit_ms": limit.as_millis() as u64 }),
                message: format!(
                    "the playbook did not finish within {} ms",
                    limit.as_millis()
                ),
                evidence: String::new(),
                findings: Vec::new(),
            };
            return (RunVerdict::Fail, vec![check]);
        }
    };
    for r in &run.results {
        shared.metrics.record_check(&r.name, r.verdict, r.duration);
    }
    let verdict = match run.verdict {
        Verdict::Pass => RunVerdict::Pass,
        Verdict::Fail | Verdict::Error => RunVerdict::Fail,
    };
    let checks = run
        .results
        .into_iter()
        .map(|r| {
            let mut measured = r.measured;
            if let serde_json::Value::Object(m) = &mut measured {
                m.insert("duration_ms".into(), (r.duration.as_millis() as u64).into());
            }
            kiln_store::CheckResult {
                name: r.name,
                verdict: match r.verdict {
                    Verdict::Pass => CheckVerdict::Pass,
                    Verdict::Fail => CheckVerdict::Fail,
                    Verdict::Error => CheckVerdict::Error,
                },
                measured,
                message: r.message,
                evidence: match r.evidence {
                    serde_json::Value::Null => String::new(),
                    serde_json::Value::String(s) => s,
                    other => other.to_string(),
                },
                findings: r.findings.clone(),
            }
        })
        .collect();
    (verdict, checks)
}

/// A run that could not start (no playbook for the node, no way to reach it): recorded as one
/// `Error` check naming why, so the attempt fails and is retried like any other.
fn not_run(shared: &Shared, name: &str, why: String) -> (RunVerdict, Vec<kiln_store::CheckResult>) {
    shared
        .metrics
        .record_check(name, Verdict::Error, Duration::ZERO);
    let check = kiln_store::CheckResult {
        name: name.into(),
        verdict: CheckVerdict::Error,
        measured: serde_json::json!({}),
        message: why,
        evidence: String::new(),
        findings: Vec::new(),
    };
    (RunVerdict::Fail, vec![check])
}

fn target(msg: &NodeMessage) -> NodeTarget {
    let n = &msg.node;
    let some = |s: &str| (!s.trim().is_empty()).then(|| s.to_string());
    NodeTarget {
        hostname: n.hostname.clone(),
        rack: n.rack.clone(),
        bmc_address: n.bmc_address.clone(),
        gpu_model: n.gpu_model.clone(),
        gpu_count: u32::from(n.gpu_count),
        firmware: FirmwareBaseline {
            bmc: some(&n.firmware_bmc),
            bios: some(&n.firmware_bios),
            gpu_vbios: some(&n.firmware_gpu_vbios),
            nic: some(&n.firmware_nic),
        },
        registered_at: time::OffsetDateTime::from_unix_timestamp_nanos(
            i128::from(msg.enqueued_at_ms) * 1_000_000,
        )
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH),
        labels: n.labels.clone(),
    }
}
