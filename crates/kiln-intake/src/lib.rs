//! Intake: a validated manifest in, every new node on `kiln.nodes` and in the store as queued.
//!
//! Order of work, and why (DESIGN.md invariant 7: every registered node ends passed or
//! dead-lettered; none vanishes):
//!
//! 1. validate the whole manifest (done by the caller through `kiln_manifest`): all or nothing;
//! 2. look up every hostname in the store: nodes queued, running or retrying are reported and
//!    left alone; the others get their next cycle number (1 for a new node);
//! 3. produce every new node (key = rack, acks=all) and wait for every delivery report;
//! 4. record the delivered nodes as queued, in one transaction.
//!
//! Produce first, record second: a crash between the two leaves messages without rows, and
//! the message carries everything the row needs, so the agent's `begin_run` creates the row
//! (kiln-store). The other order would leave rows saying "queued" for messages that were never
//! sent: nodes nobody will ever burn in, and that re-registering would refuse as "already
//! queued". A retried registration after a crash may produce a node twice; both messages carry
//! the same (hostname, cycle, attempt) and the store runs it once. See docs/platform.md.

pub mod http;
pub mod testkit;

use std::collections::BTreeSet;
use std::time::Instant;

use kiln_manifest::{Manifest, ManifestErrors};
use kiln_queue::{Delivery, NodeMessage, NodeProducer, QueueError};
use kiln_store::{NodeState, QueuedNode, Store, StoreError};
use serde::{Deserialize, Serialize};

/// Reports progress of a long registration (the CLI draws a bar; the server logs).
pub trait Progress: Send + Sync {
    /// A phase begins with `total` steps.
    fn phase(&self, _name: &'static str, _total: usize) {}
    /// `done` of the current phase's steps are complete.
    fn advance(&self, _done: usize) {}
}

/// No progress reporting.
pub struct NoProgress;
impl Progress for NoProgress {}

/// A node that was queued by this registration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueuedReport {
    pub hostname: String,
    pub rack: String,
    pub cycle: u32,
    pub partition: i32,
    pub offset: i64,
}

/// A node that was already queued, running or retrying, and so was not queued again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InProgressReport {
    pub hostname: String,
    pub state: NodeState,
    pub cycle: u32,
    pub attempt: u32,
}

/// A node whose message was not delivered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailedReport {
    pub hostname: String,
    pub reason: String,
}

/// Time spent in each phase, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    pub lookup_ms: f64,
    pub produce_ms: f64,
    pub record_ms: f64,
}

/// What a registration did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Registration {
    /// Nodes in the manifest.
    pub nodes: usize,
    /// Racks named in the manifest, sorted.
    pub racks: Vec<String>,
    /// Newly queued, in manifest order.
    pub queued: Vec<QueuedReport>,
    /// Not queued again because they are in progress.
    pub already_in_progress: Vec<InProgressReport>,
    /// Not delivered to the queue (and so not recorded); register again to retry them.
    pub failed: Vec<FailedReport>,
    pub timings: Timings,
}

#[derive(Debug, thiserror::Error)]
pub enum IntakeError {
    #[error("{0}")]
    Rejected(ManifestErrors),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Queue(#[from] QueueError),
}

/// The intake service: one store, one producer. Registrations run one at a time per process,
/// so two overlapping requests for the same nodes do not both queue them.
pub struct Intake {
    store: Store,
    producer: NodeProducer,
    one_at_a_time: tokio::sync::Mutex<()>,
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

impl Intake {
    pub fn new(store: Store, producer: NodeProducer) -> Self {
        Intake {
            store,
            producer,
            one_at_a_time: tokio::sync::Mutex::new(()),
        }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn producer(&self) -> &NodeProducer {
        &self.producer
    }

    /// Queues and records every node of `manifest` not already in progress. Nodes whose
    /// delivery failed are listed in [`Registration::failed`] and not recorded; the caller
    /// should treat a non-empty list as a failed registration (re-running it is safe).
    pub async fn register(
        &self,
        manifest: &Manifest,
        progress: &dyn Progress,
    ) -> Result<Registration, IntakeError> {
        let _guard = self.one_at_a_time.lock().await;
        let racks: BTreeSet<&str> = manifest.nodes.iter().map(|n| n.rack.as_str()).collect();
        let mut reg = Registration {
            nodes: manifest.nodes.len(),
            racks: racks.into_iter().map(str::to_string).collect(),
            queued: Vec::new(),
            already_in_progress: Vec::new(),
            failed: Vec::new(),
            timings: Timings::default(),
        };

        let t = Instant::now();
        progress.phase("checking the store", manifest.nodes.len());
        let hostnames: Vec<&str> = manifest.nodes.iter().map(|n| n.hostname.as_str()).collect();
        let known = self.store.node_states(&hostnames).await?;
        let now = kiln_queue::now_ms();
        let mut to_queue = Vec::with_capacity(manifest.nodes.len());
        for node in &manifest.nodes {
            match known.get(&node.hostname) {
                Some(st) if st.state.in_progress() => {
                    reg.already_in_progress.push(InProgressReport {
                        hostname: node.hostname.clone(),
                        state: st.state,
                        cycle: st.cycle,
                        attempt: st.attempt,
                    })
                }
                Some(st) => to_queue.push(NodeMessage::first(node.clone(), st.cycle + 1, now)),
                None => to_queue.push(NodeMessage::first(node.clone(), 1, now)),
            }
        }
        progress.advance(manifest.nodes.len());
        reg.timings.lookup_ms = ms(t);
        if to_queue.is_empty() {
            return Ok(reg);
        }

        let t = Instant::now();
        self.producer.check_topic().await?;
        progress.phase("queueing", to_queue.len());
        let results = self
            .producer
            .send_all(&to_queue, |done| progress.advance(done))
            .await;
        reg.timings.produce_ms = ms(t);

        let t = Instant::now();
        let mut delivered: Vec<(NodeMessage, Delivery)> = Vec::with_capacity(to_queue.len());
        for (msg, result) in to_queue.into_iter().zip(results) {
            match result {
                Ok(d) => delivered.push((msg, d)),
                Err(e) => reg.failed.push(FailedReport {
                    hostname: msg.node.hostname.clone(),
                    reason: e.to_string(),
                }),
            }
        }
        progress.phase("recording", delivered.len());
        let rows: Vec<QueuedNode> = delivered
            .iter()
            .map(|(m, _)| QueuedNode {
                spec: m.node.clone(),
                cycle: m.cycle,
            })
            .collect();
        self.store.record_queued(&rows, now).await?;
        progress.advance(rows.len());
        reg.timings.record_ms = ms(t);
        reg.queued = delivered
            .into_iter()
            .map(|(m, d)| QueuedReport {
                hostname: m.node.hostname,
                rack: m.node.rack,
                cycle: m.cycle,
                partition: d.partition,
                offset: d.offset,
            })
            .collect();
        if !reg.failed.is_empty() {
            tracing::warn!(
                failed = reg.failed.len(),
                "some nodes were not delivered to the queue"
            );
        }
        Ok(reg)
    }
}
